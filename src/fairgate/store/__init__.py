"""Quota counters: one protocol, a SQLite driver (default) and a Redis driver."""

from __future__ import annotations

from fairgate.quota.ports import (
    AdmitRequest,
    AdmitResult,
    CounterRef,
    PoolCounts,
    QuotaStore,
    UsageItem,
)

__all__ = ["AdmitRequest", "AdmitResult", "CounterRef", "PoolCounts", "QuotaStore", "UsageItem"]
