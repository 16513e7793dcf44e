"""The RateLimitManager facade end to end, on the memory store, with a ManualClock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fairgate.clock import ManualClock
from fairgate.domain.breaker import BreakerState
from fairgate.resilience.backoff import Cooldown
from fairgate.resilience.classify import ClientDisconnected, FailureClass, classify
from fairgate.resilience.manager import (
    Exclusion,
    RateLimitManager,
    all_rate_limited,
    earliest_free,
    retry_after_seconds,
)
from fairgate.resilience.settings import ResilienceSettings
from fairgate.resilience.state import NO_STATE, MemoryResilienceStore, TargetState

S = 1_000
#: OpenAI's structured 404 for a model the account does not serve. A bare 404 (no documented
#: identifier) is the request's fault since issue 43, N6, and locks nothing.
MODEL_NOT_FOUND = {
    "error": {
        "message": "The model `gpt-9` does not exist or you do not have access to it.",
        "type": "invalid_request_error",
        "param": None,
        "code": "model_not_found",
    }
}
P, C, M = "openai", "c1", "gpt-4o"


@pytest.fixture
def mgr(clock: ManualClock) -> RateLimitManager:
    return RateLimitManager(clock=clock)


async def excluded_for(mgr: RateLimitManager, clock: ManualClock) -> int:
    """How long from now the target P/C/M stays excluded (it must be)."""
    excl = await mgr.check(P, C, M)
    assert excl is not None
    assert excl.until_ms is not None
    return excl.until_ms - clock.now_ms()


async def fail(
    mgr: RateLimitManager,
    clock: ManualClock,
    status: int | None,
    body: Any = None,
    headers: dict[str, str] | None = None,
    *,
    conn: str = C,
    model: str = M,
    auth: str = "apikey",
    provider: str = P,
    exception: BaseException | None = None,
) -> None:
    c = classify(status, body, headers, exception=exception, model=model, now_ms=clock.now_ms())
    await mgr.on_failure(provider, conn, model, auth, c)


async def fail_on_each(
    mgr: RateLimitManager,
    clock: ManualClock,
    status: int | None,
    *,
    n: int = 5,
    prefix: str = "c",
    **kw: Any,
) -> None:
    """One failure (``status``, no body) on each of ``n`` connections ``c0``, ``c1``, …: the
    provider's breaker sees ``n`` failures, no connection more than one."""
    for i in range(n):
        await fail(mgr, clock, status, None, conn=f"{prefix}{i}", **kw)


async def test_fresh_target_is_admitted(mgr: RateLimitManager) -> None:
    assert await mgr.check(P, C, M) is None


