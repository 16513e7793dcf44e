"""Who uses a SQLite quota file: one owner alone, or sharers.

The in-memory mode (:mod:`fairgate.store.sqlite_memory`) is only exact while no other process
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
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time


def _open(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


class FileUse:
    """This process's hold on one quota file (see the module docstring)."""

    def __init__(self, db_path: str) -> None:
        self._owner_fd = _open(db_path + ".owner")
        self._share_fd = _open(db_path + ".share")
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
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            try:
                fcntl.flock(self._owner_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    msg = "the quota file's owner process did not hand it over in time"
                    raise sqlite3.OperationalError(msg) from None
                time.sleep(0.002)
        self.owner = False

    def sharer_waiting(self) -> bool:
        """(Owner) Has another process announced that it wants to use the file?"""
        try:
            fcntl.flock(self._share_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self._share_fd, fcntl.LOCK_UN)
        return False

    def hand_over(self) -> None:
        """(Owner, state committed) Become a sharer: the waiting process gets in."""
        # announce first: if a third process takes the exclusive hold in the moment the
        # conversion leaves it free, it sees this announcement and hands over in turn
        fcntl.flock(self._share_fd, fcntl.LOCK_SH)
        fcntl.flock(self._owner_fd, fcntl.LOCK_SH)
        self.owner = False

    def close(self) -> None:
        for fd in (self._owner_fd, self._share_fd):
            if fd >= 0:
                os.close(fd)
        self._owner_fd = self._share_fd = -1
