"""The mock provider's OAuth authority: issues, refreshes, expires and revokes tokens.

Modelled on the token endpoints subscription clients use (the Codex CLI's refresh against
OpenAI's auth server, Claude Code's against Anthropic's): ``POST`` a JSON (or form) body
``{"grant_type": "refresh_token", "refresh_token": ..., "client_id": ...}``; success is 200
``{"access_token", "refresh_token", "id_token", "token_type": "Bearer", "expires_in"}`` with a
**rotated** refresh token (the one just used is dead from then on); a dead, unknown or revoked
refresh token is 400 ``{"error": "invalid_grant", "error_description": ...}``; a missing field
is 400 ``invalid_request``. Access tokens live ``access_ttl_ms`` and are then refused with 401,
as the real APIs refuse an expired bearer token.

Pure apart from the injected clock; the mock's HTTP handlers call it, and in-process tests can
call it directly. ``refresh_calls`` counts every refresh attempt (the replica-race test asserts
exactly one).

The first login is the authorization-code grant with PKCE (RFC 7636), as the Codex CLI's
``codex login`` and Claude Code's login do: ``authorize`` stands for the browser step and
returns a one-time ``code`` bound to the ``code_challenge`` (S256) and ``redirect_uri``; the
token endpoint then takes ``{"grant_type": "authorization_code", "code", "code_verifier",
"redirect_uri", "client_id"}`` and answers like a refresh. A used, unknown or mismatched code
is 400 ``invalid_grant``.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from fairgate.clock import Clock


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


__all__ = ["ACCESS_PREFIX", "OAUTH_BETA", "Grant", "MockTokenIssuer"]

#: Access tokens are JWT-shaped like OpenAI's (the payload names the ChatGPT account under
#: ``https://api.openai.com/auth``), unsigned; every one starts with this encoded header, which
#: is how the mock tells OAuth tokens from API keys (real providers do by their own prefixes).
_JWT_HEADER = {"alg": "none", "typ": "JWT", "kid": "fairgate-mock"}
ACCESS_PREFIX = _b64(orjson.dumps(_JWT_HEADER)) + "."
#: The ``anthropic-beta`` flag Anthropic requires beside an OAuth bearer token.
OAUTH_BETA = "oauth-2025-04-20"

DEFAULT_ACCESS_TTL_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class Grant:
    account_id: str
    expires_at_ms: int


class MockTokenIssuer:
    def __init__(self, clock: Clock, *, access_ttl_ms: int = DEFAULT_ACCESS_TTL_MS) -> None:
        self._clock = clock
        self.access_ttl_ms = access_ttl_ms
        self._access: dict[str, Grant] = {}
        self._refresh: dict[str, str] = {}  # live refresh token → account id
        self.refresh_calls = 0
        self.code_exchanges = 0
        self.failing = False  # answer 503 (the authority is down)
        # one-time authorization code → (account id, code challenge, redirect uri)
        self._codes: dict[str, tuple[str, str, str]] = {}

    def login(self, account_id: str) -> dict[str, Any]:
        """A first token pair, as an interactive login would give (what ``auth.json`` holds)."""
        return self._issue(account_id)

    def _issue(self, account_id: str) -> dict[str, Any]:
        expires = self._clock.now_ms() + self.access_ttl_ms
        claims = {
            "https://api.openai.com/auth": {"chatgpt_account_id": account_id},
            "exp": expires // 1000,
            "jti": secrets.token_urlsafe(12),
        }
        access = ACCESS_PREFIX + _b64(orjson.dumps(claims)) + "." + secrets.token_urlsafe(16)
        refresh = "mock-rt-" + secrets.token_urlsafe(24)
        self._access[access] = Grant(account_id, expires)
        self._refresh[refresh] = account_id
        return {
            "access_token": access,
            "refresh_token": refresh,
            "id_token": "mock-id-" + secrets.token_urlsafe(8),
            "token_type": "Bearer",
            "expires_in": self.access_ttl_ms // 1000,
            "account_id": account_id,
        }

    def authorize(self, account_id: str, code_challenge: str, redirect_uri: str) -> str:
        """The browser step of a login: a one-time code for this challenge and redirect."""
        code = "mock-code-" + secrets.token_urlsafe(16)
        self._codes[code] = (account_id, code_challenge, redirect_uri)
        return code

    def _exchange(self, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        self.code_exchanges += 1
        code, verifier = body.get("code"), body.get("code_verifier")
        if not isinstance(code, str) or not isinstance(verifier, str):
            return 400, {"error": "invalid_request", "error_description": "code missing"}
        grant = self._codes.pop(code, None)  # a code works once, whatever the outcome
        challenge = _b64(hashlib.sha256(verifier.encode()).digest())
        if grant is None or grant[1] != challenge or grant[2] != body.get("redirect_uri"):
            return 400, {
                "error": "invalid_grant",
                "error_description": "authorization code is invalid, used or does not match",
            }
        return 200, self._issue(grant[0])

    def token(self, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """The token endpoint: (status, JSON body)."""
        if body.get("grant_type") == "authorization_code" and not self.failing:
            return self._exchange(body)
        if body.get("grant_type") != "refresh_token":
            return 400, {"error": "unsupported_grant_type"}
        self.refresh_calls += 1
        if self.failing:
            return 503, {"error": "temporarily_unavailable"}
        refresh = body.get("refresh_token")
        if not isinstance(refresh, str) or not refresh:
            return 400, {"error": "invalid_request", "error_description": "refresh_token missing"}
        account = self._refresh.pop(refresh, None)  # rotation: a refresh token works once
        if account is None:
            return 400, {
                "error": "invalid_grant",
                "error_description": "refresh token is invalid, expired, revoked or already used",
            }
        return 200, self._issue(account)

    def check(self, authorization: str | None) -> tuple[str | None, str]:
        """(account id, "") for a live ``Bearer`` token, else (None, why) for the 401."""
        if not authorization or not authorization.startswith("Bearer "):
            return None, "missing bearer token"
        grant = self._access.get(authorization[len("Bearer ") :])
        if grant is None:
            return None, "invalid access token"
        if self._clock.now_ms() >= grant.expires_at_ms:
            return None, "access token expired"
        return grant.account_id, ""

    def revoke_all(self, account_id: str) -> None:
        """The user signed out everywhere: every refresh token of the account dies."""
        self._refresh = {t: a for t, a in self._refresh.items() if a != account_id}
