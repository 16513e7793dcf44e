"""Proxy overhead, measured side by side in one run with one load generator:

(a) direct to the mock upstream, (b) through a bare aiohttp pass-through proxy (written here: the
floor for a Python proxy), (c) through fairgate with quota admission on (SQLite store, a pool
with requests and tokens dimensions). Non-stream and stream, fixed concurrency.
Prints requests/s and p50/p99 latency, and fairgate's added latency and its throughput relative
to the bare pass-through. Each server is its own process; absolute numbers are this machine's.

Run: ``.venv/bin/python benchmarks/proxy_overhead.py [--requests N] [--concurrency C]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
from aiohttp import web

SECRET = "bench-upstream-secret"
CLIENT_KEY = "fg-bench-client-key-0001"
ADMIN = "fg-bench-admin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError as exc:
            if getattr(exc, "code", None):
                return
            time.sleep(0.05)
    raise RuntimeError(f"{url} not ready")


# -- (b) the bare pass-through, run as its own process via ``--bare PORT UPSTREAM`` ----------


def run_bare(port: int, upstream: str) -> None:
    async def main() -> None:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )

        async def handler(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            async with session.post(
                upstream + request.path,
                data=body,
                headers={"content-type": "application/json", "authorization": f"Bearer {SECRET}"},
            ) as up:
                resp = web.StreamResponse(
                    status=up.status, headers={"content-type": up.headers["content-type"]}
                )
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp

        app = web.Application()
        app.router.add_post("/{tail:.*}", handler)
        app.router.add_get("/ready", lambda r: web.Response(text="ok"))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


# -- load generator ---------------------------------------------------------------------------


async def load(url: str, n: int, conc: int, stream: bool, key: str) -> tuple[float, list[float]]:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "benchmark"}],
        "max_tokens": 16,
        "stream": stream,
    }
    headers = {"authorization": f"Bearer {key}"}
    lat: list[float] = []
    failures = 0

    async def worker(session: aiohttp.ClientSession, jobs: Iterator[int]) -> None:
        nonlocal failures
        for _ in jobs:
            t = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    failures += 1
            lat.append((time.perf_counter() - t) * 1000)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        warm = iter(range(min(200, n)))  # connections, caches
        await asyncio.gather(*(worker(session, warm) for _ in range(conc)))
        lat.clear()
        jobs = iter(range(n))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session, jobs) for _ in range(conc)))
        elapsed = time.perf_counter() - t0
    if failures:
        raise RuntimeError(f"{failures} requests failed against {url}")
    return n / elapsed, sorted(lat)


def pct(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "--bare":
        run_bare(int(sys.argv[2]), sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()

    py = sys.executable
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp(prefix="fairgate-bench-"))
    try:
        mport, bport, fport = free_port(), free_port(), free_port()
        mock = f"http://127.0.0.1:{mport}"
        procs.append(
            subprocess.Popen(
                [py, "-m", "fairgate", "mock-upstream", "--port", str(mport), "--secret", SECRET],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        )
        wait_http(mock + "/_mock/stats")
        procs.append(
            subprocess.Popen(
                [py, __file__, "--bare", str(bport), mock + ""],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        )
        wait_http(f"http://127.0.0.1:{bport}/ready")
        cfg = tmp / "bench.yaml"
        cfg.write_text(
            "connections:\n"
            f"  - {{id: m1, provider: mock, base_url: '{mock}/v1', secret: '{SECRET}',"
            " models: [gpt-4o-mini]}\n"
            f"keys:\n  - {{id: bench, name: bench, secret: '{CLIENT_KEY}'}}\n"
            "pools:\n  - id: bp\n    name: bench\n    connections: [m1]\n"
            "    dimensions: [{unit: requests, window: hourly, limit: 1e12},"
            " {unit: tokens, window: hourly, limit: 1e15}]\n"
            "    allocations: [{key: bench, weight: 100}]\n"
        )
        env = {**os.environ, "FAIRGATE_ADMIN_KEY": ADMIN}
        procs.append(
            subprocess.Popen(
                [
                    py,
                    "-m",
                    "fairgate",
                    "serve",
                    "--config",
                    str(cfg),
                    "--port",
                    str(fport),
                    "--data-dir",
                    str(tmp / "data"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                env=env,
            )
        )
        wait_http(f"http://127.0.0.1:{fport}/health")
        targets = [
            ("direct to mock", mock, SECRET),
            ("bare aiohttp proxy", f"http://127.0.0.1:{bport}", SECRET),
            ("fairgate", f"http://127.0.0.1:{fport}", CLIENT_KEY),
        ]
        results: dict[tuple[str, bool], tuple[float, list[float]]] = {}
        for stream in (False, True):
            for name, url, key in targets:
                print(f"  {name:<20} {'stream' if stream else 'non-stream'} ...", flush=True)
                results[(name, stream)] = asyncio.run(
                    load(url, args.requests, args.concurrency, stream, key)
                )
        print()
        print(f"{args.requests} requests per row, concurrency {args.concurrency}, this machine")
        print(f"{'path':<20} {'mode':<11} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8}")
        for stream in (False, True):
            base = results[("direct to mock", stream)][1]
            for name, _, _ in targets:
                rps, lat = results[(name, stream)]
                print(
                    f"{name:<20} {'stream' if stream else 'non-stream':<11} {rps:8.0f} "
                    f"{pct(lat, 0.5):8.2f} {pct(lat, 0.99):8.2f} "
                    f"{pct(lat, 0.5) - pct(base, 0.5):8.2f}"
                )
        print()
        for stream in (False, True):
            f_rps, f_lat = results[("fairgate", stream)]
            b_rps, b_lat = results[("bare aiohttp proxy", stream)]
            mode = "stream" if stream else "non-stream"
            print(
                f"fairgate vs bare pass-through ({mode}): throughput "
                f"{f_rps / b_rps * 100:.0f} %, added p50 vs bare "
                f"{pct(f_lat, 0.5) - pct(b_lat, 0.5):.2f} ms, "
                f"mean added vs bare {statistics.fmean(f_lat) - statistics.fmean(b_lat):.2f} ms"
            )
        # added latency without queueing: one request at a time
        print("\nadded latency at concurrency 1 (no queueing), p50 vs direct to the mock:")
        for stream in (False, True):
            lat1 = {
                name: asyncio.run(load(url, max(500, args.requests // 4), 1, stream, key))[1]
                for name, url, key in targets
            }
            base1 = pct(lat1["direct to mock"], 0.5)
            mode = "stream" if stream else "non-stream"
            print(
                f"  {mode:<11} bare +{pct(lat1['bare aiohttp proxy'], 0.5) - base1:.3f} ms, "
                f"fairgate +{pct(lat1['fairgate'], 0.5) - base1:.3f} ms "
                f"(fairgate p99 {pct(lat1['fairgate'], 0.99):.2f} ms)"
            )
        print("targets: fairgate's added p50 ≤ 1 ms; throughput ≥ 60 % of the bare pass-through")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
