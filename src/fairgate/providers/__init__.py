"""How fairgate talks to providers: the upstream port and its transports.

The ``Upstream`` port and fairgate's own response type (``transport``), the aiohttp client
(``upstream``), the keep-alive HTTP/1.1 client of the relayed requests (``http1``), the
in-process double of the tests (``inprocess``), the connection probe (``probe``), OAuth
tokens and their refresh (``oauth``, ``oauth_http``) and the models' context windows. What is
said over the wire is ``fairgate.formats``' concern."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.providers.context_windows import context_window
    from fairgate.providers.oauth import (
        AuthHealth,
        OAuthTokens,
        RefreshLock,
        RefreshRejected,
        RefreshUnavailable,
        TokenStore,
        chatgpt_account_id,
        jwt_claims,
    )
    from fairgate.providers.oauth_http import HttpTokenEndpoint
    from fairgate.providers.probe import probe_connection
    from fairgate.providers.transport import (
        TRANSPORT_ERRORS,
        HttpSender,
        Upstream,
        UpstreamResponse,
    )
    from fairgate.providers.upstream import UpstreamAuthUnavailable, UpstreamClient
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = [
    "TRANSPORT_ERRORS",
    "AuthHealth",
    "HttpSender",
    "HttpTokenEndpoint",
    "OAuthTokens",
    "RefreshLock",
    "RefreshRejected",
    "RefreshUnavailable",
    "TokenStore",
    "Upstream",
    "UpstreamAuthUnavailable",
    "UpstreamClient",
    "UpstreamResponse",
    "chatgpt_account_id",
    "context_window",
    "jwt_claims",
    "probe_connection",
]
