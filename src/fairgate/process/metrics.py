"""Prometheus metrics of one gateway app: ``GET /metrics``.

Why a registry per :class:`Metrics` (not prometheus_client's global one): every app, and every
test that builds one, gets counters of its own, so two apps in one process never collide.

What is counted on the hot path (counters and histograms, O(1) each): requests by key, model,
connection and status; admission decisions by outcome and reason; fail-open admissions; upstream
latency and gateway overhead. What is read at scrape time (gauges): pool usage per dimension,
store reachability and the resilience state (breakers, cooldowns, lockouts) from an optional
callback. A Prometheus collector is synchronous while the quota store is async, so the
``/metrics`` handler refreshes a cached snapshot first and the collector only reads it.

Label cardinality is bounded by configuration, never by traffic: key ids, connection ids and pool
ids come from the metadata DB; a model is its own label only when a connection lists it or it names
a combo (user or ``qtSd/...``); anything else a client sends is ``other``.

``serve --workers N``: every worker answers ``/metrics`` for the whole process group, not for
itself (a scraper reaching whichever worker took its connection saw a third or two thirds of the
traffic, and read each switch as a counter reset). Each worker's counters and histograms are
written through to a file of its own in a directory the parent made for the group (the settings'
``worker_metrics_dir``), in prometheus_client's multiprocess format, and the worker that answers
a scrape sums every worker's file (prometheus_client's ``MultiProcessCollector``): one
``struct`` write into an mmapped page per count, no lock and no system call on the hot path. A
worker that died and was restarted keeps its file, so its counts stay in the totals (counters
never go back). The scrape-time gauges come from the shared stores (the same in every worker),
except the requests in flight, which each worker publishes to its file (:class:`SharedCells`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from prometheus_client import CollectorRegistry
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from fairgate.domain.keys import ClientKey
    from fairgate.quota.engine import QuotaEngine
    from fairgate.quota.outcomes import Admission
    from fairgate.quota.usage import DimensionUsage
    from fairgate.snapshot import Registry
    from fairgate.store.factory import StoreChoice

log = logging.getLogger("fairgate.metrics")

#: Label value when there is nothing to name (no key authenticated, no connection chosen).
NONE = "none"
#: Label value of every model no connection lists: clients cannot mint new series.
OTHER = "other"

BREAKER_STATES = ("closed", "open", "half_open")

#: How often a worker publishes its requests in flight to the group's files (seconds).
INFLIGHT_PUBLISH_S = 1.0
_INFLIGHT = "fairgate_inflight_requests"
_INFLIGHT_HELP = "Requests holding a quota reservation now"

#: Upstream answers take from milliseconds (a mock, a cache) to minutes (long generations).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: What the gateway adds is sub-millisecond when healthy; the upper buckets catch a slow store.
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)


@dataclass(frozen=True, slots=True)
class ResilienceGauges:
    """The resilience state at scrape time, as the health source reports it.

    ``breakers``: target (provider or connection id) → ``closed`` | ``open`` | ``half_open``;
    ``cooldowns``: connection id → seconds left; ``lockouts``: (connection id, model) → seconds
    left. Only entries that exist need be given: an absent cooldown is no cooldown.
    """

    breakers: Mapping[str, str] = field(default_factory=dict)
    cooldowns: Mapping[str, float] = field(default_factory=dict)
    lockouts: Mapping[tuple[str, str], float] = field(default_factory=dict)


#: Sync or async: called once per scrape, in the ``/metrics`` handler (never in the collector).
HealthSource = Callable[[], ResilienceGauges | Awaitable[ResilienceGauges]]


def gauges_from_snapshot(snap: Mapping[str, Any]) -> ResilienceGauges:
    """The gauges in a resilience manager's ``snapshot()`` (the ``/api/monitoring/health``
    shape: ``breakers`` by provider with a ``state``, ``cooldowns`` and ``lockouts`` as lists with
    ``connection_id``, ``model`` and ``remaining_ms``). Unknown or malformed entries are skipped."""
    breakers: dict[str, str] = {}
    raw_breakers = snap.get("breakers")
    if isinstance(raw_breakers, Mapping):
        for target, b in raw_breakers.items():
            if isinstance(b, Mapping) and isinstance(b.get("state"), str):
                breakers[str(target)] = b["state"]
    cooldowns: dict[str, float] = {}
    for c in snap.get("cooldowns") or ():
        if isinstance(c, Mapping) and isinstance(c.get("remaining_ms"), int | float):
            cooldowns[str(c.get("connection_id"))] = c["remaining_ms"] / 1000.0
    lockouts: dict[tuple[str, str], float] = {}
    for lo in snap.get("lockouts") or ():
        if isinstance(lo, Mapping) and isinstance(lo.get("remaining_ms"), int | float):
            key = (str(lo.get("connection_id")), str(lo.get("model")))
            lockouts[key] = lo["remaining_ms"] / 1000.0
    return ResilienceGauges(breakers, cooldowns, lockouts)


#: A pool's dimension as its usage view shows it (the gauges read its figures, not a copy).
_PoolDimension: TypeAlias = "tuple[str, DimensionUsage]"


#: The per-dimension pool gauges: name, help and the field each reads, one row each, so a gauge
#: is added in one place (the per-key ``fairgate_pool_key_consumed`` has a third label).
_POOL_GAUGES: tuple[tuple[str, str, Callable[[DimensionUsage], float]], ...] = (
    (
        "fairgate_pool_usage",
        "Used fraction of the pool limit per dimension (1 = exhausted)",
        lambda d: d.used_fraction,
    ),
    (
        "fairgate_pool_total",
        "Consumption in the current window per pool dimension, in the dimension's unit",
        lambda d: d.total,
    ),
    (
        "fairgate_pool_limit",
        "Pool limit per dimension as enforced (a plan's or a percent limit × connections; "
        "0 = unknown)",
        lambda d: d.limit,
    ),
    (
        "fairgate_pool_burn_rate_per_second",
        "Consumption per second over the dimension's window (its horizon), in its unit",
        lambda d: d.burn_rate_per_s,
    ),
)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    dimensions: tuple[_PoolDimension, ...] = ()
    store_driver: str = ""
    store_up: bool | None = None
    inflight: int | None = None
    resilience: ResilienceGauges | None = None


class _StateCollector(Collector):
    """Scrape-time gauges from the last snapshot and the health source (never raises)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snap = self._metrics.snapshot
        gauges = [
            (GaugeMetricFamily(name, text, labels=["pool", "dimension"]), value)
            for name, text, value in _POOL_GAUGES
        ]
        consumed = GaugeMetricFamily(
            "fairgate_pool_key_consumed",
            "Consumption in the current window per allocated key",
            labels=["pool", "dimension", "key"],
        )
        for pool, d in snap.dimensions:
            labels = [pool, d.key]
            for gauge, value in gauges:
                gauge.add_metric(labels, value(d))
            for k in d.keys:
                consumed.add_metric([pool, d.key, k.key_id], k.consumed)
        yield from (gauge for gauge, _ in gauges)
        yield consumed
        if snap.store_up is not None:
            up = GaugeMetricFamily(
                "fairgate_quota_store_up",
                "1 when the quota store answered a ping at the last scrape",
                labels=["driver"],
            )
            up.add_metric([snap.store_driver], 1.0 if snap.store_up else 0.0)
            yield up
        if snap.inflight is not None and self._metrics.shared is None:
            # with workers, each publishes its own and the group's files sum them
            yield GaugeMetricFamily(_INFLIGHT, _INFLIGHT_HELP, value=snap.inflight)
        yield from self._resilience()

    def _resilience(self) -> Iterator[Metric]:
        state = self._metrics.snapshot.resilience
        if state is None:
            return
        breaker = GaugeMetricFamily(
            "fairgate_breaker_state",
            "Circuit breaker state per target: 1 for the current state, 0 for the others",
            labels=["target", "state"],
        )
        for target, current in sorted(state.breakers.items()):
            states = BREAKER_STATES if current in BREAKER_STATES else (*BREAKER_STATES, current)
            for s in states:
                breaker.add_metric([target, s], 1.0 if s == current else 0.0)
        cooldown = GaugeMetricFamily(
            "fairgate_cooldown_seconds",
            "Seconds left in a connection's cooldown",
            labels=["connection"],
        )
        for conn, secs in sorted(state.cooldowns.items()):
            cooldown.add_metric([conn], max(0.0, secs))
        lockout = GaugeMetricFamily(
            "fairgate_lockout_seconds",
            "Seconds left in a model lockout on a connection",
            labels=["connection", "model"],
        )
        for (conn, model), secs in sorted(state.lockouts.items()):
            lockout.add_metric([conn, model], max(0.0, secs))
        yield from (breaker, cooldown, lockout)


