"""The online reference schedulers and the gate of issue 45, on workloads small enough to
work out by hand (pure: no store, no engine)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from fairgate.sim.fairness import Metrics
from fairgate.sim.gate import bar, distance_to_goal, judge_run
from fairgate.sim.policies import REFERENCE_NAMES, Ledger
from fairgate.sim.reference import reference
from fairgate.sim.runner import ScenarioResult, run_held, window_count
from fairgate.sim.scenario import Scenario, parse_scenario
from fairgate.sim.workload import Request, Workload


def _scenario(limit: int, keys: list[dict[str, object]], duration: str = "10m") -> Scenario:
    return parse_scenario(
        {
            "name": "tiny",
            "duration": duration,
            "tick": "30s",
            "pool": {"dimensions": [{"unit": "requests", "window": "hourly", "limit": limit}]},
            "keys": keys,
        }
    )


def _run(name: str, sc: Scenario, asks: Mapping[str, Mapping[int, int]]) -> Metrics:
    """Run reference ``name``; ``asks[key][tick]``: how many requests the key asks then."""
    arrivals = {
        k.id: [
            [Request(k.id, 10, 10, 20) for _ in range(asks.get(k.id, {}).get(i, 0))]
            for i in range(sc.ticks)
        ]
        for k in sc.keys
    }
    result = ScenarioResult(
        scenario=sc,
        seed=1,
        driver="none",
        windows=window_count(sc),
        capacity=sc.primary.limit,
        shares={k.id: sc.share_limit(k.id) for k in sc.keys},
    )
    return run_held(reference(name, sc), Workload(sc, 1, arrivals), result).metrics


@pytest.mark.parametrize("name", REFERENCE_NAMES)
def test_equal_keys_asking_at_once_split_the_pool_evenly(name: str) -> None:
    # 4 requests an hour; a and b ask 4 each at the start: each gets 2, the other 2 of each
    # wait their 2 minutes' patience (nothing frees within the hour) and are abandoned
    sc = _scenario(
        4,
        [
            {"id": "a", "demand": {"kind": "steady", "rate": 1}},
            {"id": "b", "demand": {"kind": "steady", "rate": 1}},
        ],
    )
    m = _run(name, sc, {"a": {0: 4}, "b": {0: 4}})
    assert m.admitted == {"a": 2.0, "b": 2.0}
    assert m.dropped == {"a": 2, "b": 2}
    assert m.blocked == {"a": 0, "b": 0}  # held, never refused
    assert m.ratio == {"a": 1.0, "b": 1.0}


@pytest.mark.parametrize("name", REFERENCE_NAMES)
def test_weights_split_the_pool_by_weight(name: str) -> None:
    # 8 requests, weights 75/25, both asking more: 6 and 2 (each reference orders by service
    # per unit of weight, so a is served three times for each of b's)
    sc = _scenario(
        8,
        [
            {"id": "a", "weight": 75, "demand": {"kind": "steady", "rate": 1}},
            {"id": "b", "weight": 25, "demand": {"kind": "steady", "rate": 1}},
        ],
    )
    m = _run(name, sc, {"a": {0: 10}, "b": {0: 10}})
    assert m.admitted == {"a": 6.0, "b": 2.0}


@pytest.mark.parametrize("name", REFERENCE_NAMES)
def test_a_capped_key_is_passed_over_not_waited_for(name: str) -> None:
    # a is capped at 1 an hour: it gets 1, and b gets the other 5 (work conserving)
    sc = _scenario(
        6,
        [
            {
                "id": "a",
                "cap": {"value": 1, "unit": "requests"},
                "demand": {"kind": "steady", "rate": 1},
            },
            {"id": "b", "demand": {"kind": "steady", "rate": 1}},
        ],
    )
    m = _run(name, sc, {"a": {0: 4}, "b": {0: 8}})
    assert m.admitted == {"a": 1.0, "b": 5.0}


@pytest.mark.parametrize("name", REFERENCE_NAMES)
def test_a_request_that_arrives_later_gets_room_held_not_refused(name: str) -> None:
    # a asks 3 of 6 at the start, b asks 3 at tick 4: the pool has room, both are served
    # at once; a later request of a over the limit waits and is abandoned, never refused
    sc = _scenario(
        6,
        [
            {"id": "a", "demand": {"kind": "steady", "rate": 1}},
            {"id": "b", "demand": {"kind": "steady", "rate": 1}},
        ],
    )
    m = _run(name, sc, {"a": {0: 3, 10: 2}, "b": {4: 3}})
    assert m.admitted == {"a": 3.0, "b": 3.0}
    assert m.dropped == {"a": 2, "b": 0}
    assert m.wait_p95_ms == {"a": 0, "b": 0}


def test_vtc_lifts_a_returning_key_to_the_least_waiting_counter() -> None:
    sc = _scenario(100, [{"id": k, "demand": {"kind": "steady", "rate": 1}} for k in "abc"])
    vtc, ledger = reference("vtc", sc), Ledger(sc)
    one = Request("a", 10, 10, 20)  # 1 request of 100: cost 0.01, per weight (33.3) 0.0003
    vtc.backlogged("a", set())
    for _ in range(3):
        vtc.served("a", one)
    vtc.backlogged("b", {"a"})  # b starts while a waits: lifted to a's counter
    assert vtc.order("b", 0, ledger, 0)[0] == pytest.approx(3 * 0.01 / (100 / 3))
    vtc.idle("a")
    vtc.idle("b")
    vtc.backlogged("c", set())  # nobody waits: lifted to the last counter to leave
    assert vtc.order("c", 0, ledger, 0)[0] == vtc.order("b", 0, ledger, 0)[0]


def test_sfq_tags_a_key_from_the_virtual_time_when_it_starts_waiting() -> None:
    sc = _scenario(10, [{"id": k, "demand": {"kind": "steady", "rate": 1}} for k in "ab"])
    sfq, ledger = reference("sfq", sc), Ledger(sc)
    one = Request("a", 10, 10, 20)  # cost 0.1, per weight (50): 0.002
    sfq.backlogged("a", set())
    sfq.served("a", one)
    sfq.served("a", one)  # a's next start tag: 0.004; virtual time: 0.002
    sfq.backlogged("b", {"a"})
    assert sfq.order("b", 0, ledger, 0)[0] == pytest.approx(0.002)
    assert sfq.order("a", 0, ledger, 0)[0] == pytest.approx(0.004)


# -- the gate -------------------------------------------------------------------------------------


def test_the_bar_is_the_best_reference_or_the_goal_whichever_is_lower(
    sim_metrics: Callable[..., Metrics],
) -> None:
    refs = {
        "las": sim_metrics(
            jain=0.95, jain_worst_window=0.80, utilisation=0.97, ratio={"a": 0.70, "b": 1.30}
        ),
        "vtc": sim_metrics(
            jain=0.96, jain_worst_window=0.99, utilisation=0.995, ratio={"a": 0.80, "b": 1.20}
        ),
    }
    b = bar(refs, hard={"a", "b"})
    assert b.jain == pytest.approx(0.955)
    assert b.set_by["jain"] == "vtc"
    assert b.worst_window == 0.95
    assert b.set_by["worst_window"] == "goal"
    assert b.utilisation == 0.98
    assert b.set_by["utilisation"] == "goal"
    assert b.key_low == pytest.approx(0.75)
    assert b.set_by["key_low"] == "vtc"
    assert b.key_high == pytest.approx(1.25)
    assert b.set_by["key_high"] == "vtc"


@pytest.mark.parametrize(
    ("changes", "failed"),
    [
        ({"jain": 0.9549}, "jain"),
        ({"jain_worst_window": 0.949}, "worst_window"),
        ({"utilisation": 0.979}, "utilisation"),
        ({"ratio": {"a": 0.74, "b": 1.0}}, "key_low"),
        ({"ratio": {"a": 1.0, "b": 1.26}}, "key_high"),
        ({"overshoot": {"requests/hourly": 0.01}}, "overshoot"),
    ],
)
def test_each_check_of_the_gate_can_fail_alone(
    changes: dict[str, object], failed: str, sim_metrics: Callable[..., Metrics]
) -> None:
    refs = {"vtc": sim_metrics(jain=0.96, ratio={"a": 0.80, "b": 1.20})}
    v = judge_run(sim_metrics(**changes), refs, hard={"a", "b"})
    assert [n for n, ok in v.checks.items() if not ok] == [failed]
    assert not v.passed


def test_a_soft_key_is_not_held_to_the_upper_band(sim_metrics: Callable[..., Metrics]) -> None:
    refs = {"vtc": sim_metrics()}
    v = judge_run(sim_metrics(ratio={"a": 1.0, "b": 1.5}), refs, hard={"a"})
    assert v.passed


def test_a_small_key_within_one_request_a_window_passes_the_band(
    sim_metrics: Callable[..., Metrics],
) -> None:
    # b owed 4 requests over 2 windows it asked in (slack 2/4): 3 of 4 (0.75) passes,
    # 1 of 4 (0.25) does not
    refs = {"vtc": sim_metrics()}
    near = judge_run(sim_metrics(ratio={"a": 1.0, "b": 0.75}, slack={"b": 0.5}), refs, {"a", "b"})
    assert near.passed
    assert near.distance["key_low"] == 0.0
    far = judge_run(sim_metrics(ratio={"a": 1.0, "b": 0.25}, slack={"b": 0.5}), refs, {"a", "b"})
    assert far.low_keys == ["b"]
    assert far.distance["key_low"] == pytest.approx(0.65)


def test_the_distance_to_the_goal_is_zero_where_it_is_met(
    sim_metrics: Callable[..., Metrics],
) -> None:
    assert all(d == 0 for d in distance_to_goal(sim_metrics()).values())
    d = distance_to_goal(sim_metrics(jain=0.98, utilisation=0.97, ratio={"a": 1.2, "b": 1.0}))
    assert d["jain"] == pytest.approx(0.01)
    assert d["utilisation"] == pytest.approx(0.01)
    assert d["key_high"] == pytest.approx(0.1)
