"""Where a setting is read: the :class:`From` marker every settings field carries.

A leaf module (standard library only) so an area's settings model on any floor (the quota
store, the metadata DB, resilience) declares its fields where they are used, while the one
loader that reads the sources lives above them all in ``fairgate.process.settings``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["From", "Kind"]

Kind = Literal["db", "env", "file"]


@dataclass(frozen=True, slots=True)
class From:
    """Where a setting is read: its DB key (``quota.leaseMs``), its environment variable and
    its dotted path in the config file (``server.port``); None: not from that source.

    ``lenient``: a value that does not validate is skipped with a warning (the next source
    wins) even at start, for knobs whose typo must not stop the gateway (resilience, the quota
    store's tuning); otherwise a bad value stops the start naming the variable."""

    db: str | None = None
    env: str | None = None
    file: str | None = None
    lenient: bool = False

    def name(self, kind: Kind) -> str | None:
        return {"db": self.db, "env": self.env, "file": self.file}[kind]
