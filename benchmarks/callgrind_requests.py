"""Instructions per governed request, counted by callgrind: a figure no busy host can move.

Wall-clock benchmarks (``proxy_overhead.py``, ``peers.py``) need a quiet machine; this one does
not. It runs the gateway process under ``valgrind --tool=callgrind`` (the mock upstream runs
normally), sends ``N1`` and then, in a fresh process, ``N2`` requests through it with a few
concurrent clients, and prints ``(I(N2) - I(N1)) / (N2 - N1)``: the user-space instructions one
more request costs, start-up and warm-up cancelled out. ``--compare NAME=SRC`` measures another
source tree the same way (``PYTHONPATH=SRC``), e.g. main before a change, for a before/after in
one run. Background timers add a little that depends on how long the run takes; the figure is
good to about 1 %. Kernel time (SQLite's file locks and WAL writes) is not counted.

Run: ``.venv/bin/python benchmarks/callgrind_requests.py [--compare before=/path/src] [--stream]``
(a few minutes per tree: callgrind runs the gateway about 50 times slower).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from proxy_overhead import ADMIN, CLIENT_KEY, bench_config, free_port, start_mock, stop, wait_http

CONCURRENCY = 8


async def drive(url: str, n: int, stream: bool) -> None:
    """``n`` chat completions through the gateway, ``CONCURRENCY`` at a time; every one must
    succeed (a refused request would cost less and flatter the figure)."""
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "count me"}],
        "max_tokens": 8,
        "stream": stream,
    }
    headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
    todo = iter(range(n))
    async with httpx.AsyncClient(timeout=120) as client:

        async def worker() -> None:
            for _ in todo:
                r = await client.post(url + "/v1/chat/completions", json=body, headers=headers)
                if r.status_code != 200:
                    raise RuntimeError(f"request refused: {r.status_code} {r.text[:200]}")

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


def instructions(mock: str, tmp: Path, src: str | None, n: int, stream: bool, tag: str) -> int:
    """Total instructions of one gateway process that served ``n`` requests, then stopped."""
    port = free_port()
    cfg = tmp / f"{tag}.yaml"
    cfg.write_text(bench_config(mock, 0))
    out = tmp / f"{tag}.callgrind"
    env = {**os.environ, "FAIRGATE_ADMIN_KEY": ADMIN, "FAIRGATE_KEY_RATE_PER_S": "0"}
    if src:
        env["PYTHONPATH"] = src
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable]
    cmd += ["-m", "fairgate", "serve", "--config", str(cfg), "--port", str(port)]
    cmd += ["--data-dir", str(tmp / f"{tag}-data")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", timeout=900)
        asyncio.run(drive(url, n, stream))
        proc.send_signal(signal.SIGTERM)
        proc.wait(900)
    finally:
        stop([proc])
    text = out.read_text(errors="replace")
    found = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no instruction total in {out}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--compare", action="append", default=[], metavar="NAME=SRC")
    ap.add_argument("--requests", nargs=2, type=int, default=(80, 240), metavar=("N1", "N2"))
    ap.add_argument("--stream", action="store_true", help="streamed answers (SSE)")
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
    try:
        for i, (name, src) in enumerate(trees):
            counts = []
            for n in (n1, n2):
                print(f"  {name}: {n} requests under callgrind ...", flush=True)
                counts.append(instructions(mock, tmp, src, n, args.stream, f"t{i}-{n}"))
            rows.append((name, (counts[1] - counts[0]) / (n2 - n1)))
    finally:
        stop([mproc])
        shutil.rmtree(tmp, ignore_errors=True)
    mode = "stream" if args.stream else "non-stream"
    print(f"\ninstructions per governed request ({mode}, SQLite store, {CONCURRENCY} clients)")
    base = rows[0][1]
    for name, per in rows:
        print(f"  {name:<20} {per / 1e6:8.3f} M   {per / base:6.3f}x of this tree")


if __name__ == "__main__":
    main()
