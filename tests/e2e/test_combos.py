"""Combos through the real gateway with the mock upstream: fallback on 429, fusion with a judge,
a pipeline chaining outputs, the all-failed diagnostics, every public strategy in one matrix,
and quota-share routing over a pool's members with in-flight counts back at zero."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from e2e_support import (
    ADMIN_KEY,
    UPSTREAM_SECRET,
    GatewayFactory,
    Proc,
    logged_diagnostics,
    new_secret,
)

from fairgate.routing import PUBLIC_STRATEGIES

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def config(mock_url: str, secret: str, combos: str, pools: str = "") -> str:
    conns = "".join(
        f"  - {{id: {cid}, provider: {prov}, base_url: '{mock_url}/v1', "
        f"secret: '{UPSTREAM_SECRET}', models: [{model}]}}\n"
        for cid, prov, model in (
            ("oa-1", "mock", "gpt-4o-mini"),
            ("oa-2", "mock", "gpt-4o-mini"),
            ("judge-1", "judge", "judge-model"),
            ("claude-1", "anthropic", "claude-sonnet-4"),
        )
    )
    return (
        f"connections:\n{conns}keys:\n  - {{id: k, name: k, secret: '{secret}',"
        " allowed_providers: [mock, judge, anthropic]}\n"
        f"combos:\n{combos}{pools}"
    )


@pytest.fixture
def mock(mock_upstream: Proc) -> Iterator[Proc]:
    httpx.post(mock_upstream.url + "/_mock/reset")
    yield mock_upstream
    httpx.post(mock_upstream.url + "/_mock/reset")


def client(gw: Proc, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=secret, max_retries=0)


def stats(mock: Proc) -> dict[str, object]:
    return dict(httpx.get(mock.url + "/_mock/stats").json())


def test_combo_falls_through_on_429_and_is_listed(
    mock: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    combos = (
        "  - {name: fast, strategy: priority, targets: [\n"
        "      {provider: mock, model: gpt-4o-mini, connection: oa-1},\n"
        "      {provider: mock, model: gpt-4o-mini, connection: oa-2}]}\n"
    )
    gw = start_gateway(config(mock.url, secret, combos))
    httpx.post(mock.url + "/_mock/schedule", json={"faults": ["429:1"]})
    with client(gw, secret) as c:
        raw = c.chat.completions.with_raw_response.create(
            model="fast", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert raw.parse().choices[0].message.content
        assert raw.headers["x-fairgate-connection"] == "oa-2"
        assert raw.headers["x-fairgate-combo"] == "fast"
        ids = {m.id for m in c.models.list()}
    assert "fast" in ids
    assert not any(i.startswith("qtSd/") for i in ids)


def test_fusion_returns_the_judges_merged_answer(mock: Proc, start_gateway: GatewayFactory) -> None:
    secret = new_secret()
    combos = (
        "  - name: panel\n    strategy: fusion\n    targets:\n"
        "      - {provider: mock, model: gpt-4o-mini, connection: oa-1}\n"
        "      - {provider: anthropic, model: claude-sonnet-4}\n"
        "    config: {judge: {provider: judge, model: judge-model}}\n"
    )
    gw = start_gateway(config(mock.url, secret, combos))
    with client(gw, secret) as c:
        raw = c.chat.completions.with_raw_response.create(
            model="panel",
            messages=[{"role": "user", "content": "what is two plus two"}],
            max_tokens=40,
        )
    answer = raw.parse().choices[0].message.content or ""
    assert raw.headers["x-fairgate-connection"] == "judge-1"  # the judge produced the answer
    # the mock echoes its last user message: the judge saw both panel answers in its prompt
    assert "mock" in answer
    s = stats(mock)
    assert s["requests"] == 3  # two panel members + one judge


def test_pipeline_chains_outputs(mock: Proc, start_gateway: GatewayFactory) -> None:
    secret = new_secret()
    combos = (
        "  - name: chain\n    strategy: pipeline\n    targets:\n"
        "      - {provider: anthropic, model: claude-sonnet-4}\n"
        "      - {provider: mock, model: gpt-4o-mini, connection: oa-2}\n"
        "    config: {options: {stepPrompts: [null, 'polish this draft']}}\n"
    )
    gw = start_gateway(config(mock.url, secret, combos))
    with client(gw, secret) as c:
        raw = c.chat.completions.with_raw_response.create(
            model="chain", messages=[{"role": "user", "content": "draft a haiku"}], max_tokens=60
        )
    resp = raw.parse()
    assert raw.headers["x-fairgate-connection"] == "oa-2"  # the last step answered
    # step 2 answered the step prompt ...
    assert "polish" in (resp.choices[0].message.content or "")
    # ... over a conversation that carried step 1's whole output: "draft a haiku" alone is 4
    # prompt tokens for the mock (characters / 4), step 1's answer adds ~16 words
    assert resp.usage is not None
    assert resp.usage.prompt_tokens > 20
    assert stats(mock)["requests"] == 2


def test_all_targets_failing_returns_diagnostics(mock: Proc, start_gateway: GatewayFactory) -> None:
    secret = new_secret()
    combos = (
        "  - {name: doomed, strategy: priority, config: {maxRetries: 1, maxWaitMs: 0}, targets: [\n"
        "      {provider: mock, model: gpt-4o-mini, connection: oa-1},\n"
        "      {provider: mock, model: gpt-4o-mini, connection: oa-2}]}\n"
    )
    gw = start_gateway(config(mock.url, secret, combos))
    httpx.post(mock.url + "/_mock/schedule", json={"faults": ["500", "500", "503", "503"]})
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": "doomed", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code in (502, 503)
    body = r.json()
    assert body["error"]["message"]
    diag = body["diagnostics"]
    assert diag["combo"] == "doomed"
    assert diag["terminalReason"] == "upstream_failed"
    # each target retried once on a transient 5xx before falling through; the client sees no
    # connection id, the admin's log line has them
    assert diag["attemptOrder"] == ["mock/gpt-4o-mini"] * 4
    assert "oa-1" not in r.text
    full = logged_diagnostics(gw)[-1]
    assert full["attemptOrder"] == ["mock/gpt-4o-mini@oa-1"] * 2 + ["mock/gpt-4o-mini@oa-2"] * 2
    assert diag["recoveryHint"]["action"]
    assert r.headers["x-fairgate-combo-terminal"] == "upstream_failed"
    assert UPSTREAM_SECRET not in r.text
    assert "Traceback" not in r.text


def test_empty_200_is_a_failure_that_falls_through(
    mock: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    combos = (
        "  - {name: q, strategy: priority, targets: [\n"
        "      {provider: mock, model: gpt-4o-mini, connection: oa-1},\n"
        "      {provider: mock, model: gpt-4o-mini, connection: oa-2}]}\n"
    )
    gw = start_gateway(config(mock.url, secret, combos))
    httpx.post(mock.url + "/_mock/schedule", json={"faults": ["empty"]})
    with client(gw, secret) as c:
        raw = c.chat.completions.with_raw_response.create(
            model="q", messages=[{"role": "user", "content": "x"}], max_tokens=3
        )
        assert raw.parse().choices[0].message.content
        assert raw.headers["x-fairgate-connection"] == "oa-2"
        # streams are validated on their first content chunk, then passed through live
        httpx.post(mock.url + "/_mock/schedule", json={"faults": ["error-200"]})
        raw = c.chat.completions.with_raw_response.create(
            model="q", messages=[{"role": "user", "content": "x"}], stream=True
        )
        chunks = list(raw.parse())
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert raw.headers["x-fairgate-connection"] == "oa-2"


@pytest.mark.parametrize("strategy", list(PUBLIC_STRATEGIES))
def test_every_public_strategy_answers_through_the_pipeline(
    strategy: str, mock: Proc, start_gateway: GatewayFactory, request: pytest.FixtureRequest
) -> None:
    secret = new_secret()
    combos = (
        f"  - {{name: m, strategy: {strategy}, targets: [\n"
        "      {provider: mock, model: gpt-4o-mini, connection: oa-1, priceIn: 1, priceOut: 2},\n"
        "      {provider: anthropic, model: claude-sonnet-4, priceIn: 3, priceOut: 15},\n"
        "      {provider: mock, model: gpt-4o-mini, connection: oa-2, priceIn: 0.5}]}\n"
    )
    gw = start_gateway(config(mock.url, secret, combos))
    with client(gw, secret) as c:
        for _ in range(2):
            resp = c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=4
            )
            assert resp.choices[0].message.content
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'model="m"' in metrics  # the combo's requests were recorded


def test_quota_share_spreads_over_pool_members_and_inflight_returns_to_zero(
    mock: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    pools = (
        "pools:\n  - {id: qp, name: QP, connections: [oa-1, oa-2],\n"
        "     dimensions: [{unit: requests, window: hourly, limit: 1000}],\n"
        "     allocations: [{key: k, weight: 100}]}\n"
    )
    gw = start_gateway(
        config(mock.url, secret, "  []\n", pools).replace("combos:\n  []\n", "combos: []\n")
    )
    used: dict[str, int] = {}
    with client(gw, secret) as c:
        for i in range(12):
            raw = c.chat.completions.with_raw_response.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": "x"}],
                max_tokens=2,
                stream=bool(i % 2),
            )
            conn = raw.headers["x-fairgate-connection"]
            raw.parse() if not i % 2 else list(raw.parse())
            used[conn] = used.get(conn, 0) + 1
        # a failing stream too
        httpx.post(mock.url + "/_mock/schedule", json={"faults": ["reset-mid-stream:2"]})
        with contextlib.suppress(Exception):
            list(
                c.chat.completions.create(
                    model="gpt-4o-mini", stream=True, messages=[{"role": "user", "content": "x"}]
                )
            )
    assert used == {"oa-1": 6, "oa-2": 6}  # equal weights: DRR alternates
    assert raw.headers.get("x-fairgate-combo") == "qtSd/qp/gpt-4o-mini"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        health = httpx.get(gw.url + "/health").json()
        if health["inflightLeases"] == 0 and health["inflight"] == 0:
            break
        time.sleep(0.05)
    assert (health["inflightLeases"], health["inflight"]) == (0, 0)
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": "qtSd/qp/gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 400  # internal, not user-selectable
    combos = httpx.get(gw.url + "/api/combos?internal=true", headers=ADMIN).json()
    assert any(c["name"] == "qtSd/qp/gpt-4o-mini" for c in combos)


TWO = (
    "  - {name: two, strategy: priority, targets: [\n"
    "      {provider: mock, model: gpt-4o-mini, connection: oa-1},\n"
    "      {provider: mock, model: gpt-4o-mini, connection: oa-2}],\n"
    "     config: {options: {fanOut: 2}}}\n"
    "  - {name: strict, strategy: priority, targets: [\n"
    "      {provider: mock, model: gpt-4o-mini, connection: oa-1},\n"
    "      {provider: mock, model: gpt-4o-mini, connection: oa-2}],\n"
    "     config: {maxWaitMs: 0, options: {strictPin: true}}}\n"
)


def test_pinned_target_and_fan_out(mock: Proc, start_gateway: GatewayFactory) -> None:
    secret = new_secret()
    gw = start_gateway(config(mock.url, secret, TWO))
    h = {"Authorization": f"Bearer {secret}"}
    body = {"model": "strict", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    # fan-out: both race; the slow one loses and the answer comes from the fast one
    httpx.post(mock.url + "/_mock/schedule", json={"faults": ["latency:800"]})
    r = httpx.post(
        gw.url + "/v1/chat/completions", headers=h, json={**body, "model": "two"}, timeout=10
    )
    assert r.status_code == 200
    assert r.headers["x-fairgate-fan-out"] == "2"
    assert r.elapsed.total_seconds() < 0.7
    assert httpx.get(mock.url + "/_mock/stats").json()["requests"] == 2
    # a pinned target goes first
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        json=body,
        headers={**h, "x-fairgate-pin": "mock/gpt-4o-mini@oa-2"},
    )
    assert (r.status_code, r.headers["x-fairgate-connection"]) == (200, "oa-2")
    # strict pin: the pinned target failing is the answer, nothing else is tried
    httpx.post(mock.url + "/_mock/schedule", json={"faults": ["500", "500"]})
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        json=body,
        headers={**h, "x-fairgate-pin": "mock/gpt-4o-mini@oa-2"},
    )
    assert r.status_code >= 500
    assert len(r.json()["diagnostics"]["attempted"]) == 2  # one target, retried once
    assert {a["target"] for a in logged_diagnostics(gw)[-1]["attempted"]} == {
        "mock/gpt-4o-mini@oa-2"
    }
    r = httpx.post(
        gw.url + "/v1/chat/completions", json=body, headers={**h, "x-fairgate-pin": "nope/x"}
    )
    assert (r.status_code, r.json()["error"]["param"]) == (400, "x-fairgate-pin")


def test_concurrency_cap_defers_a_busy_connection_without_dropping_it(
    mock: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    combos = (
        "  - {name: capped, strategy: priority, targets: [\n"
        "      {provider: mock, model: gpt-4o-mini, connection: oa-1},\n"
        "      {provider: mock, model: gpt-4o-mini, connection: oa-2}]}\n"
    )
    cfg = config(mock.url, secret, combos).replace(
        "  - {id: oa-1, provider: mock,", "  - {id: oa-1, max_concurrent: 1, provider: mock,"
    )
    gw = start_gateway(cfg)
    h = {"Authorization": f"Bearer {secret}"}
    body = {"model": "capped", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    import threading

    slow: dict[str, httpx.Response] = {}
    t = threading.Thread(
        target=lambda: slow.setdefault(
            "r",
            httpx.post(
                gw.url + "/v1/chat/completions",
                json=body,
                headers={**h, "x-mock-fault": "latency:800"},
                timeout=10,
            ),
        )
    )
    t.start()
    time.sleep(0.3)  # oa-1 now holds its one slot
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=h)
    assert (r.status_code, r.headers["x-fairgate-connection"]) == (200, "oa-2")
    t.join(10)
    assert slow["r"].headers["x-fairgate-connection"] == "oa-1"
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=h)
    assert r.headers["x-fairgate-connection"] == "oa-1"  # free again: back to first choice


def test_routing_defaults_cascade_under_combo_config(
    mock: Proc, start_gateway: GatewayFactory
) -> None:
    secret = new_secret()
    combos = (
        "  - {name: c, strategy: priority, targets: [\n"
        "      {provider: mock, model: gpt-4o-mini, connection: oa-1}]}\n"
    )
    gw = start_gateway(config(mock.url, secret, combos))
    bad = httpx.put(
        gw.url + "/api/routing/defaults", headers=ADMIN, json={"global": {"maxRetries": -3}}
    )
    assert bad.status_code == 422
    assert bad.json()["error"]["fields"][0]["field"] == "global"
    ok = httpx.put(
        gw.url + "/api/routing/defaults",
        headers=ADMIN,
        json={
            "global": {"maxRetries": 0, "maxWaitMs": 0},
            "providers": {"mock": {"maxRetries": 2}},
        },
    )
    assert ok.status_code == 200
    httpx.post(mock.url + "/_mock/schedule", json={"faults": ["500", "500", "500"]})
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": "c", "messages": [{"role": "user", "content": "x"}]},
    )
    # the provider layer (2 retries) beats the global layer (0): three attempts in all
    assert len(r.json()["diagnostics"]["attempted"]) == 3
