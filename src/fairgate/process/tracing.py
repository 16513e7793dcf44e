"""OpenTelemetry traces of the request path, when asked for.

Off unless asked for with the OpenTelemetry SDK's own variables *and* the ``otel`` extra is
installed (``pip install -e '.[otel]'`` in the checkout): ``OTEL_TRACES_EXPORTER`` naming an
exporter (``otlp``, ``console``, or both, comma-separated), or an OTLP endpoint
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, which means
``otlp``). Then every ``/v1`` request is a server span (``fairgate.request``) with a child span
for each quota admission (``fairgate.admission``), each upstream attempt (``fairgate.attempt``)
and each settlement (``fairgate.settle``), exported with the SDK's batch processor: ``otlp``
over OTLP/HTTP (protobuf), ``console`` as JSON on standard output. A request that carries a
W3C ``traceparent`` (and ``tracestate``, baggage) continues the caller's trace: its span is the
caller's span's child (``OTEL_PROPAGATORS`` chooses the propagators, as in the SDK).

Of the SDK's variables, these apply (:class:`TracingSettings` declares those fairgate reads
itself, from the one settings object; the OTLP exporter, the resource and the propagators read
the rest from the process environment as the SDK does, the one exception to "only
``fairgate.environment`` reads it", since re-implementing the SDK's configuration is not ours):
the exporter list (an unknown name such as ``zipkin`` is warned about and left out; ``none``
switches tracing off), ``OTEL_SDK_DISABLED=true`` (off), ``OTEL_EXPORTER_OTLP_PROTOCOL`` /
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (only ``http/protobuf``; another is warned about and
http/protobuf used), ``OTEL_SERVICE_NAME`` (default ``fairgate``), and, read by the SDK itself,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_*`` endpoints, headers, timeouts and
certificates, ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``, ``OTEL_BSP_*`` and
``OTEL_PROPAGATORS``. Unlike the SDK, nothing set means no tracing (the SDK's default exporter
is ``otlp``): a gateway exports nothing nobody asked for. Attributes name the pool, the client
key's id (never its secret), the connection, the model and the outcome.

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
import sys
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import IO, Annotated, Any, ParamSpec, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from fairgate.install import extra_hint
from fairgate.setting_source import From

log = logging.getLogger("fairgate.tracing")

__all__ = [
    "TracingPlan",
    "TracingSettings",
    "active",
    "configure",
    "plan_of",
    "shutdown",
    "traced",
    "use_tracer_provider",
]

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


#: The span exporters fairgate builds (``OTEL_TRACES_EXPORTER``); ``none`` is also understood.
EXPORTERS = ("otlp", "console")


class TracingSettings(BaseModel):
    """The SDK's variables fairgate reads itself (the ``tracing`` area of the one settings
    object); the SDK reads its others from the process environment (module doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sdk_disabled: Annotated[str | None, From(env="OTEL_SDK_DISABLED")] = Field(
        default=None, description="`true`: no tracing, whatever else is set"
    )
    exporters: Annotated[str | None, From(env="OTEL_TRACES_EXPORTER")] = Field(
        default=None,
        description="`otlp`, `console` or both (comma separated), or `none`; unset: `otlp` "
        "when an OTLP endpoint is set, else no tracing",
    )
    traces_endpoint: Annotated[str | None, From(env="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")] = Field(
        default=None, description="The OTLP/HTTP endpoint for spans (the SDK reads it)"
    )
    endpoint: Annotated[str | None, From(env="OTEL_EXPORTER_OTLP_ENDPOINT")] = Field(
        default=None, description="The OTLP/HTTP endpoint (the SDK adds `/v1/traces`)"
    )
    traces_protocol: Annotated[str | None, From(env="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")] = Field(
        default=None, description="Only `http/protobuf` (another is warned about)"
    )
    protocol: Annotated[str | None, From(env="OTEL_EXPORTER_OTLP_PROTOCOL")] = Field(
        default=None, description="Only `http/protobuf` (another is warned about)"
    )
    service_name: Annotated[str, From(env="OTEL_SERVICE_NAME")] = Field(
        default="fairgate", description="The traces' `service.name`"
    )

    def otlp_endpoint(self) -> str | None:
        return self.traces_endpoint or self.endpoint


@dataclass(frozen=True, slots=True)
class TracingPlan:
    """What the settings ask for: the exporters to build (empty: tracing off) and a
    warning for each variable asked for something fairgate does not do."""

    exporters: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())


