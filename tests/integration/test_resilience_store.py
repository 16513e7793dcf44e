"""The ResilienceStore contract on memory and a real Redis, replicas sharing Redis, and the
SQLite persistence that keeps active entries across a restart.

Time is a ManualClock; Redis TTLs are computed from it (remaining time + level memory), so
nothing sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio

from fairgate.clock import ManualClock
from fairgate.db.base import Database
from fairgate.db.engine import open_database
from fairgate.resilience.backoff import Cooldown
from fairgate.resilience.breaker import BreakerRecord
from fairgate.resilience.classify import classify
from fairgate.resilience.manager import RateLimitManager
from fairgate.resilience.persistence import SqlitePersistence
from fairgate.resilience.state import (
    LockoutKey,
    MemoryResilienceStore,
    PermanentBlock,
    ResilienceStore,
    connection_scope,
    model_scope,
)
from fairgate.resilience.state_redis import RedisResilienceStore
from fairgate.resilience.writer import PersistenceWriter

S = 1_000
#: The Redis stores' reply timeout here: these tests check the state's rules, not how a store
#: copes with a slow Redis (that is the outage tests'), and on a loaded host a burst's
#: connections took longer than the 0.5 s default connect timeout ("Timeout connecting").
TEST_TIMEOUT_S = 30.0
MEMORY = 600_000  # the default level memory


@pytest_asyncio.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("redis", id="redis", marks=pytest.mark.redis),
        pytest.param("redis-cluster", id="redis-cluster", marks=pytest.mark.redis),
        # the same contract with reads answered from memory (the watcher on, as a gateway runs)
        pytest.param("redis-watched", id="redis-watched", marks=pytest.mark.redis),
        pytest.param("redis-cluster-watched", id="redis-cluster-watched", marks=pytest.mark.redis),
    ]
)
async def rstore(
    request: pytest.FixtureRequest, clock: ManualClock
) -> AsyncIterator[ResilienceStore]:
    s: ResilienceStore
    if request.param == "memory":
        s = MemoryResilienceStore(clock=clock)
    else:
        cluster = request.param.startswith("redis-cluster")
        url: str = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
        prefix: str = request.getfixturevalue("redis_cluster_prefix" if cluster else "redis_prefix")
        s = RedisResilienceStore(url, prefix=prefix, clock=clock, socket_timeout_s=TEST_TIMEOUT_S)
        assert await s.ping()  # as the factory does: the cluster is discovered before traffic
        if request.param.endswith("-watched"):
            await s.start_watch()
            await s.wait_version(0)
    try:
        yield s
    finally:
        await s.close()


# -- the contract -----------------------------------------------------------------------------


async def test_cooldown_roundtrip_with_absolute_deadline(
    rstore: ResilienceStore, clock: ManualClock
) -> None:
    now = clock.now_ms()
    assert await rstore.get_cooldown("c1") is None
    stored = await rstore.set_cooldown("c1", now + 20 * S, 2, "rate_limit")
    assert stored == Cooldown(now + 20 * S, 2, "rate_limit")
    assert await rstore.get_cooldown("c1") == stored
    assert await rstore.get_cooldown("c2") is None


async def test_cooldown_is_never_shortened(rstore: ResilienceStore, clock: ManualClock) -> None:
    now = clock.now_ms()
    await rstore.set_cooldown("c1", now + 60 * S, 1, "rate_limit")
    stored = await rstore.set_cooldown("c1", now + 5 * S, 3, "server_error")
    assert stored == Cooldown(now + 60 * S, 3, "rate_limit")
    stored = await rstore.set_cooldown("c1", now + 90 * S, 0, "auth")
    assert stored == Cooldown(now + 90 * S, 3, "auth")
    assert await rstore.get_cooldown("c1") == stored


async def test_expiry_is_lazy_and_the_level_is_remembered(
    rstore: ResilienceStore, clock: ManualClock
) -> None:
    now = clock.now_ms()
    await rstore.set_cooldown("c1", now + 3 * S, 4, "rate_limit")
    clock.advance(3 * S)
    cd = await rstore.get_cooldown("c1")
    assert cd is not None
    assert not cd.active(clock.now_ms())
    assert cd.level == 4
    clock.advance(MEMORY)
    assert await rstore.get_cooldown("c1") is None
    # a forgotten record does not lift the level of a new one
    fresh = await rstore.set_cooldown("c1", clock.now_ms() + S, 0, "rate_limit")
    assert fresh.level == 0


async def test_clear_cooldown(rstore: ResilienceStore, clock: ManualClock) -> None:
    now = clock.now_ms()
    await rstore.set_cooldown("c1", now + 10 * S, 1, "rate_limit")
    assert not await rstore.clear_cooldown("c1", unless_active_at=now)
    assert await rstore.get_cooldown("c1") is not None
    assert await rstore.clear_cooldown("c1", unless_active_at=now + 10 * S)
    assert await rstore.get_cooldown("c1") is None
    assert not await rstore.clear_cooldown("c1")
    await rstore.set_cooldown("c1", now + 10 * S, 1, "rate_limit")
    assert await rstore.clear_cooldown("c1")


async def test_lockouts_are_per_model(rstore: ResilienceStore, clock: ManualClock) -> None:
    now = clock.now_ms()
    stored = await rstore.set_lockout("openai", "c1", "gpt-4o", now + 30 * S, 0, "rate_limited")
    assert stored == Cooldown(now + 30 * S, 0, "rate_limited")
    assert await rstore.get_lockout("openai", "c1", "gpt-4o") == stored
    assert await rstore.get_lockout("openai", "c1", "gpt-4o-mini") is None
    assert await rstore.get_lockout("openai", "c2", "gpt-4o") is None
    assert await rstore.get_cooldown("c1") is None
    shorter = await rstore.set_lockout("openai", "c1", "gpt-4o", now + S, 2, "rate_limit")
    assert shorter == Cooldown(now + 30 * S, 2, "rate_limited")
    assert await rstore.clear_lockout("openai", "c1", "gpt-4o")
    assert await rstore.get_lockout("openai", "c1", "gpt-4o") is None


async def test_model_ids_with_colons_and_slashes(
    rstore: ResilienceStore, clock: ManualClock
) -> None:
    model = "meta-llama/llama-3:70b:free"
    await rstore.set_lockout("openrouter", "c1", model, clock.now_ms() + S, 0, "x")
    assert await rstore.get_lockout("openrouter", "c1", model) is not None
    snap = await rstore.snapshot()
    assert LockoutKey("openrouter", "c1", model) in snap.lockouts


async def test_permanent_blocks_keep_the_key_and_request_that_caused_them(
    rstore: ResilienceStore, clock: ManualClock
) -> None:
    t0 = clock.now_ms()
    first = await rstore.set_permanent("conn:c1", "billing", key_id="k-1", request_id="r-1")
    assert first == PermanentBlock("conn:c1", "billing", t0, "k-1", "r-1")
    again = await rstore.set_permanent("conn:c1", "billing", key_id="k-2", request_id="r-2")
    assert again == first  # the first cause stays
    [listed] = await rstore.list_permanent()
    assert (listed.key_id, listed.request_id) == ("k-1", "r-1")


async def test_permanent_blocks(rstore: ResilienceStore, clock: ManualClock) -> None:
    t0 = clock.now_ms()
    first = await rstore.set_permanent("conn:c1", "quota_permanent: billing")
    assert first == PermanentBlock("conn:c1", "quota_permanent: billing", t0)
    clock.advance(S)
    again = await rstore.set_permanent("conn:c1", "something else")
    assert again == first  # kept as is
    await rstore.set_permanent("model:openai:c2:gpt-4o", "monthly quota", since_ms=t0 + 5)
    assert [b.scope for b in await rstore.list_permanent()] == [
        "conn:c1",
        "model:openai:c2:gpt-4o",
    ]
    clock.advance(365 * 86_400_000)
    assert len(await rstore.list_permanent()) == 2  # never expires
    assert await rstore.clear_permanent("conn:c1")
    assert not await rstore.clear_permanent("conn:c1")
    assert [b.scope for b in await rstore.list_permanent()] == ["model:openai:c2:gpt-4o"]


async def test_breaker_records_newest_wins(rstore: ResilienceStore, clock: ManualClock) -> None:
    now = clock.now_ms()
    opened = BreakerRecord("open", now + 30 * S, 30 * S, now)
    assert await rstore.put_breaker("openai", opened)
    assert await rstore.get_breaker("openai") == opened
    assert not await rstore.put_breaker("openai", BreakerRecord("closed", 0, 30 * S, now - 1))
    closed = BreakerRecord("closed", 0, 30 * S, now + 1)
    assert await rstore.put_breaker("openai", closed)
    assert await rstore.get_breaker("openai") == closed
    assert await rstore.get_breaker("anthropic") is None


async def test_single_probe_token(rstore: ResilienceStore) -> None:
    results = await asyncio.gather(*(rstore.try_probe("openai", 60_000) for _ in range(50)))
    assert results.count(True) == 1
    assert await rstore.try_probe("anthropic", 60_000)
    await rstore.release_probe("openai")
    assert await rstore.try_probe("openai", 60_000)


async def test_read_target_in_one_go(rstore: ResilienceStore, clock: ManualClock) -> None:
    now = clock.now_ms()
    empty = await rstore.read_target("openai", "c1", "gpt-4o")
    assert (empty.cooldown, empty.lockout, empty.permanent, empty.breaker) == (None,) * 4
    await rstore.set_cooldown("c1", now + S, 0, "rate_limit")
    await rstore.set_lockout("openai", "c1", "gpt-4o", now + 2 * S, 0, "rate_limited")
    await rstore.set_permanent(model_scope("openai", "c1", "gpt-4o"), "monthly quota")
    await rstore.put_breaker("openai", BreakerRecord("open", now + 3 * S, 3 * S, now))
    ts = await rstore.read_target("openai", "c1", "gpt-4o")
    assert ts.cooldown == Cooldown(now + S, 0, "rate_limit")
    assert ts.lockout == Cooldown(now + 2 * S, 0, "rate_limited")
    assert ts.permanent is not None
    assert ts.permanent.scope == model_scope("openai", "c1", "gpt-4o")
    assert ts.breaker == BreakerRecord("open", now + 3 * S, 3 * S, now)
    other = await rstore.read_target("openai", "c1", "gpt-4o-mini")
    assert other.permanent is None
    await rstore.set_permanent(connection_scope("c1"), "billing")
    other = await rstore.read_target("openai", "c1", "gpt-4o-mini")
    assert other.permanent is not None
    assert other.permanent.scope == "conn:c1"


async def test_snapshot_lists_what_is_remembered(
    rstore: ResilienceStore, clock: ManualClock
) -> None:
    now = clock.now_ms()
    await rstore.set_cooldown("c1", now + S, 0, "rate_limit")
    await rstore.set_cooldown("c2", now + 10 * S, 1, "server_error")
    await rstore.set_lockout("openai", "c1", "gpt-4o", now + 5 * S, 0, "rate_limited")
    await rstore.set_permanent("conn:c3", "billing")
    await rstore.put_breaker("openai", BreakerRecord("open", now + 30 * S, 30 * S, now))
    snap = await rstore.snapshot()
    assert set(snap.cooldowns) == {"c1", "c2"}
    assert snap.lockouts == {
        LockoutKey("openai", "c1", "gpt-4o"): Cooldown(now + 5 * S, 0, "rate_limited")
    }
    assert [b.scope for b in snap.permanent] == ["conn:c3"]
    assert set(snap.breakers) == {"openai"}
    clock.advance(S + MEMORY)  # c1 forgotten, c2 not yet (its deadline is later)
    snap = await rstore.snapshot()
    assert set(snap.cooldowns) == {"c2"}


async def test_concurrent_writers_keep_the_latest_deadline(
    rstore: ResilienceStore, clock: ManualClock
) -> None:
    now = clock.now_ms()
    rng = random.Random(7)
    untils = [now + rng.randrange(1, 300_000) for _ in range(200)]
    levels = [rng.randrange(0, 9) for _ in untils]
    await asyncio.gather(
        *(
            rstore.set_cooldown("c1", u, lvl, f"r{i}")
            for i, (u, lvl) in enumerate(zip(untils, levels, strict=True))
        )
    )
    cd = await rstore.get_cooldown("c1")
    assert cd is not None
    assert cd.until_ms == max(untils)
    assert cd.level == max(levels)
    assert cd.reason == f"r{untils.index(max(untils))}"


async def test_ping(rstore: ResilienceStore) -> None:
    assert await rstore.ping()


# -- Redis only: replicas, scripts, TTLs ------------------------------------------------------


@contextlib.asynccontextmanager
async def _closing_stores(
    url: str, prefix: str, clock: ManualClock
) -> AsyncIterator[Callable[[], RedisResilienceStore]]:
    """A maker of stores on one server and prefix (replicas sharing Redis), each closed on the
    way out: a test closes one itself only where closing is part of what it checks."""
    made: list[RedisResilienceStore] = []

    def make() -> RedisResilienceStore:
        store = RedisResilienceStore(
            url, prefix=prefix, clock=clock, socket_timeout_s=TEST_TIMEOUT_S
        )
        made.append(store)
        return store

    try:
        yield make
    finally:
        for store in made:
            await store.close()


@pytest_asyncio.fixture
async def redis_pair(
    redis_url: str, redis_prefix: str, clock: ManualClock
) -> AsyncIterator[Callable[[], ResilienceStore]]:
    async with _closing_stores(redis_url, redis_prefix, clock) as make:
        yield make


@pytest.fixture
def replica_managers(
    redis_pair: Callable[[], ResilienceStore], clock: ManualClock
) -> tuple[RateLimitManager, RateLimitManager]:
    """Two replicas' managers, each on a store of its own over the one Redis."""
    return RateLimitManager(redis_pair(), clock=clock), RateLimitManager(redis_pair(), clock=clock)


