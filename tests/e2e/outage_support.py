"""Helpers of the replica, outage and crash tests: a throwaway redis-server the test may kill,
a steady client load that records every answer, and a way to make measured figures visible.

The shared Redis of the suite is never stopped or flushed: outage tests start their own
``redis-server`` on a free port (no persistence, so a restart comes back empty, as a cache
server does) and kill and restart only that one.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from e2e_support import ADMIN_KEY, free_port

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def report(capsys: pytest.CaptureFixture[str], title: str, figures: dict[str, object]) -> None:
    """Print the figures a test measured so that they show in the CI log even when it passes."""
    with capsys.disabled():
        print(f"\n[figures] {title}")
        for name, value in figures.items():
            print(f"    {name}: {value}")


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class RedisServer:
    """One ``redis-server`` process of this test on ``port``; restartable on the same port."""

    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not _ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start:\n{self.log.read_text()}")
            time.sleep(0.02)

    def kill(self) -> None:
        """``kill -9``: no shutdown, the connections just die (and the data with it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def pause(self) -> None:
        """A hung server: connections stay open, nothing answers."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def throwaway_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server this test may kill. Without the binary: fail under CI (which
    installs it), skip elsewhere."""
    if shutil.which("redis-server") is None:
        msg = "redis-server is not installed (the outage tests start their own)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    server = RedisServer(free_port(), tmp_path / "redis.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Answer:
    phase: str
    status: int
    latency_s: float
    at: float  # monotonic time the answer arrived


@dataclass
class Load:
    """Client workers sending chat completions in a loop; each answer is tagged with the phase
    the test was in when it arrived (the test moves ``phase`` along)."""

    url: str
    key: str
    workers: int = 4
    pause_s: float = 0.0
    extra_headers: dict[str, str] = field(default_factory=dict)  # e.g. x-mock-fault: latency:200
    phase: str = "before"
    answers: list[Answer] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def ok(self, phase: str | None = None) -> int:
        return sum(1 for a in self.answers if a.status == 200 and phase in (None, a.phase))

    def count(self, phase: str) -> int:
        return sum(1 for a in self.answers if a.phase == phase)

    def statuses(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for a in self.answers:
            out[a.status] = out.get(a.status, 0) + 1
        return out

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(self.workers)]

    def halt(self) -> None:
        """No new requests from now on (those in flight still finish or fail)."""
        self._stop.set()

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _worker(self) -> None:
        body = {
            "model": "mock/gpt-4o-mini",
            "messages": [{"role": "user", "content": "steady load"}],
            "max_tokens": 4,
        }
        headers = {"Authorization": f"Bearer {self.key}", **self.extra_headers}
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    r = await client.post("/v1/chat/completions", json=body, headers=headers)
                except httpx.HTTPError as exc:
                    self.errors.append(type(exc).__name__)
                    await asyncio.sleep(0.01)
                    continue
                now = time.monotonic()
                self.answers.append(Answer(self.phase, r.status_code, now - t0, now))
                if self.pause_s:
                    await asyncio.sleep(self.pause_s)


async def health(client: httpx.AsyncClient) -> dict[str, object]:
    r = await client.get("/health")
    assert r.status_code == 200, r.text
    body: dict[str, object] = r.json()
    return body


def outage_of(h: dict[str, object]) -> dict[str, object]:
    store = h["store"]
    assert isinstance(store, dict)
    out = store["outage"]
    assert isinstance(out, dict)
    return out


async def wait_for(
    pred: Callable[[], Awaitable[bool]], within_s: float, interval: float = 0.02
) -> float:
    """Poll the async predicate until it holds; the seconds it took (fails after ``within_s``)."""
    t0 = time.monotonic()
    while True:
        if await pred():
            return time.monotonic() - t0
        if time.monotonic() - t0 > within_s:
            raise AssertionError(f"condition not met within {within_s}s")
        await asyncio.sleep(interval)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@pytest.fixture
def cpu_burners() -> Iterator[int]:
    """Keep every core of the host busy: one busy-looping process per core (at least two), for
    the duration of the test. What a production host looks like when limits matter most."""
    n = max(2, os.cpu_count() or 2)
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield n
    finally:
        for p in procs:
            p.kill()
            p.wait(5)
