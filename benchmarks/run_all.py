"""Every benchmark in one run, one table: what fairgate costs, measured side by side.

- admission µs per admit+settle: the pure decision, the SQLite and the Redis driver
  (``benchmarks/admission.py``), and how it scales from 10 to 100,000 keys in a pool;
- proxy overhead: direct to the mock upstream vs a bare aiohttp pass-through vs fairgate, non-stream
  and stream, under load and one request at a time (``benchmarks/proxy_overhead.py``);
- time to first token added on streams (first body byte, one stream at a time);
- scaling with client connections (1 → 100 concurrent) against the bare pass-through;
- memory: RSS of a gateway whose pool has 10,000 more allocations than another (idle, then after
  each key sent a request), and RSS added by 1,000 streams held open at once (slow mock).

Ratios (fairgate vs bare, vs direct, 100,000 keys vs 10) come from one run on one machine and are
the figures to compare; absolute numbers are this machine's and are labelled so. Every server is
its own process, the load generator too, all on the same cores.

Run: ``.venv/bin/python benchmarks/run_all.py [--quick] [--json PATH]`` (``--quick``: a smoke run
of a minute or two with smaller sizes, memory figures scaled up and marked so).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

import admission  # a sibling script, not a package
import proxy_overhead as po

BODY = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "benchmark"}],
    "max_tokens": 16,
}


@dataclass
class Results:
    """Rows of the final table: (section, measure, value, note), plus raw numbers for JSON."""

    rows: list[tuple[str, str, str, str]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def add(self, section: str, measure: str, value: str, note: str = "") -> None:
        self.rows.append((section, measure, value, note))


def machine() -> str:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs, {cpu or 'unknown CPU'}, Python {platform.python_version()}"


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def mock_config(mock: str, **changes: object) -> None:
    po.post_json(mock + "/_mock/config", changes)


# -- time to first token ------------------------------------------------------------------------


async def first_byte_ms(url: str, key: str, n: int) -> list[float]:
    """Sequential streams: ms from sending the request to the first body bytes (the first
    SSE event, i.e. the first token's chunk)."""
    out: list[float] = []
    headers = {"authorization": f"Bearer {key}"}
    body = {**BODY, "stream": True}
    async with aiohttp.ClientSession() as session:
        for i in range(n + 20):
            t = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                if r.status != 200:
                    raise RuntimeError(f"stream failed against {url}: {r.status}")
                await r.content.readany()
                first = (time.perf_counter() - t) * 1000
                await r.read()
            if i >= 20:  # warm-up: connections, caches
                out.append(first)
    return sorted(out)


# -- streams held open ----------------------------------------------------------------------------


async def open_streams(url: str, key: str, n: int, pid: int, mock: str) -> tuple[int, int]:
    """RSS (kB) of ``pid`` before and while ``n`` streams are open at once (each has received
    its first event and waits for the next, the mock pausing 2 s between events)."""
    before = rss_kb(pid)
    mock_config(mock, chunk_delay_ms=2000)
    headers = {"authorization": f"Bearer {key}"}
    body = {**BODY, "stream": True}
    started = 0
    all_open = asyncio.Event()

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal started
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
            if r.status != 200:
                raise RuntimeError(f"stream refused: {r.status}")
            await r.content.readany()
            started += 1
            if started == n:
                all_open.set()
            await all_open.wait()
            await asyncio.sleep(1.5)  # stay open while the gateway's RSS is read

    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=300)
        ) as session:
            tasks = [asyncio.create_task(one(session)) for _ in range(n)]
            await asyncio.wait_for(all_open.wait(), timeout=240)
            await asyncio.sleep(0.5)
            during = rss_kb(pid)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        mock_config(mock, chunk_delay_ms=0)
    return before, during


# -- memory per key -----------------------------------------------------------------------------


async def send_each_key(url: str, keys: list[str], conc: int = 32) -> None:
    it = iter(keys)
    failures = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal failures
        for key in it:
            headers = {"authorization": f"Bearer {key}"}
            async with session.post(url + "/v1/chat/completions", json=BODY, headers=headers) as r:
                await r.read()
                failures += r.status != 200

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker(session) for _ in range(conc)))
    if failures:
        raise RuntimeError(f"{failures} of {len(keys)} per-key requests failed")


