"""The request path's event hook: one admission event, written by each adapter where its
reader looks (the log and the pool's admission log, the metrics, nothing for an ungoverned
admission but the trace)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from fairgate.process.events import (
    AdmissionEvent,
    Events,
    LogEvents,
    MetricsEvents,
    TracingEvents,
)
from fairgate.process.metrics import Metrics
from fairgate.quota.decision import Outcome, Reason
from fairgate.quota.outcomes import Admission


class FakePoolLog:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def log(self, pool_id: str, event: dict[str, Any]) -> None:
        self.events.append((pool_id, event))


def event(pool: str | None, adm: Admission) -> AdmissionEvent:
    return AdmissionEvent(pool, "alice", "c1", "gpt-4o-mini", adm, 1_000, 5, 9)


def test_a_blocked_admission_is_logged_and_put_on_its_pools_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool_log = FakePoolLog()
    sink = LogEvents(pool_log, logging.getLogger("fairgate.proxy"))  # type: ignore[arg-type]
    blocked = Admission(Outcome.BLOCK, Reason.FAIR_SHARE, "requests/minute", 2_000)
    with caplog.at_level(logging.INFO, logger="fairgate.proxy"):
        sink.admission(event("shared", blocked))
        sink.admission(event("shared", Admission(Outcome.ALLOW)))
    assert [r.getMessage() for r in caplog.records] == ["admission blocked"]
    assert caplog.records[0].__dict__["reason"] == "fair-share"
    assert [(p, e["outcome"], e["retryAfterMs"]) for p, e in pool_log.events] == [
        ("shared", "block", 2_000),
        ("shared", "allow", None),
    ]
    assert pool_log.events[0][1]["ts"] == 1_000
    assert pool_log.events[0][1]["connectionId"] == "c1"


def test_an_ungoverned_admission_is_neither_logged_nor_counted() -> None:
    pool_log, metrics = FakePoolLog(), Metrics()
    hook = Events(
        LogEvents(pool_log, logging.getLogger("fairgate.proxy")),  # type: ignore[arg-type]
        MetricsEvents(metrics),
        TracingEvents(),
    )
    hook.admission(event(None, Admission(Outcome.ALLOW)))
    assert pool_log.events == []
    assert b'fairgate_admissions_total{outcome="allow"' not in metrics.render()
    hook.admission(event("shared", Admission(Outcome.ALLOW, fail_open=True)))
    assert len(pool_log.events) == 1
    text = metrics.render()
    assert b'fairgate_admissions_total{outcome="allow",reason="none"} 1.0' in text
    assert b"fairgate_fail_open_total 1.0" in text


class Recorder:
    def __init__(self) -> None:
        self.seen: list[AdmissionEvent] = []

    def admission(self, e: AdmissionEvent) -> None:
        self.seen.append(e)


def test_every_sink_gets_each_event_in_order() -> None:
    a, b = Recorder(), Recorder()
    e = event("shared", Admission(Outcome.ALLOW))
    Events(a, b).admission(e)
    assert a.seen == [e]
    assert b.seen == [e]


def test_a_held_admission_says_how_long_it_waited_on_the_pools_log() -> None:
    pool_log = FakePoolLog()
    sink = LogEvents(pool_log, logging.getLogger("fairgate.proxy"))  # type: ignore[arg-type]
    sink.admission(event("shared", Admission(Outcome.ALLOW, waited_ms=1_500)))
    sink.admission(event("shared", Admission(Outcome.ALLOW)))
    assert [e.get("waitedMs") for _, e in pool_log.events] == [1_500, None]
