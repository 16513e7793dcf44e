"""Showing the results: a rich table per scenario, a PNG chart, and JSON for anyone's tools.

The chart is drawn with matplotlib's Agg backend (no display needed) and kept small: usage over
time per key under each policy (the key's sliding-window count, what the limits act on), then
each key's admitted/ideal ratio per policy, then Jain's index and utilisation per policy beside
the targets.
"""

from __future__ import annotations

import io
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from fairgate.sim.gate import describe_verdict, run_verdict
from fairgate.sim.policies import HELD_ENGINE
from fairgate.sim.runner import ScenarioResult
from fairgate.sim.spread import Spread
from fairgate.sim.targets import (
    TARGET_JAIN,
    TARGET_RATIO,
    TARGET_UTILISATION,
    TARGET_WORST_WINDOW,
    describe,
    judge,
    meets,
    request_overshoot,
)


def _duration(ms: int | None) -> str:
    if ms is None:
        return "never"
    s = ms / 1000
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _mark(ok: bool, text: str) -> str:
    """``text`` green where a target is met, yellow where it is missed."""
    return f"[{'green' if ok else 'yellow'}]{text}[/]"


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def _dim_labels(names: list[str]) -> list[str]:
    """Short column labels of dimension names (``req`` for ``requests/hourly``), with the
    window where units repeat (``req/5h`` beside ``req/weekly``)."""
    short = [n[:3] for n in names]
    if len(set(short)) == len(short):
        return short
    return [f"{n[:3]}/{n.rpartition('/')[2]}" for n in names]


def _table(title: str) -> Table:
    """Every table of the report: a rule under the header and no vertical rules, so the
    scenario's nine columns (the per-dimension one too) and the spread's fit an 80-column
    terminal; with the default box they were cut short (``utili…``, ``107.…``)."""
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )


def scenario_table(result: ScenarioResult) -> Table:
    """One row per policy; narrow enough for an 80-column terminal."""
    sc = result.scenario
    pool = " + ".join(
        f"{d.limit * sc.pool.members:g} {d.unit.value}/{d.window.value}" for d in sc.pool.dimensions
    )
    title = (
        f"[bold]{sc.name}[/]: {sc.description or 'scenario'}\n"
        f"{pool}, {len(sc.keys)} keys, {sc.duration / 3_600_000:g} h, seed {result.seed}, "
        f"{result.driver}"
    )
    table = _table(title)
    per_dim = any(len(r.metrics.utilisation_by_dim) > 1 for r in result.runs.values())
    for col, just in (
        ("policy", "left"),
        ("Jain", "right"),
        ("worst\nwindow", "right"),
        ("utilis-\nation", "right"),
        ("over-\nshoot", "right"),
        ("refused", "right"),
        ("well-\nbehaved\nrefused", "right"),
        ("first\nrefusal", "right"),
    ):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    if per_dim:
        table.add_column("per\ndim", justify="right")
    for name, run in result.runs.items():
        m = run.metrics
        worst_over = max(m.overshoot.values(), default=0.0)
        wb_refused = sum(m.blocked.get(k, 0) for k in m.well_behaved)
        ok = meets(m)
        cells = [
            name,
            _mark(ok["jain"], f"{m.jain:.4f}"),
            _mark(ok["worst_window"], f"{m.jain_worst_window:.3f}"),
            _mark(ok["utilisation"], _pct(m.utilisation)),
            "0" if worst_over == 0 else _pct(worst_over),
            str(m.blocked_total),
            str(wb_refused) if m.well_behaved else "-",
            _duration(m.first_block_well_behaved_ms) if m.well_behaved else "-",
        ]
        if per_dim:
            cells.append(
                "\n".join(
                    f"{label} {u * 100:.1f}%"
                    for label, u in zip(
                        _dim_labels(list(m.utilisation_by_dim)),
                        m.utilisation_by_dim.values(),
                        strict=True,
                    )
                )
            )
        table.add_row(*cells)
    return table


def ratio_table(result: ScenarioResult) -> Table:
    """Each key's admitted ÷ ideal (1 = exactly its max-min fair share): one row per key,
    sorted by the ``active`` ratio (worst first), the policies side by side, so it stays
    readable with dozens of keys."""
    sc = result.scenario
    policies = list(result.runs)
    order = "active" if "active" in result.runs else policies[0]
    ratio = result.runs[order].metrics.ratio
    keys = sorted(
        (k.id for k in sc.keys),
        key=lambda k: (k not in ratio, ratio.get(k, 0.0), k),
    )
    table = _table(f"admitted ÷ ideal per key (sorted by {order})")
    table.add_column("key")
    table.add_column("weight", justify="right")
    table.add_column("demand", justify="left")
    for name in policies:
        table.add_column(name, justify="right")
    specs = {k.id: k for k in sc.keys}
    for k in keys:
        spec = specs[k]
        cells = []
        for name in policies:
            r = result.runs[name].metrics.ratio.get(k)
            cells.append("-" if r is None else f"{r:.3f}")
        table.add_row(k, f"{sc.weight_of(k):g}", spec.demand.kind, *cells)
    return table


