"""Forwarding (issue 48, item 1): a second process on a memory-mode SQLite file sends its calls
to the owner, which keeps counting in memory for both; the limits stay exact, the calls of one
loop turn share a write, and when the owner goes away the next call finds a new one (this
process takes the file and folds what the owner committed).

Time is injected (``now_ms``); nothing here asserts on wall-clock durations. The stores of
one test share one event loop and one process (an owner and a forwarder are two stores on the
same file: ``flock`` tells them apart as it does two processes), except where a real
``kill -9`` of the owner is the point.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from child_support import reap
from test_sqlite_memory import POOL, REFS, REQ, T0, TOK, _file_state, _request, _usage

from fairgate.quota.ports import ReservationExists
from fairgate.quota.window import Count
from fairgate.store.sqlite.forward import FORWARDED
from fairgate.store.sqlite.owner import FileUse
from fairgate.store.sqlite.store import SqliteQuotaStore


@asynccontextmanager
async def _owning(path: Path) -> AsyncIterator[SqliteQuotaStore]:
    """The first store on ``path``, owning it (forwarding on), closed afterwards."""
    owner = SqliteQuotaStore(path, forward=True)
    try:
        yield owner
    finally:
        await owner.close()


@asynccontextmanager
async def _paired(path: Path) -> AsyncIterator[tuple[SqliteQuotaStore, SqliteQuotaStore]]:
    """The first store on ``path`` owns it in memory, the second forwards to it; both are
    closed afterwards (the forwarder first), whatever the test did."""
    owner = SqliteQuotaStore(path, forward=True)
    other = SqliteQuotaStore(path, forward=True)
    try:
        assert (owner.mode, other.mode) == ("memory", "forwarding")
        yield owner, other
    finally:
        await other.close()
        await owner.close()


async def test_a_forwarder_counts_in_the_owners_memory_exactly(tmp_path: Path) -> None:
    """Both stores admit against a limit of 10 in one loop turn: exactly 10 win, the owner
    never hands over (it stays in memory mode), and the forwarder's 20 calls of that turn went
    out in one write."""
    path = tmp_path / "quota.sqlite"
    small = replace(POOL, dimensions=(replace(REQ, limit=10), TOK))
    async with _paired(path) as (owner, other):
        assert await other.ping()  # the connection is open (its first call opens it)
        fwd = other._fwd
        assert fwd is not None
        before = (fwd.calls, fwd.writes)
        results = await asyncio.gather(
            *(
                s.admit(_request("ab"[i % 2], f"r{i}", T0 + i, small))
                for i, s in enumerate([owner, other] * 20)
            )
        )
        assert sum(r.reserved for r in results) == 10
        assert owner.mode == "memory"
        assert (fwd.calls - before[0], fwd.writes - before[1]) == (20, 1)
        usage = await other.pool_usage(POOL.id, ["a", "b"], REFS, T0 + 50)
        assert usage == await owner.pool_usage(POOL.id, ["a", "b"], REFS, T0 + 50)
        assert usage.totals[REQ.key] == Count(0.0, 10.0)
    assert _file_state(path)[0] == 10.0  # the owner's close committed everything


async def test_every_forwarded_call_answers_as_the_owner_would(tmp_path: Path) -> None:
    """settle, release, record, peek, cumulative, anchors, active keys, gc, flush and ping go
    to the owner and come back with its answers; a duplicate reservation id is refused with
    the engine's own exception."""
    path = tmp_path / "quota.sqlite"
    async with _paired(path) as (owner, other):
        assert (await other.admit(_request("a", "r1", T0))).reserved
        with pytest.raises(ReservationExists):
            await other.admit(_request("a", "r1", T0))
        await other.settle(POOL.id, "a", "r1", _usage(40.0), T0 + 1)
        assert (await other.admit(_request("b", "r2", T0 + 2))).reserved
        assert await other.release(POOL.id, "r2", T0 + 3) is True
        assert await other.release(POOL.id, "r2", T0 + 3) is False
        await other.record(POOL.id, "b", _usage(10.0), T0 + 4)
        peek = await other.peek(POOL.id, "a", REFS, T0 + 5)
        assert peek == await owner.peek(POOL.id, "a", REFS, T0 + 5)
        assert peek[TOK.key] == Count(0.0, 40.0)
        assert await other.cumulative(POOL.id, [TOK.key]) == {TOK.key: 50.0}
        anchor = await other.set_anchor(POOL.id, TOK.key, TOK.window_ms, T0 + 60_000, T0, "c")
        assert anchor is not None
        assert await other.anchors(POOL.id) == {TOK.key: anchor}
        assert await other.active_keys(POOL.id, T0 - 1) == ["a", "b"]
        await other.flush()
        assert (await other.gc(T0 + 10, 14 * 86_400_000)).reservations == 0
        assert await other.ping() is True
        assert owner.mode == "memory"
        with pytest.raises(ValueError, match="reserved"):
            await other.record(POOL.id, "*", _usage(1.0), T0)  # checked before it leaves
    assert _file_state(path) == (2.0, 50.0, 0)


