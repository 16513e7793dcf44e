"""A test clock for real processes (``fairgate serve`` / ``demo`` / ``mock-upstream``).

Why: window counts, cooldowns, retry-after and burn rates depend on where "now" falls in a
bucket. An end-to-end test that runs across 15:00 UTC sees its hourly counts start to decay and
fails by the clock. In-process tests inject a :class:`~fairgate.clock.ManualClock`; a spawned
gateway reads its clock from its settings instead (:class:`TestClockSettings`, resolved from the
environment by the one settings object), and only when ``FAIRGATE_TESTING=1`` says this is a
test run:

``FAIRGATE_TEST_CLOCK``
    the instant the clock starts at: ISO-8601 with a zone (``2026-06-24T12:30:00Z``) or epoch ms.
``FAIRGATE_TEST_CLOCK_RATE``
    test milliseconds per real millisecond (default 1; ``0`` freezes the clock).
``FAIRGATE_TEST_CLOCK_ANCHOR``
    the real epoch ms at which the clock reads the start (default: when the process starts).
    Processes given one anchor share one timeline, so a gateway, its mock upstream and a
    gateway restarted on the same data all agree on the time.

The admin endpoint ``/api/testing/clock`` (and the mock's ``/_mock/clock``) moves it forward;
both answer 404 unless the process runs on this clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from fairgate.clock import SYSTEM_CLOCK, Clock
from fairgate.setting_source import From

TESTING_ENV = "FAIRGATE_TESTING"
START_ENV = "FAIRGATE_TEST_CLOCK"
RATE_ENV = "FAIRGATE_TEST_CLOCK_RATE"
ANCHOR_ENV = "FAIRGATE_TEST_CLOCK_ANCHOR"


class TestClockSettings(BaseModel):
    """The test clock's variables as given (the ``test_clock`` area of the one settings
    object); :func:`process_clock` reads them, since what they mean depends on each other."""

    __test__ = False  # not a pytest test class, whatever imports it
    model_config = ConfigDict(frozen=True, extra="forbid")

    testing: Annotated[str | None, From(env=TESTING_ENV)] = Field(
        default=None, description="`1` lets the test clock replace the system clock (tests only)"
    )
    start: Annotated[str | None, From(env=START_ENV)] = Field(
        default=None,
        description="With `FAIRGATE_TESTING=1`: the instant the clock starts at (ISO-8601 with a "
        "zone, or epoch ms), logged as a WARNING",
    )
    rate: Annotated[str | None, From(env=RATE_ENV)] = Field(
        default=None, description="Test milliseconds per real one (default 1; `0` freezes it)"
    )
    anchor: Annotated[str | None, From(env=ANCHOR_ENV)] = Field(
        default=None,
        description="The real epoch ms at which the clock reads its start (default: when the "
        "process starts), so several processes share one timeline",
    )


class TestClockError(ValueError):
    """A test clock variable that cannot be read; the message names the variable."""

    __test__ = False  # not a pytest test class, whatever imports it


class ShiftedClock:
    """``start + (real - anchor) × rate + advanced``: a wall clock moved to another instant,
    possibly slowed down or frozen, that tests can push forward (never back: counters, leases
    and cooldowns assume time does not run backwards)."""

    def __init__(
        self,
        start_ms: int,
        *,
        rate: float = 1.0,
        anchor_ms: int | None = None,
        real: Clock = SYSTEM_CLOCK,
    ) -> None:
        if not (rate >= 0 and math.isfinite(rate)):
            raise ValueError("rate must be a finite number >= 0")
        self.start_ms = start_ms
        self.rate = rate
        self._real = real
        self.anchor_ms = real.now_ms() if anchor_ms is None else anchor_ms
        self.advanced_ms = 0

    def now_ms(self) -> int:
        elapsed = self._real.now_ms() - self.anchor_ms
        return self.start_ms + int(elapsed * self.rate) + self.advanced_ms

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError("a test clock only moves forward")
        self.advanced_ms += ms


@dataclass(frozen=True, slots=True)
class ProcessClock:
    """The clock a process runs on, and the warning to log loudly at start (None: none)."""

    clock: Clock
    warning: str | None


def parse_instant(text: str) -> int:
    """Epoch ms of ``text``: an integer (epoch ms) or ISO-8601 with a zone."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError("give a zone, e.g. 2026-06-24T12:30:00Z")
    return int(when.timestamp() * 1000)


def process_clock(given: TestClockSettings) -> ProcessClock:
    """The system clock, or the test clock ``given`` describes when ``FAIRGATE_TESTING=1``.

    Raises :class:`TestClockError` for a value that cannot be read, so the CLI exits 2 instead of
    running on a clock nobody asked for."""
    if not (given.start or given.rate or given.anchor):
        return ProcessClock(SYSTEM_CLOCK, None)
    if given.testing != "1":
        return ProcessClock(
            SYSTEM_CLOCK,
            f"{START_ENV} is ignored: the test clock needs {TESTING_ENV}=1 (system clock in use)",
        )
    try:
        start = parse_instant(given.start) if given.start else None
    except ValueError as exc:
        raise TestClockError(f"{START_ENV}: {exc}") from None
    try:
        rate = float(given.rate or "1")
        if not (rate >= 0 and math.isfinite(rate)):
            raise ValueError
    except ValueError:
        raise TestClockError(f"{RATE_ENV} must be a number >= 0 (0 freezes the clock)") from None
    try:
        anchor = int(given.anchor) if given.anchor else None
    except ValueError:
        raise TestClockError(f"{ANCHOR_ENV} must be epoch milliseconds") from None
    anchor_ms = anchor if anchor is not None else SYSTEM_CLOCK.now_ms()
    # only a rate or an anchor: the clock starts from the real time at the anchor
    clock = ShiftedClock(anchor_ms if start is None else start, rate=rate, anchor_ms=anchor_ms)
    shown = datetime.fromtimestamp(clock.now_ms() / 1000, tz=UTC).isoformat()
    return ProcessClock(
        clock,
        f"TEST CLOCK IN USE ({TESTING_ENV}=1): time is {shown} (epoch ms {clock.now_ms()}),"
        f" running at {rate:g}x real time; never set this in production",
    )


#: the most one call may move a test clock: a year covers every window, monthly included
MAX_ADVANCE_MS = 366 * 86_400_000


def advance_ms_of(body: Mapping[str, object]) -> int:
    """The ``advanceMs`` of a control request, checked (the message names the field)."""
    value = body.get("advanceMs")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ADVANCE_MS:
        raise TestClockError(f"advanceMs must be an integer from 0 to {MAX_ADVANCE_MS}")
    return value


def clock_view(clock: ShiftedClock) -> dict[str, int | float]:
    """What the control endpoints show: the time now and how it is made."""
    return {
        "nowMs": clock.now_ms(),
        "startMs": clock.start_ms,
        "anchorMs": clock.anchor_ms,
        "rate": clock.rate,
        "advancedMs": clock.advanced_ms,
    }
