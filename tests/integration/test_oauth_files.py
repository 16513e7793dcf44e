"""Sealed OAuth token files (fairgate.db.oauth_tokens): real files, real flock, two processes'
worth of stores on one directory."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

from fairgate.clock import ManualClock
from fairgate.db.oauth_tokens import FileRefreshLock, FileTokenStore
from fairgate.domain.tokens import TokenSet
from fairgate.mock.oauth import MockTokenIssuer
from fairgate.providers.oauth import OAuthTokens, RefreshRejected
from fairgate.secretbox import SecretBox

KEY = SecretBox.generate_key()


def box() -> SecretBox:
    return SecretBox([KEY])


async def test_tokens_are_sealed_and_saved_by_compare_and_swap(tmp_path: Path) -> None:
    store = FileTokenStore(tmp_path / "oauth", box())
    t1 = TokenSet("access-one-SECRET", "refresh-one-SECRET", 1_000, "acct")
    assert await store.save("codex-1", t1, replaces=None)
    (path,) = (tmp_path / "oauth").glob("*.json")
    assert b"SECRET" not in path.read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "oauth").stat().st_mode) == 0o700
    assert await FileTokenStore(tmp_path / "oauth", box()).load("codex-1") == t1
    t2 = TokenSet("access-two", "refresh-two", 2_000, "acct")
    assert not await store.save("codex-1", t2, replaces="refresh-stale")  # someone else's turn
    assert await store.save("codex-1", t2, replaces="refresh-one-SECRET")
    assert await store.load("codex-1") == t2


async def test_seed_replaces_only_on_a_new_login(tmp_path: Path) -> None:
    store = FileTokenStore(tmp_path, box())
    config = TokenSet("cfg-access", "cfg-refresh", 0)
    assert await store.seed("c", config)
    rotated = TokenSet("new-access", "new-refresh", 9_000)
    assert await store.save("c", rotated, replaces="cfg-refresh")
    # a restart with the same config: the rotated tokens stay
    assert not await store.seed("c", config)
    assert await store.load("c") == rotated
    # the operator logged in again: the config's new tokens win
    relogin = TokenSet("re-access", "re-refresh", 0)
    assert await store.seed("c", relogin)
    assert await store.load("c") == relogin


class Endpoint:
    """The mock authority's token endpoint, as the token manager calls it."""

    def __init__(self, issuer: MockTokenIssuer, clock: ManualClock) -> None:
        self.issuer, self.clock = issuer, clock

    def exchange(self, refresh_token: str) -> TokenSet:
        """The issuer's answer to ``refresh_token``: a token set good for a minute."""
        status, body = self.issuer.token(
            {"grant_type": "refresh_token", "refresh_token": refresh_token}
        )
        if status != 200:
            raise RefreshRejected(str(body.get("error")))
        now = self.clock.now_ms()
        return TokenSet(body["access_token"], body["refresh_token"], now + 60_000, None, now)

    async def refresh(self, refresh_token: str) -> TokenSet:
        await asyncio.sleep(0.01)  # hold the lock a while: the other replica must wait
        return self.exchange(refresh_token)


async def test_two_replicas_on_one_data_dir_refresh_once(
    tmp_path: Path, clock: ManualClock
) -> None:
    """Two gateways' token managers, each with its own store and lock objects (as two processes
    would have) on one directory: one refresh call, both end with the same fresh token."""
    issuer = MockTokenIssuer(clock, access_ttl_ms=60_000)
    first = issuer.login("acct")
    directory = tmp_path / "oauth"
    now = clock.now_ms()
    seed = TokenSet(first["access_token"], first["refresh_token"], now + 60_000, None, now)
    await FileTokenStore(directory, box()).seed("c", seed)
    endpoint = Endpoint(issuer, clock)
    replicas = [
        OAuthTokens(
            clock,
            lambda _c: endpoint,
            FileTokenStore(directory, box()),
            FileRefreshLock(directory),
        )
        for _ in range(2)
    ]
    for r in replicas:
        r.manage("c")
        await r.access("c")
    clock.advance(60_000)
    a, b = await asyncio.gather(*(r.access("c") for r in replicas))
    assert issuer.refresh_calls == 1
    assert a == b
    assert issuer.check(f"Bearer {a.access_token}")[0] == "acct"
