"""The request path's result: an answer as plain data, before HTTP.

The executor and the combos return an :class:`Outcome` (an error is an
:class:`~fairgate.process.errors.ApiError` raised); only the edge (:mod:`fairgate.path.render`,
called by :mod:`fairgate.path.proxy`) turns it into an HTTP answer with the ``x-fairgate-*`` and
``x-ratelimit-*`` headers. Before, the answer was a Starlette response from the attempt on: the
combos learned who served by reading fairgate's own ``x-fairgate-connection`` header back, the
settlement rode as the response's background task, and every layer could add headers.

A settlement is ended exactly once: :meth:`Outcome.settle` runs the settlement of a whole
answer the first time it is called and never again (the edge calls it after the answer is
sent, a combo that uses the answer itself, or drops it, calls it at once); a stream settles
when its chunk iterator ends or is closed (:meth:`Outcome.discard` closes one nobody reads).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from fairgate.formats.usage import Usage
from fairgate.quota.outcomes import Admission

__all__ = ["Outcome"]


@dataclass(slots=True, eq=False)
class Outcome:
    """One answer of the request path (a 200): its content and the facts the edge renders.

    ``body``: the whole answer (JSON, or a whole event stream when ``sse``); ``chunks``: a
    streamed answer's events as they come (then ``body`` is empty). ``served_by``: the
    connection that served (None for an answer the gateway composed); ``admission``: the
    admission it was served under (its quota headers); ``omitted``, ``tools_omitted``: what
    the translation could not carry; ``compressed_dropped``: the messages dropped to fit the
    target's window; ``hedged``/``fan_out``: how a combo raced for it."""

    body: bytes = b""
    chunks: AsyncIterator[bytes] | None = None
    sse: bool = False
    served_by: str | None = None
    combo: str | None = None
    overhead_ms: float | None = None
    usage: Usage | None = None
    admission: Admission | None = None
    omitted: str | None = None
    tools_omitted: str | None = None
    compressed_dropped: int | None = None
    hedged: bool = False
    fan_out: int | None = None
    #: the settlement of a whole answer, until :meth:`settle` has run it
    pending: Callable[[], Awaitable[None]] | None = None

    @property
    def settles(self) -> bool:
        """Whether a settlement is still to run (a whole answer whose reservation is open)."""
        return self.pending is not None

    async def settle(self) -> None:
        """Run the answer's settlement, the first time only (later calls do nothing)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            await pending()

    async def discard(self) -> None:
        """An answer that is not sent (a race's loser, a shadow's): settled as if it had been,
        since the upstream did the work. A stream is started and closed at once: that ends
        its upstream response, gives its slot back and settles what was produced."""
        await self.settle()
        chunks = self.chunks
        if chunks is not None:
            with contextlib.suppress(StopAsyncIteration):
                await chunks.__anext__()
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
