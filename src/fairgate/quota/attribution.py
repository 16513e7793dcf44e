"""Charging a provider-reported global percent to keys (SPEC §4, [better]).

Subscription providers report only "the account is at 37 % of its 5-hour window". To give each
key a fair share of a percent plan, every observed rise of that reading is split over the keys
that used tokens since the previous reading, in proportion to those tokens. A drop means the
window rolled over: it starts a new baseline and charges nothing.

Worked example: reading 10 % → 14 %; since then key A used 3,000 tokens and key B 1,000 → A is
charged 3 %, B 1 %. The observed percent-per-token (0.001 %) also prices the next estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PercentAttributor:
    last_reading: float | None = None
    tokens_since: dict[str, float] = field(default_factory=dict)
    percent_per_token: float = 0.0

    def add_tokens(self, key_id: str, tokens: float) -> None:
        if tokens > 0:
            self.tokens_since[key_id] = self.tokens_since.get(key_id, 0.0) + tokens

    def observe(self, reading: float) -> dict[str, float]:
        """Feed a new global percent reading; returns the percent to charge each key."""
        charges: dict[str, float] = {}
        prev = self.last_reading
        self.last_reading = reading
        if prev is None or reading < prev:
            self.tokens_since.clear()
            return charges
        delta = reading - prev
        total = sum(self.tokens_since.values())
        if delta > 0 and total > 0:
            charges = {k: delta * t / total for k, t in self.tokens_since.items()}
            self.percent_per_token = delta / total
            self.tokens_since.clear()
        return charges

    def estimate(self, tokens: float) -> float:
        return tokens * self.percent_per_token
