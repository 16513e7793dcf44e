"""The ground floor: the domain vocabulary every other package of fairgate speaks.

Plain records and pure parsers with no fairgate import (an import-linter contract holds it):
connections and their wires, client keys, OAuth token sets, breaker states, the units and windows
quota is counted in, the providers' rate-limit readings and the one parser of retry times.
"""

from __future__ import annotations

from fairgate.domain.breaker import BreakerState
from fairgate.domain.connections import (
    ANY_MODEL,
    BILLING_FIELDS,
    AuthType,
    Connection,
    Protocol,
    protocol_for,
)
from fairgate.domain.keys import ClientKey, Denial, hash_key
from fairgate.domain.readings import RateLimitSnapshot, count_limits, parse_rate_limit_headers
from fairgate.domain.retry_after import parse_delay_ms
from fairgate.domain.tokens import TokenSet
from fairgate.domain.units import UNKNOWN_LIMIT, Unit, Window, WindowAnchor

__all__ = [
    "ANY_MODEL",
    "BILLING_FIELDS",
    "UNKNOWN_LIMIT",
    "AuthType",
    "BreakerState",
    "ClientKey",
    "Connection",
    "Denial",
    "Protocol",
    "RateLimitSnapshot",
    "TokenSet",
    "Unit",
    "Window",
    "WindowAnchor",
    "count_limits",
    "hash_key",
    "parse_delay_ms",
    "parse_rate_limit_headers",
    "protocol_for",
]
