"""The one Retry-After / reset parser (fairgate.domain.retry_after)."""

from __future__ import annotations

import pytest

from fairgate.domain.retry_after import DEFAULT_MAX_MS, parse_delay_ms, parse_reset

NOW = 1_700_000_000_000  # 2023-11-14T22:13:20Z
BIG = 10**13  # a max_ms that never clamps, to see the exact instant parsed

# (value, absolute deadline with max_ms=BIG) — None means unparseable
EXACT = [
    # plain seconds (the ambiguity: small numbers are delays)
    ("120", NOW + 120_000),
    ("0", NOW),
    ("1.5", NOW + 1_500),
    (" 20 ", NOW + 20_000),
    (".5", NOW + 500),
    # epoch seconds (> 1e9) and epoch milliseconds (> 1e12)
    ("1700000060", NOW + 60_000),
    ("1700000060.5", NOW + 60_500),
    ("1700000090000", NOW + 90_000),
    # HTTP dates (RFC 7231 IMF-fixdate, RFC 850, asctime) — tried before numbers
    ("Tue, 14 Nov 2023 22:14:20 GMT", NOW + 60_000),
    ("Tuesday, 14-Nov-23 22:14:20 GMT", NOW + 60_000),
    ("Tue Nov 14 22:14:20 2023", NOW + 60_000),
    ("Tue, 14 Nov 2023 23:14:20 +0100", NOW + 60_000),
    # RFC 3339 / ISO 8601
    ("2023-11-14T22:14:20Z", NOW + 60_000),
    ("2023-11-14T22:14:20.250Z", NOW + 60_250),
    ("2023-11-15T00:14:20.123+02:00", NOW + 60_123),
    ("2023-11-14T22:14:20.123456789Z", NOW + 60_124),  # nanoseconds: rounded up
    ("2023-11-14 22:14:20", NOW + 60_000),  # no zone: UTC
    ("2023-11-14t22:14:20z", NOW + 60_000),
    # Go durations
    ("1h30m15s", NOW + 5_415_000),
    ("6m0s", NOW + 360_000),
    ("250ms", NOW + 250),
    ("1.5s", NOW + 1_500),
    ("2m", NOW + 120_000),
    ("2m59.56s", NOW + 179_560),
    ("500us", NOW + 1),  # sub-millisecond rounds up
    ("500µs", NOW + 1),
    ("1500000ns", NOW + 2),
    ("0s", NOW),
    # unparseable
    ("", None),
    ("   ", None),
    ("abc", None),
    ("-5", None),
    ("-1s", None),
    ("1e3", None),
    ("inf", None),
    ("nan", None),
    ("5 s", None),
    ("1h-5m", None),
    ("ms", None),
    ("12:30", None),
    ("Wed, 99 Foo 2015", None),
    ("2023-13-45T00:00:00Z", None),
]


@pytest.mark.parametrize(("value", "expected"), EXACT)
def test_every_form(value: str, expected: int | None) -> None:
    assert parse_reset(value, NOW, max_ms=BIG) == expected


def test_none() -> None:
    assert parse_reset(None, NOW) is None
    assert parse_delay_ms(None, NOW) is None


@pytest.mark.parametrize(
    "value",
    [
        "Wed, 21 Oct 2015 07:28:00 GMT",  # a date in the past
        "2015-10-21T07:28:00Z",
        "1600000000",  # epoch seconds in the past
        "1600000000000",  # epoch ms in the past
    ],
)
def test_past_instants_mean_now(value: str) -> None:
    assert parse_reset(value, NOW) == NOW
    assert parse_delay_ms(value, NOW) == 0


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-30T10:00:00Z",
        "2026-11-30T10:00:00.123+02:00",
        "Mon, 30 Nov 2026 10:00:00 GMT",
        "99999999999999999999",
        "1900000000",
        "99999h",
        "864000",  # ten days of seconds
    ],
)
def test_far_future_is_clamped(value: str) -> None:
    assert parse_reset(value, NOW) == NOW + DEFAULT_MAX_MS
    assert parse_delay_ms(value, NOW, max_ms=60_000) == 60_000


def test_the_brief_examples_against_a_late_now() -> None:
    now = 1_796_000_000_000  # 2026-11-30T01:33:20Z
    assert parse_reset("2026-11-30T10:00:00Z", now) == 1_796_032_800_000
    assert parse_reset("2026-11-30T10:00:00.123+02:00", now) == 1_796_025_600_123
    assert parse_reset("1700000000", now) == now  # epoch seconds, long past
    assert parse_reset("1700000000000", now) == now


def test_delay() -> None:
    assert parse_delay_ms("20", NOW) == 20_000
    assert parse_delay_ms("6m0s", NOW) == 360_000
    assert parse_delay_ms("abc", NOW) is None
