"""Resilience settings (SPEC §9 defaults) and where they come from.

Precedence, as for every fairgate setting: DB setting (admin API) > environment variable >
built-in default, per knob: :class:`ResilienceKnobs` declares each knob's sources, range and
meaning, and the one settings object (``fairgate.process.settings``) resolves them. Per-provider
overrides (a provider whose 429s mean something different, an upstream that needs a longer
breaker cool-down) come from the config file or the admin API as ``{provider: {field: value}}``;
the DB key ``resilience.providers`` (a JSON object of the same shape) wins over the config file,
field by field.

A value that does not parse or lies outside its range is ignored with a warning (the next
source wins) rather than crashing the gateway at start: a typo in an env var must not take the
proxy down.

=====================================  ===================================  ========
field                                  environment variable                 default
=====================================  ===================================  ========
breaker_threshold                      RESILIENCE_BREAKER_THRESHOLD         0.5
breaker_min_requests                   RESILIENCE_BREAKER_MIN_REQUESTS      5
breaker_window_ms                      RESILIENCE_BREAKER_WINDOW_MS         60000
breaker_cooldown_ms                    RESILIENCE_BREAKER_COOLDOWN_MS       30000
breaker_max_cooldown_ms                RESILIENCE_BREAKER_MAX_COOLDOWN_MS   300000
breaker_probe_lease_ms                 RESILIENCE_BREAKER_PROBE_LEASE_MS    120000
breaker_counts_rate_limits             RESILIENCE_BREAKER_COUNTS_RATE_LIMITS false
oauth_base_cooldown_ms                 RESILIENCE_OAUTH_BASE_COOLDOWN_MS    5000
apikey_base_cooldown_ms                RESILIENCE_APIKEY_BASE_COOLDOWN_MS   3000
max_cooldown_ms                        RESILIENCE_MAX_COOLDOWN_MS           300000
max_hint_ms                            RESILIENCE_MAX_HINT_MS               3600000
auth_cooldown_ms                       RESILIENCE_AUTH_COOLDOWN_MS          300000
model_not_found_lockout_ms             RESILIENCE_MODEL_NOT_FOUND_LOCKOUT_MS 300000
level_memory_ms                        RESILIENCE_LEVEL_MEMORY_MS           600000
warn_fraction                          RESILIENCE_WARN_FRACTION             0.1
=====================================  ===================================  ========

DB keys are ``resilience.<camelCaseField>`` (``resilience.breakerThreshold``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from fairgate.records import camel
from fairgate.resilience.breaker import BreakerConfig
from fairgate.setting_source import From

__all__ = ["ResilienceKnobs", "ResilienceSettings"]

_DAY_MS = 86_400_000

# field -> (lowest, highest) accepted value; bools are listed separately
_RANGES: dict[str, tuple[float, float]] = {
    "breaker_threshold": (1e-9, 1.0),
    "breaker_min_requests": (1, 1_000_000),
    "breaker_window_ms": (1_000, _DAY_MS),
    "breaker_cooldown_ms": (0, _DAY_MS),
    "breaker_max_cooldown_ms": (0, 7 * _DAY_MS),
    "breaker_probe_lease_ms": (1_000, _DAY_MS),
    "oauth_base_cooldown_ms": (0, _DAY_MS),
    "apikey_base_cooldown_ms": (0, _DAY_MS),
    "max_cooldown_ms": (0, 7 * _DAY_MS),
    "max_hint_ms": (0, 8 * _DAY_MS),
    "auth_cooldown_ms": (0, 7 * _DAY_MS),
    "model_not_found_lockout_ms": (0, 7 * _DAY_MS),
    "level_memory_ms": (0, 7 * _DAY_MS),
    "warn_fraction": (0, 1),
}
_BOOLS = frozenset({"breaker_counts_rate_limits"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")


def _parse(name: str, raw: object) -> float | bool | None:
    """The value of knob ``name`` from ``raw`` (str, number or bool), or None if unusable."""
    if name in _BOOLS:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        return None
    if isinstance(raw, bool) or raw is None:
        return None
    try:
        value = float(raw) if isinstance(raw, int | float) else float(str(raw).strip())
    except ValueError:
        return None
    lo, hi = _RANGES[name]
    if not math.isfinite(value) or not lo <= value <= hi:
        return None
    return value


_BREAKER = BreakerConfig()


@dataclass(frozen=True, slots=True)
class ResilienceSettings:
    """Every resilience knob; ``providers`` holds per-provider overrides (field -> value)."""

    # the breaker's defaults are BreakerConfig's: one place for them
    breaker_threshold: float = _BREAKER.threshold
    breaker_min_requests: int = _BREAKER.min_requests
    breaker_window_ms: int = _BREAKER.window_ms
    breaker_cooldown_ms: int = _BREAKER.cooldown_ms
    breaker_max_cooldown_ms: int = _BREAKER.max_cooldown_ms
    breaker_probe_lease_ms: int = _BREAKER.probe_lease_ms
    #: A 429 is one account's limit, handled by that connection's cooldown; counting it in the
    #: provider breaker would let one exhausted account black out its healthy siblings.
    breaker_counts_rate_limits: bool = False
    oauth_base_cooldown_ms: int = 5_000
    apikey_base_cooldown_ms: int = 3_000
    max_cooldown_ms: int = 300_000
    max_hint_ms: int = 3_600_000
    auth_cooldown_ms: int = 300_000
    model_not_found_lockout_ms: int = 300_000
    #: How long a cooldown record outlives its deadline so the next failure continues the
    #: backoff (3, 6, 12 s …) instead of starting over; a success forgets it at once.
    level_memory_ms: int = 600_000
    warn_fraction: float = 0.1
    providers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def breaker_config(self) -> BreakerConfig:
        return BreakerConfig(
            threshold=self.breaker_threshold,
            min_requests=self.breaker_min_requests,
            window_ms=self.breaker_window_ms,
            cooldown_ms=self.breaker_cooldown_ms,
            max_cooldown_ms=max(self.breaker_max_cooldown_ms, self.breaker_cooldown_ms),
            probe_lease_ms=self.breaker_probe_lease_ms,
        )

    def for_provider(self, provider: str) -> ResilienceSettings:
        """These settings with ``provider``'s overrides applied (unknown or invalid fields are
        ignored)."""
        overrides = self.providers.get(provider)
        if not overrides:
            return self
        return dataclasses.replace(self, **_valid(overrides))

    @classmethod
    def from_knobs(
        cls, knobs: ResilienceKnobs, overrides: Mapping[str, Mapping[str, Any]] | None = None
    ) -> ResilienceSettings:
        """The knobs as resolved (DB setting > ``RESILIENCE_*`` env > default, by the settings
        object); ``overrides`` are per-provider (config file), merged under the DB's
        ``resilience.providers``, field by field."""
        values = knobs.model_dump(exclude={"providers_json"})
        providers: dict[str, dict[str, Any]] = {
            p: _valid(o) for p, o in (overrides or {}).items() if isinstance(o, Mapping)
        }
        if knobs.providers_json:
            try:
                stored = json.loads(knobs.providers_json)
            except ValueError:
                stored = None
            if isinstance(stored, dict):
                for p, o in stored.items():
                    if isinstance(o, Mapping):
                        providers.setdefault(str(p), {}).update(_valid(o))
        return cls(**values, providers={p: o for p, o in providers.items() if o})


def _knob(name: str, description: str, **limits: Any) -> Any:
    """Knob ``name``'s field, declared from its name in one place: its default
    (:class:`ResilienceSettings`'), its range (``_RANGES`` unless ``limits`` says it as the
    docs should show it), where it is read (DB ``resilience.<camelCase>``, env
    ``RESILIENCE_<NAME>``, lenient) and its check (parsed as the admin API parses it, so a count
    written as ``1500.0`` is 1500, in its range)."""

    def check(raw: object) -> object:
        parsed = _parse(name, raw)
        if parsed is None:
            what = "true or false" if name in _BOOLS else "a number from {:g} to {:g}"
            raise ValueError(f"must be {what.format(*_RANGES.get(name, (0, 0)))}")
        return _typed(name, parsed)

    if not limits and name in _RANGES:
        limits = dict(zip(("ge", "le"), _RANGES[name], strict=True))
    info: Any = Field(default=getattr(_D, name), description=description, **limits)
    source = From(db=f"resilience.{camel(name)}", env=f"RESILIENCE_{name.upper()}", lenient=True)
    info.metadata += [source, BeforeValidator(check)]
    return info


_D = ResilienceSettings()


class ResilienceKnobs(BaseModel):
    """The resilience knobs as the settings object resolves them (its ``resilience`` area;
    every one lenient: a bad value is skipped with a warning, the next source wins)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    breaker_threshold: float = _knob(
        "breaker_threshold",
        "Failure fraction over the window from which a provider's breaker opens",
        gt=0,
        le=1,
    )
    breaker_min_requests: int = _knob(
        "breaker_min_requests", "Requests in the window before the breaker may open"
    )
    breaker_window_ms: int = _knob(
        "breaker_window_ms", "The breaker's sliding window in milliseconds"
    )
    breaker_cooldown_ms: int = _knob(
        "breaker_cooldown_ms", "How long an open breaker stays open before a probe, in milliseconds"
    )
    breaker_max_cooldown_ms: int = _knob(
        "breaker_max_cooldown_ms",
        "The longest an open breaker's cool-down grows to after failed probes",
    )
    breaker_probe_lease_ms: int = _knob(
        "breaker_probe_lease_ms", "How long one probe request holds the half-open breaker"
    )
    breaker_counts_rate_limits: bool = _knob(
        "breaker_counts_rate_limits",
        "Whether a 429 counts as a failure in the provider breaker (off: one "
        "exhausted account would black out its healthy siblings)",
    )
    oauth_base_cooldown_ms: int = _knob(
        "oauth_base_cooldown_ms",
        "First cooldown of an OAuth connection after a failure (doubles per failure)",
    )
    apikey_base_cooldown_ms: int = _knob(
        "apikey_base_cooldown_ms",
        "First cooldown of an API-key connection after a failure (doubles per failure)",
    )
    max_cooldown_ms: int = _knob("max_cooldown_ms", "The longest a connection's cooldown grows to")
    max_hint_ms: int = _knob(
        "max_hint_ms", "The longest retry-after an upstream may impose on a connection"
    )
    auth_cooldown_ms: int = _knob(
        "auth_cooldown_ms", "Cooldown of a connection whose credentials the upstream refused"
    )
    model_not_found_lockout_ms: int = _knob(
        "model_not_found_lockout_ms",
        "How long a connection is skipped for a model it said it does not have",
    )
    level_memory_ms: int = _knob(
        "level_memory_ms",
        "How long a cooldown record outlives its deadline, so the next failure "
        "continues the backoff instead of starting over",
    )
    warn_fraction: float = _knob(
        "warn_fraction",
        "Remaining quota fraction of an upstream account below which it is reported as running low",
    )
    providers_json: Annotated[str | None, From(db="resilience.providers", lenient=True)] = Field(
        default=None,
        description="Per-provider overrides, a JSON object `{provider: {knob: value}}` (over "
        "the config file's, field by field)",
    )


def _typed(name: str, value: float | bool) -> Any:
    """Keep the declared type: ints for ``*_ms`` and counts, floats for fractions."""
    if name in _BOOLS or isinstance(value, bool):
        return bool(value)
    if name in ("breaker_threshold", "warn_fraction"):
        return float(value)
    return int(value)


def _valid(overrides: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in overrides.items():
        name = _snake(str(key))
        if name not in _RANGES and name not in _BOOLS:
            continue
        parsed = _parse(name, raw)
        if parsed is not None:
            out[name] = _typed(name, parsed)
    return out


def knob_names() -> tuple[str, ...]:
    """The camelCase names the admin API and DB settings use (``resilience.<name>``)."""
    return tuple(camel(n) for n in (*_RANGES, *_BOOLS))


def parse_knob(camel_name: str, raw: object) -> float | bool | None:
    """A knob's value from ``raw``, or None when the name is unknown or the value unusable
    (out of range, wrong type): the admin API turns None into a 422 naming the field."""
    name = _snake(camel_name)
    if name not in _RANGES and name not in _BOOLS:
        return None
    parsed = _parse(name, raw)
    return None if parsed is None else _typed(name, parsed)
