"""The outermost ASGI layer: what every HTTP request goes through, and the ``/v1`` fast lane.

Every request (any path) gets, here and nowhere else:

- the host check: a ``Host`` that names no address of this gateway is refused (400) before any
  route. A browser page on an attacker's site can resolve its own name to 127.0.0.1 (DNS
  rebinding) and then read a gateway listening on loopback as if it were same-origin; the
  request still carries the attacker's name in ``Host``, which is what this check refuses;
- a request id (the client's ``x-request-id`` when it is a sane token, else a new one), set for
  the logs while the request runs and echoed in the answer.

Then the client API (``/v1/...``: one exact path and method per route) goes straight to its
handler: no Starlette middleware stack, router, exception middleware or per-request send
wrappers, which cost as much as a bare proxy's whole HTTP layer. Everything else (the admin
API, the dashboard, ``/health``, ``/metrics``, a wrong method or path under ``/v1``) goes to the
Starlette application underneath, with the same host check and request id, and there only the
client address a trusted proxy forwards (``X-Forwarded-For`` and ``-Proto`` from
``FORWARDED_ALLOW_IPS``, uvicorn's middleware run here instead of around every request): the
admin API's backoff and ``/metrics``' loopback rule look at the client, ``/v1`` never does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from fairgate.process.client_http import ClientRequest, decode_headers, error_response
from fairgate.process.errors import ApiError
from fairgate.process.http_settings import host_allowed
from fairgate.process.logs import HEADER, REQUEST_ID, REQUEST_ID_HEADER, request_id_of
from fairgate.timers import Timer

__all__ = ["FastRoute", "GatewayApp", "SendDeadline", "internal_error", "send_stream", "via_router"]

log = logging.getLogger("fairgate.server")

Handler = Callable[[ClientRequest], Awaitable[Response]]

#: One client route: its path, its one method, its handler.
FastRoute = tuple[str, str, Handler]


def via_router(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` as a Starlette endpoint: what the router calls for a request the fast lane
    did not take on a client path (a ``HEAD`` of ``/v1/models``: Starlette serves ``HEAD`` on
    a ``GET`` route)."""

    async def endpoint(request: Request) -> Response:
        return await handler(ClientRequest.of_scope(request.scope, request.receive, request.app))

    return endpoint


def host_refusal() -> Response:
    """The answer to a request whose ``Host`` names no address of this gateway."""
    return error_response(
        ApiError(
            400,
            "This gateway does not answer to that host name (see FAIRGATE_ALLOWED_HOSTS)",
            code="host_not_allowed",
        )
    )


def internal_error(path: str, exc: BaseException) -> Response:
    """The answer to a handler that crashed: never a stack trace, a path or a secret in the
    answer; the log has the path and the error's type only."""
    log.error("unhandled error", extra={"path": path, "error": type(exc).__name__})
    return error_response(ApiError(500, "Internal error in the gateway", code="internal_error"))


