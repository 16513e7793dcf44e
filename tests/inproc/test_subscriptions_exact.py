"""Shared subscriptions, exact (issue 44), in process: the soft penalty's factor, the
credential gate, wildcard connections, the percent estimate and its attribution, the readings'
age and the retry time of subscription windows. The upstream is an in-process handler; the
clock is the test's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from inproc_support import base_config, conn, gateway

from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat
from fairgate.timers import ManualTimer


async def _answer(req: UpstreamRequest) -> Reply:
    return openai_chat(f"from {req.conn.id}")


# -- item 7: the soft penalty is × factor in the scoring, and the executor keeps that order ----


def _soft_pools() -> list[dict[str, Any]]:
    """alice is soft-penalised on s1 (weight 0: over her share from the start), not on k1."""
    dims = [{"unit": "requests", "window": "hourly", "limit": 1000}]
    return [
        {
            "id": "ps1",
            "connections": ["s1"],
            "dimensions": dims,
            "allocations": [
                {"key": "alice", "weight": 0, "policy": "soft"},
                {"key": "bob", "weight": 1},
            ],
        },
        {
            "id": "pk1",
            "connections": ["k1"],
            "dimensions": dims,
            "allocations": [{"key": "alice", "weight": 1}, {"key": "bob", "weight": 1}],
        },
    ]


@pytest.mark.parametrize(
    ("other_price", "served"),
    [
        pytest.param(100.0, "s1", id="penalised-1-beats-100"),
        pytest.param(1.5, "s1", id="penalised-1-beats-1.5"),  # 1 / 0.7 = 1.43 < 1.5
        pytest.param(1.4, "k1", id="penalised-1-loses-to-1.4"),  # 1.43 > 1.4
    ],
)
async def test_soft_penalty_scales_the_cost_by_the_factor(
    tmp_path: Path, other_price: float, served: str
) -> None:
    combo = {
        "name": "c",
        "strategy": "cost-optimized",
        "targets": [
            {"provider": "sub", "model": "m", "connection": "s1", "priceIn": 1, "priceOut": 1},
            {
                "provider": "kimi",
                "model": "m",
                "connection": "k1",
                "priceIn": other_price,
                "priceOut": other_price,
            },
        ],
    }
    cfg = base_config([conn("s1", "sub"), conn("k1", "kimi")], pools=_soft_pools(), combos=[combo])
    async with gateway(tmp_path, cfg, ManualTimer(), _answer) as h:
        r = await h.chat("c", max_tokens=5)
        assert r.status_code == 200, r.text
        assert h.sent_to == [served]
        assert r.headers["x-fairgate-connection"] == served


# -- item 2: the credential gate, for every kind of credential ---------------------------------


@pytest.mark.parametrize(
    "s1",
    [
        pytest.param(conn("s1", "sub", models=("other",)), id="model-not-served"),
        pytest.param(
            {**conn("s1", "sub", base_url="https://s1.invalid/v1"), "secret": ""},
            id="api-key-missing",
        ),
    ],
)
async def test_an_unusable_credential_is_skipped_before_any_attempt(
    tmp_path: Path, s1: dict[str, Any]
) -> None:
    combo = {
        "name": "c",
        "strategy": "priority",
        "targets": [
            {"provider": "sub", "model": "m", "connection": "s1"},
            {"provider": "kimi", "model": "m", "connection": "k1"},
        ],
        "config": {"maxWaitMs": 0},
    }
    only = {**combo, "name": "only", "targets": combo["targets"][:1]}
    cfg = base_config([s1, conn("k1", "kimi")], combos=[combo, only])
    async with gateway(tmp_path, cfg, ManualTimer(), _answer) as h:
        for _ in range(3):
            r = await h.chat("c", max_tokens=5)
            assert r.status_code == 200, r.text
        assert h.sent_to == ["k1"] * 3  # s1 never attempted
        mgr = h.gw.resilience
        assert mgr is not None
        snap = await mgr.snapshot()
        assert snap["breakers"].get("sub", {}).get("failures", 0) == 0
        # alone, it is a 503 that names what to do, still without an attempt
        r = await h.chat("only", max_tokens=5)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "credential_unusable"
        assert "s1: " in err["message"]
        assert h.sent_to == ["k1"] * 3