def print_results(results: Sequence[ScenarioResult], console: Console) -> None:
    for result in results:
        console.print(scenario_table(result))
        console.print(ratio_table(result))
        if "active" in result.runs:
            t = meets(result.runs["active"].metrics)
            marks = ", ".join(f"{k.replace('_', ' ')} {'✓' if ok else '✗'}" for k, ok in t.items())
            console.print(f"  active targets ({describe()}): {marks}")
            for policy in ("active", HELD_ENGINE):
                verdict = run_verdict(result, policy)
                if verdict is not None:
                    console.print(f"  {policy}: " + describe_verdict(verdict))
            console.print()
    console.print(
        "[dim]Ideal: weighted dominant-resource-fair over the pool's dimensions of the first "
        "one's window and longer ones, a longer one's budget shared over its windows by the "
        "same filling (max-min fair when one dimension binds). Jain: over keys with demand, "
        "of admitted ÷ ideal in each key's dominant dimension, summed over the run; worst "
        "window: the same per window. Utilisation: admitted ÷ what the ideal hands out in "
        "each window's bottleneck dimension (per dimension: in that one). Overshoot: peak "
        "sliding count above the limit (worst dimension). Well-behaved: keys that never "
        "asked more than their weighted share in a window.[/]"
    )


def print_spreads(rows: Sequence[Spread], console: Console) -> None:
    """One row per scenario and policy: the worst and the median over the seeds."""
    seeds = max((r.seeds for r in rows), default=0)
    table = _table(f"spread over {seeds} seeds")
    # with the gate's column the Jain median makes way (it stays in the JSON): 80 columns
    gated = any(r.gate is not None for r in rows)
    cols = [
        "scenario",
        "policy",
        "Jain\nworst",
        *(() if gated else ("Jain\nmedian",)),
        "worst\nwindow",
        "utilis-\nation\nworst",
        "key ratio\nmin–max",
        "over-\nshoot",
        "every\ntarget",
        *(("gate",) if gated else ()),
    ]
    for col in cols:
        table.add_column(col, justify="left" if col in ("scenario", "policy") else "right")
    table.columns[0].min_width = min(16, max((len(r.scenario) for r in rows), default=0))
    last = None
    for r in rows:
        ok = judge(
            r.jain_min,
            r.worst_window_min,
            r.utilisation_min,
            r.ratio_min,
            r.ratio_max,
            r.overshoot_max,
        )
        gate = "" if r.gate is None else _mark(r.gate == r.seeds, f"{r.gate}/{r.seeds}")
        table.add_row(
            r.scenario if r.scenario != last else "",
            r.policy,
            _mark(ok["jain"], f"{r.jain_min:.4f}"),
            *(() if gated else (f"{r.jain_median:.4f}",)),
            _mark(ok["worst_window"], f"{r.worst_window_min:.3f}"),
            _mark(ok["utilisation"], f"{r.utilisation_min * 100:.1f}%"),
            _mark(ok["key_ratio"], f"{r.ratio_min:.2f}–{r.ratio_max:.2f}"),
            "0" if r.overshoot_max == 0 else _pct(r.overshoot_max),
            _mark(r.meeting == r.seeds, f"{r.meeting}/{r.seeds}"),
            *((gate,) if gated else ()),
        )
        last = r.scenario
    console.print(table)
    console.print(
        "[dim]worst and median over the seeds (the medians of every figure are in the JSON); "
        "worst window: the lowest Jain of a single "
        "window in any seed; key ratio: the lowest and highest admitted ÷ ideal of any key "
        "with demand in any seed; overshoot: the worst of any dimension; every target: the "
        f"runs that meet all of {describe()}; gate: the active runs that pass issue 45's "
        "gate against the best reference run beside them (las, sfq, vtc).[/]"
    )


# -- JSON -----------------------------------------------------------------------------------------


