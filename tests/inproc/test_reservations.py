"""Every reservation ends: settled by an answer, released by a failure, a request that went
elsewhere, a cancelled combo or a losing fan-out branch. The store's open reservations are
read from its SQLite file: 0 after each of these.

On the old request path a soft-penalised admission held while an unpenalised candidate was
tried had no ``finally``: a cancellation left its quota reserved until the 10-minute lease.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from inproc_support import base_config, combo, conn, gateway

from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat
from fairgate.timers import ManualTimer


def _pool(pid: str, cid: str, alice: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": pid,
        "connections": [cid],
        "dimensions": [{"unit": "requests", "window": "hourly", "limit": 100}],
        "allocations": [{"key": "alice", **alice}, {"key": "bob", "weight": 1}],
    }


#: c1's pool penalises alice (soft, no share of her own); c2's admits her plainly.
POOLS = [
    _pool("p1", "c1", {"weight": 0, "policy": "soft"}),
    _pool("p2", "c2", {"weight": 1, "policy": "hard"}),
]


async def _until(pred: Any) -> None:
    for _ in range(10_000):
        if pred():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def test_held_soft_admission_is_released_when_the_request_is_cancelled(
    tmp_path: Path,
) -> None:
    hang = asyncio.Event()

    async def handler(req: UpstreamRequest) -> Reply:
        await hang.wait()
        return openai_chat("late")

    cfg = base_config([conn("c1", weight=2), conn("c2")], pools=POOLS)
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        task = asyncio.create_task(h.chat("m", max_tokens=5))
        await _until(lambda: len(h.upstream.requests) == 1)
        # c1 was admitted with a penalty and held; c2 (unpenalised) is being tried
        assert h.sent_to == ["c2"]
        assert await h.open_reservations() == 2  # c2's, and c1's hold in case c2 fails
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await h.settle_background()
        assert await h.open_reservations() == 0
        assert len(h.svc.inflight) == 0
        assert h.svc.tracker.total == 0


async def test_held_admission_is_released_when_cancelled_before_it_is_used(
    tmp_path: Path,
) -> None:
    """A combo: c1's penalised admission is held while c2 is tried with c3 still to come;
    the hold must not survive a cancellation during c2's attempt."""
    hang = asyncio.Event()

    async def handler(req: UpstreamRequest) -> Reply:
        if req.conn.id == "c2":
            await hang.wait()
        return openai_chat("ok")

    pools = [
        _pool("p1", "c1", {"weight": 0, "policy": "soft"}),
        _pool("p2", "c2", {"weight": 1, "policy": "hard"}),
    ]
    soft = combo("soft", ["c1", "c2", "c3"])
    cfg = base_config([conn("c1"), conn("c2"), conn("c3")], pools=pools, combos=[soft])
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        task = asyncio.create_task(h.chat("soft", max_tokens=5))
        await _until(lambda: len(h.upstream.requests) == 1)
        assert h.sent_to == ["c2"]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await h.settle_background()
        assert await h.open_reservations() == 0


async def test_held_admission_serves_when_nothing_better_answers(tmp_path: Path) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        if req.conn.id == "c2":
            return Reply(429, {"error": {"message": "Rate limit reached"}})
        return openai_chat("penalised but served")

    cfg = base_config([conn("c1", weight=2), conn("c2")], pools=POOLS)
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await h.chat("m", max_tokens=5)
        assert r.status_code == 200
        assert h.sent_to == ["c2", "c1"]
        await h.settle_background()
        assert await h.open_reservations() == 0


async def test_losing_fan_out_branch_leaves_no_reservation(tmp_path: Path) -> None:
    hang = asyncio.Event()

    async def handler(req: UpstreamRequest) -> Reply:
        if req.conn.id == "c2":
            await hang.wait()
        return openai_chat(f"from {req.conn.id}")

    pools = [
        _pool("p1", "c1", {"weight": 1, "policy": "hard"}),
        _pool("p2", "c2", {"weight": 1, "policy": "hard"}),
    ]
    race = combo("race", ["c1", "c2"], options={"fanOut": 2})
    cfg = base_config([conn("c1"), conn("c2")], pools=pools, combos=[race])
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await h.chat("race", max_tokens=5)
        assert r.status_code == 200
        assert r.json()["choices"][0]["message"]["content"] == "from c1"
        await h.settle_background()
        assert await h.open_reservations() == 0
        assert len(h.svc.inflight) == 0
        assert h.svc.tracker.total == 0


async def test_failures_release_and_answers_settle(tmp_path: Path) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        if req.conn.id == "c1":
            return Reply(503, {"error": {"message": "overloaded"}})
        return openai_chat("ok")

    pools = [
        _pool("p1", "c1", {"weight": 1, "policy": "hard"}),
        _pool("p2", "c2", {"weight": 1, "policy": "hard"}),
    ]
    cfg = base_config([conn("c1", weight=2), conn("c2")], pools=pools)
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        for _ in range(3):
            assert (await h.chat("m", max_tokens=5)).status_code == 200
        await h.settle_background()
        assert await h.open_reservations() == 0
        served = await h.gw.engine.usage(h.gw.registry.pools["p2"])
        failed = await h.gw.engine.usage(h.gw.registry.pools["p1"])
        assert served.dimensions[0].total == 3  # settled where it was served
        assert failed.dimensions[0].total == 0  # released where it failed
