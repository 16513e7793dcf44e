"""The admin API (``/api/...``) and the dashboard's handler.

One module per resource family (keys and connections in ``resources``, pools, combos and their
statistics, OAuth logins, resilience state, the test clock), their request and answer models in
``models``, the routes assembled in ``api``. It reads and changes the gateway's state through
``fairgate.process`` and the metadata repositories; the request path never imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.admin.api import create_admin_app
    from fairgate.admin.common import error_response
    from fairgate.admin.dashboard import dashboard_mount
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = ["create_admin_app", "dashboard_mount", "error_response"]
