"""Upstream accounts ("connections"): the wire each speaks, how it authenticates, what it serves.

The ground floor of the house: plain records every floor above reads (the metadata database
stores them, the snapshot indexes them, the upstream client sends with them), so they live here,
importing nothing of fairgate's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Protocol(StrEnum):
    """The wire format a connection speaks upstream."""

    OPENAI = "openai"  # chat completions: openai, kimi, glm, minimax, deepseek, mock, ...
    ANTHROPIC = "anthropic"  # messages: anthropic, claude
    RESPONSES = "responses"  # the OpenAI Responses API, streamed: codex (the ChatGPT backend)


#: Providers that speak the Anthropic messages API; every other provider is OpenAI-compatible.
ANTHROPIC_PROVIDERS = frozenset({"anthropic", "claude"})
#: Providers whose only wire is the Responses API.
RESPONSES_PROVIDERS = frozenset({"codex"})


def protocol_for(provider: str, explicit: str | None = None) -> Protocol:
    if explicit:
        return Protocol(explicit)
    if provider in ANTHROPIC_PROVIDERS:
        return Protocol.ANTHROPIC
    return Protocol.RESPONSES if provider in RESPONSES_PROVIDERS else Protocol.OPENAI


class AuthType(StrEnum):
    """How a connection authenticates upstream: an API key, or an OAuth token (subscription
    accounts: longer cooldowns, since their limits reset on the provider's schedule)."""

    APIKEY = "apikey"
    OAUTH = "oauth"


@dataclass(frozen=True, slots=True)
class Connection:
    """One upstream account. ``secret`` is the upstream credential: never logged or returned."""

    id: str
    provider: str
    base_url: str
    secret: str = field(repr=False)
    protocol: Protocol = Protocol.OPENAI
    auth_type: AuthType = AuthType.APIKEY
    weight: float = 1.0
    max_concurrent: int | None = None
    #: models this connection serves; ``"*"`` among them means any model (it must be said:
    #: an empty list serves nothing)
    models: tuple[str, ...] = ()
    enabled: bool = True
    #: client headers passed upstream besides the wire's functional ones (lower-case names;
    #: ``providers.upstream.WIRE_HEADERS``); none by default, so a tenant cannot choose the
    #: organisation or project billed on a shared account
    forward_headers: tuple[str, ...] = ()
    #: billing-relevant body fields (:data:`BILLING_FIELDS`) a client may set on this
    #: connection; the others are not sent, so the account's defaults bill every tenant alike
    billing_fields: tuple[str, ...] = ()

    def serves(self, model: str) -> bool:
        return model != ANY_MODEL and (model in self.models or ANY_MODEL in self.models)

    @property
    def named_models(self) -> tuple[str, ...]:
        """The models listed by name (what ``/v1/models`` shows and quota-share combos use)."""
        return tuple(m for m in self.models if m != ANY_MODEL)


#: Request body fields that choose how a shared account is billed or what it keeps: OpenAI's
#: and Anthropic's ``service_tier`` (priority processing costs more; OpenAI's ``flex`` less,
#: slower) and OpenAI's ``store`` (the completion is kept on the account, for its owner's
#: evals and distillation). A connection sends them only when its ``billing_fields`` lists
#: them (issue 43, N13).
BILLING_FIELDS: tuple[str, ...] = ("service_tier", "store")

#: A connection's model list entry that means "any model".
ANY_MODEL = "*"
