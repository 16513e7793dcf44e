"""Price table lookups, overrides and cost (fairgate.formats.pricing)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fairgate.formats.pricing import DEFAULT_PRICES, Price, PriceTable
from fairgate.formats.usage import Usage

TABLE = PriceTable()


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ("gpt-4o", "gpt-4o"),
        ("gpt-4o-2024-08-06", "gpt-4o"),
        ("gpt-4o-mini", "gpt-4o-mini"),  # longest prefix wins
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("openai/gpt-4.1", "gpt-4.1"),
        ("gpt-4.1-mini-2025-04-14", "gpt-4.1-mini"),
        ("o3-mini", "o3-mini"),
        ("o3-2025-04-16", "o3"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4"),
        ("anthropic/claude-sonnet-4-5", "claude-sonnet-4"),
        ("claude-opus-4-1-20250805", "claude-opus-4"),
        ("claude-opus-4-5-20251101", "claude-opus-4-5"),
        ("claude-haiku-4-5", "claude-haiku"),
        ("claude-3-5-haiku-latest", "claude-3-5-haiku"),
        ("CLAUDE-SONNET-4", "claude-sonnet-4"),
        ("deepseek/deepseek-chat", "deepseek-chat"),
        ("mock-fast", "mock"),
    ],
)
def test_lookup(model: str, key: str) -> None:
    assert TABLE.lookup(model) == DEFAULT_PRICES[key]


@pytest.mark.parametrize("model", ["", "unknown-model", "gpt-4oo", "o3x", "gpt-4"])
def test_unknown_models(model: str) -> None:
    assert TABLE.lookup(model) is None
    assert TABLE.cost_usd(model, Usage(1_000_000, 1_000_000)) == 0.0


def test_mock_provider_is_free_whatever_the_model() -> None:
    assert TABLE.cost_usd("mock/gpt-4o", Usage(1_000_000, 1_000_000)) == 0.0


def test_cost() -> None:
    # gpt-4o: 2.50 in, 10.00 out, 1.25 cached
    usage = Usage(prompt_tokens=1_000_000, completion_tokens=100_000, cached_tokens=400_000)
    expected = (600_000 * 2.50 + 400_000 * 1.25 + 100_000 * 10.0) / 1e6
    assert TABLE.cost_usd("gpt-4o", usage) == pytest.approx(expected)


def test_cached_tokens_at_input_price_when_no_cached_price() -> None:
    table = PriceTable({"m": Price(2.0, 4.0)})
    assert table.cost_usd("m", Usage(1_000, 0, 1_000)) == pytest.approx(0.002)


def test_overrides_add_and_patch() -> None:
    table = TABLE.with_overrides(
        {
            "my-model": {"input": 1, "output": 2.5},
            "gpt-4o": {"cached_input": 0.5},
            "claude-sonnet-4": {"input": 2.0, "output": 10.0, "cached_input": None},
        }
    )
    assert table.lookup("my-model-v2") == Price(1.0, 2.5, None)
    assert table.lookup("gpt-4o") == Price(2.50, 10.00, 0.5)
    assert table.lookup("claude-sonnet-4-20250514") == Price(2.0, 10.0, None)
    assert TABLE.lookup("gpt-4o") == DEFAULT_PRICES["gpt-4o"]  # the original is untouched
    assert TABLE.with_overrides(None).prices == TABLE.prices


def test_override_keyed_with_provider_prefix_matches_exactly() -> None:
    table = TABLE.with_overrides({"openrouter/gpt-4o": {"input": 9, "output": 9}})
    assert table.lookup("openrouter/gpt-4o") == Price(9.0, 9.0)
    assert table.lookup("openai/gpt-4o") == DEFAULT_PRICES["gpt-4o"]


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"new-model": {"input": -1, "output": 1}}, "pricing.new-model.input"),
        ({"new-model": {"input": 1, "output": math.inf}}, "pricing.new-model.output"),
        ({"new-model": {"input": 1, "output": math.nan}}, "pricing.new-model.output"),
        ({"new-model": {"input": "1", "output": 1}}, "pricing.new-model.input"),
        ({"new-model": {"input": True, "output": 1}}, "pricing.new-model.input"),
        ({"new-model": {"input": 1}}, "pricing.new-model.output"),
        (
            {"new-model": {"input": 1, "output": 1, "cached_input": -0.1}},
            "pricing.new-model.cached_input",
        ),
        ({"new-model": {"input": 1, "output": 1, "ouput": 1}}, "pricing.new-model.ouput"),
        ({"new-model": 3}, "pricing.new-model"),
        ({"": {"input": 1, "output": 1}}, "pricing."),
    ],
)
def test_invalid_overrides_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}") as info:
        TABLE.with_overrides(spec)
    assert str(info.value).startswith(field)


def test_lookup_cache_is_bounded() -> None:
    table = PriceTable()
    for i in range(5000):
        table.lookup(f"random-model-{i}")
    assert table.lookup("gpt-4o") == DEFAULT_PRICES["gpt-4o"]
    assert len(table._cache) <= 4096