@pytest.mark.redis
async def test_two_replicas_see_each_others_cooldown_at_once(
    replica_managers: tuple[RateLimitManager, RateLimitManager], clock: ManualClock
) -> None:
    ma, mb = replica_managers
    c = classify(429, None, {"retry-after": "20"}, now_ms=clock.now_ms())
    await ma.on_failure("openai", "c1", "gpt-4o", "apikey", c)
    excl = await mb.check("openai", "c1", "gpt-4o")
    assert excl is not None
    assert excl.until_ms == clock.now_ms() + 20 * S
    await mb.on_success(
        "openai",
        "c2",
        "gpt-4o",
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "30s"},
    )
    excl = await ma.check("openai", "c2", "gpt-4o")
    assert excl is not None
    assert excl.reason == "rate_limited"


@pytest.mark.redis
async def test_replicas_share_the_breaker_and_one_probe(
    replica_managers: tuple[RateLimitManager, RateLimitManager], clock: ManualClock
) -> None:
    ma, mb = replica_managers
    for i in range(5):
        c = classify(500, None, None, now_ms=clock.now_ms())
        await ma.on_failure("openai", f"c{i}", "gpt-4o", "apikey", c)
    clock.advance(1)
    excl = await mb.check("openai", "fresh", "gpt-4o")
    assert excl is not None
    assert excl.reason == "breaker_open"
    clock.advance(30 * S)
    results = await asyncio.gather(
        *(m.check("openai", f"n{i}", "gpt-4o") for i in range(25) for m in (ma, mb))
    )
    assert sum(r is None for r in results) == 1


