"""What providers tell us in their headers, turned into inputs of the quota engine (SPEC §4–§5).

- Saturation: the provider's own used fraction per dimension makes a pool strict even when our
  counters (which only see traffic through this gateway) say it is not.
- Account buckets: 5h / 7d / 7d:<family>, request and token limits per family, and a usage
  limit the provider refused with, per connection, for quota-share gating.
- Percent attribution: a subscription plan reports one global percent per window (5h, weekly,
  monthly…); every rise of a window's reading is charged to that window's dimension only, split
  over the keys that used tokens since that window's previous reading, in proportion
  (``PercentAttributor``, one per connection and window).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from fairgate.clock import Clock
from fairgate.domain.readings import RateLimitSnapshot, parse_rate_limit_headers
from fairgate.quota.attribution import PercentAttributor
from fairgate.quota.model import Pool
from fairgate.quota.signals import AccountBuckets, SaturationSignals
from fairgate.resilience.classify import CODE_TABLE, Classification, FailureClass

_NO_SIGNALS: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Reading:
    """A parsed snapshot and when it was taken (a later request's reading may be applied
    first: the older one must not look like a window reset)."""

    snap: RateLimitSnapshot
    at_ms: int


@dataclass(frozen=True, slots=True)
class PercentCharge:
    key_id: str
    counter: str  # e.g. "percent/5h"
    amount: float  # percent points


class ProviderSignals:
    def __init__(self, clock: Clock, *, min_interval_ms: int = 1_000) -> None:
        self.clock = clock
        self.min_interval_ms = min_interval_ms
        self._parsed: dict[str, int] = {}  # bounded by the number of connections
        self.saturation = SaturationSignals(clock)
        self.buckets = AccountBuckets(clock)
        # connection id → percent counter ("percent/5h") → its attributor
        self._attr: dict[str, dict[str, PercentAttributor]] = {}

    def observe(
        self,
        connection_id: str,
        model: str,
        headers: Mapping[str, str],
        *,
        force: bool = False,
        defer: bool = False,
    ) -> tuple[Reading | None, list[PercentCharge]]:
        """Feed one upstream response's headers; returns the reading and percent charges due.

        Readings move slowly (each holds until the provider's stated reset of its limit), so a
        connection's headers are parsed at most once per
        ``min_interval_ms`` (parsing every answer cost more than the rest of the hot path's
        bookkeeping); ``force`` (error answers) always parses. With ``defer`` (an answer that
        will settle) nothing is attributed now: the reading counts the request it answers, so
        :meth:`attribute` charges its rise when that request's own tokens are known; without
        it (a refused request, which used nothing) the rise is attributed at once.
        """
        now = self.clock.now_ms()
        last = self._parsed.get(connection_id)
        if not force and last is not None and 0 <= now - last < self.min_interval_ms:
            return None, []
        self._parsed[connection_id] = now
        snap = parse_rate_limit_headers(headers, now)
        if snap is None:
            return None, []
        self.saturation.update(connection_id, snap)
        self.buckets.observe_snapshot(connection_id, model, snap)
        reading = Reading(snap, now)
        if defer or not snap.percent_windows:
            return reading, []
        return reading, self._attribute(connection_id, reading)

    def attribute(
        self, connection_id: str, key_id: str, tokens: float, reading: Reading | None
    ) -> list[PercentCharge]:
        """A request settled with ``tokens``: they count for ``key_id`` in every percent window
        of the connection, then the reading its answer carried (if one was taken) is
        attributed, so its rise is charged to the keys that used tokens since the previous
        reading, this request included (issue 44, item 3)."""
        for attr in self._attr.get(connection_id, {}).values():
            attr.add_tokens(key_id, tokens)
        if reading is None or not reading.snap.percent_windows:
            return []
        return self._attribute(connection_id, reading)

    def _attribute(self, connection_id: str, reading: Reading) -> list[PercentCharge]:
        charges: list[PercentCharge] = []
        attrs = self._attr.setdefault(connection_id, {})
        for window in reading.snap.percent_windows:
            counter = window.counter
            attr = attrs.setdefault(counter, PercentAttributor())
            for key_id, pct in attr.observe(window.used * 100.0, reading.at_ms).items():
                charges.append(PercentCharge(key_id, counter, pct))
        return charges

    def refused(self, connection_id: str, model: str, cls: Classification) -> None:
        """A failed attempt: a 429 whose *structured* code says the account's usage limit is
        reached until a stated reset (Codex ``usage_limit_reached`` with ``resets_at`` /
        ``resets_in_seconds``, GLM 1308/1310) saturates the connection's ``limit`` bucket
        until then. The code itself must mean it: a quota the text suggested never does (a
        client could make an upstream echo such words)."""
        code = cls.signal.removeprefix("code:") if cls.signal.startswith("code:") else None
        if (
            cls.cls is FailureClass.QUOTA_TEMPORARY
            and cls.status == 429
            and cls.retry_after_ms is not None
            and code is not None
            and CODE_TABLE.get(code) is FailureClass.QUOTA_TEMPORARY
        ):
            reset = self.clock.now_ms() + cls.retry_after_ms
            self.buckets.limit_reached(connection_id, model, reset, model_scoped=cls.model_scoped)

    def sizes(self) -> dict[str, int]:
        """Entries of the per-connection maps (bounded by the connections, not the traffic)."""
        attributors = sum(len(a) for a in self._attr.values())
        return {"signalConnections": len(self._parsed), "percentAttributors": attributors}

    def add_tokens(self, connection_id: str, key_id: str, tokens: float) -> None:
        """Tokens of a request whose answer carried no reading (see :meth:`attribute`)."""
        self.attribute(connection_id, key_id, tokens, None)

    def percent_estimate(self, connection_id: str, tokens: float) -> float:
        """Percent a request of ``tokens`` is expected to cost, from the observed rate (the
        fastest-moving window: the one that fills first)."""
        found = self._attr.get(connection_id, {}).values()
        return max((a.estimate(tokens) for a in found), default=0.0)

    def for_pool(self, pool: Pool) -> Mapping[str, float]:
        """The provider's used fraction per dimension key of ``pool``; empty (every fraction
        0, as the engine reads a missing key) while no provider reported one: the admission
        of every governed request asks, and most providers never report."""
        if self.saturation.empty:
            return _NO_SIGNALS
        return self.saturation.for_pool(pool.connections, pool.dimension_keys)
