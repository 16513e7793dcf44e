"""The three states of a provider's circuit breaker, as every floor names them.

The breaker itself (``fairgate.resilience.breaker``) moves between them; routing reads them to
skip or prefer targets and the admin surfaces show them, so the names live on the ground floor.
"""

from __future__ import annotations

from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"
