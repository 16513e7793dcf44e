"""OAuth token lifecycle (fairgate.providers.oauth) against the mock's token authority."""

from __future__ import annotations

import asyncio

import pytest

from fairgate.clock import ManualClock
from fairgate.domain.connections import AuthType, Connection
from fairgate.domain.tokens import TokenSet
from fairgate.mock.oauth import MockTokenIssuer
from fairgate.providers.oauth import (
    LocalRefreshLock,
    MemoryTokenStore,
    OAuthBlocked,
    OAuthTokens,
    OAuthUnavailable,
    RefreshRejected,
    RefreshUnavailable,
)
from fairgate.providers.upstream import UpstreamClient

TTL = 3_600_000
AHEAD = 300_000


class IssuerEndpoint:
    """The token endpoint port, served in-process by the mock's authority (as the HTTP adapter
    would, minus the socket); yields once so concurrent callers really overlap."""

    def __init__(self, issuer: MockTokenIssuer, clock: ManualClock) -> None:
        self.issuer = issuer
        self.clock = clock

    async def refresh(self, refresh_token: str) -> TokenSet:
        await asyncio.sleep(0)
        status, body = self.issuer.token(
            {"grant_type": "refresh_token", "refresh_token": refresh_token}
        )
        if status >= 500:
            raise RefreshUnavailable(f"HTTP {status}")
        if status != 200:
            raise RefreshRejected(str(body.get("error")))
        now = self.clock.now_ms()
        return TokenSet(
            body["access_token"],
            body["refresh_token"],
            now + int(body["expires_in"]) * 1000,
            None,
            now,
        )


async def setup(clock: ManualClock, store: MemoryTokenStore | None = None):  # type: ignore[no-untyped-def]
    issuer = MockTokenIssuer(clock, access_ttl_ms=TTL)
    first = issuer.login("acct-1")
    store = store or MemoryTokenStore()
    tokens = TokenSet(first["access_token"], first["refresh_token"], clock.now_ms() + TTL, "acct-1")
    await store.save("c1", tokens, replaces=None)
    endpoint = IssuerEndpoint(issuer, clock)
    oauth = OAuthTokens(clock, lambda _cid: endpoint, store, refresh_ahead_ms=AHEAD)
    return issuer, store, oauth


async def test_valid_token_is_used_without_refreshing(clock: ManualClock) -> None:
    issuer, _, oauth = await setup(clock)
    t = await oauth.access("c1")
    assert issuer.check(f"Bearer {t.access_token}") == ("acct-1", "")
    clock.advance(TTL - AHEAD - 1)
    assert (await oauth.access("c1")).access_token == t.access_token
    assert issuer.refresh_calls == 0


async def test_refreshed_ahead_of_expiry_once_for_many_concurrent_requests(
    clock: ManualClock,
) -> None:
    issuer, store, oauth = await setup(clock)
    old = await oauth.access("c1")
    clock.advance(TTL - AHEAD)  # inside the refresh-ahead window, not yet expired
    got = await asyncio.gather(*(oauth.access("c1") for _ in range(20)))
    assert issuer.refresh_calls == 1
    assert len({t.access_token for t in got}) == 1
    fresh = got[0]
    assert fresh.access_token != old.access_token
    assert fresh.account_id == "acct-1"  # kept from the stored tokens
    assert await store.load("c1") == fresh  # the rotated pair was saved
    assert issuer.check(f"Bearer {fresh.access_token}")[0] == "acct-1"
    (h,) = oauth.health()
    assert (h.state, h.refreshes) == ("ok", 1)


async def test_two_replicas_racing_refresh_exactly_once(clock: ManualClock) -> None:
    """Two gateways share the store and the lock (as with Redis): one refresh call, and the
    loser uses the winner's tokens instead of spending the rotated refresh token."""
    issuer, store, a = await setup(clock)
    endpoint = IssuerEndpoint(issuer, clock)
    lock = LocalRefreshLock()
    a = OAuthTokens(clock, lambda _c: endpoint, store, lock, refresh_ahead_ms=AHEAD)
    b = OAuthTokens(clock, lambda _c: endpoint, store, lock, refresh_ahead_ms=AHEAD)
    await a.access("c1")
    await b.access("c1")
    clock.advance(TTL)  # expired for both
    ta, tb = await asyncio.gather(a.access("c1"), b.access("c1"))
    assert issuer.refresh_calls == 1
    assert ta == tb
    assert issuer.check(f"Bearer {ta.access_token}")[0] == "acct-1"


