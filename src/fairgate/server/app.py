"""The ASGI application: the ``/v1`` proxy, the ``/api`` admin app, health and metrics.

Startup opens the Gateway state (metadata DB, quota store, registry) and the pooled upstream
client; shutdown waits for nothing by itself (uvicorn drains in-flight requests first), then
releases any reservation still held, so a stopped gateway never leaves quota reserved.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from fairgate.admin.api import create_admin_app
from fairgate.admin.common import error_response as admin_error_response
from fairgate.admin.dashboard import dashboard_mount
from fairgate.formats.pricing import PriceTable
from fairgate.path import proxy, responses_edge
from fairgate.path.call import Services
from fairgate.path.provider_signals import ProviderSignals
from fairgate.process import credentials, tracing
from fairgate.process.client_http import error_response
from fairgate.process.edge import FastRoute, GatewayApp, SendDeadline, internal_error, via_router
from fairgate.process.errors import ApiError
from fairgate.process.events import standard_events
from fairgate.process.http_settings import HttpSettings
from fairgate.process.logs import REDACTOR
from fairgate.process.metrics import Metrics
from fairgate.process.metrics_http import metrics_endpoint
from fairgate.process.oauth_setup import start_oauth
from fairgate.process.state import Gateway
from fairgate.providers.oauth import AuthHealth, OAuthTokens
from fairgate.providers.transport import Upstream
from fairgate.providers.upstream import UpstreamClient
from fairgate.quota.model import unenforced_pools

Hook = Callable[[], Awaitable[None]]


def _auth_json(gw: Gateway, tokens: OAuthTokens, health: AuthHealth) -> dict[str, object]:
    """One OAuth connection's health with the credential gate's word on it: ``usable`` false
    while requests skip it, and ``action`` ("log in again") for the admin."""
    out = health.as_json()
    conn = gw.registry.connections.get(health.connection_id)
    if conn is not None:
        verdict = credentials.verdict(conn, tokens, gw.clock.now_ms())
        out["usable"], out["action"] = verdict.usable, verdict.action
    return out


def _memory_sizes(svc: Services, gw: Gateway) -> dict[str, int]:
    """Sizes of the gateway's in-memory maps: each is bounded by configuration (pools,
    connections, targets, combos), never by the traffic; the soak test watches them."""
    pools, events = gw.pool_log.size()
    return {
        "inflightTickets": len(svc.inflight),
        "inflightTargets": len(svc.tracker),
        "backgroundTasks": len(svc.tasks),
        "drrCombos": len(svc.drr),
        "drrHolds": svc.drr.hold_count(),
        "targetMetrics": len(svc.target_metrics),
        "poolLogPools": pools,
        "poolLogEvents": events,
        **svc.signals.sizes(),
    }


def _publish_inflight(metrics: Metrics, svc: Services) -> asyncio.Task[None] | None:
    """A worker of ``serve --workers N`` publishes its requests in flight to the group's
    ``/metrics`` (metrics.py); a single process reads them at scrape time."""
    if metrics.shared is None:
        return None
    return asyncio.get_running_loop().create_task(metrics.publish(lambda: len(svc.inflight)))


async def _stop(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def create_app(
    gw: Gateway,
    *,
    on_startup: list[Hook] | None = None,
    on_shutdown: list[Hook] | None = None,
    http: HttpSettings | None = None,
    upstream: Upstream | None = None,
) -> Starlette:
    """The gateway's ASGI app; ``http`` holds the HTTP edge's limits (default: from the
    gateway's settings, with no bind address, so no host check unless configured);
    ``upstream`` the providers' side of the request path (default: the real HTTP client; tests
    pass an in-process :class:`~fairgate.providers.inprocess.HandlerUpstream`)."""
    # a worker's: the group's exposition (metrics.py)
    metrics = Metrics.for_group(gw.settings.worker_metrics_dir)
    limits = http if http is not None else gw.settings.http.limits()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for hook in on_startup or ():
            await hook()
        await gw.start()
        # OpenTelemetry, as the SDK's OTEL_* variables ask (and with the otel extra)
        tracing_on = tracing.configure(gw.settings.tracing)
        # the exact secrets the gateway holds are masked in every log line, whatever logs them
        REDACTOR.set_source(
            lambda: [gw.admin_key or "", *(c.secret for c in gw.registry.connections.values())]
        )
        app.state.metrics = metrics
        services = Services(
            state=gw,
            upstream=upstream
            or UpstreamClient(
                timeout_s=gw.config.server.upstream_timeout_s,
                idle_per_origin=gw.config.server.upstream_idle_per_origin,
            ),
            signals=ProviderSignals(gw.clock),
            prices=PriceTable().with_overrides(
                {k: v.model_dump() for k, v in gw.config.prices.items()}
            ),
            events=standard_events(metrics, gw.pool_log),
            metrics=metrics,
            limits=limits,
        )
        if isinstance(services.upstream, UpstreamClient):  # the in-process one has no OAuth
            services.upstream.oauth = await start_oauth(gw, services.upstream)
        gw.signals_source = services.signals.for_pool
        gw.percent_estimator = services.signals.percent_estimate
        gw.target_metrics = services.target_metrics
        gw.fallback_counts = services.fallbacks
        app.state.services = services
        publishing = (
            asyncio.get_running_loop().create_task(metrics.publish(lambda: len(services.inflight)))
            if metrics.shared is not None
            else None
        )
        # everything allocated so far lives for the whole run: keep the cyclic GC from walking
        # it again and again, and let the young generation grow before a collection (fewer
        # multi-millisecond pauses in the middle of requests)
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        try:
            yield
        finally:
            await _stop(publishing)
            await services.drain()
            for ticket in list(services.inflight):
                await gw.engine.release(ticket)
            services.inflight.clear()
            await services.upstream.close()
            if isinstance(services.upstream, UpstreamClient) and isinstance(
                services.upstream.oauth, OAuthTokens
            ):
                await services.upstream.oauth.close()
            await gw.stop()
            if tracing_on:
                tracing.shutdown()
            for hook in on_shutdown or ():
                await hook()

    async def health(request: Request) -> Response:
        """200 while the gateway serves, also with its quota store down: admission then fails
        open and usage is journaled (``store.outage``), so a load balancer must keep sending
        traffic; a 503 here would turn a Redis outage into an outage of every replica."""
        svc: Services = request.app.state.services
        ok = await gw.engine.store.ping()
        outage = gw.engine.health()
        metadata_ok = gw.watcher is None or gw.watcher.healthy
        body: dict[str, object] = {
            "status": "ok" if ok and not outage.down and metadata_ok else "degraded",
            # "down": the metadata DB cannot be read; the last registry snapshot still serves
            "metadata": "ok" if metadata_ok else "down",
            # which process answered (``serve --workers N``) and the metadata change counter its
            # registry snapshot reflects: equal on every worker/replica once a change propagated
            "pid": os.getpid(),
            "metadataVersion": gw.watcher.seen if gw.watcher is not None else 0,
            "store": {
                "driver": gw.store_choice.driver,
                # SQLite: memory (this worker counts for the file), forwarding (another does,
                # for this one too) or transactional
                **_store_mode(gw.engine.store),
                "reachable": ok,
                "outage": outage.as_json(),
            },
            "failOpen": gw.engine.fail_open_count,
            "gc": gw.retention.as_json(),
            # pools that enforce nothing: no limits at all, or every limit unknown
            "warnings": unenforced_pools(gw.registry.pools.values()),
            # the config file's mode and what differs between it and the database
            "configFile": gw.config_report(),
            "inflight": len(svc.inflight),
            "inflightLeases": svc.tracker.total,
            "memory": _memory_sizes(svc, gw),
        }
        if isinstance(svc.upstream, UpstreamClient):
            # sockets to the providers: at rest ``open == idle``, and ``idle`` is at most
            # ``idlePerOrigin`` for each origin the connections name (bounded by configuration)
            pool = svc.upstream.stats()
            body["upstream"] = {
                "open": pool.open,
                "idle": pool.idle,
                "idlePerOrigin": gw.config.server.upstream_idle_per_origin,
            }
        oauth = svc.upstream.oauth if isinstance(svc.upstream, UpstreamClient) else None
        if isinstance(oauth, OAuthTokens) and oauth.health():  # states, reasons, expiry times
            body["oauth"] = [_auth_json(gw, oauth, h) for h in oauth.health()]
        return Response(orjson.dumps(body), media_type="application/json")

    # the client API: served by GatewayApp's fast lane; also routed below, so that a wrong
    # method on these paths gets the router's 405
    client: list[FastRoute] = [
        ("/v1/chat/completions", "POST", proxy.chat_completions),
        ("/v1/responses", "POST", responses_edge.responses),
        ("/v1/messages", "POST", proxy.messages),
        ("/v1/messages/count_tokens", "POST", proxy.count_tokens),
        ("/v1/embeddings", "POST", proxy.embeddings),
        ("/v1/models", "GET", proxy.models),
    ]
    routes = [
        *(Route(path, via_router(handler), methods=[method]) for path, method, handler in client),
        Route("/health", health, methods=["GET"]),
        Mount("/api", app=create_admin_app(gw, limits)),
        Route("/metrics", metrics_endpoint(gw, metrics, limits), methods=["GET"]),
        dashboard_mount(),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        message = f"No route for {request.method} {request.url.path}"
        if request.url.path == "/api" or request.url.path.startswith("/api/"):
            # a path the /api mount does not match (Starlette's mount pattern stops at a
            # newline): answer in the admin API's documented error shape
            return admin_error_response(404, message)
        return error_response(ApiError(404, message))

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(ApiError(405, f"Method {request.method} not allowed here"))

    async def crashed(request: Request, exc: Exception) -> Response:
        return internal_error(request.url.path, exc)

    return GatewayApp(
        fast=client,
        allowed_hosts=limits.allowed_hosts,
        trusted_proxies=limits.trusted_proxies,
        send_deadline=SendDeadline(gw.timer, round(limits.send_timeout_s * 1000)),
        routes=routes,
        lifespan=lifespan,
        exception_handlers={404: not_found, 405: method_not_allowed, Exception: crashed},
    )


def _store_mode(store: object) -> dict[str, object]:
    """``{"mode": ...}`` for a store that has modes (SQLite), with the calls a forwarding
    worker has sent to the owner so far; else nothing."""
    mode = getattr(store, "mode", None)
    if not isinstance(mode, str):
        return {}
    if mode == "forwarding":
        return {"mode": mode, "forwardedCalls": getattr(store, "forwarded", 0)}
    return {"mode": mode}
