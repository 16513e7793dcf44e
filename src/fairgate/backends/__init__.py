"""Shared backends: the one Redis client set-up and the deadline every backend call runs under.

The quota store, the metadata database's token store and the resilience store all reach Redis;
they share this package's client construction (one pool, one retry and timeout policy) instead of
each building its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.backends.deadline import NoReply, call_within
    from fairgate.backends.redis_client import AsyncClient, async_client, prepare, probe_client
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = ["AsyncClient", "NoReply", "async_client", "call_within", "prepare", "probe_client"]
