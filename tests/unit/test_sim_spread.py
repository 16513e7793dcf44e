"""``--seeds``: which seeds a text names, and the spread of figures over seeds (pure)."""

from __future__ import annotations

import pytest

from fairgate.sim.spread import MAX_SEEDS, parse_seeds


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("1-10", list(range(1, 11))), ("3", [3]), ("1,4,9", [1, 4, 9]), ("2-3, 3-4", [2, 3, 4])],
)
def test_parse_seeds(text: str, seeds: list[int]) -> None:
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "a", "5-2", "1-", "-1", "1,,2", f"0-{MAX_SEEDS}"])
def test_parse_seeds_rejects_with_a_message(text: str) -> None:
    with pytest.raises(ValueError, match="--seeds"):
        parse_seeds(text)
