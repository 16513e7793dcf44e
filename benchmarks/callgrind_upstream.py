"""Instructions per request of fairgate's upstream client alone, counted by callgrind.

``callgrind_servers.py`` counts a whole gateway process, where the aiohttp client is one part
among many; this one counts only the client side: a process (this file run with ``--client``)
posts the gateway's usual chat-completion body to the mock upstream through
:class:`fairgate.providers.upstream.UpstreamClient` (``post``, ``status``, ``read``,
``release``, as ``path/attempt.py`` does for a whole answer), ``--concurrency`` at a time
over keep-alive connections. It runs under ``valgrind --tool=callgrind --instr-atstart=no``;
after a warm-up it tells this process, which switches the instrumentation on
(``callgrind_control -i on``), lets it send ``N`` requests, switches it off and divides. The
mock runs outside valgrind, the client on uvloop as the gateway's does; kernel time is not
counted. ``--compare NAME=SRC`` counts another source tree's client too (``PYTHONPATH=SRC``),
so a before and an after come from one run.

``--profile`` counts Python calls per request with cProfile instead (no valgrind: quick, and
it says which functions a change removed), by function, the top ``--top``.

Run: ``.venv/bin/python benchmarks/callgrind_upstream.py [--requests 400] [--concurrency 8]
[--compare before=/path/src] [--profile]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from callgrind_support import instruction_total, run_instrumented
from proxy_overhead import SECRET, start_mock, stop

#: What the gateway sends for a small chat completion (its exchange re-encodes the client's).
BODY = (
    b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"count me"}],'
    b'"max_tokens":8,"stream":false}'
)


# -- the client (this file run with ``--client MOCK N CONC``) ---------------------------------


async def _drive(client: object, conn: object, n: int, conc: int) -> None:
    """``n`` posts through ``client``, ``conc`` at a time; every one must answer 200."""
    from fairgate.providers.upstream import UpstreamClient

    assert isinstance(client, UpstreamClient)
    todo = iter(range(n))

    async def worker() -> None:
        for _ in todo:
            resp = await client.post(conn, "/chat/completions", BODY, {})  # type: ignore[arg-type]
            try:
                raw = await resp.read()
            finally:
                resp.release()
            if resp.status != 200:
                raise RuntimeError(f"{resp.status} {raw[:200]!r}")

    await asyncio.gather(*(worker() for _ in range(conc)))


def _client(mock: str, n: int, conc: int, profile: int) -> None:
    """Warm up, then (callgrind) say ``warm`` and wait for ``go`` on stdin, send ``n`` posts
    and say ``done``; or (``profile`` > 0) print cProfile's busiest functions per request."""
    from fairgate.domain.connections import Connection
    from fairgate.providers.upstream import UpstreamClient

    conn = Connection(id="bench", provider="openai", base_url=mock + "/v1", secret=SECRET)

    async def run() -> None:
        async with UpstreamClient() as client:
            await _drive(client, conn, max(60, n // 4), conc)
            if profile:
                import cProfile
                import pstats

                prof = cProfile.Profile()
                prof.enable()
                await _drive(client, conn, n, conc)
                prof.disable()
                stats = pstats.Stats(prof)
                calls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]
                print(f"Python calls per request: {calls / n:.1f}")
                rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][1])  # type: ignore[attr-defined]
                for (file, line, name), v in rows[:profile]:
                    where = f"{Path(file).parent.name}/{Path(file).name}:{line}"
                    print(f"  {v[1] / n:6.2f}  {name}  ({where})")
                return
            print("warm", flush=True)
            sys.stdin.readline()
            await _drive(client, conn, n, conc)
            print("done", flush=True)
            sys.stdin.readline()

    import uvloop  # the gateway's loop (``process/http_protocol.py``)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())


# -- the driver -----------------------------------------------------------------------------


def measure(src: str | None, mock: str, out: Path, n: int, conc: int) -> float:
    """Instructions per request of one client process (``src`` on ``PYTHONPATH`` if given)."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    cmd = [sys.executable, str(Path(__file__).resolve()), "--client", mock, str(n), str(conc)]
    vg = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    run_instrumented(vg + cmd, env, (("warm", "on"), ("done", "off")), timeout_s=300)
    return instruction_total(out, fields="totals") / n


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "--client":
        profile = int(sys.argv[5]) if len(sys.argv) > 5 else 0
        _client(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), profile)
        return
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=400, metavar="N")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--compare", action="append", default=[], metavar="NAME=SRC")
    ap.add_argument("--profile", action="store_true", help="cProfile's call counts, no valgrind")
    ap.add_argument("--top", type=int, default=25, help="functions listed with --profile")
    args = ap.parse_args()
    runs: list[tuple[str, str | None]] = [("this tree", None)]
    for spec in args.compare:
        name, _, src = spec.partition("=")
        runs.append((name, str(Path(src).resolve())))
    if not args.profile and shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install -y valgrind)")
    tmp = Path(tempfile.mkdtemp(prefix="fairgate-upstream-"))
    mock, mproc = start_mock()
    rows: list[tuple[str, float]] = []
    try:
        for i, (label, src) in enumerate(runs):
            if args.profile:
                print(f"== {label}", flush=True)
                env = dict(os.environ, **({"PYTHONPATH": src} if src else {}))
                cmd = [sys.executable, str(Path(__file__).resolve()), "--client", mock]
                cmd += [str(args.requests), str(args.concurrency), str(args.top)]
                subprocess.run(cmd, env=env, check=True)
                continue
            print(f"  {label}: {args.requests} requests under callgrind ...", flush=True)
            out = tmp / f"r{i}.callgrind"
            rows.append((label, measure(src, mock, out, args.requests, args.concurrency)))
    finally:
        stop([mproc])
        shutil.rmtree(tmp, ignore_errors=True)
    if rows:
        print(
            f"\ninstructions per request, the upstream client alone ({args.concurrency} at a time)"
        )
        for label, per in rows:
            print(f"  {label:<16} {per / 1e3:8.1f} k")


if __name__ == "__main__":
    main()
