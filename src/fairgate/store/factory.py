"""Choosing the quota store driver: DB setting > ``QUOTA_STORE_DRIVER`` > sqlite.

Redis asked for but unusable at start (no URL, the client library missing, the server not
answering) falls back to SQLite with a warning: a gateway that refuses to start because its
counter cache is down would turn a degraded mode into an outage.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fairgate import environment
from fairgate.files import private_sqlite
from fairgate.quota.ports import QuotaStore
from fairgate.store.sqlite.memory import DEFAULT_FLUSH_MS
from fairgate.store.sqlite.store import (
    DEFAULT_MODE,
    MAX_FLUSH_MS,
    MODES,
    SYNCHRONOUS_MODES,
    SqliteQuotaStore,
)

log = logging.getLogger("fairgate.store")

DRIVERS = ("sqlite", "redis")


@dataclass(frozen=True, slots=True)
class StoreChoice:
    requested: str
    driver: str
    fallback_reason: str | None = None


def requested_driver(env: Mapping[str, str], db: Mapping[str, str]) -> str:
    """The first driver named by the DB setting or ``QUOTA_STORE_DRIVER``; sqlite otherwise.
    A value that names no driver (a typo such as ``reddis``) is skipped with a warning naming
    it: silently counting on one process's SQLite while the operator meant a shared Redis
    would break the limits of every replica."""
    sources = (
        ("the quotaStore.driver setting", db.get("quotaStore.driver")),
        ("QUOTA_STORE_DRIVER", env.get("QUOTA_STORE_DRIVER")),
    )
    for name, raw in sources:
        if not raw or not raw.strip():
            continue
        if raw.strip().lower() in DRIVERS:
            return raw.strip().lower()
        log.warning(
            "%s=%r is not a quota store driver (%s); ignoring it",
            name,
            raw.strip()[:64],
            " or ".join(DRIVERS),
        )
    return "sqlite"


def redis_url(env: Mapping[str, str], db: Mapping[str, str]) -> str | None:
    for raw in (db.get("quotaStore.redisUrl"), env.get("QUOTA_STORE_REDIS_URL")):
        if raw and raw.strip():
            return raw.strip()
    return None


#: ``QUOTA_STORE_REDIS_TIMEOUT_MS``: how long one Redis command may take before the store counts
#: as down (the connect timeout is half of it); bounds what a request waits when Redis hangs.
DEFAULT_REDIS_TIMEOUT_MS = 1_000
_REDIS_TIMEOUT_RANGE = (50, 30_000)


def redis_timeout_ms(env: Mapping[str, str]) -> int:
    raw = (env.get("QUOTA_STORE_REDIS_TIMEOUT_MS") or "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            value = -1
        lo, hi = _REDIS_TIMEOUT_RANGE
        if lo <= value <= hi:
            return value
        log.warning(
            "QUOTA_STORE_REDIS_TIMEOUT_MS=%r is not in %d..%d; using %d",
            raw,
            lo,
            hi,
            DEFAULT_REDIS_TIMEOUT_MS,
        )
    return DEFAULT_REDIS_TIMEOUT_MS


async def create_store(
    sqlite_path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    db: Mapping[str, str] | None = None,
    redis_prefix: str = "fairgate",
) -> tuple[QuotaStore, StoreChoice]:
    env = environment.snapshot() if env is None else env
    db = db or {}
    wanted = requested_driver(env, db)
    if wanted == "redis":
        reason = await _try_redis(env, db, redis_prefix)
        if isinstance(reason, str):
            log.warning("quota store: redis unavailable (%s); falling back to sqlite", reason)
            return _sqlite(sqlite_path, env), StoreChoice("redis", "sqlite", reason)
        return reason, StoreChoice("redis", "redis")
    return _sqlite(sqlite_path, env), StoreChoice(wanted, "sqlite")


def _sqlite(path: str | os.PathLike[str], env: Mapping[str, str]) -> QuotaStore:
    private_sqlite(path)  # 0600 in a 0700 directory, like the metadata DB
    sync = (env.get("QUOTA_SQLITE_SYNCHRONOUS") or "OFF").strip().upper()
    if sync not in SYNCHRONOUS_MODES:
        log.warning(
            "QUOTA_SQLITE_SYNCHRONOUS=%r is not one of %s; using OFF",
            sync,
            "/".join(SYNCHRONOUS_MODES),
        )
        sync = "OFF"
    return SqliteQuotaStore(path, synchronous=sync, **sqlite_mode(env))


def sqlite_mode(env: Mapping[str, str]) -> dict[str, Any]:
    """``QUOTA_SQLITE_MODE`` (``memory``, the default, or ``transactional``) and
    ``QUOTA_SQLITE_FLUSH_MS`` (memory mode's write-behind interval, 1..1000, default 5), as
    :class:`SqliteQuotaStore` arguments. A bad value is named in a warning and the stricter
    choice used (``transactional``; the default interval): never a silently longer loss
    window."""
    mode = (env.get("QUOTA_SQLITE_MODE") or DEFAULT_MODE).strip().lower()
    if mode not in MODES:
        log.warning(
            "QUOTA_SQLITE_MODE=%r is not one of %s; using transactional",
            mode[:64],
            "/".join(MODES),
        )
        mode = "transactional"
    raw = (env.get("QUOTA_SQLITE_FLUSH_MS") or "").strip()
    flush_ms = DEFAULT_FLUSH_MS
    if raw:
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if 1 <= value <= MAX_FLUSH_MS:
            flush_ms = value
        else:
            log.warning(
                "QUOTA_SQLITE_FLUSH_MS=%r is not in 1..%d; using %d",
                raw[:64],
                MAX_FLUSH_MS,
                DEFAULT_FLUSH_MS,
            )
    # a second process on the file (serve --workers N) forwards to the owner: memory mode stays
    return {"mode": mode, "flush_ms": flush_ms, "forward": True}


async def _try_redis(
    env: Mapping[str, str], db: Mapping[str, str], prefix: str
) -> QuotaStore | str:
    """The store when Redis works, else the reason it does not (never the URL: it may hold a
    password)."""
    url = redis_url(env, db)
    if not url:
        return "QUOTA_STORE_REDIS_URL is not set"
    from fairgate.store.redis.store import RedisQuotaStore

    try:
        timeout_s = redis_timeout_ms(env) / 1000.0
        store = RedisQuotaStore(
            url, prefix=prefix, connect_timeout_s=timeout_s / 2, socket_timeout_s=timeout_s
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
