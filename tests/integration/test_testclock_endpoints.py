"""The test clock's control endpoints on a gateway and on the mock upstream, and how the CLI
chooses the process clock: only under ``FAIRGATE_TESTING=1``, admin-only, 404 otherwise."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from cli_support import refused_at_start
from fairgate.admin.api import create_admin_app
from fairgate.cli import _free_port
from fairgate.clock import Clock, ManualClock
from fairgate.mock.server import MockConfig, MockUpstream
from fairgate.process.state import Gateway
from fairgate.testclock import ShiftedClock

ADMIN = "adm-clock-test"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
START_MS = 1_782_297_000_000  # 2026-06-24T10:30:00Z

Start = Callable[[Clock], Awaitable[tuple[Gateway, httpx.AsyncClient]]]


@pytest_asyncio.fixture
async def gateway_on(tmp_path: Path) -> AsyncIterator[Start]:
    """Start a gateway on a given clock; yields a factory of (gateway, admin client)."""
    opened: list[tuple[Gateway, httpx.AsyncClient]] = []

    async def start(clock: Clock) -> tuple[Gateway, httpx.AsyncClient]:
        gw = Gateway(data_dir=tmp_path / str(len(opened)), env={}, clock=clock, admin_key=ADMIN)
        await gw.start()
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_admin_app(gw)), base_url="http://admin"
        )
        opened.append((gw, client))
        return gw, client

    yield start
    for gw, client in opened:
        await client.aclose()
        await gw.stop()


async def test_admin_reads_and_advances_the_test_clock(gateway_on: Start) -> None:
    real = ManualClock(5_000_000)
    clock = ShiftedClock(START_MS, rate=1.0, anchor_ms=5_000_000, real=real)
    gw, api = await gateway_on(clock)
    r = await api.get("/testing/clock", headers=AUTH)
    assert r.status_code == 200
    assert r.json() == {
        "nowMs": START_MS,
        "startMs": START_MS,
        "anchorMs": 5_000_000,
        "rate": 1.0,
        "advancedMs": 0,
    }
    real.advance(250)
    r = await api.post("/testing/clock", json={"advanceMs": 3_600_000}, headers=AUTH)
    assert r.status_code == 200
    assert r.json()["nowMs"] == START_MS + 3_600_250
    # the one clock of the process: the quota engine and the resilience manager read it too
    assert gw.engine.clock.now_ms() == START_MS + 3_600_250
    for bad in ({"advanceMs": -1}, {"advanceMs": "1h"}, {}, [1]):
        r = await api.post("/testing/clock", json=bad, headers=AUTH)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["fields"][0]["field"] == "advanceMs"
    assert clock.now_ms() == START_MS + 3_600_250  # a refused request moved nothing
    # admin-only, and left out of the public schema
    assert (await api.get("/testing/clock")).status_code == 401
    schema = (await api.get("/openapi.json")).json()
    assert not [p for p in schema["paths"] if "testing" in p]


@pytest.mark.parametrize("clock", [ManualClock(START_MS), None], ids=["manual", "system"])
async def test_without_a_test_clock_the_route_does_not_exist(
    gateway_on: Start, clock: Clock | None
) -> None:
    from fairgate.clock import SYSTEM_CLOCK

    _, api = await gateway_on(clock or SYSTEM_CLOCK)
    for method, body in (("GET", None), ("POST", {"advanceMs": 1000})):
        r = await api.request(method, "/testing/clock", json=body, headers=AUTH)
        assert r.status_code == 404
        assert r.json()["error"]["type"] == "not_found_error"
    assert (await api.get("/testing/clock")).status_code == 401  # still admin-only first


async def test_mock_upstream_runs_on_the_test_clock_and_can_be_moved() -> None:
    real = ManualClock(9_000_000)
    clock = ShiftedClock(START_MS, rate=0, real=real)  # frozen
    async with MockUpstream(MockConfig(), clock=clock) as mock, httpx.AsyncClient() as http:
        r = await http.get(mock.url + "/_mock/clock")
        assert r.json()["nowMs"] == START_MS
        r = await http.post(mock.url + "/_mock/clock", json={"advanceMs": 60_000})
        assert r.json()["nowMs"] == START_MS + 60_000
        chat = await http.post(
            mock.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.json()["created"] == (START_MS + 60_000) // 1000
        bad = await http.post(mock.url + "/_mock/clock", json={"advanceMs": -5})
        assert bad.status_code == 400
        assert "advanceMs" in bad.json()["error"]
    async with MockUpstream(MockConfig()) as mock, httpx.AsyncClient() as http:
        assert (await http.get(mock.url + "/_mock/clock")).status_code == 404
        r = await http.post(mock.url + "/_mock/clock", json={"advanceMs": 1})
        assert r.status_code == 404


@pytest.mark.parametrize("value", ["garbage", "2026-06-24T10:30:00"], ids=["unreadable", "no-zone"])
@pytest.mark.parametrize("command", ["serve", "mock-upstream", "demo"])
def test_cli_refuses_a_test_clock_it_cannot_read(command: str, value: str, tmp_path: Path) -> None:
    args = [command, "--port", str(_free_port())]
    if command != "mock-upstream":
        args += ["--data-dir", str(tmp_path)]
    env = {**os.environ, "FAIRGATE_TESTING": "1", "FAIRGATE_TEST_CLOCK": value}
    assert "FAIRGATE_TEST_CLOCK" in refused_at_start(args, env)
