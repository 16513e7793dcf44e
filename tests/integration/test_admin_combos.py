"""``/combos`` of the admin API, served for real (uvicorn on a loopback port) and driven with httpx.

Happy paths, the minted qtSd/ combos (listed, readable, read-only, following pool changes) and
the rejections: each gets its status and names its field, and a rejected request changes neither
the DB nor the registry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio
from db_support import connection
from http_support import AdminApi as Api
from http_support import admin_api
from http_support import error_of as http_error_of

from fairgate.clock import ManualClock
from fairgate.config import parse_config
from fairgate.process.state import Gateway
from fairgate.routing.registry import PUBLIC_STRATEGIES

ADMIN = "adm-test"
UPSTREAM_SECRET = "upstream-very-secret-value"

CONFIG: dict[str, Any] = {
    "connections": [
        {
            "id": "mock-1",
            "provider": "mock",
            "base_url": "http://127.0.0.1:9/v1",
            "secret": UPSTREAM_SECRET,
            "models": ["gpt-x", "gpt-y"],
            "weight": 2,
        },
        {
            "id": "mock-2",
            "provider": "mock",
            "base_url": "http://127.0.0.1:9/v1",
            "models": ["gpt-y"],
        },
        connection("kimi-1", "kimi"),
    ],
    "pools": [{"id": "demo", "connections": ["mock-1"]}],
    "combos": [
        {
            "name": "seeded",
            "strategy": "priority",
            "targets": [
                {"provider": "mock", "model": "gpt-x"},
                {"provider": "kimi", "model": "k2"},
            ],
        }
    ],
}

NEW: dict[str, Any] = {
    "name": "fast",
    "strategy": "weighted",
    "targets": [
        {"provider": "mock", "model": "gpt-y", "connection": "mock-2", "weight": 3, "priceIn": 1},
        {"provider": "kimi", "model": "*"},
    ],
    "config": {"maxRetries": 2, "timeoutMs": 20_000, "options": {"sticky": True}},
}


@pytest_asyncio.fixture
async def api(tmp_path: Path, clock: ManualClock) -> AsyncIterator[Api]:
    config = parse_config(CONFIG, {})
    gw = Gateway(data_dir=tmp_path, config=config, env={}, clock=clock, admin_key=ADMIN)
    async with admin_api(gw, ADMIN, clock) as api:
        yield api


def error_of(r: httpx.Response) -> dict[str, Any]:
    return http_error_of(r, UPSTREAM_SECRET)


def fields_of(r: httpx.Response) -> dict[str, str]:
    return {f["field"]: f["message"] for f in error_of(r).get("fields", [])}


# -- happy paths --------------------------------------------------------------------------------


async def test_combo_crud(api: Api) -> None:
    r = await api.request("GET", "/combos")
    assert r.status_code == 200
    (seeded,) = r.json()
    assert seeded["name"] == "seeded"
    assert seeded["internal"] is False
    assert seeded["targets"][0] == {
        "provider": "mock",
        "model": "gpt-x",
        "connection": None,
        "weight": 1.0,
        "priceIn": None,
        "priceOut": None,
        "tier": 0,
        "contextWindow": None,
        "tags": [],
    }
    assert api.gw.registry.combo("seeded") is not None

    version = api.gw.registry.version
    r = await api.request("POST", "/combos", json=NEW)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["name"] == "fast"
    assert body["strategy"] == "weighted"
    assert body["config"]["maxRetries"] == 2
    assert body["config"]["retryDelayMs"] is None  # not set: follows the defaults
    assert body["config"]["options"] == {"sticky": True}
    assert body["createdMs"] == body["updatedMs"] == api.clock.now_ms()
    assert api.gw.registry.version > version
    combo = api.gw.registry.combo("fast")
    assert combo is not None
    assert [t.key for t in combo.targets] == ["mock/gpt-y@mock-2", "kimi/*"]
    assert combo.targets[0].weight == 3
    assert combo.config.max_retries == 2
    assert combo.config.timeout_ms == 20_000
    assert combo.config.options["sticky"] is True
    assert (await api.request("GET", "/combos/fast")).json() == body

    api.clock.advance(5_000)
    r = await api.request(
        "PUT",
        "/combos/fast",
        json={"strategy": "Round_Robin", "targets": [{"provider": "kimi", "model": "k2"}]},
    )
    assert r.status_code == 200, r.text
    put = r.json()
    assert put["strategy"] == "round-robin"
    assert put["createdMs"] == body["createdMs"]
    assert put["updatedMs"] == body["createdMs"] + 5_000
    assert put["config"]["maxRetries"] is None  # the whole combo was replaced
    replaced = api.gw.registry.combo("fast")
    assert replaced is not None
    assert replaced.strategy == "round-robin"
    assert replaced.config.max_retries == 1
    # the name may be repeated in the body when it matches
    r = await api.request("PUT", "/combos/fast", json={**NEW, "name": "fast"})
    assert r.status_code == 200, r.text

    names = [c["name"] for c in (await api.request("GET", "/combos")).json()]
    assert names == ["fast", "seeded"]
    r = await api.request("DELETE", "/combos/fast")
    assert r.status_code == 204
    assert r.content == b""
    assert (await api.request("GET", "/combos/fast")).status_code == 404
    assert api.gw.registry.combo("fast") is None


async def test_snake_case_bodies_like_the_config_file(api: Api) -> None:
    body = {
        "name": "snake",
        "strategy": "cost_optimized",
        "targets": [{"provider": "mock", "model": "gpt-x", "price_in": 1, "context_window": 8}],
        "config": {"max_retries": 0, "quality_validation": False},
    }
    r = await api.request("POST", "/combos", json=body)
    assert r.status_code == 201, r.text
    out = r.json()
    assert out["strategy"] == "cost-optimized"
    assert out["targets"][0]["priceIn"] == 1
    assert out["targets"][0]["contextWindow"] == 8
    assert out["config"]["qualityValidation"] is False


async def test_provider_model_strings_as_targets(api: Api) -> None:
    """``provider/model`` strings, as LiteLLM and OmniRoute users write them, are stored and
    answered as the mapping they mean; a string without a provider is a 422 naming it."""
    body = {"name": "litellm-style", "targets": ["mock/gpt-x", "kimi/moonshot/k2"]}
    r = await api.request("POST", "/combos", json=body)
    assert r.status_code == 201, r.text
    targets = [(t["provider"], t["model"]) for t in r.json()["targets"]]
    assert targets == [("mock", "gpt-x"), ("kimi", "moonshot/k2")]
    combo = api.gw.registry.combo("litellm-style")
    assert combo is not None
    assert [t.key for t in combo.targets] == ["mock/gpt-x", "kimi/moonshot/k2"]
    r = await _rejected(api, "POST", "/combos", 422, json={"name": "bad", "targets": ["gpt-x"]})
    assert "provider/model" in fields_of(r)["targets.0"]
    r = await _rejected(api, "POST", "/combos", 422, json={"name": "bad", "targets": ["nope/m"]})
    assert "nope" in fields_of(r)["targets.0.provider"]


async def test_every_public_strategy_can_be_created(api: Api) -> None:
    for i, strategy in enumerate(PUBLIC_STRATEGIES):
        body = {"name": f"s{i}", "strategy": strategy, "targets": NEW["targets"]}
        r = await api.request("POST", "/combos", json=body)
        assert r.status_code == 201, (strategy, r.text)
    assert len(api.gw.registry.combos) == len(PUBLIC_STRATEGIES) + 1


# -- the minted qtSd/ combos --------------------------------------------------------------------


async def test_internal_combos_are_listed_readable_and_read_only(api: Api) -> None:
    plain = [c["name"] for c in (await api.request("GET", "/combos")).json()]
    assert plain == ["seeded"]
    r = await api.request("GET", "/combos", params={"internal": "true"})
    assert r.status_code == 200
    listed = {c["name"]: c for c in r.json()}
    assert set(listed) == {"seeded", "qtSd/demo/gpt-x", "qtSd/demo/gpt-y"}
    x = listed["qtSd/demo/gpt-x"]
    assert x["internal"] is True
    assert x["pool"] == "demo"
    assert x["strategy"] == "quota-share"
    assert [(t["provider"], t["connection"], t["weight"]) for t in x["targets"]] == [
        ("mock", "mock-1", 2.0)
    ]
    assert x["createdMs"] is None
    r = await api.request("GET", "/combos/qtSd/demo/gpt-x")
    assert r.status_code == 200
    assert r.json() == x

    before, version = api.dump(), api.gw.registry.version
    r = await api.request("PUT", "/combos/qtSd/demo/gpt-x", json=NEW)
    assert r.status_code == 409
    assert "read-only" in error_of(r)["message"]
    r = await api.request("DELETE", "/combos/qtSd/demo/gpt-x")
    assert r.status_code == 409
    assert (await api.request("GET", "/combos/qtSd/demo/nope")).status_code == 404
    assert (await api.request("DELETE", "/combos/qtSd/demo/nope")).status_code == 404
    assert api.dump() == before
    assert api.gw.registry.version == version


async def test_internal_combos_follow_pool_changes(api: Api) -> None:
    r = await api.request("PATCH", "/quota/pools/demo", json={"connections": ["mock-1", "mock-2"]})
    assert r.status_code == 200, r.text
    r = await api.request("GET", "/combos/qtSd/demo/gpt-y")
    assert [t["connection"] for t in r.json()["targets"]] == ["mock-1", "mock-2"]
    r = await api.request("POST", "/quota/pools", json={"id": "kp", "connections": ["kimi-1"]})
    assert r.status_code == 201, r.text
    # kimi-1 lists no models: nothing to mint a combo for
    assert not any(n.startswith("qtSd/kp/") for n in api.gw.registry.internal_combos)
    r = await api.request("PATCH", "/connections/kimi-1", json={"models": ["k2"]})
    assert r.status_code == 200, r.text
    assert "qtSd/kp/k2" in api.gw.registry.internal_combos
    assert (await api.request("DELETE", "/quota/pools/demo")).status_code == 204
    r = await api.request("GET", "/combos", params={"internal": True})
    assert [c["name"] for c in r.json()] == ["seeded", "qtSd/kp/k2"]


# -- rejections ---------------------------------------------------------------------------------


async def _rejected(api: Api, method: str, url: str, status: int, **kw: Any) -> httpx.Response:
    before, version = api.dump(), api.gw.registry.version
    r = await api.request(method, url, **kw)
    assert r.status_code == status, r.text
    error_of(r)
    assert api.dump() == before
    assert api.gw.registry.version == version
    return r


async def test_unknown_strategy_is_422_naming_the_field(api: Api) -> None:
    r = await _rejected(api, "POST", "/combos", 422, json={**NEW, "strategy": "fastest"})
    message = fields_of(r)["strategy"]
    assert "unknown" in message
    assert "'fastest'" in message
    assert all(name in message for name in PUBLIC_STRATEGIES)
    r = await _rejected(api, "PUT", "/combos/seeded", 422, json={**NEW, "strategy": "fastest"})
    assert "strategy" in fields_of(r)


async def test_quota_share_and_qtsd_names_are_refused(api: Api) -> None:
    r = await _rejected(api, "POST", "/combos", 422, json={**NEW, "strategy": "quota-share"})
    assert "internal" in fields_of(r)["strategy"]
    r = await _rejected(api, "POST", "/combos", 422, json={**NEW, "name": "qtSd/demo/gpt-x"})
    assert "reserved" in fields_of(r)["name"]
    r = await _rejected(api, "POST", "/combos", 422, json={**NEW, "name": "a/b"})
    assert "name" in fields_of(r)


async def test_references_are_checked(api: Api) -> None:
    body = {
        **NEW,
        "targets": [
            {"provider": "openai", "model": "gpt-4o"},
            {"provider": "mock", "model": "gpt-x", "connection": "kimi-1"},
            {"provider": "mock", "model": "gpt-x", "connection": "ghost"},
        ],
    }
    r = await _rejected(api, "POST", "/combos", 422, json=body)
    fields = fields_of(r)
    assert set(fields) == {"targets.0.provider", "targets.1.connection", "targets.2.connection"}
    assert "openai" in fields["targets.0.provider"]
    r = await _rejected(
        api, "PUT", "/combos/seeded", 422, json={"targets": [{"provider": "nope", "model": "m"}]}
    )
    assert "targets.0.provider" in fields_of(r)
    judge = {**NEW, "config": {"judge": {"provider": "nope", "model": "m"}}}
    r = await _rejected(api, "POST", "/combos", 422, json=judge)
    assert "config.judge.provider" in fields_of(r)


async def test_other_rejections(api: Api) -> None:
    r = await _rejected(api, "POST", "/combos", 409, json={**NEW, "name": "seeded"})
    assert "already exists" in error_of(r)["message"]
    await _rejected(api, "GET", "/combos/ghost", 404)
    await _rejected(api, "PUT", "/combos/ghost", 404, json=NEW)
    await _rejected(api, "DELETE", "/combos/ghost", 404)
    r = await _rejected(api, "PUT", "/combos/seeded", 422, json={**NEW, "name": "other"})
    assert "name" in fields_of(r)
    r = await _rejected(api, "POST", "/combos", 422, json={**NEW, "targets": []})
    assert "targets" in fields_of(r)
    r = await _rejected(api, "POST", "/combos", 422, json={"name": "x"})
    assert "targets" in fields_of(r)
    duplicate = {**NEW, "targets": [NEW["targets"][0], NEW["targets"][0]]}
    r = await _rejected(api, "POST", "/combos", 422, json=duplicate)
    assert "duplicate target" in fields_of(r)["targets.1"]
    bad_options = {**NEW, "strategy": "auto", "config": {"options": {"exploration": 5}}}
    r = await _rejected(api, "POST", "/combos", 422, json=bad_options)
    assert "config.options" in fields_of(r)
    r = await _rejected(api, "POST", "/combos", 422, json={**NEW, "config": {"maxRetries": -1}})
    assert "config.maxRetries" in fields_of(r)
    r = await _rejected(api, "POST", "/combos", 422, json={**NEW, "extra": 1})
    assert "extra" in fields_of(r)
    await _rejected(
        api, "POST", "/combos", 400, content=b"{oops", headers={"content-type": "application/json"}
    )


async def test_openapi_documents_combos(api: Api) -> None:
    schema = (await api.request("GET", "/openapi.json")).json()
    paths = schema["paths"]
    assert set(paths["/combos"]) == {"get", "post"}
    (item,) = [p for p in paths if p.startswith("/combos/") and not p.endswith("/stats")]
    assert set(paths[item]) == {"get", "put", "delete"}
    assert set(paths["/combos/{name}/stats"]) == {"get"}
    components = schema["components"]["schemas"]
    assert {"ComboIn", "ComboOut", "ComboReplace", "ComboTargetSpec"} <= set(components)
    assert "priority" in components["ComboIn"]["properties"]["strategy"]["description"]
