"""The admin commands (``fairgate keys|pools|connections|combos|config|health``) against a real
gateway process over loopback: each one's happy path and an error (message + exit 2).

The commands run in-process through Typer's runner (the same code path as the installed script,
without paying an interpreter start per call); one test runs the real ``fairgate`` script to
prove the wiring and the environment variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from e2e_support import (
    ADMIN_KEY,
    UPSTREAM_SECRET,
    GatewayFactory,
    Proc,
    new_secret,
)
from typer.testing import CliRunner, Result

from fairgate.cli import app

runner = CliRunner()


def cli(gw: Proc | str, *args: str, admin_key: str | None = ADMIN_KEY) -> Result:
    url = gw if isinstance(gw, str) else gw.url
    env = {"FAIRGATE_URL": url}
    if admin_key is not None:
        env["FAIRGATE_ADMIN_KEY"] = admin_key
    return runner.invoke(app, list(args), env=env)


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def failed(result: Result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    return result.stderr


def config_yaml(mock_url: str, alice: str) -> str:
    return (
        "server: {default_provider: mock}\n"
        "connections:\n"
        f"  - {{id: mock-1, provider: mock, base_url: '{mock_url}/v1', secret: '{UPSTREAM_SECRET}',"
        " models: [gpt-4o-mini]}\n"
        f"  - {{id: free-1, provider: free, base_url: '{mock_url}/v1', secret: '{UPSTREAM_SECRET}',"
        " models: [free-model]}\n"
        f"  - {{id: bad-1, provider: other, base_url: '{mock_url}/v1', secret: 'sk-wrong-secret',"
        " models: [gpt-4o-mini]}\n"
        f"keys:\n  - {{id: alice, name: Alice, secret: '{alice}'}}\n"
        "pools:\n"
        "  - id: team\n    connections: [mock-1]\n"
        "    dimensions: [{unit: requests, window: hourly, limit: 100}]\n"
        "    allocations: [{key: alice, weight: 100, policy: hard}]\n"
        "combos:\n"
        "  - {name: fast, strategy: priority, targets: [\n"
        "      {provider: mock, model: gpt-4o-mini, connection: mock-1}]}\n"
    )


@pytest.fixture
def gw(mock_upstream: Proc, start_gateway: GatewayFactory) -> tuple[Proc, str]:
    alice = new_secret()
    return start_gateway(config_yaml(mock_upstream.url, alice)), alice


def chat(gw: Proc, secret: str, model: str = "gpt-4o-mini") -> str:
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=secret, max_retries=0) as c:
        r = c.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
    return r.choices[0].message.content or ""


def status_of(gw: Proc, secret: str, model: str = "free-model") -> int:
    """The status of one chat request with ``secret``: the free model needs no pool."""
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {secret}"},
        json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
    )
    return r.status_code


def test_keys_create_list_rotate_revoke(gw: tuple[Proc, str]) -> None:
    proc, _ = gw
    args = ("--name", "CI bot", "--id", "ci", "--provider", "free", "--json")
    created = as_json(cli(proc, "keys", "create", *args))
    secret = created["secret"]
    assert created["id"] == "ci"
    # (a key without an allocation may use the unpooled connections of the providers it lists)
    assert chat(proc, secret, model="free-model")

    table = cli(proc, "keys", "list")
    assert table.exit_code == 0
    assert "CI bot" in table.stdout
    assert secret not in table.stdout  # a secret is shown once, at creation
    listed = {k["id"]: k for k in as_json(cli(proc, "keys", "list", "--json"))}
    assert listed["ci"]["lastUsedMs"] is not None
    assert listed["alice"]["lastUsedMs"] is None

    rotated = cli(proc, "keys", "rotate", "ci")
    assert rotated.exit_code == 0
    assert "shown once" in rotated.stdout
    new = next(w for w in rotated.stdout.split() if w.startswith("fg-"))
    assert new != secret
    assert status_of(proc, secret) == 401
    assert chat(proc, new, model="free-model")

    revoked = cli(proc, "keys", "revoke", "ci")
    assert revoked.exit_code == 0
    assert status_of(proc, new) == 401
    assert "not found" in failed(cli(proc, "keys", "revoke", "ci"))


def test_keys_refused_admin_key_and_bad_input(gw: tuple[Proc, str]) -> None:
    proc, _ = gw
    msg = failed(cli(proc, "keys", "list", admin_key="fg-wrong-admin"))
    assert "401" in msg
    assert "FAIRGATE_ADMIN_KEY" in msg
    assert "fg-wrong-admin" not in msg
    msg = failed(cli(proc, "keys", "create", "--id", "has space"))
    assert "HTTP 422" in msg
    assert "id" in msg


def test_admin_key_from_a_file_and_a_warning_for_one_on_the_command_line(
    gw: tuple[Proc, str], tmp_path: Path
) -> None:
    """Issue 43, N18: a key typed after --admin-key is in the process list for every user of
    the machine. A file (``--admin-key @PATH`` or FAIRGATE_ADMIN_KEY_FILE) keeps it out; the
    literal form still works, and says so."""
    proc, _ = gw
    keyfile = tmp_path / "admin.key"
    keyfile.write_text(ADMIN_KEY + "\n")
    by_file = cli(proc, "keys", "list", "--json", "--admin-key", f"@{keyfile}", admin_key=None)
    assert [k["id"] for k in as_json(by_file)] == ["alice"]
    assert "warning" not in by_file.stderr
    env = {"FAIRGATE_URL": proc.url, "FAIRGATE_ADMIN_KEY_FILE": str(keyfile)}
    by_env = runner.invoke(app, ["keys", "list", "--json"], env=env)
    assert [k["id"] for k in as_json(by_env)] == ["alice"]
    literal = cli(proc, "keys", "list", "--json", "--admin-key", ADMIN_KEY, admin_key=None)
    assert [k["id"] for k in as_json(literal)] == ["alice"]
    assert "visible to other users" in literal.stderr
    assert ADMIN_KEY not in literal.stderr
    msg = failed(cli(proc, "keys", "list", "--admin-key", f"@{tmp_path}/none", admin_key=None))
    assert "cannot read the admin key file" in msg


def test_pools_list_and_usage(gw: tuple[Proc, str]) -> None:
    proc, alice = gw
    for _ in range(3):
        chat(proc, alice)
    pools = as_json(cli(proc, "pools", "list", "--json"))
    assert [p["id"] for p in pools] == ["team"]
    usage = as_json(cli(proc, "pools", "usage", "team", "--json"))
    dim = usage["dimensions"][0]
    assert dim["total"] == 3
    assert dim["keys"][0]["keyId"] == "alice"
    assert dim["keys"][0]["consumed"] == 3

    table = cli(proc, "pools", "usage", "team")
    assert "3 of 100" in table.stdout
    assert "alice" in table.stdout
    # --watch keeps refreshing in place (Rich Live); --count stops it for the test
    watched = cli(proc, "pools", "usage", "team", "--watch", "--interval", "0.1", "--count", "3")
    assert watched.exit_code == 0, watched.output
    assert "alice" in watched.stdout
    assert "not found" in failed(cli(proc, "pools", "usage", "nope"))


def test_a_two_connection_pools_limit_is_one_number_everywhere(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    """Issue 48, item 3: ``limit: 3`` on a pool of two connections admits 3 (it admitted 6),
    and the gateway process's API, ``pools list`` and ``pools usage`` all say 3."""
    alice = new_secret()
    conn = f"base_url: '{mock_upstream.url}/v1', secret: '{UPSTREAM_SECRET}', models: [gpt-4o-mini]"
    proc = start_gateway(
        "server: {default_provider: mock}\n"
        "connections:\n"
        f"  - {{id: mock-1, provider: mock, {conn}}}\n"
        f"  - {{id: mock-2, provider: mock, {conn}}}\n"
        f"keys:\n  - {{id: alice, name: Alice, secret: '{alice}'}}\n"
        "pools:\n"
        "  - id: shared\n    connections: [mock-1, mock-2]\n"
        "    dimensions: [{unit: requests, window: hourly, limit: 3}]\n"
        "    allocations: [{key: alice, weight: 100}]\n"
    )
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    codes = [
        httpx.post(
            proc.url + "/v1/chat/completions",
            headers={"authorization": f"Bearer {alice}"},
            json=body,
            timeout=30,
        ).status_code
        for _ in range(6)
    ]
    assert codes == [200, 200, 200, 429, 429, 429]
    (pool,) = as_json(cli(proc, "pools", "list", "--json"))
    assert [(d["limit"], d["basis"]) for d in pool["effectiveDimensions"]] == [(3, "pool")]
    usage = as_json(cli(proc, "pools", "usage", "shared", "--json"))
    assert [(d["limit"], d["total"]) for d in usage["dimensions"]] == [(3, 3)]
    env = {"FAIRGATE_URL": proc.url, "FAIRGATE_ADMIN_KEY": ADMIN_KEY, "COLUMNS": "200"}
    assert "3 requests/hourly" in runner.invoke(app, ["pools", "list"], env=env).stdout
    assert "3 of 3" in cli(proc, "pools", "usage", "shared").stdout


