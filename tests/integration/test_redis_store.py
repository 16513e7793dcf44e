"""What only the Redis driver promises: key layout, TTLs, one round trip, scripts, real races.

The behaviour shared with SQLite is in ``test_store_contract.py``; these tests look at the Redis
side of it with a real server, each under its own key prefix (``redis_prefix``). Time is always
an argument (``T0``); nothing sleeps.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import redis
import redis.asyncio
from redis.crc import key_slot
from resp_wire import Wire

from fairgate.domain.units import Unit
from fairgate.quota.decision import DimensionCheck, Outcome, Reason, Verdict
from fairgate.quota.model import Policy
from fairgate.quota.ports import (
    DEFAULT_LEASE_MS,
    AdmitRequest,
    CounterRef,
    GcResult,
    ReservationExists,
    UsageItem,
)
from fairgate.quota.window import Count
from fairgate.store.redis.store import RedisQuotaStore

pytestmark = pytest.mark.redis

#: Same instant as ``tests/conftest.py``'s ``T0`` (hour-aligned); that module is not importable
#: as a package here, and the spawned workers need the value anyway.
T0 = 1_700_002_800_000
HOUR = 3_600_000
DAY = 24 * HOUR
MONTH = 30 * DAY
REQ = "requests/hourly"
TOK = "tokens/hourly"
USD_MONTH = "usd/monthly"


def check(
    key: str = REQ,
    *,
    window_ms: int = HOUR,
    limit: float = 100,
    fair_share: float | None = None,
    cap: float | None = None,
    cost: float = 1.0,
    unit: Unit = Unit.REQUESTS,
    scope: str = "pool",
) -> DimensionCheck:
    return DimensionCheck(
        key=key,
        unit=unit,
        window_ms=window_ms,
        limit=limit,
        fair_share=limit if fair_share is None else fair_share,
        cap=cap,
        cost=cost,
        scope=scope,
    )


def request(
    *checks: DimensionCheck,
    pool: str = "p1",
    key: str = "k1",
    now_ms: int = T0,
    policy: Policy = Policy.BURST,
    rid: str | None = None,
    lease_ms: int = DEFAULT_LEASE_MS,
) -> AdmitRequest:
    return AdmitRequest(
        pool_id=pool,
        key_id=key,
        checks=checks or (check(),),
        policy=policy,
        threshold=0.5,
        reservation_id=rid or uuid.uuid4().hex,
        now_ms=now_ms,
        lease_ms=lease_ms,
    )


@pytest.fixture
def wire(redis_url: str) -> Iterator[Wire]:
    w = Wire(redis_url)
    try:
        yield w
    finally:
        w.relay.close()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A plain synchronous client to inspect what the store wrote."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


@pytest_asyncio.fixture
async def store(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisQuotaStore]:
    s = RedisQuotaStore(redis_url, prefix=redis_prefix)
    try:
        yield s
    finally:
        await s.close()


def keys_under(client: redis.Redis, prefix: str) -> list[str]:
    return sorted(str(k) for k in client.scan_iter(match=f"{prefix}:*", count=1000))


# -- key layout and TTLs ----------------------------------------------------------------------


async def test_every_key_is_under_the_prefix_and_carries_the_pool_hash_tag(
    store: RedisQuotaStore, raw: redis.Redis, redis_prefix: str
) -> None:
    checks = (
        check(REQ, cost=1),
        check(TOK, limit=100_000, cost=500, unit=Unit.TOKENS),
        check("model:m1:requests/hourly", limit=3, scope="model"),
    )
    for pool in ("p1", "p2"):
        held = request(*checks, pool=pool)
        await store.admit(held)
        released = request(*checks, pool=pool, key="k2")
        await store.admit(released)
        await store.release(pool, released.reservation_id, T0 + 1)
        await store.record(pool, "k2", [UsageItem(TOK, HOUR, 7)], T0 + 2)
        await store.admit(request(*checks, pool=pool, key="k3"))
        await store.settle(pool, "k3", held.reservation_id, [UsageItem(REQ, HOUR, 1)], T0 + 3)

    keys = keys_under(raw, redis_prefix)
    for pool in ("p1", "p2"):
        mine = [k for k in keys if k.startswith(f"{redis_prefix}:{{{pool}}}:")]
        assert {key_slot(k.encode()) for k in mine} == {key_slot(pool.encode())}
        assert {f"{redis_prefix}:{{{pool}}}:{s}" for s in ("rz", "act", "cum")} <= set(mine)
    assert all(k.startswith((f"{redis_prefix}:{{p1}}:", f"{redis_prefix}:{{p2}}:")) for k in keys)
    bucket = T0 // HOUR
    assert f"{redis_prefix}:{{p1}}:c:*:{REQ}:{bucket}" in keys  # pool total
    assert f"{redis_prefix}:{{p1}}:c:k1:{REQ}:{bucket}" in keys
    # A model cap is the key's alone: no pool-total key is ever written for it.
    assert not any(":c:*:model:" in k for k in keys)


async def test_counter_keys_live_at_most_two_windows_and_reservations_outlive_their_buckets(
    store: RedisQuotaStore, raw: redis.Redis, redis_prefix: str
) -> None:
    req = request(check(REQ), check(USD_MONTH, window_ms=MONTH, cost=0.25, unit=Unit.USD))
    await store.admit(req)
    await store.record("p1", "k1", [UsageItem(TOK, HOUR, 10)], T0)

    base = f"{redis_prefix}:{{p1}}"
    for counter, window in ((REQ, HOUR), (USD_MONTH, MONTH), (TOK, HOUR)):
        for owner in ("*", "k1"):
            ttl = raw.pttl(f"{base}:c:{owner}:{counter}:{T0 // window}")
            assert 0 < ttl <= 2 * window, (counter, owner, ttl)
    # The parts matter while their buckets count (2 × the longest window), so the reservation
    # key lives at least that long, beyond the lease.
    assert raw.pttl(f"{base}:r:{req.reservation_id}") > 2 * MONTH
    assert raw.zscore(f"{base}:rz", req.reservation_id) == T0 + DEFAULT_LEASE_MS


async def test_the_pools_shared_keys_outlive_every_write_by_their_ttl_and_are_refreshed_rarely(
    store: RedisQuotaStore, raw: redis.Redis, redis_prefix: str
) -> None:
    # The reservations' ZSET and the active keys' must live at least the reservation TTL past
    # every admission (a late reclaim still finds the parts). A refresh sets twice that, so the
    # writes of the next stretch find enough left and skip the PEXPIRE.
    base = f"{redis_prefix}:{{p1}}"
    need = RedisQuotaStore._reservation_ttl(request())
    await store.admit(request())
    for name in ("rz", "act"):
        assert need < raw.pttl(f"{base}:{name}") <= 2 * need, name

    for name in ("rz", "act"):  # enough left: the next admission leaves the TTL alone
        raw.pexpire(f"{base}:{name}", need + 60_000)
    await store.admit(request(now_ms=T0 + 1))
    for name in ("rz", "act"):
        assert need < raw.pttl(f"{base}:{name}") <= need + 60_000, name

    for name in ("rz", "act"):  # too little left: refreshed, never below the need
        raw.pexpire(f"{base}:{name}", need - 60_000)
    await store.admit(request(now_ms=T0 + 2))
    for name in ("rz", "act"):
        assert need + 60_000 < raw.pttl(f"{base}:{name}") <= 2 * need, name

    # the cumulative totals the same way, for their own need (2 x the window, plus a minute)
    cum_need = 2 * HOUR + 60_000
    await store.record("p1", "k1", [UsageItem(TOK, HOUR, 10)], T0 + 3)
    assert cum_need < raw.pttl(f"{base}:cum") <= 2 * cum_need
    raw.pexpire(f"{base}:cum", cum_need - 60_000)
    await store.record("p1", "k1", [UsageItem(TOK, HOUR, 10)], T0 + 4)
    assert cum_need + 60_000 < raw.pttl(f"{base}:cum") <= 2 * cum_need


async def test_counters_hold_exact_doubles_like_the_sqlite_driver(
    store: RedisQuotaStore, raw: redis.Redis, redis_prefix: str
) -> None:
    # INCRBYFLOAT would store "0.3" (long double); the drivers must agree with Python floats.
    for amount in (0.1, 0.2):
        await store.record("p1", "k1", [UsageItem(USD_MONTH, MONTH, amount)], T0)
    counts = await store.peek("p1", "k1", [CounterRef(USD_MONTH, MONTH)], T0)
    assert counts[USD_MONTH] == Count(0.0, 0.1 + 0.2)
    assert await store.cumulative("p1", [USD_MONTH]) == {USD_MONTH: 0.1 + 0.2}
    assert raw.get(f"{redis_prefix}:{{p1}}:c:k1:{USD_MONTH}:{T0 // MONTH}") == repr(0.1 + 0.2)


@pytest.mark.parametrize(
    ("amounts", "text"),
    [
        ((3.0, 4.0), "7"),  # whole counts print as '%d' ...
        ((999_999_999_999_998.0, 1.0), "999999999999999"),  # ... up to 1e15
        ((1e15, 1e15), "2000000000000000"),  # above it '%.17g' (the same digits here)
        ((2.5, 0.5), "3"),  # a fractional sum that lands on a whole count
        ((0.25, 0.5), "0.75"),  # fractions keep '%.17g'
        ((1e16, 1.0), "10000000000000000"),  # 1e16 + 1 is 1e16 in a double, as in Python
    ],
)
async def test_counter_text_is_what_python_reads_back_to_the_same_double(
    store: RedisQuotaStore,
    raw: redis.Redis,
    redis_prefix: str,
    amounts: tuple[float, ...],
    text: str,
) -> None:
    # lib.lua prints whole counts with '%d' and the rest with '%.17g': either way the text reads
    # back to the double Python's own sum gives, and a whole count's text has no '.0' or exponent
    for amount in amounts:
        await store.record("p1", "k1", [UsageItem(USD_MONTH, MONTH, amount)], T0)
    stored = raw.get(f"{redis_prefix}:{{p1}}:c:k1:{USD_MONTH}:{T0 // MONTH}")
    assert stored == text
    assert float(stored) == sum(amounts)
    counts = await store.peek("p1", "k1", [CounterRef(USD_MONTH, MONTH)], T0)
    assert counts[USD_MONTH] == Count(0.0, sum(amounts))


# -- round trips and scripts --------------------------------------------------------------------


def _dump(client: redis.Redis, prefix: str) -> dict[str, Any]:
    """Every key under ``prefix`` (the prefix cut off) with its value, for comparing two runs."""
    out: dict[str, Any] = {}
    for key in keys_under(client, prefix):
        kind = client.type(key)
        if kind == "string":
            value: Any = client.get(key)
        elif kind == "hash":
            value = client.hgetall(key)
        else:
            value = client.zrange(key, 0, -1, withscores=True)
        out[key[len(prefix) :]] = value
    return out


async def test_settles_applied_together_leave_what_they_leave_one_at_a_time(
    redis_url: str, raw: redis.Redis
) -> None:
    """settle.lua applies a batch of settles one after the other with the same arithmetic as
    one at a time: the same counters to the last bit (fractions, netting, a reservation settled
    twice, records among them), the same markers, the same active set."""
    import random

    rng = random.Random(7)
    ops: list[tuple[str, str, str, list[UsageItem], int]] = []
    admits = []
    for i in range(40):
        rid = f"r{i}"
        cost = round(rng.uniform(50, 2000), rng.choice((0, 1, 3)))
        checks = (check(REQ), check(TOK, limit=1e7, cost=cost, unit=Unit.TOKENS))
        key = f"k{i % 3}"
        admits.append(request(*checks, key=key, rid=rid, now_ms=T0 + i))
        used = round(rng.uniform(0, 1.5 * cost), rng.choice((0, 2, 7)))
        usage = [UsageItem(REQ, HOUR, 1), UsageItem(TOK, HOUR, used)]
        ops.append(("settle", key, rid, usage, T0 + 100 + i))
        if i % 7 == 0:  # replayed: its second settle must add nothing
            ops.append(("settle", key, rid, usage, T0 + 101 + i))
        if i % 5 == 0:  # a record (percent attribution) among them
            ops.append(("record", key, "", [UsageItem(TOK, HOUR, 0.1 * i)], T0 + 102 + i))
    prefixes = [f"fgtest:{uuid.uuid4().hex[:12]}" for _ in range(2)]
    dumps = []
    try:
        for together, prefix in zip((False, True), prefixes, strict=True):
            store = RedisQuotaStore(redis_url, prefix=prefix)
            try:
                for req in admits:
                    assert (await store.admit(req)).reserved

                def call(
                    op: tuple[str, str, str, list[UsageItem], int], store: RedisQuotaStore = store
                ) -> Any:
                    mode, key, rid, usage, now = op
                    if mode == "record":
                        return store.record("p1", key, usage, now)
                    return store.settle("p1", key, rid, usage, now)

                if together:  # in batches of 10 (a batch starts from what the last one left)
                    for i in range(0, len(ops), 10):
                        await asyncio.gather(*(call(op) for op in ops[i : i + 10]))
                else:
                    for op in ops:
                        await call(op)
            finally:
                await store.close()
            dumps.append(_dump(raw, prefix))
    finally:
        for prefix in prefixes:
            for key in keys_under(raw, prefix):
                raw.delete(key)
    assert dumps[0] == dumps[1]
    assert dumps[0][":{p1}:c:*:tokens/hourly:472223"] != "0"  # the counts were there to compare


async def test_settles_that_wait_behind_one_in_flight_go_as_one_script_call(
    wire: Wire, redis_prefix: str
) -> None:
    store = RedisQuotaStore(wire.url, prefix=redis_prefix)
    try:
        reqs = [request(key=f"k{i % 4}", now_ms=T0 + i) for i in range(20)]
        for req in reqs:
            await store.admit(req)
        usage = [UsageItem(REQ, HOUR, 1)]
        await store.settle("p1", "k0", "warm", usage, T0 + 50)  # loads the script
        wire.reset()
        first = asyncio.ensure_future(
            store.settle("p1", reqs[0].key_id, reqs[0].reservation_id, usage, T0 + 60)
        )
        await asyncio.sleep(0)
        rest = [store.settle("p1", r.key_id, r.reservation_id, usage, T0 + 61) for r in reqs[1:]]
        await asyncio.gather(first, *rest)
        # the first goes alone; the 19 made while it was in flight go in one call after it
        assert wire.commands == ["EVALSHA", "EVALSHA"]
        counts = await store.pool_usage("p1", ["k0"], [CounterRef(REQ, HOUR)], T0 + 62)
        assert counts.totals[REQ] == Count(0.0, 21.0)  # 20 reserved, settled at 1 each, + "warm"
    finally:
        await store.close()


async def test_an_admission_is_exactly_one_round_trip(wire: Wire, redis_prefix: str) -> None:
    store = RedisQuotaStore(wire.url, prefix=redis_prefix)
    try:
        await store.warm()  # connects (the handshakes are commands too)
        checks = (
            check(REQ),
            check(TOK, limit=1e5, cost=800, unit=Unit.TOKENS),
            check(USD_MONTH, cost=0.5),
        )
        await store.admit(request(*checks))  # connects and, on a fresh server, loads the script
        for i in range(5):
            wire.reset()
            result = await store.admit(request(*checks, key=f"k{i}", now_ms=T0 + i))
            assert result.reserved
            assert (wire.commands, wire.sent, wire.read) == (["EVALSHA"], 1, 1)

        held = request(*checks)
        await store.admit(held)
        usage = [UsageItem(REQ, HOUR, 1), UsageItem(TOK, HOUR, 300)]
        for op in (
            store.settle("p1", "k1", held.reservation_id, usage, T0 + 10),
            store.record("p1", "k1", usage, T0 + 11),
            store.release("p1", "nope", T0 + 12),
            store.peek("p1", "k1", [CounterRef(REQ, HOUR), CounterRef(TOK, HOUR)], T0),
            store.pool_usage("p1", ["k1", "k2"], [CounterRef(REQ, HOUR)], T0),
        ):
            wire.reset()
            await op
            assert (wire.sent, wire.read) == (1, 1), wire.commands
    finally:
        await store.close()


async def test_a_second_store_reuses_the_loaded_scripts(
    redis_url: str, redis_prefix: str, wire: Wire
) -> None:
    # SCRIPT FLUSH would disturb everyone sharing the server, so the cold path is not tested here;
    # what matters is that the sha is stable and a new instance never loads again.
    first = RedisQuotaStore(redis_url, prefix=redis_prefix)
    second = RedisQuotaStore(wire.url, prefix=redis_prefix)
    client = redis.asyncio.Redis.from_url(wire.url)
    try:
        await first.admit(request())
        await first.settle("p1", "k1", "none", [], T0)
        await first.release("p1", "none", T0)
        assert second.script_shas == first.script_shas
        shas = list(first.script_shas.values())
        assert await client.script_exists(*shas) == [True, True, True]
        await second.warm()  # connect (the handshakes are commands too)
        wire.reset()
        await second.admit(request(key="k2"))
        await second.settle("p1", "k2", "none", [], T0)
        await second.release("p1", "none", T0)
        assert wire.commands == ["EVALSHA"] * 3
    finally:
        await first.close()
        await second.close()
        await client.aclose()


# -- ids -------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["a{b", "a}b", "{p}", "a b", "a\tb", "a\nb", ""])
async def test_ids_that_could_break_the_hash_tag_are_rejected(
    store: RedisQuotaStore, raw: redis.Redis, redis_prefix: str, bad: str
) -> None:
    with pytest.raises(ValueError, match="invalid pool id"):
        await store.admit(request(pool=bad))
    if bad:
        with pytest.raises(ValueError, match="invalid key id"):
            await store.admit(request(key=bad))
        with pytest.raises(ValueError, match="invalid key id"):
            await store.record("p1", bad, [UsageItem(REQ, HOUR, 1)], T0)
        with pytest.raises(ValueError, match="invalid prefix"):
            RedisQuotaStore("redis://127.0.0.1", prefix=bad)
    with pytest.raises(ValueError, match="invalid pool id"):
        await store.peek(bad, "k1", [CounterRef(REQ, HOUR)], T0)
    with pytest.raises(ValueError, match="invalid pool id"):
        await store.clear(bad)
    assert keys_under(raw, redis_prefix) == []


async def test_the_pool_total_key_id_is_reserved(store: RedisQuotaStore) -> None:
    with pytest.raises(ValueError, match="reserved"):
        await store.admit(request(key="*"))
    with pytest.raises(ValueError, match="reserved"):
        await store.settle("p1", "*", "r", [UsageItem(REQ, HOUR, 1)], T0)


async def test_duplicate_reservation_id_is_rejected_without_double_reserving(
    store: RedisQuotaStore,
) -> None:
    await store.admit(request(rid="dup"))
    with pytest.raises(ValueError, match="dup"):
        await store.admit(request(rid="dup"))
    assert await store.peek("p1", "k1", [CounterRef(REQ, HOUR)], T0) == {REQ: Count(0.0, 1.0)}
    # Even one that the pool would block now: the engine retries a timed-out admission under
    # its id and must learn that the first attempt reserved, whatever the pool looks like now.
    with pytest.raises(ReservationExists, match="dup"):
        await store.admit(request(check(limit=1), rid="dup"))
    assert await store.peek("p1", "k1", [CounterRef(REQ, HOUR)], T0) == {REQ: Count(0.0, 1.0)}
    # A settled id is not held any more: settling it again adds nothing (a replayed settle)
    usage = [UsageItem(REQ, HOUR, 1.0)]
    await store.settle("p1", "k1", "dup", usage, T0)
    await store.settle("p1", "k1", "dup", usage, T0)
    assert await store.peek("p1", "k1", [CounterRef(REQ, HOUR)], T0) == {REQ: Count(0.0, 1.0)}


# -- reclaim and gc -----------------------------------------------------------------------------


async def test_gc_undoes_expired_reservations_of_idle_pools(
    store: RedisQuotaStore, raw: redis.Redis, redis_prefix: str
) -> None:
    month = check(USD_MONTH, window_ms=MONTH, cost=2.0, unit=Unit.USD)
    await store.admit(request(month, pool="idle", lease_ms=60_000))
    kept = request(month, pool="busy", lease_ms=600_000)
    await store.admit(kept)

    assert await store.gc(T0 + 60_000, 14 * DAY) == GcResult(0, 0, 1)

    ref = [CounterRef(USD_MONTH, MONTH)]
    assert await store.peek("idle", "k1", ref, T0 + 60_000) == {USD_MONTH: Count()}
    assert (await store.pool_usage("idle", [], ref, T0 + 60_000)).totals == {USD_MONTH: Count()}
    assert raw.zcard(f"{redis_prefix}:{{idle}}:rz") == 0
    assert await store.peek("busy", "k1", ref, T0 + 60_000) == {USD_MONTH: Count(0.0, 2.0)}
    assert await store.release("busy", kept.reservation_id, T0 + 60_000)


async def test_gc_forgets_keys_inactive_for_longer_than_the_retention(
    store: RedisQuotaStore,
) -> None:
    await store.admit(request(key="old", now_ms=T0))
    await store.admit(request(key="new", now_ms=T0 + 2 * DAY))
    await store.gc(T0 + 15 * DAY, 14 * DAY)
    assert await store.active_keys("p1", 0) == ["new"]


async def test_reclaim_is_bounded_per_admission(
    store: RedisQuotaStore, raw: redis.Redis, redis_prefix: str
) -> None:
    for i in range(40):
        await store.admit(request(key=f"k{i}", lease_ms=1_000))
    rz = f"{redis_prefix}:{{p1}}:rz"
    assert raw.zcard(rz) == 40

    first = await store.admit(request(now_ms=T0 + 5_000, lease_ms=HOUR))
    assert raw.zcard(rz) == 40 - 16 + 1
    assert first.totals == (Count(0.0, 24.0),)  # read after the reclaim
    await store.admit(request(now_ms=T0 + 5_000, lease_ms=HOUR))
    await store.admit(request(now_ms=T0 + 5_000, lease_ms=HOUR))
    assert raw.zcard(rz) == 3
    usage = await store.pool_usage("p1", [], [CounterRef(REQ, HOUR)], T0 + 5_000)
    assert usage.totals == {REQ: Count(0.0, 3.0)}


async def test_clear_leaves_other_prefixes_and_pools_alone(
    redis_url: str, redis_prefix: str, raw: redis.Redis
) -> None:
    a = RedisQuotaStore(redis_url, prefix=f"{redis_prefix}:a")
    b = RedisQuotaStore(redis_url, prefix=f"{redis_prefix}:b")
    try:
        for s in (a, b):
            for pool in ("p*", "p"):  # a glob character in a pool id is matched literally
                await s.admit(request(pool=pool))
                await s.record(pool, "k1", [UsageItem(REQ, HOUR, 2)], T0)
        await a.clear("p*")
        left = keys_under(raw, redis_prefix)
        assert not any(k.startswith(f"{redis_prefix}:a:{{p*}}") for k in left)
        assert any(k.startswith(f"{redis_prefix}:a:{{p}}") for k in left)
        assert any(k.startswith(f"{redis_prefix}:b:{{p*}}") for k in left)
        assert await b.peek("p*", "k1", [CounterRef(REQ, HOUR)], T0) == {REQ: Count(0.0, 3.0)}
    finally:
        await a.close()
        await b.close()


async def test_ping_fails_soft_when_the_server_is_unreachable() -> None:
    store = RedisQuotaStore("redis://127.0.0.1:1/0")
    try:
        assert not await store.ping()
    finally:
        await store.close()


async def test_a_client_passed_in_is_not_closed(redis_url: str, redis_prefix: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        store = RedisQuotaStore(redis_url, prefix=redis_prefix, client=client)
        await store.close()
        assert await client.ping()
    finally:
        await client.aclose()


# -- races ---------------------------------------------------------------------------------------

RACE_LIMIT = 5


def race_request(pool: str, i: int) -> AdmitRequest:
    return request(
        check(limit=RACE_LIMIT, fair_share=1),
        pool=pool,
        key=f"k{i % 7}",
        policy=Policy.BURST,
        rid=f"race-{i}",
    )


async def test_100_concurrent_admissions_vs_a_limit_of_5_exactly_5_win(
    store: RedisQuotaStore,
) -> None:
    results = await asyncio.gather(*(store.admit(race_request("p1", i)) for i in range(100)))

    assert sum(r.reserved for r in results) == RACE_LIMIT
    losers = [r.verdict for r in results if not r.reserved]
    assert losers == [Verdict(Outcome.BLOCK, Reason.GLOBAL_SATURATED, 0)] * (100 - RACE_LIMIT)
    usage = await store.pool_usage("p1", [], [CounterRef(REQ, HOUR)], T0)
    assert usage.totals == {REQ: Count(0.0, float(RACE_LIMIT))}


def _race_worker(
    url: str, prefix: str, pool: str, ids: list[int], start: Any, out: Any
) -> None:  # pragma: no cover - runs in a spawned process
    async def run() -> int:
        # exactness is the fact under test, not outage detection: on a loaded host four freshly
        # spawned processes may read a reply later than the 1 s default (SlowReply, seen in CI)
        store = RedisQuotaStore(url, prefix=prefix, socket_timeout_s=30.0)
        try:
            await store.ping()  # connected before the start line
            start.wait(30)  # every worker is connected: they all go at once
            results = await asyncio.gather(*(store.admit(race_request(pool, i)) for i in ids))
            return sum(r.reserved for r in results)
        finally:
            await store.close()

    try:
        out.put(("ok", asyncio.run(run())))
    except BaseException as exc:
        out.put(("error", repr(exc)))


@pytest.mark.slow
async def test_4_processes_racing_100_admissions_vs_a_limit_of_5_exactly_5_win(
    store: RedisQuotaStore, redis_url: str, redis_prefix: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(4)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_race_worker,
            args=(redis_url, redis_prefix, "p1", list(range(w, 100, 4)), start, out),
        )
        for w in range(4)
    ]
    for p in procs:
        p.start()
    try:
        reports = []
        for _ in procs:
            reports.append(await asyncio.to_thread(out.get, True, 60))
    except queue.Empty:
        pytest.fail("a racing process did not report within 60 s")
    finally:
        for p in procs:
            await asyncio.to_thread(p.join, 30)
            if p.is_alive():
                p.kill()
        out.close()
        out.join_thread()

    assert [r[0] for r in reports] == ["ok"] * 4, reports
    assert sum(int(r[1]) for r in reports) == RACE_LIMIT
    usage = await store.pool_usage("p1", [], [CounterRef(REQ, HOUR)], T0)
    assert usage.totals == {REQ: Count(0.0, float(RACE_LIMIT))}


# -- every key expires --------------------------------------------------------------------------


async def test_every_key_written_has_a_ttl(
    store: RedisQuotaStore, raw: redis.Redis, redis_prefix: str
) -> None:
    """Redis needs no GC for counters: every key the store writes (buckets, reservations, the
    reservation and active ZSETs, cumulative totals, settled markers) carries a TTL, so nothing
    outlives its use. Traffic of every kind, in two pools and three windows, then a scan."""
    hourly = check()
    monthly = check(USD_MONTH, window_ms=MONTH, cost=0.5, unit=Unit.USD)
    model = check("tokens/hourly:gpt", cost=10, unit=Unit.TOKENS, scope="model")
    for pool in ("p1", "p2"):
        for i in range(6):
            req = request(hourly, monthly, model, pool=pool, key=f"k{i % 3}", now_ms=T0 + i)
            res = await store.admit(req)
            assert res.reserved
            if i % 3 == 0:
                usage = [UsageItem(REQ, HOUR, 1), UsageItem(USD_MONTH, MONTH, 0.4, "pool")]
                await store.settle(pool, req.key_id, req.reservation_id, usage, T0 + 10)
            elif i % 3 == 1:
                await store.release(pool, req.reservation_id, T0 + 10)
        # a refusal, plain usage, and a reservation left to expire
        await store.admit(request(check(limit=1, fair_share=1, cost=5), pool=pool))
        await store.record(pool, "k9", [UsageItem(TOK, HOUR, 3)], T0 + 20)
    await store.gc(T0 + 30, 14 * DAY)  # nothing expired yet: every kind of key is still there

    keys = keys_under(raw, redis_prefix)
    kinds = {k.split("}:", 1)[1].split(":", 1)[0] for k in keys}
    assert kinds >= {"c", "r", "rz", "act", "cum"}  # the scan saw every kind of key
    no_ttl = [k for k in keys if raw.pttl(k) <= 0]
    assert no_ttl == []
