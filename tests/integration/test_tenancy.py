"""Who may use what, in process: a real gateway app on loopback, the in-process mock upstream,
real SQLite files. ``server.require_allocation`` (docs/security.md, "Tenancy").

Keys: alice has an allocation in pool ``shared``; bob has none; carol lists the unpooled
connection ``free-1``; dave lists the provider ``mock-anthropic``.
"""

from __future__ import annotations

import logging
import os
import secrets
import sqlite3
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from db_support import migrate_sqlite_to
from http_support import ServedGateway, gateway_client

from fairgate.clock import ManualClock
from fairgate.config import load_config_text
from fairgate.db.connection import open_db
from fairgate.db.settings import SettingsRepo, access_policy
from fairgate.mock.server import MockConfig, MockUpstream
from fairgate.process.state import Gateway

UP = "sk-upstream-tenancy-0123456789"
ADMIN = "adm-tenancy-test-key"
#: random, so that no run of their characters can be found in the DB by chance
KEYS = {k: "fg-" + secrets.token_urlsafe(24) for k in ("alice", "bob", "carol", "dave")}


def config_yaml(mock_url: str, *, require: bool | None = True, forward: str = "") -> str:
    server = "server: {default_provider: mock}\n"
    if require is not None:
        server = f"server: {{default_provider: mock, require_allocation: {str(require).lower()}}}\n"
    base = f"base_url: '{mock_url}/v1', secret: '{UP}'"
    return (
        server
        + "connections:\n"
        + f"  - {{id: p-1, provider: mock, {base}, models: [gpt-4o-mini]{forward}}}\n"
        + f"  - {{id: free-1, provider: mock, {base}, models: [free-model]}}\n"
        + f"  - {{id: claude-free, provider: mock-anthropic, protocol: anthropic, {base},"
        " models: [claude-x]}\n"
        + f"  - {{id: star-1, provider: mock-star, {base}, models: '*'}}\n"
        + "keys:\n"
        + f"  - {{id: alice, secret: '{KEYS['alice']}'}}\n"
        + f"  - {{id: bob, secret: '{KEYS['bob']}'}}\n"
        + f"  - {{id: carol, secret: '{KEYS['carol']}', allowed_connections: [free-1, star-1]}}\n"
        + f"  - {{id: dave, secret: '{KEYS['dave']}', allowed_providers: [mock-anthropic]}}\n"
        + "pools:\n"
        + "  - id: shared\n"
        + "    connections: [p-1]\n"
        + "    dimensions: [{unit: requests, window: hourly, limit: 1000}]\n"
        + "    allocations: [{key: alice, weight: 100}]\n"
        + "combos:\n"
        + "  - name: mix\n"
        + "    strategy: priority\n"
        + "    targets:\n"
        + "      - {provider: mock, model: free-model, connection: free-1}\n"
        + "      - {provider: mock, model: gpt-4o-mini, connection: p-1}\n"
    )


@dataclass
class Env(ServedGateway):
    data_dir: Path

    async def chat(self, key: str, model: str, **headers: str) -> httpx.Response:
        return await self.client.post(
            "/v1/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {KEYS[key]}", **headers},
        )


Start = Callable[..., Awaitable[Env]]


@pytest_asyncio.fixture
async def start(tmp_path: Path, clock: ManualClock) -> AsyncIterator[Start]:
    """Start the mock and a gateway (``config_yaml`` options); everything stops at the end."""
    started: list[Env] = []
    async with AsyncExitStack() as stack:

        async def go(**options: Any) -> Env:
            mock = MockUpstream(MockConfig(secret=UP))
            await mock.start()
            stack.push_async_callback(mock.stop)
            data_dir = tmp_path / f"data{len(started) + 1}"
            cfg = load_config_text(config_yaml(mock.url, **options), env={})
            gw = Gateway(data_dir=data_dir, config=cfg, env={}, clock=clock, admin_key=ADMIN)
            _, client = await stack.enter_async_context(gateway_client(gw))
            started.append(Env(gw, mock, client, ADMIN, data_dir))
            return started[-1]

        yield go


def assert_no_ids(r: httpx.Response) -> None:
    """No connection or pool id, and no exclusion reason, in what a client sees."""
    text = r.text + " ".join(f"{k}: {v}" for k, v in r.headers.items())
    for word in ("p-1", "free-1", "claude-free", "star-1", "shared", "permanent"):
        assert word not in text, (word, text)


