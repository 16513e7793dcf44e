"""Saturation signals, single-flight and account buckets (fairgate.quota.signals)."""

from __future__ import annotations

import asyncio

import pytest

from fairgate.clock import ManualClock
from fairgate.domain.readings import RateLimitSnapshot
from fairgate.quota.signals import (
    MAX_BUCKETS_PER_CONNECTION,
    AccountBuckets,
    BucketState,
    SaturationSignals,
    SingleFlight,
    family_of,
)

SUB = RateLimitSnapshot(unified_5h_utilization=0.6, unified_7d_utilization=0.3)
API = RateLimitSnapshot(
    requests_limit=100, requests_remaining=20, tokens_limit=1000, tokens_remaining=900
)


# -- SaturationSignals --------------------------------------------------------------------------


def test_fraction_by_unit_and_window(clock: ManualClock) -> None:
    sig = SaturationSignals(clock)
    sig.update("c1", SUB)
    sig.update("c2", API)
    assert sig.fraction("c1", "percent", "5h") == 0.6
    assert sig.fraction("c1", "percent", "weekly") == 0.3
    assert sig.fraction("c1", "percent", "monthly") == 0.0
    assert sig.fraction("c1", "requests", "hourly") == 0.0
    assert sig.fraction("c2", "requests", "hourly") == pytest.approx(0.8)
    assert sig.fraction("c2", "requests", "daily") == pytest.approx(0.8)
    assert sig.fraction("c2", "tokens", "5h") == pytest.approx(0.1)
    assert sig.fraction("c2", "usd", "monthly") == 0.0
    assert sig.fraction("unknown", "percent", "5h") == 0.0


def test_ttl_expiry(clock: ManualClock) -> None:
    sig = SaturationSignals(clock, ttl_ms=30_000)
    sig.update("c1", SUB)
    clock.advance(30_000)
    assert sig.fraction("c1", "percent", "5h") == 0.6  # exactly at the ttl: still fresh
    clock.advance(1)
    assert sig.fraction("c1", "percent", "5h") == 0.0
    sig.update("c1", SUB)
    assert sig.fraction("c1", "percent", "5h") == 0.6


def test_snapshot_without_fractions_keeps_previous_reading(clock: ManualClock) -> None:
    sig = SaturationSignals(clock)
    sig.update("c1", SUB)
    sig.update("c1", RateLimitSnapshot(retry_after_ms=1))
    assert sig.fraction("c1", "percent", "5h") == 0.6


def test_for_pool_takes_the_fullest_member(clock: ManualClock) -> None:
    sig = SaturationSignals(clock)
    sig.update("a", RateLimitSnapshot(unified_5h_utilization=0.2, unified_7d_utilization=0.9))
    sig.update("b", RateLimitSnapshot(unified_5h_utilization=0.7, unified_7d_utilization=0.1))
    clock.advance(20_000)
    sig.update("c", RateLimitSnapshot(unified_5h_utilization=0.5))
    keys = ("percent/5h", "percent/weekly", "requests/hourly")
    assert sig.for_pool(("a", "b", "c", "nobody"), keys) == {
        "percent/5h": 0.7,
        "percent/weekly": 0.9,
        "requests/hourly": 0.0,
    }
    clock.advance(15_000)  # a and b expire, c is still fresh
    assert sig.for_pool(("a", "b", "c"), keys) == {
        "percent/5h": 0.5,
        "percent/weekly": 0.0,
        "requests/hourly": 0.0,
    }
    assert sig.for_pool((), keys) == dict.fromkeys(keys, 0.0)


