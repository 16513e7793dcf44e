"""OAuth login through the admin API and ``fairgate connections login`` (issue 12): a token
pair or a PKCE authorization code, against the mock's OAuth authority; tokens sealed, never
echoed; the login survives a restart; bad input is a 422 naming the field."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from http_support import ServedGateway, gateway_client
from typer.testing import CliRunner

from fairgate.admin_cli.credentials import login_fields
from fairgate.cli import app as cli_app
from fairgate.clock import ManualClock
from fairgate.config import load_config_text
from fairgate.mock.server import MockUpstream
from fairgate.process.oauth_setup import start_oauth
from fairgate.process.state import Gateway
from fairgate.providers.upstream import UpstreamClient

ADMIN = "adm-oauth-login-test-key-000000000"
KEY = "fg-" + secrets.token_urlsafe(24)
REDIRECT = "http://localhost:1455/auth/callback"

CONFIG = f"""
server: {{default_provider: codex, require_allocation: false}}
keys:
  - {{id: alice, secret: "{KEY}"}}
"""


@dataclass
class Env(ServedGateway):
    url: str

    async def ask(self) -> httpx.Response:
        return await self.client.post(
            "/v1/chat/completions",
            json={"model": "gpt-5-codex", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {KEY}"},
        )


Start = Callable[[], Awaitable[Env]]


@pytest_asyncio.fixture
async def mock() -> AsyncIterator[MockUpstream]:
    m = MockUpstream()
    await m.start()
    yield m
    await m.stop()


@pytest_asyncio.fixture
async def start(mock: MockUpstream, tmp_path: Path, clock: ManualClock) -> AsyncIterator[Start]:
    """A gateway on ``tmp_path/data`` (each call: a restart on the same data dir)."""
    async with AsyncExitStack() as stack:

        async def go() -> Env:
            await stack.aclose()  # one gateway at a time
            gw = Gateway(
                data_dir=tmp_path / "data",
                config=load_config_text(CONFIG, env={}),
                env={},
                clock=clock,
                admin_key=ADMIN,
            )
            url, client = await stack.enter_async_context(gateway_client(gw))
            return Env(gw, mock, client, ADMIN, url)

        yield go


async def _codex_connection(env: Env, cid: str = "codex-1", auth: str = "oauth") -> None:
    r = await env.admin(
        "POST",
        "/connections",
        json={
            "id": cid,
            "provider": "codex",
            "baseUrl": env.mock.url + "/backend-api/codex",
            "authType": auth,
            "models": ["*"],
        },
    )
    assert r.status_code == 201, r.text


def _field(r: httpx.Response) -> str:
    assert r.status_code == 422, r.text
    return str(r.json()["error"]["fields"][0]["field"])


async def test_a_token_pair_login_serves_survives_a_restart_and_is_never_echoed(
    start: Start, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = await start()
    await _codex_connection(env)
    pair = env.mock.state.issuer.login("acct-1")
    body = {
        "tokenUrl": env.mock.url + "/oauth/token",
        "clientId": "app_demo",
        "accessToken": pair["access_token"],
        "refreshToken": pair["refresh_token"],
    }
    with caplog.at_level(logging.DEBUG):
        r = await env.admin("POST", "/connections/codex-1/oauth", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["state"] == "ok"
        assert r.json()["accountId"] == "acct-1"  # read from the access token, as Codex does
        served = await env.ask()
    assert served.status_code == 200, served.text
    # no expiry given: refreshed before first use, at the endpoint the login named
    assert env.mock.state.issuer.refresh_calls == 1
    health = (await env.client.get("/health")).json()["oauth"]
    assert [h["connectionId"] for h in health] == ["codex-1"]

    env = await start()  # a restart: the login (endpoint in the DB, tokens sealed) is kept
    assert (await env.ask()).status_code == 200
    assert env.mock.state.issuer.refresh_calls == 1  # the rotated pair was kept, not reused

    secrets_given = (pair["access_token"], pair["refresh_token"])
    blobs = b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file())
    logs = "\n".join(rec.getMessage() for rec in caplog.records)
    for s in secrets_given:
        assert s.encode() not in blobs
        assert s not in r.text
        assert s not in logs


async def test_a_pkce_code_is_traded_once_at_the_token_endpoint(start: Start) -> None:
    env = await start()
    await _codex_connection(env)
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    issuer = env.mock.state.issuer
    code = issuer.authorize("acct-2", challenge.rstrip(b"=").decode(), REDIRECT)
    body = {
        "tokenUrl": env.mock.url + "/oauth/token",
        "authorizationCode": code,
        "codeVerifier": verifier,
        "redirectUri": REDIRECT,
    }
    r = await env.admin("POST", "/connections/codex-1/oauth", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["accountId"] == "acct-2"
    assert r.json()["expiresAtMs"] is not None
    assert code not in r.text
    assert (await env.ask()).status_code == 200
    assert issuer.code_exchanges == 1
    assert issuer.refresh_calls == 0  # a fresh pair: nothing to refresh
    # the code is spent: the provider's refusal is a 422 on the field
    r = await env.admin("POST", "/connections/codex-1/oauth", json=body)
    assert _field(r) == "authorizationCode"
    assert "invalid_grant" in r.text


async def test_bad_logins_name_the_field(start: Start) -> None:
    env = await start()
    await _codex_connection(env)
    await _codex_connection(env, "plain-1", auth="apikey")
    url = env.mock.url + "/oauth/token"
    path = "/connections/codex-1/oauth"
    assert _field(await env.admin("POST", path, json={"tokenUrl": url})) == "refreshToken"
    assert _field(await env.admin("POST", path, json={"refreshToken": "r"})) == "tokenUrl"
    r = await env.admin("POST", path, json={"tokenUrl": "ftp://x", "refreshToken": "r"})
    assert _field(r) == "tokenUrl"
    r = await env.admin("POST", path, json={"tokenUrl": url, "authorizationCode": "c"})
    assert _field(r) == "codeVerifier"
    r = await env.admin(
        "POST",
        path,
        json={"tokenUrl": url, "authorizationCode": "c", "refreshToken": "r",
              "codeVerifier": "v", "redirectUri": REDIRECT},
    )  # fmt: skip
    assert _field(r) == "refreshToken"
    r = await env.admin("POST", path, json={"tokenUrl": url, "refreshToken": "r", "expiresAt": -1})
    assert _field(r) == "expiresAt"
    r = await env.admin(
        "POST", "/connections/plain-1/oauth", json={"tokenUrl": url, "refreshToken": "r"}
    )
    assert r.status_code == 409
    r = await env.admin(
        "POST", "/connections/nope/oauth", json={"tokenUrl": url, "refreshToken": "r"}
    )
    assert r.status_code == 404


async def test_the_cli_logs_in_from_a_codex_auth_json(start: Start, tmp_path: Path) -> None:
    env = await start()
    await _codex_connection(env)
    pair = env.mock.state.issuer.login("acct-3")
    auth_json = tmp_path / "auth.json"
    auth_json.write_text(
        json.dumps(
            {
                "OPENAI_API_KEY": None,
                "tokens": {
                    "id_token": pair["id_token"],
                    "access_token": pair["access_token"],
                    "refresh_token": pair["refresh_token"],
                    "account_id": "acct-3",
                },
                "last_refresh": "2026-01-01T00:00:00Z",
            }
        )
    )
    args = [
        "connections", "login", "codex-1", "--credentials", str(auth_json),
        "--token-url", env.mock.url + "/oauth/token", "--url", env.url, "--admin-key", ADMIN,
    ]  # fmt: skip
    res = await asyncio.to_thread(CliRunner().invoke, cli_app, args)
    assert res.exit_code == 0, res.output
    assert "codex-1 logged in (account acct-3): ok" in res.output
    assert pair["refresh_token"] not in res.output
    assert pair["access_token"] not in res.output
    assert (await env.ask()).status_code == 200
    assert env.mock.state.issuer.refresh_calls == 0  # the JWT's exp was passed on

    bad = tmp_path / "bad.json"
    bad.write_text('{"tokens": {"access_token": "only-an-access-token"}}')
    args[args.index(str(auth_json))] = str(bad)
    res = await asyncio.to_thread(CliRunner().invoke, cli_app, args)
    assert res.exit_code == 2
    assert "no refresh token" in res.output
    assert "only-an-access-token" not in res.output


def test_claude_credentials_are_read_with_their_millisecond_expiry() -> None:
    fields = login_fields(
        {"claudeAiOauth": {"accessToken": "a", "refreshToken": "r", "expiresAt": 1_800_000_123_456}}
    )
    assert fields == {"accessToken": "a", "refreshToken": "r", "expiresAt": 1_800_000_123}
    with pytest.raises(ValueError, match="nor a Claude"):
        login_fields({"something": "else"})


async def test_another_worker_adopts_the_login_on_its_next_reload(
    start: Start, tmp_path: Path, clock: ManualClock
) -> None:
    """A second gateway process on the same data dir (a worker; a replica on PostgreSQL and
    Redis alike): the login's endpoint reaches it through the settings, the tokens through the
    shared token store."""
    env = await start()
    await _codex_connection(env)
    other = Gateway(
        data_dir=tmp_path / "data", config=load_config_text(CONFIG, env={}), env={}, clock=clock
    )
    await other.start()
    try:
        async with UpstreamClient() as http:
            tokens = await start_oauth(other, http)
            assert not tokens.manages("codex-1")  # nobody logged in yet
            pair = env.mock.state.issuer.login("acct-9")
            body = {
                "tokenUrl": env.mock.url + "/oauth/token",
                "accessToken": pair["access_token"],
                "refreshToken": pair["refresh_token"],
                "expiresAt": 4_000_000_000,
            }
            r = await env.admin("POST", "/connections/codex-1/oauth", json=body)
            assert r.status_code == 200, r.text
            other.reload()  # what its metadata watcher does on the change counter's bump
            assert tokens.manages("codex-1")
            assert (await tokens.access("codex-1")).access_token == pair["access_token"]
            await tokens.close()
    finally:
        await other.stop()
