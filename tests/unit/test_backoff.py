"""Exponential backoff and the never-shorten merge (fairgate.resilience.backoff)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairgate.resilience.backoff import Cooldown, merge, next_cooldown_ms


def test_api_key_sequence_doubles_from_3s_and_caps_at_300s() -> None:
    seq = [next_cooldown_ms(level, "apikey", None) for level in range(10)]
    assert seq == [
        3_000,
        6_000,
        12_000,
        24_000,
        48_000,
        96_000,
        192_000,
        300_000,
        300_000,
        300_000,
    ]


def test_oauth_sequence_doubles_from_5s() -> None:
    seq = [next_cooldown_ms(level, "oauth", None) for level in range(8)]
    assert seq == [5_000, 10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000]


def test_unknown_auth_type_counts_as_api_key() -> None:
    assert next_cooldown_ms(0, "", None) == 3_000


def test_huge_level_stays_capped() -> None:
    assert next_cooldown_ms(10_000, "apikey", None) == 300_000


def test_negative_level_is_the_base() -> None:
    assert next_cooldown_ms(-3, "apikey", None) == 3_000


def test_custom_bases_and_cap() -> None:
    assert next_cooldown_ms(2, "oauth", None, base_oauth=1_000, max_ms=3_000) == 3_000
    assert next_cooldown_ms(1, "apikey", None, base_apikey=500) == 1_000


@pytest.mark.parametrize("level", [0, 3, 12])
def test_hint_wins_over_the_backoff(level: int) -> None:
    assert next_cooldown_ms(level, "apikey", 20_000) == 20_000


def test_hint_may_exceed_the_backoff_cap_up_to_its_own_cap() -> None:
    assert next_cooldown_ms(0, "apikey", 900_000) == 900_000
    assert next_cooldown_ms(0, "apikey", 90_000_000) == 3_600_000
    assert next_cooldown_ms(0, "apikey", 90_000, max_hint_ms=60_000) == 60_000


@pytest.mark.parametrize("hint", [0, -5])
def test_zero_or_negative_hint_falls_back_to_the_backoff(hint: int) -> None:
    assert next_cooldown_ms(1, "apikey", hint) == 6_000


def test_merge_into_nothing_is_the_new_cooldown() -> None:
    new = Cooldown(10, 0, "rate_limit")
    assert merge(None, new) == new


def test_merge_never_shortens() -> None:
    long = Cooldown(100_000, 2, "rate_limit")
    short = Cooldown(5_000, 0, "server_error")
    assert merge(long, short) == Cooldown(100_000, 2, "rate_limit")


def test_merge_extends_with_the_new_reason_and_keeps_the_higher_level() -> None:
    old = Cooldown(5_000, 4, "server_error")
    new = Cooldown(60_000, 0, "rate_limit")
    assert merge(old, new) == Cooldown(60_000, 4, "rate_limit")


def test_active_and_remaining() -> None:
    cd = Cooldown(1_000, 0, "x")
    assert cd.active(999)
    assert not cd.active(1_000)
    assert cd.remaining_ms(400) == 600
    assert cd.remaining_ms(5_000) == 0


cooldowns = st.builds(
    Cooldown,
    st.integers(0, 10**13),
    st.integers(0, 40),
    st.sampled_from(["a", "b", "c"]),
)


@given(st.lists(cooldowns, min_size=1, max_size=20))
def test_merge_is_monotonic_in_any_order(items: list[Cooldown]) -> None:
    merged: Cooldown | None = None
    for cd in items:
        before = merged
        merged = merge(merged, cd)
        if before is not None:
            assert merged.until_ms >= before.until_ms
            assert merged.level >= before.level
    assert merged is not None
    assert merged.until_ms == max(c.until_ms for c in items)
    assert merged.level == max(c.level for c in items)


@given(st.integers(0, 64), st.sampled_from(["oauth", "apikey"]))
def test_backoff_is_within_base_and_cap(level: int, auth: str) -> None:
    ms = next_cooldown_ms(level, auth, None)
    assert 3_000 <= ms <= 300_000
    assert ms <= next_cooldown_ms(level + 1, auth, None)
