"""Proxy overhead, measured side by side in one run with one load generator:

(a) direct to the mock upstream, (b) through a bare aiohttp pass-through proxy (written here: the
floor for a Python proxy), (c) through fairgate with quota admission on (SQLite store, a pool
with requests and tokens dimensions). Non-stream and stream, fixed concurrency.
Prints requests/s and p50/p99 latency, and fairgate's added latency and its throughput relative
to the bare pass-through. Each server is its own process; absolute numbers are this machine's.

Run: ``.venv/bin/python benchmarks/proxy_overhead.py [--requests N] [--concurrency C]``.
``benchmarks/run_all.py`` reuses :func:`servers` and :func:`measure` (the numbers, no printing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from callgrind_support import chat_body

SECRET = "bench-upstream-secret"
CLIENT_KEY = "fg-bench-client-key-0001"
ADMIN = "fg-bench-admin-0123456789abcdef01234567"


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


def post_json(url: str, payload: object) -> None:
    req = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=5):
        pass


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

        async def ready(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app.router.add_get("/ready", ready)
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
    body = chat_body(stream, "benchmark", 16)
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


@dataclass
class Servers:
    """The three endpoints of one run, each its own process: mock, bare pass-through, fairgate."""

    mock: str
    bare: str
    fairgate: str
    fairgate_pid: int
    tmp: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def targets(self) -> list[tuple[str, str, str]]:
        """(name, base URL, API key) in the order the results are printed."""
        return [
            ("direct to mock", self.mock, SECRET),
            ("bare aiohttp proxy", self.bare, SECRET),
            ("fairgate", self.fairgate, CLIENT_KEY),
        ]


def extra_key_secret(i: int) -> str:
    return f"fg-bench-extra-key-{i:06d}"


def bench_config(mock: str, extra_keys: int = 0, pool: bool = True) -> str:
    """The gateway's config: one mock connection, the bench key, and ``extra_keys`` more keys
    with allocations in the same pool (for the memory-per-key figure). ``pool=False``: no quota
    pool at all (the key may use the connection without an allocation), the floor of a
    governed request's cost."""
    if not pool:
        return (
            "server: {require_allocation: false}\n"
            "connections:\n"
            f"  - {{id: m1, provider: mock, base_url: '{mock}/v1', secret: '{SECRET}',"
            " models: [gpt-4o-mini]}\n"
            f"keys:\n  - {{id: bench, name: bench, secret: '{CLIENT_KEY}'}}\n"
        )
    weight = 100 / (1 + extra_keys)
    keys = [f"  - {{id: bench, name: bench, secret: '{CLIENT_KEY}'}}"]
    allocs = [f"      - {{key: bench, weight: {weight:g}}}"]
    for i in range(extra_keys):
        keys.append(f"  - {{id: k{i}, name: k{i}, secret: '{extra_key_secret(i)}'}}")
        allocs.append(f"      - {{key: k{i}, weight: {weight:g}}}")
    return (
        "connections:\n"
        f"  - {{id: m1, provider: mock, base_url: '{mock}/v1', secret: '{SECRET}',"
        " models: [gpt-4o-mini]}\n"
        "keys:\n" + "\n".join(keys) + "\n"
        "pools:\n  - id: bp\n    name: bench\n    connections: [m1]\n"
        "    dimensions: [{unit: requests, window: hourly, limit: 1e12},"
        " {unit: tokens, window: hourly, limit: 1e15}]\n"
        "    allocations:\n" + "\n".join(allocs) + "\n"
    )


def start_fairgate(
    mock: str,
    tmp: Path,
    name: str = "fg",
    extra_keys: int = 0,
    extra_env: dict[str, str] | None = None,
    pool: bool = True,
    workers: int = 1,
) -> tuple[str, subprocess.Popen[bytes]]:
    """A fairgate process (``workers`` > 1: ``serve --workers N``, one port) on a free port in
    front of ``mock``; returns its URL and process."""
    return serve_config(bench_config(mock, extra_keys, pool=pool), tmp, name, extra_env, workers)


def serve_config(
    config_yaml: str,
    tmp: Path,
    name: str = "fg",
    extra_env: dict[str, str] | None = None,
    workers: int = 1,
) -> tuple[str, subprocess.Popen[bytes]]:
    """A fairgate process on ``config_yaml`` (written to ``tmp/<name>.yaml``, its data dir
    ``tmp/<name>-data``) on a free port, once it answers ``/health``: its URL and process."""
    port = free_port()
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(config_yaml)
    # the per-key flood guard (1,000 requests/s by default) would cap the one bench key
    env = {**os.environ, "FAIRGATE_ADMIN_KEY": ADMIN, "FAIRGATE_KEY_RATE_PER_S": "0"}
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "fairgate", "serve", "--config", str(cfg)]
    cmd += ["--port", str(port), "--data-dir", str(tmp / f"{name}-data")]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", timeout=180)
    except BaseException:
        stop([proc])
        raise
    return url, proc


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def start_mock() -> tuple[str, subprocess.Popen[bytes]]:
    """The mock upstream on a free port, its rate-limit headers set out of reach (they count
    every request of a run, direct and bare too, and a benchmark must not trip the gateway's
    provider-signal backoff); returns its URL and process."""
    port = free_port()
    mock = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "fairgate", "mock-upstream", "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--secret", SECRET],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_http(mock + "/_mock/stats")
        post_json(mock + "/_mock/config", {"requests_limit": 10**12, "tokens_limit": 10**15})
    except BaseException:
        stop([proc])
        raise
    return mock, proc


