"""``fairgate simulate``: the command's work, kept out of ``cli.py`` (which only parses options).

Bad input (an unknown built-in, an unreadable or invalid scenario file, a bad option) is
reported in one clear message with exit code 2, like every other ``fairgate`` command; so is a
store that cannot be used, because the numbers would not be a measurement of the engine.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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
) -> int:
    """Run, print, write ``<out>/<scenario>.png`` and ``<out>/results.json``; the exit code.

    With ``seeds`` (``"1-10"``) every scenario runs once per seed; the spread over the seeds is
    printed after the tables, the JSON holds every run and the charts show the first seed.
    """
    try:
        seed_list = parse_seeds(seeds) if seeds is not None else [seed]
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
    url = redis_url or os.environ.get("QUOTA_STORE_REDIS_URL") or None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        console.print(f"[red]error:[/] cannot create {out}: {exc.strerror or exc}")
        return EXIT_BAD_INPUT
    try:
        results = asyncio.run(_run(scenarios, console, driver, seed_list, url))
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
            "(pip install 'fairgate[sim]')"
        )
    else:
        for r in results:
            if r.seed != seed_list[0]:
                continue
            write_chart(r, out / f"{r.scenario.name}.png")
            written.append(str(out / f"{r.scenario.name}.png"))
    console.print("wrote " + ", ".join(written))
    return 0


async def _run(
    scenarios: list[Scenario], console: Console, driver: str, seeds: list[int], url: str | None
) -> list[ScenarioResult]:
    results: list[ScenarioResult] = []
    with Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("ticks"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        for sc in scenarios:
            for seed in seeds:
                results.append(
                    await run_scenario(
                        sc, seed=seed, driver=driver, redis_url=url, progress=progress
                    )
                )
    return results
