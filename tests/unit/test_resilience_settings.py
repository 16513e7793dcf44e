"""Resilience settings: SPEC §9 defaults, DB > env > default, per-provider overrides."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fairgate.process.settings import Settings
from fairgate.resilience.breaker import BreakerConfig
from fairgate.resilience.settings import ResilienceSettings


def from_sources(
    env: dict[str, str],
    db: dict[str, str] | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> ResilienceSettings:
    """The resilience settings the settings object resolves from ``db`` > ``env`` > default."""
    return ResilienceSettings.from_knobs(Settings.load(env, db=db).resilience, overrides)


def test_defaults_are_the_spec() -> None:
    s = from_sources({})
    assert s == ResilienceSettings()
    assert (s.breaker_threshold, s.breaker_min_requests, s.breaker_window_ms) == (0.5, 5, 60_000)
    assert (s.oauth_base_cooldown_ms, s.apikey_base_cooldown_ms, s.max_cooldown_ms) == (
        5_000,
        3_000,
        300_000,
    )
    assert s.breaker_config() == BreakerConfig()


def test_db_wins_over_env_and_bad_values_fall_through() -> None:
    env = {"RESILIENCE_BREAKER_THRESHOLD": "0.6", "RESILIENCE_MAX_COOLDOWN_MS": "120000"}
    db = {"resilience.breakerThreshold": "0.9", "resilience.maxCooldownMs": "not a number"}
    s = from_sources(env, db)
    assert s.breaker_threshold == 0.9
    assert s.max_cooldown_ms == 120_000


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("RESILIENCE_BREAKER_THRESHOLD", "1.5"),
        ("RESILIENCE_BREAKER_MIN_REQUESTS", "0"),
        ("RESILIENCE_WARN_FRACTION", "nan"),
        ("RESILIENCE_BREAKER_COUNTS_RATE_LIMITS", "perhaps"),
    ],
)
def test_out_of_range_values_are_ignored(variable: str, raw: str) -> None:
    assert from_sources({variable: raw}) == ResilienceSettings()


def test_per_provider_overrides_from_config_and_db() -> None:
    overrides = {
        "anthropic": {"breaker_cooldown_ms": 60_000, "apikeyBaseCooldownMs": 1_000},
        "glm": {"unknown_field": 1, "breaker_threshold": 7},
    }
    db = {"resilience.providers": json.dumps({"anthropic": {"breakerCooldownMs": 90_000}})}
    s = from_sources({}, db, overrides)
    a = s.for_provider("anthropic")
    assert a.breaker_cooldown_ms == 90_000  # the DB wins
    assert a.apikey_base_cooldown_ms == 1_000
    assert a.breaker_config().cooldown_ms == 90_000
    assert s.for_provider("glm") == s  # nothing valid to apply
    assert s.for_provider("openai") is s


def test_broken_providers_json_is_ignored() -> None:
    s = from_sources({}, {"resilience.providers": "{not json"})
    assert s.providers == {}
