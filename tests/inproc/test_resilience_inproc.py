"""Resilience through the whole request path: cooldowns and fallback, the all-unavailable
answer, cooldowns and permanent blocks kept across a restart on the same files until an admin
clears them, and the resilience settings through the admin API.

Moved from ``tests/e2e/test_resilience.py`` (a gateway process and two mock processes per
test; the cooldown test slept 2.2 s of real time, here the injected clock moves). Two replicas
sharing a cooldown through Redis stay there: that needs two processes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from inproc_support import (
    ADMIN,
    UPSTREAM_SECRET,
    Harness,
    MockUpstream,
    base_config,
    conn,
    failed_diagnostics,
    gateway,
)

from fairgate.providers.inprocess import Reply, UpstreamRequest
from fairgate.timers import ManualTimer

GPT = "gpt-4o-mini"


class TwoAccounts:
    """conn-a (weight 2, first choice) and conn-b, each answered by its own mock."""

    def __init__(self) -> None:
        self.a = MockUpstream()
        self.b = MockUpstream()

    async def __call__(self, req: UpstreamRequest) -> Reply:
        return await (self.a if req.conn.id == "conn-a" else self.b)(req)


def two_upstreams() -> dict[str, Any]:
    return base_config([conn("conn-a", models=(GPT,), weight=2), conn("conn-b", models=(GPT,))])


async def chat(h: Harness) -> Any:
    return await h.chat(GPT, messages=[{"role": "user", "content": "x"}], max_tokens=3)


async def test_429_puts_connection_in_cooldown_and_traffic_falls_over(tmp_path: Path) -> None:
    up, timer = TwoAccounts(), ManualTimer()
    async with gateway(tmp_path, two_upstreams(), timer, up) as h:
        up.a.schedule("429:2")
        first = await chat(h)
        assert first.status_code == 200
        assert first.headers["x-fairgate-connection"] == "conn-b"  # fell over after A's 429
        assert up.a.requests == 1
        for _ in range(5):  # A is cooling down: nothing reaches it until the deadline
            r = await chat(h)
            assert (r.status_code, r.headers["x-fairgate-connection"]) == (200, "conn-b")
        assert up.a.requests == 1
        health = (await h.client.get("/api/monitoring/health", headers=ADMIN)).json()
        cooling = [
            c
            for c in health["resilience"]["cooldowns"]
            if c.get("connection_id") == "conn-a" or "conn-a" in str(c)
        ]
        assert cooling
        timer.advance(1_900)  # not yet
        assert (await chat(h)).headers["x-fairgate-connection"] == "conn-b"
        timer.advance(300)
        back = await chat(h)
        assert (back.status_code, back.headers["x-fairgate-connection"]) == (200, "conn-a")
        assert up.a.requests == 2


async def test_all_cooling_down_is_429_with_earliest_retry_after_and_diagnostics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    up = TwoAccounts()
    async with gateway(tmp_path, two_upstreams(), ManualTimer(), up) as h:
        up.a.schedule("429:7")
        # both cool down for longer than the default maxWaitMs (5 s): no wait, 429 at once
        up.b.schedule("429:6")
        with caplog.at_level(logging.INFO):
            first = await chat(h)  # both answer 429 → the upstream's 429 comes back
            assert first.status_code == 429
            body = first.json()
            assert body["diagnostics"]["terminalReason"] == "upstream_failed"
            assert body["diagnostics"]["attempted"] == [
                {"target": f"mock/{GPT}", "outcome": "failed"},
                {"target": f"mock/{GPT}", "outcome": "failed"},
            ]
            assert [a["target"] for a in failed_diagnostics(caplog.records)[-1]["attempted"]] == [
                f"mock/{GPT}@conn-a",
                f"mock/{GPT}@conn-b",
            ]
            second = await chat(h)  # now both are cooling down: nothing is sent anywhere
        assert second.status_code == 429
        assert int(second.headers["retry-after"]) == 6  # the earliest to free (conn-b)
        diag = second.json()["diagnostics"]
        assert diag["terminalReason"] == "all_rate_limited"
        assert [e["reason"] for e in diag["excluded"]] == ["cooling_down", "cooling_down"]
        excluded = failed_diagnostics(caplog.records)[-1]["excluded"]
        assert {(e["target"], e["reason"]) for e in excluded} == {
            (f"mock/{GPT}@conn-a", "cooldown"),
            (f"mock/{GPT}@conn-b", "cooldown"),
        }
        assert diag["recoveryHint"]["retry_after_seconds"] >= 1
        assert second.headers["x-fairgate-combo-terminal"] == "all_rate_limited"
        assert "Traceback" not in second.text
        assert UPSTREAM_SECRET not in second.text
        assert (up.a.requests, up.b.requests) == (1, 1)


async def test_restart_keeps_cooldowns_and_permanent_blocks_until_an_admin_clears_them(
    tmp_path: Path,
) -> None:
    """A restart is a new app on the same data directory (the metadata DB keeps the state)."""
    up, timer, cfg = TwoAccounts(), ManualTimer(), two_upstreams()
    async with gateway(tmp_path, cfg, timer, up) as h:
        up.a.schedule("quota")
        assert (await chat(h)).headers["x-fairgate-connection"] == "conn-b"
    async with gateway(tmp_path, cfg, timer, up) as again:
        for _ in range(3):
            assert (await chat(again)).headers["x-fairgate-connection"] == "conn-b"
        assert up.a.requests == 1  # the permanent block survived the restart
        health = (await again.client.get("/api/monitoring/health", headers=ADMIN)).json()
        assert health["resilience"]["permanent"]
        clear = {"connectionId": "conn-a"}
        r = await again.client.delete("/api/resilience/permanent", params=clear, headers=ADMIN)
        assert r.status_code == 204
        assert (await chat(again)).headers["x-fairgate-connection"] == "conn-a"
        r = await again.client.delete("/api/resilience/permanent", params=clear, headers=ADMIN)
        assert r.status_code == 404
        r = await again.client.delete("/api/resilience/lockout", headers=ADMIN)
        assert r.status_code == 422
        # a timed cooldown survives a restart too
        up.a.schedule("429:30")
        assert (await chat(again)).headers["x-fairgate-connection"] == "conn-b"
        seen = up.a.requests
    async with gateway(tmp_path, cfg, timer, up) as third:
        assert (await chat(third)).headers["x-fairgate-connection"] == "conn-b"
        assert up.a.requests == seen


async def test_resilience_settings_through_the_admin_api(tmp_path: Path) -> None:
    env = {"RESILIENCE_BREAKER_MIN_REQUESTS": "7"}
    async with gateway(tmp_path, two_upstreams(), ManualTimer(), TwoAccounts(), env=env) as h:
        url = "/api/resilience/settings"
        current = (await h.client.get(url, headers=ADMIN)).json()["settings"]
        assert current["breaker_min_requests"] == 7  # from the environment
        r = await h.client.put(
            url,
            headers=ADMIN,
            json={
                "settings": {"breakerMinRequests": 9},
                "providers": {"mock": {"apikeyBaseCooldownMs": 500}},
            },
        )
        assert r.status_code == 200
        assert r.json()["settings"]["breaker_min_requests"] == 9  # the DB setting wins over env
        assert r.json()["settings"]["providers"]["mock"]["apikey_base_cooldown_ms"] == 500
        bad = await h.client.put(
            url, headers=ADMIN, json={"settings": {"breakerThreshold": 7, "noSuchKnob": 1}}
        )
        assert bad.status_code == 422
        fields = {f["field"] for f in bad.json()["error"]["fields"]}
        assert fields == {"settings.breakerThreshold", "settings.noSuchKnob"}
        after = (await h.client.get(url, headers=ADMIN)).json()["settings"]
        assert after["breaker_min_requests"] == 9  # the rejected request changed nothing
        assert (await h.client.put(url, json={"settings": {}})).status_code == 401
