"""What fairgate does when a provider fails: classify, back off, trip, fail over.

Failures classified (``classify``, ``evidence``), cooldowns and lockouts (``backoff``,
``state``, ``state_redis``, ``persistence``, ``writer``), circuit breakers (``breaker``), the
credential gate, the one failover rule (``failover``), the knobs (``settings``) and the
manager the request path asks (``manager``, built by ``factory``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.resilience.classify import CODE_TABLE, Classification, FailureClass
    from fairgate.resilience.credential_gate import USABLE, CredentialFacts, CredentialVerdict
    from fairgate.resilience.evidence import request_explains
    from fairgate.resilience.factory import build_manager
    from fairgate.resilience.failover import Step, same_model_is_futile, step_after
    from fairgate.resilience.manager import (
        SHADOW_KEY_SUFFIX,
        Exclusion,
        RateLimitManager,
        all_rate_limited,
    )
    from fairgate.resilience.settings import ResilienceSettings, knob_names, parse_knob
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = [
    "CODE_TABLE",
    "SHADOW_KEY_SUFFIX",
    "USABLE",
    "Classification",
    "CredentialFacts",
    "CredentialVerdict",
    "Exclusion",
    "FailureClass",
    "RateLimitManager",
    "ResilienceSettings",
    "Step",
    "all_rate_limited",
    "build_manager",
    "knob_names",
    "parse_knob",
    "request_explains",
    "same_model_is_futile",
    "step_after",
]
