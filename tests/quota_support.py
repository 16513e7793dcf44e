"""Pools for the quota tests (unit and integration), with only what a test is about spelled out.

A :class:`~fairgate.quota.model.Pool` has six fields a test must fill in; most tests care about
its dimensions and allocations and take any id, name, provider and member. ``make_pool`` names
the rest once, so a test reads as what it sets up instead of the same eight lines again.
"""

from __future__ import annotations

from collections.abc import Iterable

from fairgate.clock import ManualClock
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.journal import Circuit
from fairgate.quota.model import Allocation, Dimension, Pool, ShareMode
from fairgate.quota.ports import QuotaStore


def make_pool(
    *dimensions: Dimension,
    allocations: Iterable[Allocation] = (),
    id: str = "p",
    name: str | None = None,
    provider: str = "kimi",
    connections: Iterable[str] = ("c",),
    share_mode: ShareMode = ShareMode.STATIC,
) -> Pool:
    """A pool of ``dimensions`` shared by ``allocations``; its name is its id unless given."""
    return Pool(
        id, name or id, provider, tuple(connections), dimensions, tuple(allocations), share_mode
    )


def engine_for(store: QuotaStore, clock: ManualClock) -> QuotaEngine:
    """An engine on ``store`` whose circuit, once open, waits a second before it probes the
    store again (the outage tests move the clock past it)."""
    return QuotaEngine(store, clock=clock, circuit=Circuit(open_ms=1_000))
