"""Choosing and preparing a Redis Cluster client (``fairgate.backends.redis_client``) on a real
3-master cluster started by the ``redis_cluster_url`` fixture."""

from __future__ import annotations

import asyncio
import importlib.resources
import re

import pytest
import redis.asyncio
import redis.asyncio.cluster
import redis.exceptions
from redis.crc import key_slot

from fairgate.backends.redis_client import (
    BoundedCluster,
    async_client,
    is_cluster_url,
    prepare,
    probe_client,
)


def _client(url: str, max_connections: int = 4) -> redis.asyncio.Redis | BoundedCluster:
    client = async_client(
        url,
        max_connections=max_connections,
        pool_timeout_s=5.0,
        connect_timeout_s=5.0,
        socket_timeout_s=5.0,
    )
    assert isinstance(client, redis.asyncio.Redis | BoundedCluster)
    return client


def test_the_url_scheme_chooses_the_client() -> None:
    assert is_cluster_url("redis+cluster://h1:7000,h2:7001")
    assert is_cluster_url("REDISS+CLUSTER://user:pw@h1:7000")
    assert not is_cluster_url("redis://127.0.0.1:6379/0")
    assert not is_cluster_url("unix:///run/redis.sock")
    plain = _client("redis://127.0.0.1:6379/0")
    assert type(plain) is redis.asyncio.Redis
    cluster = _client("redis+cluster://user:secret@10.0.0.1:7000,10.0.0.2:7001")
    assert isinstance(cluster, BoundedCluster)
    nodes = {(n.host, n.port) for n in cluster.nodes_manager.startup_nodes.values()}
    assert nodes == {("10.0.0.1", 7000), ("10.0.0.2", 7001)}
    kwargs = cluster.get_connection_kwargs()
    assert (kwargs["username"], kwargs["password"]) == ("user", "secret")
    probe = probe_client("redis+cluster://10.0.0.1:7000,10.0.0.2:7001", **_timeouts())
    assert probe.connection_pool.connection_kwargs["port"] == 7000  # PING needs no slot
    probe.close()


def _timeouts() -> dict[str, float]:
    return {"connect_timeout_s": 1.0, "socket_timeout_s": 1.0}


def test_a_cluster_url_without_a_host_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one host"):
        _client("redis+cluster://")


@pytest.mark.redis
async def test_callers_beyond_the_connection_limit_wait_instead_of_failing(
    redis_cluster_url: str, redis_cluster_prefix: str
) -> None:
    """redis-py's cluster client raises MaxConnectionsError when a node's connections are all
    busy; the bounded client makes the 200th caller wait for a turn, as a blocking pool does."""
    client = _client(redis_cluster_url, max_connections=2)
    try:
        assert await prepare(client, 2) >= 2
        key = f"{redis_cluster_prefix}:{{p}}:n"
        results = await asyncio.gather(*(client.incr(key) for _ in range(200)))
        assert sorted(results) == list(range(1, 201))
        pipe = client.pipeline(transaction=False)
        for i in range(9):  # keys on every master: one pipeline, several nodes
            pipe.set(f"{redis_cluster_prefix}:{{t{i}}}:x", i)
        assert await pipe.execute() == [True] * 9
    finally:
        await client.aclose()


@pytest.mark.redis
@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "fresh"])
async def test_a_burst_of_first_commands_never_breaks_a_connection(
    redis_cluster_url: str, redis_cluster_prefix: str, prepared: bool
) -> None:
    """The redis-py 8.1 race (``redis_client`` module docstring): 100 concurrent first scripts
    on a fresh client were misrouted (``MOVED``), and every fifth ``MOVED`` closed all the
    client's connections under the others: 6 to 25 of 100 failed. Prepared before traffic, or
    merely built by the factory (``reinitialize_steps=0``), every one succeeds, on each of
    several fresh clients."""
    for _ in range(3):
        client = _client(redis_cluster_url, max_connections=32)
        try:
            if prepared:
                await prepare(client, 32)
            script = client.register_script("return redis.call('INCR', KEYS[1])")
            keys = [f"{redis_cluster_prefix}:{{p{i % 7}}}:n" for i in range(100)]
            results = await asyncio.gather(*(script(keys=[k]) for k in keys))
            assert len(results) == 100
        finally:
            await client.aclose()


def _lua_sources() -> dict[str, str]:
    out = {}
    for package in ("fairgate.store", "fairgate.resilience"):
        for entry in (importlib.resources.files(package) / "lua").iterdir():
            if entry.name.endswith(".lua"):
                out[f"{package}/{entry.name}"] = entry.read_text(encoding="utf-8")
    return out


