"""Targets, combo config and combos (fairgate.routing.model) and name resolution (registry)."""

from __future__ import annotations

import pytest

from fairgate.domain.connections import Connection
from fairgate.routing.combo import Combo
from fairgate.routing.model import (
    GLOBAL_MAX_ATTEMPTS,
    ComboConfig,
    ShadowConfig,
    Target,
    expand_targets,
)
from fairgate.routing.registry import (
    PUBLIC_STRATEGIES,
    STRATEGIES,
    get_strategy,
    resolve_strategy,
)

A = Target("openai", "gpt-4o", "c1")
B = Target("anthropic", "claude-sonnet-4", "c2")


# -- targets ------------------------------------------------------------------------------------


def test_target_key_is_stable_and_includes_the_connection() -> None:
    assert A.key == "openai/gpt-4o@c1"
    assert Target("openai", "gpt-4o").key == "openai/gpt-4o"
    assert Target("openai", "gpt-4o", "c1", weight=3).key == A.key
    assert A.load_key == "c1"
    assert Target("openai", "gpt-4o").load_key == "openai/gpt-4o"


def test_target_parse_and_from_mapping() -> None:
    t = Target.parse("openrouter/meta-llama/llama-3", connection_id="c9", weight=2)
    assert (t.provider, t.model, t.connection_id, t.weight) == (
        "openrouter",
        "meta-llama/llama-3",
        "c9",
        2.0,
    )
    m = Target.from_mapping(
        {
            "model": "openai/gpt-4o-mini",
            "connectionId": "c1",
            "priceIn": 0.15,
            "priceOut": 0.6,
            "contextWindow": 128_000,
            "tier": 1,
            "tags": ["code"],
        }
    )
    assert m == Target(
        "openai",
        "gpt-4o-mini",
        "c1",
        price_in=0.15,
        price_out=0.6,
        context_window=128_000,
        tier=1,
        tags=frozenset({"code"}),
    )
    assert Target.from_mapping("openai/*").is_wildcard


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"provider": "openai", "model": "gpt-4o", "wieght": 2}, "unknown target field"),
        ({"model": "gpt-4o"}, "needs a provider"),
        ({"provider": "openai", "model": "gpt-4o", "price_in": -1}, "price_in"),
        ({"provider": "openai", "model": "gpt-4o", "tier": 1.5}, "integer"),
        ({"provider": "openai", "model": "gpt-4o", "weight": True}, "number"),
        ({"provider": "openai", "model": "gpt-4o", "context_window": 0}, "context_window"),
    ],
)
def test_bad_targets_are_rejected(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Target.from_mapping(data)


# -- combo config -------------------------------------------------------------------------------


def test_config_defaults_match_the_spec() -> None:
    c = ComboConfig()
    assert (c.max_retries, c.retry_delay_ms, c.fallback_delay_ms, c.timeout_ms) == (1, 0, 0, None)
    assert c.quality_validation is True
    assert c.shadow == ShadowConfig()
    assert c.attempt_cap(3) == 6
    assert ComboConfig(max_attempts=4).attempt_cap(3) == 4
    assert ComboConfig(max_retries=5).attempt_cap(50) == GLOBAL_MAX_ATTEMPTS


def test_config_cascade_later_layers_win_and_options_merge() -> None:
    defaults = {"maxRetries": 1, "options": {"exploration": 0.05}}
    global_settings = {"retryDelayMs": 200, "timeoutMs": 30_000}
    per_provider = {"maxRetries": 3, "options": {"budgetUsd": 0.01}}
    combo = {"timeoutMs": 10_000, "shadow": {"targets": ["openai/gpt-4o"], "sampleRate": 0.1}}
    c = ComboConfig.from_layers(defaults, global_settings, None, per_provider, combo)
    assert c.max_retries == 3
    assert c.retry_delay_ms == 200
    assert c.timeout_ms == 10_000
    assert dict(c.options) == {"exploration": 0.05, "budget_usd": 0.01}
    assert c.shadow.targets == (Target("openai", "gpt-4o"),)
    assert c.shadow.sample_rate == 0.1


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"maxRetry": 2}, "unknown combo config field 'maxRetry'"),
        ({"maxRetries": -1}, "maxRetries must be ≥ 0"),
        ({"timeoutMs": 0}, "timeoutMs"),
        ({"qualityValidation": "yes"}, "true or false"),
        ({"shadow": {"sampleRate": 2}}, "sample_rate"),
    ],
)
def test_bad_config_is_rejected(layer: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ComboConfig.from_layers(layer)


def test_config_options_are_read_only_and_snake_case() -> None:
    c = ComboConfig(options={"stickyLimit": 2})
    assert dict(c.options) == {"sticky_limit": 2}
    with pytest.raises(TypeError):
        c.options["x"] = 1  # type: ignore[index]


# -- combos and strategy names ------------------------------------------------------------------


def test_the_nineteen_public_strategies_are_registered() -> None:
    assert len(PUBLIC_STRATEGIES) == 19
    assert set(PUBLIC_STRATEGIES) == set(STRATEGIES)
    assert "quota-share" not in PUBLIC_STRATEGIES
    for name in PUBLIC_STRATEGIES:
        assert Combo("c", name, (A, B)).strategy == name
        assert callable(get_strategy(name))


def test_unknown_strategy_is_rejected_with_the_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown routing strategy 'fastest'") as err:
        Combo("c", "fastest", (A,))
    for name in PUBLIC_STRATEGIES:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="unknown routing strategy"):
        get_strategy("fastest")


