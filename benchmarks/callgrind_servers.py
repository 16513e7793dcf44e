"""Instructions per request of whole server processes, HTTP server included, counted by callgrind.

``callgrind_asgi.py`` counts the ASGI application alone; ``callgrind_requests.py`` a whole
gateway, but instrumented from its start (minutes under valgrind on a busy host) and as a
difference of two runs. This one starts each server process under
``valgrind --tool=callgrind --instr-atstart=no``, warms it up uninstrumented over the same
keep-alive connections, switches the instrumentation on (``callgrind_control -i on``), sends
``N`` requests (``--concurrency`` at a time), switches it off and divides. The client (in this
process) and the mock upstream run outside valgrind; kernel time is not counted. What a server
does on its own timers meanwhile (flushes, watchers) is counted too, for the few seconds the
count lasts.

Targets (``--targets``, comma-separated; default: all):

- ``aiohttp``: aiohttp's own server, a handler that reads the body and answers a fixed JSON;
- ``uvicorn``: uvicorn's stock httptools protocol (uvloop), the same handler as an ASGI app;
- ``wire``: the same on fairgate's protocol (``process/http_protocol.py``: every HTTP limit on);
- ``bare``: the bare aiohttp pass-through of ``proxy_overhead.py`` in front of the mock;
- ``nopool``: ``fairgate serve``, the model with no quota pool (the floor of a request);
- ``pool``: ``fairgate serve``, SQLite store, one pool with requests and tokens.

The first three say what the HTTP server layer costs by itself; ``bare`` against ``nopool``
is issue 15's floor. ``--compare NAME=SRC`` runs the fairgate targets of another source tree
too (``PYTHONPATH=SRC``).

Run: ``.venv/bin/python benchmarks/callgrind_servers.py [--targets wire,aiohttp]
[--requests 300] [--concurrency 8] [--stream] [--compare before=/path/src]``
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from callgrind_support import arg_parser, chat_body, instruction_total, instrument
from proxy_overhead import (
    ADMIN,
    CLIENT_KEY,
    SECRET,
    bench_config,
    free_port,
    start_mock,
    stop,
)

#: The trivial servers' answer: about the size of the mock's chat completion.
ANSWER = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"gpt-4o-mini",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"benchmark answer"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":3,'
    b'"total_tokens":12}}'
)

ALL = ("aiohttp", "uvicorn", "wire", "bare", "nopool", "pool")
TRIVIAL = ("aiohttp", "uvicorn", "wire")


# -- the trivial servers (this file run with ``--serve KIND PORT``) ---------------------------


async def _asgi(scope: dict[str, object], receive: object, send: object) -> None:
    """The trivial ASGI app: read the body, answer :data:`ANSWER`."""
    if scope["type"] != "http":  # lifespan
        msg = await receive()  # type: ignore[operator]
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})  # type: ignore[operator]
            msg = await receive()  # type: ignore[operator]
        await send({"type": "lifespan.shutdown.complete"})  # type: ignore[operator]
        return
    more = True
    while more:
        msg = await receive()  # type: ignore[operator]
        more = msg.get("more_body", False)
    await send(  # type: ignore[operator]
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": ANSWER})  # type: ignore[operator]


def _serve(kind: str, port: int) -> None:
    if kind == "aiohttp":
        from aiohttp import web

        async def handler(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(body=ANSWER, content_type="application/json")

        async def ready(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def main() -> None:
            app = web.Application()
            app.router.add_post("/{tail:.*}", handler)
            app.router.add_get("/ready", ready)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            await asyncio.Event().wait()

        import uvloop

        uvloop.run(main())
        return
    import uvicorn

    from fairgate.process.http_protocol import protocol_for, server_options
    from fairgate.process.http_settings import HttpSettings

    options = server_options(HttpSettings(), drain_s=1)
    http: object = "httptools" if kind == "uvicorn" else protocol_for(HttpSettings())
    uvicorn.run(_asgi, host="127.0.0.1", port=port, http=http, **options)  # type: ignore[arg-type]


# -- the driver -----------------------------------------------------------------------------


async def drive(url: str, n: int, conc: int, stream: bool, key: str, session: object) -> None:
    """``n`` chat completions over ``session``'s keep-alive connections, ``conc`` at a time;
    every one must succeed."""
    assert isinstance(session, aiohttp.ClientSession)
    body = chat_body(stream)
    headers = {"authorization": f"Bearer {key}"}
    todo = iter(range(n))

    async def worker() -> None:
        for _ in todo:
            async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url}: {r.status} {(await r.text())[:200]}")

    await asyncio.gather(*(worker() for _ in range(conc)))


def _ready(url: str, timeout: float) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=30):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s")


def measure(
    kind: str,
    src: str | None,
    mock: str,
    tmp: Path,
    tag: str,
    n: int,
    conc: int,
    stream: bool,
) -> float:
    """Instructions per request of one server process of ``kind``."""
    port = free_port()
    out = tmp / f"{tag}.callgrind"
    env = {**os.environ, "FAIRGATE_ADMIN_KEY": ADMIN, "FAIRGATE_KEY_RATE_PER_S": "0"}
    if src:
        env["PYTHONPATH"] = src
    here = str(Path(__file__).resolve())
    key = CLIENT_KEY
    if kind in TRIVIAL:
        cmd = [sys.executable, here, "--serve", kind, str(port)]
        ready = "/ready" if kind == "aiohttp" else "/"
    elif kind == "bare":
        cmd = [sys.executable, str(Path(here).with_name("proxy_overhead.py")), "--bare"]
        cmd += [str(port), mock]
        ready, key = "/ready", SECRET
    else:
        cfg = tmp / f"{tag}.yaml"
        cfg.write_text(bench_config(mock, 0, pool=kind == "pool"))
        cmd = [sys.executable, "-m", "fairgate", "serve", "--config", str(cfg)]
        cmd += ["--port", str(port), "--data-dir", str(tmp / f"{tag}-data")]
        ready = "/health"
    vg = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    proc = subprocess.Popen(vg + cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _ready(url + ready, timeout=900)

        async def run() -> None:
            connector = aiohttp.TCPConnector(limit=conc)
            timeout = aiohttp.ClientTimeout(total=600)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                await drive(url, max(60, n // 4), conc, stream, key, session)  # warm-up
                instrument(proc.pid, "on")
                await drive(url, n, conc, stream, key, session)
                instrument(proc.pid, "off")

        asyncio.run(run())
    finally:
        stop([proc])
    return instruction_total(out, fields="totals") / n


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] == "--serve":
        _serve(sys.argv[2], int(sys.argv[3]))
        return
    ap = arg_parser(__doc__, compare=True)
    ap.add_argument("--targets", default=",".join(ALL))
    ap.add_argument("--requests", type=int, default=300, metavar="N")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--stream", action="store_true", help="streamed answers (fairgate, bare)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install -y valgrind)")
    kinds = [k.strip() for k in args.targets.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in ALL]
    if unknown:
        sys.exit(f"unknown targets {unknown}; choose from {', '.join(ALL)}")
    runs: list[tuple[str, str, str | None]] = [(k, k, None) for k in kinds]
    for spec in args.compare:
        name, _, src = spec.partition("=")
        runs += [(f"{k} [{name}]", k, str(Path(src).resolve())) for k in kinds if k in ALL[4:]]
    tmp = Path(tempfile.mkdtemp(prefix="fairgate-servers-"))
    mock, mproc = start_mock()
    rows: list[tuple[str, float]] = []
    try:
        for i, (label, kind, src) in enumerate(runs):
            print(f"  {label}: {args.requests} requests under callgrind ...", flush=True)
            rows.append(
                (
                    label,
                    measure(
                        kind, src, mock, tmp, f"r{i}", args.requests, args.concurrency, args.stream
                    ),
                )
            )
    finally:
        stop([mproc])
        shutil.rmtree(tmp, ignore_errors=True)
    mode = "stream" if args.stream else "non-stream"
    print(f"\ninstructions per request, whole server process ({mode}, {args.concurrency} clients)")
    bare = dict(rows).get("bare")
    for label, per in rows:
        ratio = f"   {per / bare:5.2f}x the bare proxy" if bare and label != "bare" else ""
        print(f"  {label:<24} {per / 1e6:8.3f} M{ratio}")


if __name__ == "__main__":
    main()
