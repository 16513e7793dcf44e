"""Real processes on loopback: the mock upstream and the gateway, started as users start them.

Every process runs on the test clock (``fairgate.testclock``, ``FAIRGATE_TESTING=1``) of
:data:`TEST_CLOCK`: one timeline per test module, shared by the mock and every gateway the module
starts (a gateway restarted on the same data continues it), starting mid-way through the hourly
and 5-hour buckets so that window counts, cooldowns and retry-after never depend on the hour the
suite runs at. ``FAIRGATE_E2E_CLOCK_START`` (the boundary guard: 1 s before a bucket boundary)
instead freezes each test's clock there until the test calls :meth:`ClockPlan.cross_boundary`
between its traffic and its reads. Tests that compare window counts use
:func:`assert_window_count`: exact within one bucket, and across a boundary no lower than the
window arithmetic allows.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from fairgate.domain.units import Window
from fairgate.quota.window import bucket_index, sliding_value
from fairgate.testclock import parse_instant

UPSTREAM_SECRET = "sk-upstream-test-0123456789abcdef"
ADMIN_KEY = "fg-admin-e2e-key-0123456789abcdef0123"


#: 10:30 UTC on a Wednesday: 30 min from the hourly boundaries, 2.5 h from the 5-hour ones,
#: 10.5 h from midnight, days from the weekly (Thursday) and monthly (epoch-aligned) ones
MID_BUCKET = "2026-06-24T10:30:00Z"
CLOCK_START_ENV = "FAIRGATE_E2E_CLOCK_START"
#: where :func:`assert_window_count` notes each count it checked across a boundary (the guard)
CROSSINGS_ENV = "FAIRGATE_E2E_CROSSINGS_FILE"


#: the boundary guard pins the clock this long before a boundary
PIN_BEFORE_MS = 1_000


class ClockPlan:
    """The test clock the processes of one test module share: ``start`` at real ``anchor``,
    running at real speed; pinned (the boundary guard), frozen at the pinned instant until a
    test moves it across the boundary with :meth:`cross_boundary`."""

    def __init__(self) -> None:
        self.start_ms = 0
        self.anchor_ms = 0
        self.advanced_ms = 0
        self.rate = 1
        self.pinned_ms: int | None = None
        self.restart()

    @property
    def pinned(self) -> bool:
        """Whether the start was set from outside (the boundary guard): one timeline per test."""
        return self.pinned_ms is not None

    def restart(self) -> None:
        """A fresh timeline from the configured start (once per module, before its processes)."""
        pinned = os.environ.get(CLOCK_START_ENV)
        self.pinned_ms = parse_instant(pinned) if pinned else None
        self.start_ms = parse_instant(MID_BUCKET) if self.pinned_ms is None else self.pinned_ms
        self.rate = 1 if self.pinned_ms is None else 0
        self.anchor_ms = time.time_ns() // 1_000_000
        self.advanced_ms = 0

    def cross_boundary(self, *procs: Proc) -> None:
        """Where a window test has counted some traffic and is about to count or read more: with
        a pinned clock, move ``procs`` just past the boundary the pin sits before, so what came
        before lands in the previous bucket; with the usual mid-bucket clock, nothing."""
        if self.pinned_ms is not None:
            gap = self.pinned_ms + PIN_BEFORE_MS + 1 - self.now_ms()
            if gap > 0:
                self.advance(gap, *procs)

    def env(self) -> dict[str, str]:
        return {
            "FAIRGATE_TESTING": "1",
            # a process started after an advance starts where the others are
            "FAIRGATE_TEST_CLOCK": str(self.start_ms + self.advanced_ms),
            "FAIRGATE_TEST_CLOCK_ANCHOR": str(self.anchor_ms),
            "FAIRGATE_TEST_CLOCK_RATE": str(self.rate),
        }

    def now_ms(self) -> int:
        """The time the processes read now (they compute it the same way)."""
        elapsed = (time.time_ns() // 1_000_000 - self.anchor_ms) * self.rate
        return self.start_ms + elapsed + self.advanced_ms

    def advance(self, ms: int, *procs: Proc) -> None:
        """Move the clock of every process given (gateways and mocks) forward by ``ms``."""
        for p in procs:
            path = "/_mock/clock" if p.data_dir is None else "/api/testing/clock"
            r = httpx.post(
                p.url + path,
                json={"advanceMs": ms},
                headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                timeout=10,
            )
            assert r.status_code == 200, r.text
        self.advanced_ms += ms


TEST_CLOCK = ClockPlan()


def window_count_range(n: float, window: str, since_ms: int, now_ms: int) -> tuple[float, float]:
    """The values a sliding-window counter can show at ``now_ms`` when ``n`` units were counted
    between ``since_ms`` and ``now_ms``: exactly ``n`` within one bucket; across a boundary the
    units of the previous bucket fade (``prev × (1 − elapsed/W)``), at worst all of them."""
    w = Window(window).ms
    if bucket_index(since_ms, w) == bucket_index(now_ms, w):
        return n, n
    return sliding_value(n, 0.0, now_ms, w), n


def assert_window_count(value: float, n: float, window: str, since_ms: int) -> None:
    """``value`` is what a counter of ``window`` holding ``n`` units counted since ``since_ms``
    (a :data:`TEST_CLOCK` reading taken before the first of them) may show now."""
    now = TEST_CLOCK.now_ms()
    lo, hi = window_count_range(n, window, since_ms, now)
    assert lo - 1e-6 * max(1.0, n) <= value <= hi + 1e-6 * max(1.0, n), (value, n, window, lo)
    crossings = os.environ.get(CROSSINGS_ENV)
    if crossings and lo < hi:  # the guard checks that its boundary really passed under a count
        with open(crossings, "a") as fh:
            fh.write(f"{window} {since_ms} {now} {value} {n}\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    data_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return int(self.proc.returncode)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def rss_kib(pid: int) -> int:
    """The resident memory of process ``pid`` in KiB (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def sockets_to(pid: int, port: int) -> int:
    """How many of process ``pid``'s open descriptors are TCP sockets connected to ``port``
    (its remote end), e.g. a gateway's connections to the mock upstream (Linux: the socket
    inodes of ``/proc/PID/fd`` looked up in ``/proc/net/tcp`` and ``tcp6``)."""
    remote: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            remote[fields[9]] = int(fields[2].rsplit(":", 1)[1], 16)  # inode -> remote port
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:[") and remote.get(target[8:-1]) == port:
            count += 1
    return count


def wait_ready(proc: Proc, path: str, timeout: float = 120) -> None:
    """Poll ``path`` until the process answers. The bound is for a process that hangs; a start
    that takes 5 s quiet took over 30 s at load average 30 on two cores (seen: "process not
    ready after 30s" in restart, outage and stress tests), and a process that dies is reported
    at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"process exited early:\n{proc.output()}")
        try:
            with urllib.request.urlopen(proc.url + path, timeout=1) as r:
                if r.status < 500:
                    return
        except OSError:
            time.sleep(0.05)
    proc.stop()
    raise RuntimeError(f"process not ready after {timeout}s:\n{proc.output()}")


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``python -m fairgate <args>`` on the module's test clock (``env`` may override it)."""
    full_env = {**os.environ, **TEST_CLOCK.env(), **(env or {})}
    with log.open("wb") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "fairgate", *args],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=full_env,
        )


