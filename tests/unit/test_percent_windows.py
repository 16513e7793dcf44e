"""Per-window percent attribution from provider readings (fairgate.path.provider_signals)."""

from __future__ import annotations

import pytest

from fairgate.clock import ManualClock
from fairgate.path.provider_signals import PercentCharge, ProviderSignals


def codex(five: float, week: float) -> dict[str, str]:
    return {
        "x-codex-primary-used-percent": str(five),
        "x-codex-primary-window-minutes": "300",
        "x-codex-secondary-used-percent": str(week),
        "x-codex-secondary-window-minutes": "10080",
    }


def test_a_rise_is_charged_only_to_the_window_that_rose(clock: ManualClock) -> None:
    sig = ProviderSignals(clock, min_interval_ms=0)
    assert sig.observe("c", "gpt-5-codex", codex(10, 40))[1] == []  # baselines
    sig.add_tokens("c", "a", 3_000)
    sig.add_tokens("c", "b", 1_000)
    # only the weekly reading moved: nothing may land on percent/5h
    _, charges = sig.observe("c", "gpt-5-codex", codex(10, 44))
    assert sorted(charges, key=lambda c: c.key_id) == [
        PercentCharge("a", "percent/weekly", pytest.approx(3.0)),  # type: ignore[arg-type]
        PercentCharge("b", "percent/weekly", pytest.approx(1.0)),  # type: ignore[arg-type]
    ]
    # the 5h window kept its own token tally since its previous reading
    sig.add_tokens("c", "b", 1_000)
    _, charges = sig.observe("c", "gpt-5-codex", codex(15, 44))
    by = {(c.key_id, c.counter): c.amount for c in charges}
    assert by == {
        ("a", "percent/5h"): pytest.approx(5 * 3 / 5),
        ("b", "percent/5h"): pytest.approx(5 * 2 / 5),
    }


def test_a_reset_charges_nothing_and_starts_a_new_baseline(clock: ManualClock) -> None:
    sig = ProviderSignals(clock, min_interval_ms=0)
    sig.observe("c", "m", codex(80, 50))
    sig.add_tokens("c", "a", 100)
    _, charges = sig.observe("c", "m", codex(2, 51))  # the 5h window reset
    assert charges == [PercentCharge("a", "percent/weekly", pytest.approx(1.0))]  # type: ignore[arg-type]
    sig.add_tokens("c", "a", 100)
    _, charges = sig.observe("c", "m", codex(3, 51))
    assert charges == [PercentCharge("a", "percent/5h", pytest.approx(1.0))]  # type: ignore[arg-type]


def test_saturation_names_each_window(clock: ManualClock) -> None:
    sig = ProviderSignals(clock, min_interval_ms=0)
    sig.observe("c", "m", codex(70, 20))
    assert sig.saturation.fraction("c", "percent", "5h") == pytest.approx(0.7)
    assert sig.saturation.fraction("c", "percent", "weekly") == pytest.approx(0.2)
    assert sig.saturation.fraction("c", "percent", "monthly") == 0.0
    buckets = sig.buckets.buckets("c")
    assert buckets["5h"].used == pytest.approx(0.7)
    assert buckets["7d"].used == pytest.approx(0.2)