async def test_revoked_refresh_token_blocks_without_a_loop(clock: ManualClock) -> None:
    issuer, store, oauth = await setup(clock)
    issuer.revoke_all("acct-1")
    clock.advance(TTL)
    for _ in range(5):
        with pytest.raises(OAuthBlocked) as exc:
            await oauth.access("c1")
        assert "invalid_grant" in exc.value.reason
    assert issuer.refresh_calls == 1  # blocked: never asked again
    (h,) = oauth.health()
    assert h.state == "blocked"
    stored = await store.load("c1")
    assert stored is not None
    assert stored.refresh_token not in (h.reason or "")
    # an operator logs in again: the block lifts
    again = issuer.login("acct-1")
    await oauth.supply(
        "c1", TokenSet(again["access_token"], again["refresh_token"], clock.now_ms() + TTL)
    )
    assert (await oauth.access("c1")).access_token == again["access_token"]
    assert oauth.health()[0].state == "ok"


async def test_new_tokens_written_by_another_replica_lift_the_block(clock: ManualClock) -> None:
    issuer, store, oauth = await setup(clock)
    issuer.revoke_all("acct-1")
    clock.advance(TTL)
    with pytest.raises(OAuthBlocked):
        await oauth.access("c1")
    again = issuer.login("acct-1")
    await store.save(
        "c1",
        TokenSet(again["access_token"], again["refresh_token"], clock.now_ms() + TTL),
        replaces=None,
    )
    assert (await oauth.access("c1")).access_token == again["access_token"]


async def test_401_refreshes_once_per_token_then_blocks(clock: ManualClock) -> None:
    issuer, _, oauth = await setup(clock)
    t = await oauth.access("c1")
    fresh = await oauth.unauthorized("c1", t.access_token)
    assert fresh.access_token != t.access_token
    assert issuer.refresh_calls == 1
    # a late 401 for the old token from a concurrent request: no second refresh
    assert (await oauth.unauthorized("c1", t.access_token)) == fresh
    assert issuer.refresh_calls == 1
    # the fresh token is refused too: refreshing cannot help, block instead of looping
    with pytest.raises(OAuthBlocked):
        await oauth.unauthorized("c1", fresh.access_token)
    assert issuer.refresh_calls == 1