def test_pools_allow_and_disallow(gw: tuple[Proc, str]) -> None:
    """A key gets into a pool by one command, without resending the pool's allocations: it can
    then use the pool's connection (allocations are required on a new data directory), the
    other allocation is untouched, options not given keep their values, and ``disallow``
    takes it out again."""
    proc, alice = gw
    dana = as_json(cli(proc, "keys", "create", "--name", "Dana", "--id", "dana", "--json"))
    assert status_of(proc, dana["secret"], "gpt-4o-mini") == 403  # no allocation yet

    added = cli(proc, "pools", "allow", "team", "dana", "--weight", "20")
    assert added.exit_code == 0, added.output
    assert "Key dana added to pool team" in added.stdout
    assert "alice 100 % hard, dana 20 % hard (120 % in all)" in added.stdout
    assert chat(proc, dana["secret"])
    assert chat(proc, alice)

    capped = as_json(
        cli(proc, "pools", "allow", "team", "dana", "--policy", "soft", "--cap", "50",
            "--cap-unit", "requests", "--json")
    )  # fmt: skip
    by_key = {a["key"]: a for a in capped["allocations"]}
    assert by_key["dana"]["weight"] == 20  # kept: not given
    assert (by_key["dana"]["policy"], by_key["dana"]["capValue"]) == ("soft", 50)
    assert (by_key["alice"]["weight"], by_key["alice"]["policy"]) == (100, "hard")
    uncapped = as_json(cli(proc, "pools", "allow", "team", "dana", "--no-cap", "--json"))
    dana_alloc = next(a for a in uncapped["allocations"] if a["key"] == "dana")
    assert (dana_alloc["policy"], dana_alloc["capValue"], dana_alloc["capUnit"]) == (
        "soft",
        None,
        None,
    )

    removed = cli(proc, "pools", "disallow", "team", "dana")
    assert removed.exit_code == 0, removed.output
    assert "no allocation in pool team" in removed.stdout
    assert status_of(proc, dana["secret"], "gpt-4o-mini") == 403
    assert [a["key"] for a in as_json(cli(proc, "pools", "list", "--json"))[0]["allocations"]] == [
        "alice"
    ]


