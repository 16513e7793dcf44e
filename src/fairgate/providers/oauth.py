"""OAuth access tokens of subscription connections (Codex, Claude): their lifecycle.

A subscription connection authenticates with a short-lived access token (hours) and a refresh
token that buys the next one at the provider's token endpoint (``grant_type=refresh_token``);
providers rotate the refresh token on every use, so the old one dies the moment the new one is
issued. Getting this wrong loses the account until a human logs in again, hence:

- **Refresh ahead**: a token within ``refresh_ahead_ms`` of its expiry is refreshed before it
  is used, so no client request waits on an expired token and then a 401.
- **One refresh at a time per connection**: concurrent requests share one refresh in this
  process (``SingleFlight``) and hold ``RefreshLock`` across replicas (a Redis lock when Redis
  is configured); inside the lock the stored tokens are read again, so a replica that lost the
  race uses the winner's tokens instead of spending the already-rotated refresh token.
- **Atomic rotation**: the new pair is saved with a compare-and-swap on the refresh token it
  replaces (``TokenStore.save``).
- **No loops**: a refresh the provider rejects (``invalid_grant``: revoked, already used,
  expired) blocks the connection with reason ``auth`` until new tokens are supplied; a 401 on a
  token refreshes at most once per token, and a 401 on the token that refresh produced blocks
  (refreshing cannot help an account the provider refuses). That "already refreshed after a
  401" mark is spent on one token and only until the token is :meth:`OAuthTokens.accepted`: a
  refreshed token the provider has served once is a working token like any other, and a 401
  hours later (revoked server-side, rotated by another client) refreshes again instead of
  blocking the subscription until someone logs in; an endpoint that is down is retried no
  sooner than ``retry_ms`` later while the current token, if still valid, keeps serving.

Secrets: ``TokenSet`` hides its tokens from ``repr``; errors and health entries never carry
them. Pure apart from the injected clock and the three ports (endpoint, store, lock).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Protocol

import orjson

from fairgate.clock import Clock
from fairgate.domain.tokens import TokenSet
from fairgate.quota.signals import SingleFlight
from fairgate.records import camel_json

__all__ = [
    "AuthHealth",
    "LocalRefreshLock",
    "MemoryTokenStore",
    "OAuthBlocked",
    "OAuthTokens",
    "OAuthUnavailable",
    "RefreshLock",
    "RefreshRejected",
    "RefreshUnavailable",
    "TokenEndpoint",
    "TokenSet",
    "TokenStore",
    "chatgpt_account_id",
    "jwt_claims",
]

#: The claim of OpenAI's access and id tokens that names the ChatGPT account (workspace) the
#: Codex backend must be told about in ``chatgpt-account-id``.
OPENAI_AUTH_CLAIM = "https://api.openai.com/auth"


def jwt_claims(token: str) -> dict[str, object]:
    """The payload of a JWT, unverified ({} when it is not one). Only for tokens fairgate holds
    itself (to learn the account they belong to), never to trust a client."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        payload = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        claims = orjson.loads(payload)
    except (binascii.Error, ValueError):
        return {}
    return claims if isinstance(claims, dict) else {}


def chatgpt_account_id(access_token: str) -> str | None:
    """The ChatGPT account id inside an OpenAI access token, as the Codex CLI reads it."""
    auth = jwt_claims(access_token).get(OPENAI_AUTH_CLAIM)
    account = auth.get("chatgpt_account_id") if isinstance(auth, dict) else None
    return account if isinstance(account, str) and account else None


DEFAULT_REFRESH_AHEAD_MS = 5 * 60_000
DEFAULT_RETRY_MS = 30_000
#: How often a blocked connection's stored tokens are read again (a login through another
#: replica lifts the block there): the credential gate skips it meanwhile without any I/O.
RECHECK_BLOCKED_MS = 5_000


class RefreshRejected(Exception):
    """The token endpoint refused the refresh token (``invalid_grant`` and the like)."""