def _le(bound: float) -> str:
    """A bucket's ``le`` label as prometheus_client writes it (``0.005``, ``1.0``, ``+Inf``)."""
    text: str = floatToGoString(bound)  # type: ignore[no-untyped-call]
    return text


def _created_series() -> bool:
    """Whether counters and histograms export ``_created`` (prometheus_client's switch:
    ``PROMETHEUS_DISABLE_CREATED_SERIES``, or ``disable_created_metrics()``)."""
    return bool(getattr(prometheus_metrics, "_use_created", True))


class _ValueFile(Protocol):
    """What the hot path uses of prometheus_client's ``MmapedDict`` (untyped there)."""

    def write_value(self, key: str, value: float, timestamp: float) -> None: ...

    def close(self) -> None: ...


def _value_file(path: str) -> _ValueFile:
    found: _ValueFile = MmapedDict(path)  # type: ignore[no-untyped-call]
    return found


class SharedCells:
    """This process's part of a process group's metrics (``serve --workers N``, module doc):
    three mmapped files in the group's directory, named as prometheus_client's multiprocess mode
    names them (``counter_<id>.db``, ``histogram_<id>.db``, ``gauge_livesum_<id>.db``), so its
    ``MultiProcessCollector`` sums them. ``ident`` tells this process's files from the others'
    (the pid; tests give two in one process names of their own)."""

    def __init__(self, directory: str, ident: str | None = None) -> None:
        self.directory = directory
        self.ident = ident if ident is not None else str(os.getpid())
        self.counters = self._open("counter")
        self.histograms = self._open("histogram")
        self.gauges = self._open("gauge_livesum")
        self._inflight_key = mmap_key(_INFLIGHT, _INFLIGHT, [], [], _INFLIGHT_HELP)

    def _open(self, kind: str) -> _ValueFile:
        return _value_file(os.path.join(self.directory, f"{kind}_{self.ident}.db"))

    def publish_inflight(self, count: int) -> None:
        """This process's requests in flight (the group's gauge is the live processes' sum)."""
        self.gauges.write_value(self._inflight_key, float(count), 0.0)

    def forget_dead(self) -> None:
        """Drop the in-flight gauge of every worker that is gone (its requests went with it);
        its counters stay in the totals."""
        for name in os.listdir(self.directory):
            if not (name.startswith("gauge_livesum_") and name.endswith(".db")):
                continue
            pid = name[len("gauge_livesum_") : -3]
            if not pid.isdigit() or pid == self.ident:
                continue
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                mark_process_dead(int(pid), self.directory)  # type: ignore[no-untyped-call]
            except OSError:  # alive, owned by someone else: not ours to judge
                continue

    def retire(self) -> None:
        """On a worker's way out: nothing is in flight any more. The files stay open (a
        settle still draining counts into them) and go with the process."""
        self.publish_inflight(0)

    def close(self) -> None:
        for f in (self.counters, self.histograms, self.gauges):
            f.close()


