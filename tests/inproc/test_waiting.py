"""Bounded waits in the request path, on an injected clock: the cooldown-aware wait and the
concurrency queue. Nothing sleeps: the test moves the clock and the request wakes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from inproc_support import ALICE, BOB, Gate, Harness, base_config, combo, conn, gateway

from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat
from fairgate.timers import ManualTimer, SystemTimer


def _rate_limited_once(cooling_ms: int) -> Any:
    """c1 answers 429 with a ``retry-after-ms`` hint the first time, then answers."""
    seen = {"n": 0}

    async def handler(req: UpstreamRequest) -> Reply:
        seen["n"] += 1
        if seen["n"] == 1:
            return Reply(
                429,
                {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}},
                headers={"retry-after-ms": str(cooling_ms)},
            )
        return openai_chat("after the wait")

    return handler


def _waiting(tmp_path: Path, timer: ManualTimer, max_wait_ms: int, cooling_ms: int) -> Any:
    """A gateway whose combo ``w`` waits up to ``max_wait_ms`` for its one connection ``c1``
    (no retries), which answers 429 cooling for ``cooling_ms`` the first time."""
    w = combo("w", ["c1"], maxWaitMs=max_wait_ms, maxRetries=0)
    return gateway(
        tmp_path, base_config([conn("c1")], combos=[w]), timer, _rate_limited_once(cooling_ms)
    )


async def test_a_target_cooling_within_max_wait_is_waited_for(tmp_path: Path) -> None:
    timer = ManualTimer()
    async with _waiting(tmp_path, timer, max_wait_ms=1000, cooling_ms=800) as h:
        task = asyncio.create_task(h.chat("w", max_tokens=5))
        await timer.until_sleeping(1)
        assert h.sent_to == ["c1"]
        timer.advance(799)
        await asyncio.sleep(0)
        assert not task.done()
        timer.advance(1)  # the cooldown ends: the request wakes and is served
        r = await task
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "after the wait"
        assert h.sent_to == ["c1", "c1"]


async def _refused_without_waiting(h: Harness, timer: ManualTimer) -> None:
    """Ask the combo ``w`` once: its one connection's 429 is answered at once, nothing sleeps."""
    r = await h.chat("w", max_tokens=5)
    assert r.status_code == 429
    assert timer.sleeping == 0


async def test_a_target_cooling_past_max_wait_answers_at_once(tmp_path: Path) -> None:
    timer = ManualTimer()
    async with _waiting(tmp_path, timer, max_wait_ms=1000, cooling_ms=1500) as h:
        await _refused_without_waiting(h, timer)
        r2 = await h.chat("w", max_tokens=5)  # still cooling: at once, with when to retry
        assert r2.status_code == 429
        assert r2.headers["retry-after"] == "2"
        assert r2.json()["diagnostics"]["terminalReason"] == "all_rate_limited"
        assert h.sent_to == ["c1"]


async def test_max_wait_zero_disables_the_wait(tmp_path: Path) -> None:
    timer = ManualTimer()
    async with _waiting(tmp_path, timer, max_wait_ms=0, cooling_ms=100) as h:
        await _refused_without_waiting(h, timer)


async def test_the_global_routing_default_applies_to_plain_models(tmp_path: Path) -> None:
    """maxWaitMs through the cascade: the global layer (admin API) reaches a plain model."""
    timer = ManualTimer()
    cfg = base_config([conn("c1")])
    async with gateway(tmp_path, cfg, timer, _rate_limited_once(800)) as h:
        h.gw.registry = dataclasses_replace_defaults(h, max_wait_ms=0)
        r = await h.chat("m", max_tokens=5)
        assert r.status_code == 429  # disabled globally
        timer.advance(1000)
        h.gw.registry = dataclasses_replace_defaults(h, max_wait_ms=5000)
        h.upstream.handler = _rate_limited_once(800)
        task = asyncio.create_task(h.chat("m", max_tokens=5))
        await timer.until_sleeping(1)
        timer.advance(800)
        assert (await task).status_code == 200


