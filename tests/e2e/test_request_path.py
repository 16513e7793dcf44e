"""Issue 11's five repros on real processes: the gateway and two mock providers, each its own
process, driven over loopback with the official SDKs.

Each was measured on the old request path: quota-aware strategies blind to quota, a billing
402 or Anthropic's credit-balance 400 given to the client while the next account was never
tried, ``fallbackDelayMs`` never read, a 429 at once when every target was cooling for a
moment, a held soft admission's reservation left behind by a combo timeout.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from e2e_support import ADMIN_KEY, UPSTREAM_SECRET, GatewayFactory, Proc, new_secret, start_mock

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def module_mocks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc]]:
    """Two mock providers for the whole module (starting them is most of a test's cost)."""
    logs = tmp_path_factory.mktemp("mocks")
    a, b = start_mock(logs / "mock-a.log"), start_mock(logs / "mock-b.log")
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture
def mocks(module_mocks: tuple[Proc, Proc]) -> Iterator[tuple[Proc, Proc]]:
    """The module's mocks with their stats and fault schedules cleared, before and after."""
    for m in module_mocks:
        httpx.post(m.url + "/_mock/reset").raise_for_status()
    yield module_mocks
    for m in module_mocks:
        httpx.post(m.url + "/_mock/reset").raise_for_status()


def requests_to(mock: Proc) -> int:
    return int(httpx.get(mock.url + "/_mock/stats").json()["requests"])


def schedule(mock: Proc, *faults: str) -> None:
    httpx.post(mock.url + "/_mock/schedule", json={"faults": list(faults)}).raise_for_status()


def connections(a: Proc, b: Proc, *, provider_a: str = "sub", provider_b: str = "kimi") -> str:
    return (
        "connections:\n"
        f"  - {{id: s1, provider: {provider_a}, base_url: '{a.url}/v1',"
        f" secret: '{UPSTREAM_SECRET}', models: [gpt-4o-mini, claude-sonnet-4], weight: 2}}\n"
        f"  - {{id: k1, provider: {provider_b}, base_url: '{b.url}/v1',"
        f" secret: '{UPSTREAM_SECRET}', models: [gpt-4o-mini, claude-sonnet-4]}}\n"
    )


def key_line(secret: str) -> str:
    """The key ``k``; it may use every connection outside a pool (``server.require_allocation``
    is on: a pooled one needs an allocation)."""
    return (
        f"keys:\n  - {{id: k, name: k, secret: '{secret}',"
        " allowed_providers: [sub, kimi, anthropic]}\n"
    )


def combo(name: str, strategy: str, config: str = "{}", model: str = "gpt-4o-mini") -> str:
    return (
        f"  - {{name: {name}, strategy: {strategy}, config: {config}, targets: [\n"
        f"      {{provider: sub, model: {model}, connection: s1}},\n"
        f"      {{provider: kimi, model: {model}, connection: k1}}]}}\n"
    )


def _start(start_gateway: GatewayFactory, conns: str, rest: str = "") -> tuple[Proc, str]:
    """A gateway on ``conns``, key ``k`` with a fresh secret, and ``rest`` (combos, pools): the
    gateway and the key's secret."""
    secret = new_secret()
    return start_gateway(conns + key_line(secret) + rest), secret


def client(gw: Proc, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=secret, max_retries=0)


def raw_chat(c: openai.OpenAI, model: str) -> Any:
    """A 4-token chat of one user message ``x`` to ``model``, with the answer's headers."""
    return c.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "x"}], max_tokens=4
    )


def ask(gw: Proc, secret: str, model: str) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=30,
    )


# -- 1. quota-aware strategies see the quota ------------------------------------------------

STRATEGIES = ["fill-first", "headroom", "reset-aware", "reset-window", "auto"]


