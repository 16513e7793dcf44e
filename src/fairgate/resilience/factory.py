"""Building the RateLimitManager the gateway runs with: Redis when asked and reachable, else
memory, plus persistence in the metadata DB (written off the event loop), restored once at start.

Redis unusable at start (the server not answering) falls back to
the memory store with a warning, as the quota store does: a gateway that refuses to start
because its shared cache is down would turn a degraded mode into an outage. The fallback is
visible in the health snapshot (``store.driver``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.db.base import Database
from fairgate.resilience.manager import RateLimitManager
from fairgate.resilience.settings import ResilienceSettings
from fairgate.resilience.state import MemoryResilienceStore, ResilienceStore
from fairgate.resilience.writer import PersistenceWriter

if TYPE_CHECKING:
    import redis.asyncio

__all__ = ["build_manager"]

log = logging.getLogger("fairgate.resilience")


async def _redis_store(
    url: str | None,
    client: redis.asyncio.Redis | None,
    prefix: str,
    clock: Clock,
    settings: ResilienceSettings,
) -> ResilienceStore | None:
    from fairgate.resilience.state_redis import RedisResilienceStore

    store = RedisResilienceStore(
        url, prefix=prefix, client=client, clock=clock, level_memory_ms=settings.level_memory_ms
    )
    if not await store.ping():
        log.warning("resilience store: redis at %s not answering; using memory", url or "client")
        await store.close()
        return None
    await store.start_watch()  # checks read the state from memory, kept current by the watcher
    return store


async def build_manager(
    *,
    settings: ResilienceSettings | None = None,
    clock: Clock = SYSTEM_CLOCK,
    redis_url: str | None = None,
    redis_client: redis.asyncio.Redis | None = None,
    redis_prefix: str = "fairgate",
    db: Callable[[], Database] | None = None,
) -> RateLimitManager:
    """A ready manager: Redis store when ``redis_url``/``redis_client`` is given and answers,
    else memory; persistence in the metadata DB when ``db`` (which opens a connection) is given,
    on a connection and a thread of its own (``resilience.writer``),
    with the active entries already restored."""
    settings = settings or ResilienceSettings()
    store: ResilienceStore | None = None
    if redis_url or redis_client is not None:
        store = await _redis_store(redis_url, redis_client, redis_prefix, clock, settings)
    if store is None:
        store = MemoryResilienceStore(clock=clock, level_memory_ms=settings.level_memory_ms)
    persistence = None if db is None else PersistenceWriter(db, clock=clock)
    manager = RateLimitManager(store, clock=clock, settings=settings, persistence=persistence)
    restored = await manager.load()
    if restored:
        log.info("resilience: restored %d active entries from SQLite", restored)
    return manager
