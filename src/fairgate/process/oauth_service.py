"""OAuth logins supplied while the gateway runs (admin API, ``fairgate connections login``).

Why a service beside :class:`~fairgate.providers.oauth.OAuthTokens`: the token lifecycle is
pure and knows a connection only by id; a login also names *where* the tokens are refreshed
(the provider's token endpoint and client id), which must survive a restart and reach the
other replicas. That pair is not secret, so it is kept in the metadata DB's settings
(``oauth.client.<connection id>``, JSON): the write bumps the change counter, every replica
reloads, and :meth:`OAuthAccounts.adopt` takes the connection in charge there too. The tokens
themselves go only to the sealed token store (files, or Redis), never to the DB or an answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import orjson

from fairgate.clock import Clock
from fairgate.domain.tokens import TokenSet
from fairgate.providers.oauth import AuthHealth, OAuthTokens, RefreshLock, TokenStore
from fairgate.providers.oauth_http import HttpTokenEndpoint
from fairgate.providers.transport import HttpSender

__all__ = ["CLIENT_SETTING", "OAuthAccounts", "OAuthClient"]

#: Settings key prefix of a connection's token endpoint (``oauth.client.<id>``).
CLIENT_SETTING = "oauth.client."


@dataclass(frozen=True, slots=True)
class OAuthClient:
    """Where a connection's tokens are refreshed: the provider's token endpoint."""

    token_url: str
    client_id: str = ""

    def dumps(self) -> str:
        return orjson.dumps({"tokenUrl": self.token_url, "clientId": self.client_id}).decode()

    @staticmethod
    def loads(raw: str) -> OAuthClient | None:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        url = data.get("tokenUrl") if isinstance(data, dict) else None
        client = data.get("clientId") if isinstance(data, dict) else None
        if not isinstance(url, str) or not url:
            return None
        return OAuthClient(url, client if isinstance(client, str) else "")


class OAuthAccounts:
    """The gateway's OAuth connections: their token lifecycle and the endpoint of each."""

    def __init__(
        self,
        clock: Clock,
        http: HttpSender,
        store: TokenStore,
        lock: RefreshLock,
        *,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._clock = clock
        self._http = http
        self._endpoints: dict[str, HttpTokenEndpoint] = {}
        self._clients: dict[str, OAuthClient] = {}
        self.tokens = OAuthTokens(
            clock, self._endpoints.__getitem__, store, lock, on_close=on_close
        )

    def endpoint(self, client: OAuthClient) -> HttpTokenEndpoint:
        return HttpTokenEndpoint(self._http, client.token_url, client.client_id, self._clock)

    def register(self, connection_id: str, client: OAuthClient) -> None:
        """Manage ``connection_id``, refreshing at ``client``'s endpoint (idempotent)."""
        if self._clients.get(connection_id) != client:
            self._endpoints[connection_id] = self.endpoint(client)
            self._clients[connection_id] = client
        self.tokens.manage(connection_id)

    async def login(self, connection_id: str, client: OAuthClient, tokens: TokenSet) -> AuthHealth:
        """New tokens from an operator: stored (sealed) unconditionally; they lift a block."""
        self.register(connection_id, client)
        await self.tokens.supply(connection_id, tokens)
        return next(h for h in self.tokens.health() if h.connection_id == connection_id)

    def adopt(self, settings: Mapping[str, str], oauth_connections: Iterable[str]) -> list[str]:
        """Take in charge the OAuth connections logged in through another replica (their
        endpoint is in ``settings``); the ids newly or newly-differently registered."""
        changed = []
        for cid in oauth_connections:
            raw = settings.get(CLIENT_SETTING + cid)
            client = OAuthClient.loads(raw) if raw else None
            if client is not None and self._clients.get(cid) != client:
                self.register(cid, client)
                changed.append(cid)
        return changed