def test_quota_aware_strategies_route_a_capped_key_to_the_account_with_room(
    mocks: tuple[Proc, Proc], start_gateway: GatewayFactory
) -> None:
    a, b = mocks
    secret = new_secret()
    pools = (
        "pools:\n"
        "  - {id: ps1, connections: [s1], dimensions: [{unit: requests, window: hourly, "
        "limit: 1000}], allocations: [{key: k, weight: 1, cap_value: 1, cap_unit: requests}]}\n"
        "  - {id: pk1, connections: [k1], dimensions: [{unit: requests, window: hourly, "
        "limit: 1000}], allocations: [{key: k, weight: 1}]}\n"
    )
    combos = "".join(
        combo(s, s, "{options: {exploration: 0}}" if s == "auto" else "{}") for s in STRATEGIES
    )
    gw = start_gateway(connections(a, b) + key_line(secret) + f"combos:\n{combos}" + pools)
    with client(gw, secret) as c:
        # the key's one request on s1 (its cap), asked for by name
        c.chat.completions.create(
            model="sub/gpt-4o-mini", messages=[{"role": "user", "content": "x"}], max_tokens=4
        )
        for strategy in STRATEGIES:
            raw = raw_chat(c, strategy)
            assert raw.headers["x-fairgate-connection"] == "k1", strategy
    log = httpx.get(gw.url + "/api/quota/pools/ps1/log", headers=ADMIN).json()["events"]
    assert [e["outcome"] for e in log] == ["allow"]  # the capped s1 was never even tried
    assert requests_to(a) == 1
    assert requests_to(b) == len(STRATEGIES)


# -- 2. billing and credit errors fall through ---------------------------------------------


def test_billing_402_falls_through_to_the_second_account(
    mocks: tuple[Proc, Proc], start_gateway: GatewayFactory
) -> None:
    a, b = mocks
    gw, secret = _start(start_gateway, connections(a, b), f"combos:\n{combo('two', 'priority')}")
    schedule(a, "quota:402")
    with client(gw, secret) as c:
        raw = raw_chat(c, "two")
        assert raw.parse().choices[0].message.content
        assert raw.headers["x-fairgate-connection"] == "k1"
        # the account is blocked until an admin clears it: the next request goes to k1 at once
        raw = raw_chat(c, "two")
        assert raw.headers["x-fairgate-connection"] == "k1"
    assert (requests_to(a), requests_to(b)) == (1, 2)


def test_anthropic_credit_balance_400_falls_through_to_the_second_account(
    mocks: tuple[Proc, Proc], start_gateway: GatewayFactory
) -> None:
    a, b = mocks
    gw, secret = _start(
        start_gateway, connections(a, b, provider_a="anthropic", provider_b="anthropic")
    )
    schedule(a, "quota:400")
    with anthropic.Anthropic(base_url=gw.url, api_key=secret, max_retries=0) as c:
        raw = c.messages.with_raw_response.create(
            model="claude-sonnet-4", max_tokens=4, messages=[{"role": "user", "content": "x"}]
        )
        msg = raw.parse()
        assert msg.content[0].type == "text"
        assert msg.content[0].text
        assert raw.headers["x-fairgate-connection"] == "k1"
    assert (requests_to(a), requests_to(b)) == (1, 1)


# -- 3. fallbackDelayMs is honoured --------------------------------------------------------


def test_fallback_delay_is_waited_between_fall_throughs(
    mocks: tuple[Proc, Proc], start_gateway: GatewayFactory
) -> None:
    a, b = mocks
    slow = combo("slow", "priority", "{maxRetries: 0, fallbackDelayMs: 600}")
    gw, secret = _start(start_gateway, connections(a, b), f"combos:\n{slow}")
    schedule(a, "500")
    t0 = time.monotonic()
    r = ask(gw, secret, "slow")
    elapsed = time.monotonic() - t0
    assert (r.status_code, r.headers["x-fairgate-connection"]) == (200, "k1")
    assert elapsed >= 0.6  # a lower bound only: a busy machine can only make it longer


# -- 4. cooldown-aware wait ----------------------------------------------------------------


