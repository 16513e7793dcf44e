"""The store's pipelined script connection (``store/redis/lane.py``) against a real Redis.

What it promises: the calls of one loop turn go out in one write and each gets its own reply;
a cancelled call leaves the others their replies and retires the connection; a connection
that breaks costs no failed call (one retry on a new one); an unknown script is loaded and run;
an error reply is the caller's and leaves the connection in use; it works on uvloop, the
loop the gateway runs on. The broken and held paths go through a loopback relay
(``tcp_cut.py``) in front of the shared server. Nothing sleeps for time: every wait is for a
reply, bounded only by a safety timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
import redis
import redis.asyncio
import uvloop
from redis.exceptions import ResponseError
from tcp_cut import TcpCut

from fairgate.store.redis.lane import LaneScript, ScriptLane

pytestmark = pytest.mark.redis

#: Only a safety net against a hang; no test waits for it to pass.
SAFETY_S = 30.0
ECHO = LaneScript("return ARGV[1]")


@contextlib.asynccontextmanager
async def _open_lane(url: str, **kwargs: Any) -> AsyncIterator[ScriptLane]:
    """A lane on a client's pool for ``url`` (its connection settings), both closed after."""
    client = redis.asyncio.Redis.from_url(url, **kwargs)
    lane = ScriptLane(client.connection_pool)
    try:
        yield lane
    finally:
        await lane.close()
        await client.aclose()


@pytest_asyncio.fixture
async def lane(redis_url: str) -> AsyncIterator[ScriptLane]:
    async with _open_lane(redis_url) as lane:
        yield lane


@pytest.fixture
def relay(redis_url: str) -> Iterator[TcpCut]:
    cut = TcpCut.for_url(redis_url, 6379)
    try:
        yield cut
    finally:
        cut.close()


@pytest_asyncio.fixture
async def relayed(relay: TcpCut) -> AsyncIterator[ScriptLane]:
    """A lane whose connections go through ``relay``."""
    async with _open_lane(relay.url) as lane:
        yield lane


async def _turns_until(check: Callable[[], bool]) -> None:
    """Let the loop run turns until ``check`` holds (a count the lane's callbacks move)."""
    async with asyncio.timeout(SAFETY_S):
        while not check():  # noqa: ASYNC110 - no event to wait on: the lane only counts
            await asyncio.sleep(0)


async def _echo(lane: ScriptLane, value: str) -> bytes:
    reply: bytes = await lane.evalsha(ECHO, [], [value.encode()])
    return reply


async def test_the_calls_of_one_loop_turn_share_one_write(lane: ScriptLane) -> None:
    async with asyncio.timeout(SAFETY_S):
        assert await _echo(lane, "loaded") == b"loaded"  # the server knows the script now
    before = lane.counts.writes
    async with asyncio.timeout(SAFETY_S):
        replies = await asyncio.gather(*(_echo(lane, f"v{i}") for i in range(32)))
    assert replies == [f"v{i}".encode() for i in range(32)]  # each call its own reply
    assert lane.counts.writes - before == 1  # a connection per call would write 32 times
    assert lane.counts.opened == 1
    # and the next turn's calls go out in a write of their own, on the same connection
    async with asyncio.timeout(SAFETY_S):
        assert await _echo(lane, "again") == b"again"
    assert (lane.counts.writes - before, lane.counts.opened) == (2, 1)


async def test_a_cancelled_call_leaves_the_others_their_replies(
    relayed: ScriptLane, relay: TcpCut
) -> None:
    lane = relayed
    assert await lane.open()
    relay.freeze()  # the commands reach the relay; nothing comes back until the thaw
    first = asyncio.create_task(_echo(lane, "first"))
    second = asyncio.create_task(_echo(lane, "second"))
    writes = lane.counts.writes
    await _turns_until(lambda: lane.counts.writes > writes)  # both written, in one write
    first.cancel()  # as the store's deadline does
    with pytest.raises(asyncio.CancelledError):
        await first
    # retired: a call made now goes to a new connection, which the freeze holds too
    assert not lane.connected
    relay.thaw()
    async with asyncio.timeout(SAFETY_S):
        assert await second == b"second"  # not the cancelled call's reply
        assert await _echo(lane, "third") == b"third"
    assert lane.counts.opened == 2


async def test_calls_in_flight_on_a_connection_that_breaks_are_retried_once(
    relayed: ScriptLane, relay: TcpCut
) -> None:
    lane = relayed
    assert await lane.open()
    relay.freeze()
    calls = [asyncio.create_task(_echo(lane, f"c{i}")) for i in range(3)]
    writes = lane.counts.writes
    await _turns_until(lambda: lane.counts.writes > writes)
    relay.cut()  # resets the connection, as a Redis restart does
    relay.restore()
    relay.thaw()
    async with asyncio.timeout(SAFETY_S):
        assert await asyncio.gather(*calls) == [b"c0", b"c1", b"c2"]
    assert lane.counts.opened == 2


async def test_a_connection_that_broke_while_idle_is_replaced(
    relayed: ScriptLane, relay: TcpCut
) -> None:
    lane = relayed
    async with asyncio.timeout(SAFETY_S):
        assert await _echo(lane, "known") == b"known"
    relay.cut()  # the idle connection is reset (a restart, a failover)
    relay.restore()
    async with asyncio.timeout(SAFETY_S):
        assert await _echo(lane, "after") == b"after"
    assert lane.counts.opened == 2


async def test_an_unknown_script_is_loaded_and_run_in_a_burst(lane: ScriptLane) -> None:
    fresh = LaneScript(f"-- {uuid.uuid4().hex}\nreturn ARGV[1] .. '!'")
    async with asyncio.timeout(SAFETY_S):
        replies = await asyncio.gather(*(lane.evalsha(fresh, [], [b"%d" % i]) for i in range(5)))
    assert replies == [b"%d!" % i for i in range(5)]
    assert lane.counts.opened == 1


async def test_an_error_reply_is_the_callers_and_the_connection_stays(lane: ScriptLane) -> None:
    boom = LaneScript("return redis.error_reply('BOOM the script refused')")
    async with asyncio.timeout(SAFETY_S):
        results = await asyncio.gather(
            lane.evalsha(boom, [], []), _echo(lane, "fine"), return_exceptions=True
        )
    assert isinstance(results[0], ResponseError)
    assert "BOOM the script refused" in str(results[0])
    assert results[1] == b"fine"
    assert (lane.counts.opened, lane.connected) == (1, True)


async def test_a_client_that_decodes_gets_text(redis_url: str) -> None:
    async with _open_lane(redis_url, decode_responses=True) as lane, asyncio.timeout(SAFETY_S):
        assert await lane.evalsha(ECHO, [], ["é".encode()]) == "é"


def test_the_lane_runs_on_uvloop(redis_url: str) -> None:
    # the gateway's loop: its transports hand over to the lane's protocol as asyncio's do
    async def main() -> list[bytes]:
        async with _open_lane(redis_url) as lane, asyncio.timeout(SAFETY_S):
            return await asyncio.gather(*(_echo(lane, f"u{i}") for i in range(8)))

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == [f"u{i}".encode() for i in range(8)]
