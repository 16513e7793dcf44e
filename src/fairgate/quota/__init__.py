"""The quota core: pools, allocations and the admission decision, with no I/O.

The pool model and plan catalogue (``model``, ``catalog``), the pure admission rule with its
worked numbers (``decision``), the sliding windows (``window``), the store port
(``ports``) and the engine that drives it (``engine``, its records in ``outcomes``, its
journal in ``journal``), usage views, signals, attribution and retention."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.quota.attribution import PercentAttributor
    from fairgate.quota.catalog import CATALOG, resolve_plan
    from fairgate.quota.decision import (
        POLICY_CODES,
        REASON_CODES,
        DimensionCheck,
        Outcome,
        Reason,
        Scope,
        Verdict,
        compile_checks,
        dominant_levels,
        evaluate,
        retry_after_ms,
    )
    from fairgate.quota.engine import QuotaEngine
    from fairgate.quota.messages import block_message
    from fairgate.quota.model import (
        Allocation,
        Dimension,
        ModelCap,
        PlanSource,
        Policy,
        Pool,
        ShareMode,
        pool_limits,
        unenforced_message,
        unenforced_pools,
    )
    from fairgate.quota.outcomes import ALLOW_UNGOVERNED, Admission, Standing, Ticket
    from fairgate.quota.ports import (
        RECLAIM_BATCH,
        TOTAL_KEY,
        AdmitRequest,
        AdmitResult,
        CounterRef,
        GcResult,
        PoolCounts,
        QuotaStore,
        ReservationExists,
        SlotLeases,
        SlotLeaseSource,
        UsageItem,
    )
    from fairgate.quota.retention import RetentionGc
    from fairgate.quota.settings import QuotaSettings
    from fairgate.quota.signals import AccountBuckets, BucketState, SaturationSignals, SingleFlight
    from fairgate.quota.usage import PoolUsage
    from fairgate.quota.window import Anchor, Count, bucket_index, fade, reanchor, sliding_value
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = [
    "ALLOW_UNGOVERNED",
    "CATALOG",
    "POLICY_CODES",
    "REASON_CODES",
    "RECLAIM_BATCH",
    "TOTAL_KEY",
    "AccountBuckets",
    "Admission",
    "AdmitRequest",
    "AdmitResult",
    "Allocation",
    "Anchor",
    "BucketState",
    "Count",
    "CounterRef",
    "Dimension",
    "DimensionCheck",
    "GcResult",
    "ModelCap",
    "Outcome",
    "PercentAttributor",
    "PlanSource",
    "Policy",
    "Pool",
    "PoolCounts",
    "PoolUsage",
    "QuotaEngine",
    "QuotaSettings",
    "QuotaStore",
    "Reason",
    "ReservationExists",
    "RetentionGc",
    "SaturationSignals",
    "Scope",
    "ShareMode",
    "SingleFlight",
    "SlotLeaseSource",
    "SlotLeases",
    "Standing",
    "Ticket",
    "UsageItem",
    "Verdict",
    "block_message",
    "bucket_index",
    "compile_checks",
    "dominant_levels",
    "evaluate",
    "fade",
    "pool_limits",
    "reanchor",
    "resolve_plan",
    "retry_after_ms",
    "sliding_value",
    "unenforced_message",
    "unenforced_pools",
]
