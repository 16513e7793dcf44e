"""The client's request as the request path reads it (no web framework in sight).

Starlette's ``Request`` decodes the raw header list again on every lookup and reads the body
through an async generator over ``receive``. :class:`ClientRequest` is built by the edge
(:mod:`fairgate.process.edge`) from the one pass it makes over the headers anyway: a plain dict
of the decoded headers, and the ASGI ``receive`` for the body and the disconnect. Kept apart
from the answers (:mod:`fairgate.process.client_http`, Starlette's responses) so that the
request path below its edge can take a request without importing a way to render an answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

__all__ = ["ClientRequest", "Receive", "Scope", "decode_headers"]

#: The ASGI types, as Starlette spells them (``starlette.types``).
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


def decode_headers(raw: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    """The ASGI header list (lower-case names) as a dict, latin-1 decoded as Starlette decodes
    them. A header sent twice keeps its first value, as Starlette's ``headers.get`` answers."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(raw)}


class ClientRequest:
    """One client request: its ASGI scope and ``receive``, its headers decoded once (lower-case
    names; the first value of a repeated header), and the application serving it (whose
    ``state`` holds the long-lived services)."""

    __slots__ = ("app", "headers", "receive", "scope")

    def __init__(self, scope: Scope, receive: Receive, headers: dict[str, str], app: Any) -> None:
        self.scope = scope
        self.receive = receive
        self.headers = headers
        self.app = app

    @classmethod
    def of_scope(cls, scope: Scope, receive: Receive, app: Any) -> ClientRequest:
        """A request straight from an ASGI scope (the router's way in: a HEAD for a GET route)."""
        return cls(scope, receive, decode_headers(scope["headers"]), app)
