"""Units and windows of a quota dimension (SPEC §1)."""

from __future__ import annotations

from enum import StrEnum


class Unit(StrEnum):
    PERCENT = "percent"
    REQUESTS = "requests"
    TOKENS = "tokens"
    USD = "usd"


class WindowAnchor(StrEnum):
    """Where a dimension's windows start: at the provider's stated reset once a reading gives
    one (``provider``, the default; only percent windows get such readings), or always on the
    epoch-aligned grid (``epoch``). See ``fairgate.quota.window``."""

    PROVIDER = "provider"
    EPOCH = "epoch"


class Window(StrEnum):
    HOURLY = "hourly"
    FIVE_HOURS = "5h"
    DAILY = "daily"
    WEEKLY = "weekly"
    MONTHLY = "monthly"

    @property
    def ms(self) -> int:
        return WINDOW_MS[self]


WINDOW_MS: dict[Window, int] = {
    Window.HOURLY: 3_600_000,
    Window.FIVE_HOURS: 18_000_000,
    Window.DAILY: 86_400_000,
    Window.WEEKLY: 604_800_000,
    Window.MONTHLY: 2_592_000_000,
}

#: A limit at or below this means "unknown, configure me": shown, never enforced.
UNKNOWN_LIMIT = 1e-9
