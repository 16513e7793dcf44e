"""Rough edges of the admin API and the CLI found by using them (issue 14), each pinned:
served in-process (the real ASGI app, admin API mounted under /api as in production), real
SQLite files, an injected clock."""

from __future__ import annotations

import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from db_support import connection

from fairgate.cli import demo_identity
from fairgate.clock import ManualClock
from fairgate.config import parse_config
from fairgate.domain.units import Unit, Window
from fairgate.process.settings import Settings
from fairgate.process.state import Gateway
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.model import Allocation, Dimension, ModelCap, Policy, Pool
from fairgate.server.app import create_app
from fairgate.store.sqlite.store import SqliteQuotaStore

ADMIN = "adm-rough-edges"
ALICE = "fg-alice-secret-0123456789"
CONFIG: dict[str, Any] = {
    "connections": [
        connection("mock-1"),
        connection("kimi-1", "kimi"),
    ],
    "keys": [{"id": "alice", "name": "Alice", "secret": ALICE}],
    "pools": [
        {
            "id": "demo",
            "name": "Demo",
            "connections": ["mock-1"],
            "dimensions": [{"unit": "tokens", "window": "hourly", "limit": 1000}],
            "allocations": [{"key": "alice", "weight": 100, "policy": "hard"}],
        },
        {  # no dimensions of its own: the connection's plan (catalog, or manual) applies
            "id": "planned",
            "name": "Planned",
            "connections": ["kimi-1"],
            "allocations": [{"key": "alice", "weight": 100, "policy": "hard"}],
        },
    ],
}


@pytest_asyncio.fixture
async def client(tmp_path: Path, clock: ManualClock) -> AsyncIterator[httpx.AsyncClient]:
    gw = Gateway(
        data_dir=tmp_path, config=parse_config(CONFIG, {}), clock=clock, env={}, admin_key=ADMIN
    )
    app = create_app(gw)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://gw",
            headers={"Authorization": f"Bearer {ADMIN}"},
        ) as c:
            yield c


async def test_preview_refuses_unknown_parameters_naming_them(client: httpx.AsyncClient) -> None:
    r = await client.get(
        "/api/quota/preview", params={"pool": "demo", "key": "alice", "token": 5000, "x": 1}
    )
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert {f["field"] for f in err["fields"]} == {"token", "x"}
    assert "token" in err["message"]
    assert "x" in err["message"]


async def test_preview_accepts_the_seeds_names_as_aliases(client: httpx.AsyncClient) -> None:
    base = {"pool": "demo", "key": "alice"}
    plain = await client.get("/api/quota/preview", params={**base, "tokens": 5000})
    alias = await client.get("/api/quota/preview", params={**base, "estimatedTokens": 5000})
    small = await client.get("/api/quota/preview", params=base)
    assert plain.status_code == alias.status_code == small.status_code == 200
    assert plain.json() == alias.json()
    assert alias.json()["outcome"] == "block"  # 5,000 tokens do not fit 1,000
    assert small.json()["outcome"] == "allow"
    for name in ("estimatedRequests", "estimatedUsd"):
        assert (await client.get("/api/quota/preview", params={**base, name: 1})).status_code == 200
    both = await client.get(
        "/api/quota/preview", params={**base, "tokens": 1, "estimatedTokens": 2}
    )
    assert both.status_code == 422
    assert [f["field"] for f in both.json()["error"]["fields"]] == ["estimatedTokens"]