class RefreshUnavailable(Exception):
    """The token endpoint could not be reached or failed (5xx): try again later."""


class OAuthBlocked(Exception):
    """The connection cannot authenticate until someone supplies new tokens."""

    def __init__(self, connection_id: str, reason: str) -> None:
        super().__init__(f"connection '{connection_id}' is auth blocked: {reason}")
        self.connection_id = connection_id
        self.reason = reason


class OAuthUnavailable(Exception):
    """The token expired and the token endpoint is down: no usable token right now."""


class TokenEndpoint(Protocol):
    async def refresh(self, refresh_token: str) -> TokenSet:
        """Trade ``refresh_token`` for a new pair. Raises ``RefreshRejected`` or
        ``RefreshUnavailable``. A response without a refresh token keeps the old one."""
        ...


class TokenStore(Protocol):
    async def load(self, connection_id: str) -> TokenSet | None: ...

    async def save(self, connection_id: str, tokens: TokenSet, *, replaces: str | None) -> bool:
        """Store ``tokens`` if the stored refresh token is still ``replaces`` (None: store
        unconditionally, e.g. tokens supplied by an operator). False when it was not."""
        ...


class RefreshLock(Protocol):
    def hold(self, connection_id: str) -> AbstractAsyncContextManager[None]: ...