# -- Redis: reads from memory, kept current by the watcher -------------------------------------


@pytest_asyncio.fixture(params=["redis", "redis-cluster"])
async def watched(
    request: pytest.FixtureRequest, clock: ManualClock
) -> AsyncIterator[Callable[..., Any]]:
    """Started stores on one prefix, of one server or of the test cluster (the watcher then
    subscribes on a client of its own); ``poll_s`` large means only pub/sub can deliver a
    change."""
    cluster = request.param == "redis-cluster"
    url: str = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
    prefix: str = request.getfixturevalue("redis_cluster_prefix" if cluster else "redis_prefix")
    async with _closing_stores(url, prefix, clock) as new_store:

        async def make(poll_s: float = 3600.0) -> RedisResilienceStore:
            store = new_store()
            await store.start_watch(poll_s=poll_s)
            await store.wait_version(0)  # the watcher is subscribed and has read the counter
            return store

        yield make


async def _until(store: Any, version: int) -> None:
    """Wait for the watcher to deliver ``version`` (a message, not elapsed time; the timeout
    only turns a lost message into a failure instead of a hang)."""
    async with asyncio.timeout(30):
        await store.wait_version(version)


@pytest.mark.redis
async def test_watched_replica_reads_from_memory_and_sees_another_replicas_cooldown(
    watched: Callable[..., Any], clock: ManualClock
) -> None:
    a, b = await watched(), await watched()
    assert (await b.read_target("openai", "c1", "gpt-4o")).cooldown is None
    hits = b.cache_hits
    assert (await b.read_target("openai", "c1", "gpt-4o")).cooldown is None
    assert b.cache_hits == hits + 1  # no round trip: answered from memory
    stored = await a.set_cooldown("c1", clock.now_ms() + 20 * S, 1, "rate_limit")
    # delivered by pub/sub (the poll is an hour away), well within the 100 ms bound
    await _until(b, await a.shared_version())
    assert (await b.read_target("openai", "c1", "gpt-4o")).cooldown == stored
    # a breaker, a lockout and a permanent block travel the same way, and so does a clear
    rec = BreakerRecord("open", clock.now_ms() + 30 * S, 30 * S, clock.now_ms())
    await a.put_breaker("openai", rec)
    await a.set_lockout("openai", "c1", "gpt-4o", clock.now_ms() + 5 * S, 0, "quota")
    await a.set_permanent(model_scope("openai", "c1", "gpt-4o"), "billing")
    await _until(b, await a.shared_version())
    ts = await b.read_target("openai", "c1", "gpt-4o")
    assert ts.breaker == rec
    assert ts.lockout is not None
    assert ts.permanent is not None
    await a.clear_permanent(model_scope("openai", "c1", "gpt-4o"))
    await a.clear_cooldown("c1")
    await _until(b, await a.shared_version())
    ts = await b.read_target("openai", "c1", "gpt-4o")
    assert ts.permanent is None
    assert ts.cooldown is None