def test_pools_allow_and_disallow_refuse_bad_input(gw: tuple[Proc, str]) -> None:
    proc, _ = gw
    as_json(cli(proc, "keys", "create", "--name", "Erin", "--id", "erin", "--json"))
    assert "--weight" in failed(cli(proc, "pools", "allow", "team", "erin"))
    assert "not found" in failed(cli(proc, "pools", "allow", "team", "ghost", "--weight", "5"))
    assert "not found" in failed(cli(proc, "pools", "allow", "nope", "erin", "--weight", "5"))
    assert "--cap-unit" in failed(cli(proc, "pools", "allow", "team", "erin", "--weight", "5",
                                      "--cap", "9"))  # fmt: skip
    assert "--no-cap" in failed(
        cli(proc, "pools", "allow", "team", "erin", "--weight", "5", "--cap", "9", "--no-cap")
    )
    bad_weight = cli(proc, "pools", "allow", "team", "erin", "--weight", "150")
    assert bad_weight.exit_code == 2
    assert "--weight" in bad_weight.output
    bad_policy = cli(proc, "pools", "allow", "team", "erin", "--weight", "5", "--policy", "x")
    assert bad_policy.exit_code == 2
    assert "--policy" in bad_policy.output
    assert "no allocation" in failed(cli(proc, "pools", "disallow", "team", "erin"))
    pools = as_json(cli(proc, "pools", "list", "--json"))
    assert [a["key"] for a in pools[0]["allocations"]] == ["alice"]  # nothing was written


