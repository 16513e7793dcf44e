"""Which of active mode's targets a run meets, and ``--policies`` (pure)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fairgate.sim.fairness import Metrics
from fairgate.sim.policies import POLICY_NAMES, parse_policies
from fairgate.sim.runner import PolicyRun, ScenarioResult
from fairgate.sim.scenario import builtin
from fairgate.sim.spread import spreads
from fairgate.sim.targets import TARGET_NAMES, meets, request_overshoot


def test_a_good_run_meets_every_target(sim_metrics: Callable[..., Metrics]) -> None:
    assert meets(sim_metrics()) == dict.fromkeys(TARGET_NAMES, True)


@pytest.mark.parametrize(
    ("changes", "missed"),
    [
        ({"jain": 0.9899}, "jain"),
        ({"jain_worst_window": 0.949}, "worst_window"),
        ({"utilisation": 0.979}, "utilisation"),
        ({"ratio": {"a": 1.0, "b": 0.89}}, "key_ratio"),
        ({"ratio": {"a": 1.11, "b": 1.0}}, "key_ratio"),
        ({"overshoot": {"requests/hourly": 0.0, "tokens/hourly": 0.01}}, "overshoot"),
    ],
)
def test_each_target_can_be_missed_alone(
    changes: dict[str, object], missed: str, sim_metrics: Callable[..., Metrics]
) -> None:
    got = meets(sim_metrics(**changes))
    assert [name for name, ok in got.items() if not ok] == [missed]


def test_the_band_and_thresholds_are_inclusive(sim_metrics: Callable[..., Metrics]) -> None:
    edge = sim_metrics(
        jain=0.99, jain_worst_window=0.95, utilisation=0.98, ratio={"a": 0.9, "b": 1.1}
    )
    assert all(meets(edge).values())


def test_request_overshoot_reads_the_request_dimensions_only(
    sim_metrics: Callable[..., Metrics],
) -> None:
    m = sim_metrics(
        overshoot={"requests/hourly": 0.02, "tokens/hourly": 0.5, "requests/daily": 0.03}
    )
    assert request_overshoot(m) == 0.03


def test_the_spread_counts_the_runs_that_meet_every_target(
    sim_metrics: Callable[..., Metrics],
) -> None:
    def result(seed: int, m: Metrics) -> ScenarioResult:
        r = ScenarioResult(builtin("greedy"), seed, "sqlite", windows=1, capacity=1, shares={})
        r.runs["active"] = PolicyRun("active", m, [], {}, 0.0, 0)
        return r

    rows = spreads(
        [result(1, sim_metrics()), result(2, sim_metrics(jain=0.98)), result(3, sim_metrics())]
    )
    (row,) = rows
    assert (row.seeds, row.meeting) == (3, 2)


@pytest.mark.parametrize(
    ("text", "policies"),
    [
        ("active", ("active",)),
        ("active,static", ("static", "active")),  # the report's order, whatever the text's
        (" fixed , fcfs ", ("fcfs", "fixed")),
        (",".join(POLICY_NAMES), POLICY_NAMES),
    ],
)
def test_parse_policies(text: str, policies: tuple[str, ...]) -> None:
    assert parse_policies(text) == policies


@pytest.mark.parametrize("text", ["", "best", "active,", "active,nope"])
def test_parse_policies_rejects_with_a_message(text: str) -> None:
    with pytest.raises(ValueError, match="--policies: unknown policy"):
        parse_policies(text)