def memory_per_keys(mock: str, tmp: Path, n_keys: int) -> dict[str, float]:
    """RSS of two fresh gateways, identical but for ``n_keys`` extra allocations in the pool:
    idle after the same warm-up, then after each extra key sent one request."""
    out: dict[str, float] = {}
    procs = []
    try:
        base_url, base = po.start_fairgate(mock, tmp, "mem0", 0)
        procs.append(base)
        t0 = time.perf_counter()
        big_url, big = po.start_fairgate(mock, tmp, "memN", n_keys)
        procs.append(big)
        out["startup_s"] = time.perf_counter() - t0
        for url in (base_url, big_url):
            asyncio.run(po.load(url, 200, 8, False, po.CLIENT_KEY))
        time.sleep(1.0)
        out["base_kb"] = rss_kb(base.pid)
        out["idle_kb"] = rss_kb(big.pid)
        asyncio.run(send_each_key(big_url, [po.extra_key_secret(i) for i in range(n_keys)]))
        time.sleep(1.0)
        out["active_kb"] = rss_kb(big.pid)
    finally:
        po.stop(procs)
    return out


async def _heap_after_start(n_keys: int) -> dict[str, float]:
    """Python objects (tracemalloc) a started gateway holds with ``n_keys`` extra keys, by
    where they were allocated. Run in a child process (``--heap-keys N``) so that nothing else
    is traced."""
    import gc
    import tempfile
    import tracemalloc

    from fairgate.config import load_config_text
    from fairgate.process.state import Gateway

    tmp = Path(tempfile.mkdtemp(prefix="fairgate-heap-"))
    text = po.bench_config("http://127.0.0.1:9", n_keys)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    gw = Gateway(data_dir=tmp, config=load_config_text(text), env={})
    await gw.start()
    del text
    gc.collect()
    after = tracemalloc.take_snapshot()
    groups = {
        "config (pydantic models)": "pydantic",
        "key records (db/keys.py)": "fairgate/db/keys.py",
        "pool records (db/pools.py)": "fairgate/db/pools.py",
        "registry + quota model": ("fairgate/snapshot.py", "fairgate/quota/"),
    }
    out: dict[str, float] = {"total": 0.0}
    for stat in after.compare_to(before, "filename"):
        size = float(stat.size_diff)
        out["total"] += size
        name = stat.traceback[0].filename
        for label, pat in groups.items():
            pats = pat if isinstance(pat, tuple) else (pat,)
            if any(x in name for x in pats):
                out[label] = out.get(label, 0.0) + size
    await gw.stop()
    return out


