"""``fairgate simulate``: deterministic for a seed, and every built-in scenario through the real
engine on SQLite meets the active-mode targets (Jain ≥ 0.99 against the max-min ideal,
utilisation ≥ 98 % of what demand allowed, no overshoot of a request limit).

The smoke runs are shortened to three hours (the full built-ins run six to eight), which keeps
this module to seconds; the full runs are in docs/fairness.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fairgate.cli import app
from fairgate.domain.units import WINDOW_MS, Window
from fairgate.sim.fairness import dominant_window_figures, summarize, window_figures
from fairgate.sim.gate import GATE_NAMES
from fairgate.sim.policies import POLICY_NAMES
from fairgate.sim.runner import EPOCH_MS, PolicyRun, run_scenario, start_ms
from fairgate.sim.scenario import (
    ScenarioError,
    builtin,
    builtin_names,
    load_scenario,
    parse_duration_ms,
    parse_scenario,
)
from fairgate.sim.targets import TARGET_JAIN, TARGET_NAMES, TARGET_UTILISATION, request_overshoot
from fairgate.sim.workload import generate

SMOKE = parse_duration_ms("3h")


def test_workload_is_deterministic_for_a_seed() -> None:
    sc = builtin("bursty")
    assert generate(sc, 7).arrivals == generate(sc, 7).arrivals
    assert generate(sc, 7).arrivals != generate(sc, 8).arrivals


async def test_simulation_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    sc = builtin("greedy").with_duration(parse_duration_ms("90m"))
    runs = [
        await run_scenario(sc, seed=3, data_dir=tmp_path / str(i), policies=("fcfs", "active"))
        for i in range(2)
    ]
    for policy in ("fcfs", "active"):
        first, second = (r.runs[policy] for r in runs)
        assert first.metrics == second.metrics
        assert first.usage == second.usage
        assert first.admissions == second.admissions


#: Built-ins where some key's admitted ÷ ideal is still outside 0.90-1.10 (docs/fairness.md,
#: issue 17's third pass): strict, so the day they pass the marker has to go. In these smoke runs
#: (3 hours, seed 1): many-keys' capped bursty key at 0.75 (its first window's burst, asked
#: where the pool is paced) and another bursty key at 1.10; two-resource's research agent at
#: 0.85 before the CI bot starts. Both need to know what is asked later in the window.
#: Issue 45's built-ins meet every target in these smoke runs: policy-mix (Jain 0.9885, the
#: on-off hard key coming back at 0.83, before a fresh window was paced with every key
#: present), daily-batch (the batch at 0.57 of its week before the week's level across
#: windows) and tiny-keys (utilisation 95 % before a young key's first request stopped being
#: projected); the gate and its table over seeds 1-10 are in docs/fairness.md.
TARGETS_NOT_YET: set[str] = set()
RANGE_NOT_YET = {"many-keys", "two-resource", *TARGETS_NOT_YET}
#: The subscription and daily-batch built-ins run their whole week (pacing the weekly budget
#: and the ideal across windows must agree on when the week ends); active mode paces the week
#: and meets the band in subscription.
FULL_LENGTH = {"subscription", "daily-batch"}


def _xfail_in(names: set[str], reason: str) -> list[object]:
    """Every built-in, those in ``names`` as strict xfails (the day they pass, drop them)."""
    mark = pytest.mark.xfail(strict=True, reason=reason)
    return [pytest.param(n, marks=mark) if n in names else n for n in builtin_names()]


_SMOKE_RUNS: dict[str, PolicyRun] = {}


async def _smoke(name: str, tmp_path: Path) -> PolicyRun:
    """The active-mode run of a built-in (shortened unless FULL_LENGTH), once per module: two
    tests read it."""
    if name not in _SMOKE_RUNS:
        sc = builtin(name)
        if name not in FULL_LENGTH:
            sc = sc.with_duration(SMOKE)
        result = await run_scenario(sc, seed=1, data_dir=tmp_path, policies=("active",))
        _SMOKE_RUNS[name] = result.runs["active"]
    return _SMOKE_RUNS[name]


@pytest.mark.parametrize(
    "name",
    _xfail_in(TARGETS_NOT_YET, "issue 45: policy-mix Jain 0.9885, hard-3 at 0.83 (fairness.md)"),
)
async def test_builtin_scenario_meets_the_active_targets(name: str, tmp_path: Path) -> None:
    run = await _smoke(name, tmp_path)
    m = run.metrics
    assert run.admissions > 0
    assert m.jain >= TARGET_JAIN, m.ratio
    assert m.utilisation >= TARGET_UTILISATION
    assert request_overshoot(m) == 0.0
    assert all(v <= 1e-9 for v in m.overshoot.values())


@pytest.mark.parametrize(
    "name",
    _xfail_in(
        RANGE_NOT_YET,
        "issues 17/18: a key outside 0.90-1.10 (many-keys 0.75, two-resource 0.85; fairness.md)",
    ),
)
async def test_builtin_scenario_gives_every_key_its_ideal(name: str, tmp_path: Path) -> None:
    # every key with demand gets 0.90-1.10 of its max-min ideal (issue 17)
    m = (await _smoke(name, tmp_path)).metrics
    assert all(0.90 <= r <= 1.10 for r in m.ratio.values()), m.ratio


async def test_static_shares_leave_quota_unused_where_active_does_not(tmp_path: Path) -> None:
    """The comparison the simulator exists for: one greedy key, three that ask little."""
    sc = builtin("greedy").with_duration(SMOKE)
    result = await run_scenario(sc, seed=1, data_dir=tmp_path, policies=("static", "active"))
    assert result.runs["static"].metrics.utilisation < 0.85
    assert result.runs["active"].metrics.utilisation >= TARGET_UTILISATION
    assert result.runs["static"].metrics.ratio["hog"] < 0.7


def test_scenario_file_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nduration: 1h\npool: {dimensions: [{unit: requests, window: hourly, limit: 0}]}\n"
        "keys: [{id: a, demand: {kind: steady, rate: 5}}]\n"
    )
    with pytest.raises(ScenarioError, match=r"pool\.dimensions\.0\.limit"):
        load_scenario(bad)


def test_cli_writes_a_chart_and_json(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app, ["simulate", "--builtin", "late-arrival", "--duration", "3h", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    png = out / "late-arrival.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000
    doc = json.loads((out / "results.json").read_text())
    (scenario,) = doc["scenarios"]
    assert scenario["scenario"]["name"] == "late-arrival"
    assert set(scenario["policies"]) == set(POLICY_NAMES)
    # late-arrival meets every target on seed 1 (the per-key range test below holds it too)
    assert scenario["active_targets"] == dict.fromkeys(TARGET_NAMES, True)
    # and so passes the gate of issue 45, whatever the references reached
    gate = scenario["gate"]
    assert gate["passed"] is True
    assert set(gate["checks"]) == set(GATE_NAMES)
    assert all(d == 0 for d in gate["distance_to_goal"].values())
    assert "gate PASS" in res.output
    assert doc["targets"]["key_ratio"] == [0.9, 1.1]
    assert "Jain" in res.output
    assert "worst window ✓" in res.output


def test_cli_seeds_prints_the_spread_and_writes_every_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["simulate", "--builtin", "greedy", "--duration", "1h", "--seeds", "1-3"]
    res = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "spread over 3 seeds" in res.output
    doc = json.loads((out / "results.json").read_text())
    assert [s["seed"] for s in doc["scenarios"]] == [1, 2, 3]
    rows = {r["policy"]: r for r in doc["spread"]}
    assert set(rows) == set(POLICY_NAMES)
    passed = [s["gate"]["passed"] for s in doc["scenarios"]]
    assert rows["active"]["gate"] == sum(passed)
    assert rows["las"]["gate"] is None
    active = rows["active"]
    jains = [s["policies"]["active"]["metrics"]["jain"] for s in doc["scenarios"]]
    assert active["seeds"] == 3
    assert active["jain_min"] == pytest.approx(min(jains), abs=1e-6)
    assert active["jain_min"] <= active["jain_median"] <= max(jains)
    met = [all(s["active_targets"].values()) for s in doc["scenarios"]]
    assert active["meeting"] == sum(met)
    assert f"{sum(met)}/3" in res.output
    assert (out / "greedy.png").exists()  # the first seed's chart


def test_cli_policies_runs_only_those(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["simulate", "--builtin", "greedy", "--duration", "1h", "--policies", "active,static"]
    res = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    (scenario,) = json.loads((out / "results.json").read_text())["scenarios"]
    assert list(scenario["policies"]) == ["static", "active"]
    assert "fcfs" not in res.output
    assert "active targets" in res.output
    assert (out / "greedy.png").stat().st_size > 0  # the chart draws the policies it has


def test_cli_jobs_give_the_figures_of_one_process(tmp_path: Path) -> None:
    """Runs in separate processes (spawned) give what one process gives, in the same order."""
    args = ["simulate", "--builtin", "greedy", "--duration", "1h", "--seeds", "1-3"]
    args += ["--policies", "active"]
    docs = []
    for jobs in ("1", "2"):
        out = tmp_path / jobs
        res = CliRunner().invoke(app, [*args, "--jobs", jobs, "--out", str(out)])
        assert res.exit_code == 0, res.output
        docs.append(json.loads((out / "results.json").read_text()))
    one, two = ([s["policies"]["active"]["metrics"] for s in d["scenarios"]] for d in docs)
    assert [s["seed"] for s in docs[1]["scenarios"]] == [1, 2, 3]
    assert one == two
    assert docs[0]["spread"] == docs[1]["spread"]


def test_cli_a_run_failing_in_a_worker_exits_2(tmp_path: Path) -> None:
    """A worker's error reaches the user as the one-process path reports it."""
    args = ["simulate", "--builtin", "greedy", "--duration", "1h", "--seeds", "1-2", "--jobs", "2"]
    args += ["--driver", "redis", "--redis-url", "redis://127.0.0.1:1/0", "--out", str(tmp_path)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    assert "redis is not reachable at redis://127.0.0.1:1/0" in " ".join(res.output.split())


def test_cli_runs_a_scenario_file(tmp_path: Path) -> None:
    f = tmp_path / "two.yaml"
    f.write_text(
        "name: two\nduration: 2h\ntick: 1m\n"
        "pool: {dimensions: [{unit: requests, window: hourly, limit: 120}]}\n"
        "keys:\n"
        "  - {id: big, weight: 50, demand: {kind: greedy, factor: 4}}\n"
        "  - {id: small, weight: 50, demand: {kind: steady, rate: 30}}\n"
    )
    res = CliRunner().invoke(app, ["simulate", str(f), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "o" / "two.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--builtin", "nope"], "unknown built-in scenario 'nope'"),
        ([], "exactly one of"),
        (["--builtin", "greedy", "--driver", "mysql"], "--driver must be one of"),
        (["--builtin", "greedy", "--duration", "soon"], "not a duration"),
        (["--builtin", "greedy", "--policies", "best"], "--policies: unknown policy 'best'"),
        (["--builtin", "greedy", "--jobs", "0"], "--jobs: give 1 to"),
    ],
)
def test_cli_bad_input_exits_2_with_a_message(
    args: list[str], message: str, tmp_path: Path
) -> None:
    res = CliRunner().invoke(app, ["simulate", *args, "--out", str(tmp_path)])
    assert res.exit_code == 2
    assert message in " ".join(res.output.split())


