"""Who may use what, on the wire: real gateway processes, the mock upstream process, the official
SDKs as clients (docs/security.md, "Tenancy").

Keys: alice has an allocation in pool ``shared`` (``mock-1``); bob has none; carol lists the
connection ``mock-2``, which is outside every pool.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from e2e_support import (
    ADMIN_KEY,
    TEST_CLOCK,
    UPSTREAM_SECRET,
    GatewayFactory,
    Proc,
    assert_window_count,
    new_secret,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
KEYS = {k: new_secret() for k in ("alice", "bob", "carol")}
PROVIDER_HEADERS = {
    "openai-organization": "org-tenant-picked",
    "openai-project": "proj-tenant-picked",
    "anthropic-beta": "costly-beta-2099",
}


def config(mock_url: str, *, require: str = "true", forward: str = "") -> str:
    up = f"base_url: '{mock_url}/v1', secret: '{UPSTREAM_SECRET}'"
    return (
        f"server: {{default_provider: mock, require_allocation: {require}}}\n"
        "connections:\n"
        f"  - {{id: mock-1, provider: mock, {up}, models: [gpt-4o-mini]{forward}}}\n"
        f"  - {{id: mock-2, provider: mock, {up}, models: [free-model]}}\n"
        f"  - {{id: claude-1, provider: anthropic, {up},"
        f" models: [claude-sonnet-4, '*']{forward}}}\n"
        "keys:\n"
        f"  - {{id: alice, secret: '{KEYS['alice']}', allowed_providers: [anthropic]}}\n"
        f"  - {{id: bob, secret: '{KEYS['bob']}'}}\n"
        f"  - {{id: carol, secret: '{KEYS['carol']}', allowed_connections: [mock-2]}}\n"
        "pools:\n"
        "  - {id: shared, connections: [mock-1],\n"
        "     dimensions: [{unit: requests, window: hourly, limit: 1000}],\n"
        "     allocations: [{key: alice, weight: 100}]}\n"
    )


@pytest.fixture
def mock(mock_upstream: Proc) -> Iterator[Proc]:
    httpx.post(mock_upstream.url + "/_mock/reset")
    yield mock_upstream
    httpx.post(mock_upstream.url + "/_mock/reset")


def stats(mock: Proc) -> dict[str, object]:
    out: dict[str, object] = httpx.get(mock.url + "/_mock/stats").json()
    return out


def client(gw: Proc, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=KEYS[key], max_retries=0)


def ask(gw: Proc, key: str, model: str, **headers: str) -> str:
    with client(gw, key) as c:
        r = c.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=8,
            extra_headers=headers or None,
        )
    return r.choices[0].message.content or ""


def test_two_keys_on_one_pool_the_unallocated_one_is_refused(
    mock: Proc, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(config(mock.url))
    assert ask(gw, "alice", "gpt-4o-mini")
    with client(gw, "bob") as c, pytest.raises(openai.PermissionDeniedError) as info:
        c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}])
    err = info.value
    assert err.status_code == 403
    assert err.code == "no_allocation"
    raw = err.response.text + str(dict(err.response.headers))
    assert "mock-1" not in raw
    assert "shared" not in raw
    assert stats(mock)["requests"] == 1  # bob's request never reached the upstream
    # a connection outside every pool: carol lists it, bob does not
    assert ask(gw, "carol", "free-model")
    with client(gw, "bob") as c, pytest.raises(openai.PermissionDeniedError) as info:
        c.chat.completions.create(model="free-model", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "connection_not_allowed"
    # the Anthropic SDK gets its own error shape, same reason
    with (
        anthropic.Anthropic(base_url=gw.url, api_key=KEYS["carol"], max_retries=0) as ac,
        pytest.raises(anthropic.PermissionDeniedError) as ainfo,
    ):
        ac.messages.create(
            model="claude-sonnet-4", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert ainfo.value.status_code == 403
    assert "connection_not_allowed" in ainfo.value.response.text
    assert stats(mock)["requests"] == 2
    usage = httpx.get(gw.url + "/api/quota/pools/shared/usage", headers=ADMIN).json()
    assert [k["keyId"] for k in usage["dimensions"][0]["keys"]] == ["alice"]


def test_unallocated_use_when_allowed_shows_as_its_own_row(
    mock: Proc, start_gateway: GatewayFactory
) -> None:
    since = TEST_CLOCK.now_ms()
    gw = start_gateway(config(mock.url, require="false"))
    assert ask(gw, "alice", "gpt-4o-mini")
    assert ask(gw, "bob", "gpt-4o-mini")
    assert ask(gw, "bob", "free-model")  # open, as before the setting
    usage = httpx.get(gw.url + "/api/quota/pools/shared/usage", headers=ADMIN).json()
    rows = {k["keyId"]: k for k in usage["dimensions"][0]["keys"]}
    assert_window_count(rows["alice"]["consumed"], 1, "hourly", since)
    assert_window_count(rows["(unallocated)"]["consumed"], 1, "hourly", since)
    assert rows["(unallocated)"]["allocated"] is False
    settings = httpx.get(gw.url + "/api/settings", headers=ADMIN).json()
    assert settings["access"] == {"requireAllocation": False, "source": "config"}


def test_client_provider_headers_are_forwarded_only_when_allow_listed(
    mock: Proc, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(config(mock.url))
    assert ask(gw, "alice", "gpt-4o-mini", **PROVIDER_HEADERS)
    assert stats(mock)["last_headers"] == {}
    with anthropic.Anthropic(base_url=gw.url, api_key=KEYS["alice"], max_retries=0) as ac:
        ac.messages.create(
            model="claude-sonnet-4",
            max_tokens=5,
            messages=[{"role": "user", "content": "x"}],
            extra_headers=PROVIDER_HEADERS,
        )
    assert stats(mock)["last_headers"] == {"anthropic-version": "2023-06-01"}

    allowed = start_gateway(
        config(mock.url, forward=", forward_headers: [openai-organization, anthropic-beta]")
    )
    assert ask(allowed, "alice", "gpt-4o-mini", **PROVIDER_HEADERS)
    assert stats(mock)["last_headers"] == {
        "openai-organization": "org-tenant-picked",
        "anthropic-beta": "costly-beta-2099",
    }


def test_files_are_private_and_hold_no_client_key_characters(
    mock: Proc, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(config(mock.url))
    assert ask(gw, "alice", "gpt-4o-mini")
    created = httpx.post(gw.url + "/api/keys", headers=ADMIN, json={"id": "dan"}).json()
    assert "prefix" not in created
    listed = httpx.get(gw.url + "/api/keys", headers=ADMIN).json()
    assert all("prefix" not in k for k in listed)
    gw.stop()  # checkpoints the WAL into the DB file
    assert gw.data_dir is not None
    assert stat.S_IMODE(os.stat(gw.data_dir).st_mode) == 0o700
    files = [p for p in gw.data_dir.iterdir() if p.is_file()]
    assert {"fairgate.sqlite", "quota.sqlite"} <= {p.name for p in files}
    raw = b""
    for p in files:
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p.name
        raw += p.read_bytes()
    for secret in (*KEYS.values(), created["secret"]):
        # the random part only: the public "fg-test-" / "fg-" prefixes are not secret, and a run
        # such as "-test-01" also occurs in the upstream's test secret (a 1-in-256 false alarm)
        random_part = secret.removeprefix("fg-test-").removeprefix("fg-")
        runs = [random_part[i : i + 8] for i in range(len(random_part) - 7)]
        assert [r for r in runs if r.encode() in raw] == [], "characters of a client key stored"


def test_client_error_bodies_name_no_connection(mock: Proc, start_gateway: GatewayFactory) -> None:
    gw = start_gateway(config(mock.url))
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEYS['alice']}", "x-mock-fault": "503"},
        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 503
    # one attempt, or two when the first one's cooldown was waited for (maxWaitMs)
    assert set(r.json()["diagnostics"]["attemptOrder"]) == {"mock/gpt-4o-mini"}
    seen = r.text + str(dict(r.headers))
    for word in ("mock-1", "shared", "permanent", "cooldown"):
        assert word not in seen, word
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEYS['alice']}"},
        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 503  # cooling down now: the client learns that much, not where
    assert r.json()["diagnostics"]["excluded"][0]["reason"] == "cooling_down"
    assert "mock-1" not in r.text


def _serve_exit(tmp_path: Path, config_text: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(config_text)
    return subprocess.run(
        [sys.executable, "-m", "fairgate", "serve", "--config", str(cfg), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FAIRGATE_DATA_DIR": str(tmp_path / "data")},
        check=False,
    )


def test_a_url_password_and_an_empty_model_list_are_refused_at_start(tmp_path: Path) -> None:
    good = "  - {id: c, provider: mock, base_url: 'http://127.0.0.1:9/v1', models: '*'}\n"
    out = _serve_exit(tmp_path, "connections:\n" + good.replace("http://", "http://u:pw-x1@"))
    assert out.returncode == 2
    assert "connections.0.base_url" in out.stderr + out.stdout
    assert "pw-x1" not in out.stderr + out.stdout
    out = _serve_exit(tmp_path, "connections:\n" + good.replace("'*'", "[]"))
    assert out.returncode == 2
    assert "connections.0.models" in out.stderr + out.stdout
    out = _serve_exit(tmp_path, "connections:\n" + good.replace(", models: '*'", ""))
    assert out.returncode == 2
    assert "connections.0.models" in out.stderr + out.stdout


def test_a_star_connection_serves_any_model(mock: Proc, start_gateway: GatewayFactory) -> None:
    gw = start_gateway(config(mock.url))
    with anthropic.Anthropic(base_url=gw.url, api_key=KEYS["alice"], max_retries=0) as ac:
        r = ac.messages.create(
            model="anthropic/claude-whatever-9",
            max_tokens=5,
            messages=[{"role": "user", "content": "x"}],
        )
    assert r.content
    assert stats(mock)["by_model"] == {"claude-whatever-9": 1}
