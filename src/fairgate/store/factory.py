"""Opening the quota store its settings (:class:`~fairgate.store.settings.StoreSettings`) name.

Redis asked for but unusable at start (no URL, the client library missing, the server not
answering) falls back to SQLite with a warning: a gateway that refuses to start because its
counter cache is down would turn a degraded mode into an outage.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from fairgate.files import private_sqlite
from fairgate.quota.ports import QuotaStore
from fairgate.store.settings import DRIVERS, StoreSettings
from fairgate.store.sqlite.store import SqliteQuotaStore

__all__ = ["DRIVERS", "StoreChoice", "create_store"]

log = logging.getLogger("fairgate.store")


@dataclass(frozen=True, slots=True)
class StoreChoice:
    requested: str
    driver: str
    fallback_reason: str | None = None


async def create_store(
    sqlite_path: str | os.PathLike[str], settings: StoreSettings | None = None
) -> tuple[QuotaStore, StoreChoice]:
    """The store ``settings`` ask for (default: SQLite at ``sqlite_path``)."""
    settings = settings or StoreSettings()
    if settings.driver == "redis":
        reason = await _try_redis(settings)
        if isinstance(reason, str):
            log.warning("quota store: redis unavailable (%s); falling back to sqlite", reason)
            return _sqlite(sqlite_path, settings), StoreChoice("redis", "sqlite", reason)
        return reason, StoreChoice("redis", "redis")
    return _sqlite(sqlite_path, settings), StoreChoice(settings.driver, "sqlite")


def _sqlite(path: str | os.PathLike[str], settings: StoreSettings) -> QuotaStore:
    private_sqlite(path)  # 0600 in a 0700 directory, like the metadata DB
    # a second process on the file (serve --workers N) forwards to the owner: memory mode stays
    return SqliteQuotaStore(
        path,
        synchronous=settings.sqlite_synchronous,
        mode=settings.sqlite_mode,
        flush_ms=settings.sqlite_flush_ms,
        forward=True,
    )


async def _try_redis(settings: StoreSettings) -> QuotaStore | str:
    """The store when Redis works, else the reason it does not (never the URL: it may hold a
    password)."""
    url = settings.redis_url
    if not url:
        return "QUOTA_STORE_REDIS_URL is not set"
    from fairgate.store.redis.store import RedisQuotaStore

    try:
        timeout_s = settings.redis_timeout_ms / 1000.0
        store = RedisQuotaStore(
            url,
            prefix=settings.redis_prefix,
            connect_timeout_s=timeout_s / 2,
            socket_timeout_s=timeout_s,
        )
    except Exception as exc:
        return f"bad redis URL ({type(exc).__name__})"
    try:
        ok = await store.ping()
    except Exception as exc:
        ok = False
        err = type(exc).__name__
    else:
        err = "no PONG"
    if not ok:
        await store.close()
        return f"redis server not reachable ({err})"
    await store.warm()  # connections open before traffic: no storm on the first burst
    return store