def test_quota_share_is_not_user_selectable() -> None:
    with pytest.raises(ValueError, match="internal"):
        Combo("mine", "quota-share", (A,))
    with pytest.raises(ValueError, match="reserved"):
        Combo("qtSd/pool/gpt-4o", "priority", (A,))
    internal = Combo("qtSd/pool/gpt-4o", "quota-share", (A,), internal=True)
    assert internal.strategy == "quota-share"
    with pytest.raises(ValueError, match="select_quota_share"):
        get_strategy("quota-share")


def test_names_are_normalised_and_aliases_imply_options() -> None:
    assert Combo("c", " Round_Robin ", (A,)).strategy == "round-robin"
    sticky = Combo("c", "weighted-sticky", (A, B))
    assert sticky.strategy == "weighted"
    assert sticky.config.options["sticky"] is True
    assert resolve_strategy("round-robin-sticky") == ("round-robin", {"sticky": True})


def test_combo_validation() -> None:
    with pytest.raises(ValueError, match="no targets"):
        Combo("c", "priority", ())
    with pytest.raises(ValueError, match="twice"):
        Combo("c", "priority", (A, Target("openai", "gpt-4o", "c1", weight=5)))
    with pytest.raises(ValueError, match="unknown auto factor 'speed'"):
        Combo("c", "auto", (A,), ComboConfig(options={"weights": {"speed": 1}}))
    with pytest.raises(ValueError, match="must not all be zero"):
        Combo("c", "auto", (A,), ComboConfig(options={"weights": dict.fromkeys(_factors(), 0)}))
    with pytest.raises(ValueError, match="exploration"):
        Combo("c", "auto", (A,), ComboConfig(options={"exploration": 1.5}))
    with pytest.raises(ValueError, match="step_prompts"):
        Combo("c", "pipeline", (A,), ComboConfig(options={"step_prompts": ["a", "b"]}))
    with pytest.raises(ValueError, match="sticky_limit"):
        Combo("c", "round-robin", (A,), ComboConfig(options={"sticky_limit": 0}))


def _factors() -> tuple[str, ...]:
    from fairgate.routing.strategies.auto import FACTORS

    return FACTORS


def test_combo_from_mapping_applies_the_layers_below_it() -> None:
    combo = Combo.from_mapping(
        {
            "name": "fast",
            "strategy": "cost-optimized",
            "models": [{"provider": "openai", "model": "gpt-4o", "priceIn": 2.5}, "mock/echo"],
            "config": {"maxRetries": 0},
        },
        {"maxRetries": 2, "fallbackDelayMs": 50},
    )
    assert combo.name == "fast"
    assert [t.key for t in combo.targets] == ["openai/gpt-4o", "mock/echo"]
    assert combo.config.max_retries == 0
    assert combo.config.fallback_delay_ms == 50


# -- wildcards ----------------------------------------------------------------------------------


def _conn(cid: str, provider: str = "openai", models: tuple[str, ...] = ()) -> Connection:
    return Connection(id=cid, provider=provider, base_url="http://x", secret="s", models=models)


def test_wildcards_expand_to_the_providers_connections() -> None:
    by_provider = {
        "openai": (
            _conn("o1", models=("*",)),
            _conn("o2", models=("gpt-4o", "gpt-4o-mini")),
            _conn("o3", models=("o3",)),
        ),
        "mock": (_conn("m1", "mock", ("echo",)),),
    }
    targets = [
        Target("openai", "gpt-4o", "*", weight=2, price_in=1.0),
        Target("mock", "*"),
        Target("openai", "gpt-4o", "o1"),  # already produced by the wildcard: dropped
        Target("anthropic", "claude", "*"),  # no connections: nothing
    ]
    out = expand_targets(targets, by_provider)
    assert [t.key for t in out] == [
        "openai/gpt-4o@o1",
        "openai/gpt-4o@o2",
        "mock/echo@m1",
    ]
    assert all(t.weight == 2 and t.price_in == 1.0 for t in out[:2])
    models_of_o2 = expand_targets([Target("openai", "*", "o2")], by_provider)
    assert [t.key for t in models_of_o2] == ["openai/gpt-4o@o2", "openai/gpt-4o-mini@o2"]
