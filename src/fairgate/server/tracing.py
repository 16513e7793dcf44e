"""OpenTelemetry traces of the request path, when asked for.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set *and* the ``otel`` extra is installed (``pip
install -e '.[otel]'`` in the checkout): then every ``/v1`` request is a span
(``fairgate.request``) with a child span for each quota admission (``fairgate.admission``), each
upstream attempt (``fairgate.attempt``) and each settlement (``fairgate.settle``), exported over
OTLP/HTTP with the SDK's batch processor; the standard ``OTEL_*`` variables (service name,
headers, sampler) apply. Attributes name the pool, the client key's id (never its secret), the
connection, the model and the outcome.

Why decorators: the request path stays as it is (one line per traced function), and with tracing
off a traced call costs one attribute read — the hot path does not pay for a feature it does not
use. A traced function is a plain function returning the coroutine to await (the original's, when
tracing is off), so it adds no coroutine frame of its own. This module imports OpenTelemetry only
when tracing is switched on, so the base install does not need it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, ParamSpec, TypeVar

from fairgate.install import extra_hint

log = logging.getLogger("fairgate.tracing")

__all__ = ["active", "configure_from_env", "shutdown", "traced", "use_tracer_provider"]

P = ParamSpec("P")
R = TypeVar("R")
Attrs = Mapping[str, str | int | float | bool]

#: Attributes a child span also puts on its request span (who, and which pool).
_TO_REQUEST = frozenset({"fairgate.key_id", "fairgate.pool"})


class _State:
    tracer: Any = None  # an opentelemetry Tracer while tracing is on
    provider: Any = None


_STATE = _State()
_REQUEST_SPAN: contextvars.ContextVar[Any] = contextvars.ContextVar("fairgate_request_span")
#: The attribute a request's object carries its span under (see ``call_of``).
_SPAN_ATTR = "_fairgate_request_span"


def use_tracer_provider(provider: Any) -> None:
    """Trace through ``provider`` (an SDK ``TracerProvider``); None switches tracing off.
    Tests pass one whose processor feeds the SDK's in-memory exporter."""
    _STATE.provider = provider
    _STATE.tracer = None if provider is None else provider.get_tracer("fairgate")


def active() -> bool:
    """Whether spans are being recorded now."""
    return _STATE.tracer is not None


def configure_from_env(env: Mapping[str, str]) -> bool:
    """Switch tracing on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set; True when it is on."""
    if not (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip():
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed: "
            f"{extra_hint('otel')}; tracing stays off"
        )
        return False
    service = env.get("OTEL_SERVICE_NAME") or "fairgate"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    use_tracer_provider(provider)
    log.info("tracing to %s", env["OTEL_EXPORTER_OTLP_ENDPOINT"], extra={"service": service})
    return True


def shutdown() -> None:
    """Flush and stop the exporter (at the app's shutdown); tracing is off afterwards."""
    provider = _STATE.provider
    use_tracer_provider(None)
    if provider is not None and hasattr(provider, "shutdown"):
        provider.shutdown()


