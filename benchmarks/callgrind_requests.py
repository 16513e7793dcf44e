"""Instructions per governed request, counted by callgrind: a figure no busy host can move.

Wall-clock benchmarks (``proxy_overhead.py``, ``peers.py``) need a quiet machine; this one does
not. It runs the gateway process under ``valgrind --tool=callgrind`` (the mock upstream runs
normally), sends ``N1`` and then, in a fresh process, ``N2`` requests through it with a few
concurrent clients, and prints ``(I(N2) - I(N1)) / (N2 - N1)``: the user-space instructions one
more request costs, start-up and warm-up cancelled out. ``--compare NAME=SRC`` measures another
source tree the same way (``PYTHONPATH=SRC``), e.g. main before a change, for a before/after in
one run. Background timers add a little that depends on how long the run takes; the figure is
good to about 1 %. Kernel time (SQLite's file locks and WAL writes) is not counted.

``--store redis`` measures the Redis quota and resilience store instead (the Redis at
``FAIRGATE_TEST_REDIS_URL``, else ``127.0.0.1:6379``, under a key prefix unique to the run and
deleted afterwards; redis-server's own instructions are not counted). It also counts the Redis
round trips per request in two runs outside valgrind (N1 and N2 requests, the difference): a
``sitecustomize`` on the gateway's path counts every ``send_packed_command`` of redis-py's asyncio
connections (a pipeline is one) by its first command. The watcher's version polls (``GET``, a
fixed rate per second, not per request) and its subscription are listed apart. ``--keep DIR``
keeps the callgrind files (``callgrind_annotate --inclusive=yes DIR/<file>``). ``--no-pool``:
the same model with no quota pool (the floor of a governed request).

Run: ``.venv/bin/python benchmarks/callgrind_requests.py [--compare before=/path/src] [--stream]
[--store redis]`` (a few minutes per tree: callgrind runs the gateway about 50 times slower).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import cast

import httpx

from callgrind_support import arg_parser, chat_body, drop_prefix, instruction_total, redis_url
from proxy_overhead import ADMIN, CLIENT_KEY, bench_config, free_port, start_mock, stop

CONCURRENCY = 8
#: Commands the resilience watcher sends at its own pace (per second, not per request).
WATCHER_COMMANDS = frozenset({"GET", "SUBSCRIBE", "PUBLISH", "PING"})

#: Installed as ``sitecustomize`` on the gateway's path for the round-trip count: every packed
#: send of an asyncio connection, by the first command it carries, written out at exit.
_COUNTER = """
import atexit, collections, json, os, signal
import redis.asyncio.connection as _c

_counts = collections.Counter()
_send = _c.AbstractConnection.send_packed_command


def _name(command):
    first = command if isinstance(command, (bytes, bytearray, memoryview)) else command[0]
    parts = bytes(first[:64]).split(b"\\r\\n")
    return parts[2].decode(errors="replace").upper() if len(parts) > 2 else "?"


async def send_packed_command(self, command, check_health=True):
    _counts[_name(command)] += 1
    return await _send(self, command, check_health)


_c.AbstractConnection.send_packed_command = send_packed_command


@atexit.register
def _dump():
    with open(os.environ["FAIRGATE_BENCH_COUNTS"], "w") as f:
        json.dump(dict(_counts), f)


def _on_term(signum, frame):  # uvicorn re-raises SIGTERM after its graceful stop
    _dump()
    os._exit(0)


signal.signal(signal.SIGTERM, _on_term)
"""


async def drive(url: str, n: int, stream: bool) -> None:
    """``n`` chat completions through the gateway, ``CONCURRENCY`` at a time; every one must
    succeed (a refused request would cost less and flatter the figure)."""
    body = chat_body(stream)
    headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
    todo = iter(range(n))
    async with httpx.AsyncClient(timeout=120) as client:

        async def worker() -> None:
            for _ in todo:
                r = await client.post(url + "/v1/chat/completions", json=body, headers=headers)
                if r.status_code != 200:
                    raise RuntimeError(f"request refused: {r.status_code} {r.text[:200]}")

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


def wait_ready(url: str, timeout: float) -> None:
    """Like ``proxy_overhead.wait_http``, but each try may take 30 s: under callgrind on a
    busy host, a health check that asks Redis takes longer than that helper's 1 s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=30)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} not ready")