class FastCounter(Collector):
    """A counter for the hot path, exported exactly as a prometheus_client ``Counter`` of the
    same name, help and labels (``_total``, ``_created``).

    prometheus_client's ``labels()`` validates and locks on every call, and each ``inc()``
    takes a lock again; here a label set's cell is a dict lookup and a float added to. The
    request path runs on one event loop thread and ``/metrics`` reads on the same thread, so
    no lock is needed. Bounded by the same label sets a ``Counter`` would keep.

    ``shared`` (``serve --workers N``): every count is also written to this worker's counter
    file, which the group's scrape sums (no ``_created`` there: prometheus_client's
    multiprocess format has none)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        shared: _ValueFile | None = None,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._shared = shared
        #: label values → the cell's key in the shared file
        self._keys: dict[tuple[str, ...], str] = {}
        #: label values → [count, created]
        self.cells: dict[tuple[str, ...], list[float]] = {}
        if not self.labelnames:  # an unlabelled counter exists (at 0) from the start
            self.cell(())

    def cell(self, values: tuple[str, ...]) -> list[float]:
        """The ``[count, created]`` of one label set (created at first use)."""
        found = self.cells.get(values)
        if found is None:
            found = self.cells[values] = [0.0, time.time()]
            if self._shared is not None:
                key = mmap_key(
                    self.name,
                    self.name + "_total",
                    list(self.labelnames),
                    list(values),
                    self.documentation,
                )
                self._keys[values] = key
                self._shared.write_value(key, 0.0, 0.0)  # the series exists from now on
        return found

    def add(self, values: tuple[str, ...], amount: float = 1.0) -> None:
        """Count ``amount`` for one label set (the hot path's one call)."""
        cell = self.cells.get(values) or self.cell(values)
        cell[0] += amount
        shared = self._shared
        if shared is not None:
            shared.write_value(self._keys[values], cell[0], 0.0)

    def inc(self, *values: str) -> None:
        self.add(values)

    def describe(self) -> Iterable[Metric]:
        return [Metric(self.name, self.documentation, "counter")]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, "counter")
        created = _created_series()
        for values, (count, at) in list(self.cells.items()):
            labels = dict(zip(self.labelnames, values, strict=True))
            metric.add_sample(self.name + "_total", labels, count)
            if created:
                metric.add_sample(self.name + "_created", dict(labels), at)
        return [metric]


