"""``fairgate simulate``: the command's work, kept out of ``cli.py`` (which only parses options).

Bad input (an unknown built-in, an unreadable or invalid scenario file, a bad option) is
reported in one clear message with exit code 2, like every other ``fairgate`` command; so is a
store that cannot be used, because the numbers would not be a measurement of the engine.
"""

from __future__ import annotations

import asyncio
import importlib.util
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fairgate import environment
from fairgate.install import extra_hint
from fairgate.process.settings import Settings
from fairgate.sim.policies import POLICY_NAMES, parse_policies
from fairgate.sim.report import print_results, print_spreads, write_chart, write_json
from fairgate.sim.runner import DRIVERS, ScenarioResult, SimError, run_scenario
from fairgate.sim.scenario import (
    Scenario,
    ScenarioError,
    builtin,
    builtin_names,
    builtins,
    load_scenario,
    parse_duration_ms,
)
from fairgate.sim.spread import parse_seeds, spreads

EXIT_BAD_INPUT = 2
#: most runs ``--jobs`` starts at once (each is a process with its own store)
MAX_JOBS = 64


def pick_scenarios(
    scenario_file: Path | None, builtin_name: str | None, run_all: bool
) -> list[Scenario]:
    chosen = sum(x for x in (scenario_file is not None, builtin_name is not None, run_all))
    if chosen != 1:
        names = ", ".join(builtin_names())
        raise ScenarioError(
            f"give exactly one of SCENARIO_FILE, --builtin NAME or --all (built-ins: {names})"
        )
    if scenario_file is not None:
        return [load_scenario(scenario_file)]
    if builtin_name is not None:
        return [builtin(builtin_name)]
    return list(builtins())


def run_simulate(
    console: Console,
    *,
    scenario_file: Path | None = None,
    builtin_name: str | None = None,
    run_all: bool = False,
    driver: str = "sqlite",
    seed: int = 1,
    seeds: str | None = None,
    out: Path = Path("sim-results"),
    duration: str | None = None,
    redis_url: str | None = None,
    policies: str | None = None,
    jobs: int = 1,
) -> int:
    """Run, print, write ``<out>/<scenario>.png`` and ``<out>/results.json``; the exit code.

    With ``seeds`` (``"1-10"``) every scenario runs once per seed; the spread over the seeds is
    printed after the tables, the JSON holds every run and the charts show the first seed.
    ``policies`` (``"active"``, ``"active,static"``) runs only those; ``jobs`` runs that many
    scenario × seed runs at once, each in its own process (the figures are the same: a run
    depends only on its scenario and seed).
    """
    try:
        seed_list = parse_seeds(seeds) if seeds is not None else [seed]
        chosen = parse_policies(policies) if policies is not None else POLICY_NAMES
        if not 1 <= jobs <= MAX_JOBS:
            raise ValueError(f"--jobs: give 1 to {MAX_JOBS} runs at once, not {jobs}")
        scenarios = pick_scenarios(scenario_file, builtin_name, run_all)
        if duration is not None:
            ms = parse_duration_ms(duration)
            scenarios = [s.with_duration(max(ms, s.tick)) for s in scenarios]
    except (ScenarioError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return EXIT_BAD_INPUT
    if driver not in DRIVERS:
        console.print(f"[red]error:[/] --driver must be one of {', '.join(DRIVERS)}")
        return EXIT_BAD_INPUT
    # --redis-url, else the gateway's own setting (QUOTA_STORE_REDIS_URL), read leniently
    url = redis_url or Settings.load(environment.snapshot(), strict=False).store.redis_url
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        console.print(f"[red]error:[/] cannot create {out}: {exc.strerror or exc}")
        return EXIT_BAD_INPUT
    runs = [(sc, s) for sc in scenarios for s in seed_list]
    try:
        if jobs > 1 and len(runs) > 1:
            results = _run_in_processes(runs, console, driver, url, chosen, jobs)
        else:
            results = asyncio.run(_run(runs, console, driver, url, chosen))
    except SimError as exc:
        console.print(f"[red]error:[/] {exc}")
        return EXIT_BAD_INPUT
    spread = spreads(results) if len(seed_list) > 1 else []
    if spread:
        print_spreads(spread, console)
    else:
        print_results(results, console)
    write_json(results, out / "results.json", spread)
    written = [str(out / "results.json")]
    if importlib.util.find_spec("matplotlib") is None:
        console.print(
            "[yellow]warning:[/] matplotlib is not installed, no charts drawn "
            f"({extra_hint('sim')})"
        )
    else:
        for r in results:
            if r.seed != seed_list[0]:
                continue
            write_chart(r, out / f"{r.scenario.name}.png")
            written.append(str(out / f"{r.scenario.name}.png"))
    console.print("wrote " + ", ".join(written))
    return 0


def _progress(console: Console, unit: str) -> Progress:
    return Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


async def _run(
    runs: Sequence[tuple[Scenario, int]],
    console: Console,
    driver: str,
    url: str | None,
    policies: Sequence[str],
) -> list[ScenarioResult]:
    """One run after the other in this process, a progress bar per policy (ticks)."""
    results: list[ScenarioResult] = []
    with _progress(console, "ticks") as progress:
        for sc, seed in runs:
            results.append(
                await run_scenario(
                    sc,
                    seed=seed,
                    driver=driver,
                    redis_url=url,
                    policies=policies,
                    progress=progress,
                )
            )
    return results


def _run_one(
    sc: Scenario, seed: int, driver: str, url: str | None, policies: Sequence[str]
) -> ScenarioResult:
    """One run in a worker process (its own event loop and store)."""
    return asyncio.run(run_scenario(sc, seed=seed, driver=driver, redis_url=url, policies=policies))


def _run_in_processes(
    runs: Sequence[tuple[Scenario, int]],
    console: Console,
    driver: str,
    url: str | None,
    policies: Sequence[str],
    jobs: int,
) -> list[ScenarioResult]:
    """``jobs`` runs at once, each in a fresh process (spawned: nothing of this one's state is
    inherited), one progress bar over the runs; the results in the order of ``runs``. When a
    run fails, the runs not started yet are cancelled and its error is raised."""
    workers = min(jobs, len(runs))
    ctx = multiprocessing.get_context("spawn")
    with (
        _progress(console, "runs") as progress,
        ProcessPoolExecutor(workers, mp_context=ctx) as pool,
    ):
        task = progress.add_task(f"{len(runs)} runs, {workers} at a time", total=len(runs))
        futures: list[Future[ScenarioResult]] = [
            pool.submit(_run_one, sc, seed, driver, url, tuple(policies)) for sc, seed in runs
        ]
        try:
            for done in as_completed(futures):
                done.result()  # a failed run raises here
                progress.advance(task)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        return [f.result() for f in futures]
