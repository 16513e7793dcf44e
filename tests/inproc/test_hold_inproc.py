"""``admission: hold`` through the whole HTTP app (issue 45, item 1), on an injected clock: a
request that does not fit waits for room instead of a 429, freed room goes to the waiting key
with the least use per weight, a request out of patience gets a 429 with a correct
Retry-After, a client that goes away leaves the queue, and nothing is reserved or held while
waiting. Nothing sleeps: the test moves the clock and the requests wake."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from inproc_support import ADMIN, ALICE, BOB, Gate, Harness, base_config, conn, gateway

from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat
from fairgate.quota.hold import MAX_WAIT_HEADER
from fairgate.timers import ManualTimer

CAROL = "fg-test-carol-0123456789abcdef0123456789abcdef"
#: mid-hour, so the window never slides within a test
T = 1_782_298_800_000 + 1_800_000


def _config(limit: int = 2, **hold: Any) -> dict[str, Any]:
    cfg = base_config(
        [conn("c1", max_concurrent=4)],
        pools=[
            {
                "id": "p",
                "connections": ["c1"],
                "dimensions": [{"unit": "requests", "window": "hourly", "limit": limit}],
                "allocations": [
                    {"key": "alice", "weight": 40, "policy": "burst"},
                    {"key": "bob", "weight": 30},
                    {"key": "carol", "weight": 30},
                ],
                "admission": "hold",
                "max_wait_ms": 5_000,
                **hold,
            }
        ],
    )
    cfg["keys"].append(
        {"id": "carol", "name": "Carol", "secret": CAROL, "allowed_providers": ["mock"]}
    )
    return cfg


def _ask(h: Harness, tag: str, key: str = ALICE, headers: dict[str, str] | None = None) -> Any:
    return asyncio.create_task(
        h.client.post(
            "/v1/chat/completions",
            json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": tag}]},
            headers={"authorization": f"Bearer {key}", **(headers or {})},
        )
    )


async def _waiters(h: Harness) -> list[str]:
    ws = await h.gw.engine.store.waiters("p", h.timer.clock.now_ms())
    return sorted(w.key_id for w in ws)


async def test_a_request_that_does_not_fit_waits_and_is_served_when_room_frees(
    tmp_path: Path,
) -> None:
    timer, gate = ManualTimer(), Gate()
    timer.set(T)
    async with gateway(tmp_path, _config(), timer, gate.handler) as h:
        a, f = _ask(h, "a1"), _ask(h, "fail-a2")
        await gate.until(2)  # the pool's 2 requests are reserved
        b = _ask(h, "b1", key=BOB)
        await timer.until_sleeping(1)
        assert await _waiters(h) == ["bob"]  # held, not refused
        assert gate.seen == ["a1", "fail-a2"]
        assert h.svc.tracker.total == 2  # the waiter holds no concurrency slot
        gate.let_through("fail-a2")  # its reservation goes back: bob wakes and takes the room
        assert (await f).status_code == 400
        await gate.until(3)
        assert gate.seen[2] == "b1"
        gate.let_through("a1")
        gate.let_through("b1")
        assert (await a).status_code == 200
        rb = await b
        assert rb.status_code == 200, rb.text
        assert await _waiters(h) == []
        assert await h.open_reservations() == 0


async def test_out_of_patience_is_a_429_with_the_retry_after_of_the_pool(
    tmp_path: Path,
) -> None:
    async with _hour_used_up(tmp_path, _config()) as (h, timer):
        b = _ask(h, "b1", key=BOB, headers={MAX_WAIT_HEADER: "2000"})
        await timer.until_sleeping(1)
        timer.advance(1_000)  # a poll: still no room
        await timer.until_sleeping(1)
        assert not b.done()
        timer.advance(1_000)  # the client's patience (2 s, shorter than the pool's 5 s) is out
        r = await b
        assert r.status_code == 429, r.text
        log = (await h.client.get("/api/quota/pools/p/log", headers=ADMIN)).json()
        # the admission log says how long the refused request waited first
        assert log["events"][0].get("waitedMs") == 2_000  # newest first
        assert r.json()["error"]["reason"] == "global-saturated"
        # room for one frees when the hour's two requests, in the previous bucket from the top
        # of the hour on, have faded to one: half an hour after it (2 × (1 − e/W) + 1 ≤ 2)
        retry = int(r.headers["retry-after"])
        now = timer.clock.now_ms()
        assert retry == math.ceil((3_600_000 - now % 3_600_000) / 1000) + 1_800
        refused = await h.chat("m", key=BOB, max_tokens=5, headers={MAX_WAIT_HEADER: "0"})
        assert refused.status_code == 429  # 0: never wait
        assert refused.headers["retry-after"] == r.headers["retry-after"]
        assert await _waiters(h) == []
        assert await h.open_reservations() == 0


async def _answer(req: UpstreamRequest) -> Reply:
    return openai_chat("ok")


@asynccontextmanager
async def _hour_used_up(
    tmp_path: Path, cfg: dict[str, Any]
) -> AsyncIterator[tuple[Harness, ManualTimer]]:
    """A gateway whose pool has served the hour's two requests, so the next one must wait."""
    timer = ManualTimer()
    timer.set(T)
    async with gateway(tmp_path, cfg, timer, _answer) as h:
        for _ in range(2):
            assert (await h.chat("m", max_tokens=5)).status_code == 200
        yield h, timer


