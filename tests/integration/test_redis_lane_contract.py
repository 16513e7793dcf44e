"""``store/redis/lane.py`` against redis-py, the library it stands in for on the hot path (issue
47, item 5): the same ``EVALSHA`` with the same keys and arguments gives the same reply, of the
same type, or the same error, of the same class and text, through the lane and through
redis-py's own ``evalsha``, on a real Redis, with and without ``decode_responses``."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis.asyncio

from fairgate.store.redis.lane import LaneScript, ScriptLane

pytestmark = pytest.mark.redis

SAFETY_S = 30.0

#: (script, number of keys, arguments): every kind of reply a script gives, and the argument
#: encodings the lane packs itself (empty, binary with CRLF, longer than its length table)
CASES: list[tuple[str, int, list[bytes]]] = [
    ("return ARGV[1]", 0, [b"plain"]),
    ("return ARGV[1]", 0, [b""]),
    ("return ARGV[1]", 0, [b"bin\r\n\x00\xff"]),
    ("return ARGV[1]", 0, [b"x" * 5000]),
    ("return #ARGV", 0, [b"a"] * 60),
    ("return 42", 0, []),
    ("return 3.7", 0, []),  # a Lua number is truncated to an integer reply
    ("return -1", 0, []),
    ("return true", 0, []),
    ("return false", 0, []),  # nil
    ("return nil", 0, []),
    ("return {}", 0, []),
    ("return {1, 'two', {3, 'four'}, false, 5}", 0, []),  # an array stops at the first nil
    ("return redis.status_reply('FINE')", 0, []),
    ("return {ok = 'OK'}", 0, []),
    ("return redis.error_reply('BOOM the script refused')", 0, []),
    ("return redis.error_reply('WRONGTYPE not that one')", 0, []),
    ("return redis.call('NOSUCHCOMMAND')", 0, []),
    ("return redis.call('INCRBY', KEYS[1], ARGV[1])", 1, [b"5"]),
    ("return redis.call('INCRBY', KEYS[1], ARGV[1])", 1, [b"not a number"]),
    ("redis.call('SET', KEYS[1], ARGV[1]); return redis.call('GET', KEYS[1])", 1, [b"v\xe9"]),
    ("return redis.call('HGETALL', KEYS[1])", 1, []),
    ("return {KEYS[1] == KEYS[2], #KEYS}", 2, []),
    ("return tostring(ARGV[1])", 0, ["é".encode()]),
]


def _outcome(got: Any) -> tuple[str, Any]:
    """A reply as (type, value), an error as (class, text): what a caller can tell apart."""
    if isinstance(got, BaseException):
        return type(got).__name__, str(got)
    return type(got).__name__, got


async def _run_both(
    url: str, decode: bool
) -> tuple[list[tuple[tuple[str, Any], tuple[str, Any]]], int]:
    """Every case through the lane and through redis-py; the outcomes, and how many connections
    the lane opened (one: no error reply, nor a reply it could not decode, costs it its
    connection)."""
    client = redis.asyncio.Redis.from_url(url, decode_responses=decode)
    lane = ScriptLane(client.connection_pool)
    prefix = f"fg-contract-{uuid.uuid4().hex[:8]}"
    out = []
    try:
        for i, (source, nkeys, args) in enumerate(CASES):
            script = LaneScript(source)
            # each side its own keys, in the same state: equal replies, never a shared counter
            lane_keys = [f"{prefix}:lane:{i}:{k}".encode() for k in range(nkeys)]
            py_keys = [f"{prefix}:py:{i}:{k}".encode() for k in range(nkeys)]
            await client.script_load(source)
            theirs: Any
            try:
                theirs = await client.evalsha(  # type: ignore[misc]
                    script.sha.decode(), nkeys, *py_keys, *args
                )
            except Exception as exc:  # an error is an outcome to compare
                theirs = exc
            ours: Any
            try:
                ours = await lane.evalsha(script, lane_keys, args)
            except Exception as exc:  # an error is an outcome to compare
                ours = exc
            out.append((_outcome(ours), _outcome(theirs)))
        return out, lane.counts.opened
    finally:
        await lane.close()
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


@pytest.mark.parametrize("decode", [False, True], ids=["bytes", "decode_responses"])
async def test_the_lane_replies_as_redis_py_does(redis_url: str, decode: bool) -> None:
    async with asyncio.timeout(SAFETY_S):
        pairs, opened = await _run_both(redis_url, decode)
    for (source, _, args), (ours, theirs) in zip(CASES, pairs, strict=True):
        assert ours == theirs, (source, args[:1])
    # the cases cover what they claim: errors, nils, nested arrays, text when decoding
    kinds = {theirs[0] for _, theirs in pairs}
    assert {"ResponseError", "NoneType", "list", "int"} <= kinds
    assert ("str" if decode else "bytes") in kinds
    assert opened == 1


async def test_a_later_call_goes_with_the_next_call_or_on_its_own(redis_url: str) -> None:
    """A ``later`` call (a settle batch) waits for the next call made without it (an
    admission) and goes in that call's write, in the order they were made; alone, it goes on
    its own (up to 2 ms later). Replies are the same either way."""
    pool = redis.asyncio.ConnectionPool.from_url(redis_url)
    lane = ScriptLane(pool)
    script = LaneScript("return ARGV[1]")
    try:
        assert await asyncio.wait_for(lane.evalsha(script, [], [b"warm"]), SAFETY_S) == b"warm"
        writes = lane.counts.writes
        settle = asyncio.ensure_future(lane.evalsha(script, [], [b"settle"], later=True))
        await asyncio.sleep(0)  # queued, waiting for company
        admit = lane.evalsha(script, [], [b"admit"])
        assert await asyncio.wait_for(asyncio.gather(settle, admit), SAFETY_S) == [
            b"settle",
            b"admit",
        ]
        assert lane.counts.writes == writes + 1
        alone = lane.evalsha(script, [], [b"alone"], later=True)
        assert await asyncio.wait_for(alone, SAFETY_S) == b"alone"
        assert lane.counts.writes == writes + 2
    finally:
        await lane.close()
        await pool.disconnect()
