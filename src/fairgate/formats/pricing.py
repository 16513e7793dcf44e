"""Model prices, for the ``usd`` quota unit and the dashboard's cost figures.

Lookups accept the ids clients and upstreams actually send: dated snapshots
(``claude-sonnet-4-20250514`` → ``claude-sonnet-4``) match by the longest known prefix that ends
at a word boundary, and a ``provider/`` prefix is ignored (``openai/gpt-4o`` → ``gpt-4o``).
An unknown model costs 0.0: a missing price must not block traffic, and the operator can add
it through the config (``with_overrides``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fairgate.formats.usage import Usage

__all__ = ["DEFAULT_PRICES", "Price", "PriceTable"]


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens. ``cached_input_per_mtok`` None bills cache hits at the
    input price."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None


#: Approximate public list prices (USD per million tokens, standard tier, short context) as of
#: 2025. They drift and vary by region and tier: treat them as defaults and override in config.
DEFAULT_PRICES: Mapping[str, Price] = {
    # OpenAI
    "gpt-4o": Price(2.50, 10.00, 1.25),
    "gpt-4o-mini": Price(0.15, 0.60, 0.075),
    "gpt-4.1": Price(2.00, 8.00, 0.50),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.025),
    "gpt-5": Price(1.25, 10.00, 0.125),
    "gpt-5-mini": Price(0.25, 2.00, 0.025),
    "gpt-5-nano": Price(0.05, 0.40, 0.005),
    "o1": Price(15.00, 60.00, 7.50),
    "o3": Price(2.00, 8.00, 0.50),
    "o3-mini": Price(1.10, 4.40, 0.55),
    "o4-mini": Price(1.10, 4.40, 0.275),
    # Anthropic (cache reads at 10 % of input; cache writes are billed as input here)
    "claude-opus-4": Price(15.00, 75.00, 1.50),
    "claude-opus-4-5": Price(5.00, 25.00, 0.50),
    "claude-sonnet-4": Price(3.00, 15.00, 0.30),
    "claude-3-7-sonnet": Price(3.00, 15.00, 0.30),
    "claude-3-5-sonnet": Price(3.00, 15.00, 0.30),
    "claude-haiku": Price(1.00, 5.00, 0.10),
    "claude-3-5-haiku": Price(0.80, 4.00, 0.08),
    "claude-3-haiku": Price(0.25, 1.25, 0.03),
    # DeepSeek
    "deepseek-chat": Price(0.27, 1.10, 0.07),
    "deepseek-reasoner": Price(0.55, 2.19, 0.14),
    # the built-in mock upstream is free
    "mock": Price(0.0, 0.0, 0.0),
}

_FREE = Price(0.0, 0.0, 0.0)
_FREE_PROVIDERS = frozenset({"mock"})
_BOUNDARY = frozenset("-_:@")
_FIELDS = {"input": "input_per_mtok", "output": "output_per_mtok"}
_OPTIONAL_FIELDS = {"cached_input": "cached_input_per_mtok"}
_CACHE_MAX = 4096


def _rate(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: must be a number, got {value!r}")
    f = float(value)
    if not math.isfinite(f) or f < 0:
        raise ValueError(f"{where}: must be a non-negative finite number, got {value!r}")
    return f


class PriceTable:
    """Immutable model → ``Price`` table with prefix lookup; ``with_overrides`` derives a new one.

    Results of ``lookup`` are memoised per model string (bounded: cleared when it grows past
    ``_CACHE_MAX`` distinct ids, since model ids come from clients).
    """

    __slots__ = ("_by_len", "_cache", "_prices")

    def __init__(self, prices: Mapping[str, Price] | None = None) -> None:
        base = DEFAULT_PRICES if prices is None else prices
        self._prices: dict[str, Price] = {k.lower(): v for k, v in base.items()}
        self._by_len = sorted(self._prices, key=len, reverse=True)
        self._cache: dict[str, Price | None] = {}

    @property
    def prices(self) -> Mapping[str, Price]:
        return dict(self._prices)

    def with_overrides(self, mapping: Mapping[str, Any] | None) -> PriceTable:
        """A table with config overrides applied: ``{"model": {"input": x, "output": y,
        "cached_input": z}}`` (USD per million tokens).

        A model already in the table may override only some fields; a new model needs
        ``input`` and ``output``. Raises ValueError naming the offending field
        (``pricing.<model>.<field>``) for a negative, non-finite, non-numeric or unknown field.
        """
        prices = dict(self._prices)
        for model, spec in (mapping or {}).items():
            where = f"pricing.{model}"
            if not isinstance(model, str) or not model.strip():
                raise ValueError(f"{where}: model id must be a non-empty string")
            if isinstance(spec, Price):
                fields = {
                    "input": spec.input_per_mtok,
                    "output": spec.output_per_mtok,
                    "cached_input": spec.cached_input_per_mtok,
                }
            elif isinstance(spec, Mapping):
                fields = dict(spec)
            else:
                raise ValueError(f"{where}: must be a mapping with input/output prices")
            unknown = set(fields) - _FIELDS.keys() - _OPTIONAL_FIELDS.keys()
            if unknown:
                raise ValueError(f"{where}.{sorted(unknown)[0]}: unknown field")
            key = model.strip().lower()
            current = prices.get(key)
            rates: list[float] = []
            for name in ("input", "output"):
                if name in fields:
                    rates.append(_rate(fields[name], f"{where}.{name}"))
                elif current is not None:
                    rates.append(getattr(current, _FIELDS[name]))
                else:
                    raise ValueError(f"{where}.{name}: required for a model without a price")
            cached: float | None = current.cached_input_per_mtok if current else None
            if "cached_input" in fields:
                raw = fields["cached_input"]
                cached = None if raw is None else _rate(raw, f"{where}.cached_input")
            prices[key] = Price(rates[0], rates[1], cached)
        return PriceTable(prices)

    def lookup(self, model: str) -> Price | None:
        """The price of ``model``: exact id, then the id without its ``provider/`` prefix, then
        the longest known prefix ending at ``-``, ``_``, ``:`` or ``@``. None when unknown."""
        try:
            return self._cache[model]
        except KeyError:
            pass
        price = self._find(model)
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[model] = price
        return price

    def _find(self, model: str) -> Price | None:
        name = model.strip().lower()
        if not name:
            return None
        exact = self._prices.get(name)
        if exact is not None:
            return exact
        provider, slash, bare = name.rpartition("/")
        if slash:
            if provider.split("/", 1)[0] in _FREE_PROVIDERS:
                return _FREE
            exact = self._prices.get(bare)
            if exact is not None:
                return exact
        for candidate in (name, bare) if slash else (name,):
            for key in self._by_len:
                if (
                    len(key) < len(candidate)
                    and candidate.startswith(key)
                    and candidate[len(key)] in _BOUNDARY
                ):
                    return self._prices[key]
        return None

    def cost_usd(self, model: str, usage: Usage) -> float:
        """Dollars for ``usage`` on ``model``; cached prompt tokens at the cached price when known.

        ``usage.prompt_tokens`` includes the cached tokens (see ``fairgate.formats.usage``).
        0.0 for an unknown model.
        """
        price = self.lookup(model)
        if price is None:
            return 0.0
        cached = min(usage.cached_tokens, usage.prompt_tokens)
        cached_rate = (
            price.input_per_mtok
            if price.cached_input_per_mtok is None
            else price.cached_input_per_mtok
        )
        return (
            (usage.prompt_tokens - cached) * price.input_per_mtok
            + cached * cached_rate
            + usage.completion_tokens * price.output_per_mtok
        ) / 1_000_000


#: The table with only the built-in defaults.
DEFAULT_TABLE = PriceTable()
