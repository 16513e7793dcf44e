"""A deadline that a starved event loop cannot break: a store call's timeout, lag compensated.

Why: a plain ``asyncio`` timeout (redis-py's socket timeout is one) counts the time this
process's event loop takes to get round to a reply. On a host whose cores are busy, a reply that
arrived in a millisecond may be read seconds later, and the timeout fires although the server
answered: a false outage, and every admission in flight fails open.

The rule (:func:`call_within`): the caller waits ``timeout_s`` for the call. When the watchdog
wakes up and the call is still pending, it checks how late it woke. Late by more than
:func:`tolerance` means the loop was busy: the reply may be sitting in a socket buffer, not yet
read, so the watchdog waits again (the call gets the time the loop took from it). Only a
watchdog that wakes *on time* and finds the call still pending proves that the loop was
responsive and the server did not answer: that is :class:`NoReply`, an outage. A hard ceiling
(``ceiling_s``) bounds the wait whatever the loop does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class NoReply(ConnectionError):
    """The store did not answer within its timeout while this process's loop was responsive:
    an outage, like a refused connection (an ``OSError``, so every driver counts it as one),
    not an ambiguous timeout."""


def tolerance(timeout_s: float) -> float:
    """How late a watchdog may wake and still count as on time: a quarter of the timeout, at
    least 20 ms (a responsive loop wakes a timer within a millisecond or two)."""
    return max(0.02, timeout_s / 4)


async def call_within(
    awaitable: Awaitable[T],
    timeout_s: float,
    *,
    ceiling_s: float,
    monotonic: Callable[[], float] = time.monotonic,
) -> T:
    """Await ``awaitable`` for ``timeout_s`` of *responsive* loop time (module docstring);
    cancel it and raise :class:`NoReply` when it is exceeded, or after ``ceiling_s`` in all."""
    task = asyncio.ensure_future(awaitable)
    start = monotonic()
    wait = timeout_s
    try:
        while True:
            asked = monotonic()
            done, _ = await asyncio.wait((task,), timeout=wait)
            if done:
                return task.result()
            now = monotonic()
            late = now - asked - wait
            left = ceiling_s - (now - start)
            if late <= tolerance(timeout_s) or left <= 0:
                raise NoReply(f"no reply within {timeout_s:g} s")
            # the loop was busy: give the call the time it lost, then look again
            wait = min(max(late, tolerance(timeout_s)), left)
    finally:
        if not task.done():
            task.cancel()
