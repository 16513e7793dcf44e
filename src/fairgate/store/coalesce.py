"""Calls that go to a store together: while one call of a group is in flight, the next calls
of that group wait and then go as one batch.

Why: a governed request settles once, and on Redis every settle was its own script call. A
script call has a fixed cost in redis-server (the call itself, then the pool's shared keys it
reads and writes: the cumulative totals, the active set, the pool total's bucket) that is the
same for one settle or ten. Settles are off the request's path (its answer has gone out), so
they can wait for the batch in flight to come back: under load they then go several at a time,
each counter read and written once for all of them. A call that finds its group idle goes out
at once from its own task, as it did before batching: one request at a time pays nothing (a
first version started a task for every batch, and the loop turns that cost put each settle
behind the next request's admission: docs/performance.md, "Figures behind the code").

What a caller sees is unchanged: :meth:`Coalescer.submit` returns when *its* call has been
applied (with that call's own result) or raises what its batch raised, so a failed batch fails
each of its calls and the engine journals each as it would a lone one. A caller that is
cancelled while it waits in a batch leaves its call there (it may already be on the wire: a
store write is never taken back half way). :meth:`Coalescer.drain` waits until every call
handed in has been sent and answered, which a store's ``close`` does, so a graceful stop loses
none.

Bounded: a batch takes at most ``max_batch`` calls, the rest wait for the next one; a group
with nothing waiting or in flight holds no memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

G = TypeVar("G", bound=Hashable)
I = TypeVar("I")  # noqa: E741 - the item a call hands in
R = TypeVar("R")


class _Group(Generic[I, R]):
    """A group with a call in flight: what waits behind it, and when it is idle again."""

    __slots__ = ("idle", "task", "waiting")

    def __init__(self, idle: asyncio.Future[None]) -> None:
        self.waiting: list[tuple[I, asyncio.Future[R]]] = []
        self.task: asyncio.Task[None] | None = None  # the batches sent for the waiting calls
        self.idle = idle  # done once nothing is in flight or waiting


class Coalescer(Generic[G, I, R]):
    """Per group (a pool), at most one call in flight; ``send(group, items)`` applies a batch
    and returns one result per item, in order."""

    def __init__(
        self, send: Callable[[G, list[I]], Awaitable[Sequence[R]]], *, max_batch: int
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._send = send
        self._max = max_batch
        self._groups: dict[G, _Group[I, R]] = {}

    async def submit(self, group: G, item: I) -> R:
        g = self._groups.get(group)
        if g is not None:  # a call of the group is in flight: wait, then go with the others
            fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
            g.waiting.append((item, fut))
            return await fut
        g = self._groups[group] = _Group(asyncio.get_running_loop().create_future())
        try:  # idle: this call goes now, alone, from the caller's own task
            results = await self._send(group, [item])
        finally:
            self._next(group, g)
        return _one(results, 1)[0]

    def _next(self, group: G, g: _Group[I, R]) -> None:
        """A call or batch of ``g`` came back: send what waited meanwhile, or go idle."""
        if g.waiting:
            g.task = asyncio.ensure_future(self._run(group, g))
            return
        if self._groups.get(group) is g:
            del self._groups[group]
        if not g.idle.done():
            g.idle.set_result(None)

    async def _run(self, group: G, g: _Group[I, R]) -> None:
        batch, g.waiting = g.waiting[: self._max], g.waiting[self._max :]
        try:
            results = _one(await self._send(group, [item for item, _ in batch]), len(batch))
        except Exception as exc:  # every call of the batch fails with it
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
        except BaseException:  # cancelled (the loop is closing): so are the callers
            for _, fut in batch + g.waiting:
                fut.cancel()
            g.waiting = []
            raise
        else:
            for (_, fut), result in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(result)
        finally:
            g.task = None
            self._next(group, g)

    async def drain(self) -> None:
        """Wait until every call handed in so far has been sent and answered (a store closing:
        nothing waiting is dropped). Calls handed in meanwhile are waited for too."""
        while self._groups:
            await asyncio.gather(*(g.idle for g in list(self._groups.values())))


def _one(results: Sequence[R], n: int) -> Sequence[R]:
    if len(results) != n:
        raise RuntimeError(f"a batch of {n} answered {len(results)}")
    return results
