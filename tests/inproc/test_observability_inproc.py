"""``GET /metrics`` of the whole app under traffic: the exposition parses with
prometheus_client's own parser, and the counters, histograms and pool gauges move by exactly
what was sent (successes, a quota block, an unknown model, a bad key), with bounded labels; a
metrics key guards the endpoint when set.

Moved from ``tests/e2e/test_observability.py`` (a gateway process each); the JSON logs a real
process writes stay there."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from inproc_support import Harness, MockUpstream, gateway, two_mock_members

from fairgate.timers import ManualTimer
from metrics_support import Samples, samples_of, val

SECRET = "fg-test-" + uuid.uuid4().hex


def config() -> dict[str, Any]:
    pool = {
        "id": "p",
        "connections": ["mock-1", "mock-2"],
        # the pool's own limit: 4 in all, whatever its members
        "dimensions": [{"unit": "requests", "window": "hourly", "limit": 4}],
        "allocations": [{"key": "a", "weight": 100, "policy": "hard"}],
    }
    return two_mock_members({"a": SECRET}, pool)


async def scrape(h: Harness, headers: dict[str, str] | None = None) -> Samples:
    return samples_of(await h.client.get("/metrics", headers=headers))


async def chat(h: Harness, secret: str = SECRET, model: str = "mock/gpt-4o-mini") -> int:
    r = await h.chat(model, key=secret, max_tokens=4)
    return r.status_code


async def test_metrics_move_with_traffic(tmp_path: Path) -> None:
    async with gateway(tmp_path, config(), ManualTimer(), MockUpstream()) as h:
        before = await scrape(h)
        req = "fairgate_requests_total"
        ok_labels = {"key": "a", "model": "mock/gpt-4o-mini", "status": "200"}
        assert val(before, req, **ok_labels) == 0
        assert val(before, "fairgate_pool_limit", pool="p", dimension="requests/hourly") == 4

        assert [await chat(h) for _ in range(4)] == [200] * 4
        blocked = 2
        assert [await chat(h) for _ in range(blocked)] == [429] * blocked
        unbounded = "mock/no-such-model-" + uuid.uuid4().hex  # unbounded input...
        assert await chat(h, model=unbounded) == 404
        assert await chat(h, secret="fg-wrong-" + uuid.uuid4().hex) == 401
        await h.settle_background()
        after = await scrape(h)

    def delta(name: str, **labels: str) -> float:
        return val(after, name, **labels) - val(before, name, **labels)

    assert delta(req, **ok_labels) == 4
    assert delta(req, key="a", status="429", connection="none") == blocked
    assert delta(req, key="a", status="404", model="other") == 1  # ...a bounded label
    assert delta(req, key="none", status="401", model="none") == 1  # refused before parsing
    served = {ls for (n, ls), _ in after.items() if n == req and ("status", "200") in ls}
    assert {dict(ls)["connection"] for ls in served} <= {"mock-1", "mock-2"}
    # admissions: 4 allowed, then each blocked request was refused by both pool members' pool
    assert delta("fairgate_admissions_total", outcome="allow") == 4
    assert delta("fairgate_admissions_total", outcome="block") == blocked
    block_reasons = {
        dict(ls)["reason"]
        for (n, ls), v in after.items()
        if n == "fairgate_admissions_total" and ("outcome", "block") in ls and v
    }
    assert block_reasons <= {"fair-share", "global-saturated", "cap-absolute"}
    assert block_reasons
    assert delta("fairgate_fail_open_total") == 0
    # histograms: one observation per answered request
    assert delta("fairgate_upstream_latency_seconds_count") == 4
    assert delta("fairgate_overhead_seconds_count") == 4
    assert delta("fairgate_overhead_seconds_sum") > 0
    # scrape-time gauges (the clock stood still: exact counts)
    dim = {"pool": "p", "dimension": "requests/hourly"}
    total = val(after, "fairgate_pool_total", **dim)
    assert total == pytest.approx(4)
    assert val(after, "fairgate_pool_usage", **dim) == pytest.approx(total / 4)
    assert val(after, "fairgate_pool_key_consumed", key="a", **dim) == pytest.approx(4)
    assert val(after, "fairgate_quota_store_up", driver="sqlite") == 1
    assert val(after, "fairgate_inflight_requests") == 0


async def test_metrics_key_guards_the_endpoint_when_set(tmp_path: Path) -> None:
    env = {"FAIRGATE_METRICS_KEY": "scrape-me-123"}
    async with gateway(tmp_path, config(), ManualTimer(), MockUpstream(), env=env) as h:
        r = await h.client.get("/metrics")
        assert r.status_code == 401
        assert "FAIRGATE_METRICS_KEY" in r.text
        r = await h.client.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
        samples = await scrape(h, {"Authorization": "Bearer scrape-me-123"})
        assert val(samples, "fairgate_fail_open_total") == 0


@pytest.mark.parametrize(
    ("trusted", "status"), [(None, 403), ("10.0.0.1", 200)], ids=["loopback-proxy", "untrusted"]
)
async def test_metrics_see_the_client_a_trusted_proxy_forwards(
    tmp_path: Path, trusted: str | None, status: int
) -> None:
    """``/metrics`` answers loopback clients only: a request a proxy on the host forwards for
    an outside address is refused; from a peer not in ``FORWARDED_ALLOW_IPS`` the header is
    ignored (the peer itself is the client)."""
    env = {} if trusted is None else {"FORWARDED_ALLOW_IPS": trusted}
    async with gateway(tmp_path, config(), ManualTimer(), MockUpstream(), env=env) as h:
        forwarded = {"X-Forwarded-For": "203.0.113.9"}
        assert (await h.client.get("/metrics", headers=forwarded)).status_code == status
        assert (await h.client.get("/metrics")).status_code == 200
