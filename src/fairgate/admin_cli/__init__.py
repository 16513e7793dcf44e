"""The admin command groups of the ``fairgate`` command line (over the admin API)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.admin_cli.commands import register
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = ["register"]
