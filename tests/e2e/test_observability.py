"""The JSON logs of a real gateway process under real traffic: every line the process writes
is one JSON object, request-scoped events carry the request id (the client's ``x-request-id``
when it sent one), and neither the client key nor the upstream secret appears anywhere.

(``GET /metrics`` under traffic runs in-process: tests/inproc/test_observability_inproc.py.)
"""

from __future__ import annotations

import asyncio
import json

import httpx
from e2e_support import (
    ADMIN_KEY,
    FAULTS,
    UPSTREAM_SECRET,
    GatewayFactory,
    Proc,
    gateway_config,
    new_secret,
    sockets_to,
)

from metrics_support import Samples, samples_of


def scrape(gw: Proc, headers: dict[str, str] | None = None) -> Samples:
    """The gateway's ``/metrics``, parsed with prometheus_client's own parser (also used by
    tests/e2e/test_dashboard_operator.py)."""
    return samples_of(httpx.get(gw.url + "/metrics", headers=headers))


POOL = (
    "pools:\n"
    "  - id: p\n"
    "    connections: [mock-1, mock-2]\n"
    "    dimensions: [{unit: requests, window: hourly, limit: 4}]\n"  # the pool's: 4 in all
    "    allocations:\n"
    "      - {key: a, weight: 100, policy: hard}\n"
)


def test_logs_are_json_with_request_ids_and_no_secrets(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    solo = (  # a connection outside the pool, for an upstream failure
        f"  - {{id: solo, provider: mock, base_url: '{mock_upstream.url}/v1',"
        f" secret: '{UPSTREAM_SECRET}', models: [gpt-4o]{FAULTS}}}\nkeys:\n"
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
    # nothing names the server software the gateway runs on (nor the upstream's)
    assert "server" not in r.headers
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


def test_behind_a_proxy_on_the_same_host_clients_are_who_it_forwards(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    """A reverse proxy on the gateway's host (the deployment docs/security.md recommends) is
    trusted for ``X-Forwarded-For`` (``FORWARDED_ALLOW_IPS``, loopback by default): ``/metrics``,
    loopback-only by default, refuses a request it forwards for an outside client, and the
    admin API's backoff throttles that client's wrong keys, not every client of the proxy (and
    not the right key, even from that client: issue 43, N12)."""
    gw = start_gateway(gateway_config(mock_upstream.url, POOL, {"a": new_secret()}))
    outside, other = {"X-Forwarded-For": "203.0.113.9"}, {"X-Forwarded-For": "203.0.113.10"}
    assert httpx.get(gw.url + "/metrics").status_code == 200  # the host itself
    refused = httpx.get(gw.url + "/metrics", headers=outside)
    assert refused.status_code == 403
    assert "loopback" in refused.text
    assert (
        httpx.get(gw.url + "/metrics", headers={"X-Forwarded-For": "127.0.0.1"}).status_code == 200
    )
    wrong = {**outside, "Authorization": "Bearer fg-admin-wrong-0000000000000000000000"}
    codes = [httpx.get(gw.url + "/api/keys", headers=wrong).status_code for _ in range(8)]
    assert codes[0] == 401
    assert codes[-1] == 429  # that client is backed off
    right = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert httpx.get(gw.url + "/api/keys", headers={**other, **right}).status_code == 200
    locked_out = httpx.get(gw.url + "/api/keys", headers={**outside, **right})
    assert locked_out.status_code == 200  # the right key passes the lockout
    assert httpx.get(gw.url + "/api/keys", headers=wrong).status_code == 429  # still backed off


async def test_health_counts_the_upstream_connections_and_a_burst_leaves_at_most_the_bound(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    """``/health`` → ``upstream``: the relayed requests' sockets to the providers (issue 41). A
    burst of concurrent requests (each held by the mock) opens a connection each; at rest they
    are all idle, at most ``server.upstream_idle_per_origin`` of them (its three connections
    share the mock's origin), and the gateway process holds exactly that many sockets to it."""
    secret = new_secret()
    config = gateway_config(mock_upstream.url, keys={"a": secret}).replace(
        "server: {default_provider: mock}",
        "server: {default_provider: mock, upstream_idle_per_origin: 2}",
    )
    gw = start_gateway(config)
    headers = {"Authorization": f"Bearer {secret}", "x-mock-fault": "latency:300"}
    body = {"model": "mock/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client:
        answers = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=body, headers=headers) for _ in range(8))
        )
        assert [r.status_code for r in answers] == [200] * 8
        mock_port = int(mock_upstream.url.rsplit(":", 1)[1])
        # settles run after the answers, and connections past the bound are closed once they
        # have been idle 2 s: read once nothing is in flight and the pool is at rest
        for _ in range(200):
            health = (await client.get("/health")).json()
            sockets = sockets_to(gw.proc.pid, mock_port)
            at_rest = health["upstream"]["idle"] <= health["upstream"]["idlePerOrigin"]
            if health["inflight"] == 0 and sockets == health["upstream"]["open"] and at_rest:
                break
            await asyncio.sleep(0.05)
    pool = health["upstream"]
    assert pool["idlePerOrigin"] == 2
    assert pool["open"] == pool["idle"] <= 2, pool
    assert sockets == pool["open"]
