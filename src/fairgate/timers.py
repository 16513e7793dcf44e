"""Injected waiting: sleep until a time on the injected clock, or until woken.

The request path waits in three places: the pause between two fall-throughs
(``fallbackDelayMs``) and retries (``retryDelayMs``), the bounded wait for a target that is
cooling down, and the queue for a concurrency slot. Each waits *until an instant on the
clock* or until something it watches happens (a slot freed), whichever comes first: never a
blind sleep. :class:`SystemTimer` does that on the event loop; :class:`ManualTimer` does it on
a :class:`~fairgate.clock.ManualClock` that tests move with :meth:`ManualTimer.advance`, so a
test of an 800 ms wait takes microseconds and cannot flake on a busy machine.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from fairgate.clock import SYSTEM_CLOCK, Clock, ManualClock

__all__ = ["ManualTimer", "SystemTimer", "Timer"]


class Timer(Protocol):
    @property
    def clock(self) -> Clock: ...

    async def sleep_until(self, deadline_ms: int, wake: asyncio.Event | None = None) -> bool:
        """Return at ``deadline_ms`` (False) or as soon as ``wake`` is set (True)."""
        ...


class SystemTimer:
    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock

    @property
    def clock(self) -> Clock:
        return self._clock

    async def sleep_until(self, deadline_ms: int, wake: asyncio.Event | None = None) -> bool:
        delay = max(0.0, (deadline_ms - self._clock.now_ms()) / 1000)
        if wake is None:
            await asyncio.sleep(delay)
            return False
        if wake.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await wake.wait()
                return True
        return False


class ManualTimer:
    """Sleeps on a :class:`ManualClock`: a sleeper returns when :meth:`advance` (or
    :meth:`set`) moves the clock to or past its deadline, or when its event is set."""

    def __init__(self, clock: ManualClock | None = None) -> None:
        self._clock = clock or ManualClock()
        self._sleepers: list[tuple[int, asyncio.Future[None]]] = []

    @property
    def clock(self) -> ManualClock:
        return self._clock

    @property
    def sleeping(self) -> int:
        return sum(1 for _, f in self._sleepers if not f.done())

    async def until_sleeping(self, n: int = 1, *, spins: int = 10_000) -> None:
        """Let the event loop run until ``n`` sleepers wait (a test's "the request is now
        waiting"). Fails loudly instead of hanging."""
        for _ in range(spins):
            if self.sleeping >= n:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"expected {n} sleeper(s), have {self.sleeping}")

    def advance(self, ms: int) -> None:
        self.set(self._clock.now_ms() + ms)

    def set(self, now_ms: int) -> None:
        self._clock.set(now_ms)
        keep = []
        for deadline, fut in self._sleepers:
            if fut.done():
                continue
            if deadline <= now_ms:
                fut.set_result(None)
            else:
                keep.append((deadline, fut))
        self._sleepers = keep

    @staticmethod
    async def _wait(wake: asyncio.Event) -> None:
        await wake.wait()

    async def sleep_until(self, deadline_ms: int, wake: asyncio.Event | None = None) -> bool:
        if wake is not None and wake.is_set():
            return True
        if deadline_ms <= self._clock.now_ms():
            await asyncio.sleep(0)
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((deadline_ms, fut))
        if wake is None:
            try:
                await fut
            finally:
                fut.cancel()
            return False
        waiter: asyncio.Future[None] = asyncio.ensure_future(self._wait(wake))
        try:
            await asyncio.wait({fut, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            fut.cancel()
            waiter.cancel()
        return wake.is_set()
