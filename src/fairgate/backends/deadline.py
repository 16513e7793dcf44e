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
import weakref
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

    The watchdog cancels the calling task, as ``asyncio.timeout`` does: no task per call and
    no ``asyncio.wait`` (those cost more than the Redis command itself on the hot path). Nor a
    timer per call: the loop's one :class:`_Sweeper` looks at every call in flight when the
    earliest of them is due (a timer made and cancelled per call cost more than the rest of
    this function)."""
    task = asyncio.current_task()
    if task is None:  # pragma: no cover - always called from a task
        raise RuntimeError("call_within needs a running task")
    sweeper = _sweeper(asyncio.get_running_loop())
    cancelling = task.cancelling()  # cancels asked before this call are not the watchdog's
    watch = _Watch(task, timeout_s, ceiling_s, monotonic)
    sweeper.add(watch)
    try:
        result = await awaitable
    except BaseException as exc:
        # as asyncio.timeout: only the watchdog's own cancel becomes NoReply; a cancel someone
        # else asked meanwhile (a shutdown cancelling this task) goes on, or a caller that
        # retries NoReply (the metadata watcher) would never stop
        if watch.expired and task.uncancel() <= cancelling:
            # the cancel may surface as the client's own timeout error: it is the same outage
            raise NoReply(f"no reply within {timeout_s:g} s") from exc
        raise
    finally:
        watch.done = True
    if watch.expired:  # the call swallowed the cancel and answered: take the cancel back
        task.uncancel()
    return result


class _Watch:
    """One :func:`call_within`'s deadline: due ``wait`` after ``asked``; once due, cancels the
    task if the loop came on time (or the ceiling is reached), else waits again for the time
    the loop lost."""

    __slots__ = (
        "_ceiling",
        "_mono",
        "_start",
        "_task",
        "_timeout",
        "asked",
        "done",
        "expired",
        "wait",
    )

    def __init__(
        self,
        task: asyncio.Task[object],
        timeout_s: float,
        ceiling_s: float,
        monotonic: Callable[[], float],
    ) -> None:
        self._task, self._mono = task, monotonic
        self._timeout, self._ceiling = timeout_s, ceiling_s
        self.expired = self.done = False
        self._start = self.asked = monotonic()
        self.wait = timeout_s

    def look(self) -> float | None:
        """Act on a due deadline: the seconds until it is due (again), or None once it has
        cancelled the task."""
        now = self._mono()
        late = now - self.asked - self.wait
        if late < 0:  # not due yet (another call's deadline woke the sweeper)
            return -late
        left = self._ceiling - (now - self._start)
        if late <= tolerance(self._timeout) or left <= 0:
            self.expired = True
            self._task.cancel()
            return None
        # the loop was busy: give the call the time it lost, then look again
        self.asked, self.wait = now, min(max(late, tolerance(self._timeout)), left)
        return self.wait


class _Sweeper:
    """The deadlines of one event loop's calls in flight, and one timer for all of them, set
    for the earliest. A call adds its deadline and marks it done when it returns: O(1), no
    timer touched while the deadlines come due in the order they were added (one timeout per
    caller). When the timer fires, every deadline is looked at once: the done ones dropped, the
    due ones acted on (:meth:`_Watch.look`), the timer set for the earliest left. That is one
    pass per timeout over the calls made meanwhile, O(1) per call."""

    __slots__ = ("_due_at", "_handle", "_watches", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._watches: list[_Watch] = []
        self._handle: asyncio.TimerHandle | None = None
        self._due_at = 0.0  # loop time the timer fires at

    def add(self, watch: _Watch) -> None:
        self._watches.append(watch)
        at = self.loop.time() + watch.wait
        if self._handle is None or at < self._due_at:
            self._arm(at)

    def _arm(self, at: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._due_at = at
        self._handle = self.loop.call_at(at, self._sweep)

    def _sweep(self) -> None:
        self._handle = None
        kept: list[_Watch] = []
        soonest: float | None = None
        for watch in self._watches:
            if watch.done or (due := watch.look()) is None:
                continue
            kept.append(watch)
            if soonest is None or due < soonest:
                soonest = due
        self._watches = kept
        if soonest is not None:
            self._arm(self.loop.time() + soonest)


#: each running loop's sweeper (a loop that is gone takes its own with it)
_SWEEPERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Sweeper] = (
    weakref.WeakKeyDictionary()
)
#: the last one asked for: a process runs one loop, and this spares the weak lookup per call
#: (a list, so threads running loops of their own replace it without a ``global``)
_last: list[_Sweeper | None] = [None]


def _sweeper(loop: asyncio.AbstractEventLoop) -> _Sweeper:
    last = _last[0]
    if last is not None and last.loop is loop:
        return last
    found = _SWEEPERS.get(loop)
    if found is None:
        found = _SWEEPERS[loop] = _Sweeper(loop)
    _last[0] = found
    return found
