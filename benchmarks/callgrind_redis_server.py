"""Instructions redis-server spends per admission and per settle, counted by callgrind.

What the Redis store's scripts cost the server that every replica shares: a private
``redis-server`` (a free port, no persistence) runs under ``valgrind --tool=callgrind
--instr-atstart=no``; the store admits ``--requests`` reservations one at a time (two checks,
requests and tokens, as the benchmark pool has), then settles them in batches of each size of
``--batches`` (settles handed in together go as one ``settle.lua`` call: ``store/coalesce.py``).
Instrumentation is zeroed before and dumped after each phase, so each figure is that phase's
instructions divided by its calls: a count, not a time, the same on a busy host. redis-server's
side only (its event loop, the RESP parsing, the Lua VM, the commands); the gateway's side is
``callgrind_redis_store.py``. ``--compare NAME=SRC`` measures another source tree's store the
same way (``PYTHONPATH=SRC``), each tree on a fresh server.

Run: ``.venv/bin/python benchmarks/callgrind_redis_server.py [--compare before=/path/src]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from callgrind_support import arg_parser, instruction_total

HOUR = 3_600_000
T0 = 1_700_002_800_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class CountedServer:
    """A redis-server under callgrind; :meth:`phase` counts what it does between two marks."""

    def __init__(self, tmp: Path) -> None:
        self.out = tmp / "redis.callgrind"
        self.port = free_port()
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        cmd += [f"--callgrind-out-file={self.out}", "redis-server", "--port", str(self.port)]
        cmd += ["--save", "", "--appendonly", "no", "--dir", str(tmp)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.dumps = 0
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def ctl(self, *args: str) -> None:
        subprocess.run(
            ["callgrind_control", *args, str(self.proc.pid)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def start(self) -> None:
        """Zero the counts and switch instrumentation on (what follows is counted)."""
        self.ctl("-i", "on")
        self.ctl("-z")

    def count(self) -> int:
        """Dump: the instructions since the last :meth:`start` or :meth:`count`."""
        self.ctl("-d")
        self.dumps += 1
        part = Path(f"{self.out}.{self.dumps}")
        for _ in range(600):  # the dump is written by the instrumented process: wait for it
            if part.exists() and part.stat().st_size > 0:
                break
            time.sleep(0.05)
        time.sleep(0.2)
        return instruction_total(part)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def child(url: str, n: int, batches: list[int]) -> None:
    """Runs with the measured tree on ``sys.path``; says each phase's mark on stdout and waits
    for the parent's line on stdin (the parent zeroes or dumps the counts in between)."""
    from fairgate.domain.units import Unit
    from fairgate.quota.decision import DimensionCheck
    from fairgate.quota.model import Policy
    from fairgate.quota.ports import AdmitRequest, UsageItem
    from fairgate.store.redis.store import RedisQuotaStore

    def mark(word: str) -> None:
        print(word, flush=True)
        sys.stdin.readline()

    store = RedisQuotaStore(url, prefix="cg", socket_timeout_s=60.0)
    checks = (
        DimensionCheck("requests/hourly", Unit.REQUESTS, HOUR, 1e9, 1e9, None, 1.0),
        DimensionCheck("tokens/hourly", Unit.TOKENS, HOUR, 1e12, 1e12, None, 2048.0),
    )
    usage = [UsageItem("requests/hourly", HOUR, 1), UsageItem("tokens/hourly", HOUR, 1234)]
    clock = iter(range(T0, T0 + HOUR))

    async def admit(count: int) -> list[tuple[str, str]]:
        held = []
        for i in range(count):
            rid, key = uuid.uuid4().hex, f"k{i % 7}"
            req = AdmitRequest("bp", key, checks, Policy.BURST, 0.5, rid, next(clock), 60_000)
            await store.admit(req)
            held.append((key, rid))
        return held

    async def settle(held: list[tuple[str, str]], size: int) -> None:
        for j in range(0, len(held), size):
            group = held[j : j + size]
            await asyncio.gather(*(store.settle("bp", k, r, usage, next(clock)) for k, r in group))

    try:
        await settle(await admit(40), 4)  # warm: scripts loaded, keys created
        for size in batches:
            mark("admit")
            held = await admit(n)
            mark(f"settle {size}")
            await settle(held, size)
        mark("done")
    finally:
        await store.close()


def measure(src: str | None, n: int, batches: list[int]) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="fairgate-callgrind-redis-"))
    server = CountedServer(tmp)
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    here = str(Path(__file__).resolve())
    proc = None
    try:
        import redis

        for _ in range(600):
            try:
                redis.Redis.from_url(server.url).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        cmd = [sys.executable, here, "--child", server.url, "--requests", str(n)]
        cmd += ["--batches", ",".join(map(str, batches))]
        proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdin is not None
        assert proc.stdout is not None
        out: dict[str, float] = {}
        phase = None
        while True:
            word = proc.stdout.readline().strip()
            if not word:
                raise RuntimeError("the measured process ended early")
            if phase is None:
                server.start()
            else:  # the phase that just ended (each admit phase is alike: the first is kept)
                out.setdefault(phase, server.count() / n)
            if word == "done":
                break
            phase = word
            proc.stdin.write("\n")
            proc.stdin.flush()
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(60)
        return out
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = arg_parser(__doc__, compare=True)
    ap.add_argument("--requests", type=int, default=400, help="admissions per phase")
    ap.add_argument("--batches", default="1,4,16", help="settle batch sizes, e.g. 1,4,16")
    ap.add_argument("--json", metavar="FILE", help="also write the figures here")
    ap.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        asyncio.run(child(args.child, args.requests, batches))
        return
    for tool in ("valgrind", "callgrind_control", "redis-server"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed (apt-get install -y valgrind redis-server)")
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    for spec in args.compare:
        name, _, src = spec.partition("=")
        trees.append((name, str(Path(src).resolve())))
    results = {}
    for name, src in trees:
        print(f"  {name}: {args.requests} admissions, settles in batches of {batches} ...")
        results[name] = measure(src, args.requests, batches)
    print("\nredis-server instructions per call (k = thousands), one admission at a time")
    cols = ["admit", *(f"settle {b}" for b in batches)]
    print(f"  {'tree':<14}" + "".join(f"{c:>14}" for c in cols))
    for name, row in results.items():
        print(f"  {name:<14}" + "".join(f"{row[c] / 1e3:>13.1f}k" for c in cols))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
