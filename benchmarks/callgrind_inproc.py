"""Instructions per governed request of an in-process gateway, counted by callgrind, without
paying for start-up under valgrind: the figure for a host too busy for ``callgrind_requests.py``.

One process per source tree runs the app in process (SQLite store, one pool with requests +
tokens, the in-process upstream, httpx's ASGI transport, 8 concurrent requests) under
``valgrind --tool=callgrind --instr-atstart=no``: start-up runs uninstrumented, 40 requests warm
up, then the process switches callgrind's instrumentation on for itself (``callgrind_control
-i on``), serves ``N`` requests and dumps; the dump's total / N is the figure. No uvicorn, aiohttp
or mock upstream in it (``callgrind_requests.py`` has them); httpx's client side is in it.

Run: ``.venv/bin/python benchmarks/callgrind_inproc.py [--compare NAME=SRC] [--stream] [-n N]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

KEY = "fg-bench-client-key-0001"
CONFIG: dict[str, Any] = {
    "connections": [
        {
            "id": "m1",
            "provider": "mock",
            "base_url": "http://m1.invalid/v1",
            "secret": "sk-upstream",
            "models": ["gpt-4o-mini"],
        }
    ],
    "keys": [{"id": "bench", "name": "bench", "secret": KEY}],
    "pools": [
        {
            "id": "bp",
            "name": "bench",
            "connections": ["m1"],
            "dimensions": [
                {"unit": "requests", "window": "hourly", "limit": 1e12},
                {"unit": "tokens", "window": "hourly", "limit": 1e15},
            ],
            "allocations": [{"key": "bench", "weight": 100}],
        }
    ],
}
WARM_UP = 40
CONCURRENCY = 8


def _control(*args: str) -> None:
    """callgrind_control on this process; the process keeps running guest code meanwhile
    (callgrind takes commands between basic blocks, never while the process waits)."""
    proc = subprocess.Popen(
        ["callgrind_control", *args, str(os.getpid())], stdout=subprocess.DEVNULL
    )
    while proc.poll() is None:
        sum(range(1000))
    if proc.returncode != 0:
        raise RuntimeError(f"callgrind_control {' '.join(args)} failed")


def _stream_chunks() -> list[bytes]:
    import orjson

    base = {"id": "c", "object": "chat.completion.chunk", "model": "gpt-4o-mini"}

    def event(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> bytes:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        return b"data: " + orjson.dumps({**base, "choices": choices, **extra}) + b"\n\n"

    usage = {"prompt_tokens": 10, "completion_tokens": 16, "total_tokens": 26}
    words = ("one", " two", " three", " four")
    return [
        event({"role": "assistant", "content": ""}),
        *(event({"content": w}) for w in words),
        event({}, "stop"),
        event(None, usage=usage),
        b"data: [DONE]\n\n",
    ]


async def _serve(n: int, stream: bool) -> None:
    """The child: the app in process, warmed up, then ``n`` requests under instrumentation."""
    import httpx

    from fairgate.config import parse_config
    from fairgate.providers.inprocess import HandlerUpstream, Reply, UpstreamRequest, openai_chat
    from fairgate.server.app import create_app
    from fairgate.server.state import Gateway

    chunks = _stream_chunks()

    async def handler(_req: UpstreamRequest) -> Reply:
        if stream:
            return Reply(headers={"content-type": "text/event-stream"}, chunks=chunks)
        return openai_chat("hello there", model="gpt-4o-mini")

    data = Path(tempfile.mkdtemp(prefix="fairgate-cg-inproc-"))
    gw = Gateway(data_dir=data, config=parse_config(CONFIG, {}), env={})
    app = create_app(gw, upstream=HandlerUpstream(handler))
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "count me"}],
        "max_tokens": 8,
        "stream": stream,
    }
    headers = {"authorization": f"Bearer {KEY}"}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:

            async def run(count: int) -> None:
                todo = iter(range(count))

                async def worker() -> None:
                    for _ in todo:
                        r = await client.post("/v1/chat/completions", json=body, headers=headers)
                        if r.status_code != 200:
                            raise RuntimeError(f"request refused: {r.status_code} {r.text[:200]}")

                await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
                await app.state.services.drain()  # the settles of this batch too

            await run(WARM_UP)
            _control("-i", "on")
            await run(n)
            _control("-d")
    shutil.rmtree(data, ignore_errors=True)


def measure(src: str | None, n: int, stream: bool, tmp: Path, tag: str) -> float:
    out = tmp / f"{tag}.callgrind"
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    cmd += [sys.executable, __file__, "--child", str(n)] + (["--stream"] if stream else [])
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dump = Path(f"{out}.1")  # the dump taken after the measured requests
    found = re.search(r"^summary:\s+(\d+)", dump.read_text(errors="replace"), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no instruction total in {dump}")
    return int(found.group(1)) / n


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--compare", action="append", default=[], metavar="NAME=SRC")
    ap.add_argument("-n", type=int, default=200, help="measured requests")
    ap.add_argument("--stream", action="store_true", help="streamed answers (SSE)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        asyncio.run(_serve(args.child, args.stream))
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install -y valgrind)")
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    for spec in args.compare:
        name, _, src = spec.partition("=")
        trees.append((name, str(Path(src).resolve())))
    tmp = Path(tempfile.mkdtemp(prefix="fairgate-cg-inproc-"))
    rows = []
    try:
        for i, (name, src) in enumerate(trees):
            print(f"  {name}: {args.n} requests under callgrind ...", flush=True)
            rows.append((name, measure(src, args.n, args.stream, tmp, f"t{i}")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mode = "stream" if args.stream else "non-stream"
    print(f"\ninstructions per governed request, in process ({mode}, SQLite store)")
    base = rows[0][1]
    for name, per in rows:
        print(f"  {name:<20} {per / 1e6:8.3f} M   {per / base:6.3f}x of this tree")


if __name__ == "__main__":
    main()
