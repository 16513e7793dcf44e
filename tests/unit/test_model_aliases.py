"""Model aliases (issue 42, item 8): a requested name or pattern maps to a target, in its own
step before the usual resolution; names a connection or combo serves are never aliased."""

from __future__ import annotations

import re

import pytest

from fairgate.domain.connections import Connection
from fairgate.routing.aliases import ModelAlias, ModelAliases, parse_aliases
from fairgate.snapshot import Registry


def _registry(*aliases: tuple[str, str]) -> Registry:
    conn = Connection(
        id="c1", provider="mock", base_url="http://x/v1", secret="s", models=("gpt-4o-mini",)
    )
    return Registry.build(
        [conn], [], [], aliases=ModelAliases.of(ModelAlias(p, t) for p, t in aliases)
    )


def test_exact_names_win_then_patterns_in_order() -> None:
    reg = _registry(
        ("gpt-*", "gpt-4o-mini"),
        ("gpt-5*", "never-reached"),
        ("gpt-5.5", "exact-one"),
        ("claude-*-5-5", "claude-sonnet-4"),
    )
    assert reg.alias_target("gpt-5.5") == "exact-one"
    assert reg.alias_target("gpt-6.2-sol") == "gpt-4o-mini"
    assert reg.alias_target("gpt-5-codex") == "gpt-4o-mini"
    assert reg.alias_target("claude-opus-5-5") == "claude-sonnet-4"
    assert reg.alias_target("claude-opus-5-6") is None
    assert reg.alias_target("llama") is None


def test_a_served_name_and_provider_model_are_never_aliased() -> None:
    reg = _registry(("*", "elsewhere"))
    assert reg.alias_target("gpt-4o-mini") is None  # a connection lists it
    assert reg.alias_target("mock/anything") is None
    assert reg.alias_target("other") == "elsewhere"


def test_patterns_treat_only_the_star_as_special() -> None:
    aliases = ModelAliases.of([ModelAlias("a.b[1]*", "t")])
    assert aliases.resolve("a.b[1]-x") == "t"
    assert aliases.resolve("aXb[1]") is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "must be a list"),
        ([{"pattern": "x"}], "[0].target"),
        ([{"pattern": "x", "target": "y*"}], "[0].target must be a model name, not a pattern"),
        ([{"pattern": "a b", "target": "y"}], "[0].pattern"),
    ],
)
def test_stored_aliases_that_do_not_parse_name_the_entry(raw: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_aliases(raw)
