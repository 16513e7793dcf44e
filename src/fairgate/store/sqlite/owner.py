"""Who uses a SQLite quota file: one owner alone, or sharers.

The in-memory mode (:mod:`fairgate.store.sqlite.memory`) is only exact while no other process
changes the file, so every process that opens a quota file says how it uses it, with two
``flock`` locks next to it (released by the kernel when a process dies, ``kill -9`` included):

- ``<file>.owner``: the owner holds it exclusively; every sharer holds it shared. Exclusive
  succeeds only when nobody else has the file open.
- ``<file>.share``: every sharer holds it shared for as long as it uses the file, so an owner
  that probes it (exclusive, non-blocking, released at once) learns that someone is waiting.

A process that cannot be the owner (or does not want to be) becomes a sharer: it announces
itself on ``.share``, then waits for a shared hold on ``.owner``. An owner, on seeing the
announcement, commits its in-memory state, switches to the transactional path and turns its
exclusive hold into a shared one, which lets the newcomer in. From then on every process on the
file is transactional (exact across them, as the ``BEGIN IMMEDIATE`` path always was) until they
all stop; the next process to start alone is an owner again.

The owner's watcher need not poll for the announcement: an owner binds a datagram socket named
after the lock file (Linux's abstract namespace: no file, gone with the process), and a sharer
that announces itself rings it (again every :data:`RING_EVERY_S` while it waits, so a ring lost
to a race is repeated). The watcher sleeps on that socket while nothing is pending, and wakes at
once on a ring. Where the socket cannot be bound (not Linux, or a name clash) the watcher falls
back to polling every flush interval, as before.

Writers queue on a third lock, ``<file>.write``, held around every write transaction
(:meth:`FileUse.writing`). SQLite's own wait for its write lock is a busy handler that sleeps
1 ms, then 2, 5, 10..., on the event loop: with two processes committing a few thousand
transactions a second between them, many transactions found the lock taken and slept at least
a millisecond for a transaction that takes tens of microseconds (docs/performance.md, "Figures
behind the code"). A writer waiting on
``.write`` instead tries it again every 50 µs (doubling up to a millisecond) and gets in as
soon as the other commits; SQLite's lock is then almost always free at ``BEGIN IMMEDIATE``.
Exactness does not depend on it (``BEGIN IMMEDIATE`` still serialises writers, and a process
that does not take ``.write`` only waits as before).

A gateway process that finds an owner need not be a sharer at all: it *forwards*
(:mod:`fairgate.store.sqlite.forward`). The owner listens on a stream socket named after the
lock file as the doorbell is (:meth:`FileUse.forward_listener`), and a newcomer that connects
(:meth:`FileUse.connect_owner`) holds no lock and never touches the file: the owner counts
for it, in memory. When the owner goes away, a forwarder tries to own the file again like
any newcomer.

A tool or test that reads the file beside a running gateway uses :func:`shared_connection`: it
joins as a sharer, so an owner commits and hands over first and what is read is current. (The
file alone is not: an owner's last few milliseconds live in its memory.)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fairgate.store.sqlite.batches import BatchJournal, replay

#: How often a waiting sharer rings the owner's doorbell again (seconds).
RING_EVERY_S = 0.05
#: How often a waiting sharer tries the owner's lock again (seconds).
SHARE_POLL_S = 0.002
#: A writer waiting for ``.write`` looks again after this long, doubling up to WRITE_POLL_MAX_S.
WRITE_POLL_S = 0.00005
WRITE_POLL_MAX_S = 0.001


def _held_against(fd: int, how: int) -> bool:
    """Would the ``flock`` ``how`` on ``fd`` have to wait (another process holds a lock that
    conflicts)? Asked without blocking and without keeping the lock: taken and dropped at once."""
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _flock_within(
    fd: int,
    how: int,
    timeout_ms: int,
    pause_s: float,
    max_pause_s: float,
    waiting: Callable[[float], None] | None = None,
) -> bool:
    """Take the ``flock`` ``how`` on ``fd`` within ``timeout_ms``, trying without blocking
    ``pause_s`` apart (doubling up to ``max_pause_s``); False once the time is up. A blocking
    ``flock`` would wait forever for a holder that is stopped, not dead. ``waiting(now)`` runs
    before each pause."""
    deadline = time.monotonic() + timeout_ms / 1000.0
    pause = pause_s
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            now = time.monotonic()
            if now >= deadline:
                return False
            if waiting is not None:
                waiting(now)
            time.sleep(pause)
            pause = min(pause * 2, max_pause_s)


def _doorbell_name(lock_fd: int) -> bytes | None:
    """The abstract socket name of one quota file's owner (by the lock file's device and
    inode: every path to the file agrees on it); None where abstract sockets do not exist."""
    if not sys.platform.startswith("linux"):
        return None
    st = os.fstat(lock_fd)
    digest = hashlib.sha256(f"{st.st_dev}:{st.st_ino}".encode()).hexdigest()[:32]
    return b"\0fairgate-quota-" + digest.encode()


def _forward_name(lock_fd: int) -> bytes | None:
    """The abstract socket name an owner serves forwarded calls on
    (:mod:`fairgate.store.sqlite.forward`), by the lock file's identity as
    :func:`_doorbell_name`; None where abstract sockets do not exist."""
    bell = _doorbell_name(lock_fd)
    return None if bell is None else bell.replace(b"-quota-", b"-quota-fwd-", 1)


def _bound(name: bytes | None, kind: int, *, backlog: int | None = None) -> socket.socket | None:
    """A non-blocking Unix socket of ``kind`` bound to ``name`` (listening, with ``backlog``),
    or None: no name (no abstract sockets here) or the name is still taken (a former owner's
    socket not yet closed)."""
    if name is None:
        return None
    s = socket.socket(socket.AF_UNIX, kind)
    try:
        s.bind(name)
        if backlog is not None:
            s.listen(backlog)
    except OSError:
        s.close()
        return None
    s.setblocking(False)
    return s


def _open(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


class FileUse:
    """This process's hold on one quota file (see the module docstring)."""

    def __init__(self, db_path: str) -> None:
        self._owner_fd = _open(db_path + ".owner")
        self._share_fd = _open(db_path + ".share")
        self._write_fd = _open(db_path + ".write")
        self.owner = False

    def try_own(self) -> bool:
        """Hold the file alone if nobody else has it open; True on success."""
        try:
            fcntl.flock(self._owner_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.owner = True
        return True

    def share(self, timeout_ms: int) -> None:
        """Use the file beside others: announce it, then wait until an owner (if any) has
        handed over. ``sqlite3.OperationalError`` if that takes longer than ``timeout_ms`` (an
        owner that is stopped, not dead: a dead one's lock is gone)."""
        # an owner's probe holds this exclusively for a moment only: a blocking wait is short
        fcntl.flock(self._share_fd, fcntl.LOCK_SH)
        ring_at = 0.0

        def ring(now: float) -> None:
            nonlocal ring_at
            if now >= ring_at:
                self._ring()
                ring_at = now + RING_EVERY_S

        if not _flock_within(
            self._owner_fd, fcntl.LOCK_SH, timeout_ms, SHARE_POLL_S, SHARE_POLL_S, waiting=ring
        ):
            msg = "the quota file's owner process did not hand it over in time"
            raise sqlite3.OperationalError(msg)
        self.owner = False

    def _ring(self) -> None:
        """Wake the owner's watcher (best effort: it also polls, only less often)."""
        name = _doorbell_name(self._owner_fd)
        if name is None:
            return
        # no owner listening (yet), or its queue full (it was rung already): both fine
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s, contextlib.suppress(OSError):
            s.sendto(b"!", name)

    def doorbell(self) -> socket.socket | None:
        """(Owner) A non-blocking socket that a waiting sharer rings, or None where there
        is none (then the owner must poll :meth:`sharer_waiting`)."""
        # None also when a former owner's socket is not yet closed: poll instead
        return _bound(_doorbell_name(self._owner_fd), socket.SOCK_DGRAM)

    def forward_listener(self) -> socket.socket | None:
        """(Owner) A listening, non-blocking stream socket other processes on this file
        connect to and send their calls over (:mod:`fairgate.store.sqlite.forward`), or None
        where there is none (not Linux, or a former owner's socket not yet closed: they
        then share the file transactionally, as before)."""
        return _bound(_forward_name(self._owner_fd), socket.SOCK_STREAM, backlog=64)

    def connect_owner(self, timeout_ms: int) -> socket.socket | None:
        """(Would-be forwarder) A socket connected to the owner's forward listener, or None
        when there is no owner to forward to: none holds the file (this process can own it:
        :meth:`try_own`), or the file is shared transactionally (:meth:`share`), or the owner
        does not listen within ``timeout_ms`` (one that never serves: then sharing makes it
        hand over). An owner binds its listener right after taking its lock, so the wait is
        that moment at most."""
        name = _forward_name(self._owner_fd)
        if name is None:
            return None
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(name)
            except OSError:
                s.close()
            else:
                return s
            if not self._owned_elsewhere() or time.monotonic() >= deadline:
                return None
            time.sleep(SHARE_POLL_S)

    def _owned_elsewhere(self) -> bool:
        """Does another process hold the file as its owner (exclusively) right now?"""
        return _held_against(self._owner_fd, fcntl.LOCK_SH)

    def sharer_waiting(self) -> bool:
        """(Owner) Has another process announced that it wants to use the file?"""
        return _held_against(self._share_fd, fcntl.LOCK_EX)

    def hand_over(self) -> None:
        """(Owner, state committed) Become a sharer: the waiting process gets in."""
        # announce first: if a third process takes the exclusive hold in the moment the
        # conversion leaves it free, it sees this announcement and hands over in turn
        fcntl.flock(self._share_fd, fcntl.LOCK_SH)
        fcntl.flock(self._owner_fd, fcntl.LOCK_SH)
        self.owner = False

    @contextmanager
    def writing(self, timeout_ms: int) -> Iterator[None]:
        """Hold the writers' lock for one write transaction (module docstring).
        ``sqlite3.OperationalError`` after ``timeout_ms`` (a writer stopped mid-transaction:
        what SQLite's busy timeout would say)."""
        fd = self._write_fd
        if not _flock_within(fd, fcntl.LOCK_EX, timeout_ms, WRITE_POLL_S, WRITE_POLL_MAX_S):
            raise sqlite3.OperationalError("database is locked")
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        for fd in (self._owner_fd, self._share_fd, self._write_fd):
            if fd >= 0:
                os.close(fd)
        self._owner_fd = self._share_fd = self._write_fd = -1


@contextmanager
def shared_connection(
    db_path: str | os.PathLike[str], timeout_ms: int = 5000
) -> Iterator[sqlite3.Connection]:
    """A connection to a quota file, opened as one more sharer: a memory-mode owner commits
    and hands over first (every process counts transactionally from then on), so the rows
    read are the current state, not the owner's last commit. For tools and tests that read
    the file while a gateway runs; a reader in the owner's own process can ``await
    store.flush()`` instead and leave the mode alone."""
    path = os.fspath(db_path)
    use = FileUse(path)
    try:
        use.share(timeout_ms)
        conn = sqlite3.connect(path, timeout=timeout_ms / 1000.0, isolation_level=None)
        try:
            # an owner that handed over folded its journal; one that died did not
            journal = BatchJournal(path)
            with use.writing(timeout_ms):
                conn.execute("BEGIN IMMEDIATE")
                replay(conn, journal)
                conn.execute("COMMIT")
                journal.clear()
            conn.isolation_level = "DEFERRED"  # the usual implicit transactions for the caller
            yield conn
        finally:
            conn.close()
    finally:
        use.close()
