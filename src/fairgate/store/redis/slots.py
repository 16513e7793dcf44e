"""Concurrency slots shared by every replica on one Redis: leases in a ZSET per connection.

``<prefix>:{slot:<connection>}:leases`` holds the lease ids of the requests running on that
connection, scored by when each lease expires. :mod:`fairgate.path.slots` asks for a lease
before a request goes upstream, gives it back when the request ends, and renews the leases of
requests still running; a replica that dies without giving its leases back loses them when
they expire, so its slots return within one lease lifetime. The scripts take the time as an
argument (the gateway's injected clock), never Redis ``TIME``.

Redis calls go through the quota store's own guarded call (its timeouts and outage
detection); the caller decides what a failure means (the slots fail open, like admission).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from fairgate.backends.redis_client import AsyncClient

__all__ = ["RedisSlotLeases"]

T = TypeVar("T")


class RedisSlotLeases:
    """The :class:`~fairgate.quota.ports.SlotLeases` of the Redis quota store."""

    def __init__(
        self,
        client: AsyncClient,
        prefix: str,
        call: Callable[[Awaitable[Any]], Awaitable[Any]],
        scripts: Callable[[str], str],
    ) -> None:
        self._prefix = prefix
        self._call = call
        self._acquire = client.register_script(scripts("slot_acquire.lua"))
        self._release = client.register_script(scripts("slot_release.lua"))
        self._renew = client.register_script(scripts("slot_renew.lua"))

    def key(self, slot_key: str) -> str:
        """The connection's hash tag keeps its leases in one cluster slot."""
        return f"{self._prefix}:{{slot:{slot_key}}}:leases"

    async def acquire(
        self, slot_key: str, cap: int, lease_id: str, now_ms: int, ttl_ms: int
    ) -> bool:
        got = await self._call(
            self._acquire(keys=[self.key(slot_key)], args=[now_ms, cap, lease_id, ttl_ms])
        )
        return int(got) == 1

    async def release(self, slot_key: str, lease_id: str) -> bool:
        return int(await self._call(self._release(keys=[self.key(slot_key)], args=[lease_id]))) == 1

    async def renew(self, slot_key: str, lease_ids: Sequence[str], now_ms: int, ttl_ms: int) -> int:
        if not lease_ids:
            return 0
        return int(
            await self._call(
                self._renew(keys=[self.key(slot_key)], args=[now_ms, ttl_ms, *lease_ids])
            )
        )
