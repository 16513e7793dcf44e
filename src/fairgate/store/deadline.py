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
    cancel it and raise :class:`NoReply` when it is exceeded, or after ``ceiling_s`` in all.

    The watchdog is a timer on the loop that cancels the calling task, as ``asyncio.timeout``
    does: no task per call and no ``asyncio.wait`` (those cost more than the Redis command
    itself on the hot path)."""
    task = asyncio.current_task()
    if task is None:  # pragma: no cover - always called from a task
        raise RuntimeError("call_within needs a running task")
    loop = asyncio.get_running_loop()
    cancelling = task.cancelling()  # cancels asked before this call are not the watchdog's
    watchdog = _Watchdog(task, loop, timeout_s, ceiling_s, monotonic)
    try:
        result = await awaitable
    except BaseException as exc:
        # as asyncio.timeout: only the watchdog's own cancel becomes NoReply; a cancel someone
        # else asked meanwhile (a shutdown cancelling this task) goes on, or a caller that
        # retries NoReply (the metadata watcher) would never stop
        if watchdog.expired and task.uncancel() <= cancelling:
            # the cancel may surface as the client's own timeout error: it is the same outage
            raise NoReply(f"no reply within {timeout_s:g} s") from exc
        raise
    finally:
        watchdog.disarm()
    if watchdog.expired:  # the call swallowed the cancel and answered: take the cancel back
        task.uncancel()
    return result


class _Watchdog:
    """The timer of one :func:`call_within`: wakes after the wait, re-arms while the loop was
    late, cancels the task once it woke on time (or the ceiling is reached)."""

    __slots__ = (
        "_asked",
        "_ceiling",
        "_handle",
        "_loop",
        "_mono",
        "_start",
        "_task",
        "_timeout",
        "_wait",
        "expired",
    )

    def __init__(
        self,
        task: asyncio.Task[object],
        loop: asyncio.AbstractEventLoop,
        timeout_s: float,
        ceiling_s: float,
        monotonic: Callable[[], float],
    ) -> None:
        self._task, self._loop, self._mono = task, loop, monotonic
        self._timeout, self._ceiling = timeout_s, ceiling_s
        self.expired = False
        self._start = monotonic()
        self._handle: asyncio.TimerHandle | None = None
        self._arm(timeout_s)

    def _arm(self, wait: float) -> None:
        self._asked, self._wait = self._mono(), wait
        self._handle = self._loop.call_later(wait, self._wake)

    def _wake(self) -> None:
        now = self._mono()
        late = now - self._asked - self._wait
        left = self._ceiling - (now - self._start)
        if late <= tolerance(self._timeout) or left <= 0:
            self._handle = None
            self.expired = True
            self._task.cancel()
            return
        # the loop was busy: give the call the time it lost, then look again
        self._arm(min(max(late, tolerance(self._timeout)), left))

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
