"""The admin command groups of the ``fairgate`` command line (over the admin API)."""

from fairgate.admin_cli.commands import register

__all__ = ["register"]
