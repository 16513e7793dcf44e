"""The Metrics object on its own: its own registry, bounded labels, the resilience gauges from the
health source, and an exposition that the Prometheus parser reads back."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.responses import Response

from fairgate.domain.connections import Connection
from fairgate.domain.keys import ClientKey
from fairgate.process.client_http import answered
from fairgate.process.metrics import (
    FastCounter,
    FastHistogram,
    Metrics,
    ResilienceGauges,
    SharedCells,
    gauges_from_snapshot,
)
from fairgate.quota.decision import Outcome, Reason
from fairgate.quota.outcomes import Admission
from fairgate.snapshot import Registry

REG = Registry.build(
    [
        Connection("c1", "mock", "http://x/v1", "s", models=("gpt-4o-mini",)),
        Connection("c2", "kimi", "http://x/v1", "s"),  # serves any model: not a label source
    ],
    [],
    [],
)
KEY = ClientKey("alice", "Alice", "0" * 64, "fg-abcd")


def samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_each_metrics_object_has_its_own_registry() -> None:
    a, b = Metrics(), Metrics()
    a.observe_admission(Admission(Outcome.ALLOW))
    assert samples(a)[("fairgate_admissions_total", (("outcome", "allow"), ("reason", "none")))]
    assert ("fairgate_admissions_total", (("outcome", "allow"), ("reason", "none"))) not in (
        samples(b)
    )


def test_model_labels_are_bounded_by_configuration() -> None:
    m = Metrics()
    assert m.model_label(REG, "gpt-4o-mini") == "gpt-4o-mini"
    assert m.model_label(REG, "mock/gpt-4o-mini") == "mock/gpt-4o-mini"
    assert m.model_label(REG, "kimi/anything-a-client-types") == "other"
    assert m.model_label(REG, "x" * 500) == "other"
    assert m.model_label(REG, None) == "none"
    assert m.model_label(REG, 42) == "none"


def test_request_counter_and_histograms_from_the_response() -> None:
    m = Metrics()
    ok = Response(b"{}", headers={"x-fairgate-connection": "c1", "x-fairgate-overhead-ms": "0.5"})
    t0 = time.perf_counter() - 0.02
    m.observe_request(REG, KEY, {"model": "gpt-4o-mini"}, answered(ok), t0)
    m.observe_request(
        REG, None, None, answered(Response(b"", status_code=401)), time.perf_counter()
    )
    m.observe_admission(Admission(Outcome.BLOCK, Reason.FAIR_SHARE))
    m.observe_admission(Admission(Outcome.ALLOW, fail_open=True))
    got = samples(m)
    labels = (("connection", "c1"), ("key", "alice"), ("model", "gpt-4o-mini"), ("status", "200"))
    assert got[("fairgate_requests_total", labels)] == 1
    unauth = (("connection", "none"), ("key", "none"), ("model", "none"), ("status", "401"))
    assert got[("fairgate_requests_total", unauth)] == 1
    assert got[("fairgate_overhead_seconds_count", ())] == 1
    assert got[("fairgate_overhead_seconds_sum", ())] == 0.0005
    assert got[("fairgate_upstream_latency_seconds_count", ())] == 1
    assert got[("fairgate_upstream_latency_seconds_sum", ())] >= 0.019
    assert got[("fairgate_admissions_total", (("outcome", "block"), ("reason", "fair-share")))]
    assert got[("fairgate_fail_open_total", ())] == 1


class _Store:
    async def ping(self) -> bool:
        return True


def fake_gateway(resilience: Any = None) -> Any:
    """What ``Metrics.refresh`` reads of a Gateway, with no pool (no store I/O)."""
    return SimpleNamespace(
        registry=REG,
        engine=SimpleNamespace(store=_Store()),
        store_choice=SimpleNamespace(driver="sqlite"),
        resilience=resilience,
    )


async def test_resilience_gauges_come_from_the_health_source() -> None:
    m = Metrics()
    await m.refresh(fake_gateway())
    assert not any(k[0].startswith("fairgate_breaker") for k in samples(m))
    assert samples(m)[("fairgate_quota_store_up", (("driver", "sqlite"),))] == 1
    m.set_health_source(
        lambda: ResilienceGauges(
            breakers={"openai": "open", "c1": "closed"},
            cooldowns={"c1": 12.5},
            lockouts={("c1", "gpt-4o-mini"): 30.0},
        )
    )
    await m.refresh(fake_gateway(), inflight=3)
    got = samples(m)
    assert got[("fairgate_breaker_state", (("state", "open"), ("target", "openai")))] == 1
    assert got[("fairgate_breaker_state", (("state", "closed"), ("target", "openai")))] == 0
    assert got[("fairgate_breaker_state", (("state", "closed"), ("target", "c1")))] == 1
    assert got[("fairgate_cooldown_seconds", (("connection", "c1"),))] == 12.5
    assert got[("fairgate_lockout_seconds", (("connection", "c1"), ("model", "gpt-4o-mini")))] == 30
    assert got[("fairgate_inflight_requests", ())] == 3


async def test_without_a_source_the_resilience_manager_snapshot_is_read() -> None:
    class Manager:
        async def snapshot(self) -> dict[str, Any]:
            return {
                "breakers": {"mock": {"state": "half_open", "remaining_ms": 0}},
                "cooldowns": [{"connection_id": "c1", "remaining_ms": 4000, "level": 1}],
                "lockouts": [{"connection_id": "c1", "model": "m", "remaining_ms": 1500}],
                "permanent": [],
            }

    m = Metrics()
    await m.refresh(fake_gateway(Manager()))
    got = samples(m)
    assert got[("fairgate_breaker_state", (("state", "half_open"), ("target", "mock")))] == 1
    assert got[("fairgate_cooldown_seconds", (("connection", "c1"),))] == 4
    assert got[("fairgate_lockout_seconds", (("connection", "c1"), ("model", "m")))] == 1.5


def test_gauges_from_a_malformed_snapshot_skip_what_they_cannot_read() -> None:
    g = gauges_from_snapshot({"breakers": {"x": "open"}, "cooldowns": [1, {"remaining_ms": "x"}]})
    assert g == ResilienceGauges()


async def test_a_broken_health_source_does_not_break_the_scrape() -> None:
    m = Metrics()

    def broken() -> ResilienceGauges:
        raise RuntimeError("manager gone")

    m.set_health_source(broken)
    await m.refresh(fake_gateway())
    got = samples(m)
    assert ("fairgate_fail_open_total", ()) in got
    assert not any(k[0].startswith("fairgate_breaker") for k in got)


def _exposition(registry: CollectorRegistry) -> list[str]:
    """The exposition's lines with the ``_created`` timestamps masked (they are creation times)."""
    lines = generate_latest(registry).decode().splitlines()
    return [ln.rsplit(" ", 1)[0] + " <t>" if "_created" in ln else ln for ln in lines]


