"""``fairgate simulate``: replay a workload of many client keys against a pool and measure how
fairly and how fully each sharing policy used it, against the exact fair ideal (weighted
max-min; weighted dominant-resource-fair over several dimensions).

Pure parts (``scenario``, ``workload``, ``ideal``, ``fairness``) do no I/O; ``policies`` drives
the real :class:`~fairgate.quota.engine.QuotaEngine` on a real store with a manual clock;
``runner`` ties them together and ``report`` prints and draws the results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.sim.command import run_simulate
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = ["run_simulate"]
