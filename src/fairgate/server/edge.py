"""The outermost ASGI layer: refuse a request whose ``Host`` names no address of this gateway.

A browser page on an attacker's site can resolve its own name to 127.0.0.1 (DNS rebinding) and
then read a gateway listening on loopback as if it were same-origin; the request still carries
the attacker's name in ``Host``, which is what this check refuses (400, before any route).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from fairgate.server.errors import ApiError, error_response
from fairgate.server.http_settings import host_allowed

__all__ = ["AllowedHostsMiddleware"]


class AllowedHostsMiddleware:
    """400 ``host_not_allowed`` when the ``Host`` header is not in ``allowed`` (None: any)."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str] | None) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.allowed is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if host_allowed(self.allowed, Headers(scope=scope).get("host")):
            await self.app(scope, receive, send)
            return
        err = ApiError(
            400,
            "This gateway does not answer to that host name (see FAIRGATE_ALLOWED_HOSTS)",
            code="host_not_allowed",
        )
        await error_response(err)(scope, receive, send)
