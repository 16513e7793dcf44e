"""Start-up of the OAuth side: the secret box, the sealed token files, the token endpoints, and
the config's tokens seeded (see :mod:`fairgate.db.oauth_tokens` for when they replace stored
ones), and the logins made through the admin API (:mod:`fairgate.process.oauth_service`).
Only connections with an ``oauth`` block or such a login are managed; the others keep their
static secret."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from fairgate.backends.redis_client import AsyncClient, async_client
from fairgate.config import ConnectionConfig
from fairgate.db.oauth_redis import RedisRefreshLock, RedisTokenStore
from fairgate.db.oauth_tokens import FileRefreshLock, FileTokenStore
from fairgate.db.settings import SettingsRepo
from fairgate.domain.tokens import TokenSet
from fairgate.process.oauth_service import OAuthAccounts, OAuthClient
from fairgate.process.state import Gateway
from fairgate.providers.oauth import OAuthTokens, RefreshLock, chatgpt_account_id
from fairgate.providers.upstream import UpstreamClient

__all__ = ["start_oauth"]


async def start_oauth(gw: Gateway, upstream: UpstreamClient) -> OAuthTokens:
    """The gateway's OAuth side: config connections seeded and managed, logins made through
    the admin API (stored endpoint, sealed tokens) adopted now and on every reload."""
    store, lock, client = _token_persistence(gw, gw.data_dir / "oauth")
    accounts = OAuthAccounts(
        gw.clock, upstream, store, lock, on_close=None if client is None else client.aclose
    )
    for c in gw.config.connections:
        if c.oauth is not None:
            accounts.register(c.id, OAuthClient(c.oauth.token_url, c.oauth.client_id))
            await store.seed(c.id, _seed_tokens(c))
    gw.oauth = accounts
    adopt = _adopter(gw, accounts)
    adopt(SettingsRepo(gw.db).all())
    gw.reload_hooks.append(adopt)
    return accounts.tokens


def _adopter(gw: Gateway, accounts: OAuthAccounts) -> Callable[[Mapping[str, str]], None]:
    """Adopt the logins other replicas stored, from the settings read with each snapshot (no
    read of its own: a reload hook runs on the event loop)."""

    def adopt(settings: Mapping[str, str]) -> None:
        oauth_ids = [c.id for c in gw.registry.connections.values() if c.auth_type == "oauth"]
        if oauth_ids:
            accounts.adopt(settings, oauth_ids)

    return adopt


def _token_persistence(
    gw: Gateway, directory: Path
) -> tuple[FileTokenStore | RedisTokenStore, RefreshLock, AsyncClient | None]:
    """Sealed files and ``flock`` for the replicas of one data dir; with the Redis quota store,
    the tokens and the refresh lease in Redis (replicas on several hosts), the files kept as
    this host's durable copy (fairgate.db.oauth_redis)."""
    files = FileTokenStore(directory, gw.box)
    url = gw.settings.with_db(SettingsRepo(gw.db).all()).store.redis_url
    if gw.store_choice.driver != "redis" or url is None:
        return files, FileRefreshLock(directory), None
    # the one client factory: a redis+cluster:// URL gets a cluster client (the keys carry the
    # connection's hash tag, each script names one key); rare, small commands: a few connections
    client = async_client(
        url, max_connections=8, pool_timeout_s=5.0, connect_timeout_s=2.0, socket_timeout_s=5.0
    )
    prefix = gw.redis_prefix
    store = RedisTokenStore(client, gw.box, files, prefix=prefix)
    return store, RedisRefreshLock(client, prefix=prefix), client


def _seed_tokens(c: ConnectionConfig) -> TokenSet:
    assert c.oauth is not None
    # an access token of unknown age is refreshed before its first use (expiry 0)
    expires = c.oauth.expires_at * 1000 if c.oauth.expires_at is not None else 0
    return TokenSet(c.secret, c.oauth.refresh_token, expires, chatgpt_account_id(c.secret))