def traced(
    name: str,
    before: Callable[..., Attrs] | None = None,
    after: Callable[[Any], Attrs] | None = None,
    *,
    request: bool = False,
    call_of: Callable[..., object] | None = None,
) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Run the decorated coroutine function in a span ``name``: ``before(*args, **kwargs)``
    and ``after(result)`` give its attributes. ``request=True`` marks the request's own span,
    which the spans under it fill with the key id and pool they learn. ``call_of`` picks the
    request's object from the arguments: work that runs after the answer has gone (a
    settlement in a background task) is still put under its request's span through it."""

    def deco(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        # a plain function that returns the coroutine to await: with tracing off that is the
        # decorated function's own (no extra coroutine frame per call), else the traced run
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
            tracer = _STATE.tracer
            if tracer is None:
                return fn(*args, **kwargs)
            return traced_run(tracer, *args, **kwargs)

        async def traced_run(tracer: Any, *args: P.args, **kwargs: P.kwargs) -> R:
            parent = None
            if call_of is not None:
                parent = _parent_context(call_of(*args, **kwargs))
            with tracer.start_as_current_span(name, context=parent) as span:
                token = _REQUEST_SPAN.set(span) if request else None
                try:
                    if before is not None:
                        _annotate(span, before(*args, **kwargs))
                    result = await fn(*args, **kwargs)
                    if after is not None:
                        _annotate(span, after(result))
                    return result
                finally:
                    if token is not None:
                        _REQUEST_SPAN.reset(token)

        return wrapper

    return deco


def _parent_context(call: object) -> Any:
    """Inside the request: remember its span on ``call``; after it (no request span in this
    context any more): the context of the span remembered, so the new span is its child."""
    root = _REQUEST_SPAN.get(None)
    if root is not None:
        with contextlib.suppress(AttributeError, TypeError):  # an object without a __dict__
            setattr(call, _SPAN_ATTR, root)
        return None  # the current context already has the right parent
    remembered = getattr(call, _SPAN_ATTR, None)
    if remembered is None:
        return None
    from opentelemetry import trace

    return trace.set_span_in_context(remembered)


def _annotate(span: Any, attrs: Attrs) -> None:
    span.set_attributes(dict(attrs))
    root = _REQUEST_SPAN.get(None)
    if root is not None and root is not span:
        lifted = {k: v for k, v in attrs.items() if k in _TO_REQUEST}
        if lifted:
            root.set_attributes(lifted)


# -- what the request path's spans say (read from its objects; never a secret) ------------------


def request_attrs(_request: Any, route: Any, *_more: Any, **_named: Any) -> Attrs:
    return {"fairgate.route": str(getattr(route, "value", route))}


def response_attrs(resp: Any) -> Attrs:
    status = int(resp.status_code)
    return {
        "http.response.status_code": status,
        "fairgate.outcome": "ok" if status < 400 else "error",
        "fairgate.connection": resp.headers.get("x-fairgate-connection") or "",
    }


def admission_attrs(call: Any, conn: Any, pool: Any, model: str) -> Attrs:
    return {
        "fairgate.key_id": call.key.id,
        "fairgate.connection": conn.id,
        "fairgate.pool": pool.id if pool is not None else "",
        "fairgate.model": model,
    }


def admission_result(adm: Any) -> Attrs:
    return {
        "fairgate.outcome": str(adm.outcome.value),
        "fairgate.reason": str(adm.reason.value) if adm.reason is not None else "",
        "fairgate.fail_open": bool(adm.fail_open),
    }


def attempt_attrs(call: Any, cand: Any, pool: Any, _adm: Any, *_: Any, **kw: Any) -> Attrs:
    opts = kw.get("opts")
    return {
        "fairgate.key_id": call.key.id,
        "fairgate.provider": cand.conn.provider,
        "fairgate.connection": cand.conn.id,
        "fairgate.model": cand.model,
        "fairgate.pool": pool.id if pool is not None else "",
        "fairgate.combo": (getattr(opts, "combo", None) or ""),
    }


def attempt_result(result: Any) -> Attrs:
    failure = getattr(result, "failure", None)
    if hasattr(result, "status_code") and failure is None:
        return {"fairgate.outcome": "ok", "http.response.status_code": int(result.status_code)}
    return {
        "fairgate.outcome": str(failure or "error"),
        "http.response.status_code": int(getattr(result, "status", 0) or 0),
    }


def settle_attrs(_svc: Any, res: Any, conn: Any, call: Any, model: str, usage: Any) -> Attrs:
    ticket = getattr(res, "ticket", res)  # a Reservation (its ticket), or a bare ticket
    out: dict[str, str | int | float | bool] = {
        "fairgate.key_id": call.key.id,
        "fairgate.connection": conn.id,
        "fairgate.model": model,
        "fairgate.pool": ticket.pool_id if ticket is not None else "",
        "fairgate.estimated": usage is None,
    }
    if usage is not None:
        out["fairgate.tokens"] = int(usage.prompt_tokens + usage.completion_tokens)
    return out


def call_of_admission(call: Any, *_: Any, **__: Any) -> object:
    return call


def call_of_settle(_svc: Any, _res: Any, _conn: Any, call: Any, *_: Any) -> object:
    return call
