"""The ``combos:`` section of the config file: valid combos load, every problem names its field.

The file is validated by the same models as the admin API and checked against the routing
layer, so a combo that loads here is one the gateway can route: unknown strategies,
``quota-share``, ``qtSd/`` names and targets of providers the file does not configure are refused
with a message that says which field and why.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from config_support import set_at

from fairgate.config import ComboSpec, ConfigError, InvalidCombo, load_config_text, parse_config
from fairgate.routing.model import Target
from fairgate.routing.registry import PUBLIC_STRATEGIES


def _base() -> dict[str, Any]:
    return {
        "connections": [
            {"id": "c1", "provider": "mock", "base_url": "http://x/v1", "models": ["a", "b"]},
            {"id": "c2", "provider": "mock", "base_url": "http://x/v1", "models": ["*"]},
            {"id": "k1", "provider": "kimi", "base_url": "https://api.kimi/v1", "models": ["*"]},
        ],
        "combos": [
            {
                "name": "fast",
                "strategy": "priority",
                "targets": [
                    {"provider": "mock", "model": "a", "connection": "c1"},
                    {"provider": "kimi", "model": "k2"},
                ],
            }
        ],
    }


def problems_of(data: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, env or {})
    return dict(info.value.problems)


# -- valid combos -------------------------------------------------------------------------------

YAML = """
connections:
  - {id: c1, provider: mock, base_url: "http://x/v1", models: [a, b], weight: 2}
  - {id: k1, provider: kimi, base_url: "https://api.kimi/v1", models: "*"}
combos:
  - name: fast
    strategy: Weighted_Sticky
    targets:
      - {provider: "${PROVIDER}", model: a, connection: c1, weight: 3, price_in: 1.5,
         priceOut: 2, tier: 1, context_window: 128000, tags: [code]}
      - {provider: kimi, model: "*"}
      - {provider: mock, model: b, connection: "*"}
    config:
      maxRetries: 2
      retry_delay_ms: 10
      fallbackDelayMs: 5
      timeoutMs: 30000
      qualityValidation: false
      judge: {provider: kimi, model: k2}
      shadow: {targets: [{provider: kimi, model: k2-shadow}], sampleRate: 0.25}
      options: {stickyLimit: 3}
  - {name: default-ish, targets: [{provider: mock, model: a}]}
