"""Settings precedence: DB > env > default; bad values are ignored, not fatal."""

from __future__ import annotations

from fairgate.quota.settings import QuotaSettings


def test_defaults() -> None:
    s = QuotaSettings.from_sources({})
    assert (s.saturation_threshold, s.soft_deprioritize_factor, s.retention_days) == (0.5, 0.7, 14)
    assert s.retention_ms == 14 * 86_400_000


def test_env_then_db() -> None:
    env = {"QUOTA_SATURATION_THRESHOLD": "0.8", "QUOTA_SOFT_DEPRIORITIZE_FACTOR": "0.5"}
    assert QuotaSettings.from_sources(env).saturation_threshold == 0.8
    s = QuotaSettings.from_sources(env, {"quota.saturationThreshold": "0.6"})
    assert (s.saturation_threshold, s.soft_deprioritize_factor) == (0.6, 0.5)


def test_bad_values_fall_through() -> None:
    env = {"QUOTA_SATURATION_THRESHOLD": "1.5", "QUOTA_CONSUMPTION_RETENTION_DAYS": "nan"}
    s = QuotaSettings.from_sources(env, {"quota.saturationThreshold": "abc"})
    assert s.saturation_threshold == 0.5
    assert s.retention_days == 14
