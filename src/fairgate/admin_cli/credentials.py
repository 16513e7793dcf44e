"""Token pairs from the files subscription CLIs keep after a login, for ``connections login``.

Read locally and sent once to the gateway's admin API (over the admin connection, never on the
command line, where ``ps`` would show them):

- the Codex CLI's ``~/.codex/auth.json``: ``{"tokens": {"access_token", "refresh_token",
  "id_token", "account_id"}, "last_refresh"}`` (the access token is a JWT whose ``exp`` is its
  expiry);
- Claude Code's ``~/.claude/.credentials.json``: ``{"claudeAiOauth": {"accessToken",
  "refreshToken", "expiresAt"}}`` with ``expiresAt`` in epoch milliseconds.

Pure: a parsed JSON document in, the admin API's body fields out, or ``ValueError`` naming what
is missing (never a token).
"""

from __future__ import annotations

from typing import Any

from fairgate.providers.oauth import jwt_claims

__all__ = ["login_fields"]


def _str(data: dict[str, Any], key: str) -> str | None:
    v = data.get(key)
    return v if isinstance(v, str) and v else None


def login_fields(doc: object) -> dict[str, Any]:
    """``accessToken``, ``refreshToken`` and, when known, ``expiresAt`` (s) and ``accountId``."""
    if not isinstance(doc, dict):
        raise ValueError("the credentials file is not a JSON object")
    codex, claude = doc.get("tokens"), doc.get("claudeAiOauth")
    if isinstance(codex, dict):
        access, refresh = _str(codex, "access_token"), _str(codex, "refresh_token")
        exp = jwt_claims(access or "").get("exp")
        expires = int(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None
        account = _str(codex, "account_id")
        where = "tokens"
    elif isinstance(claude, dict):
        access, refresh = _str(claude, "accessToken"), _str(claude, "refreshToken")
        ms = claude.get("expiresAt")
        expires = int(ms) // 1000 if isinstance(ms, int) and not isinstance(ms, bool) else None
        account, where = None, "claudeAiOauth"
    else:
        raise ValueError(
            "not a Codex auth.json ('tokens') nor a Claude credentials file ('claudeAiOauth')"
        )
    if refresh is None:
        raise ValueError(f"the credentials file has no refresh token under '{where}'")
    out: dict[str, Any] = {"refreshToken": refresh}
    if access is not None:
        out["accessToken"] = access
    if expires is not None:
        out["expiresAt"] = expires
    if account is not None:
        out["accountId"] = account
    return out