async def test_429_with_retry_after_20_cools_the_connection_20s(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    t0 = clock.now_ms()
    await fail(mgr, clock, 429, "Too Many Requests", {"retry-after": "20"})
    excl = await mgr.check(P, C, M)
    assert excl == Exclusion("cooldown", t0 + 20 * S, True, "rate_limit")
    assert await mgr.check(P, C, "gpt-4o-mini") is not None  # the whole connection
    assert await mgr.check(P, "c2", M) is None  # not the other connection
    clock.advance(20 * S - 1)
    assert await mgr.check(P, C, M) is not None
    clock.advance(1)
    assert await mgr.check(P, C, M) is None


async def test_storm_grows_the_backoff_and_success_resets_it(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    seen = []
    for _ in range(5):
        await fail(mgr, clock, 429, "Too Many Requests")
        seen.append(await excluded_for(mgr, clock))
        clock.advance(seen[-1])
        assert await mgr.check(P, C, M) is None
    assert seen == [3 * S, 6 * S, 12 * S, 24 * S, 48 * S]
    await mgr.on_success(P, C, M)
    await fail(mgr, clock, 429, "Too Many Requests")
    assert await excluded_for(mgr, clock) == 3 * S


async def test_oauth_backoff_starts_at_5s(mgr: RateLimitManager, clock: ManualClock) -> None:
    await fail(mgr, clock, 429, None, auth="oauth")
    assert await excluded_for(mgr, clock) == 5 * S


async def test_in_flight_failures_during_a_cooldown_do_not_climb(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    for _ in range(10):  # ten requests sent before the first 429 came back
        await fail(mgr, clock, 429, None)
    cd = await mgr.store.get_cooldown(C)
    assert cd == Cooldown(clock.now_ms() + 3 * S, 0, "rate_limit")


async def test_hint_never_shortens_a_running_cooldown(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    await fail(mgr, clock, 429, None, {"retry-after": "60"})
    await fail(mgr, clock, 429, None, {"retry-after": "1"})
    assert await excluded_for(mgr, clock) == 60 * S


async def test_success_during_a_cooldown_does_not_cut_it_short(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    await fail(mgr, clock, 429, None, {"retry-after": "30"})
    await mgr.check(P, C, M)
    await mgr.on_success(P, C, M)  # a request sent before the 429
    assert await mgr.check(P, C, M) is not None


async def test_model_scoped_429_locks_only_that_model(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    body = (
        b'{"error":{"message":"Rate limit reached for gpt-4o in organization org-1 on tokens '
        b'per min (TPM): Limit 30000, Used 30000, Requested 10. Please try again in 2s.",'
        b'"type":"tokens","code":"rate_limit_exceeded"}}'
    )
    await fail(mgr, clock, 429, body)
    excl = await mgr.check(P, C, M)
    assert excl == Exclusion("lockout", clock.now_ms() + 2 * S, True, "rate_limit")
    assert await mgr.check(P, C, "gpt-4o-mini") is None
    assert await mgr.store.get_cooldown(C) is None


async def test_quota_temporary_model_scoped_gemini(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    body = {
        "error": {
            "code": 429,
            "message": "Quota exceeded for quota metric 'requests per minute', model: gemini-x",
            "status": "RESOURCE_EXHAUSTED",
        }
    }
    await fail(mgr, clock, 429, body, model="gemini-x", provider="gemini")
    excl = await mgr.check("gemini", C, "gemini-x")
    assert excl is not None
    assert excl.reason == "lockout"
    assert excl.rate_limit


async def test_permanent_block_is_only_cleared_by_clear(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    body = (
        b'{"error":{"message":"You exceeded your current quota, please check your plan and '
        b'billing details.","type":"insufficient_quota","code":"insufficient_quota"}}'
    )
    await fail(mgr, clock, 429, body)
    excl = await mgr.check(P, C, M)
    assert excl is not None
    assert excl.reason == "permanent"
    assert excl.until_ms is None
    assert not excl.rate_limit
    clock.advance(40 * 86_400_000)
    await mgr.on_success(P, C, M)
    assert (await mgr.check(P, C, "other-model")) is not None
    assert await mgr.clear("permanent", connection_id=C)
    assert await mgr.check(P, C, M) is None
    assert not await mgr.clear("permanent", connection_id=C)


async def test_headers_remaining_zero_block_until_reset_then_free_lazily(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    headers = {
        "x-ratelimit-limit-requests": "100",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "45s",
    }
    await mgr.on_success(P, C, M, headers)
    excl = await mgr.check(P, C, M)
    assert excl == Exclusion("rate_limited", clock.now_ms() + 45 * S, True, "rate_limited")
    assert await mgr.check(P, C, "gpt-4o-mini") is None
    clock.advance(45 * S)
    assert await mgr.check(P, C, M) is None


async def test_low_remaining_is_a_soft_warning(mgr: RateLimitManager, clock: ManualClock) -> None:
    low = {
        "x-ratelimit-limit-tokens": "10000",
        "x-ratelimit-remaining-tokens": "900",
        "x-ratelimit-reset-tokens": "20s",
    }
    await mgr.on_success(P, C, M, low)
    assert await mgr.check(P, C, M) is None  # soft: still admitted
    [w] = mgr.warnings(C)
    assert (w.dimension, w.remaining, w.limit) == ("tokens", 900, 10_000)
    assert w.reset_ms == clock.now_ms() + 20 * S
    snap = await mgr.snapshot()
    assert snap["warnings"][0]["dimension"] == "tokens"
    high = {**low, "x-ratelimit-remaining-tokens": "5000"}
    await mgr.on_success(P, C, M, high)
    assert mgr.warnings(C) == []
    await mgr.on_success(P, C, M, low)
    clock.advance(20 * S)
    assert mgr.warnings(C) == []  # expired at the reset


async def test_client_disconnect_and_bad_request_change_nothing(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    await fail(mgr, clock, 429, None, conn="c0")
    assert await mgr.check(P, C, M) is None
    before = await mgr.snapshot()
    for _ in range(20):
        await fail(mgr, clock, None, None, exception=ClientDisconnected())
        await fail(mgr, clock, None, None, exception=asyncio.CancelledError())
        await fail(mgr, clock, 400, b'{"error":{"message":"Invalid value for temperature"}}')
        await fail(mgr, clock, 400, b'{"error":{"message":"prompt is too long"}}')
    assert await mgr.check(P, C, M) is None
    assert await mgr.snapshot() == before
    assert mgr.breaker(P).counts() == (0, 0)


async def test_server_errors_cool_the_connection_and_open_the_breaker(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    await fail_on_each(mgr, clock, 500)
    assert mgr.breaker(P).state() is BreakerState.OPEN
    excl = await mgr.check(P, "fresh", M)
    assert excl == Exclusion("breaker_open", clock.now_ms() + 30 * S, False, "circuit open")
    assert await mgr.check("anthropic", "fresh", M) is None
    assert not all_rate_limited([excl])


async def test_half_open_admits_one_probe_of_50_and_closes_on_success(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    await fail_on_each(mgr, clock, None, exception=TimeoutError())
    clock.advance(30 * S)
    results = await asyncio.gather(*(mgr.check(P, f"n{i}", M) for i in range(50)))
    assert sum(r is None for r in results) == 1
    blocked = [r for r in results if r is not None]
    assert all(r.reason == "breaker_open" for r in blocked)
    await mgr.on_success(P, "n0", M)
    assert mgr.breaker(P).state() is BreakerState.CLOSED
    assert await mgr.check(P, "n1", M) is None


async def test_probe_failure_reopens_longer(mgr: RateLimitManager, clock: ManualClock) -> None:
    await fail_on_each(mgr, clock, 503)
    clock.advance(30 * S)
    assert await mgr.check(P, "n", M) is None
    await fail(mgr, clock, 503, None, conn="n")
    excl = await mgr.check(P, "m", M)
    assert excl is not None
    assert excl.until_ms == clock.now_ms() + 60 * S


async def test_disconnected_probe_gives_the_token_back(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    await fail_on_each(mgr, clock, 500)
    clock.advance(30 * S)
    assert await mgr.check(P, "n", M) is None
    assert await mgr.check(P, "m", M) is not None
    await fail(mgr, clock, None, None, conn="n", exception=ClientDisconnected())
    assert mgr.breaker(P).state() is BreakerState.HALF_OPEN
    assert await mgr.check(P, "m", M) is None


async def test_rate_limits_do_not_feed_the_breaker_by_default(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    await fail_on_each(mgr, clock, 429, n=10)
    assert mgr.breaker(P).state() is BreakerState.CLOSED


async def test_rate_limits_feed_the_breaker_when_configured(clock: ManualClock) -> None:
    mgr = RateLimitManager(
        clock=clock, settings=ResilienceSettings(breaker_counts_rate_limits=True)
    )
    await fail_on_each(mgr, clock, 429)
    assert mgr.breaker(P).state() is BreakerState.OPEN


async def test_auth_failure_cools_down_long(mgr: RateLimitManager, clock: ManualClock) -> None:
    await fail(mgr, clock, 401, b'{"error":{"message":"Incorrect API key provided"}}')
    excl = await mgr.check(P, C, M)
    assert excl == Exclusion("cooldown", clock.now_ms() + 300 * S, False, "auth")
    assert mgr.breaker(P).counts() == (0, 0)


async def test_model_not_found_locks_that_model(mgr: RateLimitManager, clock: ManualClock) -> None:
    await fail(mgr, clock, 404, MODEL_NOT_FOUND, model="gpt-9")
    excl = await mgr.check(P, C, "gpt-9")
    assert excl == Exclusion("lockout", clock.now_ms() + 300 * S, False, "model_not_found")
    assert await mgr.check(P, C, M) is None


async def test_our_own_bug_is_not_held_against_the_provider(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    for _ in range(10):
        await fail(mgr, clock, None, None, exception=KeyError("oops"))
    assert await mgr.check(P, C, M) is None
    assert mgr.breaker(P).counts() == (0, 0)


async def test_exclusion_that_ends_last_is_reported(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    await fail(mgr, clock, 429, None, {"retry-after": "10"})
    await mgr.on_success(
        P, C, M, {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "90s"}
    )
    excl = await mgr.check(P, C, M)
    assert excl is not None
    assert excl.reason == "rate_limited"
    assert excl.until_ms == clock.now_ms() + 90 * S


async def test_clear_cooldown_lockout_and_breaker(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    await fail(mgr, clock, 429, None)
    assert await mgr.clear("cooldown", connection_id=C)
    assert await mgr.check(P, C, M) is None
    await fail(mgr, clock, 404, MODEL_NOT_FOUND)
    assert await mgr.clear("lockout", provider=P, connection_id=C, model=M)
    assert await mgr.check(P, C, M) is None
    await fail_on_each(mgr, clock, 500)
    assert await mgr.clear("breaker", provider=P)
    assert await mgr.check(P, "z", M) is None
    with pytest.raises(ValueError, match="connection_id"):
        await mgr.clear("cooldown")


async def test_snapshot_shape(mgr: RateLimitManager, clock: ManualClock) -> None:
    await fail(mgr, clock, 429, None, {"retry-after": "20"})
    await fail(mgr, clock, 404, MODEL_NOT_FOUND, model="gpt-9")
    await fail(mgr, clock, 402, None, conn="c9")
    await fail_on_each(mgr, clock, 500, prefix="s", provider="anthropic")
    clock.advance(5 * S)
    snap = await mgr.snapshot()
    assert snap["store"] == {"driver": "memory", "ok": True, "errors": 0}
    assert snap["breakers"]["anthropic"]["state"] == "open"
    assert snap["breakers"]["anthropic"]["remaining_ms"] == 25 * S
    [cd] = [c for c in snap["cooldowns"] if c["connection_id"] == C]
    assert cd["remaining_ms"] == 15 * S
    assert cd["reason"] == "rate_limit"
    [lk] = snap["lockouts"]
    assert (lk["model"], lk["remaining_ms"]) == ("gpt-9", 295 * S)
    [perm] = snap["permanent"]
    assert perm["scope"] == "conn:c9"


def test_earliest_free_and_all_rate_limited() -> None:
    a = Exclusion("cooldown", 5_000, True)
    b = Exclusion("rate_limited", 3_000, True)
    p = Exclusion("permanent", None, False)
    br = Exclusion("breaker_open", 9_000, False)
    assert earliest_free([a, b, p]) == 3_000
    assert earliest_free([p]) is None
    assert earliest_free([]) is None
    assert earliest_free([None, a]) == 5_000
    assert all_rate_limited([a, b])
    assert not all_rate_limited([a, br])
    assert not all_rate_limited([])
    assert retry_after_seconds([a, b], 1_001) == 2
    assert retry_after_seconds([Exclusion("cooldown", 1_000, True)], 1_000) == 1
    assert retry_after_seconds([p], 0) is None
    assert a.to_dict(4_000)["retry_after_ms"] == 1_000


async def test_two_managers_on_one_store_share_the_breaker_and_its_probe(
    clock: ManualClock,
) -> None:
    store = MemoryResilienceStore(clock=clock)
    a = RateLimitManager(store, clock=clock)
    b = RateLimitManager(store, clock=clock)
    await fail_on_each(a, clock, 500)
    clock.advance(1)
    excl = await b.check(P, "fresh", M)
    assert excl is not None
    assert excl.reason == "breaker_open"
    clock.advance(30 * S)
    results = await asyncio.gather(*(m.check(P, f"n{i}", M) for i in range(25) for m in (a, b)))
    assert sum(r is None for r in results) == 1
    await b.on_success(P, "n0", M)
    clock.advance(1)
    assert await a.check(P, "x", M) is None
    assert a.breaker(P).state() is BreakerState.CLOSED


class BrokenStore(MemoryResilienceStore):
    async def read_target(self, provider: str, conn_id: str, model: str) -> TargetState:
        raise ConnectionError("redis is down")

    async def set_cooldown(self, conn_id: str, until_ms: int, level: int, reason: str) -> Any:
        raise ConnectionError("redis is down")

    async def ping(self) -> bool:
        return False


async def test_store_outage_fails_open_and_is_visible(clock: ManualClock) -> None:
    mgr = RateLimitManager(BrokenStore(clock=clock), clock=clock)
    await fail(mgr, clock, 429, None)
    assert await mgr.check(P, C, M) is None
    snap = await mgr.snapshot()
    assert snap["store"]["ok"] is False
    assert snap["store"]["errors"] == 2


async def test_per_provider_settings(clock: ManualClock) -> None:
    settings = ResilienceSettings(providers={"anthropic": {"apikey_base_cooldown_ms": 1_000}})
    mgr = RateLimitManager(clock=clock, settings=settings)
    await fail(mgr, clock, 429, None, provider="anthropic")
    excl = await mgr.check("anthropic", C, M)
    assert excl is not None
    assert excl.until_ms == clock.now_ms() + 1_000


async def test_update_settings_reconfigures_breakers(
    mgr: RateLimitManager, clock: ManualClock
) -> None:
    mgr.breaker(P)
    mgr.update_settings(ResilienceSettings(breaker_min_requests=2))
    await fail(mgr, clock, 500, None, conn="a")
    await fail(mgr, clock, 500, None, conn="b")
    assert mgr.breaker(P).state() is BreakerState.OPEN


def test_failure_class_values_are_stable() -> None:
    assert [c.value for c in FailureClass] == [
        "rate_limit",
        "quota_temporary",
        "quota_permanent",
        "auth",
        "model_not_found",
        "context_overflow",
        "server_error",
        "timeout",
        "client_disconnect",
        "bad_request",
        "ok",
    ]


async def test_a_store_that_remembers_nothing_answers_with_the_empty_state_itself(
    clock: ManualClock,
) -> None:
    store = MemoryResilienceStore(clock=clock)
    assert store.read_target_now(P, C, M) is NO_STATE
    assert await store.read_target(P, C, M) is NO_STATE
    await store.set_cooldown("c2", clock.now_ms() + 5 * S, 1, "rate_limit")
    other = store.read_target_now(P, C, M)
    assert other == NO_STATE
    assert other is not NO_STATE  # something is remembered: looked up, found nothing here
    assert store.read_target_now(P, "c2", M).cooldown is not None


async def test_a_breaker_open_in_this_process_excludes_with_nothing_in_the_store(
    clock: ManualClock,
) -> None:
    store = MemoryResilienceStore(clock=clock)
    mgr = RateLimitManager(store, clock=clock)
    br = mgr.breaker(P)
    while br.record(False) is None:  # trip it here, without telling the store
        pass
    assert store.read_target_now(P, C, M) is NO_STATE
    excl = await mgr.check(P, C, M)
    assert excl is not None
    assert excl.reason == "breaker_open"


async def test_a_success_with_nothing_tracked_resets_no_level(mgr: RateLimitManager) -> None:
    await mgr.on_success(P, C, M)
    assert await mgr.check(P, C, M) is None
    assert mgr.breaker(P).state() is BreakerState.CLOSED