def heap_per_keys(n_keys: int) -> dict[str, float]:
    import subprocess

    def child(n: int) -> dict[str, float]:
        cmd = [sys.executable, __file__, "--heap-keys", str(n)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
        last = done.stdout.strip().splitlines()[-1]
        return dict(json.loads(last))

    base, big = child(0), child(n_keys)
    return {k: big.get(k, 0.0) - base.get(k, 0.0) for k in big}


# -- the run --------------------------------------------------------------------------------------


def run(quick: bool, console: Console) -> Results:
    res = Results()
    res.raw["machine"] = machine()
    res.raw["quick"] = quick
    url = os.environ.get("FAIRGATE_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"

    # 1. admission and scaling with keys
    sizes = [10, 1000, 10_000] if quick else [10, 1000, 10_000, 100_000]
    ops = 400 if quick else 3000
    console.print(f"[bold]admission[/] ({', '.join(f'{n:,}' for n in sizes)} keys)")
    rows, trips = asyncio.run(admission.measure(sizes, ops, url))
    res.raw["admission"] = [
        {"path": p, "keys": n, "mean_us": m, "p99_us": None if math.isnan(q) else q}
        for p, n, m, q in rows
    ]
    res.raw["redis_round_trips"] = trips
    first = {p: m for p, n, m, _ in rows if n == sizes[0]}
    paths = (
        "pure decision",
        admission.SQLITE_TX,
        admission.SQLITE_MEMORY,
        "redis admit+settle",
    )
    for path in paths:
        r = [x for x in rows if x[0] == path]
        if not r:
            res.add("admission", path, "not measured", "Redis not reachable")
            continue
        _p, n0, m0, q0 = r[0]
        p99 = "" if math.isnan(q0) else f", p99 {q0:.0f} µs"
        res.add("admission", f"{path}, {n0} keys", f"{m0:.1f} µs", f"this machine{p99}")
    for path in paths:
        r = [x for x in rows if x[0] == path]
        if r:
            _p, n1, m1, _q = r[-1]
            res.add(
                "scaling: keys",
                f"{path}, {sizes[0]} → {n1:,} keys",
                f"{m1 / first[path]:.2f}×",
                f"{m1:.1f} µs at {n1:,}",
            )
    if trips is not None:
        res.add("admission", "Redis round trips per admit", f"{trips[0]:.2f}", "EVALSHA calls")

    requests = 300 if quick else 3000
    conc = 16
    with po.servers() as srv:
        # 2. proxy overhead
        console.print(
            f"[bold]proxy overhead[/] ({requests} requests per row, concurrency {conc}"
            f"{'' if quick else ', median of 3 rounds'})"
        )
        o = po.measure(srv, requests, conc, progress=False, rounds=1 if quick else 3)
        res.raw["proxy"] = {
            f"{name}|{'stream' if s else 'non-stream'}": {
                "rps": o.rps(name, s),
                "p50_ms": o.p50(name, s),
                "p99_ms": po.pct(o.loaded[(name, s)][1], 0.99),
                "p50_ms_concurrency_1": o.p50(name, s, single=True),
            }
            for name, _u, _k in srv.targets()
            for s in (False, True)
        }
        for s in (False, True):
            mode = "stream" if s else "non-stream"
            d1 = o.p50("direct to mock", s, True)
            b1 = o.p50("bare aiohttp proxy", s, True)
            f1 = o.p50("fairgate", s, True)
            res.add(
                "proxy overhead",
                f"{mode}: added p50, one request at a time",
                f"+{f1 - d1:.2f} ms vs direct",
                f"+{f1 - b1:.2f} ms vs bare (bare +{b1 - d1:.2f} ms vs direct)",
            )
            res.add(
                "proxy overhead",
                f"{mode}: throughput at concurrency {conc}",
                f"{o.rps('fairgate', s) / o.rps('bare aiohttp proxy', s):.0%} of bare",
                f"{o.rps('fairgate', s) / o.rps('direct to mock', s):.0%} of direct; "
                f"fairgate {o.rps('fairgate', s):.0f} req/s (this machine)",
            )
            res.add(
                "proxy overhead",
                f"{mode}: added p50 at concurrency {conc}",
                f"+{o.p50('fairgate', s) - o.p50('bare aiohttp proxy', s):.2f} ms vs bare",
                f"+{o.p50('fairgate', s) - o.p50('direct to mock', s):.2f} ms vs direct",
            )

        # 3. time to first token
        n_ttft = 100 if quick else 500
        console.print(f"[bold]time to first token[/] ({n_ttft} streams each)")
        ttft = {name: asyncio.run(first_byte_ms(u, k, n_ttft)) for name, u, k in srv.targets()}
        d, b, f = (statistics.median(ttft[n]) for n, _u, _k in srv.targets())
        res.raw["ttft_p50_ms"] = {n: statistics.median(v) for n, v in ttft.items()}
        res.add(
            "streams",
            "time to first token added (p50)",
            f"+{f - d:.2f} ms vs direct",
            f"+{f - b:.2f} ms vs bare; direct {d:.2f} ms (this machine)",
        )

        # 4. scaling with connections
        levels = [1, 10, 100]
        n_conn = 300 if quick else 1500
        console.print(f"[bold]connections[/] {levels} ({n_conn} requests each)")
        scale: dict[str, dict[int, tuple[float, float]]] = {}
        rounds = 1 if quick else 3
        for c in levels:
            tries: dict[str, list[tuple[float, float]]] = {}
            for _ in range(rounds):  # bare and fairgate take turns; each keeps its median
                for name, u, k in srv.targets()[1:]:
                    rps, lat = asyncio.run(po.load(u, max(n_conn, 2 * c), c, False, k))
                    tries.setdefault(name, []).append((rps, po.pct(lat, 0.5)))
            for name, v in tries.items():
                scale.setdefault(name, {})[c] = sorted(v)[len(v) // 2]
        res.raw["connections"] = {
            n: {str(c): {"rps": v[0], "p50_ms": v[1]} for c, v in d_.items()}
            for n, d_ in scale.items()
        }
        for c in levels:
            f_rps, f_p50 = scale["fairgate"][c]
            b_rps, b_p50 = scale["bare aiohttp proxy"][c]
            res.add(
                "scaling: connections",
                f"{c} concurrent, non-stream",
                f"{f_rps / b_rps:.0%} of bare",
                f"fairgate {f_rps:.0f} req/s, p50 {f_p50:.1f} ms; bare p50 {b_p50:.1f} ms "
                "(this machine)",
            )

        # 5. streams held open
        n_streams = 200 if quick else 1000
        console.print(f"[bold]memory[/]: {n_streams} streams held open")
        before, during = asyncio.run(
            open_streams(srv.fairgate, po.CLIENT_KEY, n_streams, srv.fairgate_pid, srv.mock)
        )
        per_1000 = (during - before) * 1000 / n_streams
        res.raw["streams_open"] = {"n": n_streams, "rss_before_kb": before, "rss_kb": during}
        res.add(
            "memory",
            "RSS per 1,000 in-flight streams",
            f"{per_1000 / 1024:.1f} MiB",
            f"{n_streams} open: {before / 1024:.0f} → {during / 1024:.0f} MiB"
            + (" (scaled to 1,000)" if n_streams != 1000 else ""),
        )

        # 6. memory per 10,000 keys
        n_keys = 1000 if quick else 10_000
        console.print(f"[bold]memory[/]: a pool with {n_keys:,} more allocations")
        mem = memory_per_keys(srv.mock, srv.tmp, n_keys)
        res.raw["keys_memory"] = {"n": n_keys, **mem}
        scale_k = 10_000 / n_keys
        note = " (scaled to 10,000)" if n_keys != 10_000 else ""
        res.add(
            "memory",
            "RSS per 10,000 keys, configured (idle)",
            f"{(mem['idle_kb'] - mem['base_kb']) * scale_k / 1024:.1f} MiB",
            f"{mem['base_kb'] / 1024:.0f} MiB with 1 key → {mem['idle_kb'] / 1024:.0f} MiB" + note,
        )
        heap = heap_per_keys(n_keys)
        res.raw["keys_heap_bytes"] = {"n": n_keys, **heap}
        parts = ", ".join(f"{k} {v * scale_k / 2**20:.1f}" for k, v in heap.items() if k != "total")
        res.add(
            "memory",
            "Python heap per 10,000 keys (tracemalloc)",
            f"{heap['total'] * scale_k / 2**20:.1f} MiB",
            f"of which {parts} MiB{note}",
        )
        res.add(
            "memory",
            "RSS per 10,000 keys, each sent a request",
            f"{(mem['active_kb'] - mem['base_kb']) * scale_k / 1024:.1f} MiB",
            f"{mem['active_kb'] / 1024:.0f} MiB; startup with them {mem['startup_s']:.1f} s" + note,
        )
    return res


def print_table(res: Results, console: Console) -> None:
    mode = "quick smoke run" if res.raw.get("quick") else "full run"
    table = Table(
        title=f"fairgate benchmarks ({mode}); this machine: {res.raw['machine']}",
        title_justify="left",
    )
    table.add_column("section")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("note")
    last = ""
    for section, measure, value, note in res.rows:
        table.add_row(section if section != last else "", measure, value, note)
        last = section
    console.print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a short smoke run, smaller sizes")
    ap.add_argument("--json", type=Path, help="also write every number to this JSON file")
    ap.add_argument("--heap-keys", type=int, help=argparse.SUPPRESS)  # internal: child process
    args = ap.parse_args()
    if args.heap_keys is not None:
        import logging

        logging.disable(logging.CRITICAL)
        print(json.dumps(asyncio.run(_heap_after_start(args.heap_keys))))
        return
    console = Console()
    t0 = time.perf_counter()
    res = run(args.quick, console)
    res.raw["seconds"] = time.perf_counter() - t0
    # a wide table reads better than a wrapped one, even in a pipe or a log file
    print_table(res, Console(width=max(150, console.width)))
    if args.json is not None:
        args.json.write_text(json.dumps(res.raw, indent=1) + "\n")
        console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
