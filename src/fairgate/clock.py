"""Injected time.

Everything that reads the time takes a ``Clock`` so that windows, cooldowns and DRR are tested
deterministically: tests pass a ``ManualClock`` and move it; nothing sleeps.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (windows are aligned to the epoch)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def set(self, ms: int) -> None:
        self._now = ms

    def advance(self, ms: int) -> None:
        self._now += ms


SYSTEM_CLOCK = SystemClock()
