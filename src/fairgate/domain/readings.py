"""Rate-limit headers of upstream responses → one ``RateLimitSnapshot`` (SPEC §5).

The snapshot feeds two consumers: the fair-share engine's saturation signal (how full the
provider says the account is, ``used_fractions``) and the account buckets that push a saturated
connection to the tail of a quota-share combo. Every reset goes through the one Retry-After
parser, so it is an absolute epoch-ms deadline whatever form the upstream used.

Header families understood (names are case-insensitive):

- OpenAI style: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (resets are Go
  durations such as ``6m0s``); the suffix-less ``x-ratelimit-{limit,remaining,reset}`` some
  OpenAI-compatible providers send counts as requests.
- Anthropic: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
  {limit,remaining,reset}`` (RFC 3339 resets) and the subscription headers
  ``anthropic-ratelimit-unified-{5h,7d}-{utilization,reset,status}``.
- Codex (ChatGPT subscription backend, as the Codex CLI reads them):
  ``x-codex-{primary,secondary}-used-percent`` (0..100), ``-window-minutes`` and ``-reset-at``
  (epoch seconds; the older ``-reset-after-seconds`` is read too). Which slot holds which window
  is not fixed, so a reading is named by its stated length (300 min → ``5h``, 10080 → ``weekly``).
- ``retry-after`` (any form) and ``retry-after-ms`` (milliseconds, as OpenAI sends).

Every percent reading of a subscription window (Anthropic unified 5h/7d, Codex primary/secondary)
is also listed in ``RateLimitSnapshot.percent_windows`` as a ``WindowReading`` that names its
window, so each reading is charged only to the pool dimension of that window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fairgate.domain.retry_after import parse_reset
from fairgate.domain.units import WINDOW_MS, Window

__all__ = [
    "RateLimitSnapshot",
    "WindowReading",
    "count_limits",
    "parse_rate_limit_headers",
    "used_fractions",
    "window_name",
]


@dataclass(frozen=True, slots=True)
class WindowReading:
    """One provider percent window: its name (a pool window such as ``5h``/``weekly``/
    ``monthly``, else ``<minutes>m``), used fraction (1.0 = exhausted), the absolute reset in
    epoch ms (None = not stated) and its length in ms (None = not stated)."""

    window: str
    used: float
    reset_ms: int | None = None
    window_ms: int | None = None

    @property
    def counter(self) -> str:
        """The pool counter this reading measures (``percent/5h``): one spelling for the
        attribution, the anchoring and the used fractions."""
        return f"percent/{self.window}"


def window_name(window_ms: int) -> str:
    """The pool window a provider window of ``window_ms`` is: an exact match of a known window
    length, else ``<minutes>m`` (a window fairgate has no dimension for)."""
    for window, ms in WINDOW_MS.items():
        if ms == window_ms:
            return window.value
    return f"{window_ms // 60_000}m"


#: Anthropic's unified windows, by snapshot field prefix → the window they measure.
_UNIFIED = {"unified_5h": Window.FIVE_HOURS, "unified_7d": Window.WEEKLY}


@dataclass(frozen=True, slots=True)
class RateLimitSnapshot:
    """What one response said about the account's limits; None = not reported.

    ``*_reset_ms`` and ``retry_after_ms`` are absolute epoch milliseconds; utilizations are
    fractions (1.0 = the window is exhausted).
    """

    requests_limit: int | None = None
    requests_remaining: int | None = None
    requests_reset_ms: int | None = None
    tokens_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset_ms: int | None = None
    input_tokens_limit: int | None = None
    input_tokens_remaining: int | None = None
    input_tokens_reset_ms: int | None = None
    output_tokens_limit: int | None = None
    output_tokens_remaining: int | None = None
    output_tokens_reset_ms: int | None = None
    unified_5h_utilization: float | None = None
    unified_5h_reset_ms: int | None = None
    unified_7d_utilization: float | None = None
    unified_7d_reset_ms: int | None = None
    retry_after_ms: int | None = None
    percent_windows: tuple[WindowReading, ...] = ()

    def __post_init__(self) -> None:
        # Anthropic's unified utilizations are window readings too: list them, so consumers
        # read every provider's percent windows from one place.
        unified = [
            WindowReading(window.value, used, getattr(self, f"{prefix}_reset_ms"), window.ms)
            for prefix, window in _UNIFIED.items()
            if (used := getattr(self, f"{prefix}_utilization")) is not None
        ]
        if unified:
            named = {w.window for w in unified}
            rest = tuple(w for w in self.percent_windows if w.window not in named)
            object.__setattr__(self, "percent_windows", (*unified, *rest))

    def window(self, name: str) -> WindowReading | None:
        """The percent reading of window ``name`` (e.g. ``5h``), None when not reported."""
        return next((w for w in self.percent_windows if w.window == name), None)


_COUNT = "count"
_RESET = "reset"
_UTIL = "util"

# header name → (snapshot field, kind)
_HEADERS: dict[str, tuple[str, str]] = {}
for _dim in ("requests", "tokens"):
    _HEADERS[f"x-ratelimit-limit-{_dim}"] = (f"{_dim}_limit", _COUNT)
    _HEADERS[f"x-ratelimit-remaining-{_dim}"] = (f"{_dim}_remaining", _COUNT)
    _HEADERS[f"x-ratelimit-reset-{_dim}"] = (f"{_dim}_reset_ms", _RESET)
for _dim in ("requests", "tokens", "input-tokens", "output-tokens"):
    _f = _dim.replace("-", "_")
    _HEADERS[f"anthropic-ratelimit-{_dim}-limit"] = (f"{_f}_limit", _COUNT)
    _HEADERS[f"anthropic-ratelimit-{_dim}-remaining"] = (f"{_f}_remaining", _COUNT)
    _HEADERS[f"anthropic-ratelimit-{_dim}-reset"] = (f"{_f}_reset_ms", _RESET)
for _w in ("5h", "7d"):
    _HEADERS[f"anthropic-ratelimit-unified-{_w}-utilization"] = (f"unified_{_w}_utilization", _UTIL)
    _HEADERS[f"anthropic-ratelimit-unified-{_w}-reset"] = (f"unified_{_w}_reset_ms", _RESET)
_HEADERS["retry-after"] = ("retry_after_ms", _RESET)
# suffix-less generic form: applied only where the specific header is absent
_GENERIC = {
    "x-ratelimit-limit": ("requests_limit", _COUNT),
    "x-ratelimit-remaining": ("requests_remaining", _COUNT),
    "x-ratelimit-reset": ("requests_reset_ms", _RESET),
}
_STATUS = {
    "anthropic-ratelimit-unified-5h-status": "unified_5h_utilization",
    "anthropic-ratelimit-unified-7d-status": "unified_7d_utilization",
}
_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "retry-after")
_CODEX_PREFIX = "x-codex-"
_CODEX_SLOTS = ("primary", "secondary")


def _count(value: str) -> int | None:
    try:
        f = float(value.strip())
    except ValueError:
        return None
    if not math.isfinite(f) or f < 0:
        return None
    return int(f)


def _utilization(value: str) -> float | None:
    """A used fraction: Anthropic sends 0..1; a value above 1 (or with ``%``) is a percentage."""
    text = value.strip()
    percent = text.endswith("%")
    try:
        f = float(text.rstrip("%"))
    except ValueError:
        return None
    if not math.isfinite(f) or f < 0:
        return None
    return f / 100 if percent or f > 1 else f


def _parse_specific(raw_value: str, kind: str, now_ms: int) -> float | None:
    """One header of :data:`_HEADERS`, by its kind (count, reset or utilization)."""
    if kind == _COUNT:
        return _count(raw_value)
    if kind == _RESET:
        return parse_reset(raw_value, now_ms)
    return _utilization(raw_value)


def _apply_generic(values: dict[str, Any], generic: Mapping[str, str], now_ms: int) -> None:
    """The generic headers fill only what the provider-specific ones left unknown;
    ``retry-after-ms`` (more precise than ``retry-after``) always wins."""
    for name, raw_value in generic.items():
        if name == "retry-after-ms":
            ms = _count(raw_value)
            if ms is not None:
                values["retry_after_ms"] = parse_reset(f"{ms}ms", now_ms)
            continue
        field, kind = _GENERIC[name]
        if field not in values:
            parsed = _count(raw_value) if kind == _COUNT else parse_reset(raw_value, now_ms)
            if parsed is not None:
                values[field] = parsed


def parse_rate_limit_headers(headers: Mapping[str, str], now_ms: int) -> RateLimitSnapshot | None:
    """Parse the rate-limit headers of one response; None when it carries none we understand.

    A ``-status: rejected`` unified header marks that window exhausted (utilization at least
    1.0) even when the utilization header is missing.
    """
    values: dict[str, Any] = {}
    generic: dict[str, str] = {}
    rejected: list[str] = []
    for raw_name, raw_value in headers.items():
        name = raw_name.lower()
        if not name.startswith(_PREFIXES) or not isinstance(raw_value, str):
            continue
        spec = _HEADERS.get(name)
        if spec is not None:
            parsed = _parse_specific(raw_value, spec[1], now_ms)
            if parsed is not None:
                values[spec[0]] = parsed
        elif name in _GENERIC or name == "retry-after-ms":
            generic[name] = raw_value
        elif name in _STATUS and raw_value.strip().lower() == "rejected":
            rejected.append(_STATUS[name])
    _apply_generic(values, generic, now_ms)
    for field in rejected:
        values[field] = max(float(values.get(field, 1.0)), 1.0)
    windows = _codex_windows(headers, now_ms)
    if windows:
        values["percent_windows"] = tuple(windows)
    if not values:
        return None
    return RateLimitSnapshot(**values)


def _codex_windows(headers: Mapping[str, str], now_ms: int) -> list[WindowReading]:
    """The Codex backend's primary / secondary windows. A slot without a used percent is not
    reported; one without a stated length cannot be named and is skipped (charging it to the
    wrong dimension would be worse than not charging it)."""
    lower = {k.lower(): v for k, v in headers.items() if k.lower().startswith(_CODEX_PREFIX)}
    if not lower:
        return []
    out = []
    for slot in _CODEX_SLOTS:
        base = f"{_CODEX_PREFIX}{slot}-"
        used = _utilization_percent(lower.get(base + "used-percent"))
        minutes = _count(lower.get(base + "window-minutes") or "")
        if used is None or not minutes:
            continue
        reset_ms = _codex_reset(lower, base, now_ms)
        window_ms = minutes * 60_000
        out.append(WindowReading(window_name(window_ms), used, reset_ms, window_ms))
    return out


def _utilization_percent(value: str | None) -> float | None:
    """A 0..100 percent header (Codex's ``used-percent``) as a fraction."""
    if value is None:
        return None
    try:
        f = float(value.strip().rstrip("%"))
    except ValueError:
        return None
    if not math.isfinite(f) or f < 0:
        return None
    return f / 100


def _codex_reset(headers: Mapping[str, str], base: str, now_ms: int) -> int | None:
    """``reset-at`` (epoch seconds) or, from older backends, ``reset-after-seconds``."""
    at = _count(headers.get(base + "reset-at") or "")
    if at:
        return at * 1000
    after = _count(headers.get(base + "reset-after-seconds") or "")
    return None if after is None else now_ms + after * 1000


def _used(limit: int | None, remaining: int | None) -> float | None:
    if limit is None or remaining is None or limit <= 0:
        return None
    return min(max(1.0 - remaining / limit, 0.0), 1.0)


def count_limits(snap: RateLimitSnapshot) -> dict[str, tuple[float, int | None]]:
    """The request and token limits the snapshot reports: ``requests`` / ``tokens`` → (used
    fraction, reset in epoch ms or None). OpenAI's ``x-ratelimit-*`` and Anthropic's
    ``anthropic-ratelimit-*`` alike; ``tokens`` is the fullest of the combined, input and output
    token limits (Anthropic splits them; whichever runs out first stops the account), with that
    limit's reset."""
    out: dict[str, tuple[float, int | None]] = {}
    req = _used(snap.requests_limit, snap.requests_remaining)
    if req is not None:
        out["requests"] = (req, snap.requests_reset_ms)
    tok = [
        (u, reset)
        for u, reset in (
            (_used(snap.tokens_limit, snap.tokens_remaining), snap.tokens_reset_ms),
            (
                _used(snap.input_tokens_limit, snap.input_tokens_remaining),
                snap.input_tokens_reset_ms,
            ),
            (
                _used(snap.output_tokens_limit, snap.output_tokens_remaining),
                snap.output_tokens_reset_ms,
            ),
        )
        if u is not None
    ]
    if tok:
        out["tokens"] = max(tok, key=lambda t: t[0])
    return out


def used_fractions(snap: RateLimitSnapshot) -> dict[str, float]:
    """How full each reported limit is, keyed for the quota engine: ``requests``, ``tokens``
    (:func:`count_limits`), ``percent/<window>`` (``5h``, ``weekly``, ``monthly``…); only keys
    the snapshot knows are present."""
    out = {unit: used for unit, (used, _reset) in count_limits(snap).items()}
    for reading in snap.percent_windows:
        key = reading.counter
        out[key] = max(out.get(key, 0.0), reading.used)
    return out
