"""The Redis quota store (one server or a Cluster): the store and its Lua scripts (``store``;
the scripts live in ``fairgate/store/lua``), the pipelined script lane of the hot path
(``lane``) and concurrency slots shared between replicas (``slots``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.store.redis.store import RedisQuotaStore, script_source
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = ["RedisQuotaStore", "script_source"]
