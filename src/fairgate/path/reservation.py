"""A quota reservation as a context-managed ticket: settled or released exactly once.

An admission reserves its estimated cost in the store; that reservation must end in exactly
one of two ways: *settled* with the real usage when the upstream did the work, or *released*
when it did not (a failure, a request that went elsewhere, a cancelled combo, a losing fan-out
branch, a client that went away). Before this type the request path ended reservations by hand
at a dozen places and missed a few (a held soft admission on cancellation kept its quota until
the 10-minute lease expired).

``async with Reservation(...) as res:`` releases on the way out unless the block settled it or
handed it on with :meth:`keep` (the answer settles it when its body is done). On an exception,
cancellation included, the release is spawned rather than awaited: a cancelled task must not
wait on the store, and the shutdown drain still sees the task. Every reservation still open is
in ``inflight``, which the shutdown releases.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from fairgate.domain.units import Unit
from fairgate.providers.closing import AsyncClosing
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.outcomes import Ticket

__all__ = ["Reservation"]

Spawn = Callable[[Coroutine[Any, Any, None]], None]


class Reservation(AsyncClosing):
    __slots__ = ("_engine", "_inflight", "_kept", "_open", "_spawn", "ticket")

    def __init__(
        self, engine: QuotaEngine, ticket: Ticket | None, inflight: set[Ticket], spawn: Spawn
    ) -> None:
        self._engine = engine
        self.ticket = ticket
        self._inflight = inflight
        self._spawn = spawn
        self._open = ticket is not None
        self._kept = False
        if ticket is not None:
            inflight.add(ticket)

    @property
    def open(self) -> bool:
        return self._open

    def _close(self) -> Ticket | None:
        if not self._open:
            return None
        self._open = False
        assert self.ticket is not None
        self._inflight.discard(self.ticket)
        return self.ticket

    async def settle(self, actual: Mapping[Unit, float]) -> None:
        """Replace the reservation with the real usage (a no-op once ended)."""
        ticket = self._close()
        if ticket is not None:
            await self._engine.settle(ticket, actual)

    async def release(self) -> None:
        """Give the reserved quota back (a no-op once ended)."""
        ticket = self._close()
        if ticket is not None:
            await self._engine.release(ticket)

    def release_soon(self) -> None:
        """Release in a task of its own (from a ``finally`` that must not wait)."""
        ticket = self._close()
        if ticket is not None:
            self._spawn(self._engine.release(ticket))

    def keep(self) -> None:
        """The answer owns the reservation now (it settles it when its body is done): leaving
        the ``async with`` block must not release it."""
        self._kept = True

    async def close(self) -> None:
        """What leaving the ``async with`` block normally does: release, unless kept. For an
        owner that holds several without an exit stack (:func:`fairgate.path.executor.execute`)
        as for the block itself."""
        if not self._kept:
            await self.release()

    def abandon(self) -> None:
        """What leaving the block by an exception (a cancellation included) does: release in a
        task of its own, unless kept."""
        if not self._kept:
            self.release_soon()

    async def close_on_error(self) -> None:
        self.abandon()
