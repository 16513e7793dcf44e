"""The YAML config file: a valid file loads, ``${VAR}`` expands, every problem names its field."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from config_support import set_at

from fairgate.config import (
    ID_PATTERN,
    Config,
    ConfigError,
    load_config,
    load_config_text,
    parse_config,
    redact_url,
)
from fairgate.domain.units import Unit, Window
from fairgate.quota.model import Policy, ShareMode

EXAMPLE = """
server: {port: 20128, host: 127.0.0.1, max_body_bytes: 10485760, default_provider: null,
         upstream_timeout_s: 600, default_max_tokens: 1024}
connections:
  - {id: mock-1, provider: mock, base_url: "http://127.0.0.1:9999/v1", secret: "${MOCK_KEY}",
     auth_type: apikey, weight: 1, max_concurrent: null, models: "*", protocol: null, enabled: true}
keys:
  - {id: alice, name: Alice, secret: "${ALICE_KEY}", allowed_models: []}
  - {id: bob, name: Bob, key_hash: "%s"}
plans:
  mock-1: [{unit: requests, window: hourly, limit: 100}]
pools:
  - id: demo
    name: Demo pool
    connections: [mock-1]
    share_mode: static
    active_window_s: 900
    dimensions: []
    allocations:
      - {key: alice, weight: 50, policy: hard, cap_value: null, cap_unit: null,
         model_caps: [{model: gpt-x, unit: requests, limit: 5}]}
      - {key: bob, weight: 30, policy: soft, cap_value: 1000, cap_unit: tokens}
prices: {"some-model": {input: 1.0, output: 2.0, cached_input: 0.5}}
combos: []
""" % ("ab" * 32)

ENV = {"MOCK_KEY": "upstream-secret", "ALICE_KEY": "fg-alice-0123456789"}


def _base() -> dict[str, Any]:
    """A small valid config as a parsed YAML tree, for mutation tests."""
    return {
        "connections": [
            {
                "id": "c1",
                "provider": "mock",
                "base_url": "http://x/v1",
                "secret": "s",
                "models": ["*"],
            },
            {"id": "c2", "provider": "mock", "base_url": "http://x/v1", "models": ["*"]},
            {"id": "k1", "provider": "kimi", "base_url": "https://api.kimi/v1", "models": ["*"]},
        ],
        "keys": [
            {"id": "alice", "secret": "fg-alice-secret"},
            {"id": "bob", "secret": "fg-bob-secret"},
        ],
        "plans": {"c1": [{"unit": "requests", "window": "hourly", "limit": 10}]},
        "pools": [
            {
                "id": "p1",
                "connections": ["c1"],
                "allocations": [{"key": "alice", "weight": 50}],
            }
        ],
    }


def _problems(data: object, env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, env or {})
    return info.value.problems


def test_example_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "fairgate.yaml"
    path.write_text(EXAMPLE, encoding="utf-8")
    cfg = load_config(path, ENV)
    assert cfg.server.port == 20128
    assert cfg.server.default_provider is None
    conn = cfg.connections[0]
    assert (conn.id, conn.provider, conn.secret) == ("mock-1", "mock", "upstream-secret")
    assert cfg.keys[0].secret == "fg-alice-0123456789"
    assert cfg.keys[1].key_hash == "ab" * 32
    assert cfg.plans["mock-1"][0].unit is Unit.REQUESTS
    pool = cfg.pools[0]
    assert pool.share_mode is ShareMode.STATIC
    assert pool.allocations[0].policy is Policy.HARD
    assert pool.allocations[0].model_caps[0].limit == 5
    assert pool.allocations[1].cap_unit is Unit.TOKENS
    assert cfg.prices["some-model"].cached_input == 0.5
    assert cfg.combos == []


def test_default_is_empty() -> None:
    cfg = Config.default()
    assert cfg.connections == []
    assert cfg.keys == []
    assert cfg.pools == []
    assert cfg.plans == {}
    assert cfg.server.port == 20128
    assert cfg.server.default_max_tokens == 1024
    assert load_config_text("", {}) == cfg


def test_env_expansion_forms() -> None:
    text = """
