"""The provider circuit breaker with an injected clock (fairgate.resilience.breaker)."""

from __future__ import annotations

import asyncio

import pytest

from fairgate.clock import ManualClock
from fairgate.domain.breaker import BreakerState
from fairgate.resilience.breaker import BreakerConfig, BreakerRecord, CircuitBreaker

S = 1_000


def feed(br: CircuitBreaker, clock: ManualClock, outcomes: str, step_ms: int = 100) -> None:
    """'o' = success, 'x' = provider failure, '-' = non-provider failure."""
    for ch in outcomes:
        if ch == "o":
            br.record(True)
        elif ch == "x":
            br.record(False)
        else:
            br.record(False, provider_failure=False)
        clock.advance(step_ms)


def test_starts_closed_and_admits(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    assert br.state() is BreakerState.CLOSED
    assert br.try_acquire()


def test_worked_example_of_the_module_docstring(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    feed(br, clock, "oxox", step_ms=S)  # t = 0..3: 2 ok, 2 failures, only 4 requests
    assert br.state() is BreakerState.CLOSED
    assert br.record(False) is BreakerState.OPEN  # t = 4: 3/5 = 60 %
    assert br.open_until_ms == clock.now_ms() + 30 * S
    clock.advance(6 * S)  # t = 10
    assert not br.try_acquire()
    clock.advance(24 * S)  # t = 34
    assert br.state() is BreakerState.HALF_OPEN
    assert br.try_acquire()
    clock.advance(S)  # t = 35: the probe fails
    assert br.record(False) is BreakerState.OPEN
    assert br.open_until_ms == clock.now_ms() + 60 * S
    clock.advance(60 * S)  # t = 95
    assert br.try_acquire()
    assert br.record(True) is BreakerState.CLOSED
    assert br.cooldown_ms == 30 * S


def test_does_not_open_below_min_requests(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    feed(br, clock, "xxxx")
    assert br.state() is BreakerState.CLOSED
    assert br.counts() == (4, 4)
    assert br.record(False) is BreakerState.OPEN


def test_opens_at_exactly_half(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    feed(br, clock, "ooox")
    assert br.record(False) is None  # 2/5 = 40 %
    assert br.record(False) is BreakerState.OPEN  # 3/6 = 50 %
    assert br.state() is BreakerState.OPEN
    assert not br.try_acquire()


def test_successes_never_open(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    feed(br, clock, "o" * 100)
    assert br.state() is BreakerState.CLOSED


def test_only_provider_failures_count(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    feed(br, clock, "-" * 20)
    assert br.counts() == (0, 0)
    assert br.state() is BreakerState.CLOSED


def test_window_slides(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    feed(br, clock, "xxxx")
    clock.advance(60 * S)  # the four failures leave the window
    assert br.counts() == (0, 0)
    assert br.record(False) is None
    assert br.state() is BreakerState.CLOSED


def test_window_keeps_recent_buckets_only(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    feed(br, clock, "xx", step_ms=0)
    clock.advance(30 * S)
    feed(br, clock, "xx", step_ms=0)
    assert br.counts() == (4, 4)
    clock.advance(30 * S)  # the first two are now 60 s old: gone
    assert br.counts() == (2, 2)


def test_window_memory_is_bounded(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    for _ in range(10_000):
        br.record(True)
        clock.advance(7)
    assert len(br._ok) == 60  # one slot per second of the window, whatever the traffic


def open_breaker(br: CircuitBreaker, clock: ManualClock) -> None:
    feed(br, clock, "xxxxx", step_ms=0)
    assert br.state() is BreakerState.OPEN


def test_half_open_after_cooldown(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    open_breaker(br, clock)
    assert br.open_until_ms == clock.now_ms() + 30 * S
    clock.advance(30 * S - 1)
    assert br.state() is BreakerState.OPEN
    clock.advance(1)
    assert br.state() is BreakerState.HALF_OPEN


async def test_half_open_grants_exactly_one_probe_to_50_concurrent_callers(
    clock: ManualClock,
) -> None:
    br = CircuitBreaker(clock)
    open_breaker(br, clock)
    clock.advance(30 * S)

    async def caller() -> bool:
        await asyncio.sleep(0)
        return br.try_acquire()

    granted = await asyncio.gather(*(caller() for _ in range(50)))
    assert granted.count(True) == 1
    assert br.probe_in_flight()


def test_probe_success_closes_and_clears_the_window(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    open_breaker(br, clock)
    clock.advance(30 * S)
    assert br.try_acquire()
    assert br.record(True) is BreakerState.CLOSED
    assert br.state() is BreakerState.CLOSED
    assert br.counts() == (0, 0)
    assert br.try_acquire()
    assert br.cooldown_ms == 30 * S


def test_probe_failure_reopens_longer_then_caps(clock: ManualClock) -> None:
    cfg = BreakerConfig(cooldown_ms=30 * S, max_cooldown_ms=100 * S)
    br = CircuitBreaker(clock, cfg)
    open_breaker(br, clock)
    expected = [60 * S, 100 * S, 100 * S]
    for cooldown in expected:
        clock.advance(br.cooldown_ms)
        assert br.state() is BreakerState.HALF_OPEN
        assert br.try_acquire()
        assert br.record(False) is BreakerState.OPEN
        assert br.open_until_ms == clock.now_ms() + cooldown
        assert not br.try_acquire()
    clock.advance(br.cooldown_ms)
    assert br.try_acquire()
    br.record(True)
    assert br.cooldown_ms == 30 * S  # back to base once closed


def test_released_probe_can_be_taken_again(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    open_breaker(br, clock)
    clock.advance(30 * S)
    assert br.try_acquire()
    assert not br.try_acquire()
    br.release_probe()
    assert br.try_acquire()


def test_probe_lease_expires(clock: ManualClock) -> None:
    br = CircuitBreaker(clock, BreakerConfig(probe_lease_ms=10 * S))
    open_breaker(br, clock)
    clock.advance(30 * S)
    assert br.try_acquire()
    clock.advance(10 * S - 1)
    assert not br.try_acquire()
    clock.advance(1)
    assert br.try_acquire()


def test_outcomes_while_open_do_not_change_state(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    open_breaker(br, clock)
    assert br.record(True) is None
    assert br.record(False) is None
    assert br.state() is BreakerState.OPEN


def test_custom_threshold_and_min_requests(clock: ManualClock) -> None:
    br = CircuitBreaker(clock, BreakerConfig(threshold=0.9, min_requests=10))
    feed(br, clock, "o" + "x" * 8, step_ms=0)
    assert br.state() is BreakerState.CLOSED
    assert br.record(False) is BreakerState.OPEN  # 9/10


def test_export_and_adopt_share_transitions(clock: ManualClock) -> None:
    a = CircuitBreaker(clock)
    b = CircuitBreaker(clock)
    clock.advance(1)
    open_breaker(a, clock)
    assert b.adopt(a.export())
    assert b.state() is BreakerState.OPEN
    assert b.open_until_ms == a.open_until_ms
    assert not b.adopt(a.export())  # not newer
    clock.advance(30 * S)
    assert a.try_acquire()
    a.record(True)
    assert b.adopt(a.export())
    assert b.state() is BreakerState.CLOSED


def test_adopt_ignores_older_records(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    clock.advance(10)
    open_breaker(br, clock)
    old = BreakerRecord("closed", 0, 30 * S, 1)
    assert not br.adopt(old)
    assert br.state() is BreakerState.OPEN


def test_record_roundtrip() -> None:
    rec = BreakerRecord("open", 5, 30_000, 4)
    assert BreakerRecord.from_dict(rec.to_dict()) == rec


def test_snapshot(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    feed(br, clock, "ooxxx", step_ms=0)
    snap = br.snapshot()
    assert snap["state"] == "open"
    assert snap["remaining_ms"] == 30 * S
    assert snap["requests"] == 5
    assert snap["failures"] == 3
    assert snap["failure_rate"] == pytest.approx(0.6)
    assert snap["probe_in_flight"] is False


def test_reset_closes(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    open_breaker(br, clock)
    br.reset()
    assert br.state() is BreakerState.CLOSED


def test_reconfigure_keeps_state(clock: ManualClock) -> None:
    br = CircuitBreaker(clock)
    open_breaker(br, clock)
    br.reconfigure(BreakerConfig(cooldown_ms=5 * S))
    assert br.state() is BreakerState.OPEN


@pytest.mark.parametrize(
    "kwargs",
    [
        {"threshold": 0},
        {"threshold": 1.5},
        {"min_requests": 0},
        {"cooldown_ms": 10, "max_cooldown_ms": 5},
    ],
)
def test_invalid_config(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"must|need"):
        BreakerConfig(**kwargs)  # type: ignore[arg-type]


def test_a_failure_that_may_not_open_is_counted_but_opens_nothing(clock: ManualClock) -> None:
    br = CircuitBreaker(clock, BreakerConfig(min_requests=2))
    for _ in range(5):
        assert br.record(False, may_open=False) is None
    assert br.state() is BreakerState.CLOSED
    assert br.counts() == (5, 5)
    assert br.record(False) is BreakerState.OPEN  # the window's evidence counts once allowed


def test_a_half_open_probe_failing_without_permission_gives_the_probe_back(
    clock: ManualClock,
) -> None:
    br = CircuitBreaker(clock, BreakerConfig(min_requests=1, cooldown_ms=1_000))
    assert br.record(False) is BreakerState.OPEN
    clock.advance(1_000)
    assert br.try_acquire()
    assert br.record(False, may_open=False) is None
    assert br.state() is BreakerState.HALF_OPEN
    assert br.try_acquire()  # the next request may probe