async def test_settles_ride_with_the_next_admission_and_a_close_sends_them(
    tmp_path: Path,
) -> None:
    """A settle waits (up to 2 ms) for the next admission and goes in its frame; a forwarder
    that closes sends the settles still waiting and waits for their answers first."""
    path = tmp_path / "quota.sqlite"
    async with _paired(path) as (owner, other):
        assert (await other.admit(_request("a", "r0", T0))).reserved
        fwd = other._fwd
        assert fwd is not None
        writes = fwd.writes
        settle = asyncio.ensure_future(other.settle(POOL.id, "a", "r0", _usage(40.0), T0 + 1))
        await asyncio.sleep(0)  # queued behind the 2 ms
        assert (await other.admit(_request("a", "r1", T0 + 2))).reserved
        await settle
        assert fwd.writes == writes + 1  # the admission and the settle: one frame
        late = asyncio.ensure_future(other.settle(POOL.id, "a", "r1", _usage(40.0), T0 + 3))
        await asyncio.sleep(0)
        await other.close()  # before the 2 ms are up
        await late
        assert (await owner.peek(POOL.id, "a", REFS, T0 + 4))[TOK.key] == Count(0.0, 80.0)


async def test_when_the_owner_closes_the_forwarder_takes_the_file(tmp_path: Path) -> None:
    """The owner stops (a worker restarted) while the forwarder's calls are on their way: those
    it never read go to the next owner (none fails), and that is the forwarder itself, in
    memory mode, counting on from everything the owner had counted."""
    path = tmp_path / "quota.sqlite"
    async with _paired(path) as (owner, other):
        for i in range(6):
            assert (await other.admit(_request("a", f"r{i}", T0 + i))).reserved
        moving = [
            asyncio.ensure_future(other.admit(_request("a", f"m{i}", T0 + 6))) for i in range(4)
        ]
        await asyncio.sleep(0)  # queued, perhaps written: the owner reads none of them
        await owner.close()
        assert all(r.reserved for r in await asyncio.gather(*moving))
        usage = await other.pool_usage(POOL.id, [], REFS, T0 + 10)
        assert other.mode == "memory"
        assert usage.totals[REQ.key] == Count(0.0, 10.0)
        assert (await other.admit(_request("a", "r10", T0 + 11))).reserved
        third = SqliteQuotaStore(path, forward=True)  # and the next process forwards to it
        try:
            assert third.mode == "forwarding"
            assert (await third.peek(POOL.id, "a", REFS, T0 + 12))[REQ.key] == Count(0.0, 11.0)
        finally:
            await third.close()


async def test_a_transactional_sharer_still_makes_the_owner_hand_over(tmp_path: Path) -> None:
    """A process that does not forward (a tool's ``shared_connection``, a store made
    directly) joins: the owner hands over as before, and goes on answering its forwarders
    transactionally, so all three stay exact together."""
    path = tmp_path / "quota.sqlite"
    async with _paired(path) as (owner, other):
        for i in range(4):
            assert (await other.admit(_request("a", f"r{i}", T0 + i))).reserved
        sharer = await asyncio.to_thread(SqliteQuotaStore, path, mode="memory")
        try:
            assert (owner.mode, other.mode, sharer.mode) == (
                "transactional",
                "forwarding",
                "transactional",
            )
            for i, s in enumerate([other, sharer, owner] * 2, start=4):
                assert (await s.admit(_request("a", f"r{i}", T0 + i))).reserved
            usage = await sharer.pool_usage(POOL.id, [], REFS, T0 + 20)
            assert usage.totals[REQ.key] == Count(0.0, 10.0)
        finally:
            await sharer.close()


async def test_the_owner_runs_only_the_store_methods_it_forwards(tmp_path: Path) -> None:
    """A forwarded frame naming anything else (``close``, a private method) is refused."""
    path = tmp_path / "quota.sqlite"
    async with _owning(path) as owner:
        await asyncio.sleep(0)  # the listener is up
        assert "close" not in FORWARDED
        use = FileUse(str(path))
        sock = use.connect_owner(1000)
        use.close()
        assert sock is not None
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        payload = pickle.dumps([(1, "close", ()), (2, "_hand_over", ()), (3, "ping", ())])
        writer.write(struct.pack("<I", len(payload)) + payload)
        answers: list[tuple[int, bool, object]] = []
        while len(answers) < 3:
            (n,) = struct.unpack("<I", await reader.readexactly(4))
            answers += pickle.loads(await reader.readexactly(n))
        writer.close()
        assert sorted(answers, key=lambda a: a[0]) == [
            (1, False, ("error", "not forwarded: close")),
            (2, False, ("error", "not forwarded: _hand_over")),
            (3, True, True),
        ]
        assert owner.mode == "memory"
        assert await owner.ping()


async def test_without_forward_a_second_store_shares_as_before(tmp_path: Path) -> None:
    """A store made directly (``forward`` off) is a transactional sharer next to an owner."""
    path = tmp_path / "quota.sqlite"
    async with _owning(path) as owner:
        other = await asyncio.to_thread(SqliteQuotaStore, path)
        try:
            assert (owner.mode, other.mode) == ("transactional", "transactional")
        finally:
            await other.close()