connections:
  - id: c1
    provider: mock
    base_url: "http://${HOST:-127.0.0.1}:${PORT}/v1"
    secret: "${EMPTY:-fallback}"
    models: ["$${LITERAL}", "${MODEL}"]
"""
    cfg = load_config_text(text, {"PORT": "9999", "EMPTY": "", "MODEL": "gpt-x"})
    conn = cfg.connections[0]
    assert conn.base_url == "http://127.0.0.1:9999/v1"
    assert conn.secret == "fallback"
    assert conn.models == ["${LITERAL}", "gpt-x"]


def _one_connection(conn_id: str, provider: str, secret: str, models: object) -> dict[str, Any]:
    """A configuration of one connection whose secret is written ``secret`` (an env reference,
    the point of the tests that use it)."""
    conn = {"id": conn_id, "provider": provider, "base_url": "http://x", "secret": secret}
    return {"connections": [{**conn, "models": models}]}


def test_missing_env_var_names_the_field() -> None:
    problems = _problems(_one_connection("c1", "mock", "${NOPE}", ["*"]))
    assert problems == [("connections.0.secret", "environment variable NOPE is not set")]


def test_set_but_empty_variable_is_not_missing() -> None:
    cfg = parse_config(_one_connection("c", "m", "${E}", "*"), {"E": ""})
    assert cfg.connections[0].secret == ""


def test_env_expansion_never_touches_mapping_keys() -> None:
    problems = _problems({"plans": {"${X}": []}}, {"X": "c1"})
    assert [p for p, _ in problems] == ["plans.${X}"]


ALLOC = "pools.0.allocations.0"

CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("bad unit", set_at("plans.c1.0.unit", "bytes"), "plans.c1.0.unit"),
    ("bad window", set_at("plans.c1.0.window", "yearly"), "plans.c1.0.window"),
    ("negative limit", set_at("plans.c1.0.limit", -1), "plans.c1.0.limit"),
    ("bad policy", set_at(f"{ALLOC}.policy", "lenient"), f"{ALLOC}.policy"),
    ("weight over 100", set_at(f"{ALLOC}.weight", 101), f"{ALLOC}.weight"),
    ("negative weight", set_at(f"{ALLOC}.weight", -1), f"{ALLOC}.weight"),
    ("weight not a number", set_at(f"{ALLOC}.weight", "half"), f"{ALLOC}.weight"),
    ("cap_value zero", set_at(f"{ALLOC}.cap_value", 0), f"{ALLOC}.cap_value"),
    ("cap_value without unit", set_at(f"{ALLOC}.cap_value", 10), ALLOC),
    ("cap_unit without value", set_at(f"{ALLOC}.cap_unit", "tokens"), ALLOC),
    ("bad cap unit", set_at(f"{ALLOC}.cap_unit", "bytes"), f"{ALLOC}.cap_unit"),
    (
        "bad model cap",
        set_at(f"{ALLOC}.model_caps", [{"model": "m", "unit": "requests", "limit": -5}]),
        f"{ALLOC}.model_caps.0.limit",
    ),
    ("unknown key", set_at(f"{ALLOC}.key", "carol"), f"{ALLOC}.key"),
    (
        "unknown pool connection",
        set_at("pools.0.connections", ["c1", "zz"]),
        "pools.0.connections.1",
    ),
    ("mixed providers", set_at("pools.0.connections", ["c1", "k1"]), "pools.0.connections"),
    ("no pool connection", set_at("pools.0.connections", []), "pools.0.connections"),
    ("duplicate member", set_at("pools.0.connections", ["c1", "c1"]), "pools.0.connections"),
    ("bad share mode", set_at("pools.0.share_mode", "greedy"), "pools.0.share_mode"),
    ("zero active window", set_at("pools.0.active_window_s", 0), "pools.0.active_window_s"),
    (
        "duplicate allocation",
        set_at("pools.0.allocations", [{"key": "alice"}, {"key": "alice"}]),
        "pools.0.allocations",
    ),
    (
        "duplicate dimension",
        set_at(
            "pools.0.dimensions",
            [{"unit": "requests", "window": "hourly", "limit": 1}] * 2,
        ),
        "pools.0.dimensions",
    ),
    ("duplicate connection id", set_at("connections.1.id", "c1"), "connections.1.id"),
    ("duplicate key id", set_at("keys.1.id", "alice"), "keys.1.id"),
    ("bad base url", set_at("connections.0.base_url", "ftp://x"), "connections.0.base_url"),
    (
        "password in base url",
        set_at("connections.0.base_url", "https://user:hunter2@api.example/v1"),
        "connections.0.base_url",
    ),
    ("no models", set_at("connections.0.models", None), "connections.0.models"),
    ("empty models", set_at("connections.0.models", []), "connections.0.models"),
    ("duplicate model", set_at("connections.0.models", ["a", "a"]), "connections.0.models"),
    (
        "credential header forwarded",
        set_at("connections.0.forward_headers", ["openai-organization", "Authorization"]),
        "connections.0.forward_headers",
    ),
    (
        "bad header name",
        set_at("connections.0.forward_headers", ["a b"]),
        "connections.0.forward_headers.0",
    ),
    (
        "unknown allowed connection",
        set_at("keys.0.allowed_connections", ["c1", "zz"]),
        "keys.0.allowed_connections.1",
    ),
    (
        "bad require_allocation",
        set_at("server", {"require_allocation": "maybe"}),
        "server.require_allocation",
    ),
    ("bad config mode", set_at("server", {"config_mode": "gitops"}), "server.config_mode"),
    ("bad auth type", set_at("connections.0.auth_type", "basic"), "connections.0.auth_type"),
    ("bad protocol", set_at("connections.0.protocol", "grpc"), "connections.0.protocol"),
    ("connection weight", set_at("connections.0.weight", 500), "connections.0.weight"),
    (
        "negative max_concurrent",
        set_at("connections.0.max_concurrent", -1),
        "connections.0.max_concurrent",
    ),
    ("unknown field", set_at("connections.0.secrte", "x"), "connections.0.secrte"),
    ("bad key id", set_at("keys.0.id", "al ice"), "keys.0.id"),
    ("bad key hash", set_at("keys.1", {"id": "bob", "key_hash": "xyz"}), "keys.1.key_hash"),
    (
        "key with both",
        set_at("keys.1", {"id": "bob", "secret": "s" * 9, "key_hash": "a" * 64}),
        "keys.1",
    ),
    ("key with neither", set_at("keys.1", {"id": "bob"}), "keys.1"),
    ("short key secret", set_at("keys.1", {"id": "bob", "secret": "abc"}), "keys.1.secret"),
    ("same secret twice", set_at("keys.1.secret", "fg-alice-secret"), "keys.1"),
    ("unknown plan connection", set_at("plans.zz", []), "plans.zz"),
    ("bad server port", set_at("server", {"port": 0}), "server.port"),
    ("unknown section", set_at("extras", {}), "extras"),
    ("negative price", set_at("prices", {"m": {"input": -1}}), "prices.m.input"),
    ("combos not a list", set_at("combos", {"a": 1}), "combos"),
]


@pytest.mark.parametrize(("mutate", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_error_names_its_field(mutate: Callable[[dict[str, Any]], None], field: str) -> None:
    data = _base()
    parse_config(copy.deepcopy(data), {})  # the base itself is valid
    mutate(data)
    paths = [p for p, _ in _problems(data)]
    assert field in paths, paths


def test_connection_in_two_pools_is_rejected() -> None:
    data = _base()
    data["pools"].append({"id": "p2", "connections": ["c1"]})
    problems = _problems(data)
    assert problems == [("pools.1.connections.0", "connection 'c1' already belongs to pool 'p1'")]


def test_duplicate_pool_id_is_rejected() -> None:
    data = _base()
    data["pools"].append({"id": "p1", "connections": ["c2"]})
    assert ("pools.1.id", "duplicate id 'p1'") in _problems(data)


def test_all_problems_reported_at_once_and_str_lists_them() -> None:
    data = _base()
    data["pools"][0]["allocations"][0]["weight"] = 200
    data["connections"][0]["base_url"] = "${MISSING_URL}"
    with pytest.raises(ConfigError) as info:
        parse_config(data, {})
    text = str(info.value)
    lines = text.splitlines()
    assert "connections.0.base_url: environment variable MISSING_URL is not set" in lines
    assert any(line.startswith("pools.0.allocations.0.weight: ") for line in lines)
    assert all(re.match(r"^[\w.\-]+: ", line) for line in lines)


def test_errors_never_echo_the_rejected_value() -> None:
    data = _base()
    data["keys"][1] = {"id": "bob", "secret": "s3cr", "key_hash": "nothex-supersecret"}
    text = str(_problems_error(data))
    assert "supersecret" not in text
    assert "s3cr" not in text


def _problems_error(data: object) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(data, {})
    return info.value


VALID_IDS = ["a", "A1", "mock-1", "my_pool.v2", "9lives", "x" * 64]
INVALID_IDS = ["", "-a", "_a", ".a", "a:b", "a{b", "a}b", "a b", "a/b", "x" * 65, "é"]


@pytest.mark.parametrize("ident", VALID_IDS)
def test_valid_ids(ident: str) -> None:
    assert re.match(ID_PATTERN, ident)
    data = _base()
    data["pools"][0]["id"] = ident
    parse_config(data, {})


@pytest.mark.parametrize("ident", INVALID_IDS)
@pytest.mark.parametrize("where", ["connections.0.id", "keys.0.id", "pools.0.id"])
def test_invalid_ids(ident: str, where: str) -> None:
    data = _base()
    set_at(where, ident)(data)
    problems = dict(_problems(data))
    assert where in problems
    assert "letters, digits" in problems[where]


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", {})
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [\n  {id: x\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"malformed YAML at line \d+"):
        load_config(bad, {})
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="top level must be a mapping") as info:
        load_config(listy, {})
    assert info.value.source == str(listy)


def test_windows_and_units_cover_the_enums() -> None:
    for unit in Unit:
        for window in Window:
            data = _base()
            data["plans"]["c1"] = [{"unit": unit.value, "window": window.value, "limit": 1}]
            assert parse_config(data, {}).plans["c1"][0].window is window


def test_connection_models_star_and_forward_headers() -> None:
    data = _base()
    data["connections"][0]["models"] = "*"
    data["connections"][1]["models"] = ["a", "*"]
    data["connections"][0]["forward_headers"] = ["OpenAI-Organization", "anthropic-beta"]
    data["connections"][0]["base_url"] = "https://user@api.example/v1"  # a user alone is fine
    data["keys"][0]["allowed_connections"] = ["k1"]
    data["keys"][0]["allowed_providers"] = ["kimi"]
    data["server"] = {"require_allocation": False}
    cfg = parse_config(data, {})
    assert cfg.connections[0].models == ["*"]
    assert cfg.connections[1].models == ["a", "*"]
    assert cfg.connections[0].forward_headers == ["openai-organization", "anthropic-beta"]
    assert cfg.keys[0].allowed_connections == ["k1"]
    assert cfg.server.require_allocation is False
    assert parse_config(_base(), {}).server.require_allocation is None


def test_redact_url() -> None:
    assert redact_url("https://u:pw@h:8/v1?a=b@c") == "https://u:***@h:8/v1?a=b@c"
    assert redact_url("https://u@h/v1") == "https://u@h/v1"
    assert redact_url("http://h/v1@x") == "http://h/v1@x"


def test_a_password_in_a_url_is_never_echoed_in_the_error() -> None:
    data = _base()
    data["connections"][0]["base_url"] = "http://u:pa55-w0rd-x@h/v1"
    with pytest.raises(ConfigError) as info:
        parse_config(data, {})
    assert "pa55-w0rd-x" not in str(info.value)
    assert "connections.0.base_url" in str(info.value)
