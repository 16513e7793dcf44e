"""Issue 43, N3: which failures may open the provider-wide breaker (the witness rule in
``resilience/manager.py``, ``may_open`` in ``breaker.py``) and which ones the request explains
(``resilience/evidence.py``)."""

from __future__ import annotations

import pytest

from fairgate.clock import ManualClock
from fairgate.domain.breaker import BreakerState
from fairgate.resilience.classify import Classification, FailureClass, classify
from fairgate.resilience.evidence import request_explains
from fairgate.resilience.manager import RateLimitManager

P, C, M = "openai", "c1", "gpt-4o"
TIMEOUT = classify(None, None, None, exception=TimeoutError("read"), model=M, now_ms=0)
SERVER = classify(500, {"error": {"type": "server_error"}}, None, model=M, now_ms=0)
UNREACHABLE = classify(None, None, None, exception=ConnectionRefusedError(), model=M, now_ms=0)


async def fail(
    mgr: RateLimitManager, key: str, c: Classification = TIMEOUT, *, explained: bool = True
) -> None:
    await mgr.on_failure(P, C, M, "apikey", c, key_id=key, request_explained=explained)


async def five_rounds(mgr: RateLimitManager, *keys: str) -> None:
    """Five rounds of one explained timeout from each of ``keys``, in order: the failures the
    breaker needs (five), from whichever keys witness them."""
    for _ in range(5):
        for key in keys:
            await fail(mgr, key)


@pytest.mark.parametrize(
    ("verdict", "answered", "bound", "prompt", "elapsed", "explained"),
    [
        # 4 000 tokens cannot come in 3 s: the request's length explains the timeout
        (TIMEOUT, False, 4_000, 10, 3_000, True),
        # 20 tokens come within 3 s from any healthy provider: the provider's
        (TIMEOUT, False, 20, 10, 3_000, False),
        # a 4 000-token bound is written well within 600 s: size alone excuses no timeout
        (TIMEOUT, False, 4_000, 10, 600_000, False),
        (SERVER, True, 50, 10, 200, False),  # a quick 500 on a small request
        (SERVER, True, 4_000, 10, 200, True),  # a 500 on a large request: may be its content
        (SERVER, True, 50, 40_000, 200, True),  # a large prompt
        (UNREACHABLE, False, 4_000, 10, 5, False),  # refused at once: nothing to do with it
        (UNREACHABLE, False, 50, 10, 30_000, True),  # cut after a long run (a stalled stream)
    ],
)
def test_what_the_request_explains(
    verdict: Classification, answered: bool, bound: int, prompt: int, elapsed: int, explained: bool
) -> None:
    got = request_explains(
        verdict, answered=answered, output_bound=bound, prompt_tokens=prompt, elapsed_ms=elapsed
    )
    assert got is explained


def test_only_provider_failures_are_judged() -> None:
    bad = Classification(FailureClass.BAD_REQUEST, provider_failure=False)
    assert not request_explains(
        bad, answered=True, output_bound=9_999, prompt_tokens=0, elapsed_ms=99_999
    )


async def test_one_keys_explained_failures_never_open_the_breaker(clock: ManualClock) -> None:
    mgr = RateLimitManager(clock=clock)
    for _ in range(20):
        await fail(mgr, "alice")
        clock.advance(100)
    assert mgr.breaker_state(P) is BreakerState.CLOSED
    assert await mgr.check(P, C, M) is None  # and no cooldown on the connection


async def test_a_second_key_within_the_window_opens_it(clock: ManualClock) -> None:
    mgr = RateLimitManager(clock=clock)
    await five_rounds(mgr, "alice")
    await fail(mgr, "bob")
    assert mgr.breaker_state(P) is BreakerState.OPEN


async def test_a_shadow_copy_is_no_second_witness_for_the_breaker(clock: ManualClock) -> None:
    """One key plus its shadow combo's copy (``alice~shadow``) is still one key: the same rule
    as the permanent-block quorum (issue 43, N9)."""
    mgr = RateLimitManager(clock=clock)
    await five_rounds(mgr, "alice", "alice~shadow")
    assert mgr.breaker_state(P) is BreakerState.CLOSED


async def test_a_witness_outside_the_window_does_not_count(clock: ManualClock) -> None:
    mgr = RateLimitManager(clock=clock)
    await fail(mgr, "bob")
    clock.advance(mgr.breaker(P).config.window_ms)
    await five_rounds(mgr, "alice")
    assert mgr.breaker_state(P) is BreakerState.CLOSED


async def test_an_unexplained_failure_opens_it_on_one_key(clock: ManualClock) -> None:
    mgr = RateLimitManager(clock=clock)
    for _ in range(5):
        await fail(mgr, "alice", SERVER, explained=False)
    assert mgr.breaker_state(P) is BreakerState.OPEN


async def test_a_half_open_probe_on_one_keys_explained_failure_does_not_reopen(
    clock: ManualClock,
) -> None:
    mgr = RateLimitManager(clock=clock)
    for _ in range(5):
        await fail(mgr, "alice", SERVER, explained=False)
    clock.advance(mgr.breaker(P).config.window_ms + mgr.breaker(P).cooldown_ms)
    assert await mgr.check(P, C, M) is None  # Alice's request takes the probe
    await fail(mgr, "alice")
    assert mgr.breaker_state(P) is BreakerState.HALF_OPEN
    assert await mgr.check(P, C, M) is None  # another request may probe at once
