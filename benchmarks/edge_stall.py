"""One tenant's huge body against everyone else's latency (issue 19, item 4).

Sends one ~9 MB body of 300,000 tiny messages to a fairgate process and, meanwhile, polls
``/health`` from another client; prints the idle ``/health`` latency, the slowest and median
``/health`` answer while the big body was in flight, and the big request's own time and status.
Two gateways: the default settings (the message cap refuses the body after the parse) and the
cap lifted (the whole body is parsed and checked: the worst case, off the event loop).

On the old code (everything on the event loop) ``/health`` waited for the whole check: run this
file with ``PYTHONPATH=<old checkout>/src`` to compare.

Run: ``.venv/bin/python benchmarks/edge_stall.py [--messages N]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_overhead import CLIENT_KEY, SECRET, free_port, start_fairgate, stop, wait_http


def _poll(url: str, stop_: threading.Event, out: list[float]) -> None:
    with httpx.Client(timeout=120) as client:
        while not stop_.is_set():
            t0 = time.perf_counter()
            client.get(url + "/health")
            out.append(time.perf_counter() - t0)
            time.sleep(0.005)


def measure(url: str, body: bytes) -> dict[str, float]:
    with httpx.Client(timeout=60) as client:
        idle = []
        for _ in range(50):
            t0 = time.perf_counter()
            client.get(url + "/health")
            idle.append(time.perf_counter() - t0)
    during: list[float] = []
    stop_ = threading.Event()
    poller = threading.Thread(target=_poll, args=(url, stop_, during))
    poller.start()
    time.sleep(0.3)
    n0 = len(during)
    with httpx.Client(timeout=300) as client:
        t0 = time.perf_counter()
        r = client.post(
            url + "/v1/chat/completions",
            content=body,
            headers={"Authorization": f"Bearer {CLIENT_KEY}", "Content-Type": "application/json"},
        )
        big = time.perf_counter() - t0
    n1 = len(during)
    stop_.set()
    poller.join()
    window = during[n0:n1] or [float("nan")]
    return {
        "idle_p50_ms": statistics.median(idle) * 1000,
        "during_p50_ms": statistics.median(window) * 1000,
        "during_max_ms": max(window) * 1000,
        "answers_during": float(n1 - n0),
        "big_s": big,
        "status": float(r.status_code),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=300_000)
    args = ap.parse_args()
    body = orjson.dumps(
        {
            "model": "gpt-4o-mini",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}] * args.messages,
        }
    )
    tmp = Path(tempfile.mkdtemp(prefix="fairgate-edge-"))
    mport = free_port()
    mock = f"http://127.0.0.1:{mport}"
    mock_cmd = ["mock-upstream", "--port", str(mport), "--secret", SECRET]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "fairgate", *mock_cmd],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
    ]
    try:
        wait_http(mock + "/_mock/stats")
        print(f"body: {len(body) / 1e6:.1f} MB, {args.messages:,} messages")
        for name, env in (
            ("default settings", {}),
            ("message cap lifted", {"FAIRGATE_MAX_MESSAGES": "10000000"}),
        ):
            url, proc = start_fairgate(mock, tmp, name=name.split()[0], extra_env=env)
            procs.append(proc)
            m = measure(url, body)
            print(
                f"{name:>20}: idle /health p50 {m['idle_p50_ms']:.1f} ms | while the big body "
                f"ran: /health p50 {m['during_p50_ms']:.1f} ms, slowest {m['during_max_ms']:.0f}"
                f" ms ({m['answers_during']:.0f} answers) | big request {m['big_s']:.2f} s, "
                f"status {m['status']:.0f}"
            )
    finally:
        stop(procs)


if __name__ == "__main__":
    main()