@pytest.mark.parametrize("bad", ["x", "3-1", "1-", "-2", "1,,2"])
def test_cli_bad_seeds_exit_2(bad: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app, ["simulate", "--builtin", "greedy", "--seeds", bad, "--out", str(tmp_path)]
    )
    assert res.exit_code == 2
    assert "--seeds" in res.output


def test_cli_invalid_yaml_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [\n")
    res = CliRunner().invoke(app, ["simulate", str(bad), "--out", str(tmp_path)])
    assert res.exit_code == 2
    assert "not valid YAML" in res.output


@pytest.mark.redis
@pytest.mark.parametrize(
    ("name", "duration"),
    [
        ("late-arrival", "150m"),
        ("many-keys", "90m"),
        ("two-resource", "90m"),
        ("subscription", "12h"),
        ("daily-batch", "30h"),
        ("tiny-keys", "1h"),
    ],
)
async def test_redis_driver_gives_the_same_figures(
    name: str, duration: str, redis_url: str, tmp_path: Path
) -> None:
    """Both drivers evaluate the same rule atomically, so a seed decides identically on each.
    ``many-keys`` draws on every active-mode rule: demand bounds, room held for waiting keys
    (the catch-up reserve) and pacing after the quiet first window; ``two-resource`` the
    dominant levels and their catch-up reserve; ``subscription`` the paced week (issue 18);
    ``daily-batch`` the week's level across its 5-hour windows over two batches, ``tiny-keys``
    the young keys' demand on a fresh pool (issue 45)."""
    sc = builtin(name).with_duration(parse_duration_ms(duration))
    on_sqlite = await run_scenario(sc, seed=2, data_dir=tmp_path, policies=("active",))
    on_redis = await run_scenario(
        sc, seed=2, driver="redis", redis_url=redis_url, policies=("active",)
    )
    assert on_redis.driver == "redis"
    assert on_redis.runs["active"].metrics == on_sqlite.runs["active"].metrics


async def test_requests_still_waiting_at_the_end_are_not_counted_as_demand(
    tmp_path: Path,
) -> None:
    """A key that starts asking in the run's last minute, into a full pool, was not refused:
    its requests were still within their wait. They are neither demand nor admissions."""
    sc = parse_scenario(
        {
            "name": "end",
            "duration": "1h",
            "tick": "30s",
            "pool": {"dimensions": [{"unit": "requests", "window": "hourly", "limit": 60}]},
            "keys": [
                {"id": "hog", "weight": 50, "demand": {"kind": "greedy", "factor": 10}},
                {
                    "id": "last",
                    "weight": 50,
                    "demand": {"kind": "late", "rate": 600, "start": "59m"},
                },
            ],
        }
    )
    result = await run_scenario(sc, seed=1, data_dir=tmp_path, policies=("fcfs",))
    m = result.runs["fcfs"].metrics
    assert m.demand["last"] == 0
    assert "last" not in m.ratio
    assert m.admitted["hog"] == 60
    assert m.ratio["hog"] == 1.0


async def test_admissions_count_in_the_window_they_were_asked_in(tmp_path: Path) -> None:
    """A burst asked at the end of one window and served early in the next (its cap let only
    30 in before the rollover) counts for the window it was asked in, beside its demand: the
    per-window Jain index compares the two."""
    sc = parse_scenario(
        {
            "name": "spill",
            "duration": "2h",
            "tick": "30s",
            "pool": {"dimensions": [{"unit": "requests", "window": "hourly", "limit": 100}]},
            "keys": [
                {
                    "id": "late",
                    "max_wait": "15m",
                    "cap": {"value": 30, "unit": "requests"},
                    "demand": {
                        "kind": "on_off",
                        "rate": 600,
                        "on": "5m",
                        "off": "115m",
                        "phase": "55m",
                    },
                },
            ],
        }
    )
    result = await run_scenario(sc, seed=1, data_dir=tmp_path, policies=("fixed",))
    first, second = result.runs["fixed"].windows
    assert first.demand["late"] == 50
    assert first.admitted["late"] > 30  # served across the rollover, counted where asked
    assert second.demand["late"] == 0
    assert second.admitted["late"] == 0


@pytest.mark.parametrize("name", ["bursty", "token-mix", "steady"])
async def test_dominant_ideal_keeps_the_single_dimension_figures(name: str, tmp_path: Path) -> None:
    """Where one dimension binds (the existing built-ins: 600 requests/hour beside 2 M tokens,
    or tokens alone), the dominant-resource-fair measurement gives the max-min figures of that
    dimension, to the last bit."""
    sc = builtin(name).with_duration(parse_duration_ms("2h"))
    result = await run_scenario(sc, seed=2, data_dir=tmp_path, policies=("fcfs", "active"))
    weights = {k.id: sc.weight_of(k.id) for k in sc.keys}
    caps = {
        k.id: k.cap.value if k.cap is not None and k.cap.unit is sc.primary.unit else None
        for k in sc.keys
    }
    for run in result.runs.values():
        assert len(run.windows[0].capacities) == len(
            [d for d in sc.pool.dimensions if d.window is sc.primary.window]
        )
        single = window_figures(
            result.capacity,
            weights,
            caps,
            [w.demand for w in run.windows],
            [w.admitted for w in run.windows],
        )
        assert [w.ideal for w in run.windows] == [w.ideal for w in single]
        old = summarize(
            single,
            shares=result.shares,
            overshoot={},
            blocked={},
            dropped={},
            first_block_ms={},
        )
        m = run.metrics
        assert m.ratio == old.ratio
        assert (m.jain, m.jain_worst_window, m.utilisation) == (
            old.jain,
            old.jain_worst_window,
            old.utilisation,
        )
        assert m.utilisation_by_dim[f"{sc.primary.unit.value}/hourly"] == old.utilisation


async def test_two_resource_builtin_measures_every_dimension(tmp_path: Path) -> None:
    """Both dimensions bind: the ideal is in both, each key's ratio in its dominant one."""
    sc = builtin("chat-agent").with_duration(parse_duration_ms("2h"))
    result = await run_scenario(sc, seed=1, data_dir=tmp_path, policies=("active",))
    m = result.runs["active"].metrics
    assert set(m.utilisation_by_dim) == {"requests/hourly", "tokens/hourly"}
    last = result.runs["active"].windows[-1]
    assert last.dominant == {"chat": "requests/hourly", "summariser": "tokens/hourly"}
    # the summariser alone would take every token; the ideal fills tokens, not requests
    assert last.bottleneck == "tokens/hourly"
    assert sum(last.ideal_by_dim["tokens/hourly"].values()) == pytest.approx(1_200_000)
    assert sum(last.ideal_by_dim["requests/hourly"].values()) < 600
    assert request_overshoot(result.runs["active"].metrics) == 0.0


async def test_subscription_measures_the_weekly_budget_across_windows(tmp_path: Path) -> None:
    """5-hour and weekly budgets: the run starts on a boundary of both, the ideal hands out
    the week's budget over the windows (not 250 in each 5-hour window, which would be more
    than the week holds), and a policy that spends it all reads fully used; measured on the
    5-hour windows alone the same run reads under 85 % used."""
    sc = builtin("subscription")
    assert start_ms(sc) % WINDOW_MS[Window.WEEKLY] == 0
    assert start_ms(sc) % WINDOW_MS[Window.FIVE_HOURS] == 0
    assert start_ms(builtin("steady")) == (EPOCH_MS // 3_600_000 + 1) * 3_600_000
    result = await run_scenario(sc, seed=1, data_dir=tmp_path, policies=("fcfs",))
    run = result.runs["fcfs"]
    m = run.metrics
    assert set(m.utilisation_by_dim) == {"requests/5h", "requests/weekly"}
    weekly = sum(sum(w.ideal_by_dim["requests/weekly"].values()) for w in run.windows)
    assert weekly == pytest.approx(6000)
    assert sum(sum(w.demand.values()) for w in run.windows) > 10_000  # the week binds
    assert all(sum(w.ideal.values()) <= 250 + 1e-9 for w in run.windows)
    assert m.utilisation == pytest.approx(1.0)
    assert all(v <= 1e-9 for v in m.overshoot.values())
    short = "requests/5h"
    alone = summarize(
        dominant_window_figures(
            {short: 250.0},
            {k.id: sc.weight_of(k.id) for k in sc.keys},
            {},
            [{short: w.demand_by_dim[short]} for w in run.windows],
            [{short: w.admitted_by_dim[short]} for w in run.windows],
        ),
        shares=result.shares,
        overshoot={},
        blocked={},
        dropped={},
        first_block_ms={},
    )
    assert alone.utilisation < 0.85
