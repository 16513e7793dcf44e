"""Instructions per ``/v1`` request of the ASGI application alone, counted by callgrind.

``callgrind_requests.py`` measures a whole gateway process (uvicorn, sockets, the mock upstream's
HTTP client); under a loaded host its eight gateway starts under valgrind take long. This one
needs no server, socket or subprocess: it builds the app (``create_app``, SQLite store, a pool
with requests and tokens) over an in-process upstream, runs its lifespan, and calls the ASGI
callable with uvicorn-shaped scopes (one request at a time) in a process under
``valgrind --tool=callgrind --instr-atstart=no``: start-up and a warm-up run uninstrumented
(several times faster on a busy host), then ``callgrind_control -i on`` counts ``N`` requests
and ``-i off`` stops; the figure is the instructions counted divided by ``N``. What it counts:
the ASGI layer (routing, middleware, request and response objects, streaming), the handler and
everything below it; what it does not: the HTTP server's protocol and the socket writes.
``--compare NAME=SRC`` runs another source tree (``PYTHONPATH=SRC``) the same way.

Run: ``.venv/bin/python benchmarks/callgrind_asgi.py [--stream] [--compare before=/path/src]``
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
from typing import Any

from callgrind_support import instruction_total

KEY = "fg-bench-asgi-key-0123456789"


def _config() -> dict[str, Any]:
    return {
        "connections": [
            {
                "id": "c1",
                "provider": "openai",
                "base_url": "http://c1.invalid/v1",
                "secret": "upstream-secret-abcdef",
                "models": ["gpt-4o-mini"],
            }
        ],
        "keys": [{"id": "k", "name": "K", "secret": KEY, "allowed_providers": ["openai"]}],
        "pools": [
            {
                "id": "p",
                "name": "P",
                "connections": ["c1"],
                "allocations": [{"key": "k", "weight": 100}],
                "dimensions": [
                    {"unit": "requests", "window": "hourly", "limit": 10_000_000},
                    {"unit": "tokens", "window": "hourly", "limit": 10_000_000_000},
                ],
            }
        ],
        "combos": [],
    }


async def _serve(n: int, stream: bool, data_dir: Path) -> None:
    """Build the app and send it ``n`` requests through its ASGI callable."""
    import orjson

    from fairgate.config import parse_config
    from fairgate.providers.inprocess import HandlerUpstream, Reply, UpstreamRequest, openai_chat
    from fairgate.server.app import create_app
    from fairgate.server.state import Gateway

    chunk = orjson.dumps(
        {
            "id": "x",
            "object": "chat.completion.chunk",
            "model": "gpt-4o-mini",
            "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}],
        }
    )
    usage = orjson.dumps(
        {
            "id": "x",
            "object": "chat.completion.chunk",
            "model": "gpt-4o-mini",
            "choices": [],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
        }
    )
    sse = [b"data: " + chunk + b"\n\n", b"data: " + usage + b"\n\n", b"data: [DONE]\n\n"]

    async def handler(req: UpstreamRequest) -> Reply:
        if stream:
            return Reply(chunks=sse, headers={"content-type": "text/event-stream"})
        return openai_chat("hi", model="gpt-4o-mini")

    gw = Gateway(data_dir=data_dir, config=parse_config(_config(), {}), env={})
    app = create_app(gw, upstream=HandlerUpstream(handler))
    body = orjson.dumps(
        {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "count me"}],
            "max_tokens": 8,
            "stream": stream,
        }
    )
    headers = [
        (b"host", b"127.0.0.1:8080"),
        (b"user-agent", b"bench"),
        (b"accept", b"*/*"),
        (b"content-type", b"application/json"),
        (b"authorization", b"Bearer " + KEY.encode()),
        (b"content-length", str(len(body)).encode()),
    ]

    async def one() -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "server": ("127.0.0.1", 8080),
            "client": ("127.0.0.1", 5000),
            "scheme": "http",
            "method": "POST",
            "root_path": "",
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
            "query_string": b"",
            "headers": list(headers),
            "state": {},
        }
        done = asyncio.Event()
        sent_body = False
        status = 0

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()  # as uvicorn: nothing more until the answer is complete
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif not message.get("more_body", False):
                done.set()

        await app(scope, receive, send)
        if status != 200:
            raise RuntimeError(f"request refused: {status}")

    async with app.router.lifespan_context(app):
        for _ in range(WARM_UP):
            await one()
        await app.state.services.drain()
        _handshake("ready")  # the parent turns instrumentation on
        for _ in range(n):
            await one()
        await app.state.services.drain()
        _handshake("done")  # ... and off


#: Requests before counting starts: caches, the SQLite pages, the first-call paths.
WARM_UP = 30


def _handshake(word: str) -> None:
    """Tell the parent ``word`` and block (the event loop too) until it answers."""
    sys.stdout.write(word + "\n")
    sys.stdout.flush()
    sys.stdin.readline()


def _instructions(src: str | None, n: int, stream: bool, tmp: Path, tag: str) -> int:
    out = tmp / f"{tag}.callgrind"
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    cmd += [sys.executable, __file__, "--child", str(n), str(tmp / f"{tag}-data")]
    cmd += ["--stream"] if stream else []
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        for word, switch in (("ready", "on"), ("done", "off")):
            line = proc.stdout.readline().strip()
            if line != word:
                raise RuntimeError(f"child said {line!r}, expected {word!r}")
            subprocess.run(
                ["callgrind_control", "-i", switch, str(proc.pid)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            proc.stdin.write("\n")
            proc.stdin.flush()
        if proc.wait(1800) != 0:
            raise RuntimeError(f"child exited with {proc.returncode}")
    finally:
        if proc.poll() is None:
            proc.kill()
    # with instrumentation toggled, "summary" is what was counted at the first toggle (0)
    return instruction_total(out, fields="totals")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--compare", action="append", default=[], metavar="NAME=SRC")
    ap.add_argument("--requests", type=int, default=200, metavar="N")
    ap.add_argument("--stream", action="store_true", help="streamed answers (SSE)")
    ap.add_argument("--child", nargs=2, metavar=("N", "DATA_DIR"), help=argparse.SUPPRESS)
    ap.add_argument("--keep", metavar="DIR", help="keep the callgrind files in DIR")
    args = ap.parse_args()
    if args.child:
        asyncio.run(_serve(int(args.child[0]), args.stream, Path(args.child[1])))
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install -y valgrind)")
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    for spec in args.compare:
        name, _, src = spec.partition("=")
        trees.append((name, str(Path(src).resolve())))
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="fairgate-asgi-"))
    tmp.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, float]] = []
    try:
        for i, (name, src) in enumerate(trees):
            print(f"  {name}: {args.requests} requests under callgrind ...", flush=True)
            count = _instructions(src, args.requests, args.stream, tmp, f"t{i}")
            rows.append((name, count / args.requests))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    mode = "stream" if args.stream else "non-stream"
    print(f"\ninstructions per /v1 request through the ASGI app ({mode}, SQLite store, in-process)")
    base = rows[0][1]
    for name, per in rows:
        print(f"  {name:<20} {per / 1e6:8.3f} M   {per / base:6.3f}x of this tree")


if __name__ == "__main__":
    main()
