"""The strategies read real views: quota per target for this key, health with cooldowns and
lockouts, task hints from the request.

The capped-key repro: alice is at her cap on connection s1 while k1 has room; a combo
``[s1, k1]`` with any quota-aware strategy must go to k1 without trying s1 (no blocked
admission in s1's pool log). On the old request path the strategies got no quota view, fell
back to configured order, tried s1 first and were blocked there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from inproc_support import base_config, conn, gateway

from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat
from fairgate.timers import ManualTimer


async def _answer(req: UpstreamRequest) -> Reply:
    return openai_chat(f"from {req.conn.id}")


def _pools(alice_on_s1: dict[str, Any]) -> list[dict[str, Any]]:
    dims = [{"unit": "requests", "window": "hourly", "limit": 1000}]
    return [
        {
            "id": "ps1",
            "connections": ["s1"],
            "dimensions": dims,
            "allocations": [{"key": "alice", **alice_on_s1}, {"key": "bob", "weight": 1}],
        },
        {
            "id": "pk1",
            "connections": ["k1"],
            "dimensions": dims,
            "allocations": [{"key": "alice", "weight": 1}, {"key": "bob", "weight": 1}],
        },
    ]


def _combo(strategy: str, **options: Any) -> dict[str, Any]:
    return {
        "name": "c",
        "strategy": strategy,
        "targets": [
            {"provider": "sub", "model": "m", "connection": "s1"},
            {"provider": "kimi", "model": "m", "connection": "k1"},
        ],
        "config": {"options": options},
    }


QUOTA_AWARE = [
    pytest.param("fill-first", {}, id="fill-first"),
    pytest.param("headroom", {}, id="headroom"),
    pytest.param("reset-aware", {}, id="reset-aware"),
    pytest.param("reset-window", {}, id="reset-window"),
    pytest.param("auto", {"exploration": 0.0}, id="auto"),
]


@pytest.mark.parametrize(("strategy", "options"), QUOTA_AWARE)
async def test_capped_key_is_routed_to_the_target_with_room(
    tmp_path: Path, strategy: str, options: dict[str, Any]
) -> None:
    cfg = base_config(
        [conn("s1", "sub"), conn("k1", "kimi")],
        pools=_pools({"weight": 1, "cap_value": 3, "cap_unit": "requests"}),
        combos=[_combo(strategy, **options)],
    )
    async with gateway(tmp_path, cfg, ManualTimer(), _answer) as h:
        ps1 = h.gw.registry.pools["ps1"]
        await h.gw.engine.record(ps1, "alice", {"requests/hourly": 3.0})  # at her cap on s1
        r = await h.chat("c", max_tokens=5)
        assert r.status_code == 200, r.text
        assert r.headers["x-fairgate-connection"] == "k1"
        assert h.sent_to == ["k1"]
        assert [e["outcome"] for e in await h.gw.pool_log.recent("ps1")] == []  # s1 never tried
        # bob is not capped on s1: the strategies that keep configured order among targets
        # with room send him there first (headroom and reset-aware rank by what is left)
        r = await h.chat("c", key="fg-bob-secret-0123456789", max_tokens=5)
        assert r.status_code == 200
        if strategy in ("fill-first", "reset-window"):
            assert r.headers["x-fairgate-connection"] == "s1"


async def test_headroom_prefers_the_account_with_more_left(tmp_path: Path) -> None:
    cfg = base_config(
        [conn("s1", "sub"), conn("k1", "kimi")],
        pools=_pools({"weight": 1}),
        combos=[_combo("headroom")],
    )
    async with gateway(tmp_path, cfg, ManualTimer(), _answer) as h:
        await h.gw.engine.record(h.gw.registry.pools["ps1"], "alice", {"requests/hourly": 400.0})
        r = await h.chat("c", max_tokens=5)
        assert r.headers["x-fairgate-connection"] == "k1"


async def test_soft_penalised_target_goes_behind_for_any_strategy(tmp_path: Path) -> None:
    """priority reads no quota itself, but the soft partition puts a penalised target last."""
    cfg = base_config(
        [conn("s1", "sub"), conn("k1", "kimi")],
        pools=_pools({"weight": 0, "policy": "soft"}),
        combos=[_combo("priority")],
    )
    async with gateway(tmp_path, cfg, ManualTimer(), _answer) as h:
        r = await h.chat("c", max_tokens=5)
        assert r.headers["x-fairgate-connection"] == "k1"
        assert h.sent_to == ["k1"]


async def test_auto_reads_cooldowns_from_the_health_view(tmp_path: Path) -> None:
    calls = {"s1": 0}

    async def handler(req: UpstreamRequest) -> Reply:
        if req.conn.id == "s1":
            calls["s1"] += 1
            return Reply(
                429, {"error": {"message": "Rate limit reached"}}, headers={"retry-after": "60"}
            )
        return openai_chat("k1")

    combo = _combo("auto", exploration=0.0)
    combo["config"]["maxWaitMs"] = 0
    cfg = base_config([conn("s1", "sub"), conn("k1", "kimi")], combos=[combo])
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        await h.chat("c", max_tokens=5)  # auto's order, whatever it is: s1 now cools down
        h.upstream.requests.clear()
        r = await h.chat("c", max_tokens=5)
        assert r.headers["x-fairgate-connection"] == "k1"
        # the cooling target was ordered last, not merely skipped: diagnostics show no
        # exclusion of s1 before k1 answered
        assert h.sent_to == ["k1"]
        assert calls["s1"] <= 1


async def test_auto_fits_the_task_from_the_request(tmp_path: Path) -> None:
    combo = {
        "name": "c",
        "strategy": "auto",
        "targets": [
            {"provider": "sub", "model": "m", "connection": "s1", "tags": ["code"]},
            {"provider": "kimi", "model": "m", "connection": "k1", "tags": ["vision"]},
        ],
        "config": {"options": {"exploration": 0.0}},
    }
    cfg = base_config([conn("s1", "sub"), conn("k1", "kimi")], combos=[combo])
    async with gateway(tmp_path, cfg, ManualTimer(), _answer) as h:
        image = {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        }
        r = await h.chat("c", max_tokens=5, messages=[image])
        assert r.headers["x-fairgate-connection"] == "k1"