class _HistogramCell:
    """One label set of a :class:`FastHistogram`: observations per bucket, their sum (and, with
    a shared file, where each of them is written)."""

    __slots__ = ("bounds", "counts", "created", "keys", "shared", "sum", "sum_key")

    def __init__(
        self,
        bounds: tuple[float, ...],
        shared: _ValueFile | None = None,
        keys: tuple[str, ...] = (),
        sum_key: str = "",
    ) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()
        self.shared = shared
        self.keys = keys
        self.sum_key = sum_key

    def observe(self, amount: float) -> None:
        """As prometheus_client's: the first bucket whose upper bound is ≥ ``amount``."""
        i = bisect_left(self.bounds, amount)
        self.counts[i] += 1
        self.sum += amount
        shared = self.shared
        if shared is not None:  # the file holds each bucket's own count, as the client's does
            shared.write_value(self.keys[i], float(self.counts[i]), 0.0)
            shared.write_value(self.sum_key, self.sum, 0.0)


class FastHistogram(Collector):
    """A histogram for the hot path, exported exactly as a prometheus_client ``Histogram`` of
    the same name, help, labels and buckets (``_bucket`` cumulative with ``le``, ``_count``,
    ``_sum``, ``_created``); why, and ``shared``, as :class:`FastCounter`."""

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        labelnames: Sequence[str] = (),
        shared: _ValueFile | None = None,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        bounds = [float(b) for b in buckets]
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.bounds = tuple(bounds)
        self._le = tuple(_le(b) for b in bounds)
        self._shared = shared
        self.cells: dict[tuple[str, ...], _HistogramCell] = {}
        if not self.labelnames:
            self.cell(())

    def cell(self, values: tuple[str, ...]) -> _HistogramCell:
        found = self.cells.get(values)
        if found is None:
            found = self.cells[values] = self._new_cell(values)
        return found

    def _new_cell(self, values: tuple[str, ...]) -> _HistogramCell:
        shared = self._shared
        if shared is None:
            return _HistogramCell(self.bounds)
        names, doc = [*self.labelnames, "le"], self.documentation
        keys = tuple(
            mmap_key(self.name, self.name + "_bucket", names, [*values, le], doc) for le in self._le
        )
        sum_key = mmap_key(self.name, self.name + "_sum", list(self.labelnames), list(values), doc)
        for key in (*keys, sum_key):  # the series exist from now on
            shared.write_value(key, 0.0, 0.0)
        return _HistogramCell(self.bounds, shared, keys, sum_key)

    def describe(self) -> Iterable[Metric]:
        return [Metric(self.name, self.documentation, "histogram")]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, "histogram")
        created = _created_series()
        for values, cell in list(self.cells.items()):
            labels = dict(zip(self.labelnames, values, strict=True))
            acc = 0.0
            for le, n in zip(self._le, cell.counts, strict=True):
                acc += n
                metric.add_sample(self.name + "_bucket", {**labels, "le": le}, acc)
            metric.add_sample(self.name + "_count", dict(labels), acc)
            metric.add_sample(self.name + "_sum", dict(labels), cell.sum)
            if created:
                metric.add_sample(self.name + "_created", dict(labels), cell.created)
        return [metric]