# -- allocations required ----------------------------------------------------------------------


async def test_a_key_without_allocation_is_refused_and_the_allocated_key_served(
    start: Start,
) -> None:
    env = await start()
    assert env.gw.registry.require_allocation  # a new data dir: on
    ok = await env.chat("alice", "gpt-4o-mini")
    assert ok.status_code == 200, ok.text
    refused = await env.chat("bob", "gpt-4o-mini")
    assert refused.status_code == 403, refused.text
    err = refused.json()["error"]
    assert err["code"] == "no_allocation"
    assert err["type"] == "permission_error"
    assert_no_ids(refused)
    assert env.mock.state.stats.requests == 1  # bob's request never reached the upstream
    # the pool's log never saw bob: refused before admission, nothing counted against the pool
    usage = (await env.admin("GET", "/quota/pools/shared/usage")).json()
    rows = {k["keyId"]: k for k in usage["dimensions"][0]["keys"]}
    assert set(rows) == {"alice"}
    assert rows["alice"]["consumed"] == 1


async def test_a_connection_outside_every_pool_needs_the_key_to_list_it(start: Start) -> None:
    env = await start()
    refused = await env.chat("bob", "free-model")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "connection_not_allowed"
    assert_no_ids(refused)
    assert (await env.chat("alice", "free-model")).status_code == 403  # pooled alloc ≠ free
    assert (await env.chat("carol", "free-model")).status_code == 200  # listed by id
    assert (await env.chat("dave", "claude-x")).status_code == 200  # listed by provider
    assert (await env.chat("carol", "claude-x")).status_code == 403
    assert (await env.chat("dave", "mock-anthropic/claude-x")).status_code == 200
    assert env.mock.state.stats.requests == 3
    # /v1/models lists what the key may use, nothing else
    listed = await env.client.get("/v1/models", headers={"Authorization": f"Bearer {KEYS['dave']}"})
    ids = {m["id"] for m in listed.json()["data"]}
    assert "mock-anthropic/claude-x" in ids
    assert not {"gpt-4o-mini", "free-model", "mock/free-model"} & ids


async def test_a_combo_skips_the_targets_the_key_may_not_use(start: Start) -> None:
    env = await start()
    r = await env.chat("alice", "mix")  # free-1 (first) is not alice's: skipped, never tried
    assert r.status_code == 200, r.text
    assert r.headers["x-fairgate-connection"] == "p-1"
    assert env.mock.state.stats.by_model == {"gpt-4o-mini": 1}
    r = await env.chat("carol", "mix")
    assert r.status_code == 200
    assert r.headers["x-fairgate-connection"] == "free-1"
    r = await env.chat("bob", "mix")  # may use neither target
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "no_allocation"
    assert_no_ids(r)
    assert env.mock.state.stats.requests == 2


async def test_models_star_serves_any_model_and_names_none(start: Start) -> None:
    env = await start()
    r = await env.chat("carol", "mock-star/whatever-model")
    assert r.status_code == 200, r.text
    assert env.mock.state.stats.by_model == {"whatever-model": 1}
    assert (await env.chat("carol", "mock-star/*")).status_code == 404  # "*" is not a model
    listed = await env.client.get(
        "/v1/models", headers={"Authorization": f"Bearer {KEYS['carol']}"}
    )
    assert "mock-star/*" not in {m["id"] for m in listed.json()["data"]}


# -- allocations not required ------------------------------------------------------------------


async def test_unallocated_use_when_allowed_is_its_own_usage_row(start: Start) -> None:
    env = await start(require=False)
    assert not env.gw.registry.require_allocation
    for key in ("alice", "bob", "bob"):
        assert (await env.chat(key, "gpt-4o-mini")).status_code == 200
    assert (await env.chat("bob", "free-model")).status_code == 200  # open, as before
    usage = (await env.admin("GET", "/quota/pools/shared/usage")).json()
    rows = {k["keyId"]: k for k in usage["dimensions"][0]["keys"]}
    assert set(rows) == {"alice", "(unallocated)"}
    assert rows["alice"]["allocated"] is True
    other = rows["(unallocated)"]
    assert other["allocated"] is False
    assert other["consumed"] == 2
    assert other["fairShare"] == 0
    assert other["weight"] == 0
    assert usage["dimensions"][0]["total"] == 3


