"""The ``/api`` admin app (FastAPI): pools, plans, usage, preview, connections, keys, combos,
settings.

Mounted by the main app at ``/api``; routes are declared without the prefix and the schema is at
``/openapi.json`` (``/api/openapi.json`` once mounted).

Authentication happens in :class:`AdminGuard`, an ASGI middleware, *before* the body is read, so
an unauthenticated caller learns nothing, not even whether its JSON parses. The same guard turns
any unexpected exception into a sanitized 500 (no traceback, path or secret), so a bad input can
never surface as a stack trace. The route-level security dependency only documents the two
accepted headers in the OpenAPI schema (and re-checks, should the guard ever be removed).
"""

from __future__ import annotations

import hmac
import logging
from typing import Annotated

import orjson
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fairgate import __version__
from fairgate.admin.aliases import router as aliases_router
from fairgate.admin.combo_stats import router as combo_stats_router
from fairgate.admin.combos import router as combos_router
from fairgate.admin.common import AdminError, error_response
from fairgate.admin.oauth import router as oauth_router
from fairgate.admin.pools import router as pools_router
from fairgate.admin.resilience import router as resilience_router
from fairgate.admin.resources import router as resources_router
from fairgate.admin.testing import router as testing_router
from fairgate.config import dotted
from fairgate.db.common import Conflict, Invalid, MetadataUnavailable, NotFound, RepoError
from fairgate.process.guards import AdminBackoff
from fairgate.process.http_settings import HttpSettings
from fairgate.process.state import Gateway

log = logging.getLogger("fairgate.admin")

OPENAPI_PATH = "/openapi.json"
_PUBLIC = frozenset({OPENAPI_PATH})

_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <admin key>")
_header = APIKeyHeader(name="x-admin-key", auto_error=False, description="The admin key")


def admin_problem(gw: Gateway, headers: Headers) -> str | None:
    """Why this request may not use the admin API, or None. The compare is constant-time."""
    if not gw.admin_key:
        return "The admin API is disabled: set FAIRGATE_ADMIN_KEY to enable it"
    presented = presented_key(headers)
    if not presented:
        return "Missing admin key: send 'Authorization: Bearer <admin key>' or 'x-admin-key'"
    if hmac.compare_digest(presented.encode("utf-8"), gw.admin_key.encode("utf-8")):
        return None
    if gw.registry.authenticate(presented) is not None:
        return CLIENT_KEY_PROBLEM
    return "Invalid admin key"


#: The caller is authenticated (a valid client key) but not allowed here: 403, not 401.
CLIENT_KEY_PROBLEM = "Client keys cannot use the admin API; use the admin key"


def problem_status(problem: str) -> int:
    """401 asks for credentials; a valid client key has them and is refused the admin API."""
    return 403 if problem == CLIENT_KEY_PROBLEM else 401


def _auth_headers(status: int) -> dict[str, str] | None:
    return {"WWW-Authenticate": "Bearer"} if status == 401 else None


def presented_key(headers: Headers) -> str:
    """The admin key a request presents (``x-admin-key`` or a Bearer token), or ""."""
    presented = headers.get("x-admin-key")
    if not presented:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        presented = token.strip() if scheme.lower() == "bearer" else ""
    return presented


