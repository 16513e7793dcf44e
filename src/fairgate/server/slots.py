"""Per-connection concurrency slots: a real semaphore with a bounded FIFO queue.

A connection's ``max_concurrent`` is how many requests the account takes at once. The executor
first tries every candidate with a free slot; when every remaining candidate is at its cap, the
request queues for a slot on *any* of them, first come first served, up to the combo's
``queueTimeoutMs`` (then 503 ``concurrency_full`` with ``Retry-After``), instead of overloading
an account or failing at once.

The slots are the :class:`~fairgate.routing.InflightTracker`'s counts (the same numbers the
strategies read), so a slot *is* a :class:`~fairgate.routing.Lease`. A freed slot is handed
straight to the first waiter (its lease is taken on its behalf before it wakes), so a request
arriving meanwhile cannot jump the queue; a waiter that gives up or was cancelled after the
hand-over releases that lease, which hands it on to the next.

Per process: with several replicas each enforces the cap on its own traffic (see
docs/design-notes.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from fairgate.routing import InflightTracker, Lease, Target
from fairgate.timers import Timer

__all__ = ["Slots"]


@dataclass(eq=False)
class _Waiter:
    wants: dict[str, tuple[Target, int]]  # load key → (target, cap)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    granted: tuple[Target, Lease] | None = None
    gone: bool = False


class Slots:
    def __init__(self, tracker: InflightTracker) -> None:
        self._tracker = tracker
        self._queues: dict[str, deque[_Waiter]] = {}
        tracker.on_release = self._on_release

    @staticmethod
    def capped(cap: int | None) -> bool:
        return cap is not None and cap > 0

    def try_acquire(self, target: Target, cap: int | None) -> Lease | None:
        """A slot now, or None when the connection is at its cap or others queue for it."""
        if not self.capped(cap):
            return self._tracker.acquire(target)
        assert cap is not None
        if self._queues.get(target.load_key) or self._tracker.count(target) >= cap:
            return None
        return self._tracker.acquire(target)

    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def wait(
        self, wants: Sequence[tuple[Target, int]], deadline_ms: int, timer: Timer
    ) -> tuple[Target, Lease] | None:
        """Queue for a slot on any of ``wants`` until ``deadline_ms``; the target that freed
        and its slot, or None on timeout. Cancellation gives a granted slot back."""
        waiter = _Waiter({t.load_key: (t, cap) for t, cap in wants})
        for key in waiter.wants:
            self._queues.setdefault(key, deque()).append(waiter)
        try:
            await timer.sleep_until(deadline_ms, waiter.event)
        except BaseException:
            self._leave(waiter)
            if waiter.granted is not None:
                waiter.granted[1].release()
            raise
        self._leave(waiter)
        return waiter.granted

    def _leave(self, waiter: _Waiter) -> None:
        waiter.gone = True
        for key in waiter.wants:
            q = self._queues.get(key)
            if q is None:
                continue
            with contextlib.suppress(ValueError):
                q.remove(waiter)
            if not q:
                del self._queues[key]

    def _on_release(self, key: str) -> None:
        q = self._queues.get(key)
        while q:
            waiter = q[0]
            if waiter.gone or waiter.granted is not None:
                q.popleft()
                continue
            target, cap = waiter.wants[key]
            if self._tracker.count(target) >= cap:
                return
            waiter.granted = (target, self._tracker.acquire(target))
            self._leave(waiter)
            waiter.event.set()
            return
