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

from typing import Any

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
HOUR = 3_600_000


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
    r = chat(gw, keys["a"])  # the baseline reading: one request's worth (this one)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].startswith("mock reply: x")
    assert r.json()["usage"]["total_tokens"] == TOKENS_PER_REQUEST
    TEST_CLOCK.advance(1_100, gw, codex_mock)  # readings are taken at most once a second
    assert chat(gw, keys["a"]).status_code == 200  # reads 2 steps: +1 step, its own: a's
    for who in ("a", "b"):  # not read (same second): their tokens split the next rise
        r = chat(gw, keys[who])
        assert r.status_code == 200, r.text
    TEST_CLOCK.advance(1_100, gw, codex_mock)
    # reads 5 steps: +3, split a 1 : b 2 (the request whose answer reported it counts too)
    assert chat(gw, keys["b"]).status_code == 200
    usage = httpx.get(gw.url + "/api/quota/pools/cx/usage", headers=ADMIN).json()
    by = {d["key"]: {k["keyId"]: k["consumed"] for k in d["keys"]} for d in usage["dimensions"]}
    assert_window_count(by["percent/5h"]["a"], 2 * FIVE_H_STEP, "5h", since)
    assert_window_count(by["percent/5h"]["b"], 2 * FIVE_H_STEP, "5h", since)
    # the weekly reading rose by a fifth as much: the weekly counter holds exactly that, and
    # none of it landed on the 5-hour one (which holds exactly the 5-hour rises above)
    assert_window_count(by["percent/weekly"]["a"], 2 * WEEK_STEP, "weekly", since)
    assert_window_count(by["percent/weekly"]["b"], 2 * WEEK_STEP, "weekly", since)


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


def test_two_accounts_three_keys_strict_block_and_rollover_at_the_providers_reset(
    codex_mock: Proc, start_gateway: GatewayFactory
) -> None:
    """The wire of the strict-mode and reset story (the behaviour in detail is
    ``tests/inproc/test_codex_windows.py``): two Codex accounts and three keys share a pool; the
    mock's ``x-codex-*`` readings turn it strict, attribute the rises and block the key over its
    share with ``Retry-After`` at the account's reset, which anchors the pool's 5-hour window;
    moving every process's clock past that reset rolls the keys' shares over with the account's
    window, while the weekly counts stay."""
    per_1k = 300.0  # 17 tokens a request: 5.1 % of the 5-hour window, 1.02 % of the week
    # tokens that outlive the jump to the reset (their refresh is test_oauth_connections')
    config = {"codex_percent_per_1k_tokens": per_1k, "oauth_access_ttl_s": 86_400.0}
    httpx.post(codex_mock.url + "/_mock/config", json=config)
    keys = {"a": new_secret(), "b": new_secret(), "c": new_secret()}
    tokens = [login(codex_mock, f"acct-{n}")["access_token"] for n in (1, 2)]
    key_lines = "".join(
        f"  - {{id: {kid}, name: {kid}, secret: '{secret}'}}\n" for kid, secret in keys.items()
    )
    conns = "".join(
        f"  - {{id: codex-{n}, provider: codex, base_url: '{codex_mock.url}/backend-api/codex',\n"
        f"     auth_type: oauth, secret: '{token}', models: ['*']}}\n"
        for n, token in enumerate(tokens, 1)
    )
    gw = start_gateway(
        "server: {default_provider: codex}\n"
        f"connections:\n{conns}keys:\n{key_lines}"
        "pools:\n"
        "  - {id: cx, name: Codex, connections: [codex-1, codex-2],\n"
        "     dimensions: [{unit: percent, window: 5h, limit: 100},\n"
        "                  {unit: percent, window: weekly, limit: 100}],\n"
        "     allocations: [{key: a, weight: 0}, {key: b, weight: 0}, {key: c, weight: 0}]}\n"
    )

    def ask(who: str) -> httpx.Response:
        r = httpx.post(
            gw.url + "/v1/chat/completions",
            headers={"Authorization": f"Bearer {keys[who]}"},
            # the output budget prices the admission: the Codex answer is 16 tokens
            json={
                "model": "gpt-5-codex",
                "max_tokens": 16,
                "messages": [{"role": "user", "content": "x"}],
            },
        )
        TEST_CLOCK.advance(1_100, gw, codex_mock)  # a reading per connection and second
        return r

    def usage() -> dict[str, dict[str, Any]]:
        u = httpx.get(gw.url + "/api/quota/pools/cx/usage", headers=ADMIN).json()
        return {d["key"]: d for d in u["dimensions"]}

    def consumed(u: dict[str, dict[str, Any]], dim: str) -> dict[str, float]:
        return {k["keyId"]: k["consumed"] for k in u[dim]["keys"] if k["keyId"] in keys}

    for who in ("b", "c"):
        assert ask(who).status_code == 200
    blocked = None
    for _ in range(40):
        r = ask("a")
        if r.status_code == 429:
            blocked = r
            break
        assert r.status_code == 200, r.text
    assert blocked is not None, "a was never blocked"
    refused_at = TEST_CLOCK.now_ms() - 1_100
    err = blocked.json()["error"]
    assert (err["reason"], err["dimension"]) == ("fair-share", "percent/5h")
    u = usage()
    five, week = consumed(u, "percent/5h"), consumed(u, "percent/weekly")
    assert five["a"] >= 200 / 3 > five["b"]
    assert week["a"] > 0
    anchored = u["percent/5h"]
    assert anchored["anchorSource"] in ("codex-1", "codex-2")
    reset = anchored["resetsAtMs"]
    # the account's window started at its first use (seconds ago), and resets 5 h after it
    assert 5 * HOUR - 120_000 < reset - refused_at <= 5 * HOUR
    assert abs(int(blocked.headers["retry-after"]) - (reset - refused_at) / 1000) <= 2

    TEST_CLOCK.advance(reset - TEST_CLOCK.now_ms() + 1_000, gw, codex_mock)
    after = usage()
    assert consumed(after, "percent/5h") == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert consumed(after, "percent/weekly") == week
    r = ask("a")
    assert r.status_code == 200, r.text
