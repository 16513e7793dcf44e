"""``POST /connections/{id}/oauth``: log an OAuth (subscription) connection in.

Two ways, one body: the operator hands over a token pair they obtained (``refreshToken``, with
``accessToken`` and ``expiresAt`` when known — what ``fairgate connections login`` reads from a
Codex ``auth.json`` or Claude credentials file), or the one-time ``authorizationCode`` of a PKCE
login with its ``codeVerifier`` and ``redirectUri``, which fairgate trades at ``tokenUrl``
(``grant_type=authorization_code``) itself. Either way the tokens go sealed to the token store,
lift an ``auth`` block, and are never echoed: the answer is the health entry (state, expiry).
``tokenUrl``/``clientId`` are kept in the settings so a restart and the other replicas refresh
at the same endpoint (:mod:`fairgate.process.oauth_service`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from pydantic import Field, StringConstraints

from fairgate.admin.common import ERROR_RESPONSES, GW, AdminError, invalid
from fairgate.admin.models import ApiModel, ErrorBody
from fairgate.config import HttpUrl
from fairgate.db.common import Conflict
from fairgate.db.settings import SettingsRepo
from fairgate.domain.tokens import TokenSet
from fairgate.process.oauth_service import CLIENT_SETTING, OAuthClient
from fairgate.providers.oauth import RefreshRejected, RefreshUnavailable, chatgpt_account_id

router = APIRouter(responses=ERROR_RESPONSES)
_UPSTREAM: dict[int | str, dict[str, object]] = {s: {"model": ErrorBody} for s in (502, 503)}

Token = Annotated[str, StringConstraints(min_length=1, max_length=20_000, pattern=r"^\S+$")]


class OAuthLoginIn(ApiModel):
    token_url: HttpUrl = Field(description="The provider's token endpoint")
    client_id: str = Field(default="", max_length=500)
    access_token: Token | None = Field(default=None, repr=False, description="Write-only")
    refresh_token: Token | None = Field(default=None, repr=False, description="Write-only")
    expires_at: int | None = Field(
        default=None, ge=0, le=10**11, description="Access token expiry, epoch seconds"
    )
    account_id: str | None = Field(default=None, max_length=500)
    authorization_code: Token | None = Field(default=None, repr=False, description="Write-only")
    code_verifier: Token | None = Field(default=None, repr=False)
    redirect_uri: str | None = Field(default=None, max_length=2000)


class OAuthLoginOut(ApiModel):
    connection_id: str
    state: str
    reason: str | None
    expires_at_ms: int | None
    account_id: str | None


def _checked(body: OAuthLoginIn) -> None:
    """Exactly one way in, each with what it needs (422 naming the field)."""
    if body.authorization_code is None and body.refresh_token is None:
        raise invalid([("refreshToken", "give refreshToken (a token pair) or authorizationCode")])
    if body.authorization_code is not None:
        given = [n for n in ("refresh_token", "access_token") if getattr(body, n) is not None]
        if given:
            name = OAuthLoginIn.model_fields[given[0]].alias or given[0]
            raise invalid([(name, "not with authorizationCode (the code buys the tokens)")])
        missing = [
            (alias, "required with authorizationCode")
            for alias, v in (
                ("codeVerifier", body.code_verifier),
                ("redirectUri", body.redirect_uri),
            )
            if not v
        ]
        if missing:
            raise invalid(missing)


async def _tokens(gw: GW, body: OAuthLoginIn, client: OAuthClient) -> TokenSet:
    assert gw.oauth is not None
    if body.authorization_code is None:
        access = body.access_token or ""
        return TokenSet(
            access,
            body.refresh_token or "",
            # without an access token or its expiry: refreshed before the first use
            body.expires_at * 1000 if body.expires_at is not None and access else 0,
            body.account_id or chatgpt_account_id(access),
        )
    try:
        tokens = await gw.oauth.endpoint(client).exchange_code(
            body.authorization_code, body.code_verifier or "", body.redirect_uri or ""
        )
    except RefreshRejected as exc:
        raise invalid(
            [("authorizationCode", f"the token endpoint refused the code ({exc})")]
        ) from None
    except RefreshUnavailable as exc:
        raise AdminError(502, f"the token endpoint did not answer ({exc})") from None
    return (
        tokens
        if body.account_id is None
        else TokenSet(
            tokens.access_token,
            tokens.refresh_token,
            tokens.expires_at_ms,
            body.account_id,
            tokens.issued_at_ms,
        )
    )


@router.post("/connections/{connection_id}/oauth", tags=["connections"], responses=_UPSTREAM)
async def oauth_login(connection_id: str, body: OAuthLoginIn, gw: GW) -> OAuthLoginOut:
    """Store new OAuth tokens for an ``authType: oauth`` connection (404 unknown, 409 not
    OAuth); the answer carries no token."""
    conn = gw.connections().get(connection_id)
    if conn.auth_type != "oauth":
        raise Conflict(f"connection '{connection_id}' has authType '{conn.auth_type}', not oauth")
    if gw.oauth is None:
        raise AdminError(503, "the OAuth side of the gateway is not running")
    _checked(body)
    client = OAuthClient(body.token_url, body.client_id)
    tokens = await _tokens(gw, body, client)
    health = await gw.oauth.login(connection_id, client, tokens)
    SettingsRepo(gw.db).set(CLIENT_SETTING + connection_id, client.dumps())  # → other replicas
    return OAuthLoginOut(
        connection_id=connection_id,
        state=health.state,
        reason=health.reason,
        expires_at_ms=health.expires_at_ms,
        account_id=tokens.account_id,
    )
