"""fairgate side by side with its peers (issue 15's method), every target behind one mock upstream.

Targets, each its own process: direct to the mock, a bare aiohttp pass-through (the floor for a
Python proxy), fairgate on the SQLite quota store, fairgate on the Redis quota + resilience
store (when Redis answers at ``--redis-url``), optionally fairgate from another source tree
(``--compare NAME=SRC``, e.g. ``main=/work/main/src``: before/after in one run), and the LiteLLM
proxy when it is installed (``pip install 'fairgate[bench-peers]'``, or ``--litellm PATH`` to a
``litellm`` executable in a separate venv; its rows say "not installed" otherwise).
``--fairgate sqlite`` (or any comma-separated subset of sqlite, transactional, no-pool,
no-pool-workers, workers, redis, redis-workers) runs only those fairgate rows: with
``--compare`` and more ``--rounds``, a before/after of one row with many pairs in the time the
whole table takes. ``workers`` and ``redis-workers`` are ``serve --workers N`` (``--workers``,
default 2) on the SQLite file and on Redis: set beside their one-process rows, their CPU per
request is what a second worker costs (issue 48: within +10 % is the target;
``no-pool-workers`` beside ``no-pool`` is what N processes cost with no quota store at all),
and ``--pin-load CPU`` runs wrk on that CPU alone (``taskset``), so the load generator's share
of the two cores is the same for every row. Each N-workers row is also set against its
one-process row, paired by round (CPU per request at c16 and req/s at c16 and c64, as ratios:
the lines after the table).

Method: rounds alternate the targets (``--rounds``, median round of each row), so a noisy
moment of a shared host hits every target alike. Per target and round:

- c1 p50: one connection, sequential non-streamed requests;
- c16 and c64: req/s, p50 and p99 latency;
- time to first SSE event: sequential streamed requests, time until the first ``data:`` event;
- CPU ms per request at c16: the server process tree's utime + stime from ``/proc`` over the
  c16 run, divided by the requests; the Redis row adds redis-server's share (``INFO cpu``: all
  of that server's clients, so on a Redis shared with other work it reads high), and per
  request the ``EVALSHA`` calls (the scripts' round trips) and every command the server ran
  (``total_commands_processed``, which counts each ``redis.call`` inside a script too);
- CPU ms per request at c1, the same way over the c1 run (without redis-server's share): work
  done once per interval (the memory mode's commit every ``QUOTA_SQLITE_FLUSH_MS``, a loop
  turn) is shared by many requests at c16 and paid by few at c1, so the two columns together
  tell per-request work from per-interval work;
- the mock's request count checked against what the load generator completed, and 0 errors
  (non-2xx, socket errors, timeouts) required: a row with errors fails the run.

Load generator: ``wrk`` when it is on PATH (``apt-get install -y wrk``); else a Python aiohttp
generator (:func:`proxy_overhead.load`). The Python generator costs about as much CPU per request
as the bare proxy itself and shares the same two cores, so it holds the direct and bare rows
down (they read lower than with wrk, and fairgate's ratio to the bare proxy reads higher): use
wrk for the ratios of the issue's table.

Run: ``.venv/bin/python benchmarks/peers.py --quick`` (about 3 minutes here) or without
``--quick`` for the full method (10 s per measurement, 3 rounds). Prints a table; asserts
nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from proxy_overhead import (
    CLIENT_KEY,
    SECRET,
    free_port,
    load,
    pct,
    start_fairgate,
    start_mock_and_bare,
    stop,
    wait_http,
)

MODEL = "gpt-4o-mini"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "benchmark"}], "max_tokens": 16}
CLK_TCK = os.sysconf("SC_CLK_TCK")
LITELLM_KEY = "sk-bench-litellm-master-0123456789abcdef"


# -- process CPU from /proc -------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def tree_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` and its live descendants, in seconds."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)
        todo += _children(p)
    return total


# -- targets ----------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    url: str
    key: str
    pid: int
    #: redis-server's CPU seconds, commands run and EVALSHA calls so far (all of its clients)
    redis_cpu: Callable[[], tuple[float, int, int]] | None = None
    missing: str | None = None  # why the target did not run ("not installed", ...)


def redis_cpu_reader(url: str) -> Callable[[], tuple[float, int, int]] | None:
    """redis-server's used CPU seconds (``INFO cpu``), commands processed (``INFO stats``: every
    command it ran, each ``redis.call`` inside a Lua script included, so a governed request's
    two scripts count for about fifty) and ``EVALSHA`` calls (``INFO commandstats``: the
    scripts' round trips), or None when Redis does not answer. The gateway's round trips
    themselves are counted on its side by ``callgrind_requests.py --store redis``."""
    try:
        import redis
    except ImportError:
        return None
    client = redis.Redis.from_url(url, socket_timeout=2)

    def read() -> tuple[float, int, int]:
        info = client.info("cpu")
        stats = client.info("stats")
        scripts = client.info("commandstats").get("cmdstat_evalsha", {})
        cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return cpu, int(stats["total_commands_processed"]), int(scripts.get("calls", 0))

    try:
        read()
    except Exception:
        return None
    return read


def litellm_command(explicit: str | None) -> list[str] | None:
    """How to start the LiteLLM proxy, or None when it is not installed."""
    if explicit:
        return [explicit]
    exe = shutil.which("litellm")
    if exe:
        return [exe]
    if importlib.util.find_spec("litellm") is not None:
        return [sys.executable, "-m", "litellm"]
    return None


def start_litellm(cmd: list[str], mock: str, tmp: Path) -> tuple[str, subprocess.Popen[bytes], str]:
    """LiteLLM's proxy, one worker, logging off, in front of the mock; URL, process, version."""
    port = free_port()
    cfg = tmp / "litellm.yaml"
    cfg.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {mock}/v1\n"
        f"      api_key: {SECRET}\n"
        "litellm_settings:\n  set_verbose: false\n  json_logs: false\n"
        "general_settings:\n  disable_spend_logs: true\n"
        f"  master_key: {LITELLM_KEY}\n"
    )
    env = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_MODE": "PRODUCTION"}
    args = [*cmd, "--config", str(cfg), "--port", str(port), "--num_workers", "1"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):  # a proxy that refused to start fails the run now, not in 4 min
            if proc.poll() is not None:
                raise RuntimeError(f"litellm exited with {proc.returncode} (run it by hand)")
            try:
                wait_http(url + "/health/liveliness", timeout=1)
                break
            except RuntimeError:
                continue
    except BaseException:
        stop([proc])
        raise
    python = Path(cmd[0]).with_name("python") if cmd[0].endswith("litellm") else cmd[0]
    out = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    version = out.stdout.strip() or "?"
    return url, proc, version


