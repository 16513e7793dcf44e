"""The quota engine's knobs, as plain values.

Where they come from (DB setting > environment > config file > default) is resolved in one
place for every setting, :mod:`fairgate.process.settings`, which hands the engine this object.
"""

from __future__ import annotations

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
