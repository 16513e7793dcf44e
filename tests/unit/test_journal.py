"""The outage bookkeeping on its own: the circuit's rules and the bounded journal's compaction.

Time is an argument everywhere, so nothing sleeps."""

from __future__ import annotations

import logging

import pytest

from fairgate.quota.journal import Circuit, Journal, JournalEntry
from fairgate.quota.ports import UsageItem

T0 = 1_700_002_800_000  # hour-aligned
HOUR = 3_600_000
DAY = 24 * HOUR


def settle(
    rid: str, now: int, key: str = "a", amount: float = 1.0, pool: str = "p"
) -> JournalEntry:
    usage = (UsageItem("requests/hourly", HOUR, 1.0), UsageItem("tokens/daily", DAY, amount))
    return JournalEntry("settle", pool, key, rid, usage, now)


# -- circuit ------------------------------------------------------------------------------------


def test_circuit_closed_lets_everyone_through() -> None:
    c = Circuit(open_ms=1_000)
    assert not c.down
    assert all(c.allow(T0) for _ in range(5))
    assert c.success(T0) is None  # nothing to close


def test_circuit_opens_on_failure_then_lets_one_probe_through_after_the_wait() -> None:
    c = Circuit(open_ms=1_000)
    assert c.failure(T0) is True  # an outage began
    assert c.down
    assert c.down_since_ms == T0
    assert c.failure(T0 + 10) is False  # the same outage
    assert not c.allow(T0 + 500)
    assert not c.allow(T0 + 1_009)  # the wait restarts at the last failure
    assert c.allow(T0 + 1_010)  # the probe
    assert not c.allow(T0 + 1_011)  # only one at a time
    assert c.failure(T0 + 1_020) is False  # the probe failed: wait again
    assert not c.allow(T0 + 1_500)
    assert c.allow(T0 + 2_020)
    assert c.success(T0 + 2_030) == 2_030  # closed: the outage lasted 2,030 ms
    assert not c.down
    assert (c.outages, c.last_outage_ms) == (1, 2_030)
    assert c.allow(T0 + 2_031)


def test_an_abandoned_probe_lets_the_next_caller_probe() -> None:
    c = Circuit(open_ms=100)
    c.failure(T0)
    assert c.allow(T0 + 100)
    assert not c.allow(T0 + 101)
    c.probe_abandoned()
    assert c.allow(T0 + 102)
    assert c.down  # abandoning says nothing about the store


def test_reset_forgets_the_outage() -> None:
    c = Circuit()
    c.failure(T0)
    c.reset()
    assert not c.down
    assert c.allow(T0)


# -- journal ------------------------------------------------------------------------------------


def test_fifo_and_done_only_pops_the_entry_it_was_given() -> None:
    j = Journal(max_entries=10)
    a, b = settle("r1", T0), settle("r2", T0 + 1)
    j.append(a)
    j.append(b)
    assert len(j) == 2
    assert j.head() is a
    j.done(b)  # not the head: nothing happens
    assert len(j) == 2
    j.done(a)
    assert j.head() is b
    j.done(b, replayed=False)
    assert (len(j), j.appended, j.replayed, j.dropped) == (0, 2, 1, 1)
    assert j.head() is None


def test_forget_drops_a_deleted_pools_writes() -> None:
    j = Journal()
    j.append(settle("r1", T0, pool="p"))
    j.append(settle("r2", T0, pool="q"))
    assert j.forget("p") == 1
    assert [e.pool_id for e in j] == ["q"]


def test_compaction_sums_usage_per_bucket_and_keeps_reservations_as_releases() -> None:
    j = Journal(max_entries=100)
    start = T0 + HOUR  # midnight: both hours below fall in one day
    # 30 settles of key a in two hourly buckets, 10 of key b, and a release
    for i in range(20):
        j.append(settle(f"a{i}", start + i, amount=10))
    for i in range(10):
        j.append(settle(f"b{i}", start + HOUR + i, key="b", amount=5))
    for i in range(10):
        j.append(settle(f"c{i}", start + HOUR + 100 + i, amount=10))
    j.append(JournalEntry("release", "p", "a", "gone", (), start + 5))
    j.compact()
    entries = list(j)
    releases = [e for e in entries if e.op == "release"]
    usage = [e for e in entries if e.op == "settle"]
    assert sorted(e.reservation_id for e in releases) == sorted(
        [f"a{i}" for i in range(20)]
        + [f"b{i}" for i in range(10)]
        + [f"c{i}" for i in range(10)]
        + ["gone"]
    )
    # compacted usage reserves nothing and lands in the bucket it was used in
    assert all(not e.reserved and len(e.usage) == 1 for e in usage)
    sums = {
        (e.key_id, e.usage[0].key, e.now_ms // e.usage[0].window_ms): e.usage[0].amount
        for e in usage
    }
    hour0, hour1, day = start // HOUR, start // HOUR + 1, start // DAY
    assert sums == {
        ("a", "requests/hourly", hour0): 20,
        ("a", "requests/hourly", hour1): 10,
        ("a", "tokens/daily", day): 300,  # both hours are in the same day
        ("b", "requests/hourly", hour1): 10,
        ("b", "tokens/daily", day): 50,
    }
    assert [e.now_ms for e in entries] == sorted(e.now_ms for e in entries)
    assert len({e.reservation_id for e in usage}) == len(usage)  # synthetic ids never collide
    assert j.compactions == 1
    assert j.dropped == 0


def test_a_full_journal_compacts_itself_and_stays_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    j = Journal(max_entries=50)
    for _ in range(1_000):  # one key, one bucket: each compaction folds it all into one sum
        j.append(JournalEntry("record", "p", "a", "", (UsageItem("tokens/daily", DAY, 2.0),), T0))
    assert len(j) <= 50
    assert j.compactions >= 1
    assert j.dropped == 0
    assert sum(e.usage[0].amount for e in j) == pytest.approx(2_000)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_overflow_drops_releases_first_then_the_oldest_usage_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    j = Journal(max_entries=10)
    # every settle is a different key: nothing to fold, so compaction must cut
    for i in range(10):
        j.append(settle(f"r{i}", T0 + i, key=f"k{i}"))
    j.compact()
    # 10 releases + 20 sums (2 counters × 10 keys) do not fit in 5: releases go, then 15 sums
    assert len(j) == 5
    assert all(e.op == "settle" for e in j)
    assert j.dropped == 15
    assert sorted({e.key_id for e in j}) == ["k7", "k8", "k9"]  # the newest survive
    assert any("expire with their lease" in r.getMessage() for r in caplog.records)
    assert any(
        r.levelno == logging.ERROR and "dropped 15 usage" in r.getMessage() for r in caplog.records
    )


def test_unreserved_settles_and_zero_amounts_leave_no_release_and_no_sum() -> None:
    j = Journal(max_entries=10)
    usage = (UsageItem("requests/hourly", HOUR, 1.0), UsageItem("tokens/daily", DAY, 0.0))
    j.append(JournalEntry("settle", "p", "a", "x1", usage, T0, reserved=False))
    j.append(JournalEntry("release", "p", "a", "x2", (), T0, reserved=False))
    j.compact()
    (only,) = list(j)
    assert (only.op, only.usage[0].key, only.usage[0].amount) == ("settle", "requests/hourly", 1.0)


def test_max_entries_must_leave_room() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        Journal(max_entries=1)
