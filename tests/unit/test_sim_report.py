"""The simulator's report stays readable: chart groups with many keys, the tables in 80
columns (pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rich.console import Console

from fairgate.sim.fairness import Metrics
from fairgate.sim.policies import POLICY_NAMES
from fairgate.sim.report import chart_groups, print_spreads, scenario_table
from fairgate.sim.runner import PolicyRun, ScenarioResult
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
            gate=9 if policy == "active" else None,
        )
        for name in builtin_names()
        for policy in ("static", "active")
    ]
    console = Console(width=80, record=True)
    print_spreads(rows, console)
    text = console.export_text()
    assert "…" not in text
    for cell in ("subscription", "0.81–1.20", "100.0%", "10/10", "9/10", "gate"):
        assert cell in text
    plain = Console(width=80, record=True)
    print_spreads([replace(r, gate=None) for r in rows], plain)
    text = plain.export_text()
    assert "…" not in text
    assert "0.9985" in text  # without references run, the median column is back
    assert "gate" not in text.split("worst and median")[0]


def test_a_scenarios_table_fits_an_80_column_terminal(sim_metrics: Callable[..., Metrics]) -> None:
    """Four policies on a pool of two dimensions (the per-dimension column too), with the
    widest figures, nothing cut short with an ellipsis."""
    result = ScenarioResult(
        builtin("two-resource"), seed=1, driver="sqlite", windows=2, capacity=300, shares={}
    )
    for name in POLICY_NAMES:
        metrics = sim_metrics(
            jain=0.9713,
            jain_worst_window=0.814,
            utilisation=1.0,
            overshoot={"requests/hourly": 0.0, "tokens/hourly": 0.0125},
            blocked={"a": 12_345},
            well_behaved=["a"],
            first_block_ms={"a": 5_700_000},
            utilisation_by_dim={"requests/hourly": 1.07, "tokens/hourly": 0.979},
        )
        result.runs[name] = PolicyRun(name, metrics, [], {}, 0.0, 0)
    console = Console(width=80, record=True)
    console.print(scenario_table(result))
    text = console.export_text()
    assert "…" not in text
    for cell in ("fixed", "0.9713", "100.0 %", "1.2 %", "12345", "95 min", "req 107.0%"):
        assert cell in text