async def test_the_setting_changes_through_the_admin_api_without_a_restart(start: Start) -> None:
    env = await start(require=None)
    got = (await env.admin("GET", "/settings")).json()["access"]
    assert got == {"requireAllocation": True, "source": "default"}
    assert (await env.chat("bob", "gpt-4o-mini")).status_code == 403
    r = await env.admin("PUT", "/settings", json={"access": {"requireAllocation": False}})
    assert r.status_code == 200, r.text
    assert r.json()["access"] == {"requireAllocation": False, "source": "db"}
    assert (await env.chat("bob", "gpt-4o-mini")).status_code == 200
    r = await env.admin("PUT", "/settings", json={"access": {"requireAllocation": None}})
    assert r.json()["access"]["source"] == "default"
    assert (await env.chat("bob", "gpt-4o-mini")).status_code == 403


async def test_key_allow_lists_through_the_admin_api(start: Start) -> None:
    env = await start()
    assert (await env.chat("bob", "free-model")).status_code == 403
    r = await env.admin("PATCH", "/keys/bob", json={"allowedConnections": ["free-1"]})
    assert r.status_code == 200, r.text
    assert r.json()["allowedConnections"] == ["free-1"]
    assert (await env.chat("bob", "free-model")).status_code == 200
    r = await env.admin("PATCH", "/keys/bob", json={"allowedConnections": ["ghost"]})
    assert r.status_code == 422
    assert r.json()["error"]["fields"][0]["field"] == "allowedConnections.0"
    r = await env.admin("POST", "/keys", json={"id": "erin", "allowedProviders": ["mock-star"]})
    assert r.status_code == 201
    assert r.json()["allowedProviders"] == ["mock-star"]


# -- migration of an existing data dir --------------------------------------------------------


def _old_db(path: Path) -> None:
    """A metadata DB as main left it (schema 4): a connection with no model list, a key with
    its 7-character display prefix."""
    db = sqlite3.connect(path)
    migrate_sqlite_to(db, 4)
    db.execute(
        "INSERT INTO connections (id, provider, base_url, models) "
        "VALUES ('old-1', 'mock', 'http://x/v1', '[]')"
    )
    db.execute(
        "INSERT INTO client_keys (id, name, key_hash, prefix) VALUES ('k', 'k', ?, 'fg-AbCd')",
        ("0" * 64,),
    )
    db.commit()
    db.close()


def test_an_existing_db_keeps_open_access_serves_any_model_and_loses_key_prefixes(
    tmp_path: Path,
) -> None:
    _old_db(tmp_path / "fairgate.sqlite")
    db = open_db(tmp_path / "fairgate.sqlite")
    try:
        settings = SettingsRepo(db).all()
        assert access_policy(settings, None).source == "legacy"
        assert not access_policy(settings, None).required
        assert access_policy(settings, True).required  # the file's choice wins over legacy
        assert db.execute("SELECT models FROM connections").fetchone()[0] == '["*"]'
        assert db.execute("SELECT prefix FROM client_keys").fetchone()[0] == ""
    finally:
        db.close()
    fresh = open_db(tmp_path / "new" / "fairgate.sqlite")
    try:
        assert access_policy(SettingsRepo(fresh).all(), None).source == "default"
    finally:
        fresh.close()