@pytest.mark.redis
async def test_a_replicas_own_write_is_read_back_at_once(
    watched: Callable[..., Any], clock: ManualClock
) -> None:
    a = await watched()
    await a.read_target("openai", "c1", "m")  # cached: nothing
    stored = await a.set_cooldown("c1", clock.now_ms() + S, 1, "rate_limit")
    assert (await a.read_target("openai", "c1", "m")).cooldown == stored  # no wait for a message


@pytest.mark.redis
async def test_the_poll_catches_a_change_whose_message_was_lost(
    watched: Callable[..., Any], clock: ManualClock
) -> None:
    b = await watched(poll_s=0.01)
    a = await watched()  # its client writes as another replica would, minus the message
    assert (await b.read_target("openai", "c1", "m")).cooldown is None
    # a write whose PUBLISH never reached b (as across a reconnect): hash + counter only
    base = a.info()["base"]
    until = clock.now_ms() + 10 * S
    await a._client.hset(f"{base}:cd:c1", mapping={"until": until, "level": 1, "reason": "x"})
    version = int(await a._client.incr(f"{base}:ver"))
    await _until(b, version)
    assert (await b.read_target("openai", "c1", "m")).cooldown == Cooldown(until, 1, "x")


@pytest.mark.redis
async def test_a_view_the_watcher_has_not_vouched_for_lately_is_read_from_redis(
    watched: Callable[..., Any], clock: ManualClock
) -> None:
    """An overdue watcher (here: it polled once, and no message comes) never lets a check use
    the cached view unconfirmed: the check reads the version counter, and a write whose message
    never arrived is seen."""
    b = await watched()  # polls once, then only messages: nothing confirms the version again
    a = await watched()
    assert (await b.read_target("openai", "c1", "m")).cooldown is None
    # a write whose PUBLISH never reached b: hash + counter only
    base = a.info()["base"]
    until = clock.now_ms() + 10 * S
    await a._client.hset(f"{base}:cd:c1", mapping={"until": until, "level": 1, "reason": "x"})
    await a._client.incr(f"{base}:ver")
    hits = b.cache_hits
    assert (await b.read_target("openai", "c1", "m")).cooldown is None  # within 100 ms: cached
    assert b.cache_hits == hits + 1
    clock.advance(101)  # past MAX_STALE_MS since the last confirmation
    assert (await b.read_target("openai", "c1", "m")).cooldown == Cooldown(until, 1, "x")
    assert b.cache_hits == hits + 1  # the version moved: the target was read from Redis
    assert b.reconfirms == 1