async def test_401_after_the_refreshed_token_served_refreshes_again(clock: ManualClock) -> None:
    """Issue 43, N10: once the provider accepted the token a 401 refresh produced, a 401 on it
    hours later (revoked upstream) is a new event: one more refresh, not a block until login."""
    issuer, _, oauth = await setup(clock)
    t = await oauth.access("c1")
    fresh = await oauth.unauthorized("c1", t.access_token)
    oauth.accepted("c1", fresh.access_token)  # hours of successful use
    clock.advance(2 * 3_600_000 // 3)
    again = await oauth.unauthorized("c1", fresh.access_token)
    assert again.access_token != fresh.access_token
    assert issuer.refresh_calls == 2
    assert (await oauth.access("c1")) == again
    assert all(h.state == "ok" for h in oauth.health())
    # the new token is spent in its turn: refused before any accepted use, it blocks
    with pytest.raises(OAuthBlocked):
        await oauth.unauthorized("c1", again.access_token)
    assert issuer.refresh_calls == 2


async def test_accepting_another_token_keeps_the_mark(clock: ManualClock) -> None:
    """Only the refreshed token's own accepted use clears its mark: a late success of the old
    token (a request sent before the refresh) proves nothing about the new one."""
    _, _, oauth = await setup(clock)
    t = await oauth.access("c1")
    fresh = await oauth.unauthorized("c1", t.access_token)
    oauth.accepted("c1", t.access_token)
    oauth.accepted("unknown", fresh.access_token)
    with pytest.raises(OAuthBlocked):
        await oauth.unauthorized("c1", fresh.access_token)


async def test_endpoint_down_keeps_a_valid_token_and_retries_later(clock: ManualClock) -> None:
    issuer, _, oauth = await setup(clock)
    t = await oauth.access("c1")
    issuer.failing = True
    clock.advance(TTL - AHEAD)
    assert (await oauth.access("c1")) == t  # still valid: keep serving
    assert oauth.health()[0].state == "degraded"
    assert (await oauth.access("c1")) == t
    assert issuer.refresh_calls == 1  # not retried before retry_ms
    clock.advance(oauth.retry_ms)
    issuer.failing = False
    assert (await oauth.access("c1")).access_token != t.access_token
    assert oauth.health()[0].state == "ok"


async def test_expired_and_endpoint_down_is_unavailable_not_blocked(clock: ManualClock) -> None:
    issuer, _, oauth = await setup(clock)
    issuer.failing = True
    clock.advance(TTL)
    with pytest.raises(OAuthUnavailable):
        await oauth.access("c1")
    issuer.failing = False
    clock.advance(oauth.retry_ms)
    assert (await oauth.access("c1")).access_token


async def test_no_tokens_is_a_clear_block(clock: ManualClock) -> None:
    _, _, oauth = await setup(clock)
    with pytest.raises(OAuthBlocked, match="no OAuth tokens"):
        await oauth.access("other")


def test_tokens_never_in_repr() -> None:
    t = TokenSet("at-secret", "rt-secret", 1, "acct")
    assert "secret" not in repr(t)


async def test_short_lived_tokens_do_not_refresh_on_every_request(clock: ManualClock) -> None:
    """Tokens living less than the refresh-ahead margin are refreshed at half their life."""
    issuer = MockTokenIssuer(clock, access_ttl_ms=60_000)
    first = issuer.login("acct")
    store = MemoryTokenStore()
    now = clock.now_ms()
    await store.save(
        "c",
        TokenSet(first["access_token"], first["refresh_token"], now + 60_000, None, now),
        replaces=None,
    )
    oauth = OAuthTokens(clock, lambda _c: IssuerEndpoint(issuer, clock), store)
    for _ in range(5):
        await oauth.access("c")
    assert issuer.refresh_calls == 0
    clock.advance(30_000)
    await oauth.access("c")
    await oauth.access("c")
    assert issuer.refresh_calls == 1


class _Answer:
    """An upstream answer as far as the OAuth retry looks at it."""

    def __init__(self, status: int) -> None:
        self.status = status

    def release(self) -> None:
        return None


async def test_transport_401_served_then_401_again_refreshes_instead_of_blocking(
    clock: ManualClock,
) -> None:
    """Issue 43, N10 end to end in the transport: a 401, the refresh, the retry served; hours
    of answers; then a 401 on that token refreshes once more and the request is served."""
    issuer, _, oauth = await setup(clock)
    oauth.manage("c1")
    client = UpstreamClient()
    client.oauth = oauth
    refused: set[str] = set()  # access tokens the provider refuses from now on

    async def send(conn: Connection, path: str, body: bytes, headers: object) -> _Answer:
        return _Answer(401 if conn.secret in refused else 200)

    client._send = send  # type: ignore[method-assign,assignment]
    conn = Connection("c1", "codex", "http://x/v1", "", auth_type=AuthType.OAUTH)
    first = await oauth.access("c1")
    refused.add(first.access_token)
    assert (await client.post(conn, "/chat/completions", b"{}", {})).status == 200
    fresh = await oauth.access("c1")
    for _ in range(3):  # the refreshed token serves for a while
        clock.advance(600_000)
        assert (await client.post(conn, "/chat/completions", b"{}", {})).status == 200
    refused.add(fresh.access_token)  # revoked upstream
    assert (await client.post(conn, "/chat/completions", b"{}", {})).status == 200
    assert issuer.refresh_calls == 2
    assert all(h.state == "ok" for h in oauth.health())