async def test_an_existing_data_dir_warns_at_start(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    _old_db(data_dir / "fairgate.sqlite")
    gw = Gateway(data_dir=data_dir, env={}, clock=clock)
    with caplog.at_level(logging.WARNING, logger="fairgate.server"):
        await gw.start()
    try:
        assert not gw.registry.require_allocation
        assert any("require_allocation is not set" in r.getMessage() for r in caplog.records)
    finally:
        await gw.stop()


# -- forwarded headers --------------------------------------------------------------------------

PROVIDER_HEADERS = {
    "openai-organization": "org-attacker",
    "openai-project": "proj-attacker",
    "anthropic-beta": "costly-beta-2099",
}


async def test_billing_headers_are_not_forwarded_by_default(start: Start) -> None:
    """Only an Anthropic connection's functional headers pass by default (issue 42, item 9)."""
    env = await start()
    assert (await env.chat("alice", "gpt-4o-mini", **PROVIDER_HEADERS)).status_code == 200
    assert env.mock.state.stats.last_headers == {}
    r = await env.chat("dave", "claude-x", **PROVIDER_HEADERS)
    assert r.status_code == 200
    assert env.mock.state.stats.last_headers == {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "costly-beta-2099",
    }


async def test_allow_listed_headers_are_forwarded(start: Start) -> None:
    env = await start(forward=", forward_headers: [OpenAI-Organization]")
    assert env.gw.registry.connections["p-1"].forward_headers == ("openai-organization",)
    assert (await env.chat("alice", "gpt-4o-mini", **PROVIDER_HEADERS)).status_code == 200
    assert env.mock.state.stats.last_headers == {"openai-organization": "org-attacker"}
    # and through the admin API
    r = await env.admin("PATCH", "/connections/p-1", json={"forwardHeaders": ["anthropic-beta"]})
    assert r.status_code == 200, r.text
    assert r.json()["forwardHeaders"] == ["anthropic-beta"]
    assert (await env.chat("alice", "gpt-4o-mini", **PROVIDER_HEADERS)).status_code == 200
    assert env.mock.state.stats.last_headers == {"anthropic-beta": "costly-beta-2099"}
    r = await env.admin("PATCH", "/connections/p-1", json={"forwardHeaders": ["x-api-key"]})
    assert r.status_code == 422
    assert r.json()["error"]["fields"][0]["field"] == "forwardHeaders"


# -- what clients see, what is stored ------------------------------------------------------------


async def test_client_error_bodies_name_no_connection_and_admins_get_the_detail(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    env = await start(forward=", forward_headers: [x-mock-fault]")  # the fault reaches the mock
    with caplog.at_level(logging.INFO, logger="fairgate.proxy"):
        r = await env.chat("alice", "gpt-4o-mini", **{"x-mock-fault": "500"})
    assert r.status_code >= 500
    assert "diagnostics" in r.json()
    # one attempt, or more when a cooldown was waited for (maxWaitMs)
    assert set(r.json()["diagnostics"]["attemptOrder"]) == {"mock/gpt-4o-mini"}
    assert_no_ids(r)
    logged = [rec for rec in caplog.records if rec.getMessage() == "request failed"]
    assert logged, "the full diagnostics go to the log"
    assert set(logged[0].__dict__["diagnostics"]["attemptOrder"]) == {"mock/gpt-4o-mini@p-1"}


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


async def test_data_dir_is_private_and_files_owner_only(start: Start) -> None:
    env = await start()
    assert (await env.chat("alice", "gpt-4o-mini")).status_code == 200
    assert _mode(env.data_dir) == 0o700
    files = sorted(env.data_dir.glob("*.sqlite*"))
    names = {f.name for f in files}
    assert {"fairgate.sqlite", "fairgate.sqlite-wal", "quota.sqlite", "quota.sqlite-wal"} <= names
    for f in files:
        assert _mode(f) == 0o600, f


def test_an_existing_loose_db_is_tightened(tmp_path: Path) -> None:
    data = tmp_path / "loose"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    db = open_db(data / "fairgate.sqlite")
    db.close()
    os.chmod(data / "fairgate.sqlite", 0o644)
    os.chmod(data, 0o755)
    open_db(data / "fairgate.sqlite").close()
    assert _mode(data / "fairgate.sqlite") == 0o600
    assert _mode(data) == 0o700


async def test_no_character_of_a_client_key_is_stored(start: Start) -> None:
    env = await start()
    r = await env.admin("POST", "/keys", json={"id": "gen"})
    secret = r.json()["secret"]
    assert "prefix" not in r.json()
    env.gw.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = b"".join(f.read_bytes() for f in env.data_dir.glob("fairgate.sqlite*"))
    for s in (secret, *KEYS.values()):
        runs = {s[i : i + 8] for i in range(len(s) - 7)}
        assert not [run for run in runs if run.encode() in raw], s


async def test_a_url_password_stored_before_is_never_echoed(start: Start) -> None:
    env = await start()
    old = env.gw.registry.connections["free-1"]
    env.gw.connections().update(replace(old, base_url="http://u:hunter2-pw@h/v1"))
    env.gw.reload()
    for path in ("/connections", "/connections/free-1"):
        r = await env.admin("GET", path)
        assert r.status_code == 200
        assert "hunter2-pw" not in r.text
        assert "http://u:***@h/v1" in r.text