class LocalRefreshLock:
    """One process's lock per connection (a single replica, or the tests)."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    @asynccontextmanager
    async def hold(self, connection_id: str) -> AsyncIterator[None]:
        lock = self._locks.setdefault(connection_id, asyncio.Lock())
        async with lock:
            yield


class MemoryTokenStore:
    """Tokens in a dict, with the compare-and-swap the durable stores have."""

    def __init__(self) -> None:
        self._tokens: dict[str, TokenSet] = {}

    async def load(self, connection_id: str) -> TokenSet | None:
        return self._tokens.get(connection_id)

    async def save(self, connection_id: str, tokens: TokenSet, *, replaces: str | None) -> bool:
        current = self._tokens.get(connection_id)
        if replaces is not None and (current is None or current.refresh_token != replaces):
            return False
        self._tokens[connection_id] = tokens
        return True


@dataclass(frozen=True, slots=True)
class AuthHealth:
    """What the health API and the dashboard show for one OAuth connection (no secrets)."""

    connection_id: str
    state: str  # ok | degraded (endpoint down, token still valid) | blocked
    reason: str | None
    expires_at_ms: int | None
    refreshes: int
    since_ms: int

    def as_json(self) -> dict[str, object]:
        return camel_json(self)


@dataclass
class _State:
    tokens: TokenSet | None = None
    blocked: str | None = None  # reason, while the stored refresh token is the rejected one
    rejected_refresh: str | None = field(default=None, repr=False)
    retry_at_ms: int = 0
    # the access token a refresh forced by a 401 produced, until the provider first accepts it:
    # a 401 on it before that means refreshing does not help (the account itself is refused),
    # so it blocks instead of looping; after an accepted use it is an ordinary token again
    fresh_from_401: str | None = field(default=None, repr=False)
    refreshes: int = 0
    degraded: str | None = None
    since_ms: int = 0
    recheck_at_ms: int = 0  # a blocked connection's next read of the store


class OAuthTokens:
    """Valid access tokens for OAuth connections, refreshed as described in the module notes."""

    def __init__(
        self,
        clock: Clock,
        endpoint_for: Callable[[str], TokenEndpoint],
        store: TokenStore,
        lock: RefreshLock | None = None,
        *,
        refresh_ahead_ms: int = DEFAULT_REFRESH_AHEAD_MS,
        retry_ms: int = DEFAULT_RETRY_MS,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._on_close = on_close
        self._clock = clock
        self._endpoint_for = endpoint_for
        self._store = store
        self._lock: RefreshLock = lock or LocalRefreshLock()
        self.refresh_ahead_ms = refresh_ahead_ms
        self.retry_ms = retry_ms
        self._flight = SingleFlight()
        self._states: dict[str, _State] = {}

    def manage(self, connection_id: str) -> None:
        """Take charge of a connection's tokens (its ``auth_type`` is ``oauth``)."""
        self._state(connection_id)

    def manages(self, connection_id: str) -> bool:
        return connection_id in self._states

    def _state(self, connection_id: str) -> _State:
        st = self._states.get(connection_id)
        if st is None:
            st = self._states[connection_id] = _State(since_ms=self._clock.now_ms())
        return st

    def _due(self, tokens: TokenSet, now: int) -> bool:
        """Inside the refresh-ahead margin: ``refresh_ahead_ms``, but at most half the token's
        lifetime (a provider issuing 60-second tokens must not make every request refresh)."""
        exp = tokens.expires_at_ms
        if exp is None:
            return False
        ahead = self.refresh_ahead_ms
        if tokens.issued_at_ms is not None:
            ahead = min(ahead, max(0, exp - tokens.issued_at_ms) // 2)
        return now >= exp - ahead

    def _expired(self, tokens: TokenSet, now: int) -> bool:
        return tokens.expires_at_ms is not None and now >= tokens.expires_at_ms

    async def _current(self, connection_id: str) -> TokenSet:
        """The stored tokens (the store is the truth: another replica may have refreshed, an
        operator may have supplied new ones, which also lifts a block)."""
        st = self._state(connection_id)
        tokens = await self._store.load(connection_id)
        if tokens is None:
            # known unusable until someone logs in: the credential gate skips it, and a later
            # read that finds tokens lifts this (rejected_refresh None ≠ any token)
            st.rejected_refresh = None
            self._set(st, blocked="no OAuth tokens stored for this connection")
            raise OAuthBlocked(connection_id, st.blocked or "")
        if st.blocked is not None and tokens.refresh_token != st.rejected_refresh:
            self._set(st, blocked=None)
        st.tokens = tokens
        if st.blocked is not None:
            raise OAuthBlocked(connection_id, st.blocked)
        return tokens

    def _set(self, st: _State, *, blocked: str | None = None, degraded: str | None = None) -> None:
        if (st.blocked, st.degraded) != (blocked, degraded):
            st.since_ms = self._clock.now_ms()
        st.blocked, st.degraded = blocked, degraded

    async def access(self, connection_id: str) -> TokenSet:
        """A token to send now. Raises ``OAuthBlocked`` or ``OAuthUnavailable``."""
        st = self._state(connection_id)
        now = self._clock.now_ms()
        tokens = st.tokens
        if tokens is not None and st.blocked is None and not self._due(tokens, now):
            return tokens  # the hot path: no store read, no lock
        tokens = await self._current(connection_id)
        if not self._due(tokens, now):
            return tokens
        return await self._refresh_or_keep(connection_id, tokens)

    async def unauthorized(self, connection_id: str, used_access_token: str) -> TokenSet:
        """The provider answered 401 to ``used_access_token``: a token to retry with, refreshed
        at most once per token (a second 401 on a fresh token blocks instead of looping)."""
        st = self._state(connection_id)
        tokens = await self._current(connection_id)
        if tokens.access_token != used_access_token:
            return tokens  # someone already refreshed
        if st.fresh_from_401 == used_access_token:
            reason = "the provider rejects a freshly refreshed access token"
            st.rejected_refresh = tokens.refresh_token
            self._set(st, blocked=reason)
            raise OAuthBlocked(connection_id, reason)
        fresh = await self._refresh_or_keep(connection_id, tokens, force=True)
        st.fresh_from_401 = fresh.access_token
        return fresh

    def accepted(self, connection_id: str, access_token: str) -> None:
        """The provider served a request made with ``access_token``: if a 401 refresh produced
        it, the refresh has done its job and a later 401 on this token may refresh again. Called
        on every accepted OAuth request, so it is a dict lookup and never awaits."""
        st = self._states.get(connection_id)
        if st is not None and st.fresh_from_401 == access_token:
            st.fresh_from_401 = None

    async def _refresh_or_keep(
        self, connection_id: str, seen: TokenSet, *, force: bool = False
    ) -> TokenSet:
        st = self._state(connection_id)
        now = self._clock.now_ms()
        if now < st.retry_at_ms and not force:  # the endpoint failed a moment ago
            if self._expired(seen, now):
                raise OAuthUnavailable(f"connection '{connection_id}': token endpoint down")
            return seen
        try:
            return await self._flight.do(connection_id, lambda: self._refresh(connection_id, seen))
        except RefreshUnavailable:
            st.retry_at_ms = self._clock.now_ms() + self.retry_ms
            self._set(st, degraded="the token endpoint is unreachable")
            if self._expired(seen, self._clock.now_ms()) or force:
                raise OAuthUnavailable(
                    f"connection '{connection_id}': token endpoint down"
                ) from None
            return seen

    async def _refresh(self, connection_id: str, seen: TokenSet) -> TokenSet:
        st = self._state(connection_id)
        async with self._lock.hold(connection_id):
            current = await self._current(connection_id)
            if current.refresh_token != seen.refresh_token or (
                current.access_token != seen.access_token
            ):
                return current  # another replica refreshed while we waited for the lock
            try:
                fresh = await self._endpoint_for(connection_id).refresh(current.refresh_token)
            except RefreshRejected as exc:
                st.rejected_refresh = current.refresh_token
                self._set(st, blocked=f"the token endpoint rejected the refresh token ({exc})")
                raise OAuthBlocked(connection_id, st.blocked or "") from None
            if not fresh.refresh_token:
                fresh = replace(fresh, refresh_token=current.refresh_token)
            if fresh.account_id is None:
                fresh = replace(fresh, account_id=current.account_id)
            if not await self._store.save(connection_id, fresh, replaces=current.refresh_token):
                return await self._current(connection_id)  # lost a race after all: theirs
            st.tokens = fresh
            st.refreshes += 1
            st.retry_at_ms = 0
            self._set(st)
            return fresh

    async def supply(self, connection_id: str, tokens: TokenSet) -> None:
        """New tokens from an operator (config, admin API, ``connections login``): stored
        unconditionally; they lift an ``auth`` block."""
        await self._store.save(connection_id, tokens, replaces=None)
        st = self._state(connection_id)
        st.tokens = tokens
        st.fresh_from_401 = None
        st.retry_at_ms = 0
        self._set(st)

    def health(self) -> list[AuthHealth]:
        return [self._health(cid, st) for cid, st in sorted(self._states.items())]

    @staticmethod
    def _health(cid: str, st: _State) -> AuthHealth:
        state = "blocked" if st.blocked else "degraded" if st.degraded else "ok"
        exp = st.tokens.expires_at_ms if st.tokens is not None else None
        return AuthHealth(cid, state, st.blocked or st.degraded, exp, st.refreshes, st.since_ms)

    def standing(self, connection_id: str) -> AuthHealth | None:
        """One connection's health (None when not managed): a dict lookup, for the credential
        gate of every attempt."""
        st = self._states.get(connection_id)
        return None if st is None else self._health(connection_id, st)

    async def recheck(self, connection_id: str) -> None:
        """A blocked connection reads its stored tokens again, at most every
        :data:`RECHECK_BLOCKED_MS`: new tokens (a login through another replica, a restored
        store) lift the block. Free for a connection that is not blocked."""
        st = self._states.get(connection_id)
        if st is None or st.blocked is None:
            return
        now = self._clock.now_ms()
        if now < st.recheck_at_ms:
            return
        st.recheck_at_ms = now + RECHECK_BLOCKED_MS
        try:
            await self._current(connection_id)
        except Exception:  # still blocked, or the store failed to answer: the block stays
            return

    def forget(self, connection_id: str) -> None:
        self._states.pop(connection_id, None)

    async def close(self) -> None:
        """Release what the store and lock hold (a Redis client); safe to call twice."""
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            await on_close()
