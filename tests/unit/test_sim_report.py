"""The simulator's report stays readable: chart groups with many keys, the spread table in
80 columns (pure)."""

from __future__ import annotations

from rich.console import Console

from fairgate.sim.report import chart_groups, print_spreads
from fairgate.sim.runner import ScenarioResult
from fairgate.sim.scenario import builtin, builtin_names
from fairgate.sim.spread import Spread


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


def test_the_spread_over_seeds_fits_an_80_column_terminal() -> None:
    """Every built-in's name and the widest figures, nothing cut short with an ellipsis."""
    rows = [
        Spread(
            scenario=name,
            policy=policy,
            seeds=10,
            jain_min=0.9909,
            jain_median=0.9985,
            worst_window_min=0.874,
            worst_window_median=0.951,
            utilisation_min=1.0,
            utilisation_median=0.9834,
            ratio_min=0.81,
            ratio_max=1.20,
            overshoot_max=0.0,
            meeting=10,
        )
        for name in builtin_names()
        for policy in ("static", "active")
    ]
    console = Console(width=80, record=True)
    print_spreads(rows, console)
    text = console.export_text()
    assert "…" not in text
    for cell in ("subscription", "0.81–1.20", "100.0%", "10/10"):
        assert cell in text
