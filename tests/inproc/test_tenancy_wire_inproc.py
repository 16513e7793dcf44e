"""Who may use what, through the whole HTTP app (docs/security.md, "Tenancy"): allocations,
allowed connections, the unallocated row, client provider headers, private files, and error
bodies that name no connection.

Keys: alice has an allocation in pool ``shared`` (``mock-1``); bob has none; carol lists the
connection ``mock-2``, which is outside every pool.

Moved from ``tests/e2e/test_tenancy_wire.py`` (a gateway process per test); what stays there
needs a process: the refusal at start (exit code 2). The official SDKs over real HTTP are
covered per route in ``tests/e2e/test_sdk_clients.py``.
"""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path
from typing import Any

import httpx
from inproc_support import ADMIN, Harness, MockUpstream, conn, gateway

from fairgate.mock.server import RECORDED_HEADERS
from fairgate.timers import ManualTimer

GPT = "gpt-4o-mini"
KEYS = {k: "fg-test-" + uuid.uuid4().hex for k in ("alice", "bob", "carol")}
PROVIDER_HEADERS = {
    "openai-organization": "org-tenant-picked",
    "openai-project": "proj-tenant-picked",
    "anthropic-beta": "costly-beta-2099",
}


def config(*, require: bool = True, forward: list[str] | None = None) -> dict[str, Any]:
    fwd = {"forward_headers": forward} if forward else {}
    return {
        "server": {"default_provider": "mock", "require_allocation": require},
        "connections": [
            conn("mock-1", models=(GPT,), **fwd),
            conn("mock-2", models=("free-model",)),
            conn("claude-1", "anthropic", models=("claude-sonnet-4", "*"), **fwd),
        ],
        "keys": [
            {"id": "alice", "secret": KEYS["alice"], "allowed_providers": ["anthropic"]},
            {"id": "bob", "secret": KEYS["bob"]},
            {"id": "carol", "secret": KEYS["carol"], "allowed_connections": ["mock-2"]},
        ],
        "pools": [
            {
                "id": "shared",
                "connections": ["mock-1"],
                "dimensions": [{"unit": "requests", "window": "hourly", "limit": 1000}],
                "allocations": [{"key": "alice", "weight": 100}],
            }
        ],
    }


async def ask(h: Harness, key: str, model: str, **headers: str) -> httpx.Response:
    return await h.chat(model, key=KEYS[key], headers=headers, max_tokens=8)