def _clean(value: Any) -> Any:
    """JSON has no infinity; round floats so the file stays readable."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return round(value, 6)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def result_dict(result: ScenarioResult) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for name, run in result.runs.items():
        metrics = asdict(run.metrics)
        metrics["first_block_well_behaved_ms"] = run.metrics.first_block_well_behaved_ms
        metrics["request_overshoot"] = request_overshoot(run.metrics)
        runs[name] = {
            "metrics": metrics,
            "admissions": run.admissions,
            "wall_s": run.wall_s,
            "windows": [
                {
                    "index": w.index,
                    "capacity": w.capacity,
                    "jain": w.jain(),
                    "demand": w.demand,
                    "ideal": w.ideal,
                    "admitted": w.admitted,
                    "bottleneck": w.bottleneck,
                    "dominant": w.dominant,
                    "dimensions": {
                        d: {
                            "capacity": cap,
                            "demand": w.demand_by_dim[d],
                            "ideal": w.ideal_by_dim[d],
                            "admitted": w.admitted_by_dim[d],
                        }
                        for d, cap in w.capacities.items()
                    },
                }
                for w in run.windows
            ],
            "series": {
                "hours": [round(t, 4) for t in run.times_h],
                "usage": {k: [round(v, 2) for v in vs] for k, vs in run.usage.items()},
            },
        }
    out: dict[str, Any] = {
        "scenario": result.scenario.model_dump(mode="json"),
        "seed": result.seed,
        "driver": result.driver,
        "windows": result.windows,
        "capacity_per_window": result.capacity,
        "weighted_shares": result.shares,
        "policies": runs,
    }
    if "active" in result.runs:
        out["active_targets"] = meets(result.runs["active"].metrics)
    for field_name, policy in (("gate", "active"), ("gate_hold", HELD_ENGINE)):
        verdict = run_verdict(result, policy)
        if verdict is not None:
            out[field_name] = {
                "passed": verdict.passed,
                "checks": verdict.checks,
                "bar": asdict(verdict.bar),
                "low_keys": verdict.low_keys,
                "high_keys": verdict.high_keys,
                "distance_to_goal": verdict.distance,
            }
    return _clean(out)  # type: ignore[no-any-return]


def write_json(
    results: Sequence[ScenarioResult], path: Path, spread: Sequence[Spread] = ()
) -> None:
    doc: dict[str, Any] = {
        "targets": {
            "jain": TARGET_JAIN,
            "worst_window": TARGET_WORST_WINDOW,
            "utilisation": TARGET_UTILISATION,
            "key_ratio": list(TARGET_RATIO),
            "overshoot": 0.0,
            "request_overshoot": 0.0,
        },
        "scenarios": [result_dict(r) for r in results],
    }
    if spread:
        doc["spread"] = _clean([asdict(r) for r in spread])
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# -- chart ----------------------------------------------------------------------------------------


#: Above this many keys the chart draws one line and one bar per demand pattern, not per key.
CHART_KEYS = 10


def chart_groups(result: ScenarioResult) -> dict[str, list[str]]:
    """What the chart draws a line and a bar for: each key, or with more than
    :data:`CHART_KEYS` keys each demand pattern (its keys' use summed, their ratios as median
    and range), so 40 keys stay 4 readable lines instead of 40 colours that repeat."""
    keys = result.scenario.keys
    if len(keys) <= CHART_KEYS:
        return {k.id: [k.id] for k in keys}
    out: dict[str, list[str]] = {}
    for k in keys:
        out.setdefault(
            f"{k.demand.kind} ×{sum(1 for x in keys if x.demand.kind == k.demand.kind)}", []
        ).append(k.id)
    return out


def write_chart(result: ScenarioResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sc = result.scenario
    groups = chart_groups(result)
    labels = list(groups)
    colors = {g: plt.get_cmap("tab10")(i % 10) for i, g in enumerate(labels)}
    policies = list(result.runs)
    limit = sc.primary.limit * sc.pool.members
    unit = f"{sc.primary.unit.value}/{sc.primary.window.value}"

    fig = plt.figure(figsize=(13, 7.2), dpi=80)
    grid = fig.add_gridspec(2, max(2, len(policies)), height_ratios=(1.15, 1), hspace=0.42)
    top_axes: list[Any] = []
    for i, name in enumerate(policies):
        ax = fig.add_subplot(grid[0, i], sharey=top_axes[0] if top_axes else None)
        top_axes.append(ax)
        run = result.runs[name]
        total = [sum(vals) for vals in zip(*run.usage.values(), strict=True)]
        ax.plot(run.times_h, total, color="0.55", lw=1.2, label="pool")
        for g, members in groups.items():
            series = [sum(vals) for vals in zip(*(run.usage[k] for k in members), strict=True)]
            ax.plot(run.times_h, series, color=colors[g], lw=1.4, label=g)
        ax.axhline(limit, color="0.2", ls="--", lw=0.9)
        m = run.metrics
        ax.set_title(
            f"{name}: Jain {m.jain:.3f}, util {m.utilisation:.1%}", fontsize=10, loc="left"
        )
        ax.set_xlabel("hours", fontsize=9)
        if i == 0:
            ax.set_ylabel(f"sliding use ({unit})", fontsize=9)
        else:
            ax.tick_params(labelleft=False)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.25)
    top_axes[0].legend(fontsize=7, loc="upper left", ncol=2, framealpha=0.8)
    top_axes[0].set_ylim(0, limit * 1.12)

    half = max(1, len(policies) // 2)
    ax_ratio = fig.add_subplot(grid[1, :half])
    width = 0.8 / max(1, len(labels))
    top = 1.0
    for j, g in enumerate(labels):
        xs = [i + (j - (len(labels) - 1) / 2) * width for i in range(len(policies))]
        lows, mids, highs = [], [], []
        for p in policies:
            rs = [r for k in groups[g] if (r := result.runs[p].metrics.ratio.get(k)) is not None]
            rs = rs or [math.nan]
            lo, mid, hi = min(rs), statistics.median(rs), max(rs)
            lows.append(mid - lo)
            mids.append(mid)
            highs.append(hi - mid)
            top = max(top, hi if math.isfinite(hi) else top)
        many = len(groups[g]) > 1
        ax_ratio.bar(
            xs,
            mids,
            width=width * 0.95,
            color=colors[g],
            label=g,
            yerr=[lows, highs] if many else None,
            capsize=2 if many else 0,
            error_kw={"lw": 0.8},
        )
    ax_ratio.axhline(1.0, color="0.2", ls="--", lw=0.9)
    ax_ratio.set_ylim(0, top * 1.3)
    ax_ratio.set_xticks(range(len(policies)), policies, fontsize=9)
    grouped = any(len(v) > 1 for v in groups.values())
    ax_ratio.set_title(
        "admitted ÷ ideal per key"
        + (" (median, min–max per pattern)" if grouped else " (1 = its max-min fair share)"),
        fontsize=10,
        loc="left",
    )
    ax_ratio.tick_params(labelsize=8)
    ax_ratio.legend(fontsize=7, ncol=min(len(labels), 6), loc="upper center")
    ax_ratio.grid(axis="y", alpha=0.25)

    ax_fair = fig.add_subplot(grid[1, half:])
    pos = list(range(len(policies)))
    jain = [result.runs[p].metrics.jain for p in policies]
    util = [result.runs[p].metrics.utilisation for p in policies]
    ax_fair.bar([x - 0.2 for x in pos], jain, width=0.38, color="#4c72b0", label="Jain's index")
    ax_fair.bar([x + 0.2 for x in pos], util, width=0.38, color="#55a868", label="utilisation")
    for x, jv, uv in zip(pos, jain, util, strict=True):
        ax_fair.text(x - 0.2, jv + 0.005, f"{jv:.3f}", ha="center", fontsize=7)
        ax_fair.text(x + 0.2, uv + 0.005, f"{uv:.1%}", ha="center", fontsize=7)
    ax_fair.axhline(TARGET_JAIN, color="0.2", ls="--", lw=0.9)
    lo = min([*jain, *util, 0.9])
    ax_fair.set_ylim(max(0.0, lo - 0.08), 1.0 + (1.0 - max(0.0, lo - 0.08)) * 0.22)
    ax_fair.set_xticks(pos, policies, fontsize=9)
    ax_fair.set_title(
        f"fairness (target {TARGET_JAIN}), utilisation ({TARGET_UTILISATION})",
        fontsize=10,
        loc="left",
    )
    ax_fair.tick_params(labelsize=8)
    ax_fair.legend(fontsize=7, ncol=2, loc="upper center")
    ax_fair.grid(axis="y", alpha=0.25)

    fig.suptitle(
        f"{sc.name}: {sc.description}  ({limit:g} {unit}, seed {result.seed}, {result.driver})",
        fontsize=11,
        x=0.01,
        ha="left",
    )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    _write_small_png(buf.getvalue(), path)


def _write_small_png(png: bytes, path: Path) -> None:
    """A line chart needs few colours: a 128-colour palette PNG is a third of the size and
    looks the same (Pillow comes with matplotlib)."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - matplotlib depends on Pillow
        path.write_bytes(png)
        return
    with Image.open(io.BytesIO(png)) as img:
        small = img.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
        small.save(path, format="PNG", optimize=True)
