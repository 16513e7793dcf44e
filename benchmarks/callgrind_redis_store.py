"""Instructions per governed request on the Redis path alone, counted by callgrind.

What a governed request asks of Redis, in one process: one admission (``admit``, two counters:
requests and tokens), one settle, and one resilience check of its target
(``RedisResilienceStore.read_target`` with the watcher on, as the gateway runs it; its clock
stands still, so the check is answered from memory as on a host that runs the watcher on time). Each
concurrency level runs ``N1`` and then, in a fresh process, ``N2`` such requests (8 at a time)
under ``valgrind --tool=callgrind`` and prints ``(I(N2) - I(N1)) / (N2 - N1)``: start-up cancels
out. Faster to run than ``callgrind_requests.py --store redis`` (no gateway, no HTTP), and it
isolates the store's share; redis-server's own instructions are not counted. ``--compare
NAME=SRC`` measures another source tree the same way (``PYTHONPATH=SRC``).

It uses the Redis at ``FAIRGATE_TEST_REDIS_URL`` (else ``127.0.0.1:6379``) under a key prefix
unique to the run, deleted afterwards.

Run: ``.venv/bin/python benchmarks/callgrind_redis_store.py [--compare before=/path/src]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from callgrind_support import arg_parser, drop_prefix, instruction_total, redis_url

CONCURRENCY = 8
HOUR = 3_600_000


async def child(n: int, url: str, prefix: str) -> None:
    from fairgate.clock import ManualClock
    from fairgate.domain.units import Unit
    from fairgate.quota.decision import DimensionCheck
    from fairgate.quota.model import Policy
    from fairgate.quota.ports import AdmitRequest, UsageItem
    from fairgate.resilience.state_redis import RedisResilienceStore
    from fairgate.store.redis.store import RedisQuotaStore

    store = RedisQuotaStore(url, prefix=prefix, socket_timeout_s=30.0)
    # a clock that stands still and a watcher that polls once: its confirmation never goes
    # overdue (as on a host quiet enough to run it on time), and no background poll, whose
    # count grows with the run's length under valgrind, lands in the difference
    rs = RedisResilienceStore(url, prefix=prefix, socket_timeout_s=30.0, clock=ManualClock())
    await store.warm()
    await rs.start_watch(poll_s=3600.0)
    await rs.wait_version(0)
    now = 1_700_002_800_000
    checks = (
        DimensionCheck("requests/hourly", Unit.REQUESTS, HOUR, 1e12, 1e12, None, 1.0),
        DimensionCheck("tokens/hourly", Unit.TOKENS, HOUR, 1e15, 1e15, None, 64.0),
    )
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            await rs.read_target("mock", "m1", "gpt-4o-mini")
            rid = uuid.uuid4().hex
            req = AdmitRequest("bp", "bench", checks, Policy.BURST, 0.5, rid, now + i, 60_000)
            await store.admit(req)
            usage = [UsageItem("requests/hourly", HOUR, 1), UsageItem("tokens/hourly", HOUR, 20)]
            await store.settle("bp", "bench", rid, usage, now + i)

    try:
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    finally:
        await rs.close()
        await store.close()


def instructions(src: str | None, n: int, out: Path, url: str) -> int:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    prefix = f"fgcgs{uuid.uuid4().hex[:10]}"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable]
    cmd += [__file__, "--child", str(n), "--url", url, "--prefix", prefix]
    try:
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    finally:
        drop_prefix(url, prefix)
    return instruction_total(out)


def main() -> None:
    ap = arg_parser(__doc__, compare=True)
    ap.add_argument("--requests", nargs=2, type=int, default=(100, 400), metavar=("N1", "N2"))
    ap.add_argument("--keep", metavar="DIR", help="keep the callgrind files here")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--url", default="", help=argparse.SUPPRESS)
    ap.add_argument("--prefix", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        asyncio.run(child(args.child, args.url, args.prefix))
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install -y valgrind)")
    url = redis_url()
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    for spec in args.compare:
        name, _, src = spec.partition("=")
        trees.append((name, str(Path(src).resolve())))
    n1, n2 = args.requests
    tmp = Path(tempfile.mkdtemp(prefix="fairgate-callgrind-store-"))
    rows = []
    try:
        for i, (name, src) in enumerate(trees):
            counts = []
            for n in (n1, n2):
                print(f"  {name}: {n} requests under callgrind ...", flush=True)
                out = tmp / f"t{i}-{n}.callgrind"
                counts.append(instructions(src, n, out, url))
                if args.keep:
                    Path(args.keep).mkdir(parents=True, exist_ok=True)
                    shutil.copy(out, Path(args.keep) / out.name)
            rows.append((name, (counts[1] - counts[0]) / (n2 - n1)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"\ninstructions per request on the Redis path (admit + settle + resilience check, "
        f"{CONCURRENCY} at a time)"
    )
    base = rows[0][1]
    for name, per in rows:
        print(f"  {name:<20} {per / 1e3:9.1f} k   {per / base:6.3f}x of this tree")


if __name__ == "__main__":
    main()
