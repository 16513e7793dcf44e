"""The credential gate: a stage of the target loop that skips, before any attempt, a
connection whose credential is known unusable (issue 44, item 2).

Why a gate and not a failure: a blocked OAuth login, an access token that expired with its
refresh failing, a missing API key or a connection that does not serve the asked model cannot
answer, and finding that out by *attempting* costs the request an error and, worse, feeds the
provider-wide breaker, so one dead account took a healthy one of the same provider down (the
half-open probe picked the dead one again). The gate decides from what is already known,
without I/O, so a skipped connection is never attempted, never counts against its provider, and
the reason an admin must act on ("log in again") is the same one ``/health``, the dashboard
and ``fairgate connections`` show.

This module is the pure core, over plain data (:class:`CredentialFacts` in,
:class:`CredentialVerdict` out); the gateway's adapter (``fairgate.process.credentials``)
gathers the facts from the connection and the OAuth token lifecycle. Every credential kind
goes through the same function, and every target loop (plain models, quota-share, user
combos, the combo pipeline) calls the same stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "USABLE",
    "CredentialFacts",
    "CredentialProblem",
    "CredentialVerdict",
    "credential_gate",
]


class CredentialProblem(StrEnum):
    """Why a credential cannot be used now (the reason code diagnostics and APIs show)."""

    OAUTH_BLOCKED = "oauth-blocked"  # the provider refused the refresh token or a fresh token
    OAUTH_EXPIRED = "oauth-expired"  # the access token expired and its refresh failed
    OAUTH_MISSING = "oauth-missing"  # an OAuth connection with no tokens (never logged in)
    API_KEY_MISSING = "api-key-missing"  # an API-key connection without a secret
    MODEL_NOT_SERVED = "model-not-served"  # the connection does not list the model


#: What an admin does about each problem: the words /health, the dashboard and the CLI show.
_ACTIONS = {
    CredentialProblem.OAUTH_BLOCKED: "log in again",
    CredentialProblem.OAUTH_EXPIRED: "log in again",
    CredentialProblem.OAUTH_MISSING: "log in again",
    CredentialProblem.API_KEY_MISSING: "set the API key",
    CredentialProblem.MODEL_NOT_SERVED: "add the model to the connection",
}


@dataclass(frozen=True, slots=True)
class CredentialFacts:
    """What is known of one connection's credential for one request, as plain data.

    ``oauth_state`` is the token lifecycle's state (``ok``, ``degraded``, ``blocked``) or None
    when the connection is not OAuth-managed; ``oauth_expired``: its access token's expiry
    has passed (with ``degraded`` this is "expired with a failed refresh");
    ``oauth_has_tokens``: tokens were ever supplied (configured or logged in);
    ``key_required``: an API-key connection cannot work without its key (a hosted API, over
    https; a local server over plain http, such as Ollama or vLLM, often takes none)."""

    oauth: bool
    has_secret: bool = True
    key_required: bool = True
    oauth_state: str | None = None
    oauth_expired: bool = False
    oauth_has_tokens: bool = True
    serves_model: bool = True


@dataclass(frozen=True, slots=True)
class CredentialVerdict:
    """The gate's answer: usable, or the problem and the admin's action."""

    problem: CredentialProblem | None = None

    @property
    def usable(self) -> bool:
        return self.problem is None

    @property
    def action(self) -> str | None:
        return None if self.problem is None else _ACTIONS[self.problem]

    def as_json(self) -> dict[str, object]:
        return {
            "usable": self.usable,
            "problem": None if self.problem is None else self.problem.value,
            "action": self.action,
        }


USABLE = CredentialVerdict()


def credential_gate(facts: CredentialFacts) -> CredentialVerdict:
    """Whether the credential can serve the request now; the first problem found otherwise.

    A ``degraded`` OAuth connection whose token is still valid is usable (the token endpoint
    is down, the token is not); one whose token has expired is not, since every attempt would
    fail before reaching the provider. An API-key connection to a hosted API needs its key."""
    if not facts.serves_model:
        return CredentialVerdict(CredentialProblem.MODEL_NOT_SERVED)
    if facts.oauth:
        if facts.oauth_state == "blocked":
            return CredentialVerdict(CredentialProblem.OAUTH_BLOCKED)
        if not facts.oauth_has_tokens and not facts.has_secret:
            return CredentialVerdict(CredentialProblem.OAUTH_MISSING)
        if facts.oauth_state == "degraded" and facts.oauth_expired:
            return CredentialVerdict(CredentialProblem.OAUTH_EXPIRED)
        return USABLE
    if not facts.has_secret and facts.key_required:
        return CredentialVerdict(CredentialProblem.API_KEY_MISSING)
    return USABLE