def test_every_key_a_script_touches_is_declared_or_built_from_a_declared_one() -> None:
    """A cluster runs a script on the node of its KEYS' slot, so a key a script builds must sit
    in the same slot. The only key built inside the scripts is a reservation's (``KEYS[1]``,
    the pool base, ``.. ':r:' .. id``: the pool's hash tag); the bucket keys stored in a
    reservation were written by admit.lua from its own KEYS (same tag). Any other key expression
    given to ``redis.call`` or to lib.lua's key helpers fails this test."""
    allowed = {
        "KEYS[1] .. ':r:' .. id",  # admit.lua: reclaim an expired reservation of the pool
        "p[1]",  # lib.lua drop_reservation: a reservation part's bucket key
        "rkey",  # lib.lua drop_reservation's parameter (the calls below are checked)
        "key",  # lib.lua add_to / set_sum / keep_for parameter (the calls below are checked)
        "unpack(KEYS",  # admit.lua: MGET of a range of its declared keys
        "c.kkey",  # admit.lua: KEYS[k + 3] (checked below)
        "c.tkey",  # admit.lua: KEYS[k + 1]
        "wkey",  # admit.lua: the pool's hold queue, KEYS[1] .. ':w' (checked below)
    }
    # PUBLISH's first argument is a channel, not a key (the resilience scripts announce their
    # version there): channels are not hashed to slots
    uses = re.compile(
        r"(?:redis\.call\(\s*'(?!PUBLISH')\w+'"
        r"|(?<!function )(?:add_to|set_sum|keep_for|drop_reservation)\()"
        r"\s*,?\s*([^,)]+)"
    )
    sources = _lua_sources()
    seen = set()
    for name, text in sources.items():
        for raw in uses.findall(text):
            first = raw.strip()
            seen.add(first)
            assert first.startswith("KEYS[") or first in allowed, (name, first)
    assert "KEYS[1] .. ':r:' .. id" in seen  # the pattern does see the built key
    admit = sources["fairgate.store/admit.lua"]
    assert "tkey = KEYS[k + 1]," in admit
    assert "kkey = KEYS[k + 3]," in admit
    assert "local wkey = KEYS[1] .. ':w'" in admit


def test_one_pool_one_slot() -> None:
    """The keys of one pool hash to one slot whatever their suffix; two pools may differ."""
    base = "fairgate:{pool-1}"
    slots = {key_slot(f"{base}{s}".encode()) for s in (":rz", ":act", ":cum", ":r:x", ":log")}
    slots.add(key_slot(f"{base}:c:k1:requests/hourly:472223".encode()))
    assert len(slots) == 1


@pytest.mark.redis
async def test_shared_slot_leases_on_the_cluster(
    redis_cluster_url: str, redis_cluster_prefix: str
) -> None:
    """The slot scripts (acquire, renew, release) each name one key, ``{slot:<connection>}``:
    connections whose leases sit on different masters keep their own caps."""
    from fairgate.store.redis.store import RedisQuotaStore

    store = RedisQuotaStore(redis_cluster_url, prefix=redis_cluster_prefix)
    try:
        await store.warm()
        leases = store.slot_leases()
        conns = ["c1", "c2", "c3", "c4", "c5", "c6"]
        client = store._client
        assert isinstance(client, BoundedCluster)
        masters = {
            client.nodes_manager.get_node_from_slot(key_slot(leases.key(c).encode())).name
            for c in conns
        }
        assert len(masters) == 3  # the six connections' leases sit on all three masters
        now, ttl = 1_000_000, 60_000
        for conn in conns:
            got = [await leases.acquire(conn, 2, f"{conn}-{i}", now, ttl) for i in range(3)]
            assert got == [True, True, False]
            assert await leases.renew(conn, [f"{conn}-0", f"{conn}-1"], now + 1, ttl) == 2
            assert await leases.release(conn, f"{conn}-0")
            assert await leases.acquire(conn, 2, f"{conn}-3", now + 2, ttl)
    finally:
        await store.close()


async def test_a_caller_that_waits_too_long_for_a_connection_gets_a_timeout() -> None:
    """Load, not an outage: a timeout (which the quota store confirms with a probe before it
    counts as an outage), as the single-server pool reports it. Re-entrant within a task: a
    pipeline that re-sends a redirected command through the client does not wait on itself."""
    client = async_client(
        "redis+cluster://127.0.0.1:1",  # never reached: the wait ends first
        max_connections=1,
        pool_timeout_s=0.05,
        connect_timeout_s=1.0,
        socket_timeout_s=1.0,
    )
    assert isinstance(client, BoundedCluster)
    held, done = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        # the same task twice: the second needs no permit of its own
        async with client.permit(), client.permit():
            held.set()
            await done.wait()

    task = asyncio.create_task(holder())
    await asyncio.wait_for(held.wait(), 30)  # a permit that is not re-entrant never gets here
    try:
        with pytest.raises(redis.exceptions.TimeoutError, match="no Redis Cluster connection"):
            await client.ping()
    finally:
        done.set()
        await task
        await client.aclose()
