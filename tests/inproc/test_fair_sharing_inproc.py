"""Three keys 50/30/20 share a pool of 100 requests/hour through the whole HTTP app: a greedy
key is held to its share once the pool is strict, the others still get through, and the counts
the admin API shows are exact. On both quota store drivers, mid-bucket and across an hourly
boundary (the clock starts 1 s before it and passes it between the greedy key's two bursts: the
previous bucket's count fades, ``prev × (1 − elapsed/W)``, and lets at most what faded in).

Moved from ``tests/e2e/test_fair_sharing.py`` (a gateway process per driver); several
processes sharing one Redis store are covered in ``tests/e2e/test_replicas.py``."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest
from inproc_support import (
    ADMIN,
    Harness,
    MockUpstream,
    base_config,
    conn,
    gateway,
    two_mock_members,
)

from fairgate.timers import ManualTimer

KEYS = {k: f"fg-test-{k}-{i}e3b0c44298fc1c149afbf4c8996fb924" for i, k in enumerate("abc")}


def config() -> dict[str, object]:
    pool = {
        "id": "shared",
        "name": "Shared",
        "connections": ["mock-1", "mock-2"],  # the pool's own limit: 100 in all
        "dimensions": [{"unit": "requests", "window": "hourly", "limit": 100}],
        "allocations": [
            {"key": "a", "weight": 50, "policy": "hard"},
            {"key": "b", "weight": 30, "policy": "hard"},
            {"key": "c", "weight": 20, "policy": "hard"},
        ],
    }
    return two_mock_members(KEYS, pool)


async def send(h: Harness, key: str, n: int) -> tuple[int, list[httpx.Response]]:
    ok, blocked = 0, []
    for _ in range(n):
        r = await h.chat(
            "mock/gpt-4o-mini",
            key=KEYS[key],
            messages=[{"role": "user", "content": "x"}],
            max_tokens=2,
        )
        if r.status_code == 200:
            ok += 1
        else:
            assert r.status_code == 429, r.text
            blocked.append(r)
    return ok, blocked


HOUR_MS = 3_600_000
#: 2026-06-24T11:00:00Z, an hourly boundary (also what the e2e boundary guard pins)
BOUNDARY_MS = 1_782_298_800_000


def faded_range(n: float, since_ms: int, now_ms: int) -> tuple[float, float]:
    """What an hourly counter holding ``n`` units counted since ``since_ms`` may show at
    ``now_ms``: ``n`` within one bucket; across a boundary, the previous bucket's units fade."""
    if since_ms // HOUR_MS == now_ms // HOUR_MS:
        return n, n
    return n * (1 - (now_ms % HOUR_MS) / HOUR_MS), n


@pytest.mark.parametrize("crossing", [False, True], ids=["mid-bucket", "across-boundary"])
@pytest.mark.parametrize("driver", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
async def test_greedy_key_held_to_its_share_others_served(
    tmp_path: Path, driver: str, crossing: bool, request: pytest.FixtureRequest
) -> None:
    env: dict[str, str] = {}
    if driver == "redis":
        env = {
            "QUOTA_STORE_DRIVER": "redis",
            "QUOTA_STORE_REDIS_URL": request.getfixturevalue("redis_url"),
            "QUOTA_STORE_REDIS_PREFIX": request.getfixturevalue("redis_prefix"),
        }
    timer = ManualTimer()
    timer.set(BOUNDARY_MS - 1_000 if crossing else BOUNDARY_MS + HOUR_MS // 2)
    since = timer.clock.now_ms()
    async with gateway(tmp_path, config(), timer, MockUpstream(), env=env) as h:
        assert h.gw.store_choice.driver == driver
        ok_a, blocked_a = await send(h, "a", 30)
        if crossing:  # the first 30 in the previous bucket
            timer.advance(1_001)
        more_ok, more_blocked = await send(h, "a", 30)
        ok_a, blocked_a = ok_a + more_ok, blocked_a + more_blocked
        # generous up to 50 % of the pool, then strict: a's share is exactly 50 within one
        # bucket; across the boundary what faded lets a few more in (a key is held once its
        # count reaches its share, so any fade below it admits one more): at most ceil(faded)
        now = timer.clock.now_ms()
        faded = 50 - faded_range(50, since, now)[0]
        assert 50 <= ok_a <= 50 + math.ceil(faded)
        assert ok_a == 50 or crossing
        assert len(blocked_a) == 60 - ok_a
        err = blocked_a[0]
        assert int(err.headers["retry-after"]) >= 1
        body = err.json()["error"]
        assert body["reason"] == "fair-share"
        assert body["dimension"] == "requests/hourly"
        assert body["code"] == "rate_limit_exceeded"
        assert body["message"] == "Quota share limit reached for your API key on mock"

        assert await send(h, "b", 10) == (10, [])
        assert await send(h, "c", 10) == (10, [])

        usage = (await h.client.get("/api/quota/pools/shared/usage", headers=ADMIN)).json()
        (dim,) = usage["dimensions"]
        assert dim["limit"] == pytest.approx(100)
        consumed = {k["keyId"]: k["consumed"] for k in dim["keys"]}
        assert (consumed["b"], consumed["c"]) == pytest.approx((10, 10))  # after the boundary
        lo, hi = faded_range(ok_a, since, now)
        assert lo - 1e-6 <= consumed["a"] <= hi + 1e-6
        assert lo + 20 - 1e-6 <= dim["total"] <= hi + 20 + 1e-6
        assert consumed["a"] < ok_a or not crossing  # the boundary really passed under it
        log = (await h.client.get("/api/quota/pools/shared/log?limit=500", headers=ADMIN)).json()
        entries = log if isinstance(log, list) else log.get("entries", log.get("events", []))
        assert sum(1 for e in entries if e["outcome"] == "block") == 60 - ok_a


async def test_a_paced_week_tells_a_refused_key_when_its_line_lets_it_in(tmp_path: Path) -> None:
    """A subscription-shaped pool (250 requests per 5 hours, 6,000 a week), active, 24 hours
    into a week that has spent 900: the week is paced (the 5-hour windows would spend it
    early) and the line rises 35.7 an hour. A refused request's 429 says to come back when the
    line passes 901, 4,421 s on; before, Retry-After counted on the week's total alone, which
    does not fade before the week ends (547,872 s)."""
    week_ms = 7 * 24 * HOUR_MS
    pool = {
        "id": "week",
        "connections": ["c1"],
        "share_mode": "active",
        "dimensions": [
            {"unit": "requests", "window": "5h", "limit": 250},
            {"unit": "requests", "window": "weekly", "limit": 6000},
        ],
        "allocations": [{"key": "alice", "weight": 50}, {"key": "bob", "weight": 50}],
    }
    cfg = base_config([conn("c1")], pools=[pool])
    timer = ManualTimer()
    timer.set((BOUNDARY_MS // week_ms + 1) * week_ms + 24 * HOUR_MS)
    async with gateway(tmp_path, cfg, timer, MockUpstream()) as h:
        week = h.gw.registry.pools["week"]
        await h.gw.engine.record(week, "bob", {"requests/weekly": 900.0, "requests/5h": 200.0})
        r = await h.chat("m", max_tokens=5)
        assert r.status_code == 429, r.text
        body = r.json()["error"]
        assert (body["reason"], body["dimension"]) == ("fair-share", "requests/weekly")
        line_per_s = 6000 / (week_ms / 1000)
        assert int(r.headers["retry-after"]) == math.ceil((901 - 6000 * 24 / 168) / line_per_s)
