"""The admin API served for real (uvicorn on a loopback port) and driven with httpx.

Covers the happy paths and, above all, the rejections: every bad request gets the documented
status and error shape, names the field, never leaks a secret or a stack trace, and leaves the DB
exactly as it was.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from db_support import connection
from http_support import AdminApi as Api
from http_support import admin_api, admin_client, error_of

from fairgate.clock import ManualClock
from fairgate.config import Config, ConfigError, parse_config
from fairgate.db.pools import PoolRepo
from fairgate.domain.units import Unit
from fairgate.process.state import Gateway

ADMIN = "adm-test"
ALICE_SECRET = "fg-alice-secret-0123456789"
BOB_SECRET = "fg-bob-secret-0123456789"
UPSTREAM_SECRET = "upstream-very-secret-value"

CONFIG: dict[str, Any] = {
    "connections": [
        connection("mock-1", secret="${UP}"),
        connection("mock-2"),
        connection("kimi-1", "kimi"),
    ],
    "keys": [
        {"id": "alice", "name": "Alice", "secret": "${ALICE}"},
        {"id": "bob", "name": "Bob", "secret": BOB_SECRET},
    ],
    "pools": [
        {
            "id": "demo",
            "name": "Demo pool",
            "connections": ["mock-1"],
            "dimensions": [{"unit": "requests", "window": "hourly", "limit": 10}],
            "allocations": [
                {
                    "key": "alice",
                    "weight": 50,
                    "policy": "hard",
                    "model_caps": [{"model": "gpt-x", "unit": "requests", "limit": 5}],
                },
                {"key": "bob", "weight": 50, "policy": "soft"},
            ],
        }
    ],
}
ENV = {"UP": UPSTREAM_SECRET, "ALICE": ALICE_SECRET}


def make_config() -> Config:
    return parse_config(CONFIG, ENV)


@pytest_asyncio.fixture
async def api(tmp_path: Path, clock: ManualClock) -> AsyncIterator[Api]:
    gw = Gateway(data_dir=tmp_path, config=make_config(), env=ENV, clock=clock, admin_key=ADMIN)
    async with admin_api(gw, ADMIN, clock) as api:
        yield api


def fields_of(r: httpx.Response) -> dict[str, str]:
    return {f["field"]: f["message"] for f in error_of(r).get("fields", [])}


async def refused_writing_nothing(
    api: Api, cases: list[tuple[str, str, dict[str, Any], int, str | None]]
) -> None:
    """Each ``(method, url, request kwargs, status, field)`` is answered ``status``, naming
    ``field`` when one is given, and leaves every table as it was."""
    before = api.dump()
    for method, url, kw, status, field in cases:
        r = await api.request(method, url, **kw)
        assert r.status_code == status, (method, url, r.text)
        if field:
            assert field in fields_of(r), r.text
        assert api.dump() == before


def no_leak(r: httpx.Response) -> None:
    for secret in (UPSTREAM_SECRET, ALICE_SECRET, BOB_SECRET, "Traceback", "/work/", 'File "'):
        assert secret not in r.text


# -- auth -------------------------------------------------------------------------------------


async def test_auth_required_everywhere(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.base_url) as anon:
        for method, url in [
            ("GET", "/quota/pools"),
            ("GET", "/settings"),
            ("POST", "/keys"),
            ("DELETE", "/quota/pools/demo"),
            ("GET", "/does-not-exist"),
        ]:
            r = await anon.request(method, url)
            assert r.status_code == 401, (method, url)
            assert error_of(r)["type"] == "authentication_error"
            assert r.headers["www-authenticate"] == "Bearer"
        wrong = await anon.get("/quota/pools", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert error_of(wrong)["message"] == "Invalid admin key"
        client_key = await anon.get("/keys", headers={"Authorization": f"Bearer {ALICE_SECRET}"})
        assert client_key.status_code == 403  # authenticated, not allowed
        assert error_of(client_key)["type"] == "permission_error"
        assert "Client keys" in error_of(client_key)["message"]
        # authentication comes before the body is even parsed
        bad = await anon.post("/quota/pools", content=b"{oops", headers={"x-admin-key": "no"})
        assert bad.status_code == 401
        ok = await anon.get("/quota/pools", headers={"x-admin-key": ADMIN})
        assert ok.status_code == 200
        basic = await anon.get("/quota/pools", headers={"Authorization": f"Basic {ADMIN}"})
        assert basic.status_code == 401
        schema = await anon.get("/openapi.json")
        assert schema.status_code == 200
        assert "/quota/pools/{pool_id}/usage" in schema.json()["paths"]


async def test_no_admin_key_configured(tmp_path: Path) -> None:
    gw = Gateway(data_dir=tmp_path, env={})
    async with admin_client(gw, "anything") as (_, c):
        assert gw.admin_key is None
        r = await c.get("/quota/pools")
    assert r.status_code == 401
    assert "FAIRGATE_ADMIN_KEY" in error_of(r)["message"]


def test_admin_key_from_env(tmp_path: Path) -> None:
    assert Gateway(data_dir=tmp_path, env={"FAIRGATE_ADMIN_KEY": "k"}).admin_key == "k"
    assert (
        Gateway(data_dir=tmp_path, env={"FAIRGATE_ADMIN_KEY": "k"}, admin_key="a").admin_key == "a"
    )


# -- pools ------------------------------------------------------------------------------------

NEW_POOL = {
    "id": "p2",
    "name": "Second",
    "connections": ["mock-2"],
    "shareMode": "active",
    "activeWindowS": 600,
    "dimensions": [{"unit": "tokens", "window": "daily", "limit": 1000}],
    "allocations": [{"key": "alice", "weight": 70, "capValue": 100, "capUnit": "tokens"}],
}


async def test_pool_crud(api: Api) -> None:
    r = await api.request("GET", "/quota/pools")
    assert r.status_code == 200
    (demo,) = r.json()
    assert demo["id"] == "demo"
    assert demo["provider"] == "mock"
    assert demo["planSource"] == "pool"
    assert demo["allocations"][0]["modelCaps"] == [
        {"model": "gpt-x", "unit": "requests", "limit": 5.0}
    ]
    version = api.gw.registry.version
    r = await api.request("POST", "/quota/pools", json=NEW_POOL)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["shareMode"] == "active"
    assert body["activeWindowS"] == 600
    assert body["allocations"][0]["capUnit"] == "tokens"
    assert api.gw.registry.version > version
    assert api.gw.registry.pool_by_connection["mock-2"].id == "p2"
    r = await api.request("GET", "/quota/pools/p2")
    assert r.json() == body
    r = await api.request(
        "PATCH",
        "/quota/pools/p2",
        json={"name": "Renamed", "allocations": [{"key": "bob", "weight": 10}]},
    )
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "Renamed"
    assert [a["key"] for a in r.json()["allocations"]] == ["bob"]
    assert r.json()["shareMode"] == "active"  # untouched
    assert api.gw.registry.pools["p2"].allocation("alice") is None
    r = await api.request("DELETE", "/quota/pools/p2")
    assert r.status_code == 204
    assert r.content == b""
    assert (await api.request("GET", "/quota/pools/p2")).status_code == 404
    assert "p2" not in api.gw.registry.pools


async def test_pool_accepts_config_style_snake_case(api: Api) -> None:
    body = {
        "id": "p3",
        "connections": ["mock-2"],
        "share_mode": "static",
        "active_window_s": 60,
        "allocations": [{"key": "bob", "cap_value": 3, "cap_unit": "requests"}],
    }
    r = await api.request("POST", "/quota/pools", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["activeWindowS"] == 60
    assert r.json()["allocations"][0]["capValue"] == 3
    assert r.json()["planSource"] == "empty"


async def test_pool_rejections_change_nothing(api: Api) -> None:
    before = api.dump()
    cases: list[tuple[str, str, dict[str, Any], int, str | None]] = [
        ("POST", "/quota/pools", {"content": b'{"id": "x",'}, 400, None),
        ("POST", "/quota/pools", {"content": b"not json"}, 400, None),
        (
            "POST",
            "/quota/pools",
            {"content": b'{"id": "x"}', "headers": {"content-type": "text/plain"}},
            400,
            None,
        ),
        (
            "POST",
            "/quota/pools",
            {"json": {**NEW_POOL, "allocations": [{"key": "alice", "weight": "lots"}]}},
            422,
            "allocations.0.weight",
        ),
        (
            "POST",
            "/quota/pools",
            {"json": {**NEW_POOL, "allocations": [{"key": "alice", "weight": 101}]}},
            422,
            "allocations.0.weight",
        ),
        (
            "POST",
            "/quota/pools",
            {"json": {**NEW_POOL, "allocations": [{"key": "alice", "policy": "greedy"}]}},
            422,
            "allocations.0.policy",
        ),
        (
            "POST",
            "/quota/pools",
            {
                "json": {
                    **NEW_POOL,
                    "dimensions": [{"unit": "bytes", "window": "daily", "limit": 1}],
                }
            },
            422,
            "dimensions.0.unit",
        ),
        ("POST", "/quota/pools", {"json": {**NEW_POOL, "id": "a:b"}}, 422, "id"),
        ("POST", "/quota/pools", {"json": {**NEW_POOL, "connections": []}}, 422, "connections"),
        ("POST", "/quota/pools", {"json": {**NEW_POOL, "unknown": 1}}, 422, "unknown"),
        ("POST", "/quota/pools", {"json": [1, 2]}, 422, "body"),
        (
            "POST",
            "/quota/pools",
            {"json": {**NEW_POOL, "connections": ["mock-2", "ghost"]}},
            422,
            "connections.1",
        ),
        (
            "POST",
            "/quota/pools",
            {"json": {**NEW_POOL, "connections": ["mock-2", "kimi-1"]}},
            422,
            "connections",
        ),
        (
            "POST",
            "/quota/pools",
            {"json": {**NEW_POOL, "allocations": [{"key": "ghost"}]}},
            422,
            "allocations.0.key",
        ),
        ("POST", "/quota/pools", {"json": {**NEW_POOL, "id": "demo"}}, 409, None),
        (
            "POST",
            "/quota/pools",
            {"json": {**NEW_POOL, "connections": ["mock-1"]}},
            409,
            None,
        ),
        ("GET", "/quota/pools/ghost", {}, 404, None),
        ("PATCH", "/quota/pools/ghost", {"json": {"name": "x"}}, 404, None),
        ("PATCH", "/quota/pools/demo", {"json": {"name": None}}, 422, "name"),
        ("PATCH", "/quota/pools/demo", {"json": {"shareMode": "x"}}, 422, "shareMode"),
        (
            "PATCH",
            "/quota/pools/demo",
            {"json": {"allocations": [{"key": "alice"}, {"key": "ghost"}]}},
            422,
            "allocations.1.key",
        ),
        ("DELETE", "/quota/pools/ghost", {}, 404, None),
        ("GET", "/quota/pools/ghost/usage", {}, 404, None),
        ("GET", "/quota/pools/ghost/log", {}, 404, None),
        ("GET", "/quota/pools/demo/log?limit=0", {}, 422, "limit"),
        ("GET", "/quota/pools/demo/log?limit=abc", {}, 422, "limit"),
        ("PUT", "/quota/pools/demo", {"json": {}}, 405, None),
    ]
    for method, url, kw, status, field in cases:
        r = await api.request(method, url, **kw)
        assert r.status_code == status, (method, url, kw, r.text)
        err = error_of(r)
        if field is not None:
            assert field in fields_of(r), (field, r.text)
        if status in (400, 422):
            assert err["type"] == "invalid_request_error"
        no_leak(r)
        assert api.dump() == before, (method, url, kw)


async def test_unexpected_errors_are_sanitized(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: PoolRepo) -> None:
        raise RuntimeError(f"/secret/path {UPSTREAM_SECRET}")

    monkeypatch.setattr(PoolRepo, "records", boom)
    r = await api.request("GET", "/quota/pools")
    assert r.status_code == 500
    assert error_of(r) == {"message": "Internal error in the admin API", "type": "api_error"}
    assert "/secret/path" not in r.text
    no_leak(r)


# -- usage, log, model caps, preview ----------------------------------------------------------


async def _use(api: Api, key: str, n: int, model: str | None = None) -> None:
    pool = api.gw.registry.pools["demo"]
    for _ in range(n):
        adm = await api.gw.engine.admit(pool, key, {Unit.REQUESTS: 1}, model=model)
        assert adm.allowed
        await api.gw.engine.settle(adm.ticket, {Unit.REQUESTS: 1})


async def test_usage(api: Api) -> None:
    await _use(api, "alice", 3)
    r = await api.request("GET", "/quota/pools/demo/usage")
    assert r.status_code == 200
    body = r.json()
    assert body["poolId"] == "demo"
    (dim,) = body["dimensions"]
    assert dim["key"] == "requests/hourly"
    assert dim["limit"] == 10
    assert dim["total"] == 3
    assert dim["usedFraction"] == pytest.approx(0.3)
    assert dim["strict"] is False
    assert "burnRatePerS" in dim
    assert "timeToExhaustionMs" in dim
    keys = {k["keyId"]: k for k in dim["keys"]}
    assert keys["alice"]["consumed"] == 3
    assert keys["alice"]["fairShare"] == 5
    assert keys["alice"]["surplus"] == 2
    assert keys["alice"]["borrowing"] is False
    assert keys["bob"]["policy"] == "soft"
    # the standing of active mode (issue 18): the largest consumed / limit, and where
    assert keys["alice"]["dominantShare"] == pytest.approx(0.3)
    assert keys["alice"]["dominantDimension"] == "requests/hourly"
    assert (keys["bob"]["dominantShare"], keys["bob"]["dominantDimension"]) == (0, None)


async def test_log(api: Api) -> None:
    for i in range(5):
        api.gw.pool_log.log("demo", {"ts": i, "keyId": "alice", "outcome": "allow"})
    r = await api.request("GET", "/quota/pools/demo/log?limit=3")
    assert r.status_code == 200
    assert [e["ts"] for e in r.json()["events"]] == [4, 3, 2]
    assert r.json()["poolId"] == "demo"


async def test_model_caps(api: Api) -> None:
    url = "/quota/pools/demo/allocations/bob/model-caps"
    caps = [{"model": "gpt-y", "unit": "tokens", "limit": 1000}]
    r = await api.request("PUT", url, json=caps)
    assert r.status_code == 200, r.text
    assert r.json()["modelCaps"] == [{"model": "gpt-y", "unit": "tokens", "limit": 1000.0}]
    assert api.gw.registry.pools["demo"].allocation("bob").model_caps[0].model == "gpt-y"  # type: ignore[union-attr]
    before = api.dump()
    dup = await api.request("PUT", url, json=caps * 2)
    assert dup.status_code == 422
    bad = await api.request("PUT", url, json=[{"model": "m", "unit": "requests", "limit": -1}])
    assert bad.status_code == 422
    assert "0.limit" in fields_of(bad)
    missing = await api.request("PUT", "/quota/pools/demo/allocations/ghost/model-caps", json=caps)
    assert missing.status_code == 404
    assert api.dump() == before


async def test_one_allocation_is_added_replaced_and_removed_alone(api: Api) -> None:
    """``PUT/DELETE …/allocations/{key}`` touch that key's allocation only: the others, with
    their policies, caps and model caps, stay exactly as stored, and the registry follows."""
    (await api.request("POST", "/keys", json={"id": "dana", "name": "Dana"})).raise_for_status()
    url = "/quota/pools/demo/allocations/dana"
    r = await api.request("PUT", url, json={"weight": 20, "capValue": 50, "capUnit": "requests"})
    assert r.status_code == 200, r.text
    by_key = {a["key"]: a for a in r.json()["allocations"]}
    assert sorted(by_key) == ["alice", "bob", "dana"]
    assert (by_key["dana"]["weight"], by_key["dana"]["policy"]) == (20, "hard")
    assert (by_key["dana"]["capValue"], by_key["dana"]["capUnit"]) == (50, "requests")
    assert by_key["bob"]["policy"] == "soft"  # the others untouched
    assert by_key["alice"]["modelCaps"] == [{"model": "gpt-x", "unit": "requests", "limit": 5.0}]
    pool = api.gw.registry.pools["demo"]
    assert pool.weight_of("dana") == 20

    r = await api.request("PUT", url, json={"weight": 30, "policy": "burst"})  # replaces it all
    assert r.status_code == 200, r.text
    dana = next(a for a in r.json()["allocations"] if a["key"] == "dana")
    assert (dana["weight"], dana["policy"], dana["capValue"]) == (30, "burst", None)
    assert api.gw.registry.pools["demo"].weight_of("dana") == 30

    r = await api.request("DELETE", url)
    assert r.status_code == 204, r.text
    r = await api.request("GET", "/quota/pools/demo")
    assert [a["key"] for a in r.json()["allocations"]] == ["alice", "bob"]
    assert api.gw.registry.pools["demo"].allocation("dana") is None
    assert api.gw.registry.pools["demo"].allocation("bob") is not None


async def test_one_allocation_rejections_change_nothing(api: Api) -> None:
    before = api.dump()
    cases: list[tuple[str, str, dict[str, Any] | None, int, str]] = [
        ("PUT", "/quota/pools/demo/allocations/ghost", {"weight": 5}, 404, "ghost"),
        ("PUT", "/quota/pools/nope/allocations/bob", {"weight": 5}, 404, "nope"),
        ("PUT", "/quota/pools/demo/allocations/bob", {}, 422, "weight"),
        ("PUT", "/quota/pools/demo/allocations/bob", {"weight": 101}, 422, "weight"),
        ("PUT", "/quota/pools/demo/allocations/bob", {"weight": 5, "capValue": 3}, 422, "cap"),
        ("PUT", "/quota/pools/demo/allocations/bob", {"weight": 5, "key": "x"}, 422, "key"),
        ("PUT", "/quota/pools/demo/allocations/bob", {"weight": 5, "policy": "x"}, 422, "policy"),
        ("DELETE", "/quota/pools/demo/allocations/ghost", None, 404, "ghost"),
        ("DELETE", "/quota/pools/nope/allocations/bob", None, 404, "nope"),
    ]
    for method, url, body, status, needle in cases:
        r = await api.request(method, url, json=body)
        assert r.status_code == status, (method, url, body, r.text)
        assert needle in r.text, (method, url, body, r.text)
    assert api.dump() == before


async def test_preview_has_no_side_effect(api: Api, tmp_path: Path) -> None:
    await _use(api, "alice", 5)  # alice at her fair share of 5 ...
    await _use(api, "bob", 1)  # ... and the pool strict (6/10 ≥ 0.5)
    before = (await api.request("GET", "/quota/pools/demo/usage")).json()
    # the store's memory mode (the default) writes behind: commit, then the file is the state
    await api.gw.engine.store.flush()
    quota_db = sqlite3.connect(tmp_path / "quota.sqlite")
    counters = list(quota_db.iterdump())
    for _ in range(3):
        r = await api.request("GET", "/quota/preview", params={"pool": "demo", "key": "alice"})
        assert r.status_code == 200, r.text
    body = r.json()
    assert body["outcome"] == "block"
    assert body["reason"] == "fair-share"
    assert body["dimension"] == "requests/hourly"
    assert body["retryAfterMs"] > 0
    (dim,) = body["dimensions"]
    assert dim["total"] == 6
    assert dim["consumed"] == 5
    assert dim["fairShare"] == 5
    assert dim["strict"] is True
    soft = await api.request("GET", "/quota/preview", params={"pool": "demo", "key": "bob"})
    assert soft.json()["outcome"] == "allow"
    capped = await api.request(
        "GET", "/quota/preview", params={"pool": "demo", "key": "alice", "model": "gpt-x"}
    )
    assert [d["scope"] for d in capped.json()["dimensions"]] == ["pool", "model"]
    after = (await api.request("GET", "/quota/pools/demo/usage")).json()
    assert after["dimensions"][0]["total"] == before["dimensions"][0]["total"]
    assert after["dimensions"][0]["keys"] == before["dimensions"][0]["keys"]
    await api.gw.engine.store.flush()  # anything the previews changed in memory, in the file
    assert list(quota_db.iterdump()) == counters
    quota_db.close()
    for params, status, field in [
        ({"pool": "ghost", "key": "alice"}, 404, None),
        ({"pool": "demo", "key": "ghost"}, 404, None),
        ({"pool": "demo"}, 422, "key"),
        ({"pool": "demo", "key": "alice", "tokens": "-1"}, 422, "tokens"),
        ({"pool": "demo", "key": "alice", "requests": "x"}, 422, "requests"),
    ]:
        r = await api.request("GET", "/quota/preview", params=params)
        assert r.status_code == status, (params, r.text)
        if field:
            assert field in fields_of(r)


async def test_delete_pool_clears_its_counters(api: Api) -> None:
    await _use(api, "alice", 4)
    usage = (await api.request("GET", "/quota/pools/demo/usage")).json()
    assert usage["dimensions"][0]["total"] == 4
    export = (await api.request("GET", "/quota/pools/export")).json()
    api.gw.pool_log.log("demo", {"ts": 1})
    assert (await api.request("DELETE", "/quota/pools/demo")).status_code == 204
    r = await api.request("POST", "/quota/pools", json=export["pools"][0])
    assert r.status_code == 201, r.text
    usage = (await api.request("GET", "/quota/pools/demo/usage")).json()
    assert usage["dimensions"][0]["total"] == 0
    assert all(k["consumed"] == 0 for k in usage["dimensions"][0]["keys"])
    assert (await api.request("GET", "/quota/pools/demo/log")).json()["events"] == []


# -- export / import --------------------------------------------------------------------------


async def test_export_import_is_idempotent(api: Api) -> None:
    assert (await api.request("POST", "/quota/pools", json=NEW_POOL)).status_code == 201
    export = (await api.request("GET", "/quota/pools/export")).json()
    assert export["version"] == 1
    assert [p["id"] for p in export["pools"]] == ["demo", "p2"]
    before = api.dump()
    for _ in range(2):
        r = await api.request("POST", "/quota/pools/import", json=export)
        assert r.status_code == 200, r.text
        assert r.json() == {"created": 0, "updated": 0, "unchanged": 2}
        assert api.dump() == before
    changed = {
        "pools": [
            {**export["pools"][0], "name": "Changed"},
            {**NEW_POOL, "id": "p3", "connections": ["kimi-1"], "dimensions": []},
        ]
    }
    r = await api.request("POST", "/quota/pools/import", json=changed)
    assert r.json() == {"created": 1, "updated": 1, "unchanged": 0}
    r = await api.request("POST", "/quota/pools/import", json=changed)
    assert r.json() == {"created": 0, "updated": 0, "unchanged": 2}
    p3 = (await api.request("GET", "/quota/pools/p3")).json()
    assert p3["planSource"] == "catalog"
    assert p3["effectiveDimensions"][0]["key"] == "requests/hourly"


async def test_import_rejections_change_nothing(api: Api) -> None:
    export = (await api.request("GET", "/quota/pools/export")).json()
    before = api.dump()
    good = {**NEW_POOL, "id": "p9"}
    for body, status, field in [
        (
            {"pools": [good, {**good, "id": "p10", "connections": ["ghost"]}]},
            422,
            "pools.1.connections.0",
        ),
        (
            {"pools": [good, {**good, "id": "p10", "allocations": [{"key": "x"}]}]},
            422,
            "pools.1.allocations.0.key",
        ),
        ({"pools": [good, good]}, 422, "pools"),
        ({"pools": [{**good, "connections": ["mock-1"]}]}, 409, None),
        ({"version": 2, "pools": []}, 422, "version"),
        (
            {"pools": [{**export["pools"][0], "allocations": [{"key": "a", "weight": -1}]}]},
            422,
            "pools.0.allocations.0.weight",
        ),
    ]:
        r = await api.request("POST", "/quota/pools/import", json=body)
        assert r.status_code == status, (body, r.text)
        if field:
            assert field in fields_of(r), r.text
        assert api.dump() == before


# -- plans ------------------------------------------------------------------------------------


async def test_plans(api: Api) -> None:
    r = await api.request("GET", "/quota/plans")
    plans = {p["connectionId"]: p for p in r.json()}
    assert plans["kimi-1"]["source"] == "catalog"
    assert plans["mock-1"]["source"] == "empty"
    assert (
        await api.request("POST", "/quota/pools", json={"id": "np", "connections": ["mock-2"]})
    ).status_code == 201
    dims = {"dimensions": [{"unit": "requests", "window": "daily", "limit": 50}]}
    r = await api.request("PUT", "/quota/plans/mock-2", json=dims)
    assert r.status_code == 200, r.text
    assert r.json()["source"] == "override"
    pool = api.gw.registry.pools["np"]
    assert [d.key for d in pool.dimensions] == ["requests/daily"]
    got = (await api.request("GET", "/quota/pools/np")).json()
    assert got["planSource"] == "override"
    assert got["dimensions"] == []
    r = await api.request("DELETE", "/quota/plans/mock-2")
    assert r.status_code == 204
    assert r.content == b""
    assert (await api.request("GET", "/quota/plans/mock-2")).json()["source"] == "empty"
    assert api.gw.registry.pools["np"].dimensions == ()
    await refused_writing_nothing(
        api,
        [
            ("PUT", "/quota/plans/mock-2", {"json": {"dimensions": []}}, 422, "dimensions"),
            (
                "PUT",
                "/quota/plans/mock-2",
                {"json": {"dimensions": [{"unit": "x"}]}},
                422,
                "dimensions.0.unit",
            ),
            ("PUT", "/quota/plans/ghost", {"json": dims}, 404, None),
            ("GET", "/quota/plans/ghost", {}, 404, None),
            ("DELETE", "/quota/plans/ghost", {}, 404, None),
        ],
    )


# -- connections ------------------------------------------------------------------------------


async def test_connection_secret_is_write_only(api: Api) -> None:
    body = {
        "id": "up-9",
        "provider": "openai",
        "baseUrl": "https://api.example/v1",
        "secret": "sk-brand-new-secret",
        "maxConcurrent": 3,
        "models": "*",
    }
    responses = [await api.request("POST", "/connections", json=body)]
    assert responses[0].status_code == 201, responses[0].text
    assert responses[0].json()["hasSecret"] is True
    assert responses[0].json()["maxConcurrent"] == 3
    assert api.gw.registry.connections["up-9"].secret == "sk-brand-new-secret"
    responses.append(await api.request("GET", "/connections"))
    responses.append(await api.request("GET", "/connections/up-9"))
    responses.append(await api.request("GET", "/connections/mock-1"))
    patched = await api.request("PATCH", "/connections/up-9", json={"secret": "sk-rotated-secret"})
    assert patched.status_code == 200
    responses.append(patched)
    assert api.gw.registry.connections["up-9"].secret == "sk-rotated-secret"
    for r in responses:
        assert "secret" not in r.json() if isinstance(r.json(), dict) else True
        assert "sk-brand-new-secret" not in r.text
        assert "sk-rotated-secret" not in r.text
        no_leak(r)
    listed = {c["id"]: c for c in responses[1].json()}
    assert listed["mock-1"]["hasSecret"] is True
    assert listed["mock-1"]["pool"] == "demo"
    assert listed["mock-2"]["hasSecret"] is False


async def test_connection_crud_and_rejections(api: Api) -> None:
    body = {"id": "c9", "provider": "mock", "baseUrl": "http://h/v1", "models": ["m"]}
    assert (await api.request("POST", "/connections", json=body)).status_code == 201
    r = await api.request("PATCH", "/connections/c9", json={"maxConcurrent": None, "weight": 5})
    assert r.status_code == 200
    assert r.json()["weight"] == 5
    await refused_writing_nothing(
        api,
        [
            ("POST", "/connections", {"json": body}, 409, None),
            (
                "POST",
                "/connections",
                {"json": {**body, "id": "c10", "baseUrl": "nope"}},
                422,
                "baseUrl",
            ),
            ("POST", "/connections", {"json": {**body, "id": "c10", "weight": "x"}}, 422, "weight"),
            (
                "POST",
                "/connections",
                {"json": {**body, "id": "c10", "authType": "x"}},
                422,
                "authType",
            ),
            ("POST", "/connections", {"json": {"id": "c10"}}, 422, "provider"),
            ("POST", "/connections", {"json": {**body, "id": "c10", "models": []}}, 422, "models"),
            (
                "POST",
                "/connections",
                {"json": {**body, "id": "c10", "models": None}},
                422,
                "models",
            ),
            ("PATCH", "/connections/c9", {"json": {"models": []}}, 422, "models"),
            (
                "POST",
                "/connections",
                {"json": {**body, "id": "c10", "baseUrl": "https://u:hunter2@h/v1"}},
                422,
                "baseUrl",
            ),
            ("PATCH", "/connections/c9", {"json": {"baseUrl": "http://a:b@h/v1"}}, 422, "baseUrl"),
            (
                "POST",
                "/connections",
                {"json": {**body, "id": "c10", "forwardHeaders": ["Authorization"]}},
                422,
                "forwardHeaders",
            ),
            ("PATCH", "/connections/c9", {"json": {"weight": None}}, 422, "weight"),
            ("PATCH", "/connections/ghost", {"json": {"weight": 1}}, 404, None),
            ("PATCH", "/connections/mock-1", {"json": {"provider": "kimi"}}, 409, None),
            ("GET", "/connections/ghost", {}, 404, None),
            ("DELETE", "/connections/ghost", {}, 404, None),
            ("DELETE", "/connections/mock-1", {}, 409, None),
        ],
    )
    assert (await api.request("DELETE", "/connections/c9")).status_code == 204
    assert "c9" not in api.gw.registry.connections


async def test_a_new_host_needs_the_secret_again(api: Api) -> None:
    """Issue 43, N8: PATCH of baseUrl kept the stored secret, and POST .../test then sent it to
    the admin's host: an admin could read any upstream secret. A new origin needs the secret
    in the same change; a new path on the same host does not; an OAuth connection's host does
    not change at all."""
    body = {"id": "c9", "provider": "mock", "baseUrl": "https://up.example/v1", "models": ["m"]}
    body["secret"] = "sk-stored-upstream-secret"
    assert (await api.request("POST", "/connections", json=body)).status_code == 201
    before = api.dump()
    for url in (
        "https://attacker.example/v1",
        "http://up.example/v1",
        "https://up.example:8443/v1",
    ):
        r = await api.request("PATCH", "/connections/c9", json={"baseUrl": url})
        assert r.status_code == 422, r.text
        assert "secret" in fields_of(r)
        assert api.dump() == before
    r = await api.request("PATCH", "/connections/c9", json={"baseUrl": "https://UP.example/v2"})
    assert r.status_code == 200, r.text  # same origin, another path
    r = await api.request(
        "PATCH", "/connections/c9", json={"baseUrl": "https://new.example/v1", "secret": "sk-new-1"}
    )
    assert r.status_code == 200, r.text
    assert api.gw.registry.connections["c9"].secret == "sk-new-1"
    oauth = {**body, "id": "o9", "authType": "oauth"}
    oauth.pop("secret")
    assert (await api.request("POST", "/connections", json=oauth)).status_code == 201
    r = await api.request(
        "PATCH", "/connections/o9", json={"baseUrl": "https://attacker.example/v1"}
    )
    assert r.status_code == 422, r.text
    assert "baseUrl" in fields_of(r)


# -- keys -------------------------------------------------------------------------------------


async def test_key_secret_shown_once(api: Api) -> None:
    r = await api.request("POST", "/keys", json={"id": "carol", "name": "Carol"})
    assert r.status_code == 201, r.text
    body = r.json()
    secret = body["secret"]
    assert secret.startswith("fg-")
    assert "prefix" not in body  # no character of the secret is kept: shown by its id
    key = api.gw.registry.authenticate(secret)
    assert key is not None
    assert key.id == "carol"
    for url in ("/keys", "/keys/carol"):
        got = await api.request("GET", url)
        assert got.status_code == 200
        assert secret not in got.text
        assert key.key_hash not in got.text
        assert "secret" not in got.text
        assert "hash" not in got.text.lower()
    generated = await api.request("POST", "/keys", json={"allowedModels": ["gpt-x"]})
    assert generated.status_code == 201
    assert generated.json()["id"].startswith("key-")
    assert generated.json()["allowedModels"] == ["gpt-x"]


async def test_key_rotate_keeps_the_key_and_its_share(api: Api) -> None:
    before = api.gw.registry.pools["demo"].allocation("alice")
    r = await api.request("POST", "/keys/alice/rotate")
    assert r.status_code == 200, r.text
    body = r.json()
    new = body["secret"]
    assert new != ALICE_SECRET
    assert "prefix" not in body  # as at creation: no character of the secret is kept
    assert (body["id"], body["name"]) == ("alice", "Alice")
    assert api.gw.registry.authenticate(ALICE_SECRET) is None  # the old secret stops at once
    key = api.gw.registry.authenticate(new)
    assert key is not None
    assert key.id == "alice"
    assert api.gw.registry.pools["demo"].allocation("alice") == before
    assert new not in "".join(api.dump())  # only the hash is stored
    listed = await api.request("GET", "/keys/alice")
    assert new not in listed.text
    dump = api.dump()
    r = await api.request("POST", "/keys/ghost/rotate")
    assert r.status_code == 404
    assert api.dump() == dump


async def test_connection_test_reports_an_unreachable_upstream(api: Api) -> None:
    # mock-1 points at port 9 (discard, nothing listens): a reading, not an error of the route
    r = await api.request("POST", "/connections/mock-1/test")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ok"] is False
    assert body["status"] is None
    assert "cannot reach" in body["error"]
    no_leak(r)
    assert (await api.request("POST", "/connections/ghost/test")).status_code == 404


async def test_key_crud_and_rejections(api: Api) -> None:
    r = await api.request("PATCH", "/keys/bob", json={"enabled": False, "name": "Robert"})
    assert r.status_code == 200
    assert r.json()["enabled"] is False
    assert api.gw.registry.authenticate(BOB_SECRET) is None  # disabled at once
    await refused_writing_nothing(
        api,
        [
            ("POST", "/keys", {"json": {"id": "alice"}}, 409, None),
            ("POST", "/keys", {"json": {"id": "bad id"}}, 422, "id"),
            ("POST", "/keys", {"json": {"name": 5}}, 422, "name"),
            ("POST", "/keys", {"json": {"allowedModels": "gpt-x"}}, 422, "allowedModels"),
            ("POST", "/keys", {"json": {"secret": "mine"}}, 422, "secret"),
            ("PATCH", "/keys/ghost", {"json": {"name": "x"}}, 404, None),
            ("PATCH", "/keys/bob", {"json": {"enabled": None}}, 422, "enabled"),
            ("GET", "/keys/ghost", {}, 404, None),
            ("DELETE", "/keys/ghost", {}, 404, None),
        ],
    )
    assert (await api.request("DELETE", "/keys/alice")).status_code == 204
    assert api.gw.registry.authenticate(ALICE_SECRET) is None
    assert api.gw.registry.pools["demo"].allocation("alice") is None


# -- settings ---------------------------------------------------------------------------------


async def test_settings_never_echo_the_redis_url(api: Api) -> None:
    r = await api.request("GET", "/settings")
    assert r.status_code == 200
    body = r.json()
    assert body["quotaStore"]["activeDriver"] == "sqlite"
    assert body["quotaStore"]["redisUrlConfigured"] is False
    assert body["quota"]["saturationThreshold"] == 0.5
    url = "redis://:pa55word-xyz@127.0.0.1:1/0"
    old_store = api.gw.engine.store
    r = await api.request(
        "PUT", "/settings", json={"quotaStore": {"driver": "redis", "redisUrl": url}}
    )
    assert r.status_code == 200, r.text
    store = r.json()["quotaStore"]
    assert store["requestedDriver"] == "redis"
    assert store["activeDriver"] == "sqlite"  # nothing listens on port 1: fell back
    assert store["fallbackReason"]
    assert store["redisUrlConfigured"] is True
    assert store["redisUrlSource"] == "db"
    assert api.gw.engine.store is not old_store
    for resp in (r, await api.request("GET", "/settings")):
        assert "pa55word" not in resp.text
        assert "127.0.0.1:1" not in resp.text
    r = await api.request(
        "PUT", "/settings", json={"quotaStore": {"driver": None, "redisUrl": None}}
    )
    assert r.json()["quotaStore"]["redisUrlConfigured"] is False
    assert r.json()["quotaStore"]["driverSource"] == "default"


async def test_settings_knobs(api: Api) -> None:
    r = await api.request("PUT", "/settings", json={"quota": {"saturationThreshold": 0.8}})
    assert r.status_code == 200
    assert r.json()["quota"]["saturationThreshold"] == 0.8
    assert api.gw.quota_settings.saturation_threshold == 0.8
    assert api.gw.engine.settings.saturation_threshold == 0.8
    before = api.dump()
    for body, field in [
        ({"quota": {"saturationThreshold": 1.5}}, "quota.saturationThreshold"),
        ({"quota": {"softDeprioritizeFactor": "x"}}, "quota.softDeprioritizeFactor"),
        ({"quota": {"consumptionRetentionDays": -1}}, "quota.consumptionRetentionDays"),
        ({"quotaStore": {"driver": "mongo"}}, "quotaStore.driver"),
        ({"quotaStore": {"redisUrl": "http://x"}}, "quotaStore.redisUrl"),
        ({"quotaStore": None}, "quotaStore"),
        ({"quota": {"saturationThreshold": 0.3}, "quotaStore": None}, "quotaStore"),
    ]:
        r = await api.request("PUT", "/settings", json=body)
        assert r.status_code == 422, (body, r.text)
        assert field in fields_of(r), r.text
        assert api.dump() == before
    assert api.gw.quota_settings.saturation_threshold == 0.8


# -- misc -------------------------------------------------------------------------------------


async def test_unknown_route_and_method(api: Api) -> None:
    r = await api.request("GET", "/nowhere")
    assert r.status_code == 404
    assert error_of(r)["type"] == "not_found_error"
    r = await api.request("POST", "/settings", json={})
    assert r.status_code == 405
    error_of(r)


async def _redis_keys(redis_url: str, pool_id: str, *, delete: bool = False) -> list[bytes]:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    try:
        keys = [k async for k in client.scan_iter(match=f"fairgate:{{{pool_id}}}:*")]
        if delete and keys:
            await client.delete(*keys)
        return keys
    finally:
        await client.aclose()


@pytest.mark.redis
async def test_switch_to_redis_without_restart(api: Api, redis_url: str) -> None:
    """The store follows a settings change at run time; the URL is still never echoed."""
    pool_id = "rt" + uuid.uuid4().hex[:10]
    body = {**NEW_POOL, "id": pool_id, "shareMode": "static"}
    assert (await api.request("POST", "/quota/pools", json=body)).status_code == 201
    try:
        r = await api.request(
            "PUT", "/settings", json={"quotaStore": {"driver": "redis", "redisUrl": redis_url}}
        )
        assert r.status_code == 200, r.text
        assert r.json()["quotaStore"]["activeDriver"] == "redis"
        assert r.json()["quotaStore"]["fallbackReason"] is None
        assert redis_url not in r.text
        assert api.gw.engine.store.name == "redis"
        pool = api.gw.registry.pools[pool_id]
        adm = await api.gw.engine.admit(pool, "alice", {Unit.TOKENS: 10})
        await api.gw.engine.settle(adm.ticket, {Unit.TOKENS: 10})
        usage = (await api.request("GET", f"/quota/pools/{pool_id}/usage")).json()
        assert usage["dimensions"][0]["total"] == 10
        assert await _redis_keys(redis_url, pool_id)
        assert (await api.request("DELETE", f"/quota/pools/{pool_id}")).status_code == 204
        assert await _redis_keys(redis_url, pool_id) == []  # counters cleared in Redis too
        r = await api.request("PUT", "/settings", json={"quotaStore": {"driver": "sqlite"}})
        assert r.json()["quotaStore"]["activeDriver"] == "sqlite"
        assert api.gw.engine.store.name == "sqlite"
    finally:
        await _redis_keys(redis_url, pool_id, delete=True)


async def test_protocol_follows_provider_unless_explicit(api: Api) -> None:
    r = await api.request("PATCH", "/connections/mock-2", json={"provider": "anthropic"})
    assert r.json()["protocol"] == "anthropic"
    body = {
        "id": "ma",
        "provider": "mock-a",
        "baseUrl": "http://h/v1",
        "protocol": "anthropic",
        "models": "*",
    }
    assert (await api.request("POST", "/connections", json=body)).json()["protocol"] == "anthropic"
    r = await api.request("PATCH", "/connections/ma", json={"provider": "mock-b"})
    assert r.json()["protocol"] == "anthropic"
    r = await api.request("PATCH", "/connections/ma", json={"protocol": None})
    assert r.json()["protocol"] == "openai"


async def test_restart_with_a_conflicting_config_is_a_config_error(
    api: Api, tmp_path: Path
) -> None:
    r = await api.request("PATCH", "/quota/pools/demo", json={"connections": ["mock-2"]})
    assert r.status_code == 200
    r = await api.request("POST", "/quota/pools", json={"id": "other", "connections": ["mock-1"]})
    assert r.status_code == 201
    # seed mode (the default): the API moved the members, so the pools keep the API's
    kept = Gateway(data_dir=tmp_path, config=make_config(), env=ENV, admin_key=ADMIN)
    await kept.start()
    try:
        assert kept.registry.pools["demo"].connections == ("mock-2",)
        assert kept.registry.pools["other"].connections == ("mock-1",)
    finally:
        await kept.stop()
    # an authoritative file wants mock-1 back in demo, where the DB has it in another pool
    authoritative = make_config()
    authoritative.server.config_mode = "authoritative"
    again = Gateway(data_dir=tmp_path, config=authoritative, env=ENV, admin_key=ADMIN)
    with pytest.raises(ConfigError, match="conflicts with the database"):
        await again.start()
    await again.stop()  # never started: a no-op


async def test_every_delete_answers_204_with_no_body(api: Api) -> None:
    """One convention for the whole admin API (docs/operations.md): a delete answers 204 and no
    body; what is in force afterwards is a GET. The plan override's delete once answered 200
    with the plan, the only one that did."""
    schema = (await api.request("GET", "/openapi.json")).json()
    deletes = {
        path: op["responses"]
        for path, item in schema["paths"].items()
        for m, op in item.items()
        if m == "delete"
    }
    assert len(deletes) >= 5
    for path, responses in deletes.items():
        assert "204" in responses, path
        assert "200" not in responses, path


async def test_a_pools_admission_setting_through_the_api(api: Api) -> None:
    """Issue 45, item 1: ``admission: hold`` and its bounds are created, patched field by field
    (the others kept), read back and reach the engine's pool; a bad value is a 422 naming it."""
    r = await api.request("POST", "/quota/pools", json=NEW_POOL)
    assert r.status_code == 201, r.text
    assert r.json()["admission"] == "refuse"  # the default
    r = await api.request("PATCH", "/quota/pools/p2", json={"admission": "hold", "maxWaitMs": 2000})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["admission"], body["maxWaitMs"], body["queuePerKey"]) == ("hold", 2000, 32)
    hold = api.gw.registry.pools["p2"].hold
    assert (hold.mode.value, hold.max_wait_ms, hold.queue_per_pool) == ("hold", 2000, 256)
    assert (await api.request("GET", "/quota/pools/p2")).json() == body
    r = await api.request("PATCH", "/quota/pools/p2", json={"queuePerKey": 0})
    assert r.status_code == 422
    assert "queuePerKey" in r.text