def plan_of(settings: TracingSettings) -> TracingPlan:
    """The SDK's variables read the SDK's way (module doc), pure: no import, no side effect."""
    if (settings.sdk_disabled or "").lower() == "true":
        return TracingPlan()
    warnings: list[str] = []
    raw = settings.exporters or ""
    if raw:
        names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    else:  # nothing named: an OTLP endpoint asks for otlp (the SDK's default exporter)
        names = ["otlp"] if settings.otlp_endpoint() else []
    chosen: list[str] = []
    for name in names:
        if name == "none":
            return TracingPlan(warnings=tuple(warnings))
        if name in EXPORTERS:
            if name not in chosen:
                chosen.append(name)
        else:
            warnings.append(
                f"OTEL_TRACES_EXPORTER: '{name}' is not supported (fairgate exports to "
                f"{', '.join(EXPORTERS)} or none); left out"
            )
    if "otlp" in chosen:
        for var, value in (
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", settings.traces_protocol),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", settings.protocol),
        ):
            proto = (value or "").lower()
            if proto and proto != "http/protobuf":
                warnings.append(
                    f"{var}={proto} is not supported: spans are exported over http/protobuf"
                )
                break
    return TracingPlan(tuple(chosen), tuple(warnings))


def configure(settings: TracingSettings, *, console: IO[str] | None = None) -> bool:
    """Switch tracing on as the SDK's variables ask (:func:`plan_of`); True when it is
    on. ``console``: where the console exporter writes (standard output)."""
    plan = plan_of(settings)
    for warning in plan.warnings:
        log.warning(warning)
    if not plan.exporters:
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        exporters: list[Any] = []
        if "otlp" in plan.exporters:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
    except ImportError:
        log.warning(
            f"tracing is asked for ({', '.join(plan.exporters)}) but OpenTelemetry is not "
            f"installed: {extra_hint('otel')}; tracing stays off"
        )
        return False
    if "console" in plan.exporters:
        exporters.append(ConsoleSpanExporter(out=console or sys.stdout))
    service = settings.service_name
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    use_tracer_provider(provider)
    endpoint = settings.otlp_endpoint()
    log.info(
        "tracing to %s",
        ", ".join(
            f"otlp {endpoint or '(the SDK default)'}" if e == "otlp" else e for e in plan.exporters
        ),
        extra={"service": service},
    )
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
            opts: dict[str, Any] = {"context": None}
            if call_of is not None:
                opts["context"] = _parent_context(call_of(*args, **kwargs))
            if request:  # the caller's trace, when it sent one (W3C traceparent)
                opts["context"], opts["kind"] = _incoming_context(args[0] if args else None)
            with tracer.start_as_current_span(name, **opts) as span:
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


def record_span(name: str, attrs: Attrs, start_ns: int, end_ns: int) -> None:
    """A span ``name`` that has already happened (from ``start_ns`` to ``end_ns``, epoch
    nanoseconds), under the current span: how an event reported after the fact (the event
    hook's tracing adapter, :mod:`fairgate.process.events`) is traced. Its attributes lift
    the key id and pool to the request's span, as a decorated function's do."""
    tracer = _STATE.tracer
    if tracer is None:
        return
    span = tracer.start_span(name, start_time=start_ns)
    try:
        _annotate(span, attrs)
    finally:
        span.end(end_time=end_ns)


def _incoming_context(request: object) -> tuple[Any, Any]:
    """The context the request's headers carry (``traceparent``, ``tracestate``, baggage, by
    the propagators ``OTEL_PROPAGATORS`` configures; none: a new trace), and the server kind."""
    from opentelemetry import propagate, trace

    headers = getattr(request, "headers", None)
    parent = propagate.extract(headers) if headers is not None else None
    return parent, trace.SpanKind.SERVER


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
    if failure is None and not hasattr(result, "status"):  # an answer (an error has a status)
        return {"fairgate.outcome": "ok", "http.response.status_code": 200}
    return {
        "fairgate.outcome": str(failure or "error"),
        "http.response.status_code": int(getattr(result, "status", 0) or 0),
    }


def settle_attrs(
    _svc: Any, res: Any, conn: Any, call: Any, model: str, usage: Any, *_: Any
) -> Attrs:
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


def call_of_attempt(call: Any, *_: Any, **__: Any) -> object:
    return call


def call_of_settle(_svc: Any, _res: Any, _conn: Any, call: Any, *_: Any) -> object:
    return call
