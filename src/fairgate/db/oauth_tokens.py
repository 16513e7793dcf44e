"""OAuth tokens at rest: one sealed file per connection under ``<data dir>/oauth/``.

Why files and not a table: a refresh must be one atomic step *across the replicas that share a
data dir*, including the lock that keeps two of them from spending the same refresh token (the
provider rotates it: the second refresh would be refused and lock the account out). ``flock``
on a per-connection lock file gives exactly that between processes, and an atomic rename makes
each save all-or-nothing. Replicas on different hosts need a shared lock (Redis): not here yet.

Every value is sealed with the gateway's :class:`~fairgate.secretbox.SecretBox` (Fernet), so
the files hold no token in clear; the directory is 0700 and each file 0600.

A record also keeps ``seed``: a digest of the refresh token the *config* last supplied. The
config still holds that token after it was rotated, so at start-up the config's tokens replace
the stored ones only when the config supplies a different refresh token (the operator logged
in again), never merely because the gateway restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

from fairgate.domain.tokens import TokenSet
from fairgate.files import FILE_MODE, private_dir
from fairgate.secretbox import SecretBox

__all__ = ["FileRefreshLock", "FileTokenStore", "seed_digest"]

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def seed_digest(refresh_token: str) -> str:
    return hashlib.sha256(refresh_token.encode()).hexdigest()


def _name(connection_id: str) -> str:
    return _SAFE.sub("_", connection_id) + "-" + seed_digest(connection_id)[:8]


class FileTokenStore:
    """``TokenStore`` over sealed files; ``save`` is a compare-and-swap under the file lock."""

    def __init__(self, directory: str | os.PathLike[str], box: SecretBox) -> None:
        self.dir = private_dir(directory)
        self._box = box

    def _path(self, connection_id: str) -> Path:
        return self.dir / f"{_name(connection_id)}.json"

    def _read(self, connection_id: str) -> dict[str, Any] | None:
        try:
            raw = self._path(connection_id).read_bytes()
        except FileNotFoundError:
            return None
        data = orjson.loads(raw)
        return data if isinstance(data, dict) else None

    def _tokens(self, data: dict[str, Any]) -> TokenSet:
        exp, issued = data.get("expires_at_ms"), data.get("issued_at_ms")
        return TokenSet(
            self._box.open(str(data.get("access_token", ""))),
            self._box.open(str(data.get("refresh_token", ""))),
            int(exp) if isinstance(exp, int) else None,
            data.get("account_id") if isinstance(data.get("account_id"), str) else None,
            int(issued) if isinstance(issued, int) else None,
        )

    def _write(self, connection_id: str, tokens: TokenSet, seed: str | None) -> None:
        data = {
            "access_token": self._box.seal(tokens.access_token),
            "refresh_token": self._box.seal(tokens.refresh_token),
            "expires_at_ms": tokens.expires_at_ms,
            "account_id": tokens.account_id,
            "issued_at_ms": tokens.issued_at_ms,
            "seed": seed,
        }
        _replace_file(self._path(connection_id), data)

    async def load(self, connection_id: str) -> TokenSet | None:
        data = await asyncio.to_thread(self._read, connection_id)
        return None if data is None else self._tokens(data)

    def _save(self, connection_id: str, tokens: TokenSet, replaces: str | None) -> bool:
        with _flocked(self.dir / f"{_name(connection_id)}.save.lock"):
            data = self._read(connection_id)
            if replaces is not None and (
                data is None or self._tokens(data).refresh_token != replaces
            ):
                return False
            seed = data.get("seed") if data is not None else None
            self._write(connection_id, tokens, seed if isinstance(seed, str) else None)
            return True

    async def save(self, connection_id: str, tokens: TokenSet, *, replaces: str | None) -> bool:
        return await asyncio.to_thread(self._save, connection_id, tokens, replaces)

    def _seed(self, connection_id: str, tokens: TokenSet) -> bool:
        digest = seed_digest(tokens.refresh_token)
        with _flocked(self.dir / f"{_name(connection_id)}.save.lock"):
            data = self._read(connection_id)
            if data is not None and data.get("seed") == digest:
                return False  # the same login as before: keep what refreshing made of it
            self._write(connection_id, tokens, digest)
            return True

    def reseal(self) -> int:
        """Key rotation: every token file sealed again under the box's first key, each under
        its save lock (a refresh meanwhile is not lost); the number of files."""
        n = 0
        for path in sorted(self.dir.glob("*.json")):
            with _flocked(path.with_suffix(".save.lock")):
                data = orjson.loads(path.read_bytes())
                if not isinstance(data, dict):
                    continue
                for field in ("access_token", "refresh_token"):
                    data[field] = self._box.reseal(str(data.get(field, "")))
                _replace_file(path, data)
                n += 1
        return n

    async def seed(self, connection_id: str, tokens: TokenSet) -> bool:
        """Store the config's tokens unless they are the ones already seeded. True if stored."""
        return await asyncio.to_thread(self._seed, connection_id, tokens)


def _replace_file(path: Path, data: dict[str, Any]) -> None:
    """All or nothing: a temporary file, synced, renamed over ``path``."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, FILE_MODE)
    with os.fdopen(fd, "wb") as fh:
        fh.write(orjson.dumps(data))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def _flocked(path: Path) -> Any:
    fd = os.open(path, os.O_CREAT | os.O_RDWR, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class FileRefreshLock:
    """``RefreshLock`` across the processes sharing a data dir (``flock``), and within one
    process (an asyncio lock first, so one process's waiters do not each hold a thread)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = private_dir(directory)
        self._local: dict[str, asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def hold(self, connection_id: str) -> AsyncIterator[None]:
        local = self._local.setdefault(connection_id, asyncio.Lock())
        async with local:
            path = self.dir / f"{_name(connection_id)}.refresh.lock"
            fd = await asyncio.to_thread(os.open, path, os.O_CREAT | os.O_RDWR, FILE_MODE)
            try:
                await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
