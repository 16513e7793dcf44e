"""OAuth tokens and the refresh lock on a real Redis (fairgate.db.oauth_redis): replicas on
different hosts — own data dirs, own Redis clients — refresh a connection once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio
from test_oauth_files import Endpoint

from fairgate.backends.redis_client import AsyncClient, async_client
from fairgate.clock import ManualClock
from fairgate.config import load_config_text
from fairgate.db.oauth_redis import RedisRefreshLock, RedisTokenStore
from fairgate.db.oauth_tokens import FileTokenStore
from fairgate.domain.tokens import TokenSet
from fairgate.mock.oauth import MockTokenIssuer
from fairgate.process.oauth_setup import start_oauth
from fairgate.process.state import Gateway
from fairgate.providers.oauth import OAuthTokens
from fairgate.providers.upstream import UpstreamClient
from fairgate.secretbox import ENV_VAR, SecretBox

KEY = SecretBox.generate_key()


@pytest_asyncio.fixture(
    params=[pytest.param("redis", id="redis"), pytest.param("redis-cluster", id="redis-cluster")]
)
async def clients(
    request: pytest.FixtureRequest, redis_prefix: str
) -> AsyncIterator[list[AsyncClient]]:
    """One client per "host", from the gateway's client factory: on one Redis, and on a real
    3-master Redis Cluster (each key carries its connection's hash tag)."""
    cluster = request.param == "redis-cluster"
    url: str = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
    made = [
        async_client(
            url, max_connections=8, pool_timeout_s=5.0, connect_timeout_s=2.0, socket_timeout_s=5.0
        )
        for _ in range(2)
    ]
    yield made
    if cluster:  # the redis_prefix fixture cleans the single server only
        async for key in made[0].scan_iter(match=f"{redis_prefix}:*"):
            await made[0].delete(key)
    for c in made:
        await c.aclose()


def _host(
    client: redis.asyncio.Redis, data: Path, prefix: str
) -> tuple[RedisTokenStore, RedisRefreshLock]:
    box = SecretBox([KEY])
    files = FileTokenStore(data / "oauth", box)
    return RedisTokenStore(client, box, files, prefix=prefix), RedisRefreshLock(
        client, prefix=prefix
    )


class GatedEndpoint(Endpoint):
    """The mock authority's token endpoint, held open until the test lets it answer, so the
    other replica is known to be waiting on the lock while the refresh is in flight."""

    def __init__(self, issuer: MockTokenIssuer, clock: ManualClock) -> None:
        super().__init__(issuer, clock)
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def refresh(self, refresh_token: str) -> TokenSet:
        self.entered.set()
        await self.gate.wait()
        return self.exchange(refresh_token)


async def test_two_hosts_refresh_once_and_the_other_rereads(
    clients: list[redis.asyncio.Redis], redis_prefix: str, tmp_path: Path, clock: ManualClock
) -> None:
    issuer = MockTokenIssuer(clock, access_ttl_ms=60_000)
    first = issuer.login("acct")
    now = clock.now_ms()
    seed = TokenSet(first["access_token"], first["refresh_token"], now + 60_000, None, now)
    endpoint = GatedEndpoint(issuer, clock)
    hosts = [_host(c, tmp_path / f"host{i}", redis_prefix) for i, c in enumerate(clients)]
    waiting = asyncio.Event()

    async def noted_sleep(s: float) -> None:  # host B polls the lease: it is waiting
        waiting.set()
        await asyncio.sleep(0.005)

    hosts[1][1]._sleep = noted_sleep
    replicas = [OAuthTokens(clock, lambda _c: endpoint, s, lock) for s, lock in hosts]
    assert await hosts[0][0].seed("c", seed)
    assert not await hosts[1][0].seed("c", seed)  # the same login, seeded once for all hosts
    for r in replicas:
        r.manage("c")
        assert await r.access("c") == seed
    clock.advance(60_000)  # expired everywhere
    a = asyncio.create_task(replicas[0].access("c"))
    await endpoint.entered.wait()  # host A holds the lease and is at the token endpoint
    b = asyncio.create_task(replicas[1].access("c"))
    await waiting.wait()  # host B found the lease taken
    endpoint.gate.set()
    ta, tb = await asyncio.gather(a, b)
    assert issuer.refresh_calls == 1
    assert ta == tb
    assert ta.refresh_token != seed.refresh_token
    assert issuer.check(f"Bearer {tb.access_token}")[0] == "acct"
    # the lease is released, and each host's file holds the new pair (the durable copy)
    assert not await clients[0].exists(hosts[0][1].key("c"))
    assert await FileTokenStore(tmp_path / "host0" / "oauth", SecretBox([KEY])).load("c") == ta


async def test_tokens_are_sealed_in_redis_and_swapped_by_compare(
    clients: list[redis.asyncio.Redis], redis_prefix: str, tmp_path: Path
) -> None:
    store, _ = _host(clients[0], tmp_path, redis_prefix)
    t1 = TokenSet("access-one-SECRET", "refresh-one-SECRET", 1_000, "acct", 5)
    assert await store.save("c", t1, replaces=None)
    raw = await clients[0].hgetall(store.key("c"))
    assert not any(b"SECRET" in v for v in raw.values())
    assert await store.load("c") == t1
    t2 = TokenSet("access-two", "refresh-two", None, None, None)
    assert not await store.save("c", t2, replaces="refresh-stale")
    assert not await store.save("fresh", t2, replaces="refresh-one-SECRET")  # nothing stored
    assert await store.save("c", t2, replaces="refresh-one-SECRET")
    assert await store.load("c") == t2


async def test_tokens_lost_by_redis_come_back_from_the_hosts_copy(
    clients: list[redis.asyncio.Redis], redis_prefix: str, tmp_path: Path
) -> None:
    store, _ = _host(clients[0], tmp_path, redis_prefix)
    t1 = TokenSet("a1", "r1", 9_000, "acct")
    await store.save("c", t1, replaces=None)
    await clients[0].delete(store.key("c"))  # a Redis restart without persistence
    assert await store.load("c") == t1
    assert await clients[0].exists(store.key("c"))  # put back for the other hosts


async def test_a_dead_holders_lease_expires(
    clients: list[redis.asyncio.Redis], redis_prefix: str
) -> None:
    dead = RedisRefreshLock(clients[0], prefix=redis_prefix, lease_ms=50)
    await clients[0].set(dead.key("c"), "someone-who-crashed", px=50)
    live = RedisRefreshLock(clients[1], prefix=redis_prefix, lease_ms=50)
    async with live.hold("c"):  # waits until the crashed holder's lease ends
        assert await clients[1].get(live.key("c")) != b"someone-who-crashed"
    # a holder whose lease ran out and was taken over deletes only its own lease
    async with live.hold("c"):
        await clients[0].set(live.key("c"), "the-next-holder", px=60_000)
    assert await clients[0].get(live.key("c")) == b"the-next-holder"


@pytest.mark.parametrize("cluster", [False, True], ids=["redis", "redis-cluster"])
async def test_a_gateway_on_the_redis_store_keeps_its_tokens_in_redis(
    cluster: bool, request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> None:
    redis_url: str = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
    redis_prefix: str = request.getfixturevalue(
        "redis_cluster_prefix" if cluster else "redis_prefix"
    )
    config = load_config_text(
        """
connections:
  - {id: codex-1, provider: codex, base_url: "http://127.0.0.1:9/backend-api/codex",
     auth_type: oauth, secret: "cfg-access-SECRET", models: ["*"],
     oauth: {refresh_token: "cfg-refresh-SECRET", token_url: "http://127.0.0.1:9/oauth/token"}}
""",
        {},
    )
    env = {
        "QUOTA_STORE_DRIVER": "redis",
        "QUOTA_STORE_REDIS_URL": redis_url,
        "QUOTA_STORE_REDIS_PREFIX": redis_prefix,
        ENV_VAR: KEY.decode(),
    }
    gw = Gateway(data_dir=tmp_path, config=config, env=env, clock=clock)
    await gw.start()
    async with UpstreamClient() as http:
        tokens = await start_oauth(gw, http)
        assert tokens is not None
        try:
            check = async_client(
                redis_url,
                max_connections=1,
                pool_timeout_s=5.0,
                connect_timeout_s=2.0,
                socket_timeout_s=5.0,
            )
            key = f"{redis_prefix}:oauth:{{codex-1}}:tokens"
            raw = await check.hgetall(key)
            await check.aclose()
            assert raw
            assert not any(b"SECRET" in v for v in raw.values())
        finally:
            await tokens.close()
            await gw.stop()
