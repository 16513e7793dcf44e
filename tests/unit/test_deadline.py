"""The lag-compensated deadline of store calls (fairgate.backends.deadline): a reply that a busy
event loop reads late is no timeout; a server that does not answer while the loop is
responsive is one. The loop is really blocked (``time.sleep`` inside it), no clock is faked."""

from __future__ import annotations

import asyncio
import time

import pytest

from fairgate.backends.deadline import NoReply, call_within, tolerance


def _block_loop(seconds: float) -> None:
    """What a starved host does to this process: nothing else runs on the loop meanwhile."""
    time.sleep(seconds)


async def test_a_reply_read_late_by_a_blocked_loop_is_not_a_timeout() -> None:
    async def quick() -> str:
        await asyncio.sleep(0.001)  # the server answers at once
        return "PONG"

    loop = asyncio.get_running_loop()
    loop.call_soon(_block_loop, 0.3)  # ... but the loop is busy for 6 x the timeout
    assert await call_within(quick(), 0.05, ceiling_s=5) == "PONG"
    # the same wait with a plain asyncio timeout is a (false) timeout
    loop.call_soon(_block_loop, 0.3)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(quick(), 0.05)


async def test_no_reply_on_a_responsive_loop_is_an_outage_and_the_call_is_cancelled() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def hung() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    with pytest.raises(NoReply):
        await call_within(hung(), 0.02, ceiling_s=5)
    await asyncio.sleep(0)
    assert started.is_set()
    assert cancelled.is_set()
    assert isinstance(NoReply(), ConnectionError)  # an outage for every driver (an OSError)


async def test_the_ceiling_bounds_the_wait_however_busy_the_loop() -> None:
    async def hung() -> None:
        await asyncio.Event().wait()

    ticks = iter(range(1_000))

    def always_late() -> float:  # every wake-up 0.1 s after the last look: a loop never free
        return next(ticks) * 0.1

    with pytest.raises(NoReply):
        await call_within(hung(), 0.001, ceiling_s=0.5, monotonic=always_late)
    assert next(ticks) < 20  # gave up at the ceiling, after a handful of looks


def test_tolerance_is_a_quarter_of_the_timeout_and_at_least_20_ms() -> None:
    assert tolerance(1.0) == 0.25
    assert tolerance(0.01) == 0.02


async def test_a_cancel_the_call_turns_into_its_own_timeout_error_is_still_no_reply() -> None:
    """redis-py may surface the watchdog's cancel as its TimeoutError: still an outage."""

    async def converts() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise TimeoutError("client-side timeout") from None

    with pytest.raises(NoReply):
        await call_within(converts(), 0.02, ceiling_s=5)
    await asyncio.sleep(0)  # the task carries no leftover cancel


async def test_a_call_that_swallows_the_cancel_and_answers_leaves_no_cancel_behind() -> None:
    async def swallows() -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "late answer"
        return "never"

    assert await call_within(swallows(), 0.02, ceiling_s=5) == "late answer"
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    await asyncio.sleep(0)  # would raise CancelledError if a cancel were left pending


async def test_a_cancel_from_outside_during_an_expired_call_is_not_turned_into_no_reply() -> None:
    """A shutdown cancels a task whose call already timed out while the client was still
    tidying up: the cancel must reach the task (a loop that retries ``NoReply``, such as the
    metadata watcher, would otherwise never stop)."""
    timed_out = asyncio.Event()

    async def slow_to_give_up() -> str:
        try:
            await asyncio.sleep(3600)  # no reply
        except asyncio.CancelledError:
            timed_out.set()  # the watchdog's cancel: the client tidies up, taking a while
            await asyncio.sleep(3600)
        return "never"

    async def caller() -> str:
        return await call_within(slow_to_give_up(), 0.01, ceiling_s=5)

    task = asyncio.create_task(caller())
    await timed_out.wait()
    task.cancel()  # the shutdown
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_the_watchdogs_own_cancel_is_still_no_reply() -> None:
    async def never() -> str:
        await asyncio.sleep(3600)
        return "never"

    task = asyncio.create_task(call_within(never(), 0.01, ceiling_s=5))
    with pytest.raises(NoReply):
        await task
    assert not task.cancelled()
    assert task.cancelling() == 0


async def test_every_call_in_flight_gets_its_own_deadline_from_the_one_timer() -> None:
    """The loop's calls share one timer (set for the earliest deadline): each must still come
    due, not just the first, and a short deadline added after a long one must not wait for
    it."""

    async def hung() -> None:
        await asyncio.Event().wait()

    long = asyncio.create_task(call_within(hung(), 30.0, ceiling_s=60))
    await asyncio.sleep(0)  # the long deadline is in first and set the timer
    results = await asyncio.gather(
        *(call_within(hung(), 0.02, ceiling_s=5) for _ in range(200)), return_exceptions=True
    )
    assert all(isinstance(r, NoReply) for r in results)
    assert not long.done()  # its deadline is its own: 30 s, not the short calls'
    long.cancel()
    with pytest.raises(asyncio.CancelledError):
        await long

    # calls that answer leave nothing behind that would cancel a later caller
    async def quick() -> str:
        await asyncio.sleep(0)
        return "PONG"

    assert [await call_within(quick(), 0.02, ceiling_s=5) for _ in range(50)] == ["PONG"] * 50
    await asyncio.sleep(0.1)  # past every deadline those calls had
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
