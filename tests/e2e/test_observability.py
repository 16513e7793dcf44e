"""``GET /metrics`` and the JSON logs of a real gateway process under real traffic (openai SDK).

Metrics: the exposition parses with prometheus_client's own parser, and the counters, histograms
and pool gauges move by exactly what was sent (successes, a quota block, an unknown model, a bad
key), with bounded labels. Logs: every line the process writes is one JSON object, request-scoped
events carry the request id (the client's ``x-request-id`` when it sent one), and neither the
client key nor the upstream secret appears anywhere.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from e2e_support import (
    ADMIN_KEY,
    TEST_CLOCK,
    UPSTREAM_SECRET,
    GatewayFactory,
    Proc,
    assert_window_count,
    gateway_config,
    new_secret,
)
from prometheus_client.parser import text_string_to_metric_families

POOL = (
    "pools:\n"
    "  - id: p\n"
    "    connections: [mock-1, mock-2]\n"
    "    dimensions: [{unit: requests, window: hourly, limit: 2}]\n"  # 2 members: 4 in all
    "    allocations:\n"
    "      - {key: a, weight: 100, policy: hard}\n"
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(gw: Proc, headers: dict[str, str] | None = None) -> Samples:
    r = httpx.get(gw.url + "/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def val(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def chat(gw: Proc, secret: str, model: str = "mock/gpt-4o-mini", **kw: Any) -> Any:
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=secret, max_retries=0) as c:
        return c.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, **kw
        )


def test_metrics_move_with_traffic(mock_upstream: Proc, start_gateway: GatewayFactory) -> None:
    secret = new_secret()
    since = TEST_CLOCK.now_ms()
    gw = start_gateway(gateway_config(mock_upstream.url, POOL, {"a": secret}))
    before = scrape(gw)
    req = "fairgate_requests_total"
    ok_labels = {"key": "a", "model": "mock/gpt-4o-mini", "status": "200"}
    assert val(before, req, **ok_labels) == 0
    assert val(before, "fairgate_pool_limit", pool="p", dimension="requests/hourly") == 4

    for _ in range(4):
        chat(gw, secret)
    blocked = 0
    for _ in range(2):
        with pytest.raises(openai.RateLimitError):
            chat(gw, secret)
        blocked += 1
    with pytest.raises(openai.NotFoundError):
        chat(gw, secret, model="mock/no-such-model-" + new_secret())  # unbounded input...
    with pytest.raises(openai.AuthenticationError):
        chat(gw, "fg-wrong-" + new_secret())

    TEST_CLOCK.cross_boundary(gw)
    after = scrape(gw)

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
    # scrape-time gauges
    dim = {"pool": "p", "dimension": "requests/hourly"}
    total = val(after, "fairgate_pool_total", **dim)
    assert_window_count(total, 4, "hourly", since)
    assert val(after, "fairgate_pool_usage", **dim) == pytest.approx(total / 4)
    consumed = val(after, "fairgate_pool_key_consumed", key="a", **dim)
    assert_window_count(consumed, 4, "hourly", since)
    assert val(after, "fairgate_quota_store_up", driver="sqlite") == 1
    assert val(after, "fairgate_inflight_requests") == 0


def test_metrics_key_guards_the_endpoint_when_set(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(
        gateway_config(mock_upstream.url, keys={"k": new_secret()}),
        extra_env={"FAIRGATE_METRICS_KEY": "scrape-me-123"},
    )
    r = httpx.get(gw.url + "/metrics")
    assert r.status_code == 401
    assert "FAIRGATE_METRICS_KEY" in r.text
    assert httpx.get(gw.url + "/metrics", headers={"Authorization": "Bearer nope"}).status_code == (
        401
    )
    samples = scrape(gw, {"Authorization": "Bearer scrape-me-123"})
    assert val(samples, "fairgate_fail_open_total") == 0


def test_logs_are_json_with_request_ids_and_no_secrets(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    solo = (  # a connection outside the pool, for an upstream failure
        f"  - {{id: solo, provider: mock, base_url: '{mock_upstream.url}/v1',"
        f" secret: '{UPSTREAM_SECRET}', models: [gpt-4o]}}\nkeys:\n"
    )
    gw = start_gateway(
        gateway_config(mock_upstream.url, POOL, {"a": secret}).replace("keys:\n", solo, 1)
    )
    h = {"Authorization": f"Bearer {secret}"}
    body = {"model": "mock/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    # served (the answer echoes the client's request id)
    r = httpx.post(
        gw.url + "/v1/chat/completions", json=body, headers={**h, "x-request-id": "r-ok"}
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "r-ok"
    # no request id sent: one is made up and echoed
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=h)
    made_up = r.headers["x-request-id"]
    assert len(made_up) >= 16
    # quota blocks
    for i in range(4):
        httpx.post(
            gw.url + "/v1/chat/completions",
            json=body,
            headers={**h, "x-request-id": f"r-block-{i}"},
        )
    # a bad key, a request id that is not a sane token (replaced), one that is a secret (masked)
    httpx.post(gw.url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer x"})
    r = httpx.post(
        gw.url + "/v1/chat/completions", json=body, headers={**h, "x-request-id": "bad id!"}
    )
    assert r.headers["x-request-id"] != "bad id!"
    httpx.post(gw.url + "/v1/chat/completions", json=body, headers={**h, "x-request-id": secret})
    # an upstream failure, on a connection outside the pool (the fault header is passed upstream)
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        json={**body, "model": "mock/gpt-4o"},
        headers={**h, "x-request-id": "r-upstream", "x-mock-fault": "500"},
    )
    assert r.status_code >= 500
    # the admin API with the admin key
    assert httpx.get(
        gw.url + "/api/quota/pools/p/usage", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ).is_success
    gw.stop()

    text = gw.output()
    assert secret not in text
    assert UPSTREAM_SECRET not in text
    assert ADMIN_KEY not in text
    events = []
    for line in text.splitlines():
        if not line.strip():
            continue
        event = json.loads(line)  # every line is one JSON object
        assert isinstance(event, dict)
        assert {"ts", "level", "logger", "msg"} <= event.keys()
        events.append(event)
    blocked = [e for e in events if e["msg"] == "admission blocked"]
    assert len([e for e in blocked if e["request_id"].startswith("r-block-")]) == 2
    assert any("[redacted]" in e["request_id"] for e in blocked)  # the id that was a secret
    for e in blocked:
        assert e["pool"] == "p"
        assert e["key"] == "a"
        assert e["connection"] in ("mock-1", "mock-2")
        assert e["reason"]
    upstream = [e for e in events if e["msg"] == "upstream error"]
    assert upstream
    assert {e["request_id"] for e in upstream} == {"r-upstream"}
    assert {e["status"] for e in upstream} == {500}
    assert {e["connection"] for e in upstream} == {"solo"}
    assert any(e["msg"].startswith("fairgate ") and "url" in e for e in events)  # the banner