def _route_path(scope: Scope) -> str:
    """The path inside this app (Starlette keeps the full path and sets ``root_path``)."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


class AdminGuard:
    """Admin key check before anything else (wrong keys logged and throttled per client
    address), ``Cache-Control: no-store`` on every answer (they carry keys and configuration),
    and the last-resort 500."""

    def __init__(self, app: ASGIApp, gw: Gateway, limits: HttpSettings) -> None:
        self.app = app
        self.gw = gw
        self.backoff = AdminBackoff(
            limits.admin_free_failures,
            int(limits.admin_backoff_s * 1000),
            int(limits.admin_backoff_max_s * 1000),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def no_store(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["cache-control"] = "no-store"
            await send(message)

        if _route_path(scope) not in _PUBLIC and await self._refused(scope, receive, no_store):
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await no_store(message)

        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:
            log.debug("admin client disconnected", extra={"path": _route_path(scope)})
        except Exception as exc:
            log.error(
                "admin API error",
                extra={"path": _route_path(scope), "error": type(exc).__name__},
                exc_info=True,
            )
            if started:
                raise
            resp = error_response(500, "Internal error in the admin API")
            await resp(scope, receive, send)

    async def _refused(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer (and return True) when this request may not use the admin API."""
        client = scope.get("client")
        addr = str(client[0]) if client else "?"
        now = self.gw.clock.now_ms()
        wait_ms = self.backoff.locked_for(addr, now)
        headers = Headers(scope=scope)
        problem = admin_problem(self.gw, headers)
        if problem is None:
            # the right key always passes, lockout or not: whoever shares the admin's address
            # (a NAT, a proxy) must not keep the admin out. A success during a lockout does not
            # forget the address's failures, or a guesser there would get its free tries back.
            if not wait_ms:
                self.backoff.succeeded(addr)
            return False
        if wait_ms:
            self.backoff.failed(addr, now)
            retry = str(max(1, -(-self.backoff.locked_for(addr, now) // 1000)))
            resp = error_response(
                429, "Too many wrong admin keys; wait and retry", headers={"Retry-After": retry}
            )
            await resp(scope, receive, send)
            return True
        if self.gw.admin_key and presented_key(headers):
            failures = self.backoff.failed(addr, now)
            log.warning(  # never the key itself
                "admin authentication failed",
                extra={"client": addr, "failures": failures, "path": _route_path(scope)},
            )
        status = problem_status(problem)
        resp = error_response(status, problem, headers=_auth_headers(status))
        await resp(scope, receive, send)
        return True


async def require_admin(
    request: Request,
    _bearer_cred: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    _header_key: Annotated[str | None, Depends(_header)],
) -> None:
    problem = admin_problem(request.app.state.gateway, request.headers)
    if problem is not None:
        raise AdminError(problem_status(problem), problem)


async def metadata_answers(request: Request) -> None:
    """Every admin call first makes sure a PostgreSQL metadata DB answers, without holding the
    event loop (``Gateway.ensure_metadata_answers``): the routes then use the synchronous
    connection on the loop, which a server that hangs would hold for the statement deadline."""
    await request.app.state.gateway.ensure_metadata_answers()


def _validation_fields(exc: RequestValidationError) -> tuple[bool, list[tuple[str, str]]]:
    """(is malformed JSON, [(field, message)]). The location's first part (body, query, path)
    is dropped; the rejected input is never echoed."""
    fields: list[tuple[str, str]] = []
    malformed = False
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            malformed = True
            continue
        loc = tuple(err.get("loc", ()))
        if loc and loc[0] in ("body", "query", "path", "header") and len(loc) > 1:
            loc = loc[1:]
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        fields.append((dotted(loc), msg))
    return malformed, fields


def _install_error_handlers(app: FastAPI) -> None:
    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        malformed, fields = _validation_fields(exc)
        if malformed:
            return error_response(400, "Malformed JSON in the request body")
        if isinstance(exc.body, bytes | str) and exc.body:
            # the body was not parsed: not JSON, or JSON sent without a JSON content type
            try:
                orjson.loads(exc.body)
            except orjson.JSONDecodeError:
                return error_response(400, "Malformed JSON in the request body")
            return error_response(400, "Send the body as JSON (Content-Type: application/json)")
        summary = "; ".join(f"{f}: {m}" for f, m in fields) or "invalid request"
        return error_response(422, summary, fields)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            # the path as the client sent it, /api prefix included
            message = f"No route for {request.method} {request.scope.get('path', '')}"
        elif exc.status_code == 405:
            message = f"Method {request.method} not allowed here"
        else:
            message = str(exc.detail) if isinstance(exc.detail, str) else "request failed"
        return error_response(exc.status_code, message, headers=dict(exc.headers or {}))

    async def on_admin(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, AdminError)
        return error_response(exc.status, exc.message, exc.fields, _auth_headers(exc.status))

    async def on_repo(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RepoError)
        if isinstance(exc, Invalid):
            return error_response(422, str(exc), exc.problems)
        status = 404 if isinstance(exc, NotFound) else 409 if isinstance(exc, Conflict) else 400
        return error_response(status, str(exc))

    async def on_metadata_down(request: Request, exc: Exception) -> Response:
        """The metadata DB is unreachable: nothing was written (the transaction could not run),
        the proxy keeps serving from the last snapshot; retry once the DB is back."""
        return error_response(
            503,
            f"{exc}; nothing was changed, the gateway keeps serving from its last snapshot, "
            "retry when the database is back",
            headers={"Retry-After": "5"},
        )

    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(MetadataUnavailable, on_metadata_down)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(AdminError, on_admin)
    app.add_exception_handler(RepoError, on_repo)


def create_admin_app(gw: Gateway, limits: HttpSettings | None = None) -> FastAPI:
    """The admin app over ``gw`` (which may not be started yet: routes read it per request);
    ``limits`` sets the wrong-key backoff."""
    app = FastAPI(
        title="fairgate admin API",
        version=__version__,
        openapi_url=OPENAPI_PATH,
        docs_url=None,
        redoc_url=None,
        dependencies=[Depends(require_admin), Depends(metadata_answers)],
    )
    app.state.gateway = gw
    _install_error_handlers(app)
    app.include_router(pools_router)
    app.include_router(combo_stats_router)  # before /combos/{name:path}, which would match it
    app.include_router(combos_router)
    app.include_router(resources_router)
    app.include_router(aliases_router)
    app.include_router(oauth_router)
    app.include_router(resilience_router)
    app.include_router(testing_router)
    app.add_middleware(AdminGuard, gw=gw, limits=limits or HttpSettings())
    return app