def start_mock(log: Path) -> Proc:
    """A mock provider process on a free port that takes ``UPSTREAM_SECRET``, logging to ``log``,
    once it answers; the caller stops it."""
    port = free_port()
    p = Proc(
        spawn(["mock-upstream", "--port", str(port), "--secret", UPSTREAM_SECRET], log),
        f"http://127.0.0.1:{port}",
        log,
    )
    wait_ready(p, "/_mock/stats")
    return p


@pytest.fixture(scope="module")
def mock_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    p = start_mock(tmp_path_factory.mktemp("mock") / "mock.log")
    yield p
    p.stop()


#: A mock connection's clause that lets a test's ``x-mock-fault`` header through (the gateway
#: forwards no client header that a connection's ``forward_headers`` does not list).
FAULTS = ", forward_headers: [x-mock-fault]"


def gateway_config(mock_url: str, pools_yaml: str = "", keys: dict[str, str] | None = None) -> str:
    """Three connections; every key may use those outside every pool (its providers are
    listed); a pooled one needs an allocation (``server.require_allocation``, on by default)."""
    keys = keys or {}
    key_lines = "".join(
        f"  - {{id: {kid}, name: {kid}, secret: '{secret}',"
        " allowed_providers: [mock, anthropic]}\n"
        for kid, secret in keys.items()
    )
    return (
        "server: {default_provider: mock}\n"
        "connections:\n"
        f"  - {{id: mock-1, provider: mock, base_url: '{mock_url}/v1', secret: '{UPSTREAM_SECRET}',"
        f" models: [gpt-4o-mini]{FAULTS}}}\n"
        f"  - {{id: mock-2, provider: mock, base_url: '{mock_url}/v1', secret: '{UPSTREAM_SECRET}',"
        f" models: [gpt-4o-mini], weight: 0.5{FAULTS}}}\n"
        f"  - {{id: claude-1, provider: anthropic, base_url: '{mock_url}/v1',"
        f" secret: '{UPSTREAM_SECRET}', models: [claude-sonnet-4]}}\n"
        f"keys:\n{key_lines}" + pools_yaml
    )