_OWNER = textwrap.dedent(
    """
    import asyncio, json
    from fairgate.store.sqlite.store import SqliteQuotaStore

    async def main():
        store = SqliteQuotaStore({path!r}, mode="memory", flush_ms=5)
        assert store.mode == "memory"
        print(json.dumps({{"pid": 0}}), flush=True)
        await asyncio.sleep(3600)  # serves forwarded calls until killed

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_kill_9_of_the_owner_the_forwarder_takes_over_with_what_was_committed(
    tmp_path: Path,
) -> None:
    """The owner is another process, killed with -9 after the forwarder's 12 admissions and
    settles were committed (``flush``): the forwarder's next call takes the file, folds the
    dead owner's journal, and counts on from all 12."""
    path = tmp_path / "quota.sqlite"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _OWNER.format(path=str(path)),
        ],
        stdout=subprocess.PIPE,
        env={**os.environ},
        text=True,
    )

    async def run() -> tuple[Count, str]:
        other = SqliteQuotaStore(path, forward=True)
        try:
            assert other.mode == "forwarding"
            for i in range(12):
                assert (await other.admit(_request("ab"[i % 2], f"r{i}", T0 + i))).reserved
                await other.settle(POOL.id, "ab"[i % 2], f"r{i}", _usage(40.0), T0 + i)
            await other.flush()  # committed by the owner: must survive its kill
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            fwd = other._fwd
            assert fwd is not None
            for _ in range(1000):  # the kernel closes the socket: the loop reads its end
                if fwd.lost:
                    break
                await asyncio.sleep(0.01)
            assert fwd.lost
            usage = await other.pool_usage(POOL.id, [], REFS, T0 + 20)
            return usage.totals[REQ.key], other.mode
        finally:
            await other.close()

    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {"pid": 0}
        total, mode = asyncio.run(run())
    finally:
        reap(proc)
    assert mode == "memory"
    assert total == Count(0.0, 12.0)
    assert _file_state(path) == (12.0, 12 * 40.0, 0)


def test_a_forwarder_refuses_nothing_but_a_peer_of_another_user(tmp_path: Path) -> None:
    """``same_user`` reads the peer's uid (SO_PEERCRED): this process's own is accepted."""
    from fairgate.store.sqlite.forward import same_user

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        assert same_user(a) is True
    finally:
        a.close()
        b.close()


async def test_an_owner_that_answers_nothing_fails_the_calls_after_the_timeout(
    tmp_path: Path,
) -> None:
    """A stopped owner (its socket open, nothing read): the forwarder's calls fail with the
    store's unavailable error after its busy timeout instead of waiting forever."""
    from fairgate.store.sqlite.forward import ForwardClient

    mute, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    client = ForwardClient(peer, timeout_s=0.05)
    try:
        with pytest.raises(sqlite3.OperationalError, match="not answering"):
            await client.call("ping", ())
        assert client.lost
    finally:
        client.close()
        mute.close()


async def test_a_forwarders_held_request_waits_in_the_owners_queue(tmp_path: Path) -> None:
    """``admission: hold`` with two workers: the queue lives in the owner's memory beside its
    counters, so a forwarder's waiter is seen by both, and its ``leave`` (the client went
    away) empties the owner's queue; read from the file's table, both would see nothing."""
    from test_store_hold import POOL as HELD
    from test_store_hold import T0 as H0
    from test_store_hold import _admit, _fill, _hold

    async with _paired(tmp_path / "quota.sqlite") as (owner, other):
        await _fill(owner, H0)
        held = await _admit(other, "a", H0 + 1, _hold("a-1", H0 + 1))
        assert held.waiting
        assert not held.reserved
        for store in (owner, other):
            assert [w.waiter_id for w in await store.waiters(HELD.id, H0 + 2)] == ["a-1"]
        assert await other.leave(HELD.id, "a-1")
        assert await owner.waiters(HELD.id, H0 + 3) == []
        assert not await owner.leave(HELD.id, "a-1")


async def test_a_forwarded_call_does_not_ask_for_the_running_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python 3.11's ``asyncio.get_running_loop()`` makes a ``getpid`` system call each time;
    the forwarder takes its loop once, when it connects, so an admission and a settle on the
    forwarding path ask for it no more (a ``getpid`` per call and per frame before)."""
    path = tmp_path / "quota.sqlite"
    async with _paired(path) as (_, other):
        assert await other.ping()  # connected: the loop is known from here on
        asked: list[str] = []
        real = asyncio.get_running_loop

        def counting() -> asyncio.AbstractEventLoop:
            asked.append(sys._getframe(1).f_code.co_filename)
            return real()

        monkeypatch.setattr(asyncio, "get_running_loop", counting)
        results = await asyncio.gather(*(other.admit(_request("a", f"g{i}", T0)) for i in range(5)))
        await other.settle(POOL.id, "a", "g0", _usage(1.0), T0 + 1)
        monkeypatch.undo()
        assert all(r.reserved for r in results)
        assert not [f for f in asked if f.endswith("forward.py")]
