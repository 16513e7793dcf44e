"""The one parser for "when may I try again" values (SPEC §5, §9).

Upstreams disagree on how to say when a limit resets: ``Retry-After`` is seconds or an HTTP
date, OpenAI's ``x-ratelimit-reset-*`` are Go durations, Anthropic's ``anthropic-ratelimit-*-reset``
are RFC 3339 timestamps, others send epoch seconds or milliseconds. Every caller (cooldowns,
lockouts, rate-limit headers, saturation signals) goes through ``parse_reset`` so a format is
understood everywhere or nowhere.

Accepted forms, tried in this order (dates before numbers, so no date is misread as a number):

=====================  ===================================  ===================================
form                   example                              meaning
=====================  ===================================  ===================================
HTTP date (RFC 7231)   ``Wed, 21 Oct 2015 07:28:00 GMT``    that instant (also RFC 850, asctime)
RFC 3339 / ISO 8601    ``2026-11-30T10:00:00Z``             that instant; offsets
                       ``2026-11-30T10:00:00.123+02:00``    and fractions kept; no zone = UTC
Go duration            ``1h30m15s``, ``6m0s``, ``250ms``,   now + duration (units h m s ms us
                       ``1.5s``, ``500us``                  µs ns; fractions allowed)
seconds                ``120``, ``1.5``                     now + that many seconds
epoch seconds          ``1700000000`` (> 1e9)               that instant
epoch milliseconds     ``1700000000000`` (> 1e12)           that instant
=====================  ===================================  ===================================

Anything else — empty, ``abc``, negative (``-5``, ``-1s``), ``inf``, ``1e3`` — is None.
A parsed instant is clamped into ``[now, now + max_ms]``: a reset in the past means "now", and
a wild value (a bogus epoch, ``99999h``) cannot lock a connection out for months.
Fractional milliseconds round up, so a caller never retries a hair too early.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

__all__ = ["DEFAULT_MAX_MS", "parse_delay_ms", "parse_reset"]

#: Eight days: longer than any weekly window reset, short enough to bound a bogus value.
DEFAULT_MAX_MS = 8 * 86_400_000

_EPOCH_MS_MIN = 1e12
_EPOCH_S_MIN = 1e9

_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|h|m|s)")
_GO_UNIT_MS = {
    "ns": 1e-6,
    "us": 1e-3,
    "µs": 1e-3,  # U+00B5 micro sign
    "μs": 1e-3,  # U+03BC greek mu
    "ms": 1.0,
    "s": 1_000.0,
    "m": 60_000.0,
    "h": 3_600_000.0,
}
_ISO_START = re.compile(r"\d{4}-\d{2}-\d{2}")
_ISO_FRACTION = re.compile(r"(\.\d{1,6})\d*")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)


def _datetime_ms(dt: datetime) -> float:
    """Exact epoch ms (rounded up), avoiding float error from ``timestamp() * 1000``."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    us = (dt - _EPOCH) // _ONE_US
    return float(-(-us // 1000))


def _http_date_ms(value: str) -> float | None:
    try:
        dt = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return _datetime_ms(dt)


def _iso_ms(value: str) -> float | None:
    text = value.replace("z", "Z")
    text = _ISO_FRACTION.sub(r"\1", text, count=1)  # Go's RFC3339Nano has 9 digits
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    return _datetime_ms(dt)


def _go_duration_ms(value: str) -> float | None:
    pos = 0
    total = 0.0
    for m in _GO_PART.finditer(value):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _GO_UNIT_MS[m.group(2)]
        pos = m.end()
    if pos != len(value) or pos == 0:
        return None
    return total


def _deadline_ms(value: str, now_ms: int) -> float | None:
    first = value[0]
    if first.isalpha():
        return _http_date_ms(value)
    if _ISO_START.match(value):
        return _iso_ms(value)
    if _NUMBER.fullmatch(value):
        n = float(value)
        if n > _EPOCH_MS_MIN:
            return n
        if n > _EPOCH_S_MIN:
            return n * 1000
        return now_ms + n * 1000
    duration = _go_duration_ms(value)
    return None if duration is None else now_ms + duration


def parse_reset(value: str | None, now_ms: int, *, max_ms: int = DEFAULT_MAX_MS) -> int | None:
    """The absolute epoch-ms deadline ``value`` names, clamped into ``[now_ms, now_ms + max_ms]``;
    None when it is missing, empty, negative or not one of the forms in the module docstring."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    deadline = _deadline_ms(text, now_ms)
    if deadline is None or not math.isfinite(deadline):
        return None
    ceiling = now_ms + max_ms
    if deadline >= ceiling:
        return ceiling
    return max(now_ms, math.ceil(deadline))


def parse_delay_ms(value: str | None, now_ms: int, *, max_ms: int = DEFAULT_MAX_MS) -> int | None:
    """How long from ``now_ms`` until the deadline ``value`` names (0..max_ms), or None."""
    deadline = parse_reset(value, now_ms, max_ms=max_ms)
    return None if deadline is None else deadline - now_ms
