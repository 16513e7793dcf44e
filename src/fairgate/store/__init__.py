"""Quota counters: one protocol, a SQLite driver (default) and a Redis driver."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.quota.ports import (
        AdmitRequest,
        AdmitResult,
        CounterRef,
        PoolCounts,
        QuotaStore,
        UsageItem,
    )
    from fairgate.store.admission_log import (
        MAX_AGE_MS,
        LogBackend,
        RedisLogBackend,
        SharedPoolLog,
        SqliteLogBackend,
    )
    from fairgate.store.factory import StoreChoice, create_store
    from fairgate.store.redis.store import RedisQuotaStore
    from fairgate.store.settings import DRIVERS, StoreSettings
    from fairgate.store.sqlite.store import SqliteQuotaStore
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = [
    "DRIVERS",
    "MAX_AGE_MS",
    "AdmitRequest",
    "AdmitResult",
    "CounterRef",
    "LogBackend",
    "PoolCounts",
    "QuotaStore",
    "RedisLogBackend",
    "RedisQuotaStore",
    "SharedPoolLog",
    "SqliteLogBackend",
    "SqliteQuotaStore",
    "StoreChoice",
    "StoreSettings",
    "UsageItem",
    "create_store",
]
