"""A Codex subscription pool on real processes: the gateway speaks the Responses wire to the
mock's Codex backend with an OAuth access token (the account id taken from it, as the Codex
CLI does), reads the ``x-codex-*`` 5-hour and weekly readings, and charges each window's rise
to that window only, split by the keys' token shares.

The mock's windows fill at ``PER_1K`` percent per 1,000 tokens (the weekly one at a fifth of
that); one request here is 17 tokens (1 prompt token for "x", the mock's 16-token answer: the
Codex backend takes no output cap), so 0.017 % of the 5-hour window and 0.0034 % of the
week. (Small on purpose: the gateway prices the next request at the observed percent per token
times its output budget, and a steep rate would make that estimate alone fill the window.)
"""

from __future__ import annotations

import httpx
import openai
import pytest
from e2e_support import (
    ADMIN_KEY,
    TEST_CLOCK,
    GatewayFactory,
    Proc,
    assert_window_count,
    new_secret,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
PER_1K = 1.0
WEEKLY = 0.2
TOKENS_PER_REQUEST = 17
FIVE_H_STEP = TOKENS_PER_REQUEST * PER_1K / 1000  # 0.017 percentage points
WEEK_STEP = FIVE_H_STEP * WEEKLY


def codex_config(mock_url: str, access_token: str, keys: dict[str, str], pools: str) -> str:
    key_lines = "".join(
        f"  - {{id: {kid}, name: {kid}, secret: '{secret}'}}\n" for kid, secret in keys.items()
    )
    return (
        "server: {default_provider: codex}\n"
        "connections:\n"
        f"  - {{id: codex-1, provider: codex, base_url: '{mock_url}/backend-api/codex',\n"
        f"     auth_type: oauth, secret: '{access_token}', models: ['*']}}\n"
        f"keys:\n{key_lines}" + pools
    )


def login(mock: Proc, account: str) -> dict[str, str]:
    r = httpx.post(mock.url + "/_mock/oauth/login", json={"account_id": account})
    r.raise_for_status()
    return dict(r.json())


def chat(gw: Proc, secret: str) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": "gpt-5-codex", "messages": [{"role": "user", "content": "x"}]},
    )


@pytest.fixture
def codex_mock(mock_upstream: Proc) -> Proc:
    httpx.post(mock_upstream.url + "/_mock/reset")
    httpx.post(
        mock_upstream.url + "/_mock/config",
        json={"codex_percent_per_1k_tokens": PER_1K, "codex_weekly_ratio": WEEKLY},
    )
    return mock_upstream


def test_each_window_is_charged_only_by_its_own_reading(
    codex_mock: Proc, start_gateway: GatewayFactory
) -> None:
    keys = {"a": new_secret(), "b": new_secret()}
    pools = (
        "pools:\n"
        "  - {id: cx, name: Codex, connections: [codex-1],\n"
        "     dimensions: [{unit: percent, window: 5h, limit: 100},\n"
        "                  {unit: percent, window: weekly, limit: 100}],\n"
        "     allocations: [{key: a, weight: 50}, {key: b, weight: 50}]}\n"
    )
    token = login(codex_mock, "acct-cx")["access_token"]
    since = TEST_CLOCK.now_ms()
    gw = start_gateway(codex_config(codex_mock.url, token, keys, pools))
    r = chat(gw, keys["a"])  # the baseline reading: one request's worth
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].startswith("mock reply: x")
    assert r.json()["usage"]["total_tokens"] == TOKENS_PER_REQUEST
    TEST_CLOCK.advance(1_100, gw, codex_mock)  # readings are taken at most once a second
    assert chat(gw, keys["a"]).status_code == 200  # reads 2 steps: +1 step, all a's tokens
    for who in ("a", "b"):  # not read (same second): their tokens split the next rise
        r = chat(gw, keys[who])
        assert r.status_code == 200, r.text
    TEST_CLOCK.advance(1_100, gw, codex_mock)
    assert chat(gw, keys["b"]).status_code == 200  # reads 5 steps: +3, split a 2 : b 1
    usage = httpx.get(gw.url + "/api/quota/pools/cx/usage", headers=ADMIN).json()
    by = {d["key"]: {k["keyId"]: k["consumed"] for k in d["keys"]} for d in usage["dimensions"]}
    assert_window_count(by["percent/5h"]["a"], 3 * FIVE_H_STEP, "5h", since)
    assert_window_count(by["percent/5h"]["b"], 1 * FIVE_H_STEP, "5h", since)
    # the weekly reading rose by a fifth as much: the weekly counter holds exactly that, and
    # none of it landed on the 5-hour one (which holds exactly the 5-hour rises above)
    assert_window_count(by["percent/weekly"]["a"], 3 * WEEK_STEP, "weekly", since)
    assert_window_count(by["percent/weekly"]["b"], 1 * WEEK_STEP, "weekly", since)


def test_responses_client_through_a_codex_pool(
    codex_mock: Proc, start_gateway: GatewayFactory
) -> None:
    """The openai SDK's Responses API, through fairgate, to the Codex backend (Responses on
    both sides), streamed and not."""
    keys = {"a": new_secret()}
    pools = (
        "pools:\n"
        "  - {id: cx, name: Codex, connections: [codex-1],\n"
        "     dimensions: [{unit: percent, window: 5h, limit: 100}],\n"
        "     allocations: [{key: a, weight: 1}]}\n"
    )
    token = login(codex_mock, "acct-rsp")["access_token"]
    gw = start_gateway(codex_config(codex_mock.url, token, keys, pools))
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=keys["a"], max_retries=0) as client:
        resp = client.responses.create(model="gpt-5-codex", input="hello codex")
        assert resp.output_text.startswith("mock reply: hello codex")
        assert resp.usage is not None
        assert resp.usage.output_tokens == 16
        with client.responses.stream(model="gpt-5-codex", input="stream codex") as stream:
            text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
            final = stream.get_final_response()
        assert text == final.output_text
        assert text.startswith("mock reply: stream codex")