async def test_a_client_that_goes_away_leaves_the_queue_and_nothing_is_held(
    tmp_path: Path,
) -> None:
    async with _hour_used_up(tmp_path, _config()) as (h, timer):
        b = _ask(h, "b1", key=BOB)
        await timer.until_sleeping(1)
        assert await _waiters(h) == ["bob"]
        b.cancel()  # the client went away
        with pytest.raises(asyncio.CancelledError):
            await b
        for _ in range(100):
            await asyncio.sleep(0)
            if not await _waiters(h):
                break
        assert await _waiters(h) == []
        assert timer.sleeping == 0
        assert await h.open_reservations() == 0
        assert h.svc.tracker.total == 0


async def test_queue_limits_refuse_at_once(tmp_path: Path) -> None:
    async with _hour_used_up(tmp_path, _config(queue_per_key=1, queue_per_pool=2)) as (h, timer):
        b1 = _ask(h, "b1", key=BOB)
        await timer.until_sleeping(1)
        b2 = await h.chat("m", key=BOB, max_tokens=5)  # bob's queue holds one
        assert b2.status_code == 429
        assert "retry-after" in b2.headers
        c1 = _ask(h, "c1", key=CAROL)
        await timer.until_sleeping(2)
        a3 = await h.chat("m", key=ALICE, max_tokens=5)  # the pool's holds two
        assert a3.status_code == 429
        assert await _waiters(h) == ["bob", "carol"]
        timer.advance(5_000)
        assert (await b1).status_code == 429
        assert (await c1).status_code == 429


async def test_freed_room_goes_to_the_key_with_the_least_use_per_weight(
    tmp_path: Path,
) -> None:
    """alice has used the pool, bob nothing: alice's request waits first, but the room that
    frees goes to bob's (the least use of the window per weight), then alice's waits on."""
    timer, gate = ManualTimer(), Gate()
    timer.set(T)
    async with gateway(tmp_path, _config(limit=3), timer, gate.handler) as h:
        tasks = [_ask(h, t) for t in ("a1", "fail-a2", "a3")]
        await gate.until(3)  # the pool's 3 requests: all alice's
        a4 = _ask(h, "a4")
        await timer.until_sleeping(1)
        b1 = _ask(h, "b1", key=BOB)
        await timer.until_sleeping(2)
        assert await _waiters(h) == ["alice", "bob"]
        gate.let_through("fail-a2")
        await gate.until(4)
        assert gate.seen[3] == "b1"  # bob first, though alice asked before
        assert await _waiters(h) == ["alice"]
        for t in ("a1", "a3", "b1"):
            gate.let_through(t)
        statuses = [(await t).status_code for t in tasks]
        assert statuses == [200, 400, 200]
        assert (await b1).status_code == 200
        timer.advance(5_000)
        assert (await a4).status_code == 429  # no room freed for it within its patience
        assert await h.open_reservations() == 0


async def test_a_malformed_max_wait_header_is_a_400_naming_it(tmp_path: Path) -> None:
    timer = ManualTimer()
    timer.set(T)
    async with gateway(tmp_path, _config(), timer, _answer) as h:
        r = await h.chat("m", max_tokens=5, headers={MAX_WAIT_HEADER: "soon"})
        assert r.status_code == 400
        assert MAX_WAIT_HEADER in r.json()["error"]["message"]
