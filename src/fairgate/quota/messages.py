"""Client-facing block messages (SPEC §4); exact wording users of this kind of engine know."""

from __future__ import annotations

from fairgate.quota.decision import Reason


def block_message(reason: Reason, provider: str, model: str | None = None) -> str:
    if reason is Reason.FAIR_SHARE:
        return f"Quota share limit reached for your API key on {provider}"
    if reason is Reason.CAP_ABSOLUTE:
        return f"Absolute quota cap reached for your API key on {provider}"
    if reason is Reason.MODEL_CAP:
        return f"Model cap reached for your API key on {provider}/{model or ''}"
    return f"Provider {provider} quota window is saturated; no shared capacity available"
