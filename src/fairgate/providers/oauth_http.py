"""The OAuth token endpoint over HTTP (the ``TokenEndpoint`` port's adapter).

``POST <token_url>`` with a JSON body ``{"grant_type": "refresh_token", "refresh_token",
"client_id"}`` — what the Codex CLI sends to OpenAI's auth server and Claude Code to
Anthropic's. 200 → the new pair (``expires_in`` seconds; a missing ``refresh_token`` keeps the
old one); 400/401/403 → ``RefreshRejected`` carrying only the provider's error code (never the
body, which could echo the token); anything else, or no answer → ``RefreshUnavailable``.
"""

from __future__ import annotations

from urllib.parse import urlencode

import orjson

from fairgate.clock import Clock
from fairgate.domain.tokens import TokenSet
from fairgate.providers.oauth import RefreshRejected, RefreshUnavailable, chatgpt_account_id
from fairgate.providers.transport import HttpSender

__all__ = ["HttpTokenEndpoint"]

_REJECTED = frozenset({400, 401, 403})


class HttpTokenEndpoint:
    def __init__(
        self,
        http: HttpSender,
        token_url: str,
        client_id: str,
        clock: Clock,
        *,
        timeout_s: float = 30.0,
    ) -> None:
        self._http = http
        self.token_url = token_url
        self.client_id = client_id
        self._clock = clock
        self._timeout_s = timeout_s

    async def refresh(self, refresh_token: str) -> TokenSet:
        body: dict[str, str] = {"grant_type": "refresh_token", "refresh_token": refresh_token}
        if self.client_id:
            body["client_id"] = self.client_id
        return await self._grant(orjson.dumps(body), "application/json")

    async def exchange_code(self, code: str, code_verifier: str, redirect_uri: str) -> TokenSet:
        """The second half of a PKCE login: the one-time ``code`` for the first pair. A form
        body, as the Codex CLI sends it (RFC 6749 section 4.1.3). Raises ``RefreshRejected``
        (a used, expired or mismatched code) or ``RefreshUnavailable``."""
        body = {
            "grant_type": "authorization_code",
            "code": code,
            "code_verifier": code_verifier,
            "redirect_uri": redirect_uri,
        }
        if self.client_id:
            body["client_id"] = self.client_id
        return await self._grant(urlencode(body).encode(), "application/x-www-form-urlencoded")

    async def _grant(self, payload: bytes, content_type: str) -> TokenSet:
        try:
            resp = await self._http.send(
                "POST",
                self.token_url,
                body=payload,
                headers={"content-type": content_type, "accept": "application/json"},
                timeout_s=self._timeout_s,
            )
            try:
                raw = await resp.read()
            finally:
                resp.release()
            status = resp.status
        except (TimeoutError, OSError) as exc:  # the port's errors: no answer, or a broken one
            raise RefreshUnavailable(type(exc).__name__) from None
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            data = {}
        if status in _REJECTED:
            code = data.get("error")
            raise RefreshRejected(code if isinstance(code, str) else f"HTTP {status}")
        if status != 200 or not isinstance(data.get("access_token"), str):
            raise RefreshUnavailable(f"HTTP {status}")
        expires_in = data.get("expires_in")
        expires = (
            self._clock.now_ms() + int(expires_in) * 1000
            if isinstance(expires_in, int | float) and not isinstance(expires_in, bool)
            else None
        )
        access = data["access_token"]
        refresh = data.get("refresh_token")
        return TokenSet(
            access,
            refresh if isinstance(refresh, str) else "",
            expires,
            chatgpt_account_id(access),
            self._clock.now_ms(),
        )
