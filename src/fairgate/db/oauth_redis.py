"""OAuth tokens and their refresh lock on Redis: one refresh per connection across replicas on
different hosts (issue 12).

Why: the sealed token files and their ``flock`` (:mod:`fairgate.db.oauth_tokens`) coordinate
the replicas sharing a data dir. Replicas on different hosts share only Redis (the quota store),
and the provider rotates the refresh token on every use, so two hosts refreshing the same
connection would spend one refresh token twice: the second refresh is refused and the account is
locked out until a human logs in again. Hence, when the quota store is Redis:

- **The lock** is a lease: ``SET <prefix>:oauth:{<id>}:lock <owner> NX PX <lease>``. The holder
  refreshes and releases with a compare-and-delete (a replica never deletes another's lease).
  The others poll, then reread the tokens under the lock and find the new pair, so they never
  call the token endpoint. The lease (60 s) outlives the token endpoint's timeout (30 s), and
  a holder that dies frees the lock when it ends.
- **The tokens** live in one hash per connection, sealed with the gateway's
  :class:`~fairgate.secretbox.SecretBox` (the replicas must share ``FAIRGATE_SECRET_KEY``), and
  are saved with a compare-and-swap on a digest of the refresh token they replace (a Lua
  script, atomic in Redis). Redis may lose data (no persistence, a failover), and losing the
  rotated refresh token loses the account, so every save is also written through to this
  host's sealed file; a connection missing from Redis is restored from the file, if absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fairgate.backends.redis_client import AsyncClient
from fairgate.db.oauth_tokens import FileTokenStore, seed_digest
from fairgate.domain.tokens import TokenSet
from fairgate.secretbox import SecretBox

__all__ = ["LEASE_MS", "RedisRefreshLock", "RedisTokenStore"]

#: How long a refresh may hold the lock before another replica may take it over.
LEASE_MS = 60_000

# KEYS[1] the hash; ARGV[1] the digest the stored refresh token must have ('' = any); then
# field/value pairs. 1 if written.
_SAVE = """
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'rd') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
"""

# ARGV[1] mode: 'seed' (write unless the hash already has this seed digest, ARGV[2]) or
# 'restore' (write only if the hash does not exist); then field/value pairs.
_REPLACE = """
if ARGV[1] == 'seed' and redis.call('HGET', KEYS[1], 'seed') == ARGV[2] then return 0 end
if ARGV[1] == 'restore' and redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def _int(raw: Any) -> int | None:
    return int(raw) if raw not in (None, b"", "") else None


class RedisTokenStore:
    """``TokenStore`` shared by every replica of a Redis deployment (see the module notes);
    ``backup`` is this host's sealed file store, written through and read on a Redis miss."""

    def __init__(
        self,
        client: AsyncClient,
        box: SecretBox,
        backup: FileTokenStore,
        *,
        prefix: str = "fairgate",
    ) -> None:
        self._r = client
        self._box = box
        self._backup = backup
        self._prefix = prefix
        self._save = client.register_script(_SAVE)
        self._replace = client.register_script(_REPLACE)

    def key(self, connection_id: str) -> str:
        return f"{self._prefix}:oauth:{{{connection_id}}}:tokens"

    def _fields(self, tokens: TokenSet) -> list[str]:
        return [
            "at", self._box.seal(tokens.access_token),
            "rt", self._box.seal(tokens.refresh_token),
            "rd", seed_digest(tokens.refresh_token),
            "exp", "" if tokens.expires_at_ms is None else str(tokens.expires_at_ms),
            "acct", tokens.account_id or "",
            "iss", "" if tokens.issued_at_ms is None else str(tokens.issued_at_ms),
        ]  # fmt: skip

    async def load(self, connection_id: str) -> TokenSet | None:
        raw = await self._r.hgetall(self.key(connection_id))
        if not raw:
            return await self._restore(connection_id)
        data = {_text(k): _text(v) for k, v in raw.items()}
        return TokenSet(
            self._box.open(data.get("at", "")),
            self._box.open(data.get("rt", "")),
            _int(data.get("exp")),
            data.get("acct") or None,
            _int(data.get("iss")),
        )

    async def _restore(self, connection_id: str) -> TokenSet | None:
        """Redis lost the tokens: this host's last copy, put back unless another host did."""
        tokens = await self._backup.load(connection_id)
        if tokens is None:
            return None
        if not await self._replace(
            keys=[self.key(connection_id)], args=["restore", "", *self._fields(tokens)]
        ):
            return await self.load(connection_id)
        return tokens

    async def save(self, connection_id: str, tokens: TokenSet, *, replaces: str | None) -> bool:
        digest = "" if replaces is None else seed_digest(replaces)
        ok = await self._save(keys=[self.key(connection_id)], args=[digest, *self._fields(tokens)])
        if ok:
            await self._backup.save(connection_id, tokens, replaces=None)
        return bool(ok)

    async def seed(self, connection_id: str, tokens: TokenSet) -> bool:
        """The config's tokens, unless they are the ones already seeded (as the file store)."""
        digest = seed_digest(tokens.refresh_token)
        args = ["seed", digest, *self._fields(tokens), "seed", digest]
        written = bool(await self._replace(keys=[self.key(connection_id)], args=args))
        await self._backup.seed(connection_id, tokens)
        return written


class RedisRefreshLock:
    """``RefreshLock`` across hosts: a lease in Redis (see the module notes), behind a local
    asyncio lock so one process's waiters poll Redis once, not each."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        prefix: str = "fairgate",
        lease_ms: int = LEASE_MS,
        poll_s: tuple[float, float] = (0.02, 0.25),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._r = client
        self._prefix = prefix
        self.lease_ms = lease_ms
        self._poll = poll_s
        self._sleep = sleep
        self._release = client.register_script(_RELEASE)
        self._local: dict[str, asyncio.Lock] = {}

    def key(self, connection_id: str) -> str:
        return f"{self._prefix}:oauth:{{{connection_id}}}:lock"

    @contextlib.asynccontextmanager
    async def hold(self, connection_id: str) -> AsyncIterator[None]:
        local = self._local.setdefault(connection_id, asyncio.Lock())
        async with local:
            key, owner = self.key(connection_id), secrets.token_hex(16)
            wait = self._poll[0]
            while not await self._r.set(key, owner, nx=True, px=self.lease_ms):
                await self._sleep(wait)
                wait = min(wait * 2, self._poll[1])
            try:
                yield
            finally:
                await self._release(keys=[key], args=[owner])