class Scraped(Protocol):
    """What a scrape reads of the process (the Gateway is one): the pools, the engine that
    counts them, the store in use. A protocol, so metrics stand below the process state."""

    @property
    def registry(self) -> Registry: ...
    @property
    def engine(self) -> QuotaEngine: ...
    @property
    def store_choice(self) -> StoreChoice: ...


class Metrics:
    """The gateway's metrics. One per app; the hot path calls the ``observe_*`` methods.
    ``shared``: this worker's files of a ``serve --workers N`` group (module doc)."""

    def __init__(self, shared: SharedCells | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.shared = shared
        counts = shared.counters if shared is not None else None
        spread = shared.histograms if shared is not None else None
        # the hot path's counters and histograms (exported as prometheus_client's would be)
        self.requests = FastCounter(
            "fairgate_requests",
            "Proxied requests by client key, requested model, serving connection and status",
            ["key", "model", "connection", "status"],
            counts,
        )
        self.admissions = FastCounter(
            "fairgate_admissions",
            "Quota admission decisions by outcome (allow, penalize, block) and reason",
            ["outcome", "reason"],
            counts,
        )
        self.fail_open = FastCounter(
            "fairgate_fail_open",
            "Admissions allowed because the quota engine or store failed (fail-open)",
            shared=counts,
        )
        self.upstream_latency = FastHistogram(
            "fairgate_upstream_latency_seconds",
            "Time upstream: until the whole answer (non-stream) or its headers (stream)",
            LATENCY_BUCKETS,
            shared=spread,
        )
        self.overhead = FastHistogram(
            "fairgate_overhead_seconds",
            "Time the gateway itself adds to a request (auth, parsing, admission, translation)",
            OVERHEAD_BUCKETS,
            shared=spread,
        )
        self.combo_requests = FastCounter(
            "fairgate_combo_requests",
            "Requests for a combo by outcome (ok, or the HTTP status of the failure)",
            ["combo", "outcome"],
            counts,
        )
        self.combo_fallbacks = FastCounter(
            "fairgate_combo_fallbacks",
            "Fallbacks of a combo to its next target, by the failure class of the previous one",
            ["combo", "reason"],
            counts,
        )
        self.combo_hedges = FastCounter(
            "fairgate_combo_hedges",
            "Hedged first tokens of a combo by outcome: won (the hedge answered first), lost "
            "(it answered after the first target), cancelled (cut off when the first target "
            "answered), failed (it got no answer), capped (not sent: maxHedgesInFlight)",
            ["combo", "outcome"],
            counts,
        )
        self.attempts = FastCounter(
            "fairgate_target_attempts",
            "Upstream attempts per target (provider, connection, model) by outcome (ok or the "
            "failure class)",
            ["provider", "connection", "model", "outcome"],
            counts,
        )
        self.attempt_latency = FastHistogram(
            "fairgate_target_latency_seconds",
            "Latency of successful upstream attempts per provider and connection",
            LATENCY_BUCKETS,
            ["provider", "connection"],
            spread,
        )
        if shared is None:
            # registered in this order: the exposition lists them as it always did
            for metric in (
                self.requests,
                self.admissions,
                self.fail_open,
                self.upstream_latency,
                self.overhead,
                self.combo_requests,
                self.combo_fallbacks,
                self.combo_hedges,
                self.attempts,
                self.attempt_latency,
            ):
                self.registry.register(metric)
        else:  # every worker's files, this one's included, summed at each scrape
            group = MultiProcessCollector(None, path=shared.directory)  # type: ignore[no-untyped-call]
            self.registry.register(group)
        self.snapshot = _Snapshot()
        self.health_source: HealthSource | None = None
        self._models_of: Registry | None = None
        self._models: frozenset[str] = frozenset()
        self._combos: frozenset[str] = frozenset()
        self._overhead = self.overhead.cell(())
        self._upstream_latency = self.upstream_latency.cell(())
        self.registry.register(_StateCollector(self))

    @classmethod
    def for_group(cls, directory: str | os.PathLike[str] | None) -> Metrics:
        """A worker's metrics (shared with its group when ``directory``, the settings'
        ``worker_metrics_dir``, names the group's directory), else a process's own."""
        return cls(SharedCells(str(directory)) if directory else None)

    async def publish(self, inflight: Callable[[], int]) -> None:
        """(A worker of a group) Publish this worker's requests in flight every
        :data:`INFLIGHT_PUBLISH_S` until cancelled; the gauge goes to 0 on the way out."""
        shared = self.shared
        if shared is None:
            return
        try:
            while True:
                shared.publish_inflight(inflight())
                await asyncio.sleep(INFLIGHT_PUBLISH_S)
        finally:
            with contextlib.suppress(Exception):
                shared.retire()

    def set_health_source(self, source: HealthSource | None) -> None:
        """Report breakers, cooldowns and lockouts at scrape time. Without one, the Gateway's
        resilience manager (``gw.resilience``, when it has one) is read through
        :func:`gauges_from_snapshot`."""
        self.health_source = source

    # -- hot path -------------------------------------------------------------------------

    def model_label(self, reg: Registry, model: object) -> str:
        """The model as a label: itself when configuration knows it, else ``other``."""
        if not isinstance(model, str) or not model:
            return NONE
        if reg is not self._models_of:
            known: set[str] = {f"qtSd/{pool_id}" for pool_id in reg.pools}
            for combos in (getattr(reg, "combos", None), getattr(reg, "internal_combos", None)):
                known.update(str(name) for name in combos or ())  # user and minted combos
            for conn in reg.connections.values():
                for m in conn.named_models:
                    known.add(m)
                    known.add(f"{conn.provider}/{m}")
            combos = {*reg.combos, *reg.internal_combos}  # what ``reg.combo`` finds
            self._models, self._combos, self._models_of = frozenset(known), frozenset(combos), reg
        return model if model in self._models else OTHER

    def observe_request(
        self,
        reg: Registry,
        key: ClientKey | None,
        body: Mapping[str, Any] | None,
        answered: tuple[int, str | None, float | None],
        t0: float,
    ) -> None:
        """Count one finished ``/v1`` request (for a stream: once its headers are decided).

        ``answered``: its status, the serving connection and the overhead the proxy computed
        (:func:`fairgate.process.client_http.answered`: the edge reads them off its answer, so
        this module knows no HTTP framework); the upstream time is what remains of the elapsed
        time, so the proxy needs no extra clock.
        """
        status, connection, overhead_ms = answered
        model = self.model_label(reg, body.get("model") if body is not None else None)
        self.requests.add(
            (key.id if key is not None else NONE, model, connection or NONE, str(status))
        )
        if model in self._combos and model not in (NONE, OTHER):
            outcome = "ok" if status < 400 else str(status)
            self.combo_requests.add((model, outcome))
        if overhead_ms is None:
            return
        overhead = overhead_ms / 1000.0
        self._overhead.observe(overhead)
        self._upstream_latency.observe(max(0.0, time.perf_counter() - t0 - overhead))

    def observe_attempt(
        self,
        reg: Registry,
        provider: str,
        connection: str,
        model: str,
        outcome: str,
        latency_ms: float,
    ) -> None:
        """One upstream attempt; provider and connection come from configuration, the model is
        bounded by :meth:`model_label`, the outcome by the failure classifier's classes."""
        self.attempts.add((provider, connection, self.model_label(reg, model), outcome))
        if outcome == "ok":
            self.attempt_latency.cell((provider, connection)).observe(max(0.0, latency_ms) / 1000)

    def observe_fallback(self, reg: Registry, combo: str, reason: str) -> None:
        self.combo_fallbacks.add((self.model_label(reg, combo), reason))

    def observe_hedge(self, reg: Registry, combo: str, outcome: str) -> None:
        self.combo_hedges.add((self.model_label(reg, combo), outcome))

    def observe_admission(self, adm: Admission) -> None:
        self.admissions.add((adm.outcome.value, adm.reason.value if adm.reason else NONE))
        if adm.fail_open:
            self.fail_open.inc()

    # -- scrape ---------------------------------------------------------------------------

    async def refresh(self, gw: Scraped, inflight: int | None = None) -> None:
        """Re-read pool usage and store health into the snapshot the collector serves.

        A pool whose usage cannot be read is left out (and the store is reported down): the
        scrape still answers, so an outage of the store is visible instead of a failed scrape.
        """
        dims: list[_PoolDimension] = []
        store_up = True
        for pool in list(gw.registry.pools.values()):
            try:
                usage = await gw.engine.usage(pool)
            except Exception as exc:
                store_up = False
                log.warning(
                    "metrics: pool usage unavailable",
                    extra={"pool": pool.id, "error": type(exc).__name__},
                )
                continue
            dims.extend((pool.id, d) for d in usage.dimensions)
        try:
            store_up = store_up and await gw.engine.store.ping()
        except Exception:
            store_up = False
        self.snapshot = _Snapshot(
            tuple(dims), gw.store_choice.driver, store_up, inflight, await self._read_health(gw)
        )
        shared = self.shared
        if shared is not None:  # this worker's count as of now; the others' as they published
            if inflight is not None:
                shared.publish_inflight(inflight)
            shared.forget_dead()

    async def _read_health(self, gw: Scraped) -> ResilienceGauges | None:
        """The resilience gauges, or None (no source, or it failed: the scrape still answers)."""
        source = self.health_source
        try:
            if source is not None:
                got = source()
                return await got if inspect.isawaitable(got) else got
            manager = getattr(gw, "resilience", None)
            snapshot = getattr(manager, "snapshot", None)
            if snapshot is None:
                return None
            raw = snapshot()
            raw = await raw if inspect.isawaitable(raw) else raw
            return gauges_from_snapshot(raw) if isinstance(raw, Mapping) else None
        except Exception as exc:
            log.warning("metrics: health source failed", extra={"error": type(exc).__name__})
            return None

    def render(self) -> bytes:
        return generate_latest(self.registry)