# -- load generation --------------------------------------------------------------------------


@dataclass
class Run:
    """One measurement: throughput, latencies (ms), requests completed, errors."""

    rps: float
    p50: float
    p99: float
    requests: int
    errors: int


WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = [[%s]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("FGWRK %%d %%d %%d %%f %%f\\n", summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def wrk_run(
    url: str, key: str, conc: int, seconds: float, tmp: Path, pin: str | None = None
) -> Run:
    script = tmp / f"wrk-{key[-8:]}.lua"
    script.write_text(WRK_SCRIPT % (json.dumps(BODY), key))
    out = subprocess.run(
        [
            *(["taskset", "-c", pin] if pin else []),
            "wrk",
            "-t1",
            f"-c{conc}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "10s",
            "-s",
            str(script),
            url + "/v1/chat/completions",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("FGWRK "))
    n, dur_us, errors, p50_us, p99_us = line.split()[1:]
    return Run(
        int(n) / (int(dur_us) / 1e6),
        float(p50_us) / 1000,
        float(p99_us) / 1000,
        int(n),
        int(errors),
    )


def python_run(url: str, key: str, conc: int, seconds: float) -> Run:
    n = max(conc * 20, int(seconds * 400))
    rps, lat = asyncio.run(load(url, n, conc, False, key))
    return Run(rps, pct(lat, 0.5), pct(lat, 0.99), n, 0)


async def first_event_ms(url: str, key: str, n: int) -> list[float]:
    """Sequential streamed requests: ms until the first SSE ``data:`` line arrives."""
    headers = {"authorization": f"Bearer {key}"}
    body = {**BODY, "stream": True}
    out: list[float] = []
    async with aiohttp.ClientSession() as session:
        for i in range(n + 10):  # 10 warm-up requests
            t = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                if r.status != 200:
                    raise RuntimeError(f"stream request to {url} failed: {r.status}")
                first = None
                async for line in r.content:
                    if first is None and line.startswith(b"data:"):
                        first = (time.perf_counter() - t) * 1000
                if i >= 10 and first is not None:
                    out.append(first)
    return sorted(out)


def failed_attempts(url: str) -> str:
    """What a fairgate target's ``/metrics`` says of its failed upstream attempts (the failover
    rule retries a server error or a timeout on the same target, and the mock counts both
    attempts), for the message of a run whose counts disagree; empty for another target."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            families = list(text_string_to_metric_families(r.read().decode()))
    except (OSError, ValueError):
        return ""
    failed: dict[str, float] = {}
    for family in families:
        for sample in family.samples:
            outcome = sample.labels.get("outcome", "ok")
            if sample.name == "fairgate_target_attempts_total" and outcome != "ok":
                failed[outcome] = failed.get(outcome, 0.0) + sample.value
    return f" (the target's failed upstream attempts so far: {failed or 'none'})"


def mock_stats(mock: str) -> tuple[int, int]:
    """The mock's count of requests so far and of those it is still answering."""
    with urllib.request.urlopen(mock + "/_mock/stats", timeout=5) as r:
        stats = json.loads(r.read())
    return int(stats["requests"]), int(stats["in_flight"])


def mock_requests(mock: str, settle_s: float = 0.2, timeout_s: float = 10.0) -> int:
    """The mock's request count once it is quiet: nothing in flight and the same count twice
    ``settle_s`` apart. A request a target still held when the load generator stopped
    reaches the mock after it; read at a fixed delay (0.2 s, once), a straggler held longer
    than that on a busy host was counted in the *next* run, whose count then exceeded its
    completed requests plus its connections (``c64: the mock saw 35049, client 34984``).
    ``timeout_s``: a target that keeps sending on its own never gets quiet; its count then
    is what it is and the run's check judges it."""
    deadline = time.monotonic() + timeout_s
    last, _ = mock_stats(mock)
    while time.monotonic() < deadline:
        time.sleep(settle_s)
        count, in_flight = mock_stats(mock)
        if count == last and in_flight == 0:
            break
        last = count
    return last


# -- one round --------------------------------------------------------------------------------


@dataclass
class Row:
    c1: list[float] = field(default_factory=list)
    c16: list[Run] = field(default_factory=list)
    c64: list[Run] = field(default_factory=list)
    ttfe: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    cpu1_ms: list[float] = field(default_factory=list)
    redis_cpu_ms: list[float] = field(default_factory=list)
    redis_cmds: list[float] = field(default_factory=list)
    redis_evalsha: list[float] = field(default_factory=list)


class Bench:
    def __init__(
        self,
        mock: str,
        mock_pid: int,
        seconds: float,
        ttfe_n: int,
        tmp: Path,
        pin: str | None = None,
    ) -> None:
        self.mock, self.mock_pid, self.seconds, self.ttfe_n, self.tmp = (
            mock,
            mock_pid,
            seconds,
            ttfe_n,
            tmp,
        )
        self.use_wrk = shutil.which("wrk") is not None
        self.pin = pin

    def run(self, t: Target, conc: int, seconds: float) -> Run:
        before = mock_requests(self.mock)
        if self.use_wrk:
            r = wrk_run(t.url, t.key, conc, seconds, self.tmp, self.pin)
        else:
            r = python_run(t.url, t.key, conc, seconds)
        seen = mock_requests(self.mock) - before  # once what was in flight has arrived
        if r.errors:
            raise RuntimeError(f"{t.name} c{conc}: {r.errors} errors")
        # wrk counts completed requests; up to ``conc`` more were in flight when it stopped
        # (the Python generator's warm-up requests are counted by the mock too)
        slack = conc if self.use_wrk else conc + min(200, r.requests)
        if not r.requests <= seen <= r.requests + slack:
            msg = f"{t.name} c{conc}: the mock saw {seen}, client {r.requests}"
            raise RuntimeError(msg + failed_attempts(t.url))
        return r

    def round(self, t: Target, row: Row) -> None:
        cpu0 = tree_cpu_s(t.pid)
        r1 = self.run(t, 1, self.seconds / 2)
        row.c1.append(r1.p50)
        # per request at c1 as well: what c16 shares between requests (a commit every few ms,
        # a loop turn) one connection pays alone, so the two together tell per-request work
        # from per-interval work
        cpu1 = tree_cpu_s(t.pid)  # the c1 run's end is the c16 run's start: one walk of /proc
        row.cpu1_ms.append((cpu1 - cpu0) * 1000 / r1.requests)
        cpu0 = cpu1
        rcpu0, rcmd0, reval0 = t.redis_cpu() if t.redis_cpu else (0.0, 0, 0)
        r16 = self.run(t, 16, self.seconds)
        row.cpu_ms.append((tree_cpu_s(t.pid) - cpu0) * 1000 / r16.requests)
        if t.redis_cpu:
            rcpu, rcmd, reval = t.redis_cpu()
            row.redis_cpu_ms.append((rcpu - rcpu0) * 1000 / r16.requests)
            row.redis_cmds.append((rcmd - rcmd0) / r16.requests)
            row.redis_evalsha.append((reval - reval0) / r16.requests)
        row.c16.append(r16)
        row.c64.append(self.run(t, 64, self.seconds))
        row.ttfe.append(pct(asyncio.run(first_event_ms(t.url, t.key, self.ttfe_n)), 0.5))


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.rps)[len(runs) // 2]


def report(targets: list[Target], rows: dict[str, Row], bench: Bench, rounds: int) -> None:
    gen = "wrk" if bench.use_wrk else "Python aiohttp (holds direct/bare down)"
    total = sum(sum(r.requests for r in row.c16 + row.c64) for row in rows.values())
    print(
        f"\nload generator: {gen}; {rounds} alternating rounds, median round per cell; "
        f"{total} loaded requests, 0 errors, mock counts checked"
    )
    head = (
        f"{'target (latencies in ms)':<34} {'c1 p50':>8} {'c16 req/s':>10} {'c16 p99':>8} "
        f"{'c64 req/s':>10} {'c64 p99':>8} {'TTFE p50':>9} {'CPU/req c1':>11} {'CPU/req c16':>12}"
    )
    print(head)
    print("-" * len(head))
    for t in targets:
        if t.missing:
            print(f"{t.name:<34} {t.missing}")
            continue
        row = rows[t.name]
        r16, r64 = median_run(row.c16), median_run(row.c64)
        cpu = f"{statistics.median(row.cpu_ms):.3f} ms"
        if row.redis_cpu_ms:
            cpu += f" +{statistics.median(row.redis_cpu_ms):.3f} redis"
        print(
            f"{t.name:<34} {statistics.median(row.c1):8.2f} {r16.rps:10.0f} {r16.p99:8.2f} "
            f"{r64.rps:10.0f} {r64.p99:8.2f} {statistics.median(row.ttfe):9.2f} "
            f"{statistics.median(row.cpu1_ms):8.3f} ms {cpu:>12}"
        )
    for t in targets:
        found = rows.get(t.name)
        if not t.missing and found is not None and found.redis_cmds:
            print(
                f"{t.name}: per request at c16, {statistics.median(found.redis_evalsha):.2f} "
                f"EVALSHA (the scripts' round trips) and {statistics.median(found.redis_cmds):.2f} "
                "commands run by Redis, those inside the scripts included (every client of "
                "that server counts)"
            )
    workers_vs_one(targets, rows)
    bare = rows.get("bare aiohttp pass-through")
    if bare is None:
        return
    print(
        "\nrelative to the bare pass-through (targets: ≥ 70 % SQLite, ≥ 60 % Redis at c16/c64; "
        "+p50 c1 ≤ 0.3 ms; +TTFE ≤ 0.4 ms; p99 c16 ≤ 1.5×):"
    )
    b16, b64 = median_run(bare.c16), median_run(bare.c64)
    for t in targets:
        if t.missing or not t.name.startswith(("fairgate", "LiteLLM")):
            continue
        row = rows[t.name]
        r16, r64 = median_run(row.c16), median_run(row.c64)
        print(
            f"  {t.name:<32} c16 {r16.rps / b16.rps * 100:5.1f} %  c64 "
            f"{r64.rps / b64.rps * 100:5.1f} %  +p50 c1 "
            f"{statistics.median(row.c1) - statistics.median(bare.c1):+.2f} ms  +TTFE "
            f"{statistics.median(row.ttfe) - statistics.median(bare.ttfe):+.2f} ms  "
            f"p99 c16 {r16.p99 / b16.p99:.2f}×"
        )


def workers_vs_one(targets: list[Target], rows: dict[str, Row]) -> None:
    """Each ``serve --workers N`` row against its one-process row (issue 48, item 1: CPU per
    request within +10 %, throughput not lower): per round, since the rounds alternate the
    targets (a noisy moment hits both rows of a round alike), then the median of the rounds."""
    pairs = []
    for t in targets:
        if t.missing or " workers" not in t.name:
            continue
        head, _, rest = t.name.partition(", ")
        store, _, tail = rest.partition(", ")
        count, _, label = tail.partition(" workers")
        one = rows.get(f"{head}, {store}{label}")
        if one is not None and t.name in rows:
            pairs.append((f"{store}{label}", int(count), one, rows[t.name]))
    if not pairs:
        return
    print("\nworkers N vs 1, paired by round (target: CPU/req c16 within +10 %, req/s not lower):")

    def ratio(a: list[float], b: list[float]) -> float:
        return statistics.median(y / x for x, y in zip(a, b, strict=False) if x > 0)

    for name, n, one, many in pairs:
        cpu = ratio(one.cpu_ms, many.cpu_ms)
        rounds = " ".join(
            f"{(y / x - 1) * 100:+.0f}" for x, y in zip(one.cpu_ms, many.cpu_ms, strict=False)
        )
        c16 = ratio([r.rps for r in one.c16], [r.rps for r in many.c16])
        c64 = ratio([r.rps for r in one.c64], [r.rps for r in many.c64])
        print(
            f"  {name:<24} {n} workers: CPU/req c16 {statistics.median(one.cpu_ms):.3f} → "
            f"{statistics.median(many.cpu_ms):.3f} ms ({(cpu - 1) * 100:+.1f} %)  "
            f"c16 req/s {(c16 - 1) * 100:+.1f} %  c64 req/s {(c64 - 1) * 100:+.1f} %"
            f"  (CPU by round: {rounds} %)"
        )


#: The fairgate rows, by the name ``--fairgate`` gives them.
KINDS = (
    "sqlite",
    "transactional",
    "no-pool",
    "no-pool-workers",
    "workers",
    "redis",
    "redis-workers",
)


def fairgate_targets(
    mock: str, tmp: Path, args: argparse.Namespace, procs: list[subprocess.Popen[bytes]]
) -> list[Target]:
    out: list[Target] = []
    kinds: set[str] = args.fairgate
    sources: list[tuple[str, str | None]] = [("", None)]
    for spec in args.compare:
        label, _, src = spec.partition("=")
        sources.append((f" [{label}]", str(Path(src).resolve())))
    redis_cpu = redis_cpu_reader(args.redis_url) if kinds & {"redis", "redis-workers"} else None
    for i, (label, src) in enumerate(sources):
        base = {"PYTHONPATH": src} if src else {}
        if "sqlite" in kinds:
            url, proc = start_fairgate(mock, tmp, name=f"fg-sqlite-{i}", extra_env=base)
            procs.append(proc)
            out.append(Target(f"fairgate, SQLite{label}", url, CLIENT_KEY, proc.pid))
        if not src and "transactional" in kinds:  # this tree's SQLite store in its other mode
            tx = {"QUOTA_SQLITE_MODE": "transactional"}
            url, proc = start_fairgate(mock, tmp, name="fg-sqlite-transactional", extra_env=tx)
            procs.append(proc)
            out.append(Target("fairgate, SQLite transactional", url, CLIENT_KEY, proc.pid))
        if "no-pool" in kinds:  # the floor of a governed request: the model with no quota pool
            url, proc = start_fairgate(
                mock, tmp, name=f"fg-no-pool-{i}", extra_env=base, pool=False
            )
            procs.append(proc)
            out.append(Target(f"fairgate, no pool{label}", url, CLIENT_KEY, proc.pid))
        if args.workers > 1 and "no-pool-workers" in kinds:  # what N processes cost, no store
            url, proc = start_fairgate(
                mock,
                tmp,
                name=f"fg-no-pool-workers-{i}",
                extra_env=base,
                pool=False,
                workers=args.workers,
            )
            procs.append(proc)
            name = f"fairgate, no pool, {args.workers} workers{label}"
            out.append(Target(name, url, CLIENT_KEY, proc.pid))
        if args.workers > 1 and "workers" in kinds:  # N processes on one port, one SQLite file
            url, proc = start_fairgate(
                mock, tmp, name=f"fg-workers-{i}", extra_env=base, workers=args.workers
            )
            procs.append(proc)
            name = f"fairgate, SQLite, {args.workers} workers{label}"
            out.append(Target(name, url, CLIENT_KEY, proc.pid))
        for kind, workers in (("redis", 1), ("redis-workers", args.workers)):
            if kind not in kinds or (kind == "redis-workers" and workers < 2):
                continue
            name = f"fairgate, Redis{f', {workers} workers' if workers > 1 else ''}{label}"
            if redis_cpu is None:
                out.append(Target(name, "", "", 0, missing="Redis not reachable"))
                continue
            env = {
                **base,
                "QUOTA_STORE_DRIVER": "redis",
                "QUOTA_STORE_REDIS_URL": args.redis_url,
                "QUOTA_STORE_REDIS_PREFIX": f"fgbench{uuid.uuid4().hex[:8]}",
            }
            url, proc = start_fairgate(
                mock, tmp, name=f"fg-{kind}-{i}", extra_env=env, workers=workers
            )
            procs.append(proc)
            out.append(Target(name, url, CLIENT_KEY, proc.pid, redis_cpu))
    return out


def _kinds(text: str) -> set[str]:
    """``--fairgate``'s value: a comma-separated subset of :data:`KINDS`."""
    kinds = {k.strip() for k in text.split(",") if k.strip()}
    unknown = kinds - set(KINDS)
    if not kinds or unknown:
        msg = f"--fairgate takes a comma-separated list of {', '.join(KINDS)}"
        raise argparse.ArgumentTypeError(msg)
    return kinds


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="3 s per measurement (about 3 min)")
    ap.add_argument("--seconds", type=float, default=10.0, help="per loaded measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    ap.add_argument("--litellm", help="path to a litellm executable (e.g. in its own venv)")
    ap.add_argument("--no-litellm", action="store_true")
    ap.add_argument(
        "--workers",
        type=int,
        default=2,
        help="also run `fairgate serve --workers N` on SQLite (1: no such row)",
    )
    ap.add_argument(
        "--fairgate",
        type=_kinds,
        default=set(KINDS),
        metavar="KINDS",
        help=f"the fairgate rows to run, comma-separated (default: all of {','.join(KINDS)})",
    )
    ap.add_argument(
        "--pin-load",
        metavar="CPU",
        help="run wrk on this CPU alone (taskset -c CPU), the same share for every row",
    )
    ap.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="NAME=SRC",
        help="also run fairgate from another source tree (PYTHONPATH=SRC)",
    )
    args = ap.parse_args()
    seconds = 3.0 if args.quick else args.seconds
    ttfe_n = 100 if args.quick else 300
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp(prefix="fairgate-peers-"))
    try:
        mock, mproc, bare, bproc = start_mock_and_bare(procs)
        targets = [
            Target("direct to the mock", mock, SECRET, mproc.pid),
            Target("bare aiohttp pass-through", bare, SECRET, bproc.pid),
            *fairgate_targets(mock, tmp, args, procs),
        ]
        cmd = None if args.no_litellm else litellm_command(args.litellm)
        if cmd is None:
            targets.append(Target("LiteLLM", "", "", 0, missing="not installed"))
        else:
            url, proc, version = start_litellm(cmd, mock, tmp)
            procs.append(proc)
            targets.append(Target(f"LiteLLM {version}, 1 worker", url, LITELLM_KEY, proc.pid))
        bench = Bench(mock, mproc.pid, seconds, ttfe_n, tmp, args.pin_load)
        rows: dict[str, Row] = {t.name: Row() for t in targets if not t.missing}
        for r in range(args.rounds):
            for t in targets:
                if t.missing:
                    continue
                print(f"  round {r + 1}/{args.rounds}: {t.name} ...", flush=True)
                bench.round(t, rows[t.name])
        report(targets, rows, bench, args.rounds)
    finally:
        stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
