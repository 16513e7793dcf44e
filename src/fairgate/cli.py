"""The ``fairgate`` command line."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fairgate import __version__
from fairgate.clock import ManualClock
from fairgate.quota.catalog import CATALOG
from fairgate.quota.engine import QuotaEngine
from fairgate.quota.model import Allocation, Dimension, Policy, Pool
from fairgate.quota.units import Unit, Window

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="fairgate: an LLM gateway that shares upstream quota fairly.",
)
console = Console()


@app.command()
def version() -> None:
    """Print the version."""
    console.print(f"fairgate {__version__}")


@app.command()
def plans() -> None:
    """Show the built-in plan catalog (limit 0 = unknown: configure it per connection)."""
    table = Table(title="Known provider plans")
    table.add_column("provider")
    table.add_column("dimensions")
    for provider, dims in sorted(CATALOG.items()):
        table.add_row(
            provider,
            ", ".join(
                f"{d.unit}/{d.window}/{d.limit:g}" if d.known else f"{d.unit}/{d.window}/?"
                for d in dims
            ),
        )
    console.print(table)


@app.command()
def demo(
    data_dir: Annotated[
        Path | None, typer.Option(help="Where the demo's SQLite file goes (default: a temp dir).")
    ] = None,
) -> None:
    """Three keys share a 100 requests/hour pool; watch the engine decide, on the real store."""
    if data_dir is None:
        with tempfile.TemporaryDirectory(prefix="fairgate-demo-") as tmp:
            asyncio.run(_engine_demo(Path(tmp)))
    else:
        data_dir.mkdir(parents=True, exist_ok=True)
        asyncio.run(_engine_demo(data_dir))


async def _engine_demo(data_dir: Path) -> None:
    from fairgate.store.sqlite import SqliteQuotaStore

    clock = ManualClock(1_700_002_800_000)
    store = SqliteQuotaStore(data_dir / "quota.sqlite")
    engine = QuotaEngine(store, clock=clock)
    pool = Pool(
        id="demo",
        name="demo pool",
        provider="mock",
        connections=("mock-1",),
        dimensions=(Dimension(Unit.REQUESTS, Window.HOURLY, 100),),
        allocations=(
            Allocation("alice", 50, policy=Policy.HARD),
            Allocation("bob", 30, policy=Policy.SOFT),
            Allocation("carol", 20, policy=Policy.HARD),
        ),
    )
    console.print(
        "[bold]Pool[/] 100 requests/hour shared by alice (50 %, hard), bob (30 %, soft), "
        "carol (20 %, hard); strict mode from 50 % pool use."
    )
    phases = [("alice", 70), ("bob", 40), ("carol", 25), ("alice", 10)]
    table = Table(title="Decisions (one minute apart per phase)")
    for col in ("phase", "key", "sent", "allowed", "penalised", "blocked", "first block"):
        table.add_column(col)
    for i, (key, n) in enumerate(phases, start=1):
        allowed = penalised = blocked = 0
        first = ""
        for _ in range(n):
            adm = await engine.admit(pool, key, {Unit.REQUESTS: 1})
            if adm.allowed:
                allowed += 1
                penalised += int(adm.penalized)
                await engine.settle(adm.ticket, {Unit.REQUESTS: 1})
            else:
                blocked += 1
                if not first and adm.reason is not None:
                    secs = (adm.retry_after_ms or 0) / 1000
                    first = f"{adm.reason.value}, retry in {secs:,.0f}s"
        table.add_row(str(i), key, str(n), str(allowed), str(penalised), str(blocked), first)
        clock.advance(60_000)
    console.print(table)
    usage = await engine.usage(pool)
    dim = usage.dimensions[0]
    t2 = Table(
        title=f"Pool usage: {dim.total:.0f}/{dim.limit:.0f} {dim.key}"
        f" ({'strict' if dim.strict else 'generous'})"
    )
    for col in ("key", "weight", "policy", "consumed", "fair share", "surplus", "borrowing"):
        t2.add_column(col)
    for k in dim.keys:
        t2.add_row(
            k.key_id,
            f"{k.weight:g} %",
            k.policy,
            f"{k.consumed:.1f}",
            f"{k.fair_share:.0f}",
            f"{k.surplus:+.1f}",
            "yes" if k.borrowing else "",
        )
    console.print(t2)
    await store.close()


def main() -> None:
    app()
