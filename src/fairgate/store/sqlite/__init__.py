"""The SQLite quota store (the default): the store itself (``store``), its memory mode with a
write-behind journal (``memory``, ``batches``), the owner/sharer hand-over between processes
(``owner``) and the reservation shapes both modes share (``parts``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.store.sqlite.memory import DEFAULT_FLUSH_MS
    from fairgate.store.sqlite.store import (
        DEFAULT_MODE,
        MAX_FLUSH_MS,
        MODES,
        SYNCHRONOUS_MODES,
        SqliteQuotaStore,
    )
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = [
    "DEFAULT_FLUSH_MS",
    "DEFAULT_MODE",
    "MAX_FLUSH_MS",
    "MODES",
    "SYNCHRONOUS_MODES",
    "SqliteQuotaStore",
]