def start_bare(mock: str) -> tuple[str, subprocess.Popen[bytes]]:
    """The bare aiohttp pass-through (this file run with ``--bare``) in front of ``mock``."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--bare", str(port), mock],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/ready")
    except BaseException:
        stop([proc])
        raise
    return url, proc


def start_mock_and_bare(
    procs: list[subprocess.Popen[bytes]],
) -> tuple[str, subprocess.Popen[bytes], str, subprocess.Popen[bytes]]:
    """The mock upstream and the bare pass-through in front of it (URL and process of each),
    each added to ``procs`` as soon as it runs, so that the caller's ``stop`` ends both even
    when what starts next fails."""
    mock, mproc = start_mock()
    procs.append(mproc)
    bare, bproc = start_bare(mock)
    procs.append(bproc)
    return mock, mproc, bare, bproc


@contextmanager
def servers() -> Iterator[Servers]:
    """Start the mock upstream, the bare pass-through and fairgate; stop them afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp(prefix="fairgate-bench-"))
    try:
        mock, _, bare, _ = start_mock_and_bare(procs)
        url, proc = start_fairgate(mock, tmp)
        procs.append(proc)
        yield Servers(mock, bare, url, proc.pid, tmp, procs)
    finally:
        stop(procs)


@dataclass(frozen=True)
class Overhead:
    """Everything :func:`measure` found; latencies in ms, sorted."""

    requests: int
    concurrency: int
    loaded: dict[tuple[str, bool], tuple[float, list[float]]]  # (target, stream) → (rps, lat)
    single: dict[tuple[str, bool], list[float]]  # concurrency 1: (target, stream) → lat

    def p50(self, name: str, stream: bool, single: bool = False) -> float:
        lat = self.single[(name, stream)] if single else self.loaded[(name, stream)][1]
        return pct(lat, 0.5)

    def rps(self, name: str, stream: bool) -> float:
        return self.loaded[(name, stream)][0]


def measure(
    srv: Servers, requests: int, concurrency: int, progress: bool = True, rounds: int = 1
) -> Overhead:
    """Load every target (non-stream and stream) at ``concurrency``, then one at a time.

    With ``rounds`` > 1 the loaded runs are repeated, the targets taking turns, and each keeps
    its median round (by throughput): on a small machine the load generator and three servers
    share the cores, and one unlucky round should not decide a ratio."""
    runs: dict[tuple[str, bool], list[tuple[float, list[float]]]] = {}
    for r in range(rounds):
        for stream in (False, True):
            for name, url, key in srv.targets():
                if progress:
                    mode = "stream" if stream else "non-stream"
                    print(f"  {name:<20} {mode:<11} round {r + 1}/{rounds} ...", flush=True)
                result = asyncio.run(load(url, requests, concurrency, stream, key))
                runs.setdefault((name, stream), []).append(result)
    loaded = {k: sorted(v, key=lambda x: x[0])[len(v) // 2] for k, v in runs.items()}
    single: dict[tuple[str, bool], list[float]] = {}
    for stream in (False, True):
        for name, url, key in srv.targets():
            single[(name, stream)] = asyncio.run(
                load(url, max(500, requests // 4), 1, stream, key)
            )[1]
    return Overhead(requests, concurrency, loaded, single)


def report(o: Overhead) -> None:
    names = ["direct to mock", "bare aiohttp proxy", "fairgate"]
    print()
    print(f"{o.requests} requests per row, concurrency {o.concurrency}, this machine")
    print(f"{'path':<20} {'mode':<11} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8}")
    for stream in (False, True):
        base = o.loaded[("direct to mock", stream)][1]
        for name in names:
            rps, lat = o.loaded[(name, stream)]
            print(
                f"{name:<20} {'stream' if stream else 'non-stream':<11} {rps:8.0f} "
                f"{pct(lat, 0.5):8.2f} {pct(lat, 0.99):8.2f} "
                f"{pct(lat, 0.5) - pct(base, 0.5):8.2f}"
            )
    print()
    for stream in (False, True):
        f_rps, f_lat = o.loaded[("fairgate", stream)]
        b_rps, b_lat = o.loaded[("bare aiohttp proxy", stream)]
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
        base1 = o.p50("direct to mock", stream, single=True)
        mode = "stream" if stream else "non-stream"
        print(
            f"  {mode:<11} bare +{o.p50('bare aiohttp proxy', stream, True) - base1:.3f} ms, "
            f"fairgate +{o.p50('fairgate', stream, True) - base1:.3f} ms "
            f"(fairgate p99 {pct(o.single[('fairgate', stream)], 0.99):.2f} ms)"
        )
    print("targets: fairgate's added p50 ≤ 1 ms; throughput ≥ 60 % of the bare pass-through")


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "--bare":
        run_bare(int(sys.argv[2]), sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1, help="repeat, keep each row's median")
    args = ap.parse_args()
    with servers() as srv:
        report(measure(srv, args.requests, args.concurrency, rounds=args.rounds))


if __name__ == "__main__":
    main()