@pytest.mark.redis
async def test_checks_that_find_the_watcher_overdue_share_one_version_read(
    watched: Callable[..., Any], clock: ManualClock
) -> None:
    """A loop too busy to run the watcher on time: the checks confirm the version themselves,
    one GET for all of them, and then read from memory (no read of each target)."""
    b = await watched()
    await b.read_target("openai", "c1", "m")
    await b.read_target("openai", "c2", "m")
    hits, before = b.cache_hits, b.reconfirms
    clock.advance(101)
    states = await asyncio.gather(
        *(b.read_target("openai", f"c{1 + i % 2}", "m") for i in range(20))
    )
    assert all(s.cooldown is None for s in states)
    assert b.cache_hits == hits + 20
    assert b.reconfirms == before + 1
    await b.read_target("openai", "c1", "m")  # confirmed again just now: no other read
    assert b.reconfirms == before + 1


@pytest.mark.redis
async def test_a_watcher_that_cannot_subscribe_leaves_checks_reading_redis(
    redis_url: str, redis_prefix: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RedisResilienceStore(redis_url, prefix=redis_prefix, clock=clock)

    def no_pubsub() -> None:
        raise NotImplementedError("no pub/sub on this client")

    monkeypatch.setattr(store._client, "pubsub", no_pubsub)
    try:
        await store.start_watch()
        assert store._watch_task is not None
        await asyncio.wait({store._watch_task}, timeout=30)  # it gives up at once
        await store.read_target("openai", "c1", "m")
        await store.read_target("openai", "c1", "m")
        assert store.cache_hits == 0
        assert store.version is None
    finally:
        await store.close()


async def test_when_a_cached_view_may_serve() -> None:
    """Confirmed within 100 ms, or Redis not answering the watcher (no replica can write then):
    the view serves. Overdue while Redis answers (a stalled watcher): it does not."""
    from fairgate.resilience.state_redis import MAX_STALE_MS, _ReadCache

    cache = _ReadCache()
    assert not cache.fresh(0)  # no version read yet
    cache.observe(5, 1_000)
    assert cache.fresh(1_000 + MAX_STALE_MS)
    assert not cache.fresh(1_001 + MAX_STALE_MS)
    cache.pending_since = 1_050  # a counter read in flight, not yet overdue
    assert not cache.fresh(1_150)
    assert cache.fresh(1_151)  # pending over 100 ms: Redis hangs
    cache.pending_since, cache.failing = None, True  # the read failed: Redis unreachable
    assert cache.fresh(9_999)
    cache.failing = False
    cache.observe(6, 10_000)  # back, and the version moved: the cached reads are dropped
    assert cache.fresh(10_000)
    assert not cache.entries


@pytest.mark.redis
async def test_managers_on_watched_stores_share_a_cooldown(
    watched: Callable[..., Any], clock: ManualClock
) -> None:
    a, b = await watched(), await watched()
    ma, mb = RateLimitManager(a, clock=clock), RateLimitManager(b, clock=clock)
    assert await mb.check("openai", "c1", "gpt-4o") is None
    c = classify(429, None, {"retry-after": "20"}, now_ms=clock.now_ms())
    await ma.on_failure("openai", "c1", "gpt-4o", "apikey", c)
    await _until(b, await a.shared_version())
    excl = await mb.check("openai", "c1", "gpt-4o")
    assert excl is not None
    assert excl.until_ms == clock.now_ms() + 20 * S


@pytest.mark.redis
async def test_monotonic_in_lua_under_concurrent_writers_on_two_clients(
    redis_pair: Callable[[], ResilienceStore], clock: ManualClock
) -> None:
    a, b = redis_pair(), redis_pair()
    now = clock.now_ms()
    rng = random.Random(11)
    untils = [now + rng.randrange(1, 300_000) for _ in range(300)]
    writes = [
        (a if i % 2 else b).set_lockout("openai", "c1", "m", u, i % 5, "x")
        for i, u in enumerate(untils)
    ]
    results = await asyncio.gather(*writes)
    # every reply is already the max of what was stored before it: deadlines never go back
    assert all(r.until_ms >= u for r, u in zip(results, untils, strict=True))
    final = await a.get_lockout("openai", "c1", "m")
    assert final is not None
    assert final.until_ms == max(untils)
    assert final.level == 4


@pytest.mark.redis
async def test_keys_carry_ttl_of_remaining_time_plus_memory(
    redis_url: str, redis_prefix: str, clock: ManualClock
) -> None:
    store = RedisResilienceStore(redis_url, prefix=redis_prefix, clock=clock, level_memory_ms=0)
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await store.set_cooldown("c1", clock.now_ms() + 20 * S, 0, "rate_limit")
        key = f"{redis_prefix}:{{rs}}:cd:c1"
        ttl = await client.pttl(key)
        assert 19 * S < ttl <= 20 * S
        assert await client.hget(key, "until") == str(clock.now_ms() + 20 * S).encode()
        # a deadline already past (by the caller's clock) is not written at all
        await store.set_cooldown("c2", clock.now_ms() - 1, 0, "rate_limit")
        assert not await client.exists(f"{redis_prefix}:{{rs}}:cd:c2")
    finally:
        await client.aclose()
        await store.close()


@pytest.mark.redis
async def test_shared_client_with_decoded_responses(
    redis_url: str, redis_prefix: str, clock: ManualClock
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
    store = RedisResilienceStore(prefix=redis_prefix, client=client, clock=clock)
    try:
        await store.set_cooldown("c1", clock.now_ms() + S, 1, "rate_limit")
        await store.set_permanent("conn:c1", "billing")
        ts = await store.read_target("openai", "c1", "m")
        assert ts.cooldown == Cooldown(clock.now_ms() + S, 1, "rate_limit")
        assert ts.permanent is not None
    finally:
        await store.close()
        await client.aclose()  # the store does not close a client it was given


@pytest.mark.redis
@pytest.mark.parametrize("bad", ["a:b", "a b", "{x}", ""])
async def test_ids_that_would_alias_keys_are_refused(
    redis_pair: Callable[[], ResilienceStore], clock: ManualClock, bad: str
) -> None:
    store = redis_pair()
    with pytest.raises(ValueError, match="invalid"):
        await store.set_cooldown(bad, clock.now_ms() + S, 0, "x")
    with pytest.raises(ValueError, match="invalid"):
        await store.get_lockout(bad, "c1", "m")


def test_redis_store_needs_url_or_client() -> None:
    with pytest.raises(ValueError, match="url or a client"):
        RedisResilienceStore()
    with pytest.raises(ValueError, match="prefix"):
        RedisResilienceStore("redis://localhost", prefix="a{b}")


# -- persistence --------------------------------------------------------------------------------


_opened: list[Database] = []


@pytest.fixture(autouse=True)
def _close_dbs() -> Iterator[None]:
    """Each simulated process's DB connection is closed at the end (a PostgreSQL connection
    left to the garbage collector warns)."""
    yield
    while _opened:
        _opened.pop().close()


def _db(path: Path, url: str | None = None) -> Database:
    """The metadata DB: the SQLite file at ``path``, or the PostgreSQL schema of ``url``."""
    _opened.append(open_database(url, path))
    return _opened[-1]


async def _manager(
    path: Path, clock: ManualClock, store: ResilienceStore | None = None, url: str | None = None
) -> RateLimitManager:
    persistence = PersistenceWriter(lambda: _db(path, url), clock=clock)
    mgr = RateLimitManager(store or MemoryResilienceStore(clock=clock), clock=clock,
                           persistence=persistence)  # fmt: skip
    await mgr.load()
    return mgr


async def _fail(
    mgr: RateLimitManager,
    clock: ManualClock,
    conn: str,
    status: int,
    body: Any = None,
    headers: dict[str, str] | None = None,
    model: str = "gpt-4o",
    provider: str = "openai",
    key_id: str | None = None,
) -> None:
    c = classify(status, body, headers, model=model, now_ms=clock.now_ms())
    await mgr.on_failure(provider, conn, model, "apikey", c, key_id=key_id, request_id="req-1")


async def test_restart_keeps_active_entries_and_drops_expired_ones(
    tmp_path: Path, clock: ManualClock, metadata_url: str | None
) -> None:
    db = tmp_path / "meta.sqlite"
    mgr = await _manager(db, clock, url=metadata_url)
    await _fail(mgr, clock, "short", 429, None, {"retry-after": "10"})
    await _fail(mgr, clock, "long", 429, None, {"retry-after": "100"})
    # OpenAI's structured 404 (a bare one locks nothing since issue 43, N6): lockout 300 s
    not_found = {"error": {"type": "invalid_request_error", "code": "model_not_found"}}
    await _fail(mgr, clock, "c1", 404, not_found, model="gpt-9")
    await _fail(mgr, clock, "billing", 402)
    for i in range(5):
        await _fail(mgr, clock, f"s{i}", 500, provider="anthropic")
    clock.advance(20 * S)  # "short" is over, everything else still runs

    await mgr.close()  # the process stops; a new one starts on the same file, an empty store
    again = await _manager(db, clock, url=metadata_url)
    assert await again.check("openai", "short", "gpt-4o") is None
    long = await again.check("openai", "long", "gpt-4o")
    assert long is not None
    assert long.reason == "cooldown"
    assert long.until_ms == clock.now_ms() + 80 * S
    lock = await again.check("openai", "c1", "gpt-9")
    assert lock is not None
    assert lock.reason == "lockout"
    perm = await again.check("openai", "billing", "gpt-4o")
    assert perm is not None
    assert perm.reason == "permanent"
    br = await again.check("anthropic", "other", "claude")
    assert br is not None
    assert br.reason == "breaker_open"
    assert br.until_ms == clock.now_ms() + 10 * S

    rows = {
        r[0]
        for r in _db(db, metadata_url).execute("SELECT scope FROM resilience_state").fetchall()
    }  # fmt: skip
    assert "cd:short" not in rows  # pruned on load
    assert {"cd:long", "lk:openai:c1:gpt-9", "perm:conn:billing", "br:anthropic"} <= rows


async def test_permanent_survives_restarts_until_cleared(
    tmp_path: Path, clock: ManualClock, metadata_url: str | None
) -> None:
    db = tmp_path / "meta.sqlite"
    mgr = await _manager(db, clock, url=metadata_url)
    billing = {"type": "error", "error": {"type": "billing_error", "message": "credit too low"}}
    await _fail(mgr, clock, "c1", 402, billing, key_id="k-7")
    clock.advance(90 * 86_400_000)
    await mgr.close()
    mgr = await _manager(db, clock, url=metadata_url)
    assert (await mgr.check("openai", "c1", "gpt-4o")) is not None
    [perm] = (await mgr.snapshot())["permanent"]
    assert perm["caused_by"] == {"key_id": "k-7", "request_id": "req-1"}  # kept across restarts
    assert await mgr.clear("permanent", connection_id="c1")
    await mgr.close()
    mgr = await _manager(db, clock, url=metadata_url)
    assert await mgr.check("openai", "c1", "gpt-4o") is None


async def test_success_and_clears_delete_rows(
    tmp_path: Path, clock: ManualClock, metadata_url: str | None
) -> None:
    db = tmp_path / "meta.sqlite"
    mgr = await _manager(db, clock, url=metadata_url)
    await _fail(mgr, clock, "c1", 429)
    await mgr.check("openai", "c1", "gpt-4o")
    clock.advance(3 * S)
    await mgr.on_success("openai", "c1", "gpt-4o")
    await _fail(mgr, clock, "c2", 429)
    await mgr.clear("cooldown", connection_id="c2")
    await mgr.flush()
    count = _db(db, metadata_url).execute("SELECT COUNT(*) FROM resilience_state").fetchone()[0]
    assert count == 0


async def test_persisted_rows_are_monotonic(
    tmp_path: Path, clock: ManualClock, metadata_url: str | None
) -> None:
    p = SqlitePersistence(_db(tmp_path / "meta.sqlite", metadata_url), clock=clock)
    now = clock.now_ms()
    p.save_cooldown("c1", Cooldown(now + 60 * S, 1, "rate_limit"))
    p.save_cooldown("c1", Cooldown(now + 5 * S, 3, "server_error"))
    assert p.load().cooldowns == {"c1": Cooldown(now + 60 * S, 3, "rate_limit")}
    p.save_breaker("openai", BreakerRecord("open", now + 30 * S, 30 * S, now))
    p.save_breaker("openai", BreakerRecord("open", now + 10 * S, 10 * S, now - 1))  # older
    assert p.load().breakers["openai"].until_ms == now + 30 * S
    p.save_breaker("openai", BreakerRecord("closed", 0, 30 * S, now + 1))
    assert p.load().breakers == {}


@pytest.mark.redis
async def test_restore_into_redis(
    tmp_path: Path, redis_pair: Callable[[], ResilienceStore], clock: ManualClock
) -> None:
    db = tmp_path / "meta.sqlite"
    first = redis_pair()
    mgr = await _manager(db, clock, first)
    await _fail(mgr, clock, "c1", 429, None, {"retry-after": "100"})
    await mgr.flush()
    await first.clear_cooldown("c1")  # Redis lost it (a flush, a new server)
    await first.close()
    second = redis_pair()
    again = await _manager(db, clock, second)
    excl = await again.check("openai", "c1", "gpt-4o")
    assert excl is not None
    assert excl.until_ms == clock.now_ms() + 100 * S


# -- factory ------------------------------------------------------------------------------------


async def test_factory_defaults_to_memory_and_restores(tmp_path: Path, clock: ManualClock) -> None:
    from fairgate.resilience.factory import build_manager

    db = tmp_path / "meta.sqlite"
    first = await build_manager(clock=clock, db=lambda: _db(db))
    assert first.store.name == "memory"
    await _fail(first, clock, "c1", 429, None, {"retry-after": "50"})
    await first.close()
    second = await build_manager(clock=clock, db=lambda: _db(db))
    assert await second.check("openai", "c1", "gpt-4o") is not None


@pytest.mark.redis
async def test_factory_uses_redis_when_it_answers(
    redis_url: str, redis_prefix: str, clock: ManualClock
) -> None:
    from fairgate.resilience.factory import build_manager

    mgr = await build_manager(clock=clock, redis_url=redis_url, redis_prefix=redis_prefix)
    try:
        assert mgr.store.name == "redis"
    finally:
        await mgr.close()


async def test_factory_falls_back_to_memory_when_redis_is_down(clock: ManualClock) -> None:
    from fairgate.resilience.factory import build_manager

    mgr = await build_manager(clock=clock, redis_url="redis://127.0.0.1:1/0")
    assert mgr.store.name == "memory"
