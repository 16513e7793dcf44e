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


def test_lease_knob_env_db_and_range() -> None:
    assert QuotaSettings.from_sources({}).lease_ms == 600_000
    assert QuotaSettings.from_sources({"QUOTA_LEASE_MS": "2500"}).lease_ms == 2_500
    both = QuotaSettings.from_sources({"QUOTA_LEASE_MS": "2500"}, {"quota.leaseMs": "90000"})
    assert both.lease_ms == 90_000
    # below a second, above a day or not a number: ignored, the next source wins
    for bad in ("999", "86400001", "soon", "inf"):
        assert QuotaSettings.from_sources({"QUOTA_LEASE_MS": bad}).lease_ms == 600_000
