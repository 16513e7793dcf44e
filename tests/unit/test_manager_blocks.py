"""Who may set a block, and who is named as its cause (issue 19: one tenant must not switch
shared connections off, and every block says which key and request caused it)."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from fairgate.clock import ManualClock
from fairgate.resilience.classify import classify
from fairgate.resilience.manager import PERMANENT_WINDOW_MS, RateLimitManager

S = 1_000
P, C, M = "gemini", "c1", "gemini-2.0-pro"

#: Gemini's billing precondition: a permanent class, but on a 400, so not account-level.
PRECONDITION = orjson.dumps(
    {
        "error": {
            "code": 400,
            "message": "Gemini API free tier is not available in your country. "
            "Please enable billing on your project.",
            "status": "FAILED_PRECONDITION",
        }
    }
)
BILLING_402 = orjson.dumps(
    {"type": "error", "error": {"type": "billing_error", "message": "credit balance too low"}}
)


def echo(word: str) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": f"Unrecognized request argument supplied: {word}",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
    )


@pytest.fixture
def mgr(clock: ManualClock) -> RateLimitManager:
    return RateLimitManager(clock=clock)


async def fail(
    mgr: RateLimitManager,
    clock: ManualClock,
    status: int,
    body: Any,
    key: str | None,
    request: str = "req-1",
    *,
    conn: str = C,
) -> None:
    c = classify(status, body, None, model=M, now_ms=clock.now_ms())
    await mgr.on_failure(P, conn, M, "apikey", c, key_id=key, request_id=request)


async def test_one_key_cannot_set_a_permanent_block_alone(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    for i in range(5):
        await fail(mgr, clock, 400, PRECONDITION, "key-a", f"req-{i}")
        clock.advance(30 * S)
    snap = await mgr.snapshot()
    assert snap["permanent"] == []
    excl = await mgr.check(P, C, M)
    assert excl is not None
    assert excl.reason == "cooldown"  # a temporary quota meanwhile
    assert excl.until_ms is not None


async def test_a_second_key_within_the_window_confirms_it(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    await fail(mgr, clock, 400, PRECONDITION, "key-a", "req-a")
    clock.advance(60 * S)
    await fail(mgr, clock, 400, PRECONDITION, "key-b", "req-b")
    [perm] = (await mgr.snapshot())["permanent"]
    assert perm["scope"] == f"conn:{C}"
    assert perm["caused_by"] == {"key_id": "key-b", "request_id": "req-b"}
    excl = await mgr.check(P, C, M)
    assert excl is not None
    assert excl.reason == "permanent"


async def test_a_shadow_copy_is_no_second_witness(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    """Issue 43, N9: a combo's shadow copy is sent under ``<key>~shadow``; it is the same
    client's request once more, so one key plus a shadow combo must not make a quorum."""
    await fail(mgr, clock, 400, PRECONDITION, "key-a", "req-a")
    clock.advance(S)
    await fail(mgr, clock, 400, PRECONDITION, "key-a~shadow", "req-a")
    assert (await mgr.snapshot())["permanent"] == []
    clock.advance(S)
    await fail(mgr, clock, 400, PRECONDITION, "key-b~shadow", "req-b")
    [perm] = (await mgr.snapshot())["permanent"]  # a second client's copy is a second client
    assert perm["caused_by"] == {"key_id": "key-b~shadow", "request_id": "req-b"}


async def test_evidence_older_than_the_window_does_not_count(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    await fail(mgr, clock, 400, PRECONDITION, "key-a")
    clock.advance(PERMANENT_WINDOW_MS + S)
    await fail(mgr, clock, 400, PRECONDITION, "key-b")
    assert (await mgr.snapshot())["permanent"] == []


async def test_an_account_level_signal_blocks_at_once_naming_the_key(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    await fail(mgr, clock, 402, BILLING_402, "key-a", "req-9")
    [perm] = (await mgr.snapshot())["permanent"]
    assert perm["caused_by"] == {"key_id": "key-a", "request_id": "req-9"}


@pytest.mark.parametrize(
    "word",
    ["insufficient_quota", "invalid_api_key", "rate_limit_exceeded", "credit balance is too low"],
)
async def test_echoed_words_from_many_keys_block_nothing(
    mgr: RateLimitManager, clock: ManualClock, word: str
) -> None:
    for i in range(10):
        await fail(mgr, clock, 400, echo(word), f"key-{i % 3}", f"req-{i}")
    assert await mgr.check(P, C, M) is None
    snap = await mgr.snapshot()
    assert (snap["cooldowns"], snap["lockouts"], snap["permanent"]) == ([], [], [])


async def test_a_cooldown_names_the_key_and_request_and_is_logged(
    mgr: RateLimitManager, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fairgate.resilience")
    await fail(mgr, clock, 429, None, "key-a", "req-42")
    [cd] = (await mgr.snapshot())["cooldowns"]
    assert cd["caused_by"]["key_id"] == "key-a"
    assert cd["caused_by"]["request_id"] == "req-42"
    assert cd["caused_by"]["signal"] == "status:429"
    [fields] = [vars(r) for r in caplog.records if vars(r).get("block") == "cooldown"]
    assert (fields["key_id"], fields["request_id"], fields["target"]) == ("key-a", "req-42", C)


async def test_a_shorter_failure_does_not_take_over_a_longer_blocks_cause(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    await fail(mgr, clock, 429, b'{"error":{"message":"x"}}', "key-a", "req-a")  # 3 s
    headers_long = classify(429, None, {"retry-after": "60"}, model=M, now_ms=clock.now_ms())
    await mgr.on_failure(P, C, M, "apikey", headers_long, key_id="key-b", request_id="req-b")
    await fail(mgr, clock, 429, None, "key-c", "req-c")  # in flight: asks for 3 s again
    [cd] = (await mgr.snapshot())["cooldowns"]
    assert cd["remaining_ms"] == 60 * S
    assert cd["caused_by"]["key_id"] == "key-b"


async def test_a_lockout_learned_from_headers_names_the_request(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    headers = {
        "x-ratelimit-limit-requests": "100",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "30s",
    }
    await mgr.on_success(P, C, M, headers, key_id="key-h", request_id="req-h")
    [lk] = (await mgr.snapshot())["lockouts"]
    assert lk["caused_by"]["key_id"] == "key-h"
    assert lk["caused_by"]["signal"] == "headers"


async def test_the_breaker_names_the_failure_that_opened_it(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    for i in range(5):
        await fail(mgr, clock, 500, None, f"key-{i}", f"req-{i}", conn=f"s{i}")
    br = (await mgr.snapshot())["breakers"][P]
    assert br["state"] == "open"
    assert br["caused_by"]["request_id"] == "req-4"


async def test_clearing_a_permanent_block_forgets_its_evidence(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    await fail(mgr, clock, 400, PRECONDITION, "key-a")
    await fail(mgr, clock, 400, PRECONDITION, "key-b")
    assert await mgr.clear("permanent", connection_id=C)
    await mgr.clear("cooldown", connection_id=C)
    await fail(mgr, clock, 400, PRECONDITION, "key-c")
    assert (await mgr.snapshot())["permanent"] == []