"""


def test_a_valid_combos_section_loads_and_builds() -> None:
    cfg = load_config_text(YAML, {"PROVIDER": "mock"})
    fast, plain = cfg.combos
    assert fast.strategy == "weighted-sticky"  # canonical spelling, alias kept
    assert fast.targets[0].provider == "mock"  # ${ENV} expanded inside combos too
    combo = fast.to_combo()
    assert combo.name == "fast"
    assert combo.strategy == "weighted"
    assert combo.config.options == {"sticky": True, "sticky_limit": 3}
    assert [t.key for t in combo.targets] == ["mock/a@c1", "kimi/*", "mock/b@*"]
    first = combo.targets[0]
    assert first == Target(
        provider="mock",
        model="a",
        connection_id="c1",
        weight=3,
        price_in=1.5,
        price_out=2,
        tier=1,
        context_window=128_000,
        tags=frozenset({"code"}),
    )
    assert combo.config.max_retries == 2
    assert combo.config.retry_delay_ms == 10
    assert combo.config.fallback_delay_ms == 5
    assert combo.config.timeout_ms == 30_000
    assert combo.config.quality_validation is False
    assert combo.config.judge is not None
    assert combo.config.judge.key == "kimi/k2"
    assert combo.config.shadow.sample_rate == 0.25
    assert [t.key for t in combo.config.shadow.targets] == ["kimi/k2-shadow"]
    # the combo sets only what it names: the rest stays at the defaults (the cascade)
    default = plain.to_combo()
    assert default.strategy == "priority"
    assert default.config.max_retries == 1
    assert plain.config.layer() == {}
    assert set(fast.config.layer()) == {
        "maxRetries",
        "retryDelayMs",
        "fallbackDelayMs",
        "timeoutMs",
        "qualityValidation",
        "judge",
        "shadow",
        "options",
    }


def test_layers_below_the_combo_apply_where_it_sets_nothing() -> None:
    spec = ComboSpec.model_validate(
        {"name": "x", "targets": [{"provider": "mock", "model": "a"}], "config": {"maxRetries": 0}}
    )
    combo = spec.to_combo({"maxRetries": 3, "retryDelayMs": 7})
    assert combo.config.max_retries == 0  # the combo's own value wins
    assert combo.config.retry_delay_ms == 7  # inherited


@pytest.mark.parametrize("strategy", PUBLIC_STRATEGIES)
def test_every_public_strategy_is_accepted(strategy: str) -> None:
    data = _base()
    data["combos"][0]["strategy"] = strategy
    cfg = parse_config(data, {})
    assert cfg.combos[0].to_combo().strategy == strategy


def test_provider_model_strings_are_targets() -> None:
    """A LiteLLM or OmniRoute user writes ``openai/gpt-4o``: the string means the mapping, split
    at the first ``/`` (a provider id has none, a model may), in targets, judge and shadows."""
    data = _base()
    data["connections"].append(
        {"id": "or-1", "provider": "openrouter", "base_url": "https://or/v1", "models": "*"}
    )
    data["combos"][0]["targets"] = ["mock/a", {"provider": "kimi", "model": "k2"}, "openrouter/m/x"]
    data["combos"][0]["config"] = {"judge": "kimi/k2", "shadow": {"targets": ["mock/b"]}}
    (combo,) = parse_config(data, {}).combos
    as_mappings = [(t.provider, t.model, t.connection) for t in combo.targets]
    assert as_mappings == [("mock", "a", None), ("kimi", "k2", None), ("openrouter", "m/x", None)]
    assert combo.config.judge is not None
    assert (combo.config.judge.provider, combo.config.judge.model) == ("kimi", "k2")
    assert combo.config.shadow is not None
    assert combo.config.shadow.targets[0].model == "b"
    assert [t.key for t in combo.to_combo().targets] == ["mock/a", "kimi/k2", "openrouter/m/x"]


@pytest.mark.parametrize("ref", ["gpt-4o", "/gpt-4o", "openai/", " ", "open ai/gpt-4o"])
def test_a_target_string_that_is_not_provider_model_names_its_field(ref: str) -> None:
    data = _base()
    data["combos"][0]["targets"][1] = ref
    problems = problems_of(data)
    field = next(f for f in problems if f.startswith("combos.0.targets.1"))
    assert "provider" in f"{field}: {problems[field]}", problems  # the field or the message


def test_a_target_string_of_a_provider_without_connection_is_refused() -> None:
    data = _base()
    data["combos"][0]["targets"][1] = "openai/gpt-4o"
    assert "no connection of provider 'openai'" in problems_of(data)["combos.0.targets.1.provider"]


def test_no_combos_is_fine() -> None:
    data = _base()
    del data["combos"]
    assert parse_config(data, {}).combos == []


# -- every problem names its field -------------------------------------------------------------


def _add_combo(combo: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def mutate(data: dict[str, Any]) -> None:
        data["combos"].append(combo)

    return mutate


T0 = "combos.0.targets.0"
CASES: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("unknown strategy", set_at("combos.0.strategy", "fastest"), "combos.0.strategy", "unknown"),
    (
        "quota-share is internal",
        set_at("combos.0.strategy", "quota-share"),
        "combos.0.strategy",
        "internal",
    ),
    ("qtSd name", set_at("combos.0.name", "qtSd/pool/a"), "combos.0.name", "reserved"),
    ("bad name", set_at("combos.0.name", "my combo"), "combos.0.name", "1-64 characters"),
    ("no name", _add_combo({"targets": [{"provider": "mock", "model": "a"}]}), "combos.1.name", ""),
    ("no targets", set_at("combos.0.targets", []), "combos.0.targets", "at least 1"),
    (
        "duplicate name",
        _add_combo({"name": "fast", "targets": [{"provider": "mock", "model": "b"}]}),
        "combos.1.name",
        "duplicate combo name 'fast'",
    ),
    (
        "provider without connection",
        set_at("combos.0.targets.1.provider", "openai"),
        "combos.0.targets.1.provider",
        "no connection of provider 'openai'",
    ),
    (
        "wildcard of a provider without connection",
        set_at("combos.0.targets.0", {"provider": "openai", "model": "*"}),
        f"{T0}.provider",
        "openai",
    ),
    (
        "unknown connection",
        set_at(f"{T0}.connection", "c9"),
        f"{T0}.connection",
        "unknown connection 'c9'",
    ),
    (
        "connection of another provider",
        set_at(f"{T0}.connection", "k1"),
        f"{T0}.connection",
        "provider 'kimi'",
    ),
    (
        "duplicate target",
        set_at("combos.0.targets.1", {"provider": "mock", "model": "a", "connection": "c1"}),
        "combos.0.targets.1",
        "duplicate target 'mock/a@c1'",
    ),
    (
        "negative price",
        set_at(f"{T0}.price_in", -1),
        f"{T0}.price_in",
        "greater than or equal to 0",
    ),
    ("camelCase key named as written", set_at(f"{T0}.priceOut", -1), f"{T0}.priceOut", ""),
    ("bad weight", set_at(f"{T0}.weight", 1000), f"{T0}.weight", ""),
    ("bad context window", set_at(f"{T0}.context_window", 0), f"{T0}.context_window", ""),
    ("unknown target field", set_at(f"{T0}.bogus", 1), f"{T0}.bogus", "Extra inputs"),
    ("provider with a slash", set_at(f"{T0}.provider", "a/b"), f"{T0}.provider", ""),
    (
        "unknown config field",
        set_at("combos.0.config", {"maxRetry": 2}),
        "combos.0.config.maxRetry",
        "",
    ),
    (
        "negative retries",
        set_at("combos.0.config", {"maxRetries": -1}),
        "combos.0.config.maxRetries",
        "greater than or equal to 0",
    ),
    (
        "bad strategy option",
        set_at("combos.0.config", {"options": {"exploration": 3}}),
        "combos.0.config.options",
        "exploration",
    ),
    (
        "judge of a provider without connection",
        set_at("combos.0.config", {"judge": {"provider": "nope", "model": "m"}}),
        "combos.0.config.judge.provider",
        "nope",
    ),
    (
        "shadow target of a provider without connection",
        set_at("combos.0.config", {"shadow": {"targets": [{"provider": "nope", "model": "m"}]}}),
        "combos.0.config.shadow.targets.0.provider",
        "nope",
    ),
    (
        "shadow sample rate above 1",
        set_at("combos.0.config", {"shadow": {"sampleRate": 2}}),
        "combos.0.config.shadow.sampleRate",
        "",
    ),
    ("missing env var", set_at(f"{T0}.model", "${NOPE}"), f"{T0}.model", "NOPE is not set"),
    ("combo not a mapping", set_at("combos.0", "mock/a"), "combos.0", ""),
]


@pytest.mark.parametrize(
    ("mutate", "field", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_every_combo_error_names_its_field(
    mutate: Callable[[dict[str, Any]], None], field: str, needle: str
) -> None:
    data = _base()
    parse_config(copy.deepcopy(data), {})  # the base itself is valid
    mutate(data)
    problems = problems_of(data)
    assert field in problems, problems
    assert needle in problems[field], problems[field]


def test_unknown_strategy_lists_the_valid_ones() -> None:
    data = _base()
    data["combos"][0]["strategy"] = "fastest"
    message = problems_of(data)["combos.0.strategy"]
    assert "'fastest'" in message
    for name in PUBLIC_STRATEGIES:
        assert name in message
    assert "quota-share" not in message.split(";")[1]


def test_all_combo_problems_are_reported_at_once() -> None:
    data = _base()
    data["combos"][0]["targets"] = [
        {"provider": "openai", "model": "a"},
        {"provider": "mock", "model": "a", "connection": "k1"},
    ]
    data["combos"].append({"name": "fast", "targets": [{"provider": "zz", "model": "m"}]})
    problems = problems_of(data)
    assert set(problems) == {
        "combos.0.targets.0.provider",
        "combos.0.targets.1.connection",
        "combos.1.name",
        "combos.1.targets.0.provider",
    }


def test_to_combo_names_the_routing_layers_problems() -> None:
    """What only the routing layer knows (step_prompts vs the number of steps) is named too."""
    spec = ComboSpec.model_validate(
        {
            "name": "chain",
            "strategy": "pipeline",
            "targets": [{"provider": "mock", "model": "a"}],
            "config": {"options": {"stepPrompts": ["one", "two"]}},
        }
    )
    with pytest.raises(InvalidCombo) as info:
        spec.to_combo()
    assert [f for f, _ in info.value.problems] == ["config.options"]
    assert "step_prompts" in str(info.value)
