"""Bounded strategy state (fairgate.routing.state) and stable hashing (sticky)."""

from __future__ import annotations

import random

from fairgate.routing.model import Target
from fairgate.routing.state import StrategyState
from fairgate.routing.sticky import stable_index, stable_unit


def test_turns_decks_and_affinities_are_lru_bounded() -> None:
    state = StrategyState(max_combos=4, max_sessions=10)
    rng = random.Random(0)
    t = Target("p", "m", "c1")
    for i in range(100):
        state.next_turn(f"combo{i}")
        state.draw(f"combo{i}", ["a", "b"], rng)
        state.note_success("combo", f"session{i}", t)
    assert state.sizes() == (4, 4, 10)
    assert state.session_target("combo", "session99") == t.key
    assert state.session_target("combo", "session0") is None
    state.forget_combo("combo")
    assert state.sizes()[2] == 0


def test_stable_hash_is_deterministic_and_in_range() -> None:
    assert stable_unit("a", "b") == stable_unit("a", "b")
    assert stable_unit("a", "b") != stable_unit("ab", "")
    assert 0.0 < stable_unit("x") <= 1.0
    assert all(0 <= stable_index(7, str(i)) < 7 for i in range(100))