def dataclasses_replace_defaults(h: Any, **kw: Any) -> Any:
    import dataclasses

    reg = h.gw.registry
    return dataclasses.replace(
        reg, routing_defaults=dataclasses.replace(reg.routing_defaults, **kw)
    )


async def test_a_client_that_leaves_while_waiting_costs_nothing(tmp_path: Path) -> None:
    timer = ManualTimer()
    pools = [
        {
            "id": "p1",
            "connections": ["c1"],
            "dimensions": [{"unit": "requests", "window": "hourly", "limit": 100}],
            "allocations": [{"key": "alice", "weight": 1}],
        }
    ]
    cfg = base_config(
        [conn("c1")], combos=[combo("w", ["c1"], maxWaitMs=5000, maxRetries=0)], pools=pools
    )
    async with gateway(tmp_path, cfg, timer, _rate_limited_once(3000)) as h:
        task = asyncio.create_task(h.chat("w", max_tokens=5))
        await timer.until_sleeping(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await h.settle_background()
        assert timer.sleeping == 0
        assert await h.open_reservations() == 0


# -- concurrency queue ---------------------------------------------------------------------


def _ask(h: Any, tag: str, model: str = "m", key: str = ALICE) -> Any:
    return asyncio.create_task(
        h.client.post(
            "/v1/chat/completions",
            json={"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": tag}]},
            headers={"authorization": f"Bearer {key}"},
        )
    )


async def test_requests_queue_fifo_for_a_slot(tmp_path: Path) -> None:
    timer, gate = ManualTimer(), Gate()
    cfg = base_config([conn("c1", max_concurrent=1)])
    async with gateway(tmp_path, cfg, timer, gate.handler) as h:
        first = _ask(h, "A")
        await gate.until(1)
        second = _ask(h, "B")
        await timer.until_sleeping(1)
        third = _ask(h, "C")
        await timer.until_sleeping(2)
        assert h.svc.slots.queued() == 2
        assert [t for t, _ in gate.waiting] == ["A"]  # never more than the cap upstream
        gate.let_through("A")
        assert (await first).status_code == 200
        await gate.until(2)
        assert [t for t, _ in gate.waiting] == ["A", "B"]  # first come, first served
        gate.let_through("B")
        await gate.until(3)
        gate.let_through("C")
        assert (await second).json()["choices"][0]["message"]["content"] == "done B"
        assert (await third).json()["choices"][0]["message"]["content"] == "done C"
        assert h.svc.tracker.total == 0
        assert h.svc.slots.queued() == 0


async def test_a_freed_slot_goes_to_a_waiting_key_under_its_share(tmp_path: Path) -> None:
    """Issue 43, N4: one key held both slots of ``max_concurrent: 2`` (streams it never read)
    and kept the queue's head with its next requests, so the other key waited out its queue
    timeout (503 ``concurrency_full``) for as long as it kept sending. A freed slot now goes to
    the first waiter whose key holds less than its share (2 slots, 2 keys: one each), before
    the earlier waiters of the key that holds them all; among keys at their share, first come
    first served as before."""
    timer, gate = ManualTimer(), Gate()
    cfg = base_config([conn("c1", max_concurrent=2)])
    async with gateway(tmp_path, cfg, timer, gate.handler) as h:
        held = [_ask(h, "A1"), _ask(h, "A2")]
        await gate.until(2)
        queued = [_ask(h, "A3")]
        await timer.until_sleeping(1)
        queued.append(_ask(h, "A4"))
        await timer.until_sleeping(2)
        bob = _ask(h, "B1", key=BOB)
        await timer.until_sleeping(3)
        assert h.svc.slots.queued() == 3
        gate.let_through("A1")
        assert (await held[0]).status_code == 200
        await gate.until(3)
        assert [t for t, _ in gate.waiting][2] == "B1"  # bob's, though alice's two came first
        gate.let_through("A2")
        await gate.until(4)
        assert [t for t, _ in gate.waiting][3] == "A3"  # then alice's, in their order
        for tag in ("B1", "A3"):
            gate.let_through(tag)
        await gate.until(5)
        gate.let_through("A4")
        for task in (held[1], bob, *queued):
            assert (await task).status_code == 200
        assert h.svc.tracker.total == 0
        assert h.svc.slots.queued() == 0