def test_for_pool_answer_is_kept_until_a_reading_changes_or_expires(clock: ManualClock) -> None:
    """The pool's answer is given again while nothing it was built from changed; a new
    reading, a dropped connection and the oldest reading's expiry each change it at once."""
    sig = SaturationSignals(clock, ttl_ms=30_000)
    members, keys = ("a", "b"), ("percent/5h", "percent/weekly")
    sig.update("a", RateLimitSnapshot(unified_5h_utilization=0.2, unified_7d_utilization=0.9))
    clock.advance(10_000)
    sig.update("b", RateLimitSnapshot(unified_5h_utilization=0.7))
    first = sig.for_pool(members, keys)
    assert first == {"percent/5h": 0.7, "percent/weekly": 0.9}
    assert sig.for_pool(members, keys) is first  # kept: nothing changed
    sig.update("b", RateLimitSnapshot(unified_5h_utilization=0.4))  # a member's new reading
    assert sig.for_pool(members, keys) == {"percent/5h": 0.4, "percent/weekly": 0.9}
    clock.advance(20_000)  # a's reading is exactly at the ttl: still fresh
    assert sig.for_pool(members, keys) == {"percent/5h": 0.4, "percent/weekly": 0.9}
    clock.advance(1)  # a expires (nothing else changed): the kept answer must not outlive it
    assert sig.for_pool(members, keys) == {"percent/5h": 0.4, "percent/weekly": 0.0}
    sig.forget("b")
    assert sig.for_pool(members, keys) == {"percent/5h": 0.0, "percent/weekly": 0.0}
    sig.update("c", RateLimitSnapshot(unified_5h_utilization=0.99))  # not a member
    assert sig.for_pool(members, keys) == {"percent/5h": 0.0, "percent/weekly": 0.0}
    sig.update("a", RateLimitSnapshot(unified_5h_utilization=0.3))
    assert sig.for_pool(members, keys) == {"percent/5h": 0.3, "percent/weekly": 0.0}


def test_signals_memory_is_bounded(clock: ManualClock) -> None:
    sig = SaturationSignals(clock, max_connections=3)
    for c in ("a", "b", "c"):
        sig.update(c, SUB)
    sig.update("a", SUB)  # refresh a: b is now the least recently updated
    sig.update("d", SUB)
    assert sig.fraction("b", "percent", "5h") == 0.0
    assert all(sig.fraction(c, "percent", "5h") == 0.6 for c in ("a", "c", "d"))
    sig.forget("a")
    assert sig.fraction("a", "percent", "5h") == 0.0


# -- SingleFlight -------------------------------------------------------------------------------


async def test_single_flight_shares_one_call() -> None:
    flight = SingleFlight()
    calls = 0
    gate = asyncio.Event()

    async def fetch() -> int:
        nonlocal calls
        calls += 1
        await gate.wait()
        return 42

    tasks = [asyncio.create_task(flight.do("k", fetch)) for _ in range(10)]
    await asyncio.sleep(0)
    assert flight.inflight == 1
    gate.set()
    assert await asyncio.gather(*tasks) == [42] * 10
    assert calls == 1
    assert flight.inflight == 0
    # the key is free again: the next miss fetches afresh
    assert await flight.do("k", fetch) == 42
    assert calls == 2


async def test_single_flight_keys_are_independent() -> None:
    flight = SingleFlight()

    async def value(v: str) -> str:
        await asyncio.sleep(0)
        return v

    a, b = await asyncio.gather(
        flight.do("a", lambda: value("A")), flight.do("b", lambda: value("B"))
    )
    assert (a, b) == ("A", "B")


async def test_single_flight_error_reaches_every_caller() -> None:
    flight = SingleFlight()
    calls = 0

    async def boom() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        raise RuntimeError("upstream down")

    results = await asyncio.gather(
        *(flight.do("k", boom) for _ in range(5)), return_exceptions=True
    )
    assert calls == 1
    assert all(isinstance(r, RuntimeError) for r in results)
    assert flight.inflight == 0


async def test_single_flight_survives_a_cancelled_caller() -> None:
    flight = SingleFlight()
    gate = asyncio.Event()

    async def fetch() -> str:
        await gate.wait()
        return "ok"

    first = asyncio.create_task(flight.do("k", fetch))
    second = asyncio.create_task(flight.do("k", fetch))
    await asyncio.sleep(0)
    first.cancel()  # the first caller's client went away
    await asyncio.sleep(0)
    gate.set()
    assert await second == "ok"
    with pytest.raises(asyncio.CancelledError):
        await first


# -- family_of ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("claude-opus-4-1-20250805", "opus"),
        ("claude-opus-4-5", "opus"),
        ("claude-sonnet-4-20250514", "sonnet"),
        ("claude-3-5-sonnet-20241022", "sonnet"),
        ("claude-3-7-sonnet-latest", "sonnet"),
        ("anthropic/claude-haiku-4-5", "haiku"),
        ("claude-3-haiku-20240307", "haiku"),
        ("anthropic.claude-3-5-sonnet-20240620-v1:0", "sonnet"),
        ("Claude-Opus-4", "opus"),
        ("gpt-4o", "gpt-4o"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("openai/gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("o3-2025-04-16", "o3"),
        ("o3", "o3"),
        ("o4-mini", "o4-mini"),
        ("gpt-5-codex", "gpt-5-codex"),
        ("gpt-4-0613", "gpt-4"),
        ("deepseek-chat", "deepseek-chat"),
        ("kimi/kimi-k2-0905-preview", "kimi-k2-0905-preview"),
        ("", None),
        ("   ", None),
        ("openai/", None),
    ],
)
def test_family_of(model: str, family: str | None) -> None:
    assert family_of(model) == family


