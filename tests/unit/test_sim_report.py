"""The simulator's report stays readable with many keys: chart groups (pure)."""

from __future__ import annotations

from fairgate.sim.report import chart_groups
from fairgate.sim.runner import ScenarioResult
from fairgate.sim.scenario import builtin


def _result(name: str) -> ScenarioResult:
    return ScenarioResult(builtin(name), seed=1, driver="sqlite", windows=1, capacity=1, shares={})


def test_a_few_keys_are_drawn_one_by_one() -> None:
    assert chart_groups(_result("greedy")) == {k: [k] for k in ("hog", "app1", "app2", "app3")}


def test_forty_keys_are_drawn_as_their_four_demand_patterns() -> None:
    groups = chart_groups(_result("many-keys"))
    assert list(groups) == ["greedy ×10", "steady ×10", "on_off ×10", "bursty ×10"]
    assert sorted(k for ks in groups.values() for k in ks) == sorted(
        k.id for k in builtin("many-keys").keys
    )
