"""Cheap per-caller guards that run before any expensive work: a per-key request rate and a
backoff for wrong admin keys. Pure and clock-injected (milliseconds); O(1) per call.

Both maps are bounded: the rate guard by the configured keys (only authenticated keys reach it),
the admin backoff by an explicit cap on remembered addresses (oldest forgotten first), since
addresses come from the network.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["AdminBackoff", "KeyRateGuard"]


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at_ms: int


class KeyRateGuard:
    """A token bucket per client key: ``rate_per_s`` sustained, ``burst`` at once.

    It is a flood guard, not a quota (pools share the upstream): its job is to refuse a key that
    sends thousands of requests a second before the gateway parses a single body of them."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate_per_ms = rate_per_s / 1000.0
        self.burst = float(max(1, burst))
        self._buckets: dict[str, _Bucket] = {}

    @property
    def enabled(self) -> bool:
        return self.rate_per_ms > 0

    def take(self, key_id: str, now_ms: int) -> int:
        """0 when ``key_id`` may send a request now (and it is counted), else the milliseconds
        until it may."""
        if not self.enabled:
            return 0
        b = self._buckets.get(key_id)
        if b is None:
            b = self._buckets[key_id] = _Bucket(self.burst, now_ms)
        elapsed = max(0, now_ms - b.at_ms)
        b.tokens = min(self.burst, b.tokens + elapsed * self.rate_per_ms)
        b.at_ms = max(b.at_ms, now_ms)
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return 0
        return max(1, int((1.0 - b.tokens) / self.rate_per_ms + 0.999))

    def __len__(self) -> int:
        return len(self._buckets)


@dataclass(slots=True)
class _Failures:
    count: int
    locked_until_ms: int


class AdminBackoff:
    """Wrong admin keys per client address: ``free`` failures, then a lockout of ``base_ms``
    doubling with each further failure up to ``max_ms``. A success forgets the address.

    A lockout throttles failures, not the right key: the guard lets the right key through
    during one (an admin behind the same NAT or proxy as a guesser must not be locked out), and
    a wrong key then gets 429 and extends it. That is no oracle worth having: the admin key is
    at least 32 characters, so guessing it online is hopeless at any speed; what the lockout
    saves is the log and the work of a flood of wrong keys. Per address, so one guesser does not
    slow an admin elsewhere."""

    def __init__(self, free: int, base_ms: int, max_ms: int, capacity: int = 10_000) -> None:
        self.free = free
        self.base_ms = base_ms
        self.max_ms = max(max_ms, base_ms)
        self.capacity = capacity
        self._by_addr: OrderedDict[str, _Failures] = OrderedDict()

    def locked_for(self, addr: str, now_ms: int) -> int:
        """Milliseconds ``addr`` must still wait before it may try again (0: it may)."""
        f = self._by_addr.get(addr)
        return 0 if f is None else max(0, f.locked_until_ms - now_ms)

    def failed(self, addr: str, now_ms: int) -> int:
        """Record a failure; the number of failures from ``addr`` so far."""
        f = self._by_addr.pop(addr, None) or _Failures(0, 0)
        f.count += 1
        over = f.count - self.free
        if over > 0:
            f.locked_until_ms = now_ms + min(self.max_ms, self.base_ms << min(over - 1, 40))
        self._by_addr[addr] = f  # most recent last
        while len(self._by_addr) > self.capacity:
            self._by_addr.popitem(last=False)
        return f.count

    def succeeded(self, addr: str) -> None:
        self._by_addr.pop(addr, None)

    def __len__(self) -> int:
        return len(self._by_addr)