# -- AccountBuckets -----------------------------------------------------------------------------


def test_bucket_saturates_at_one_and_clears_when_reset_passes(clock: ManualClock) -> None:
    b = AccountBuckets(clock)
    reset = clock.now_ms() + 60_000
    b.observe("c", "5h", 0.99, reset)
    assert not b.is_saturated("c", "claude-sonnet-4")
    b.observe("c", "5h", 1.0, reset)
    assert b.is_saturated("c", "claude-sonnet-4")
    assert b.is_saturated("c", "gpt-4o")  # 5h is account-wide
    assert not b.is_saturated("other", "claude-sonnet-4")
    clock.advance(59_999)
    assert b.is_saturated("c", "claude-sonnet-4")
    clock.advance(1)
    assert not b.is_saturated("c", "claude-sonnet-4")
    assert "5h" not in b.buckets("c")  # cleared lazily on read


def test_lower_reading_clears(clock: ManualClock) -> None:
    b = AccountBuckets(clock)
    b.observe("c", "7d", 1.2, clock.now_ms() + 3_600_000)
    assert b.is_saturated("c", "x")
    b.observe("c", "7d", 0.4, clock.now_ms() + 3_600_000)
    assert not b.is_saturated("c", "x")


def test_unknown_reset_holds_until_a_lower_reading(clock: ManualClock) -> None:
    b = AccountBuckets(clock)
    b.observe("c", "5h", 1.0, None)
    clock.advance(30 * 86_400_000)
    assert b.is_saturated("c", "m")
    b.observe("c", "5h", 0.1, None)
    assert not b.is_saturated("c", "m")


def test_family_bucket_only_blocks_its_family(clock: ManualClock) -> None:
    b = AccountBuckets(clock)
    b.observe("c", "7d:opus", 1.0, clock.now_ms() + 1000)
    assert b.is_saturated("c", "claude-opus-4-1")
    assert b.is_saturated("c", "anthropic/claude-opus-4-20250514")
    assert not b.is_saturated("c", "claude-sonnet-4-5")
    clock.advance(1000)
    assert not b.is_saturated("c", "claude-opus-4-1")


def test_observe_snapshot_fills_5h_7d_and_family(clock: ManualClock) -> None:
    b = AccountBuckets(clock)
    reset = clock.now_ms() + 10_000
    snap = RateLimitSnapshot(
        unified_5h_utilization=0.5,
        unified_5h_reset_ms=reset,
        unified_7d_utilization=1.0,
        unified_7d_reset_ms=reset,
    )
    b.observe_snapshot("c", "claude-opus-4-1", snap)
    assert set(b.buckets("c")) == {"5h", "7d", "7d:opus"}
    assert b.buckets("c")["7d:opus"].used == 1.0
    assert b.is_saturated("c", "claude-sonnet-4")  # 7d is account-wide
    # a later lower 7d reading from a sonnet request clears 7d and 7d:sonnet, not 7d:opus
    b.observe_snapshot("c", "claude-sonnet-4", RateLimitSnapshot(unified_7d_utilization=0.8))
    assert not b.is_saturated("c", "claude-sonnet-4")
    assert b.is_saturated("c", "claude-opus-4-1")
    # a snapshot without unified readings changes nothing
    b.observe_snapshot("c", "claude-opus-4-1", RateLimitSnapshot(requests_limit=5))
    assert b.is_saturated("c", "claude-opus-4-1")


