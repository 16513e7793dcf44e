"""The credential gate's pure core: every credential kind, one verdict each."""

from __future__ import annotations

import pytest

from fairgate.resilience.credential_gate import (
    CredentialFacts,
    CredentialProblem,
    credential_gate,
)

P = CredentialProblem


@pytest.mark.parametrize(
    ("facts", "problem", "action"),
    [
        (CredentialFacts(oauth=False), None, None),
        (CredentialFacts(oauth=False, has_secret=False), P.API_KEY_MISSING, "set the API key"),
        # a local server over plain http often takes no key
        (CredentialFacts(oauth=False, has_secret=False, key_required=False), None, None),
        (CredentialFacts(oauth=True, oauth_state="ok"), None, None),
        (CredentialFacts(oauth=True, oauth_state="blocked"), P.OAUTH_BLOCKED, "log in again"),
        # the token endpoint is down but the token still valid: usable
        (CredentialFacts(oauth=True, oauth_state="degraded"), None, None),
        (
            CredentialFacts(oauth=True, oauth_state="degraded", oauth_expired=True),
            P.OAUTH_EXPIRED,
            "log in again",
        ),
        (
            CredentialFacts(oauth=True, has_secret=False, oauth_has_tokens=False),
            P.OAUTH_MISSING,
            "log in again",
        ),
        (
            CredentialFacts(oauth=True, oauth_state="blocked", serves_model=False),
            P.MODEL_NOT_SERVED,
            "add the model to the connection",
        ),
    ],
)
def test_gate(
    facts: CredentialFacts, problem: CredentialProblem | None, action: str | None
) -> None:
    v = credential_gate(facts)
    assert (v.problem, v.action, v.usable) == (problem, action, problem is None)
