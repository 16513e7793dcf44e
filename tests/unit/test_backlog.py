"""Backlogged keys (issue 17): refused without a break since before the current window began."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fairgate.quota.backlog import (
    FAST_FACTOR,
    FAST_HOLD_MS,
    GAP_FACTOR,
    MIN_GAP_MS,
    Streak,
    backlogged,
    refused,
)

MIN = 60_000
HOUR = 60 * MIN
IDLE = 15 * MIN  # the pool's active window
T = 1_700_002_800_000  # hour-aligned: 10:00 in the worked example


def _run(times: list[int], hold: int = MIN) -> Streak:
    run: Streak | None = None
    for t in times:
        run = refused(run, t, hold, IDLE)
    assert run is not None
    return run


def test_worked_example_a_batch_key_is_backlogged_a_burst_is_not() -> None:
    # the batch key: refused every 30 s since 09:40
    batch = _run([T - 20 * MIN + i * 30_000 for i in range(81)])  # up to 10:20
    # the light key: refused from 10:02 to 10:05 while its burst waited, and at 10:20
    light = _run([T + 2 * MIN + i * 30_000 for i in range(7)])
    assert light.first_ms == T + 2 * MIN
    light = refused(light, T + 20 * MIN, MIN, IDLE)
    assert light.first_ms == T + 20 * MIN  # its run broke at about 10:06
    now = T + 20 * MIN
    runs = {"batch": batch, "light": light}
    assert backlogged(runs, now, [("requests/hourly", T)]) == {
        "batch": frozenset({"requests/hourly"})
    }


def test_admissions_between_refusals_do_not_break_a_run() -> None:
    # a greedy key gets a slot now and then between refusals: only refusals make its run
    run = _run([T + i * 40_000 for i in range(100)])
    assert run.first_ms == T
    assert run.until_ms >= run.last_ms + MIN_GAP_MS


def test_a_run_breaks_after_its_gap_and_a_new_one_starts() -> None:
    run = _run([T, T + 30_000])
    later = refused(run, run.until_ms + 1, MIN, IDLE)
    assert later.first_ms == run.until_ms + 1


def test_the_gap_follows_the_clients_rhythm() -> None:
    """A client that polls every five minutes keeps asking: its run survives its rhythm."""
    run = _run([T + i * 5 * MIN for i in range(6)])
    # the first pause broke the run, and taught it the rhythm: the next ones do not
    assert run.first_ms == T + 5 * MIN
    assert run.until_ms - run.last_ms >= 5 * MIN


def test_a_long_retry_after_holds_the_run() -> None:
    run = refused(None, T, 10 * MIN, IDLE)
    assert run.until_ms == T + 10 * MIN
    assert refused(run, T + 9 * MIN, MIN, IDLE).first_ms == T


def test_a_pause_longer_than_the_active_window_does_not_enter_the_gap() -> None:
    run = _run([T, T + 30_000, T + 60_000])
    gap = run.gap_ms
    after = refused(run, T + 2 * HOUR, MIN, IDLE)
    assert after.gap_ms == gap
    assert after.first_ms == T + 2 * HOUR


def test_a_run_that_began_after_the_window_did_is_not_backlogged() -> None:
    run = _run([T + MIN, T + 2 * MIN])
    windows = [("requests/hourly", T), ("tokens/5h", T - 2 * HOUR)]
    assert backlogged({"k": run}, T + 2 * MIN, windows) == {}
    old = _run([T - MIN + i * 30_000 for i in range(7)])
    # begun before the hour did, after the 5-hour window did: backlogged in the hour only
    assert backlogged({"k": old}, T + 2 * MIN, windows) == {"k": frozenset({"requests/hourly"})}


def test_a_dead_run_is_not_backlogged() -> None:
    run = _run([T - 10 * MIN, T - 9 * MIN])
    assert backlogged({"k": run}, run.until_ms + 1, [("requests/hourly", T)]) == {}


@given(st.lists(st.integers(min_value=0, max_value=20 * MIN), min_size=1, max_size=40))
def test_a_run_never_begins_after_its_last_refusal_and_lasts_a_minute_at_least(
    gaps: list[int],
) -> None:
    t, run = T, None
    for g in gaps:
        t += g
        run = refused(run, t, 0, IDLE)
        assert run.first_ms <= run.last_ms == t
        assert run.until_ms - t >= MIN_GAP_MS
        assert run.until_ms - t >= round(GAP_FACTOR * run.gap_ms) - 1


def test_a_burst_of_refusals_is_one_attempt_not_a_rhythm() -> None:
    """A client that sends 30 concurrent requests every five minutes, refused at the same
    instant: its usual gap is the five minutes, so its run outlives the wait to its next
    burst. Averaged in, the burst's zero gaps would take the gap to nothing and break the run
    a minute after each burst."""
    times = [T + poll * 5 * MIN + i for poll in range(4) for i in range(30)]
    run = _run(times)
    # the first wait is not known yet (the run breaks once); from the second burst on, one run
    assert run.first_ms == T + 5 * MIN
    assert run.gap_ms > 2 * MIN
    assert run.until_ms > times[-1] + 5 * MIN


def test_a_client_that_retries_long_before_its_retry_after_is_held_by_its_own_pace() -> None:
    """Refused every 30 s and told to come back in 20 minutes, a key stops asking (its queue
    ran dry) and asks again 3 minutes later. Held by the Retry-After its run outlived the
    pause, so its new requests were judged on its sliding count as a backlogged key's; held by
    its own pace (at most FAST_HOLD_MS), the pause ends the run and the new refusal starts
    another."""
    run = _run([T + i * 30_000 for i in range(20)], hold=20 * MIN)
    assert run.first_ms == T
    assert run.until_ms - run.last_ms <= FAST_HOLD_MS
    later = refused(run, run.last_ms + 3 * MIN, 20 * MIN, IDLE)
    assert later.first_ms == run.last_ms + 3 * MIN  # a new run


def test_a_client_that_waits_for_its_retry_after_keeps_its_run() -> None:
    # the Retry-After holds the run from the first refusal; then its rhythm is the Retry-After
    run = _run([T + i * 10 * MIN for i in range(5)], hold=10 * MIN)
    assert run.first_ms == T
    assert run.until_ms - run.last_ms >= 10 * MIN
    assert FAST_FACTOR * run.gap_ms >= 10 * MIN
