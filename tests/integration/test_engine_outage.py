"""The engine through a store outage (SPEC §2 [better]): fail open fast behind a circuit, charge
what was used meanwhile through the journal, replay it when the store answers, enforce again.

The store is a real SQLite store behind a switch that makes every call fail as a dead Redis
would (``ConnectionRefusedError``, an ``OSError``: "unavailable"); its data survives the outage,
as with a network partition. Time is a ManualClock; only the background-task test sleeps, for a
few milliseconds."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import quota_support
from fairgate.clock import ManualClock
from fairgate.domain.units import Unit, Window
from fairgate.quota.decision import Outcome, Reason
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.journal import Journal
from fairgate.quota.model import Allocation, Dimension, Policy, Pool
from fairgate.quota.ports import CounterRef
from fairgate.quota.window import Count
from fairgate.store.sqlite.store import SqliteQuotaStore
from quota_support import engine_for

HOUR = 3_600_000
REQ = Dimension(Unit.REQUESTS, Window.HOURLY, 10)
TOK = Dimension(Unit.TOKENS, Window.HOURLY, 10_000)


def make_pool(*dims: Dimension) -> Pool:
    return quota_support.make_pool(
        *(dims or (REQ,)),
        allocations=(
            Allocation("a", 50, policy=Policy.HARD),
            Allocation("b", 50, policy=Policy.HARD),
        ),
        id="p1",
        name="shared",
        connections=("k1",),
    )


def store_gone_down(store: FlakyStore, clock: ManualClock) -> tuple[QuotaEngine, Pool]:
    """An engine on ``store`` and the shared pool, the store just gone down: where most outage
    tests start."""
    engine = engine_for(store, clock)
    store.down = True
    return engine, make_pool()


def _gated(op: str) -> Any:
    """The store's ``op``, counted and refused while the power is off."""

    async def call(self: FlakyStore, *args: Any, **kwargs: Any) -> Any:
        self._gate(op)
        return await getattr(SqliteQuotaStore, op)(self, *args, **kwargs)

    return call


