"""A pool's limit means one thing on every surface (issue 48, item 3).

``limit: 10`` written on a two-connection pool admitted 20 (the engine multiplied every limit
by the number of connections) while ``GET /api/quota/pools/{id}`` said 10, ``/usage`` 20. Now a
pool's own limit is the pool's, enforced as written; a plan's (catalogue or a connection's
override) is one account's and the pool enforces it once per connection, as does any percent
limit (a percent is of one account's window). Every surface shows the enforced number: the
pool's ``effectiveDimensions`` (with ``basis`` and ``writtenLimit``), its ``/usage``, ``fairgate
pools list`` and ``pools usage`` (rendered from those answers) and ``fairgate config check``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from inproc_support import ADMIN, MockUpstream, base_config, conn, gateway
from rich.console import Console
from typer.testing import CliRunner

from fairgate.admin_cli import render
from fairgate.cli import app
from fairgate.timers import ManualTimer

SHARED = {
    "id": "shared",
    "connections": ["m1", "m2"],
    "dimensions": [{"unit": "requests", "window": "hourly", "limit": 10}],
    "allocations": [{"key": "alice", "weight": 100}],
}
#: kimi's catalogue plan is requests/hourly/1500, one account's; two accounts: 3000
KIMI = {"id": "kimi", "connections": ["k1", "k2"], "allocations": [{"key": "alice", "weight": 100}]}
#: a percent limit is each account's window, wherever it is written
CODEX = {
    "id": "codex",
    "connections": ["c1", "c2"],
    "dimensions": [{"unit": "percent", "window": "5h", "limit": 100}],
    "allocations": [{"key": "alice", "weight": 100}],
}
CONFIG = base_config(
    [
        conn("m1"),
        conn("m2"),
        conn("k1", "kimi", models=("kimi-m",)),
        conn("k2", "kimi", models=("kimi-m",)),
        conn("c1", "codex", models=("codex-m",)),
        conn("c2", "codex", models=("codex-m",)),
    ],
    pools=[SHARED, KIMI, CODEX],
)


def _text(renderable: Any) -> str:
    console = Console(width=400, record=True)
    console.print(renderable)
    return console.export_text()


async def test_a_pools_own_limit_is_enforced_and_shown_as_written(tmp_path: Path) -> None:
    timer = ManualTimer()
    async with gateway(tmp_path, CONFIG, timer, MockUpstream()) as h:
        codes = [(await h.chat("m")).status_code for _ in range(14)]
        assert codes.count(200) == 10  # not 20: the pool's limit, not ten per connection
        assert set(codes[10:]) == {429}
        await h.settle_background()
        pool = (await h.client.get("/api/quota/pools/shared", headers=ADMIN)).json()
        (dim,) = pool["effectiveDimensions"]
        assert (dim["limit"], dim["basis"], dim["writtenLimit"]) == (10, "pool", 10)
        usage = (await h.client.get("/api/quota/pools/shared/usage", headers=ADMIN)).json()
        (used,) = usage["dimensions"]
        assert (used["limit"], used["total"]) == (10, 10)
        # fairgate pools list / pools usage print these answers
        listed = (await h.client.get("/api/quota/pools", headers=ADMIN)).json()
        table = _text(render.pools_table(listed))
        assert "10 requests/hourly" in table
        assert "per connection" not in table.split("shared")[1].split("\n")[0]
        assert "requests/hourly: 10 of 10 (100.0 %" in _text(render.usage_view(usage))


async def test_a_plans_and_a_percent_limit_are_per_connection_everywhere(tmp_path: Path) -> None:
    async with gateway(tmp_path, CONFIG, ManualTimer(), MockUpstream()) as h:
        pools = {p["id"]: p for p in (await h.client.get("/api/quota/pools", headers=ADMIN)).json()}
        for pid, key, enforced, written in (
            ("kimi", "requests/hourly", 3000, 1500),
            ("codex", "percent/5h", 200, 100),
        ):
            (dim,) = [d for d in pools[pid]["effectiveDimensions"] if d["key"] == key]
            assert (dim["limit"], dim["basis"], dim["writtenLimit"]) == (
                enforced,
                "per-connection",
                written,
            )
            usage = (await h.client.get(f"/api/quota/pools/{pid}/usage", headers=ADMIN)).json()
            (shown,) = [d for d in usage["dimensions"] if d["key"] == key]
            assert shown["limit"] == enforced
        table = _text(render.pools_table(list(pools.values())))
        assert "3000 requests/hourly (1500 per connection × 2)" in table
        assert "200 percent/5h (100 per connection × 2)" in table


def test_config_check_says_what_each_pool_will_enforce(tmp_path: Path) -> None:
    file = tmp_path / "fairgate.yaml"
    file.write_text(yaml.safe_dump(CONFIG))
    env = {"FAIRGATE_DATABASE_URL": None, "FAIRGATE_SECRET_KEY": None}
    args = ["config", "check", str(file), "--data-dir", str(tmp_path / "data")]
    res = CliRunner().invoke(app, [*args, "--json"], env=env)
    assert res.exit_code == 0, res.output
    enforced = {p["pool"]: p["dimensions"] for p in json.loads(res.stdout)["enforced"]}
    assert [(d["key"], d["limit"], d["basis"]) for d in enforced["shared"]] == [
        ("requests/hourly", 10, "pool")
    ]
    kimi = {d["key"]: (d["limit"], d["writtenLimit"]) for d in enforced["kimi"]}
    assert kimi["requests/hourly"] == (3000, 1500)
    res = CliRunner().invoke(app, args, env=env, terminal_width=400)
    assert res.exit_code == 0, res.output
    assert "pool shared enforces: 10 requests/hourly\n" in res.stdout
    assert "pool kimi enforces: 3000 requests/hourly (1500 per connection × 2)" in res.stdout
    assert "pool codex enforces: 200 percent/5h (100 per connection × 2)" in res.stdout
