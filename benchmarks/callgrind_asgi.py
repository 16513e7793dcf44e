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

Each tree runs twice: the model behind a quota pool (``pool``) and the same model with no pool
(``no pool``: the floor of a governed request), so "pool minus no pool" (what governing a request
adds: admission, settle, the quota headers, the routing view, the admission log) comes out of one
run. ``--variant pool`` or ``--variant no-pool`` runs one of them only. With no pool the key
lists the connection's provider (``allowed_providers``): with ``server.require_allocation`` on
(the default) a connection outside every pool is refused (403 ``connection_not_allowed``) to a
key that does not list it or its provider. The per-key flood guard is off
(``FAIRGATE_KEY_RATE_PER_S=0``, as in ``peers.py``) unless the environment sets it: a run faster
than its 1,000 requests a second would otherwise be refused with 429 ``key_rate_limited`` once
the burst is spent.

``--profile`` runs the same harness without valgrind under ``cProfile`` instead (switched on
after the warm-up, off after the ``N`` counted requests), once per tree and variant, and prints
the Python function calls per request: in total, by package (fairgate, starlette, asyncio, ...;
every tree and variant side by side) and for the functions that differ most between the
variants. Call counts barely move with the host's load, so they name *where* the instructions
go, which callgrind on CPython cannot (it sees the interpreter's C frames only).

Run: ``.venv/bin/python benchmarks/callgrind_asgi.py [--stream] [--variant pool|no-pool]
[--profile] [--compare before=/path/src]``
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

from callgrind_support import arg_parser, chat_body, instruction_total, run_instrumented

KEY = "fg-bench-asgi-key-0123456789"


def _config(pool: bool = True) -> dict[str, Any]:
    """One OpenAI connection and one key; with ``pool`` the connection is in a pool with a
    requests and a tokens dimension (limits far above what a run uses: every request is
    admitted), without it the key reaches the connection by ``allowed_providers``."""
    cfg: dict[str, Any] = {
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
    if not pool:
        cfg["pools"] = []
    return cfg


#: The gateway's environment before what passes through: no per-key flood guard.
ENV = {"FAIRGATE_KEY_RATE_PER_S": "0"}


async def _serve(
    n: int,
    stream: bool,
    data_dir: Path,
    pool: bool = True,
    start: Callable[[], None] | None = None,
    stop: Callable[[], None] | None = None,
) -> None:
    """Build the app and send it ``n`` requests through its ASGI callable; ``start`` and
    ``stop`` around the counted ones (default: the handshake with the parent, which switches
    callgrind's instrumentation)."""
    import orjson

    from fairgate.config import parse_config
    from fairgate.process.state import Gateway
    from fairgate.providers.inprocess import HandlerUpstream, Reply, UpstreamRequest, openai_chat
    from fairgate.server.app import create_app

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

    # no flood guard unless the environment sets one (see the module docstring); the per-key
    # rate guard's settings pass through, and the quota store's (``QUOTA_SQLITE_FLUSH_MS``: under
    # valgrind a 5 ms write-behind commits at every request); nothing else of the environment
    env = dict(ENV)
    env.update(
        (k, v) for k, v in os.environ.items() if k.startswith(("FAIRGATE_KEY_RATE_", "QUOTA_"))
    )
    gw = Gateway(data_dir=data_dir, config=parse_config(_config(pool), {}), env=env)
    app = create_app(gw, upstream=HandlerUpstream(handler))
    body = orjson.dumps(chat_body(stream))
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

        async def receive() -> MutableMapping[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()  # as uvicorn: nothing more until the answer is complete
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
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
        (start or functools.partial(_handshake, "ready"))()  # the parent turns callgrind on
        for _ in range(n):
            await one()
        await app.state.services.drain()
        (stop or functools.partial(_handshake, "done"))()  # ... and off


#: Requests before counting starts: caches, the SQLite pages, the first-call paths.
WARM_UP = 30


def _handshake(word: str) -> None:
    """Tell the parent ``word`` and block (the event loop too) until it answers."""
    sys.stdout.write(word + "\n")
    sys.stdout.flush()
    sys.stdin.readline()


def _instructions(src: str | None, n: int, stream: bool, tmp: Path, tag: str, pool: bool) -> int:
    out = tmp / f"{tag}.callgrind"
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    cmd += [sys.executable, __file__, "--child", str(n), str(tmp / f"{tag}-data")]
    cmd += ["--stream"] if stream else []
    cmd += [] if pool else ["--variant", "no-pool"]
    code = run_instrumented(cmd, env, (("ready", "on"), ("done", "off")), timeout_s=1800)
    if code != 0:
        raise RuntimeError(f"child exited with {code}")
    # with instrumentation toggled, "summary" is what was counted at the first toggle (0)
    return instruction_total(out, fields="totals")


def _profile_child(n: int, stream: bool, data_dir: Path, pool: bool, out: Path) -> None:
    """The harness under cProfile (counted requests only): calls and own time per function,
    and calls per package, as JSON."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    asyncio.run(_serve(n, stream, data_dir, pool, start=prof.enable, stop=prof.disable))
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    functions: dict[str, list[float]] = {}
    packages: dict[str, int] = {}
    for (file, line, name), (_cc, nc, tt, _ct, _callers) in stats.items():
        functions[f"{Path(file).name}:{line}({name})"] = [nc, tt]
        packages[_package(file)] = packages.get(_package(file), 0) + nc
    out.write_text(json.dumps({"functions": functions, "packages": packages}))


def _package(file: str) -> str:
    """The package a profiled function's file belongs to ("~" is a built-in)."""
    if file == "~":
        return "built-in (C)"
    parts = Path(file).parts
    for name in ("fairgate", "starlette", "uvicorn", "orjson", "prometheus_client", "anyio"):
        if name in parts:
            return name
    if "asyncio" in parts:
        return "asyncio"
    return "other Python"


def _profile(src: str | None, n: int, stream: bool, tmp: Path, tag: str, pool: bool) -> Any:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    out = tmp / f"{tag}.profile.json"
    cmd = [sys.executable, __file__, "--child-profile", str(n), str(tmp / f"{tag}-data"), str(out)]
    cmd += ["--stream"] if stream else []
    cmd += [] if pool else ["--variant", "no-pool"]
    subprocess.run(cmd, env=env, check=True, stdin=subprocess.DEVNULL)
    return json.loads(out.read_text())


def _print_profiles(name: str, n: int, got: dict[str, Any], top: int) -> None:
    fns = {v: prof["functions"] for v, prof in got.items()}
    calls = {v: {f: c / n for f, (c, _) in rows.items()} for v, rows in fns.items()}
    tott = {v: {f: t * 1e6 / n for f, (_, t) in rows.items()} for v, rows in fns.items()}
    for v in got:
        total = sum(calls[v].values())
        print(f"  {name} / {v}: {total:8.1f} calls per request, {sum(tott[v].values()):.0f} µs")
    if set(got) != {"pool", "no pool"}:
        return
    a, b = calls["pool"], calls["no pool"]
    diff = {f: a.get(f, 0.0) - b.get(f, 0.0) for f in set(a) | set(b)}
    print(f"  pool minus no pool: {sum(diff.values()):+.1f} calls per request; by function:")
    ranked = sorted(diff, key=lambda f: -abs(diff[f]))[:top]
    for f in ranked:
        t = tott["pool"].get(f, 0.0) - tott["no pool"].get(f, 0.0)
        print(f"    {diff[f]:+7.2f} calls  {t:+7.1f} µs tottime  {f}")


def _print_packages(n: int, runs: list[tuple[str, dict[str, Any]]], mode: str) -> None:
    """Calls per request by package, one column per tree and variant."""
    cols = [(f"{name} / {v}", prof["packages"]) for name, per in runs for v, prof in per.items()]
    print(f"\nPython calls per /v1 request by package ({mode}; cProfile)")
    width = max(16, *(len(c) + 2 for c, _ in cols))
    print(f"  {'package':<20}" + "".join(f"{c:>{width}}" for c, _ in cols))
    for g in sorted({g for _, pk in cols for g in pk}):
        print(f"  {g:<20}" + "".join(f"{pk.get(g, 0) / n:{width}.1f}" for _, pk in cols))
    print(f"  {'total':<20}" + "".join(f"{sum(pk.values()) / n:{width}.1f}" for _, pk in cols))


VARIANTS = {"pool": (True,), "no-pool": (False,), "both": (True, False)}


def main() -> None:
    ap = arg_parser(__doc__, compare=True)
    ap.add_argument("--requests", type=int, default=200, metavar="N")
    ap.add_argument("--stream", action="store_true", help="streamed answers (SSE)")
    ap.add_argument("--variant", choices=tuple(VARIANTS), default="both")
    ap.add_argument("--profile", action="store_true", help="cProfile call counts, no valgrind")
    ap.add_argument("--top", type=int, default=40, help="functions listed with --profile")
    ap.add_argument("--child", nargs=2, metavar=("N", "DATA_DIR"), help=argparse.SUPPRESS)
    ap.add_argument("--child-profile", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--keep", metavar="DIR", help="keep the callgrind files in DIR")
    args = ap.parse_args()
    pools = VARIANTS[args.variant]
    if args.child:
        asyncio.run(_serve(int(args.child[0]), args.stream, Path(args.child[1]), pools[0]))
        return
    if args.child_profile:
        n, data, out = args.child_profile
        _profile_child(int(n), args.stream, Path(data), pools[0], Path(out))
        return
    if not args.profile and shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install -y valgrind)")
    trees: list[tuple[str, str | None]] = [("this tree", None)]
    for spec in args.compare:
        name, _, src = spec.partition("=")
        trees.append((name, str(Path(src).resolve())))
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="fairgate-asgi-"))
    tmp.mkdir(parents=True, exist_ok=True)
    mode = "stream" if args.stream else "non-stream"
    rows: list[tuple[str, dict[str, Any]]] = []
    try:
        for i, (name, src) in enumerate(trees):
            per: dict[str, Any] = {}
            for pool in pools:
                label = "pool" if pool else "no pool"
                tag = f"t{i}-{'p' if pool else 'n'}"
                if args.profile:
                    print(f"  {name} / {label}: {args.requests} requests under cProfile ...")
                    per[label] = _profile(src, args.requests, args.stream, tmp, tag, pool)
                else:
                    print(f"  {name} / {label}: {args.requests} requests under callgrind ...")
                    count = _instructions(src, args.requests, args.stream, tmp, tag, pool)
                    per[label] = count / args.requests
            if args.profile:
                print(f"\nPython calls per /v1 request ({mode}, SQLite store, in-process)")
                _print_profiles(name, args.requests, per, args.top)
            rows.append((name, per))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.profile:
        _print_packages(args.requests, rows, mode)
        return
    print(f"\ninstructions per /v1 request through the ASGI app ({mode}, SQLite store, in-process)")
    base = rows[0][1]
    for name, per in rows:
        cells = [f"{v}: {per[v] / 1e6:6.3f} M ({per[v] / base[v]:5.3f}x)" for v in per]
        if len(per) == 2:
            cells.append(f"pool - no pool: {(per['pool'] - per['no pool']) / 1e3:7.1f} k")
        print(f"  {name:<20} " + "   ".join(cells))


if __name__ == "__main__":
    main()