def gateway(
    mock: str,
    tmp: Path,
    src: str | None,
    n: int,
    stream: bool,
    tag: str,
    store: str,
    *,
    count: bool = False,
    pool: bool = True,
) -> int | dict[str, int]:
    """One gateway process that served ``n`` requests, then stopped: its total instructions
    (under callgrind), or with ``count`` its Redis sends by command (outside valgrind)."""
    port = free_port()
    cfg = tmp / f"{tag}.yaml"
    cfg.write_text(bench_config(mock, 0, pool=pool))
    out = tmp / f"{tag}.callgrind"
    env = {**os.environ, "FAIRGATE_ADMIN_KEY": ADMIN, "FAIRGATE_KEY_RATE_PER_S": "0"}
    paths = [src] if src else [p for p in [env.get("PYTHONPATH")] if p]
    if store == "redis":
        prefix = f"fgcg{uuid.uuid4().hex[:10]}"
        env.update(
            QUOTA_STORE_DRIVER="redis",
            QUOTA_STORE_REDIS_URL=redis_url(),
            QUOTA_STORE_REDIS_PREFIX=prefix,
        )
    if count:
        hook = tmp / f"{tag}-hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(_COUNTER)
        paths.insert(0, str(hook))
        env["FAIRGATE_BENCH_COUNTS"] = str(tmp / f"{tag}.counts.json")
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    cmd = [] if count else ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    cmd += [sys.executable, "-m", "fairgate", "serve", "--config", str(cfg), "--port", str(port)]
    cmd += ["--data-dir", str(tmp / f"{tag}-data")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + "/health", timeout=900)
        asyncio.run(drive(url, n, stream))
        proc.send_signal(signal.SIGTERM)
        proc.wait(900)
    finally:
        stop([proc])
        if store == "redis":
            drop_prefix(redis_url(), prefix)
    if count:
        return cast(dict[str, int], json.loads((tmp / f"{tag}.counts.json").read_text()))
    return instruction_total(out)


def main() -> None:
    ap = arg_parser(__doc__, compare=True)
    ap.add_argument("--requests", nargs=2, type=int, default=(80, 240), metavar=("N1", "N2"))
    ap.add_argument("--stream", action="store_true", help="streamed answers (SSE)")
    ap.add_argument("--store", choices=("sqlite", "redis"), default="sqlite")
    ap.add_argument("--no-pool", action="store_true", help="the model has no quota pool")
    ap.add_argument("--keep", metavar="DIR", help="keep the callgrind files here")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install -y valgrind)")
    n1, n2 = args.requests
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    for spec in args.compare:
        name, _, src = spec.partition("=")
        trees.append((name, str(Path(src).resolve())))
    tmp = Path(tempfile.mkdtemp(prefix="fairgate-callgrind-"))
    mock, mproc = start_mock()
    rows: list[tuple[str, float]] = []
    trips: list[tuple[str, dict[str, float]]] = []
    try:
        for i, (name, src) in enumerate(trees):
            counts = []
            for n in (n1, n2):
                print(f"  {name}: {n} requests under callgrind ...", flush=True)
                tag = f"t{i}-{n}"
                got = gateway(
                    mock, tmp, src, n, args.stream, tag, args.store, pool=not args.no_pool
                )
                counts.append(cast(int, got))
                if args.keep:
                    Path(args.keep).mkdir(parents=True, exist_ok=True)
                    shutil.copy(tmp / f"{tag}.callgrind", Path(args.keep) / f"{tag}.callgrind")
            rows.append((name, (counts[1] - counts[0]) / (n2 - n1)))
            if args.store == "redis":
                sent = [
                    cast(
                        dict[str, int],
                        gateway(
                            mock, tmp, src, n, args.stream, f"c{i}-{n}", args.store, count=True
                        ),
                    )
                    for n in (n1, n2)
                ]
                names = set(sent[0]) | set(sent[1])
                trips.append(
                    (
                        name,
                        {
                            c: (sent[1].get(c, 0) - sent[0].get(c, 0)) / (n2 - n1)
                            for c in sorted(names)
                        },
                    )
                )
    finally:
        stop([mproc])
        shutil.rmtree(tmp, ignore_errors=True)
    mode = "stream" if args.stream else "non-stream"
    label = "SQLite" if args.store == "sqlite" else "Redis"
    what = "request to a model with no pool" if args.no_pool else "governed request"
    print(f"\ninstructions per {what} ({mode}, {label} store, {CONCURRENCY} clients)")
    base = rows[0][1]
    for name, per in rows:
        print(f"  {name:<20} {per / 1e6:8.3f} M   {per / base:6.3f}x of this tree")
    if trips:
        print("\nRedis round trips per request (sends by first command; the watcher's apart)")
        for name, per_cmd in trips:
            hot = sum(v for c, v in per_cmd.items() if c not in WATCHER_COMMANDS)
            detail = ", ".join(f"{c} {v:.2f}" for c, v in per_cmd.items() if abs(v) >= 0.005)
            print(f"  {name:<20} {hot:6.2f}   ({detail})")


if __name__ == "__main__":
    main()
