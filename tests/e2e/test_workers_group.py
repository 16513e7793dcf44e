"""``serve --workers 2`` as one gateway (issue 48): ``/metrics`` is the whole group's exposition
whichever worker takes the scrape (item 2); the per-key rate guard counts in each worker, as
documented (item 4)."""

from __future__ import annotations

import httpx
import pytest
from e2e_support import GatewayFactory, Proc, gateway_config, new_secret
from prometheus_client.parser import text_string_to_metric_families
from test_shared_metadata import BODY, healths, start_two_workers

N = 200
SCRAPES = 30


def _fresh(url: str) -> httpx.AsyncClient:
    """A client that opens a connection for each request: the kernel hands each new connection
    to either worker, so a run of them reaches both."""
    return httpx.AsyncClient(
        base_url=url, timeout=30, limits=httpx.Limits(max_keepalive_connections=0)
    )


def _requests_total(exposition: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == "fairgate_requests_total"
    )


@pytest.mark.slow
async def test_every_scrape_of_two_workers_counts_every_request(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    gw = await start_two_workers(
        start_gateway, gateway_config(mock_upstream.url, keys={"k1": secret})
    )
    auth = {"Authorization": f"Bearer {secret}"}
    async with _fresh(gw.url) as c:
        statuses = [
            (await c.post("/v1/chat/completions", json=BODY, headers=auth)).status_code
            for _ in range(N)
        ]
        assert statuses == [200] * N
        sums = [_requests_total((await c.get("/metrics")).text) for _ in range(SCRAPES)]
    # before: each scrape summed one worker's share (133 or 67 of 200 in the run)
    assert sums == [N] * SCRAPES
    # and the scrapes went to both workers, as the requests did
    assert len({h["pid"] for h in await healths(gw.url)}) == 2


@pytest.mark.slow
async def test_the_key_rate_guard_counts_in_each_worker_as_documented(
    mock_upstream: Proc, start_gateway: GatewayFactory
) -> None:
    """Item 4, decided per process (docs/security.md): with a burst of 3 and no refill to speak
    of, two workers let a key through more than one burst and at most two, and the parent
    says at start what the guard adds up to."""
    secret = new_secret()
    gw = await start_two_workers(
        start_gateway,
        gateway_config(mock_upstream.url, keys={"k1": secret}),
        extra_env={"FAIRGATE_KEY_RATE_PER_S": "0.0001", "FAIRGATE_KEY_RATE_BURST": "3"},
    )
    auth = {"Authorization": f"Bearer {secret}"}
    async with _fresh(gw.url) as c:
        answers = [await c.post("/v1/chat/completions", json=BODY, headers=auth) for _ in range(60)]
    served = sum(r.status_code == 200 for r in answers)
    refused = [r for r in answers if r.status_code != 200]
    assert 3 < served <= 6
    assert {(r.status_code, r.json()["error"]["code"]) for r in refused} == {
        (429, "key_rate_limited")
    }
    assert "a key may send up to 0.0002 requests a second (bursts of 6)" in gw.output()