def test_the_fast_counters_and_histograms_export_as_prometheus_clients_own() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    counter = FastCounter("t_requests", "Requests", ["key", "status"])
    plain = FastCounter("t_fails", "Failures")
    hist = FastHistogram("t_latency_seconds", "Latency", (0.005, 0.1, 1), ["conn"])
    whole = FastHistogram("t_overhead_seconds", "Overhead", (0.001, 0.01))
    for m in (counter, plain, hist, whole):
        ours.register(m)
    p_counter = Counter("t_requests", "Requests", ["key", "status"], registry=theirs)
    Counter("t_fails", "Failures", registry=theirs)
    p_hist = Histogram(
        "t_latency_seconds", "Latency", ["conn"], buckets=(0.005, 0.1, 1), registry=theirs
    )
    p_whole = Histogram("t_overhead_seconds", "Overhead", buckets=(0.001, 0.01), registry=theirs)
    for key, status in (("a", "200"), ("b", "429"), ("a", "200")):
        counter.inc(key, status)
        p_counter.labels(key, status).inc()
    # values on, between and past the bounds, in two label sets
    for conn, v in (
        ("c1", 0.005),
        ("c1", 0.0049),
        ("c2", 0.5),
        ("c1", 1.0),
        ("c2", 7.0),
        ("c1", 0),
    ):
        hist.cell((conn,)).observe(v)
        p_hist.labels(conn).observe(v)
    for v in (0.001, 0.0100001, 0.0):
        whole.cell(()).observe(v)
        p_whole.observe(v)
    assert _exposition(ours) == _exposition(theirs)
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in ours.collect()
        for s in f.samples
    }
    assert got[("t_requests_total", (("key", "a"), ("status", "200")))] == 2.0
    assert got[("t_fails_total", ())] == 0.0
    assert got[("t_latency_seconds_bucket", (("conn", "c1"), ("le", "0.005")))] == 3.0


def _without_created(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {k: v for k, v in samples(m).items() if not k[0].endswith("_created")}


async def test_workers_of_one_group_each_answer_for_all_of_them(tmp_path: Any) -> None:
    """``serve --workers N`` (issue 48, item 2): whichever worker takes the scrape, the
    exposition is the group's sum, and it equals what one process that saw every request would
    say (but ``_created``, which prometheus_client's multiprocess format does not have)."""
    # two live processes' ids (a gone one's in-flight gauge is dropped at each scrape)
    a = Metrics(SharedCells(str(tmp_path), ident=str(os.getpid())))
    b = Metrics(SharedCells(str(tmp_path), ident=str(os.getppid())))
    alone = Metrics()
    ok, limited = Response(status_code=200), Response(status_code=429)
    answers = [ok] * 5 + [limited] * 2
    for i, resp in enumerate(answers):
        for m in (a if i % 3 else b, alone):
            resp.headers["x-fairgate-overhead-ms"] = "0.4"
            m.observe_request(
                REG, KEY, {"model": "gpt-4o-mini"}, answered(resp), time.perf_counter()
            )
            m.observe_admission(Admission(Outcome.ALLOW))
            m.observe_attempt(REG, "mock", "c1", "gpt-4o-mini", "ok", 12.0 * i)
    await a.refresh(fake_gateway(), inflight=2)
    await b.refresh(fake_gateway(), inflight=1)
    await alone.refresh(fake_gateway(), inflight=3)
    for worker in (a, b):
        got = _without_created(worker)
        assert got == _without_created(alone)
        requests = sum(v for (name, _), v in got.items() if name == "fairgate_requests_total")
        assert requests == len(answers)
        assert got[("fairgate_inflight_requests", ())] == 3  # the two workers' own, summed
    for worker in (a, b):
        assert worker.shared is not None
        worker.shared.close()


async def test_a_dead_workers_counts_stay_and_its_inflight_goes(tmp_path: Any) -> None:
    """A worker that died (its pid gone) keeps its counts in the group's totals, as counters
    never go back; its requests in flight went with it."""
    dead = Metrics(SharedCells(str(tmp_path), ident="999999999"))  # no such process
    dead.observe_admission(Admission(Outcome.ALLOW))
    await dead.refresh(fake_gateway(), inflight=4)
    live = Metrics(SharedCells(str(tmp_path)))
    live.observe_admission(Admission(Outcome.ALLOW))
    await live.refresh(fake_gateway(), inflight=1)
    got = samples(live)
    assert got[("fairgate_admissions_total", (("outcome", "allow"), ("reason", "none")))] == 2
    assert got[("fairgate_inflight_requests", ())] == 1
    for m in (dead, live):
        assert m.shared is not None
        m.shared.close()
