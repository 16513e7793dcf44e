"""Where a newcomer silently got nothing (issue 49, item 2), now said: a pool that enforces
nothing because no limit is known (a provider with no plan in the catalogue, such as openai,
and no ``dimensions``) is reported by ``/health``, the start log and ``fairgate config check``;
a gateway started without ``FAIRGATE_ADMIN_KEY`` says at start that the admin API is off and
how to turn it on."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from inproc_support import ADMIN, base_config, conn, gateway
from typer.testing import CliRunner

from fairgate.cli import app
from fairgate.clock import ManualClock
from fairgate.config import parse_config
from fairgate.process.state import Gateway
from fairgate.timers import ManualTimer

#: an openai connection in a pool that sets no dimensions: the catalogue has no openai plan
CONFIG = base_config(
    [conn("o1", "openai"), conn("k1", "kimi")],
    pools=[
        {"id": "team", "connections": ["o1"], "allocations": [{"key": "alice", "weight": 100}]},
        {"id": "kimi", "connections": ["k1"], "allocations": [{"key": "alice", "weight": 100}]},
    ],
)
NO_LIMITS = "pool team: no limits: provider 'openai' has no plan in the catalogue"


async def test_a_pool_without_any_limit_is_reported_by_health_and_the_start_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="fairgate"):
        async with gateway(tmp_path, CONFIG, ManualTimer()) as h:
            (warning,) = (await h.client.get("/health")).json()["warnings"]
            assert warning.startswith(NO_LIMITS)
            assert "nothing is enforced" in warning
            # a plan for its connection gives it limits: the warning goes
            plan = {"dimensions": [{"unit": "tokens", "window": "daily", "limit": 1e6}]}
            r = await h.client.put("/api/quota/plans/o1", json=plan, headers=ADMIN)
            assert r.status_code == 200, r.text
            assert (await h.client.get("/health")).json()["warnings"] == []
    (logged,) = [r.getMessage() for r in caplog.records if "no limits" in r.getMessage()]
    assert logged.startswith(NO_LIMITS)  # the kimi pool (a catalogue plan) is not named


async def test_a_start_without_an_admin_key_says_the_admin_api_is_off(
    tmp_path: Path, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    config = parse_config(base_config([conn("m1")]), {})
    for admin_key, said in ((None, True), ("k" * 40, False)):
        gw = Gateway(data_dir=tmp_path, config=config, env={}, clock=clock, admin_key=admin_key)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="fairgate"):
            await gw.start()
        await gw.stop()
        off = [r.getMessage() for r in caplog.records if "admin API is off" in r.getMessage()]
        assert bool(off) == said
        if said:
            assert "set FAIRGATE_ADMIN_KEY" in off[0]
            assert "at least 32 characters" in off[0]


def _check(file: Path, data: Path) -> dict[str, Any]:
    res = CliRunner().invoke(
        app,
        ["config", "check", str(file), "--data-dir", str(data), "--json"],
        env={"FAIRGATE_DATABASE_URL": None, "FAIRGATE_SECRET_KEY": None},
    )
    assert res.exit_code == 0, res.output  # a warning is no error
    out: dict[str, Any] = json.loads(res.stdout)
    return out


async def test_config_check_reports_a_pool_without_any_limit(tmp_path: Path) -> None:
    file = tmp_path / "fairgate.yaml"
    file.write_text(yaml.safe_dump(CONFIG))
    data = tmp_path / "data"
    (warning,) = _check(file, data)["warnings"]  # no database yet: the file's pools
    assert warning.startswith(NO_LIMITS)
    # with a database: the pools as a start leaves them (here a plan set through the API)
    async with gateway(data, CONFIG, ManualTimer()) as h:
        plan = {"dimensions": [{"unit": "tokens", "window": "daily", "limit": 1e6}]}
        r = await h.client.put("/api/quota/plans/o1", json=plan, headers=ADMIN)
        assert r.status_code == 200, r.text
    assert _check(file, data)["warnings"] == []