def test_a_short_cooldown_is_waited_for_and_answered(
    mocks: tuple[Proc, Proc], start_gateway: GatewayFactory
) -> None:
    a, _ = mocks
    both = combo("both", "priority", "{maxRetries: 0, maxWaitMs: 5000}")
    gw, secret = _start(start_gateway, connections(a, a), f"combos:\n{both}")
    schedule(a, "429:1", "429:1")  # both accounts rate limited for a second
    t0 = time.monotonic()
    r = ask(gw, secret, "both")
    elapsed = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert elapsed >= 0.9  # it waited for the first to free instead of a 429 at once
    assert requests_to(a) == 3
    # past maxWaitMs: the 429 comes at once, with when to retry
    schedule(a, "429:30", "429:30")
    r = ask(gw, secret, "both")
    assert r.status_code == 429
    assert int(r.headers["retry-after"]) >= 20


# -- 5. concurrency backpressure and no reservation left behind ----------------------------


def test_concurrency_cap_queues_then_answers_503_concurrency_full(
    mocks: tuple[Proc, Proc], start_gateway: GatewayFactory
) -> None:
    import threading

    a, _ = mocks
    gw, secret = _start(
        start_gateway,
        f"connections:\n  - {{id: s1, provider: sub, base_url: '{a.url}/v1',"
        f" secret: '{UPSTREAM_SECRET}', models: [gpt-4o-mini], max_concurrent: 1}}\n",
        "combos:\n"
        "  - {name: q, strategy: priority, config: {queueTimeoutMs: 300}, targets: [\n"
        "      {provider: sub, model: gpt-4o-mini, connection: s1}]}\n",
    )
    # the slot is held for 8 s: the second request must queue (300 ms) and give up while it
    # is, however long a busy host takes between the two (1.5 s was a margin of 1.2 s)
    schedule(a, "latency:8000")
    slow: dict[str, httpx.Response] = {}
    t = threading.Thread(target=lambda: slow.setdefault("r", ask(gw, secret, "q")))
    t.start()
    deadline = time.monotonic() + 30
    while requests_to(a) == 0:
        assert time.monotonic() < deadline, "the first request never reached the upstream"
        time.sleep(0.02)
    r = ask(gw, secret, "q")  # the one slot is busy: queued 300 ms, then 503
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "concurrency_full"
    assert r.json()["diagnostics"]["terminalReason"] == "concurrency_full"
    assert r.headers["retry-after"] == "1"
    t.join(60)
    assert slow["r"].status_code == 200
    assert requests_to(a) == 1  # never more than the cap upstream


def test_a_timed_out_combo_leaves_no_reservation(
    mocks: tuple[Proc, Proc], start_gateway: GatewayFactory
) -> None:
    """s1 admits the key with a soft penalty (held while k1 is tried); k1 is too slow for the
    combo's timeout. Both reservations must be released: the pool counters show nothing."""
    a, b = mocks
    secret = new_secret()
    pools = (
        "pools:\n"
        "  - {id: ps1, connections: [s1], dimensions: [{unit: requests, window: hourly, "
        "limit: 1000}], allocations: [{key: k, weight: 0, policy: soft}, {key: o, weight: 1}]}\n"
        "  - {id: pk1, connections: [k1], dimensions: [{unit: requests, window: hourly, "
        "limit: 1000}], allocations: [{key: k, weight: 1}]}\n"
    )
    gw = start_gateway(
        connections(a, b)
        + key_line(secret)
        + f"  - {{id: o, name: o, secret: '{new_secret()}'}}\n"
        + f"combos:\n{combo('late', 'priority', '{timeoutMs: 400, maxRetries: 0}')}"
        + pools
    )
    schedule(b, "latency:3000")
    r = ask(gw, secret, "late")
    assert r.status_code == 504
    assert requests_to(a) == 0  # s1 was only held, never used
    # the releases run off the response path: wait for them (a fixed 0.3 s sleep was a bet on
    # a quiet host), then nothing may be left held
    deadline = time.monotonic() + 30
    for pool in ("ps1", "pk1"):
        while True:
            usage = httpx.get(gw.url + f"/api/quota/pools/{pool}/usage", headers=ADMIN).json()
            if usage["dimensions"][0]["total"] == 0:
                break
            assert time.monotonic() < deadline, (pool, usage)
            time.sleep(0.05)
    health = httpx.get(gw.url + "/health").json()
    assert health["inflight"] == 0