def test_buckets_memory_is_bounded(clock: ManualClock) -> None:
    b = AccountBuckets(clock, max_connections=2)
    b.observe("a", "5h", 1.0, None)
    b.observe("b", "5h", 1.0, None)
    b.observe("c", "5h", 1.0, None)
    assert not b.is_saturated("a", "m")  # evicted: the least recently updated connection
    assert b.is_saturated("b", "m")
    assert b.is_saturated("c", "m")
    for i in range(MAX_BUCKETS_PER_CONNECTION + 10):
        b.observe("c", f"7d:family-{i}", 0.5, None)
    assert len(b.buckets("c")) == MAX_BUCKETS_PER_CONNECTION
    assert b.is_saturated("c", "m")  # family churn never evicts the account-wide buckets
    assert "7d:family-0" not in b.buckets("c")
    assert "7d:family-41" in b.buckets("c")
    b.forget("c")
    assert b.buckets("c") == {}


def test_openai_request_and_token_limits_saturate_the_models_family(clock: ManualClock) -> None:
    """OpenAI's documented headers: limits, remaining, and resets as Go durations."""
    from fairgate.domain.readings import parse_rate_limit_headers

    b = AccountBuckets(clock)
    now = clock.now_ms()
    headers = {
        "x-ratelimit-limit-requests": "500",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "20ms",
        "x-ratelimit-limit-tokens": "30000",
        "x-ratelimit-remaining-tokens": "29000",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    snap = parse_rate_limit_headers(headers, now)
    assert snap is not None
    b.observe_snapshot("c", "gpt-4o-2024-08-06", snap)
    assert b.buckets("c")["requests:gpt-4o"] == BucketState(1.0, now + 20, now)
    assert b.buckets("c")["tokens:gpt-4o"].reset_ms == now + 360_000
    assert b.buckets("c")["tokens:gpt-4o"].used == pytest.approx(1 / 30)
    assert b.is_saturated("c", "gpt-4o")
    assert not b.is_saturated("c", "gpt-4o-mini")  # limits are per model at OpenAI
    clock.advance(20)  # the request limit's reset passed
    assert not b.is_saturated("c", "gpt-4o")

    # the token limit runs out: saturated for the stated 6m0s, not a millisecond less
    headers |= {"x-ratelimit-remaining-requests": "499", "x-ratelimit-remaining-tokens": "0"}
    snap = parse_rate_limit_headers(headers, clock.now_ms())
    assert snap is not None
    b.observe_snapshot("c", "gpt-4o", snap)
    clock.advance(359_999)
    assert b.is_saturated("c", "gpt-4o")
    clock.advance(1)
    assert not b.is_saturated("c", "gpt-4o")


def test_anthropic_split_token_limits_use_the_fullest_and_its_reset(clock: ManualClock) -> None:
    b = AccountBuckets(clock)
    snap = RateLimitSnapshot(
        input_tokens_limit=100,
        input_tokens_remaining=50,
        input_tokens_reset_ms=clock.now_ms() + 5,
        output_tokens_limit=10,
        output_tokens_remaining=0,
        output_tokens_reset_ms=clock.now_ms() + 7,
    )
    b.observe_snapshot("c", "claude-sonnet-4-5", snap)
    state = b.buckets("c")["tokens:sonnet"]
    assert (state.used, state.reset_ms) == (1.0, clock.now_ms() + 7)
    assert b.is_saturated("c", "claude-sonnet-4-5")


def test_only_a_usage_limit_code_saturates_the_limit_bucket(clock: ManualClock) -> None:
    """Codex's 429 body (as the Codex CLI parses it) saturates ``limit`` until ``resets_at``;
    a 429 whose quota reading came from its text, with a Retry-After, does not."""
    import orjson

    from fairgate.path.provider_signals import ProviderSignals
    from fairgate.resilience.classify import classify

    sig = ProviderSignals(clock)
    now = clock.now_ms()
    body = {
        "error": {
            "type": "usage_limit_reached",
            "message": "The usage limit has been reached",
            "plan_type": "plus",
            "resets_at": now // 1000 + 3 * 86_400,
        }
    }
    sig.refused("c", "gpt-5-codex", classify(429, orjson.dumps(body), {}, now_ms=now))
    assert sig.buckets.buckets("c")["limit"].reset_ms == now + 3 * 86_400_000
    assert sig.buckets.is_saturated("c", "any-model")  # the account, not a model
    echo = {"error": {"message": "daily quota exceeded", "type": "rate_limit_error"}}
    cls = classify(429, orjson.dumps(echo), {"retry-after": "60"}, now_ms=now)
    sig.refused("d", "m", cls)
    assert sig.buckets.buckets("d") == {}
    clock.advance(3 * 86_400_000)
    assert not sig.buckets.is_saturated("c", "any-model")
