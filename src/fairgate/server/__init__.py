"""The process assembled: the ASGI application (``app``: the request path, the admin API and the
dashboard mounted on the process's edge) and ``serve --workers N`` (``workers``,
``worker_protocol``). The top floor below the CLI."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.server.app import create_app
    from fairgate.server.workers import MAX_WORKERS, config_secrets, run_workers
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = ["MAX_WORKERS", "config_secrets", "create_app", "run_workers"]