async def messages(h: Harness, key: str, model: str, **headers: str) -> httpx.Response:
    """A Messages API request as the Anthropic SDK sends it."""
    return await h.client.post(
        "/v1/messages",
        json={"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        headers={"x-api-key": KEYS[key], "anthropic-version": "2023-06-01", **headers},
    )


def recorded(h: Harness) -> dict[str, str]:
    """The provider-selecting headers of the last upstream request (what the mock records)."""
    sent = h.upstream.requests[-1].headers
    return {name: sent[name] for name in RECORDED_HEADERS if name in sent}


def answered(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


async def test_two_keys_on_one_pool_the_unallocated_one_is_refused(tmp_path: Path) -> None:
    async with gateway(tmp_path, config(), ManualTimer(), MockUpstream()) as h:
        assert answered(await ask(h, "alice", GPT))
        r = await ask(h, "bob", GPT)
        assert r.status_code == 403
        assert r.json()["error"]["code"] == "no_allocation"
        raw = r.text + str(dict(r.headers))
        assert "mock-1" not in raw
        assert "shared" not in raw
        assert len(h.sent_to) == 1  # bob's request never reached the upstream
        # a connection outside every pool: carol lists it, bob does not
        assert answered(await ask(h, "carol", "free-model"))
        r = await ask(h, "bob", "free-model")
        assert (r.status_code, r.json()["error"]["code"]) == (403, "connection_not_allowed")
        # the Messages API gets its own error shape, same reason
        r = await messages(h, "carol", "claude-sonnet-4")
        assert r.status_code == 403
        assert r.json()["type"] == "error"
        assert "connection_not_allowed" in r.text
        assert len(h.sent_to) == 2
        usage = (await h.client.get("/api/quota/pools/shared/usage", headers=ADMIN)).json()
        assert [k["keyId"] for k in usage["dimensions"][0]["keys"]] == ["alice"]


async def test_unallocated_use_when_allowed_shows_as_its_own_row(tmp_path: Path) -> None:
    async with gateway(tmp_path, config(require=False), ManualTimer(), MockUpstream()) as h:
        assert answered(await ask(h, "alice", GPT))
        assert answered(await ask(h, "bob", GPT))
        assert answered(await ask(h, "bob", "free-model"))  # open, as before the setting
        usage = (await h.client.get("/api/quota/pools/shared/usage", headers=ADMIN)).json()
        rows = {k["keyId"]: k for k in usage["dimensions"][0]["keys"]}
        assert rows["alice"]["consumed"] == 1  # the clock stood still: exact counts
        assert rows["(unallocated)"]["consumed"] == 1
        assert rows["(unallocated)"]["allocated"] is False
        settings = (await h.client.get("/api/settings", headers=ADMIN)).json()
        assert settings["access"] == {"requireAllocation": False, "source": "config"}


async def test_billing_headers_are_forwarded_only_when_allow_listed(
    tmp_path: Path,
) -> None:
    """The headers that choose who is billed pass only a connection that lists them; an
    Anthropic connection forwards ``anthropic-beta`` by default (issue 42, item 9: Claude
    Code's beta features are refused without it), an OpenAI one does not."""
    async with gateway(tmp_path / "closed", config(), ManualTimer(), MockUpstream()) as h:
        assert answered(await ask(h, "alice", GPT, **PROVIDER_HEADERS))
        assert recorded(h) == {}
        r = await messages(h, "alice", "claude-sonnet-4", **PROVIDER_HEADERS)
        assert r.status_code == 200, r.text
        assert recorded(h) == {
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "costly-beta-2099",
        }

    allowed = config(forward=["openai-organization", "anthropic-beta"])
    async with gateway(tmp_path / "allowed", allowed, ManualTimer(), MockUpstream()) as h:
        assert answered(await ask(h, "alice", GPT, **PROVIDER_HEADERS))
        assert recorded(h) == {
            "openai-organization": "org-tenant-picked",
            "anthropic-beta": "costly-beta-2099",
        }


async def test_files_are_private_and_hold_no_client_key_characters(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with gateway(data, config(), ManualTimer(), MockUpstream()) as h:
        assert answered(await ask(h, "alice", GPT))
        created = (await h.client.post("/api/keys", headers=ADMIN, json={"id": "dan"})).json()
        assert "prefix" not in created
        listed = (await h.client.get("/api/keys", headers=ADMIN)).json()
        assert all("prefix" not in k for k in listed)
    # the app has stopped: the WAL is checkpointed into the DB files
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700
    files = [p for p in data.iterdir() if p.is_file()]
    assert {"fairgate.sqlite", "quota.sqlite"} <= {p.name for p in files}
    raw = b""
    for p in files:
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p.name
        raw += p.read_bytes()
    for secret in (*KEYS.values(), created["secret"]):
        # the random part only: the public "fg-test-" / "fg-" prefixes are not secret
        random_part = secret.removeprefix("fg-test-").removeprefix("fg-")
        runs = [random_part[i : i + 8] for i in range(len(random_part) - 7)]
        assert [r for r in runs if r.encode() in raw] == [], "characters of a client key stored"


async def test_client_error_bodies_name_no_connection(tmp_path: Path) -> None:
    cfg = config(forward=["x-mock-fault"])  # the test's fault reaches the mock
    async with gateway(tmp_path, cfg, ManualTimer(), MockUpstream()) as h:
        r = await ask(h, "alice", GPT, **{"x-mock-fault": "503"})
        assert r.status_code == 503
        assert set(r.json()["diagnostics"]["attemptOrder"]) == {f"mock/{GPT}"}
        seen = r.text + str(dict(r.headers))
        for word in ("mock-1", "shared", "permanent", "cooldown"):
            assert word not in seen, word
        r = await ask(h, "alice", GPT)
        assert r.status_code == 503  # cooling down now: the client learns that much, not where
        assert r.json()["diagnostics"]["excluded"][0]["reason"] == "cooling_down"
        assert "mock-1" not in r.text


async def test_a_star_connection_serves_any_model(tmp_path: Path) -> None:
    async with gateway(tmp_path, config(), ManualTimer(), MockUpstream()) as h:
        r = await messages(h, "alice", "anthropic/claude-whatever-9")
        assert r.status_code == 200, r.text
        assert r.json()["content"]
        assert [q.json()["model"] for q in h.upstream.requests] == ["claude-whatever-9"]
