"""Resilience persistence is written off the event loop (fairgate.resilience.writer).

The regression behind it: a lockout learned from a success's rate-limit headers was written to
the metadata DB inline, on the event loop; with PostgreSQL hung (SIGSTOP, a stalled host) the
write never returned and the whole replica stopped answering, ``/health`` included, so the
change watcher could not even report the outage (tests/e2e/test_metadata_outage.py caught it).
Here the database is a real SQLite file behind a gate that holds every statement until the
test opens it: the "hang" is the gate, the writes are real.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fairgate.clock import ManualClock
from fairgate.db.connection import open_db
from fairgate.resilience.backoff import Cooldown
from fairgate.resilience.manager import HEADER_REASON, RateLimitManager
from fairgate.resilience.state import MemoryResilienceStore
from fairgate.resilience.writer import PersistenceWriter

S = 1_000


class GatedDb:
    """A real SQLite connection whose statements wait until ``gate`` is set (a hung server)."""

    def __init__(self, path: Path) -> None:
        self.conn = open_db(path)
        self.gate = threading.Event()
        self.waiting = threading.Event()  # a statement is held at the gate

    @property
    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> sqlite3.Cursor:
        self.waiting.set()
        self.gate.wait()
        return self.conn.execute(sql, parameters)

    def executemany(self, sql: str, rows: Any, /) -> sqlite3.Cursor:
        self.gate.wait()
        return self.conn.executemany(sql, rows)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[GatedDb]:
    db = GatedDb(tmp_path / "meta.sqlite")
    yield db
    db.gate.set()  # the writer closes the connection it was given (its own)


def rows(path: Path) -> dict[str, tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        found = conn.execute("SELECT scope, until_ms, reason FROM resilience_state").fetchall()
    return {str(r[0]): tuple(r[1:]) for r in found}


async def test_a_lockout_learned_while_the_database_hangs_does_not_hold_the_loop(
    gated: GatedDb, tmp_path: Path
) -> None:
    clock = ManualClock()
    writer = PersistenceWriter(lambda: gated, clock=clock)
    mgr = RateLimitManager(MemoryResilienceStore(clock=clock), clock=clock, persistence=writer)
    reset_s = 30
    headers = {
        "x-ratelimit-limit-requests": "100",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": f"{reset_s}s",
    }
    # every success learns the lockout again; none of them waits for the database. The first
    # write is let reach the gate before the others come, so they find it stuck (on a busy
    # host the thread may not have started yet when fifty successes are done: then all fifty
    # coalesce into one write not started, which is right too, but not this test's case)
    await mgr.on_success("openai", "c1", "gpt-4o", headers)
    assert gated.waiting.wait(timeout=30)  # the thread is stuck in the first write
    for _ in range(49):
        clock.advance(10)
        await mgr.on_success("openai", "c1", "gpt-4o", headers)
    locked = await mgr.check("openai", "c1", "gpt-4o")
    assert locked is not None  # the live state is there at once
    assert locked.reason == HEADER_REASON
    assert writer.pending == 1  # fifty writes of one row, coalesced behind the stuck one

    gated.gate.set()
    await mgr.flush()
    [(until, reason)] = rows(tmp_path / "meta.sqlite").values()
    assert until == locked.until_ms
    assert reason == HEADER_REASON
    await mgr.close()


async def test_writes_keep_their_order_per_row_and_a_delete_wins(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "meta.sqlite"
    writer = PersistenceWriter(lambda: open_db(path), clock=clock)
    now = clock.now_ms()
    writer.submit(
        ("cd", "a"), "save_cooldown", lambda p: p.save_cooldown("a", Cooldown(now + S, 0, "x"))
    )
    writer.submit(
        ("cd", "b"), "save_cooldown", lambda p: p.save_cooldown("b", Cooldown(now + S, 0, "y"))
    )
    writer.submit(("cd", "a"), "delete_cooldown", lambda p: p.delete_cooldown("a"))
    await writer.flush()
    assert set(rows(path)) == {"cd:b"}
    state = await writer.restore(MemoryResilienceStore(clock=clock))
    assert set(state.cooldowns) == {"b"}
    await writer.close()


async def test_a_stop_waits_for_the_queue_but_not_for_a_hung_database(
    gated: GatedDb, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    writer = PersistenceWriter(lambda: gated, clock=clock)
    now = clock.now_ms()
    for conn in ("a", "b", "c"):
        writer.submit(
            ("cd", conn),
            "save_cooldown",
            lambda p, c=conn: p.save_cooldown(c, Cooldown(now + S, 0, "x")),
        )
    assert gated.waiting.wait(timeout=30)
    with caplog.at_level(logging.WARNING, logger="fairgate.resilience"):
        await writer.close(timeout_s=0.05)  # the database never answers: the stop goes on
    assert any("2 writes not saved at stop" in r.getMessage() for r in caplog.records)
    writer.submit(("cd", "d"), "save_cooldown", lambda p: None)  # after close: ignored
    assert writer.pending == 0


async def test_a_failed_write_is_logged_and_the_next_one_reconnects(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    path = tmp_path / "meta.sqlite"
    opened: list[sqlite3.Connection] = []

    def connect() -> sqlite3.Connection:
        opened.append(open_db(path))
        return opened[-1]

    writer = PersistenceWriter(connect, clock=clock)

    def broken(p: Any) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    with caplog.at_level(logging.WARNING, logger="fairgate.resilience"):
        writer.submit(("cd", "a"), "save_cooldown", broken)
        now = clock.now_ms()
        writer.submit(
            ("cd", "b"), "save_cooldown", lambda p: p.save_cooldown("b", Cooldown(now + S, 0, "y"))
        )
        await writer.flush()
    assert any("save_cooldown failed: disk I/O error" in r.getMessage() for r in caplog.records)
    assert set(rows(path)) == {"cd:b"}
    assert len(opened) == 2  # the connection was reopened after the failure
    await writer.close()