async def test_a_request_that_queues_too_long_gets_503_concurrency_full(tmp_path: Path) -> None:
    timer, gate = ManualTimer(), Gate()
    cfg = base_config(
        [conn("c1", max_concurrent=1)],
        combos=[combo("q", ["c1"], queueTimeoutMs=2000)],
    )
    async with gateway(tmp_path, cfg, timer, gate.handler) as h:
        first = _ask(h, "A", "q")
        await gate.until(1)
        late = _ask(h, "B", "q")
        await timer.until_sleeping(1)
        timer.advance(2000)
        r = await late
        assert r.status_code == 503
        assert r.headers["retry-after"] == "2"
        body = r.json()
        assert body["error"]["code"] == "concurrency_full"
        assert body["diagnostics"]["terminalReason"] == "concurrency_full"
        assert body["diagnostics"]["waitedMs"] == 2000
        gate.let_through("A")
        assert (await first).status_code == 200
        assert h.svc.tracker.total == 0
        assert h.svc.slots.queued() == 0


async def test_a_slot_goes_to_another_candidate_when_one_is_free(tmp_path: Path) -> None:
    timer, gate = ManualTimer(), Gate()
    cfg = base_config([conn("c1", max_concurrent=1, weight=2), conn("c2", max_concurrent=1)])
    async with gateway(tmp_path, cfg, timer, gate.handler) as h:
        a = _ask(h, "A")
        await gate.until(1)
        b = _ask(h, "B")
        await gate.until(2)
        assert [r.conn.id for r in h.upstream.requests] == ["c1", "c2"]
        gate.let_through("A")
        gate.let_through("B")
        assert (await a).status_code == (await b).status_code == 200


async def test_the_slot_is_released_on_failure_and_cancellation(tmp_path: Path) -> None:
    timer, gate = ManualTimer(), Gate()  # the requests it never lets through hang upstream
    cfg = base_config([conn("c1", max_concurrent=1)])
    async with gateway(tmp_path, cfg, timer, gate.handler) as h:
        failing = _ask(h, "fail")
        await gate.until(1)
        gate.let_through("fail")
        assert (await failing).status_code == 400
        assert h.svc.tracker.total == 0
        task = _ask(h, "hang")
        for _ in range(1000):
            if h.svc.tracker.total:
                break
            await asyncio.sleep(0)
        assert h.svc.tracker.total == 1
        queued = _ask(h, "queued")
        await timer.until_sleeping(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the freed slot went to the queued request, whose upstream now hangs in turn
        for _ in range(1000):
            if len(h.upstream.requests) == 3:
                break
            await asyncio.sleep(0)
        assert h.svc.slots.queued() == 0
        assert h.svc.tracker.total == 1
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert h.svc.tracker.total == 0


async def test_the_wait_budget_ends_even_on_a_clock_that_does_not_move(tmp_path: Path) -> None:
    """A gateway whose injected clock stands still (a test's ManualClock) under the real
    timer: every wait is real but the target never stops cooling on the clock. The budget
    counts the waits asked for, so the request still ends (here after 4 × 50 ms)."""
    timer = ManualTimer()  # only its clock is used: the gateway keeps its SystemTimer
    cfg = base_config([conn("c1")], combos=[combo("w", ["c1"], maxWaitMs=200, maxRetries=0)])
    async with gateway(tmp_path, cfg, timer, _rate_limited_once(50)) as h:
        h.gw.timer = SystemTimer(timer.clock)
        r = await asyncio.wait_for(h.chat("w", max_tokens=5), timeout=30)
        assert r.status_code == 429
        assert r.json()["diagnostics"]["waitedMs"] == 0  # the clock never moved
        assert h.sent_to == ["c1"]
