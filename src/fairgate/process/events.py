"""The request path's instrumentation behind one hook: the path reports what happened (an
admission) once, as plain data, to an :class:`EventSink`; adapters write it where each reader
looks: the log (and the pool's admission log the dashboard shows), the Prometheus series,
the OpenTelemetry trace.

Why one hook: the admission used to be written three ways inline in the executor (a log line,
the pool's admission log, a metrics counter) and a fourth by a tracing decorator; a new reader
(or a test that wants to see the events) is now an adapter, and the executor says what
happened in one line. The adapters are cheap: a blocked admission logs, every governed one is
counted and put on the pool's log, and the span is only built while tracing is on.
"""

from __future__ import annotations

import logging
from typing import Protocol

from fairgate.process import tracing
from fairgate.process.metrics import Metrics
from fairgate.quota.outcomes import Admission
from fairgate.records import record
from fairgate.store.admission_log import SharedPoolLog

__all__ = [
    "AdmissionEvent",
    "EventSink",
    "Events",
    "LogEvents",
    "MetricsEvents",
    "TracingEvents",
    "standard_events",
]


@record(eq=False)
class AdmissionEvent:
    """One admission decision of the request path: who asked (``key_id``), where
        (``connection_id``, ``model``, ``pool_id``: None for a connection no pool governs, which
        is allowed without asking the quota engine), the decision, when (``ts_ms``, the injected
        clock) and how long it took (``started_ns``/``ended_ns``, wall time, for the span). One is
    built per admission: a cheap record (``fairgate.records``), not a frozen dataclass."""

    pool_id: str | None
    key_id: str
    connection_id: str
    model: str
    admission: Admission
    ts_ms: int
    started_ns: int
    ended_ns: int


class EventSink(Protocol):
    """Where the request path reports what happened (one method per kind of event)."""

    def admission(self, event: AdmissionEvent) -> None: ...


class LogEvents:
    """The log adapter: a blocked admission is an ``info`` line (the admin's "why was I
    refused"), and every governed admission goes on its pool's admission log (the pool page)."""

    __slots__ = ("_log", "_pool_log")

    def __init__(self, pool_log: SharedPoolLog, logger: logging.Logger) -> None:
        self._pool_log = pool_log
        self._log = logger

    def admission(self, event: AdmissionEvent) -> None:
        pool_id = event.pool_id
        if pool_id is None:
            return
        adm = event.admission
        if not adm.allowed:
            self._log.info(
                "admission blocked",
                extra={
                    "pool": pool_id,
                    "key": event.key_id,
                    "connection": event.connection_id,
                    "reason": adm.reason.value if adm.reason else None,
                    "dimension": adm.dimension,
                    "retry_after_ms": adm.retry_after_ms,
                },
            )
        self._pool_log.log(
            pool_id,
            {
                "ts": event.ts_ms,
                "keyId": event.key_id,
                "model": event.model,
                "connectionId": event.connection_id,
                # the enum members themselves: str subclasses, written as their values
                "outcome": adm.outcome,
                "reason": adm.reason,
                "dimension": adm.dimension,
                "retryAfterMs": adm.retry_after_ms,
                "failOpen": adm.fail_open,
                # admission: hold: how long it waited in the pool's queue first
                **({"waitedMs": adm.waited_ms} if adm.waited_ms else {}),
            },
        )


class MetricsEvents:
    """The metrics adapter: admissions by outcome and reason, fail-open admissions."""

    __slots__ = ("_metrics",)

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def admission(self, event: AdmissionEvent) -> None:
        if event.pool_id is not None:
            self._metrics.observe_admission(event.admission)


class TracingEvents:
    """The tracing adapter: a ``fairgate.admission`` span (under the request's span) over the
    time the decision took, with who, where and the outcome; nothing while tracing is off."""

    __slots__ = ()

    def admission(self, event: AdmissionEvent) -> None:
        if not tracing.active():
            return
        adm = event.admission
        tracing.record_span(
            "fairgate.admission",
            {
                "fairgate.key_id": event.key_id,
                "fairgate.connection": event.connection_id,
                "fairgate.pool": event.pool_id or "",
                "fairgate.model": event.model,
                **tracing.admission_result(adm),
            },
            event.started_ns,
            event.ended_ns,
        )


class Events:
    """Several sinks as one: each event goes to every adapter, in order."""

    __slots__ = ("_sinks",)

    def __init__(self, *sinks: EventSink) -> None:
        self._sinks = sinks

    def admission(self, event: AdmissionEvent) -> None:
        for sink in self._sinks:
            sink.admission(event)


def standard_events(metrics: Metrics, pool_log: SharedPoolLog) -> Events:
    """The gateway's sinks: the log (and the pools' admission log), metrics, tracing."""
    return Events(
        LogEvents(pool_log, logging.getLogger("fairgate.proxy")),
        MetricsEvents(metrics),
        TracingEvents(),
    )
