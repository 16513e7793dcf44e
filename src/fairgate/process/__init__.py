"""What one gateway process holds and how it speaks HTTP.

``state.Gateway`` (the metadata database, the quota engine and store, resilience, the snapshot,
the OAuth service), the HTTP edge (``edge``: host check, request ids, the ``/v1`` fast lane;
``http_protocol``: uvicorn's httptools protocol with head/body deadlines and connection caps;
``client_http``: the request and answer types of the fast lane; ``errors``), the one settings
object (``settings``), the edge's settings (``http_settings``), the per-key rate guard and admin
backoff (``guards``), logs, metrics and tracing. The request path and the admin API stand on it;
the process assembly (``fairgate.server``) stands on all three.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.process.client_http import (
        Answer,
        ClientRequest,
        Later,
        StreamAnswer,
        error_response,
    )
    from fairgate.process.edge import (
        FastRoute,
        GatewayApp,
        SendDeadline,
        internal_error,
        via_router,
    )
    from fairgate.process.errors import ApiError
    from fairgate.process.guards import AdminBackoff, KeyRateGuard
    from fairgate.process.http_protocol import protocol_for, run, server_options
    from fairgate.process.http_settings import HttpSettings, SettingsError, admin_key_problem
    from fairgate.process.logs import (
        MASK,
        REDACTOR,
        REQUEST_ID,
        configure_from_settings,
    )
    from fairgate.process.metrics import Metrics
    from fairgate.process.metrics_http import metrics_endpoint
    from fairgate.process.oauth_service import CLIENT_SETTING, OAuthClient
    from fairgate.process.oauth_setup import start_oauth
    from fairgate.process.settings import Fraction, RetentionDays, Settings
    from fairgate.process.state import Gateway
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = [
    "CLIENT_SETTING",
    "MASK",
    "REDACTOR",
    "REQUEST_ID",
    "AdminBackoff",
    "Answer",
    "ApiError",
    "ClientRequest",
    "FastRoute",
    "Fraction",
    "Gateway",
    "GatewayApp",
    "HttpSettings",
    "KeyRateGuard",
    "Later",
    "Metrics",
    "OAuthClient",
    "RetentionDays",
    "SendDeadline",
    "Settings",
    "SettingsError",
    "StreamAnswer",
    "admin_key_problem",
    "configure_from_settings",
    "error_response",
    "internal_error",
    "metrics_endpoint",
    "protocol_for",
    "run",
    "server_options",
    "start_oauth",
    "via_router",
]
