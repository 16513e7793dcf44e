"""Retention GC that runs: the scheduled task that keeps the quota store bounded over time.

Why: the SQLite store keeps one row per (pool, key, counter, window bucket), and nothing else
ever deletes a row, so without this the file grows with every hour of traffic and
``QUOTA_CONSUMPTION_RETENTION_DAYS`` means nothing. Reservations of a request whose process
crashed are undone by the next admission *of the same pool*; an idle pool would keep them (and
their amounts on the dashboard) forever.

What a run does is the store's ``gc`` (:meth:`fairgate.quota.ports.QuotaStore.gc`): delete
counter buckets past the retention (never one still inside 2 × its window, which the sliding
window reads), forget active-key entries older than the retention, undo expired reservations
of every pool. On Redis the buckets expire by TTL; the run does the rest, on one replica at a
time (a lock key). Given the admission log, a run also trims its events past their age
(:meth:`fairgate.store.admission_log.SharedPoolLog.gc`: Redis streams of pools that went quiet,
which no append trims).

When: once shortly after start (a random delay of up to :data:`START_JITTER_S`, so replicas
started together do not all collect at once), then every :data:`INTERVAL_S` give or take
:data:`JITTER` of it. The store is asked at the engine's (injected) clock's now, so tests run
days of traffic in milliseconds by calling :meth:`RetentionGc.run_once`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass

from fairgate.quota.engine import QuotaEngine
from fairgate.quota.ports import AgedLog, GcResult

log = logging.getLogger("fairgate.quota")

#: Every hour, each run shifted by up to ±10 % at random.
INTERVAL_S = 3600.0
JITTER = 0.1
#: The first run comes within this many seconds of start.
START_JITTER_S = 30.0


@dataclass(frozen=True, slots=True)
class GcRun:
    """One finished run: when (the engine's clock), what it removed, how long it took;
    ``log_events``: admission-log events trimmed by age."""

    at_ms: int
    result: GcResult
    took_ms: float
    log_events: int = 0


class RetentionGc:
    """The schedule and the record of the runs (``/health`` shows :meth:`as_json`)."""

    def __init__(
        self,
        engine: QuotaEngine,
        *,
        interval_s: float = INTERVAL_S,
        start_jitter_s: float = START_JITTER_S,
        rng: random.Random | None = None,
        pool_log: AgedLog | None = None,
    ) -> None:
        self.engine = engine
        self.pool_log = pool_log
        self.interval_s = interval_s
        self.start_jitter_s = start_jitter_s
        self._rng = rng or random.Random()
        self.runs = 0
        self.last: GcRun | None = None
        self.last_error: str | None = None
        #: everything removed since start, per kind
        self.removed = {"buckets": 0, "activeKeys": 0, "reservations": 0, "logEvents": 0}

    def delay_s(self, first: bool) -> float:
        """Seconds until the next run: a short random delay at start, then the interval with
        its jitter."""
        if first:
            return self._rng.uniform(0.0, self.start_jitter_s)
        return self.interval_s * self._rng.uniform(1.0 - JITTER, 1.0 + JITTER)

    async def run_once(self) -> GcRun:
        """One collection now; recorded, logged, and returned."""
        t0 = time.perf_counter()
        at = self.engine.clock.now_ms()
        result = await self.engine.gc()
        log_events = 0
        if self.pool_log is not None and not result.skipped:
            log_events = await self.pool_log.gc()
        run = GcRun(at, result, (time.perf_counter() - t0) * 1000, log_events)
        self.runs += 1
        self.last = run
        self.last_error = None
        self.removed["buckets"] += result.buckets
        self.removed["activeKeys"] += result.active_keys
        self.removed["reservations"] += result.reservations
        self.removed["logEvents"] += log_events
        if result.skipped:
            log.info("quota gc: another replica holds the gc lock; skipped")
        else:
            log.info(
                "quota gc: removed %d buckets, %d active-key entries, %d expired reservations, "
                "%d admission-log events",
                result.buckets,
                result.active_keys,
                result.reservations,
                log_events,
            )
        return run

    async def run_forever(self) -> None:
        """The gateway's background task: never dies of a failed run (logged, retried at the
        next turn); cancelled at shutdown."""
        first = True
        while True:
            await asyncio.sleep(self.delay_s(first))
            first = False
            try:
                await self.run_once()
            except Exception as exc:
                self.last_error = type(exc).__name__
                log.warning("quota gc failed (%s); next try in an hour", type(exc).__name__)

    def as_json(self) -> dict[str, object]:
        last = self.last
        return {
            "runs": self.runs,
            "lastRunMs": None if last is None else last.at_ms,
            "lastRemoved": (
                None if last is None else {**last.result.as_json(), "logEvents": last.log_events}
            ),
            "lastTookMs": None if last is None else round(last.took_ms, 1),
            "removedTotal": dict(self.removed),
            "lastError": self.last_error,
            "intervalS": self.interval_s,
        }
