"""The credential gate's adapter: the facts of a connection's credential, gathered from the
connection and the OAuth token lifecycle, handed to the pure
:func:`fairgate.resilience.credential_gate.credential_gate`.

Every target loop calls :func:`gate` before resilience and admission (the executor's
``_admit``), and ``/health``, the connections API (hence the dashboard and
``fairgate connections``) call :func:`verdict`, so the reason a request skipped a connection
and the action an admin reads are one decision. Cost per candidate: a dict lookup; a blocked
OAuth connection reads its stored tokens again at most every few seconds
(:meth:`~fairgate.providers.oauth.OAuthTokens.recheck`), so a login through another replica
lifts the block here too.
"""

from __future__ import annotations

from fairgate.domain.connections import AuthType, Connection
from fairgate.providers.oauth import OAuthTokens
from fairgate.resilience.credential_gate import (
    USABLE,
    CredentialFacts,
    CredentialVerdict,
    credential_gate,
)

__all__ = ["facts", "gate", "verdict"]


def facts(
    conn: Connection, model: str | None, tokens: OAuthTokens | None, now_ms: int
) -> CredentialFacts:
    """The plain facts of ``conn``'s credential (``model`` None: whatever it is asked)."""
    serves = model is None or conn.serves(model)
    if conn.auth_type is not AuthType.OAUTH:
        return CredentialFacts(
            oauth=False,
            has_secret=bool(conn.secret),
            key_required=conn.base_url.startswith("https://"),
            serves_model=serves,
        )
    health = None if tokens is None else tokens.standing(conn.id)
    if health is None:  # not managed: the configured secret is sent as a static bearer
        return CredentialFacts(
            oauth=True,
            has_secret=bool(conn.secret),
            oauth_has_tokens=False,
            serves_model=serves,
        )
    exp = health.expires_at_ms
    return CredentialFacts(
        oauth=True,
        has_secret=bool(conn.secret),
        oauth_state=health.state,
        oauth_expired=exp is not None and now_ms >= exp,
        serves_model=serves,
    )


def verdict(
    conn: Connection, tokens: OAuthTokens | None, now_ms: int, model: str | None = None
) -> CredentialVerdict:
    """The gate's answer for ``conn`` (for the health and connections views: any model)."""
    return credential_gate(facts(conn, model, tokens, now_ms))


async def gate(
    conn: Connection, model: str, tokens: OAuthTokens | None, now_ms: int
) -> CredentialVerdict:
    """The stage of the target loop: whether ``conn`` may be attempted for ``model`` now."""
    if conn.auth_type is AuthType.OAUTH and tokens is not None:
        await tokens.recheck(conn.id)  # a no-op unless blocked and due
    elif conn.secret and conn.serves(model):
        return USABLE  # the usual case, without building the facts
    return credential_gate(facts(conn, model, tokens, now_ms))
