"""Real processes on loopback: the mock upstream and the gateway, started as users start them."""

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

import pytest

UPSTREAM_SECRET = "sk-upstream-test-0123456789abcdef"
ADMIN_KEY = "fg-admin-e2e-key"


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


def wait_ready(proc: Proc, path: str, timeout: float = 30) -> None:
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
    full_env = {**os.environ, **(env or {})}
    with log.open("wb") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "fairgate", *args],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=full_env,
        )


@pytest.fixture(scope="module")
def mock_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    port = free_port()
    log = tmp_path_factory.mktemp("mock") / "mock.log"
    p = Proc(
        spawn(["mock-upstream", "--port", str(port), "--secret", UPSTREAM_SECRET], log),
        f"http://127.0.0.1:{port}",
        log,
    )
    wait_ready(p, "/_mock/stats")
    yield p
    p.stop()


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
        " models: [gpt-4o-mini]}\n"
        f"  - {{id: mock-2, provider: mock, base_url: '{mock_url}/v1', secret: '{UPSTREAM_SECRET}',"
        " models: [gpt-4o-mini], weight: 0.5}\n"
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
) -> Proc:
    port = free_port()
    ddir = data_dir or (workdir / f"data-{name}")
    ddir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / f"{name}.yaml"
    cfg.write_text(config_yaml)
    log = workdir / f"{name}.log"
    full_env = {"FAIRGATE_ADMIN_KEY": ADMIN_KEY, **env}
    p = Proc(
        spawn(
            ["serve", "--config", str(cfg), "--port", str(port), "--data-dir", str(ddir)],
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
    ) -> Proc:
        env = {"QUOTA_STORE_DRIVER": driver, **(extra_env or {})}
        if driver == "redis":
            env["QUOTA_STORE_REDIS_URL"] = request.getfixturevalue("redis_url")
            env.setdefault("QUOTA_STORE_REDIS_PREFIX", request.getfixturevalue("redis_prefix"))
        p = launch_gateway(tmp_path, config_yaml, env, data_dir=data_dir, name=f"gw{len(started)}")
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
