"""``GET /metrics`` on the edge: who may read it and the handler (Starlette), apart from the
collectors (:mod:`fairgate.process.metrics`), which the request path records into without
importing an HTTP framework."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from fairgate.process.http_settings import HttpSettings, is_loopback
from fairgate.process.metrics import Metrics, Scraped


def metrics_access_problem(limits: HttpSettings, request: Request) -> tuple[int, str] | None:
    """Who may read ``/metrics`` (it names every key, connection and model): with
    ``FAIRGATE_METRICS_KEY`` set, whoever sends it as a Bearer token; unset, loopback clients
    only (a scraper on the same host), unless ``FAIRGATE_METRICS_PUBLIC`` opens it."""
    wanted = limits.metrics_key or ""
    if wanted:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        presented = token.strip() if scheme.lower() == "bearer" else ""
        if presented and hmac.compare_digest(presented.encode(), wanted.encode()):
            return None
        return 401, "Send 'Authorization: Bearer <FAIRGATE_METRICS_KEY>' to read the metrics"
    client = request.client.host if request.client is not None else ""
    if limits.metrics_public or is_loopback(client):
        return None
    return 403, (
        "/metrics answers loopback clients only; set FAIRGATE_METRICS_KEY to scrape it "
        "from elsewhere"
    )


def metrics_endpoint(
    gw: Scraped, metrics: Metrics, limits: HttpSettings
) -> Callable[[Request], Any]:
    """The ``GET /metrics`` handler over ``gw`` and ``metrics``."""

    async def handler(request: Request) -> Response:
        problem = metrics_access_problem(limits, request)
        if problem is not None:
            status, message = problem
            return Response(
                message + "\n",
                status_code=status,
                media_type="text/plain",
                headers={"WWW-Authenticate": "Bearer"} if status == 401 else None,
            )
        svc = getattr(request.app.state, "services", None)
        inflight = len(svc.inflight) if svc is not None else None
        await metrics.refresh(gw, inflight)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return handler