GatewayFactory = Callable[..., Proc]


def launch_gateway(
    workdir: Path,
    config_yaml: str,
    env: dict[str, str],
    *,
    data_dir: Path | None = None,
    name: str = "gw",
    port: int | None = None,
    extra_args: tuple[str, ...] = (),
) -> Proc:
    port = port or free_port()
    ddir = data_dir or (workdir / f"data-{name}")
    ddir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / f"{name}.yaml"
    cfg.write_text(config_yaml)
    log = workdir / f"{name}.log"
    full_env = {"FAIRGATE_ADMIN_KEY": ADMIN_KEY, **env}
    args = ["serve", "--config", str(cfg), "--port", str(port), "--data-dir", str(ddir)]
    p = Proc(
        spawn(
            [*args, *extra_args],
            log,
            full_env,
        ),
        f"http://127.0.0.1:{port}",
        log,
        ddir,
        full_env,
    )
    wait_ready(p, "/health")
    return p


def module_gateway(workdir: Path, config_yaml: str) -> Iterator[Proc]:
    """A module-scoped fixture's gateway on ``config_yaml`` (``yield from`` it): launched in
    ``workdir``, stopped when the module's tests are done."""
    p = launch_gateway(workdir, config_yaml, {})
    yield p
    p.stop()


#: The FAIRGATE_SECRET_KEY of the test gateways that share a PostgreSQL metadata DB (a valid
#: Fernet key; fixed so replicas started apart agree).
SHARED_SECRET_KEY = "dGVzdC1vbmx5LWtleS1mb3ItZmFpcmdhdGUtc3ViMTI="


@pytest.fixture
def start_gateway(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[GatewayFactory]:
    """Start gateway processes; ``driver="redis"`` points them at the test Redis (own prefix)."""
    started: list[Proc] = []

    def factory(
        config_yaml: str,
        *,
        driver: str = "sqlite",
        data_dir: Path | None = None,
        extra_env: dict[str, str] | None = None,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> Proc:
        env = {"QUOTA_STORE_DRIVER": driver, **(extra_env or {})}
        if "FAIRGATE_DATABASE_URL" in env:
            # replicas sharing a PostgreSQL DB must share the key of the secrets at rest
            env.setdefault("FAIRGATE_SECRET_KEY", SHARED_SECRET_KEY)
        if driver == "redis":
            env["QUOTA_STORE_REDIS_URL"] = request.getfixturevalue("redis_url")
            env.setdefault("QUOTA_STORE_REDIS_PREFIX", request.getfixturevalue("redis_prefix"))
        p = launch_gateway(
            tmp_path,
            config_yaml,
            env,
            data_dir=data_dir,
            name=f"gw{len(started)}",
            port=port,
            extra_args=extra_args,
        )
        started.append(p)
        return p

    yield factory
    for p in started:
        p.stop()


def logged_diagnostics(proc: Proc) -> list[dict[str, Any]]:
    """The admin's full diagnostics of every failed request so far, oldest first, from the
    gateway's JSON log (a client's error body carries only reason codes)."""
    out: list[dict[str, Any]] = []
    for line in proc.output().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("msg") == "request failed":
            out.append(event["diagnostics"])
    return out


def new_secret() -> str:
    return "fg-test-" + uuid.uuid4().hex