class FlakyStore(SqliteQuotaStore):
    """A SQLite store with a power switch, counting the calls that reached it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.down = False
        self.calls: Counter[str] = Counter()
        self.refuse: set[str] = set()  # reservation ids whose settle raises ValueError

    def _gate(self, op: str) -> None:
        self.calls[op] += 1
        if self.down:
            raise ConnectionRefusedError(f"{op}: connection refused")

    admit = _gated("admit")
    release = _gated("release")
    record = _gated("record")
    pool_usage = _gated("pool_usage")
    cumulative = _gated("cumulative")

    async def settle(self, pool_id: str, key_id: str, reservation_id: str, *rest: Any) -> None:
        self._gate("settle")
        if reservation_id in self.refuse:
            raise ValueError("refused")
        await super().settle(pool_id, key_id, reservation_id, *rest)

    async def ping(self) -> bool:
        self.calls["ping"] += 1
        return not self.down and await super().ping()


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[FlakyStore]:
    s = FlakyStore(tmp_path / "quota.sqlite")
    yield s  # pytest runs the rest after a failed test too
    await s.close()


async def counts(store: FlakyStore, key: str, dim: Dimension, now: int) -> tuple[Count, Count]:
    """(pool total, key) buckets, read past the switch."""
    got = await SqliteQuotaStore.pool_usage(store, "p1", [key], [CounterRef(dim.key, HOUR)], now)
    return got.totals[dim.key], got.per_key[key][dim.key]


async def test_outage_fails_open_fast_and_journals_what_is_used(
    store: FlakyStore, clock: ManualClock
) -> None:
    engine = engine_for(store, clock)
    pool = make_pool()
    before = await engine.admit(pool, "a", {Unit.REQUESTS: 1})  # reserved while up
    assert before.ticket is not None
    assert before.ticket.reserved

    store.down = True
    first = await engine.admit(pool, "a", {Unit.REQUESTS: 1})
    assert first.allowed
    assert first.fail_open
    assert engine.circuit.down
    assert store.calls["admit"] == 2
    # the circuit is open: the next admissions never reach the store
    more = [await engine.admit(pool, "b", {Unit.REQUESTS: 1}) for _ in range(20)]
    assert store.calls["admit"] == 2
    assert all(a.allowed and a.fail_open for a in more)
    assert engine.fail_open_count == 21
    # a fail-open admission still has a ticket: what the request uses is charged
    assert all(a.ticket is not None and not a.ticket.reserved for a in [first, *more])

    await engine.settle(before.ticket, {Unit.REQUESTS: 1})
    for a in [first, *more]:
        await engine.settle(a.ticket, {Unit.REQUESTS: 1})
        await engine.release(a.ticket)  # a fail-open ticket holds nothing: no-op, not journaled
    assert len(engine.journal) == 22
    assert store.calls["settle"] == 0  # journaled straight away while the circuit is open
    assert store.calls["release"] == 0

    h = engine.health()
    assert (h.down, h.fail_open, h.journal_pending, h.outages) == (True, 21, 22, 1)
    assert h.last_error == "ConnectionRefusedError"
    assert h.down_since_ms == clock.now_ms()


async def test_replay_restores_the_outage_usage_exactly_and_enforcement_resumes(
    store: FlakyStore, clock: ManualClock
) -> None:
    engine = engine_for(store, clock)
    pool = make_pool()  # 10 requests/hour, a and b 50 % each: strict from 5
    held = await engine.admit(pool, "a", {Unit.REQUESTS: 1})
    store.down = True
    served = [await engine.admit(pool, "a", {Unit.REQUESTS: 1}) for _ in range(7)]
    for adm in [held, *served]:
        await engine.settle(adm.ticket, {Unit.REQUESTS: 1})
    assert len(engine.journal) == 8

    clock.advance(500)
    assert not await engine.probe()  # still inside the circuit's wait: not even a ping
    assert store.calls["ping"] == 0
    clock.advance(500)
    assert not await engine.probe()  # the probe pings: still down
    assert store.calls["ping"] == 1
    assert engine.circuit.down

    store.down = False
    clock.advance(1_000)
    assert await engine.probe()
    assert not engine.circuit.down
    assert engine.circuit.last_outage_ms == 2_000
    assert len(engine.journal) == 0
    assert engine.journal.replayed == 8
    # the reservation made before the outage was replaced by its settle (not counted twice)
    total, mine = await counts(store, "a", REQ, clock.now_ms())
    assert total.curr == mine.curr == 8
    # over its share of 5 in a strict pool: blocked again, without anything restarted
    again = await engine.admit(pool, "a", {Unit.REQUESTS: 1})
    assert again.outcome is Outcome.BLOCK
    assert again.reason is Reason.FAIR_SHARE
    assert (await engine.admit(pool, "b", {Unit.REQUESTS: 1})).allowed


async def test_journaled_usage_lands_in_the_bucket_it_was_used_in(
    store: FlakyStore, clock: ManualClock
) -> None:
    engine = engine_for(store, clock)
    pool = make_pool(TOK)
    clock.advance(HOUR - 60_000)  # one minute before the hour turns
    store.down = True
    adm = await engine.admit(pool, "a", {Unit.TOKENS: 100})
    await engine.settle(adm.ticket, {Unit.TOKENS: 70})
    clock.advance(120_000)  # the replay happens in the next hour
    store.down = False
    assert await engine.probe()
    total, mine = await counts(store, "a", TOK, clock.now_ms())
    assert (total.prev, total.curr) == (70, 0)
    assert (mine.prev, mine.curr) == (70, 0)


async def test_admission_probes_once_per_wait_when_no_background_task(
    store: FlakyStore, clock: ManualClock
) -> None:
    engine, pool = store_gone_down(store, clock)
    await engine.admit(pool, "a", {Unit.REQUESTS: 1})
    clock.advance(1_000)
    await engine.admit(pool, "a", {Unit.REQUESTS: 1})  # the probe: reaches the store, fails
    assert store.calls["admit"] == 2
    await engine.admit(pool, "a", {Unit.REQUESTS: 1})  # wait restarted: fast again
    assert store.calls["admit"] == 2
    store.down = False
    clock.advance(1_000)
    adm = await engine.admit(pool, "a", {Unit.REQUESTS: 1})
    assert not adm.fail_open
    assert adm.ticket is not None
    assert adm.ticket.reserved
    assert not engine.circuit.down


async def test_background_task_probes_and_replays_and_admissions_never_wait(
    store: FlakyStore, clock: ManualClock
) -> None:
    engine = engine_for(store, clock)
    pool = make_pool()
    task = asyncio.get_running_loop().create_task(engine.run_replay(interval_s=0.001))
    await asyncio.sleep(0)  # let it start
    try:
        store.down = True
        for _ in range(3):
            adm = await engine.admit(pool, "a", {Unit.REQUESTS: 1})
            await engine.settle(adm.ticket, {Unit.REQUESTS: 1})
        clock.advance(5_000)  # long past the wait: still, with the task running, no admission
        await engine.admit(pool, "a", {Unit.REQUESTS: 1})  # probes by itself
        assert store.calls["admit"] == 1
        store.down = False
        for _ in range(200):  # the task pings every millisecond
            if not engine.circuit.down and not len(engine.journal):
                break
            await asyncio.sleep(0.001)
        assert not engine.circuit.down
        assert engine.journal.replayed == 3
        _, mine = await counts(store, "a", REQ, clock.now_ms())
        assert mine.curr == 3
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_replay_stops_when_the_store_fails_again_and_keeps_the_rest(
    store: FlakyStore, clock: ManualClock
) -> None:
    engine, pool = store_gone_down(store, clock)
    for _ in range(5):
        adm = await engine.admit(pool, "a", {Unit.REQUESTS: 1})
        await engine.settle(adm.ticket, {Unit.REQUESTS: 1})
    store.down = False
    clock.advance(1_000)
    original = store.settle
    seen = 0

    async def flaky_settle(*args: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == 3:
            store.down = True
        await original(*args)

    store.settle = flaky_settle  # type: ignore[method-assign]
    assert await engine.probe() is False
    assert engine.journal.replayed == 2
    assert len(engine.journal) == 3
    assert engine.circuit.down
    store.down = False
    clock.advance(1_000)
    assert await engine.probe()
    assert engine.journal.replayed == 5
    _, mine = await counts(store, "a", REQ, clock.now_ms())
    assert mine.curr == 5


async def test_a_write_the_store_refuses_is_dropped_not_retried_forever(
    store: FlakyStore, clock: ManualClock
) -> None:
    engine, pool = store_gone_down(store, clock)
    tickets = []
    for _ in range(3):
        adm = await engine.admit(pool, "a", {Unit.REQUESTS: 1})
        assert adm.ticket is not None
        tickets.append(adm.ticket)
        await engine.settle(adm.ticket, {Unit.REQUESTS: 1})
    store.refuse.add(tickets[1].reservation_id)
    store.down = False
    clock.advance(1_000)
    assert await engine.probe()
    assert (engine.journal.replayed, engine.journal.dropped, len(engine.journal)) == (2, 1, 0)
    _, mine = await counts(store, "a", REQ, clock.now_ms())
    assert mine.curr == 2


async def test_refusals_are_not_outages(store: FlakyStore, clock: ManualClock) -> None:
    """A ValueError means the store answered: counted, not journaled, circuit stays closed."""
    engine = engine_for(store, clock)
    pool = make_pool()
    adm = await engine.admit(pool, "a", {Unit.REQUESTS: 1})
    assert adm.ticket is not None
    store.refuse.add(adm.ticket.reservation_id)
    await engine.settle(adm.ticket, {Unit.REQUESTS: 1})
    assert engine.store_errors == 1
    assert engine.last_error == "ValueError"
    assert not engine.circuit.down
    assert len(engine.journal) == 0


async def test_a_failed_burn_sample_does_not_journal_the_settle_again(
    store: FlakyStore, clock: ManualClock
) -> None:
    engine = engine_for(store, clock)
    pool = make_pool()
    adm = await engine.admit(pool, "a", {Unit.REQUESTS: 1})
    original = store.cumulative

    async def broken(*args: Any) -> dict[str, float]:
        raise ConnectionRefusedError("sample")

    store.cumulative = broken  # type: ignore[method-assign]
    await engine.settle(adm.ticket, {Unit.REQUESTS: 1})
    store.cumulative = original  # type: ignore[method-assign]
    assert len(engine.journal) == 0
    assert engine.store_errors == 1
    _, mine = await counts(store, "a", REQ, clock.now_ms())
    assert mine.curr == 1


async def test_release_and_record_are_journaled_too(store: FlakyStore, clock: ManualClock) -> None:
    engine = engine_for(store, clock)
    pool = make_pool(TOK)
    adm = await engine.admit(pool, "a", {Unit.TOKENS: 500})  # reserved: 500 counted
    assert (await counts(store, "a", TOK, clock.now_ms()))[1].curr == 500
    store.down = True
    await engine.release(adm.ticket)  # fails: journaled
    await engine.record(pool, "b", {TOK.key: 42})  # while down: journaled
    assert [e.op for e in engine.journal] == ["release", "record"]
    store.down = False
    clock.advance(1_000)
    assert await engine.probe()
    assert (await counts(store, "a", TOK, clock.now_ms()))[1].curr == 0  # reservation dropped
    total, b = await counts(store, "b", TOK, clock.now_ms())
    assert (total.curr, b.curr) == (42, 42)


async def test_a_long_outage_compacts_the_journal_and_loses_nothing(
    store: FlakyStore, clock: ManualClock
) -> None:
    engine = QuotaEngine(store, clock=clock, journal=Journal(max_entries=100))
    pool = make_pool(TOK)
    store.down = True
    for i in range(1_000):
        adm = await engine.admit(pool, "ab"[i % 2], {Unit.TOKENS: 10})
        await engine.settle(adm.ticket, {Unit.TOKENS: 7})
        clock.advance(100)
    assert len(engine.journal) <= 100
    assert engine.journal.compactions >= 1
    store.down = False
    clock.advance(1_000)
    assert await engine.probe()
    assert engine.journal.dropped == 0
    now = clock.now_ms()
    total, a = await counts(store, "a", TOK, now)
    _, b = await counts(store, "b", TOK, now)
    assert total.curr + total.prev == pytest.approx(7_000)
    assert a.curr + a.prev == pytest.approx(3_500)
    assert b.curr + b.prev == pytest.approx(3_500)


async def test_forgetting_a_pool_drops_its_journal(store: FlakyStore, clock: ManualClock) -> None:
    engine, pool = store_gone_down(store, clock)
    adm = await engine.admit(pool, "a", {Unit.REQUESTS: 1})
    await engine.settle(adm.ticket, {Unit.REQUESTS: 1})
    store.down = False
    await engine.forget_pool(pool.id)
    assert len(engine.journal) == 0


async def test_swapping_the_store_closes_the_circuit_and_replays_into_the_new_one(
    store: FlakyStore, clock: ManualClock, tmp_path: Path
) -> None:
    engine, pool = store_gone_down(store, clock)
    adm = await engine.admit(pool, "a", {Unit.REQUESTS: 1})
    await engine.settle(adm.ticket, {Unit.REQUESTS: 1})
    assert engine.circuit.down
    fresh = FlakyStore(tmp_path / "other.sqlite")
    try:
        engine.store = fresh
        assert not engine.circuit.down
        assert await engine.probe()
        _, mine = await counts(fresh, "a", REQ, clock.now_ms())
        assert mine.curr == 1
    finally:
        await fresh.close()


def test_health_json_shape() -> None:
    engine = QuotaEngine(SqliteQuotaStore(":memory:"), clock=ManualClock(0))
    body = engine.health().as_json()
    assert body == {
        "down": False,
        "downSinceMs": None,
        "outages": 0,
        "slowTimeouts": 0,
        "lastOutageMs": None,
        "failOpen": 0,
        "storeErrors": 0,
        "lastError": None,
        "journal": {"pending": 0, "appended": 0, "replayed": 0, "dropped": 0, "compactions": 0},
    }


async def test_gateway_stop_replays_what_is_still_journaled(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A graceful stop gives the journal one last replay before closing the store."""
    from fairgate.process.state import Gateway

    gw = Gateway(data_dir=tmp_path / "gw", env={}, clock=clock)
    await gw.start()
    flaky = FlakyStore(tmp_path / "flaky.sqlite")
    old = gw.engine.store
    gw.engine.store = flaky
    await old.close()
    pool = make_pool()
    flaky.down = True
    adm = await gw.engine.admit(pool, "a", {Unit.REQUESTS: 1})
    await gw.engine.settle(adm.ticket, {Unit.REQUESTS: 1})
    assert len(gw.engine.journal) == 1
    flaky.down = False  # back, but before the background task got round to it
    await gw.stop()
    reopened = SqliteQuotaStore(tmp_path / "flaky.sqlite")
    try:
        got = await reopened.pool_usage("p1", ["a"], [CounterRef(REQ.key, HOUR)], clock.now_ms())
        assert got.per_key["a"][REQ.key].curr == 1
    finally:
        await reopened.close()


async def test_a_probe_that_never_reached_the_store_decides_nothing(
    store: FlakyStore, clock: ManualClock
) -> None:
    engine = engine_for(store, clock)
    store.down = True
    await engine.admit(make_pool(), "a", {Unit.REQUESTS: 1})
    assert engine.circuit.down
    store.down = False
    clock.advance(1_000)
    # the probe's turn goes to a pool with nothing to enforce: no store call, no verdict
    empty = Pool("e", "e", "openai", ("o1",), (Dimension(Unit.TOKENS, Window.DAILY, 0),))
    assert (await engine.admit(empty, "a", {Unit.TOKENS: 1})).ticket is None
    assert engine.circuit.down
    # the next caller probes, reaches the store, and closes the circuit
    adm = await engine.admit(make_pool(), "a", {Unit.REQUESTS: 1})
    assert not adm.fail_open
    assert not engine.circuit.down
