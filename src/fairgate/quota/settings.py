"""Quota engine settings and where they come from: DB setting > environment > default."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    saturation_threshold: float = 0.5
    soft_deprioritize_factor: float = 0.7
    retention_days: float = 14.0
    lease_ms: int = 10 * 60_000
    active_refresh_ms: int = 1_000
    default_max_tokens: int = 1024

    @property
    def retention_ms(self) -> int:
        return int(self.retention_days * 86_400_000)

    @classmethod
    def from_sources(
        cls, env: Mapping[str, str], db: Mapping[str, str] | None = None
    ) -> QuotaSettings:
        """Read each knob from the DB settings, else the environment, else the default.

        A value that does not parse or lies outside its range is ignored (the next source
        wins) rather than crashing the gateway at start.
        """
        db = db or {}

        def pick(db_key: str, env_key: str, default: float, lo: float, hi: float) -> float:
            for raw in (db.get(db_key), env.get(env_key)):
                if raw is None or str(raw).strip() == "":
                    continue
                try:
                    v = float(raw)
                except ValueError:
                    continue
                if math.isfinite(v) and lo <= v <= hi:
                    return v
            return default

        return cls(
            saturation_threshold=pick(
                "quota.saturationThreshold", "QUOTA_SATURATION_THRESHOLD", 0.5, 0.0, 1.0
            ),
            soft_deprioritize_factor=pick(
                "quota.softDeprioritizeFactor", "QUOTA_SOFT_DEPRIORITIZE_FACTOR", 0.7, 0.0, 1.0
            ),
            retention_days=pick(
                "quota.consumptionRetentionDays",
                "QUOTA_CONSUMPTION_RETENTION_DAYS",
                14.0,
                0.0,
                3650.0,
            ),
            # how long an admission's reservation lives unsettled (a crashed replica's are
            # reclaimed after it); at least a second, at most a day
            lease_ms=int(pick("quota.leaseMs", "QUOTA_LEASE_MS", 10 * 60_000, 1_000, 86_400_000)),
        )
