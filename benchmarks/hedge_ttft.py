"""Hedged first token (issue 46, item 1): what it does to the time to first token and what it
costs in upstream calls.

Two mock upstream processes behind one fairgate process: the *slow* target is the combo's first
choice and usually fast, but one request in ten gets its first token ``--slow-ms`` late
(``slow-first-token`` from the mock's schedule); the *fast* target, the second choice, always
answers after ``--fast-ms``. Two combos over the same two targets, one with
``predictiveTtftMs: --hedge-ms`` and one without, get the same streamed load in one run; the
client measures each request's time to its first content token. Printed side by side: p50, p99
and max time to first token, and the upstream calls each mock saw (the hedges' extra calls).

Run: ``.venv/bin/python benchmarks/hedge_ttft.py [--requests N] [--concurrency C]``.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_overhead import (
    CLIENT_KEY,
    SECRET,
    pct,
    post_json,
    serve_config,
    start_mock,
    stop,
)


def config(slow: str, fast: str, hedge_ms: int) -> str:
    conns = "".join(
        f"  - {{id: {cid}, provider: mock, base_url: '{url}/v1', secret: '{SECRET}',"
        " models: [gpt-4o-mini]}\n"
        for cid, url in (("slow", slow), ("fast", fast))
    )
    targets = (
        "[{provider: mock, model: gpt-4o-mini, connection: slow},"
        " {provider: mock, model: gpt-4o-mini, connection: fast}]"
    )
    return (
        "server: {require_allocation: false}\n"
        f"connections:\n{conns}"
        f"keys:\n  - {{id: bench, name: bench, secret: '{CLIENT_KEY}'}}\n"
        "combos:\n"
        f"  - {{name: plain, strategy: priority, targets: {targets}}}\n"
        f"  - {{name: hedged, strategy: priority, targets: {targets},"
        f" config: {{predictiveTtftMs: {hedge_ms}, maxHedgesInFlight: 64}}}}\n"
    )


def mock_requests(mock: str) -> int:
    with urllib.request.urlopen(mock + "/_mock/stats", timeout=10) as r:
        return int(orjson.loads(r.read())["requests"])


def _has_content(line: bytes) -> bool:
    """A chat chunk with a non-empty ``content`` delta (the role chunk's ``""`` is none)."""
    if not line.startswith(b"data: {"):
        return False
    return b'"content":"' in line and b'"content":""' not in line


async def ttfts(url: str, model: str, n: int, conc: int) -> list[float]:
    """Each request's time to its first content token, in ms (sorted)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "benchmark"}],
        "max_tokens": 16,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    out: list[float] = []

    async def worker(session: aiohttp.ClientSession, jobs: Iterator[int]) -> None:
        for _ in jobs:
            t = time.perf_counter()
            first: float | None = None
            async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                if r.status != 200:
                    raise RuntimeError(f"{model}: HTTP {r.status}: {await r.text()}")
                async for line in r.content:
                    if first is None and _has_content(line):
                        first = (time.perf_counter() - t) * 1000
            if first is None:
                raise RuntimeError(f"{model}: a stream without content")
            out.append(first)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        jobs = iter(range(n))
        await asyncio.gather(*(worker(session, jobs) for _ in range(conc)))
    return sorted(out)


def run(args: argparse.Namespace) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        slow, p1 = start_mock()
        fast, p2 = start_mock()
        procs += [p1, p2]
        post_json(fast + "/_mock/config", {"latency_ms": args.fast_ms})
        with tempfile.TemporaryDirectory() as tmp:
            url, gw = serve_config(config(slow, fast, args.hedge_ms), Path(tmp), "hedge")
            procs.append(gw)
            asyncio.run(ttfts(url, "plain", 20, 4))  # warm the connections
            rows = []
            for model in args.order.split(","):
                # one request in ten slow, in the same pattern for both combos
                pattern = ["ok"] * 9 + [f"slow-first-token:{args.slow_ms}"]
                faults = (pattern * (args.requests // 10 + 1))[: args.requests]
                post_json(slow + "/_mock/schedule", {"faults": faults})
                before = (mock_requests(slow), mock_requests(fast))
                lat = asyncio.run(ttfts(url, model, args.requests, args.concurrency))
                calls = (mock_requests(slow) - before[0], mock_requests(fast) - before[1])
                rows.append((model, lat, calls))
    finally:
        stop(procs)
    print(
        f"{args.requests} streamed requests, concurrency {args.concurrency}; slow target: "
        f"1 in 10 first tokens {args.slow_ms} ms late; fast target: {args.fast_ms} ms; "
        f"hedge after {args.hedge_ms} ms"
    )
    print(
        f"{'combo':8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'upstream calls':>16} {'extra':>6}"
    )
    for model, lat, (a, b) in rows:
        extra = a + b - args.requests
        print(
            f"{model:8} {pct(lat, 0.50):8.1f} {pct(lat, 0.99):8.1f} {lat[-1]:8.1f} "
            f"{f'{a} + {b}':>16} {extra:>6}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--slow-ms", type=int, default=1000)
    ap.add_argument("--fast-ms", type=int, default=60)
    ap.add_argument("--hedge-ms", type=int, default=200)
    ap.add_argument("--order", default="plain,hedged", help="which combo runs first")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
