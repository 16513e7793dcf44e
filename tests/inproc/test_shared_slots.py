"""Concurrency slots shared through Redis: two replicas, one ``max_concurrent``.

Real Redis (the ``redis_url`` fixture, a key prefix of the test's own); each "replica" is its
own :class:`~fairgate.path.slots.Slots` with its own in-flight tracker, as two processes
have. Time is a ManualTimer's clock, handed to the Lua scripts as an argument, so a lease's
expiry is tested by moving the clock, never by waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
import redis.asyncio
from inproc_support import ALICE, base_config, conn

from fairgate.config import parse_config
from fairgate.path.call import Services
from fairgate.path.slots import Slots
from fairgate.process.state import Gateway
from fairgate.providers.inprocess import HandlerUpstream, Reply, UpstreamRequest, openai_chat
from fairgate.routing import InflightTracker, Target
from fairgate.server.app import create_app
from fairgate.store.redis.slots import RedisSlotLeases
from fairgate.store.redis.store import RedisQuotaStore
from fairgate.timers import ManualTimer

TTL = 30_000
C1 = Target("c1", "m", connection_id="c1")


@pytest.fixture
async def leases(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisSlotLeases]:
    store = RedisQuotaStore(redis_url, prefix=redis_prefix)
    try:
        yield store.slot_leases()
    finally:
        await store.close()


async def held_in_redis(redis_url: str, leases: RedisSlotLeases, key: str = "c1") -> int:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        return int(await client.zcard(leases.key(key)))
    finally:
        await client.aclose()


async def eventually(cond: Callable[[], bool]) -> None:
    """Let the loop run until ``cond`` holds: a Redis round trip is real I/O, so this yields
    to the selector instead of spinning (no timing is asserted; it fails loudly, never hangs)."""
    for _ in range(10_000):
        if cond():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the condition never held")


def replica(leases: RedisSlotLeases, timer: ManualTimer, *, poll_ms: int = 250) -> Slots:
    return Slots(
        InflightTracker(), lambda: leases, timer=lambda: timer, lease_ttl_ms=TTL, poll_ms=poll_ms
    )


async def test_two_replicas_never_exceed_the_cap_together(leases: RedisSlotLeases) -> None:
    timer = ManualTimer()
    a, b = replica(leases, timer), replica(leases, timer)
    # a burst on both replicas at once: exactly the cap is granted, whoever asks
    got = await asyncio.gather(*(s.try_acquire(C1, 3) for s in (a, b) * 10))
    granted = [lease for lease in got if lease is not None]
    assert len(granted) == 3
    assert a.held_leases() + b.held_leases() == 3
    # a release on one replica frees the slot for the other
    for lease in granted:
        lease.release()
    await a.settle()
    await b.settle()
    four = [await s.try_acquire(C1, 3) for s in (b, b, b, a)]
    assert [x is not None for x in four] == [True, True, True, False]


async def test_a_dead_replicas_leases_expire_and_their_slots_return(
    leases: RedisSlotLeases, redis_url: str
) -> None:
    timer = ManualTimer()
    dead, alive = replica(leases, timer), replica(leases, timer)
    assert await dead.try_acquire(C1, 2) is not None
    assert await dead.try_acquire(C1, 2) is not None
    # the replica "dies": no release, no renewal
    assert await alive.try_acquire(C1, 2) is None
    timer.advance(TTL - 1)
    assert await alive.try_acquire(C1, 2) is None
    timer.advance(1)
    assert await alive.try_acquire(C1, 2) is not None
    assert await alive.try_acquire(C1, 2) is not None
    assert await held_in_redis(redis_url, leases) == 2  # the dead ones were reaped


async def test_a_renewed_lease_outlives_its_first_expiry(leases: RedisSlotLeases) -> None:
    timer = ManualTimer()
    long_stream, other = replica(leases, timer), replica(leases, timer)
    assert await long_stream.try_acquire(C1, 1) is not None
    timer.advance(TTL * 2 // 3)
    assert await long_stream.renew() == 1
    timer.advance(TTL * 2 // 3)  # past the first expiry, within the renewed one
    assert await other.try_acquire(C1, 1) is None
    timer.advance(TTL // 3)
    assert await other.try_acquire(C1, 1) is not None
    # the expired lease is not brought back by a late renewal
    assert await long_stream.renew() == 0


async def test_the_renewal_task_keeps_a_long_request_counted(leases: RedisSlotLeases) -> None:
    timer = ManualTimer()
    running, other = replica(leases, timer), replica(leases, timer)
    lease = await running.try_acquire(C1, 1)
    assert lease is not None
    for _ in range(6):  # two lease lifetimes, a renewal every third of one
        await eventually(lambda: timer.sleeping == 1)  # the renewer waits for its next turn
        timer.advance(TTL // 3)
    await eventually(lambda: timer.sleeping == 1)
    assert await other.try_acquire(C1, 1) is None
    lease.release()
    await running.settle()
    assert await other.try_acquire(C1, 1) is not None
    await running.aclose()


async def test_a_waiter_takes_a_slot_freed_on_another_replica(leases: RedisSlotLeases) -> None:
    timer = ManualTimer()
    a, b = replica(leases, timer, poll_ms=100), replica(leases, timer, poll_ms=100)
    held = await a.try_acquire(C1, 1)
    assert held is not None
    start = timer.clock.now_ms()
    waiting = asyncio.create_task(b.wait([(C1, 1)], timer.clock.now_ms() + 1_000, timer))
    await eventually(lambda: timer.sleeping == 2)  # a's renewer and b's waiter
    assert b.queued() == 1
    held.release()  # on replica a: nothing wakes b, its next poll finds the slot
    await a.settle()
    timer.advance(100)
    got = await waiting
    assert got is not None
    assert got[0] == C1
    assert timer.clock.now_ms() - start == 100  # found at the first poll
    assert b.queued() == 0


async def test_a_waiter_gives_up_at_its_deadline(leases: RedisSlotLeases) -> None:
    timer = ManualTimer()
    a, b = replica(leases, timer), replica(leases, timer)
    assert await a.try_acquire(C1, 1) is not None
    start = timer.clock.now_ms()
    waiting = asyncio.create_task(b.wait([(C1, 1)], start + 600, timer))
    for _ in range(3):  # polls at 250 and 500 find the slot taken; 600 is the deadline
        await eventually(lambda: timer.sleeping == 2)
        timer.advance(250)
    assert await waiting is None
    assert b.queued() == 0
    assert b.held_leases() == 0


# -- the gateway on the Redis store: a lease is given back on every path -------------------


@contextlib.asynccontextmanager
async def redis_gateway(
    tmp_path: Path, redis_url: str, prefix: str, timer: ManualTimer, upstream: HandlerUpstream
) -> AsyncIterator[tuple[Services, httpx.AsyncClient]]:
    env = {
        "QUOTA_STORE_DRIVER": "redis",
        "QUOTA_STORE_REDIS_URL": redis_url,
        "QUOTA_STORE_REDIS_PREFIX": prefix,
    }
    cfg = parse_config(base_config([conn("c1", max_concurrent=1)]), {})
    gw = Gateway(data_dir=tmp_path, config=cfg, env=env, clock=timer.clock)
    gw.timer = timer
    app = create_app(gw, upstream=upstream)
    async with app.router.lifespan_context(app):
        assert gw.store_choice.driver == "redis"
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield app.state.services, client


_SSE = (
    b'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
)


async def test_the_gateway_gives_the_shared_slot_back_on_every_path(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    timer = ManualTimer()
    hang = asyncio.Event()

    async def handler(req: UpstreamRequest) -> Reply:
        tag = req.json()["messages"][0]["content"]
        if tag == "bad":
            return Reply(400, {"error": {"message": "bad 'temperature'"}})
        if tag == "down":
            raise ConnectionRefusedError
        if tag == "broken":
            return Reply(chunks=[_SSE, ConnectionResetError()])
        if tag == "stream":
            return Reply(chunks=[_SSE, b"data: [DONE]\n\n"])
        if tag == "hang":
            await hang.wait()
        return openai_chat("ok")

    upstream = HandlerUpstream(handler)
    async with redis_gateway(tmp_path, redis_url, redis_prefix, timer, upstream) as (svc, client):
        leases = svc.state.slot_leases
        assert isinstance(leases, RedisSlotLeases)

        async def post(tag: str, **extra: object) -> httpx.Response:
            return await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": tag}], **extra},
                headers={"authorization": f"Bearer {ALICE}"},
            )

        async def check(tag: str, *, stream: bool = False, ok: bool | None = None) -> None:
            r = await post(tag, stream=stream)
            if ok is not None:
                assert (r.status_code == 200) is ok, (tag, r.status_code)
            await svc.slots.settle()
            assert svc.slots.held_leases() == 0, tag
            assert await held_in_redis(redis_url, leases) == 0, tag

        await check("ok", ok=True)
        await check("bad", ok=False)
        await check("stream", stream=True, ok=True)
        # a request cancelled while upstream (the client went away) gives its slot back too
        task = asyncio.create_task(post("hang"))
        for _ in range(1000):
            if svc.slots.held_leases():
                break
            await asyncio.sleep(0)
        assert await held_in_redis(redis_url, leases) == 1
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await svc.slots.settle()
        assert svc.slots.held_leases() == 0
        assert await held_in_redis(redis_url, leases) == 0
        # the upstream breaking mid-stream, then not answering at all (last: it cools c1 down)
        await check("broken", stream=True)
        await check("down", ok=False)
