"""Outage detection that tells a slow event loop from a dead store (docs/design-notes.md,
"Outage detection").

In-process: a real SQLite store behind a switch that makes calls time out (optionally after
applying them: a reply lost to the timeout) or be refused, and a real Redis store whose event
loop is really blocked while a command is in flight. Time is a ManualClock for the engine."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from fairgate.clock import ManualClock
from fairgate.domain.units import Unit, Window
from fairgate.path.quota_headers import quota_headers
from fairgate.quota.decision import Outcome
from fairgate.quota.engine import ADMIT_ATTEMPTS
from fairgate.quota.model import Allocation, Dimension, Policy
from fairgate.quota.ports import AdmitRequest, AdmitResult, CounterRef
from fairgate.store.redis.store import MAX_CONNECTIONS, WARM_POOL_CONNECTIONS, RedisQuotaStore
from fairgate.store.sqlite.store import SqliteQuotaStore
from quota_support import engine_for, make_pool

HOUR = 3_600_000
REQ = Dimension(Unit.REQUESTS, Window.HOURLY, 10)
POOL = make_pool(
    REQ,
    allocations=(Allocation("a", 100, policy=Policy.BURST),),
    id="p1",
    name="shared",
    connections=("k1",),
)


class SlowTimeout(TimeoutError):
    """What a driver raises when a reply did not come within its timeout."""


class SwitchStore(SqliteQuotaStore):
    """A SQLite store whose admissions can time out (before or after being applied) or be
    refused, and whose out-of-loop probe says whether the server is alive."""

    timeout_errors = (SlowTimeout,)

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.timeouts = 0  # the next n admissions time out
        self.apply_then_time_out = False  # ... after the store applied them (reply lost)
        self.refused = False
        self.alive = True
        self.confirms = 0
        self.admits: list[str] = []

    async def admit(self, req: AdmitRequest) -> AdmitResult:
        self.admits.append(req.reservation_id)
        if self.refused:
            raise ConnectionRefusedError("refused")
        if self.timeouts:
            self.timeouts -= 1
            if self.apply_then_time_out:
                await super().admit(req)
            raise SlowTimeout("no reply in time")
        return await super().admit(req)

    async def confirm_alive(self) -> bool:
        self.confirms += 1
        return self.alive


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[SwitchStore]:
    s = SwitchStore(tmp_path / "quota.sqlite")
    yield s  # pytest runs the rest after a failed test too
    await s.close()


async def used(store: SqliteQuotaStore, now: int) -> float:
    counts = await SqliteQuotaStore.pool_usage(store, "p1", [], [CounterRef(REQ.key, HOUR)], now)
    return counts.totals[REQ.key].curr


@pytest.mark.parametrize("applied", [False, True], ids=["lost-request", "lost-reply"])
async def test_a_timeout_of_a_live_store_is_retried_not_failed_open(
    store: SwitchStore, clock: ManualClock, applied: bool
) -> None:
    engine = engine_for(store, clock)
    store.timeouts, store.apply_then_time_out = 2, applied
    adm = await engine.admit(POOL, "a", {Unit.REQUESTS: 1})
    assert adm.allowed
    assert not adm.fail_open
    assert adm.ticket is not None
    assert adm.ticket.reserved
    # every attempt under the same reservation id: reserved once, whichever attempt did it
    assert len(set(store.admits)) == 1
    assert await used(store, clock.now_ms()) == 1
    h = engine.health()
    # lost reply: the second attempt finds the reservation of the first and stops there
    timeouts = 1 if applied else 2
    assert (h.fail_open, h.outages, h.down, h.slow_timeouts) == (0, 0, False, timeouts)
    assert store.confirms == timeouts
    await engine.settle(adm.ticket, {Unit.REQUESTS: 1})
    assert await used(store, clock.now_ms()) == 1


async def test_a_timeout_confirmed_by_the_probe_is_an_outage(
    store: SwitchStore, clock: ManualClock
) -> None:
    engine = engine_for(store, clock)
    store.timeouts, store.alive = 1, False
    adm = await engine.admit(POOL, "a", {Unit.REQUESTS: 1})
    assert adm.fail_open
    h = engine.health()
    assert (h.fail_open, h.outages, h.down, h.slow_timeouts) == (1, 1, True, 0)
    # with the circuit open, the next admission fails open without asking the store
    store.timeouts = 0
    assert (await engine.admit(POOL, "a", {Unit.REQUESTS: 1})).fail_open
    assert len(store.admits) == 1


async def test_a_refused_connection_is_an_outage_at_once_without_a_probe(
    store: SwitchStore, clock: ManualClock
) -> None:
    engine = engine_for(store, clock)
    store.refused = True
    adm = await engine.admit(POOL, "a", {Unit.REQUESTS: 1})
    assert adm.fail_open
    assert engine.health().outages == 1
    assert store.confirms == 0


async def test_endless_timeouts_of_a_live_store_fail_open_counted_but_open_no_circuit(
    store: SwitchStore, clock: ManualClock
) -> None:
    engine = engine_for(store, clock)
    store.timeouts = 10 * ADMIT_ATTEMPTS
    adm = await engine.admit(POOL, "a", {Unit.REQUESTS: 1})
    assert adm.fail_open
    assert len(store.admits) == ADMIT_ATTEMPTS
    h = engine.health()
    assert (h.fail_open, h.outages, h.down) == (1, 0, False)


async def test_concurrent_timeouts_share_one_probe(store: SwitchStore, clock: ManualClock) -> None:
    gate = asyncio.Event()

    async def slow_confirm() -> bool:
        store.confirms += 1
        await gate.wait()
        return True

    store.confirm_alive = slow_confirm  # type: ignore[method-assign]
    engine = engine_for(store, clock)
    store.timeouts = 5
    tasks = [asyncio.create_task(engine.admit(POOL, "a", {Unit.REQUESTS: 1})) for _ in range(5)]
    for _ in range(10):
        await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*tasks)
    assert store.confirms == 1
    assert not any(r.fail_open for r in results)
    assert await used(store, clock.now_ms()) == 5


# -- a real Redis, a really blocked event loop ------------------------------------------------


@pytest.mark.redis
async def test_redis_admissions_survive_a_blocked_event_loop(
    redis_url: str, redis_prefix: str, clock: ManualClock
) -> None:
    """The loop is blocked for 4 x the store's timeout while 20 admissions are in flight:
    Redis answered at once, so none fails open and the limit is exact. (A single block is the
    easy case: asyncio reads the ready sockets before it fires the timers that came due. The
    hard one, a loop that stays busy while other processes share the cores, is the e2e
    stress test's; old main failed open there, see tests/e2e/test_stress.py.)"""
    store = RedisQuotaStore(redis_url, prefix=redis_prefix, socket_timeout_s=0.1)
    await store.warm()
    engine = engine_for(store, clock)
    try:
        loop = asyncio.get_running_loop()
        tasks = [
            asyncio.create_task(engine.admit(POOL, "a", {Unit.REQUESTS: 1})) for _ in range(20)
        ]
        await asyncio.sleep(0)  # every admission has sent its script
        loop.call_soon(time.sleep, 0.4)
        results = await asyncio.gather(*tasks)
        assert [r.fail_open for r in results] == [False] * 20
        assert sum(r.allowed for r in results) == 10  # the pool's limit, exactly
        assert engine.health().outages == 0
    finally:
        await store.close()


@pytest.mark.redis
async def test_warm_opens_the_whole_pool_before_traffic(redis_url: str, redis_prefix: str) -> None:
    # on a single server the hot-path scripts run on the store's lane: its one pipelined
    # connection is opened before traffic, and a few of the client's pool (reads, maintenance)
    store = RedisQuotaStore(redis_url, prefix=redis_prefix)
    try:
        lane = store._lane
        assert lane is not None
        pool = store._client.connection_pool
        assert (lane.counts.opened, lane.connected) == (0, False)
        await store.warm()
        assert (lane.counts.opened, lane.connected) == (1, True)
        assert len(pool._available_connections) == WARM_POOL_CONNECTIONS
        assert all(c.is_connected for c in pool._available_connections)
        # a burst of scripts uses the lane's open connections: none is opened beyond them
        reqs = [
            AdmitRequest(
                pool_id="warm",
                key_id="k",
                checks=(),
                policy=Policy.HARD,
                threshold=0.5,
                reservation_id=f"warm-{i}",
                now_ms=1_000,
            )
            for i in range(3 * MAX_CONNECTIONS)
        ]
        results = await asyncio.gather(*(store.admit(r) for r in reqs))
        assert {r.verdict.outcome for r in results} == {Outcome.ALLOW}
        assert (lane.counts.opened, lane.connected) == (1, True)
        # and a burst of reads never goes beyond the client's pool
        await asyncio.gather(*(store.ping() for _ in range(3 * pool.max_connections)))
        assert len(pool._available_connections) + len(pool._in_use_connections) <= (
            pool.max_connections
        )
    finally:
        await store.close()


async def test_warm_against_a_dead_server_logs_and_does_not_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = RedisQuotaStore("redis://127.0.0.1:1/0", prefix="t")
    try:
        await store.warm()
        assert "opened 0 of" in caplog.text
        assert await store.confirm_alive() is False
    finally:
        await store.close()


async def test_calls_queued_behind_a_hung_server_fail_at_once_not_one_timeout_each() -> None:
    """A server that accepts connections and never answers (a hung Redis): the calls holding
    the 32 connections wait for the timeout; the calls queued behind them fail at once."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(-1)  # read everything, answer nothing
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = RedisQuotaStore(f"redis://127.0.0.1:{port}/0", prefix="t", socket_timeout_s=0.05)
    try:
        results = await asyncio.gather(
            *(store.active_keys("p1", 0) for _ in range(100)), return_exceptions=True
        )
        kinds = Counter(type(r).__name__ for r in results)
        assert kinds == {"NoReply": MAX_CONNECTIONS, "StoreFailing": 100 - MAX_CONNECTIONS}
        assert all(isinstance(r, tuple(RedisQuotaStore.unavailable_errors)) for r in results)
        assert not any(isinstance(r, tuple(RedisQuotaStore.timeout_errors)) for r in results)

        # the same silence while the out-of-loop probe gets answers: this process was too
        # slow, the server is fine; a timeout the engine retries, and no queued call gives up
        async def answers() -> bool:
            return True

        store.confirm_alive = answers  # type: ignore[method-assign]
        results = await asyncio.gather(
            *(store.active_keys("p1", 0) for _ in range(2 * MAX_CONNECTIONS)),
            return_exceptions=True,
        )
        assert Counter(type(r).__name__ for r in results) == {"SlowReply": 2 * MAX_CONNECTIONS}
        assert all(isinstance(r, tuple(RedisQuotaStore.timeout_errors)) for r in results)
    finally:
        await store.close()
        server.close()
        await server.wait_closed()


# -- quota headers on every governed answer -----------------------------------------------------


async def test_every_governed_answer_carries_quota_headers_fail_open_included(
    store: SwitchStore, clock: ManualClock
) -> None:
    """SPEC §4: the key's standing in ``x-ratelimit-*``. A fail-open answer keeps the limits
    and resets (known from the pool) and says the remaining counts are unavailable."""
    engine = engine_for(store, clock)
    clock.advance(HOUR // 4)  # 45 minutes left in the hourly window
    ok = quota_headers(await engine.admit(POOL, "a", {Unit.REQUESTS: 1}))
    assert ok == {
        "x-ratelimit-limit-requests-hourly": "10",
        "x-ratelimit-remaining-requests-hourly": "9",
        "x-ratelimit-reset-requests-hourly": "2700s",
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "9",
    }
    store.refused = True
    adm = await engine.admit(POOL, "a", {Unit.REQUESTS: 1})
    assert adm.fail_open
    assert quota_headers(adm) == {
        "x-ratelimit-limit-requests-hourly": "10",
        "x-ratelimit-reset-requests-hourly": "2700s",
        "x-ratelimit-limit-requests": "10",
        "x-fairgate-quota": "unavailable",
    }
    # a reply lost to a timeout (admitted, standing unknown): the same
    store.refused, store.timeouts, store.apply_then_time_out = False, 1, True
    engine = engine_for(store, clock)
    lost = await engine.admit(POOL, "a", {Unit.REQUESTS: 1})
    assert not lost.fail_open
    assert quota_headers(lost)["x-fairgate-quota"] == "unavailable"


@pytest.mark.redis
async def test_concurrent_out_of_loop_probes_of_a_live_server_all_say_alive(
    redis_url: str, redis_prefix: str
) -> None:
    """The store's calls and the engine may probe at the same moment; the probe has one
    connection, so they share one PING (two at once: one refused, a false outage)."""
    store = RedisQuotaStore(redis_url, prefix=redis_prefix)
    try:
        assert await asyncio.gather(*(store.confirm_alive() for _ in range(10))) == [True] * 10
    finally:
        await store.close()
