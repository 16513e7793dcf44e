"""Serves the dashboard's static files at ``/dashboard/``.

Why the page itself is public: it is static HTML/JS/CSS with no data in it. Everything it shows
comes from the admin API, which the page calls with the admin key the operator types in (kept in
``sessionStorage``, sent as ``Authorization: Bearer``), so the key check stays in one place.

The answers carry a strict Content-Security-Policy (same-origin scripts, styles and fetches only,
no inline script, no framing): the page needs no CDN, works offline, and an injected string in,
say, a pool name cannot run as script.
"""

from __future__ import annotations

from pathlib import Path

from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DASHBOARD_DIR = Path(__file__).resolve().parent.parent / "dashboard"

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    # the files are tiny and change with the gateway version: always revalidate
    (b"cache-control", b"no-cache"),
)


class _WithHeaders:
    """Adds :data:`SECURITY_HEADERS` to every answer of the wrapped app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", ())
                    if bytes(k).lower() != b"cache-control"
                ]
                names = {bytes(k).lower() for k, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in names]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def dashboard_mount(directory: Path = DASHBOARD_DIR) -> Mount:
    """``/dashboard/`` → ``index.html``, ``/dashboard/app.js`` etc.; ``/dashboard`` redirects to
    ``/dashboard/`` (the main router adds the slash), so relative asset URLs resolve."""
    return Mount(
        "/dashboard",
        app=_WithHeaders(StaticFiles(directory=directory, html=True, check_dir=False)),
        name="dashboard",
    )