async def test_a_client_key_on_the_admin_api_is_forbidden_not_unauthenticated(
    client: httpx.AsyncClient,
) -> None:
    r = await client.get("/api/keys", headers={"Authorization": f"Bearer {ALICE}"})
    assert r.status_code == 403
    assert r.json()["error"]["type"] == "permission_error"
    assert "Client keys cannot use the admin API" in r.json()["error"]["message"]
    assert "www-authenticate" not in r.headers
    wrong = await client.get("/api/keys", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert wrong.headers["www-authenticate"] == "Bearer"


async def test_an_unknown_api_route_is_named_with_its_api_prefix(
    client: httpx.AsyncClient,
) -> None:
    r = await client.get("/api/quota/nothing-here")
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "No route for GET /api/quota/nothing-here"


async def test_a_manual_plan_of_zeros_warns_in_the_answer_and_in_health(
    client: httpx.AsyncClient,
) -> None:
    assert (await client.get("/health")).json()["warnings"] == []
    zeros = {"dimensions": [{"unit": "tokens", "window": "hourly", "limit": 0}]}
    r = await client.put("/api/quota/plans/kimi-1", json=zeros)
    assert r.status_code == 200, r.text
    (warning,) = r.json()["warnings"]
    assert "nothing is enforced" in warning
    (health,) = (await client.get("/health")).json()["warnings"]
    assert health.startswith("pool planned:")
    real = {"dimensions": [{"unit": "tokens", "window": "hourly", "limit": 500}]}
    assert (await client.put("/api/quota/plans/kimi-1", json=real)).json()["warnings"] == []
    assert (await client.get("/health")).json()["warnings"] == []


async def test_health_shows_when_gc_last_ran_and_what_it_removed(
    client: httpx.AsyncClient,
) -> None:
    gc = (await client.get("/health")).json()["gc"]
    assert gc["intervalS"] == 3600
    assert gc["removedTotal"] == {
        "buckets": 0,
        "activeKeys": 0,
        "reservations": 0,
        "logEvents": 0,
    }
    assert set(gc) >= {"runs", "lastRunMs", "lastRemoved", "lastError"}


@pytest.mark.parametrize("tiny", [0.0, 1e-12, 1e-9])
async def test_a_limit_at_or_below_1e_9_is_unknown_everywhere_caps_included(
    tmp_path: Path, clock: ManualClock, tiny: float
) -> None:
    """Unknown means shown, never enforced: for a dimension (as before), and now for an
    absolute cap and a per-model cap too (a tiny cap refused every request)."""
    alloc = Allocation(
        "a",
        100,
        cap_value=tiny,
        cap_unit=Unit.TOKENS,
        policy=Policy.HARD,
        model_caps=(ModelCap("gpt-x", Unit.TOKENS, tiny),),
    )
    assert alloc.cap_for(Unit.TOKENS) is None
    assert alloc.model_cap("gpt-x") == ()
    dims = (
        Dimension(Unit.TOKENS, Window.HOURLY, 1000),
        Dimension(Unit.REQUESTS, Window.HOURLY, tiny),
    )
    pool = Pool("p", "p", "mock", ("c",), dims, (alloc,))
    assert [d.key for d in pool.enforced_dimensions()] == ["tokens/hourly"]
    assert pool.unenforced_warning is None
    assert Pool("q", "q", "mock", ("c",), dims[1:], (alloc,)).unenforced_warning is not None
    store = SqliteQuotaStore(tmp_path / "q.sqlite")
    try:
        engine = QuotaEngine(store, clock=clock)
        adm = await engine.admit(pool, "a", {Unit.TOKENS: 10, Unit.REQUESTS: 1}, model="gpt-x")
        assert adm.allowed
        assert [s.key for s in adm.status] == ["tokens/hourly"]
    finally:
        await store.close()


def test_demo_honours_the_admin_key_and_data_dir_from_the_environment(tmp_path: Path) -> None:
    env = {"FAIRGATE_ADMIN_KEY": " my-admin-key ", "FAIRGATE_DATA_DIR": str(tmp_path / "d")}
    assert demo_identity(Settings.load(env), None) == (tmp_path / "d", "my-admin-key")
    # --data-dir wins over the environment
    assert demo_identity(Settings.load(env), tmp_path / "flag")[0] == tmp_path / "flag"
    ddir, key = demo_identity(Settings.load({}), None)
    assert ddir.name.startswith("fairgate-demo-")
    assert key.startswith("fg-admin-")
    assert len(key) > 20
    ddir.rmdir()


def test_pyproject_license_is_an_spdx_string() -> None:
    """``license = {text = ...}`` printed a deprecation warning on every install."""
    root = Path(__file__).resolve().parents[2]
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "MIT"
    assert "setuptools>=77" in meta["build-system"]["requires"]  # first to read SPDX strings