def test_connections_list_and_test(gw: tuple[Proc, str]) -> None:
    proc, _ = gw
    conns = as_json(cli(proc, "connections", "list", "--json"))
    assert {c["id"]: c["hasSecret"] for c in conns} == {
        "mock-1": True,
        "free-1": True,
        "bad-1": True,
    }
    listed = cli(proc, "connections", "list")
    assert UPSTREAM_SECRET not in listed.stdout
    reading = as_json(cli(proc, "connections", "test", "mock-1", "--json"))
    assert reading["ok"] is True
    assert reading["status"] == 200
    assert "mock-gpt-4o-mini" in reading["models"]  # what the mock account lists
    # a refused secret is a reading with the provider's words, and exit 2
    bad = cli(proc, "connections", "test", "bad-1")
    assert bad.exit_code == 2
    assert "401" in bad.stdout
    assert "failed" in bad.stdout
    assert "sk-wrong-secret" not in bad.output
    assert "not found" in failed(cli(proc, "connections", "test", "nope"))


def test_combos_list_and_show(gw: tuple[Proc, str]) -> None:
    proc, alice = gw
    assert chat(proc, alice, model="fast")
    combos = as_json(cli(proc, "combos", "list", "--json"))
    assert [c["name"] for c in combos] == ["fast"]
    shown = as_json(cli(proc, "combos", "show", "fast", "--json"))
    (target,) = shown["stats"]["targets"]
    assert target["key"] == "mock/gpt-4o-mini@mock-1"
    assert target["requests"] == 1
    assert target["successRate"] == 1.0
    assert target["p50Ms"] is not None
    assert target["state"] == "ok"
    table = cli(proc, "combos", "show", "fast")
    assert "100.0 %" in table.stdout
    assert "priority" in table.stdout
    assert "not found" in failed(cli(proc, "combos", "show", "nope"))


def test_health(gw: tuple[Proc, str]) -> None:
    proc, _ = gw
    ok = cli(proc, "health", admin_key=None)
    assert ok.exit_code == 0, ok.output
    assert "sqlite" in ok.stdout
    msg = failed(cli("http://127.0.0.1:9", "health"))
    assert "cannot reach the gateway" in msg


def test_config_check(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(config_yaml("http://127.0.0.1:9", new_secret()))
    ok = runner.invoke(app, ["config", "check", str(good)])
    assert ok.exit_code == 0, ok.output
    assert "3 connection(s), 1 key(s), 1 pool(s), 1 combo(s)" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        good.read_text()
        .replace("weight: 100", "weight: -5")
        .replace("window: hourly", "window: fortnightly")
    )
    res = runner.invoke(app, ["config", "check", str(bad)])
    assert res.exit_code == 2
    assert "pools.0.allocations.0.weight" in res.stderr
    assert "pools.0.dimensions.0.window" in res.stderr
    problems = json.loads(runner.invoke(app, ["config", "check", str(bad), "--json"]).stdout)
    assert {p["field"] for p in problems["problems"]} >= {
        "pools.0.allocations.0.weight",
        "pools.0.dimensions.0.window",
    }
    # weights are percentages: three keys of weight 1 share 3 % of the limit, said as a warning
    low = tmp_path / "low.yaml"
    low.write_text(good.read_text().replace("weight: 100", "weight: 1"))
    res = runner.invoke(app, ["config", "check", str(low)])
    assert res.exit_code == 0, res.output
    assert "warning: pools.0.allocations" in res.stdout
    assert "sum to 1 %" in res.stdout
    assert "percentages" in res.stdout
    as_json = json.loads(runner.invoke(app, ["config", "check", str(low), "--json"]).stdout)
    assert [w.partition(":")[0] for w in as_json["warnings"]] == ["pools.0.allocations"]
    assert (
        json.loads(runner.invoke(app, ["config", "check", str(good), "--json"]).stdout)["warnings"]
        == []
    )
    missing = runner.invoke(app, ["config", "check", str(tmp_path / "none.yaml")])
    assert missing.exit_code == 2
    assert "cannot read" in missing.stderr


def test_installed_script_reads_the_environment(gw: tuple[Proc, str]) -> None:
    proc, _ = gw
    env = {**os.environ, "FAIRGATE_URL": proc.url, "FAIRGATE_ADMIN_KEY": ADMIN_KEY}
    run = subprocess.run(
        [sys.executable, "-m", "fairgate", "keys", "list", "--json"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert [k["id"] for k in json.loads(run.stdout)] == ["alice"]
    env.pop("FAIRGATE_ADMIN_KEY")
    run = subprocess.run(
        [sys.executable, "-m", "fairgate", "keys", "list"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2
    assert b"401" in run.stderr