class GatewayApp(Starlette):
    """The Starlette application with the outermost layer of the module docstring in front.

    ``fast`` lists the client routes served without Starlette's routing; they must also be in
    ``routes`` (so a wrong method under the same path gets the router's 405). ``allowed_hosts``
    is the host check's list (None: any host); ``trusted_proxies`` the peers whose forwarded
    client address the routes underneath see (``FORWARDED_ALLOW_IPS``); ``send_deadline`` bounds
    each write of a streamed ``/v1`` answer (None: unbounded)."""

    def __init__(
        self,
        *,
        fast: Sequence[FastRoute],
        allowed_hosts: frozenset[str] | None,
        trusted_proxies: str,
        send_deadline: SendDeadline | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.send_deadline = send_deadline
        self.fast: Mapping[str, tuple[str, Handler]] = {p: (m, h) for p, m, h in fast}
        self.allowed_hosts = allowed_hosts
        # uvicorn types the ASGI messages its own way; the callables are the same
        forwarded = ProxyHeadersMiddleware(cast(Any, self._routed), trusted_hosts=trusted_proxies)
        self._forwarded = cast(ASGIApp, forwarded)

    async def _routed(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan (and websockets, which no route serves)
            await super().__call__(scope, receive, send)
            return
        # one pass over the headers (the server gives lower-case names): the host check, the
        # request id and, on the fast lane, the handler's headers
        headers = decode_headers(scope["headers"])
        rid = request_id_of(headers.get(HEADER))
        raw_id = rid.encode("ascii")
        token = REQUEST_ID.set(rid)
        try:
            if not host_allowed(self.allowed_hosts, headers.get("host")):
                refused = host_refusal()
                refused.raw_headers.append((REQUEST_ID_HEADER, raw_id))
                await refused(scope, receive, send)
                return
            route = self.fast.get(scope["path"])
            if route is not None and route[0] == scope["method"]:
                await self._serve(route[1], scope, receive, send, raw_id, headers)
                return

            async def send_with_id(message: Message) -> None:
                if message["type"] == "http.response.start":
                    message["headers"] = [*message.get("headers", ()), (REQUEST_ID_HEADER, raw_id)]
                await send(message)

            await self._forwarded(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)

    async def _serve(
        self,
        handler: Handler,
        scope: Scope,
        receive: Receive,
        send: Send,
        raw_id: bytes,
        headers: dict[str, str],
    ) -> None:
        """One client request: the handler builds the whole answer (errors included) before a
        byte is sent, so a crash in it still gets the JSON 500; a crash while a stream is being
        written is uvicorn's to log and close, as under Starlette. The request is a
        :class:`ClientRequest` over the headers decoded in :meth:`__call__`."""
        scope["app"] = self
        try:
            resp = await handler(ClientRequest(scope, receive, headers, self))
        except Exception as exc:
            crash = internal_error(scope["path"], exc)
            crash.raw_headers.append((REQUEST_ID_HEADER, raw_id))
            await crash(scope, receive, send)
            raise  # as Starlette's outermost middleware does: the server logs it too
        resp.raw_headers.append((REQUEST_ID_HEADER, raw_id))
        if isinstance(resp, StreamingResponse) and _spec(scope) in _WATCH:
            await send_stream(resp, receive, send, self.send_deadline)
        else:
            await resp(scope, receive, send)


#: ASGI spec versions under which a send after the client left is silently dropped (uvicorn's
#: httptools protocol says 2.3), so a stream must watch for the disconnect to stop.
_WATCH = frozenset({"2.0", "2.1", "2.2", "2.3"})


def _spec(scope: Scope) -> str:
    spec: str = scope.get("asgi", {}).get("spec_version", "2.0")
    return spec


class SendDeadline:
    """How long one write of a streamed answer may wait on the client (issue 43, N3).

    A client that stops reading a stream without closing its connection fills the socket's
    buffers; the server's ``send`` then waits, the relay stops pulling the upstream, and the
    upstream request, its connection slot and the quota reservation are held until the upstream
    gives up and cuts the stream — a failure that used to count against the provider (the
    breaker, the connection's cooldown) though the client caused it, on purpose if it likes.
    With a deadline, a write still waiting after ``timeout_ms`` ends the stream as a
    disconnect would: the relay is closed (the upstream request and the slot are freed, what was
    streamed is settled) and no failure is reported: it is the client's, never the provider's.
    ``timer`` is the gateway's injected one; a stall is noticed between ``timeout_ms`` and
    1.5 × ``timeout_ms`` after its write began (the watcher wakes every half deadline, not once
    per chunk)."""

    __slots__ = ("timeout_ms", "timer")

    def __init__(self, timer: Timer, timeout_ms: int) -> None:
        self.timer = timer
        self.timeout_ms = max(1, timeout_ms)


async def send_stream(
    resp: StreamingResponse, receive: Receive, send: Send, deadline: SendDeadline | None = None
) -> None:
    """Send ``resp`` as Starlette does under ASGI spec < 2.4: the stream is cancelled when the
    client disconnects (its generator's ``finally`` settles what was streamed), an error of
    the stream is raised here, and its background task runs after it. The stream is sent from
    this task; one watcher task waits for the disconnect and cancels this one while the stream
    is still being sent. Two tasks raced under ``asyncio.wait`` before (and an anyio task group
    in Starlette), which cost a streamed request more than the rest of the HTTP layer. With a
    ``deadline``, a second watcher cancels it the same way when one write waits too long on a
    client that stopped reading (:class:`SendDeadline`); the relay is then closed here."""
    task = asyncio.current_task()
    assert task is not None
    watch = _Watch(task)
    loop = asyncio.get_running_loop()
    watcher = loop.create_task(_watch(receive, watch))
    stall_watcher: asyncio.Task[None] | None = None
    out = send
    if deadline is not None:
        clock = deadline.timer.clock

        async def timed_send(message: Message) -> None:
            watch.sending_since = clock.now_ms()
            try:
                await send(message)
            finally:
                watch.sending_since = None

        out = timed_send
        stall_watcher = loop.create_task(_watch_stall(deadline, watch))
    try:
        await resp.stream_response(out)
    except asyncio.CancelledError:
        # the client left or stalled (a watcher's cancel, and no other one pending): it is over
        if not watch.cancelled or task.uncancel() > 0:
            raise
    finally:
        watch.streaming = False  # from here the watchers' news means nothing
        watcher.cancel()
        if stall_watcher is not None:
            stall_watcher.cancel()
    if watch.stalled:
        # the relay waits at a yield, not in a read: close it now (its ``finally`` frees the
        # upstream request and the slot and settles), not whenever the collector finds it
        close = getattr(resp.body_iterator, "aclose", None)
        if close is not None:
            await close()
        log.warning(
            "client stopped reading a stream; closed it",
            extra={"send_timeout_ms": deadline.timeout_ms if deadline else None},
        )
    if resp.background is not None:
        await resp.background()


class _Watch:
    """What :func:`send_stream` and its watchers share: the task sending the stream, whether it
    still is, whether a watcher cancelled it (and for a stall), and since when the write in
    progress waits (None: none is)."""

    __slots__ = ("cancelled", "sending_since", "stalled", "streaming", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.streaming = True
        self.cancelled = False
        self.stalled = False
        self.sending_since: int | None = None


async def _watch_stall(deadline: SendDeadline, watch: _Watch) -> None:
    """Cancel the stream's task once one write has waited ``deadline.timeout_ms``: every half
    deadline, look whether the write in progress began that long ago."""
    timer, timeout = deadline.timer, deadline.timeout_ms
    step = max(1, timeout // 2)
    while watch.streaming:
        await timer.sleep_until(timer.clock.now_ms() + step)
        since = watch.sending_since
        if since is not None and timer.clock.now_ms() - since >= timeout and watch.streaming:
            watch.cancelled = watch.stalled = True
            watch.task.cancel()
            return


async def _watch(receive: Receive, watch: _Watch) -> None:
    """Cancel the stream's task when the client disconnects while it is being sent (under
    uvicorn ``receive`` also says disconnect once the answer is complete: by then the stream
    is no longer being sent, and this task is cancelled before it could run again)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    if watch.streaming:
        watch.cancelled = True
        watch.task.cancel()
