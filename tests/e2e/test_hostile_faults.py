"""Upstream faults through the real gateway (issue 8, "Upstream faults").

Two connections on two mock upstream processes, one pool over both, and a ``priority`` combo
(A first, then B, no same-target retries) so that each fault lands where the test puts it. For
every fault the mock can produce -- 429s (seconds and HTTP-date Retry-After), 5xx, overloaded,
exhausted quota, a hold longer than the gateway's ``upstream_timeout_s``, a TCP reset, a reset
mid-stream, an empty 200, an error inside a 200, a stream without a finish -- and for plain and
streaming requests:

- A fails, B healthy → the client gets B's good answer (fallback);
- A and B both fail → the client gets a clean JSON error with diagnostics (which targets were
  tried, the terminal reason), never a 500 without a body, a traceback or a secret;
- no request takes longer than (attempts × the upstream timeout) + a margin;
- afterwards ``/health`` shows nothing in flight, and the pool's counters hold exactly the
  settled usage: one request per answer the client got, plus one per failed attempt the
  upstream answered with a 200 (quality failures are charged with their usage, SPEC §8), and
  nothing for failed attempts without a 200 (their reservation is released). A reservation left
  behind would show as an extra request and ≥ 1,024 tokens (the default ``max_tokens``).

A storm test then sends concurrent requests into a burst of 429s on one upstream and 5xx on the
other: every answer is a 200 or a clean error, and the counters end equal to the 200s.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from e2e_support import (
    ADMIN_KEY,
    TEST_CLOCK,
    UPSTREAM_SECRET,
    GatewayFactory,
    Proc,
    assert_window_count,
    launch_gateway,
    logged_diagnostics,
    new_secret,
    start_mock,
    window_count_range,
)

from fairgate.routing.model import DEFAULT_MAX_WAIT_MS

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
UPSTREAM_TIMEOUT_S = 1.0
#: time a request may take beyond its attempts' upstream time (loopback, two processes)
MARGIN_S = 1.5
#: 11 characters: the mock counts ceil(11 / 4) = 3 prompt tokens, and so does the gateway
PROMPT = "hello there"
PROMPT_TOKENS = 3
LABEL_A = "mock/gpt-4o-mini@conn-a"
LABEL_B = "mock/gpt-4o-mini@conn-b"


@pytest.fixture(scope="module")
def mock_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """The second upstream (the module's ``mock_upstream`` is the first)."""
    p = start_mock(tmp_path_factory.mktemp("mock-b") / "mock-b.log")
    yield p
    p.stop()


@pytest.fixture
def mocks(mock_upstream: Proc, mock_b: Proc) -> Iterator[tuple[Proc, Proc]]:
    for m in (mock_upstream, mock_b):
        httpx.post(m.url + "/_mock/reset")
    yield mock_upstream, mock_b
    for m in (mock_upstream, mock_b):
        httpx.post(m.url + "/_mock/reset")


def config(a_url: str, b_url: str, secret: str) -> str:
    return (
        f"server: {{upstream_timeout_s: {UPSTREAM_TIMEOUT_S}}}\n"
        "connections:\n"
        f"  - {{id: conn-a, provider: mock, base_url: '{a_url}/v1', secret: '{UPSTREAM_SECRET}',"
        " models: [gpt-4o-mini]}\n"
        f"  - {{id: conn-b, provider: mock, base_url: '{b_url}/v1', secret: '{UPSTREAM_SECRET}',"
        " models: [gpt-4o-mini]}\n"
        f"keys:\n  - {{id: k, name: k, secret: '{secret}'}}\n"
        "pools:\n  - {id: p, name: P, connections: [conn-a, conn-b],\n"
        "     dimensions: [{unit: requests, window: hourly, limit: 1000000},\n"
        "                  {unit: tokens, window: hourly, limit: 1000000000}],\n"
        "     allocations: [{key: k, weight: 100}]}\n"
        "combos:\n"
        # maxWaitMs 0: step 3 is about the error when both fail, not the wait that follows
        # a short cooldown (tests/e2e/test_request_path.py has that)
        "  - {name: prio, strategy: priority, config: {maxRetries: 0, maxWaitMs: 0}, targets: [\n"
        "      {provider: mock, model: gpt-4o-mini, connection: conn-a},\n"
        "      {provider: mock, model: gpt-4o-mini, connection: conn-b}]}\n"
    )


#: The breaker (≥ 5 requests, ≥ 50 % failures in 60 s) would open on this test's deliberate
#: failure rate and turn later steps into "provider unavailable" answers; it has its own tests.
GATEWAY_ENV = {"RESILIENCE_BREAKER_MIN_REQUESTS": "100000"}


@dataclass
class Outcome:
    """What the client saw for one request."""

    status: int
    elapsed_s: float
    connection: str | None = None
    text: str = ""
    usage_tokens: int | None = None
    stream_error: bool = False
    finished: bool = False
    body: dict[str, Any] = field(default_factory=dict)
    raw: str = ""


class Client:
    def __init__(self, gw: Proc, secret: str) -> None:
        self.gw = gw
        self.secret = secret
        self.http = httpx.Client(
            base_url=gw.url, headers={"Authorization": f"Bearer {secret}"}, timeout=30
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ask(self, model: str, *, stream: bool) -> Outcome:
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": PROMPT}]}
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        t0 = time.monotonic()
        with self.http.stream("POST", "/v1/chat/completions", json=body) as resp:
            raw = resp.read().decode(errors="replace")
        out = Outcome(resp.status_code, time.monotonic() - t0, raw=raw)
        out.connection = resp.headers.get("x-fairgate-connection")
        assert "Traceback" not in raw
        assert UPSTREAM_SECRET not in raw
        assert self.secret not in raw
        if resp.status_code != 200 or not resp.headers["content-type"].startswith(
            "text/event-stream"
        ):
            assert resp.headers["content-type"].startswith("application/json"), raw[:300]
            out.body = orjson.loads(raw)
            if resp.status_code == 200:
                out.text = out.body["choices"][0]["message"]["content"] or ""
                out.usage_tokens = out.body["usage"]["total_tokens"]
                out.finished = bool(out.body["choices"][0]["finish_reason"])
            return out
        for line in raw.splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = orjson.loads(line[6:])
            if "error" in event:
                out.stream_error = True
                assert event["error"]["message"]
                continue
            if event.get("usage"):
                out.usage_tokens = event["usage"]["total_tokens"]
            for choice in event.get("choices") or ():
                out.text += choice["delta"].get("content") or ""
                out.finished = out.finished or bool(choice.get("finish_reason"))
        return out


def schedule(mock: Proc, *faults: str) -> None:
    r = httpx.post(mock.url + "/_mock/schedule", json={"faults": list(faults)})
    assert r.status_code == 200, r.text


def clear_resilience(gw: Proc) -> None:
    """Forget what the last step taught the gateway (cooldowns, lockouts, permanent blocks)."""
    for conn in ("conn-a", "conn-b"):
        for kind, params in (
            ("cooldown", {"connectionId": conn}),
            ("permanent", {"connectionId": conn}),
            ("lockout", {"connectionId": conn, "provider": "mock", "model": "gpt-4o-mini"}),
        ):
            r = httpx.delete(f"{gw.url}/api/resilience/{kind}", params=params, headers=ADMIN)
            assert r.status_code in (204, 404), r.text
    r = httpx.delete(f"{gw.url}/api/resilience/breaker", params={"provider": "mock"}, headers=ADMIN)
    assert r.status_code in (204, 404), r.text


def settle_and_read(gw: Proc, key_id: str | None = None) -> tuple[dict[str, Any], dict[str, float]]:
    """Wait until nothing is in flight and the background settlements landed (twice in a row);
    then ``/health`` and the pool's totals per dimension (``key_id``'s row of them, if given).
    Quiet is read from ``/health``, not from the totals staying put: across a bucket boundary a
    window total keeps fading."""
    deadline = time.monotonic() + 10
    quiet_before = False
    health: dict[str, Any] = {}
    while time.monotonic() < deadline:
        health = httpx.get(gw.url + "/health").json()
        quiet = (
            health["inflight"],
            health["inflightLeases"],
            health["memory"]["backgroundTasks"],
        ) == (0, 0, 0)
        if quiet and quiet_before:
            usage = httpx.get(gw.url + "/api/quota/pools/p/usage", headers=ADMIN).json()
            if key_id is None:
                return health, {d["key"]: d["total"] for d in usage["dimensions"]}
            return health, {
                d["key"]: next(k["consumed"] for k in d["keys"] if k["keyId"] == key_id)
                for d in usage["dimensions"]
            }
        quiet_before = quiet
        time.sleep(0.2)
    raise AssertionError(f"in-flight state never settled: {health}")


# which failed attempts the upstream answered with a 200 (charged with their usage), and the
# tokens each is charged
def charged_tokens(fault: str, stream: bool) -> int | None:
    """Tokens a failed attempt with ``fault`` is charged, or None when it is not charged."""
    if fault == "empty":
        return PROMPT_TOKENS  # the mock's usage: the prompt and no completion
    if fault == "error-200":
        return PROMPT_TOKENS  # no usage in the answer: the gateway's prompt estimate
    if fault == "no-finish" and not stream:
        return PROMPT_TOKENS + 16  # the mock's usage (16 completion tokens)
    if fault == "reset-mid-stream:1" and stream:
        return PROMPT_TOKENS  # a 200 whose stream broke before any content: the estimate
    return None


FAULTS = [
    "429:1",
    "429-date:1",
    "500",
    "502",
    "503",
    "overloaded",
    "quota",
    "timeout:5",
    "reset",
    "reset-mid-stream:1",
    "reset-mid-stream:3",
    "empty",
    "error-200",
    "no-finish",
]


def upstream_time(fault: str, attempts: int) -> float:
    return attempts * UPSTREAM_TIMEOUT_S if fault.startswith("timeout") else 0.0


@dataclass
class Ledger:
    """What the pool's counters must hold once everything settled, from what the client saw."""

    fault: str
    answers: int = 0  # 200s the client got
    charged_failures: int = 0  # failed attempts that were 200s: settled with their usage
    tokens: int = 0  # the tokens the client can account for exactly
    unknown_token_streams: int = 0  # 200 streams without a usage block (charged by estimate)

    def add(self, out: Outcome, fault_attempts: int, *, stream: bool) -> None:
        charge = charged_tokens(self.fault, stream)
        if charge is not None:
            self.charged_failures += fault_attempts
            self.tokens += charge * fault_attempts
        if out.status == 200:
            self.answers += 1
            if out.usage_tokens is None:
                self.unknown_token_streams += 1
            else:
                self.tokens += out.usage_tokens


def assert_clean_error(out: Outcome, attempts: list[str]) -> None:
    """A JSON error with a message and diagnostics naming every attempt. A 5xx status is the
    upstream's own, passed on with ``code: upstream_error`` -- never the gateway's 500."""
    assert 400 <= out.status < 600, out.raw
    error = out.body["error"]
    assert error["message"]
    if out.status == 500:
        assert error["code"] == "upstream_error", out.raw
    diag = out.body["diagnostics"]
    assert diag["terminalReason"] == "upstream_failed", diag
    assert diag["attemptOrder"] == [a.rpartition("@")[0] for a in attempts], diag  # no conn id
    assert diag["recoveryHint"]


@pytest.fixture(scope="module")
def matrix_gw(
    tmp_path_factory: pytest.TempPathFactory, mock_upstream: Proc, mock_b: Proc
) -> Iterator[Proc]:
    """One gateway for every fault of the matrix (starting one is most of a case's cost);
    each case gets a key of its own (:func:`fresh_key`) and clears the resilience state."""
    p = launch_gateway(
        tmp_path_factory.mktemp("matrix"),
        config(mock_upstream.url, mock_b.url, new_secret()),
        {"QUOTA_STORE_DRIVER": "sqlite", **GATEWAY_ENV},
    )
    yield p
    p.stop()


def fresh_key(gw: Proc, key_id: str) -> str:
    """A new key holding the pool's only allocation: its row of the pool's usage counts this
    case's traffic alone."""
    created = httpx.post(f"{gw.url}/api/keys", headers=ADMIN, json={"id": key_id})
    assert created.status_code == 201, created.text
    r = httpx.patch(
        f"{gw.url}/api/quota/pools/p",
        headers=ADMIN,
        json={"allocations": [{"key": key_id, "weight": 100}]},
    )
    assert r.status_code == 200, r.text
    return str(created.json()["secret"])


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_gets_fallback_or_clean_error_and_leaves_nothing_behind(
    fault: str, mocks: tuple[Proc, Proc], matrix_gw: Proc
) -> None:
    mock_a, mock_b = mocks
    gw = matrix_gw
    key_id = "k-" + "".join(c if c.isalnum() else "-" for c in fault)
    secret = fresh_key(gw, key_id)
    clear_resilience(gw)  # what an earlier case taught the gateway
    mark = len(gw.output())
    since = TEST_CLOCK.now_ms()
    ledger = Ledger(fault)
    partial_stream = fault == "reset-mid-stream:3"  # content reached the client before the cut
    streams_through = fault == "no-finish"  # content came: a stream is passed on as it is
    with Client(gw, secret) as client:
        # 1. A fails, B answers (non-stream)
        schedule(mock_a, fault)
        out = client.ask("prio", stream=False)
        assert (out.status, out.connection) == (200, "conn-b"), out.raw[:500]
        assert out.text
        assert out.finished
        assert out.elapsed_s < upstream_time(fault, 1) + MARGIN_S
        if fault.startswith("timeout"):
            assert out.elapsed_s >= UPSTREAM_TIMEOUT_S * 0.9  # A was given its full timeout
        ledger.add(out, 1, stream=False)
        clear_resilience(gw)

        # 2. A fails, B answers (stream)
        schedule(mock_a, fault)
        out = client.ask("prio", stream=True)
        assert out.status == 200, out.raw[:500]
        assert out.text
        assert out.elapsed_s < upstream_time(fault, 1) + MARGIN_S
        if partial_stream:
            # nothing can be taken back once content is on the wire: the stream ends with an
            # error event the SDKs raise, and the reservation is settled with what was streamed
            assert out.connection == "conn-a"
            assert out.stream_error
            assert not out.finished
            ledger.add(out, 0, stream=True)
        elif streams_through:
            assert out.connection == "conn-a"
            assert not out.finished
            ledger.add(out, 0, stream=True)
        else:
            assert out.connection == "conn-b"
            assert out.finished
            assert not out.stream_error
            ledger.add(out, 1, stream=True)
        clear_resilience(gw)

        # 3. both fail (non-stream): a clean error with diagnostics
        schedule(mock_a, fault)
        schedule(mock_b, fault)
        out = client.ask("prio", stream=False)
        assert_clean_error(out, [LABEL_A, LABEL_B])
        assert out.elapsed_s < upstream_time(fault, 2) + MARGIN_S
        ledger.add(out, 2, stream=False)
        clear_resilience(gw)

        # 4. both fail (stream)
        schedule(mock_a, fault)
        schedule(mock_b, fault)
        out = client.ask("prio", stream=True)
        assert out.elapsed_s < upstream_time(fault, 2) + MARGIN_S
        if partial_stream or streams_through:
            assert (out.status, out.connection) == (200, "conn-a")
            assert out.stream_error == partial_stream
            ledger.add(out, 0, stream=True)
            schedule(mock_b)  # B's fault was never reached
        else:
            assert_clean_error(out, [LABEL_A, LABEL_B])
            ledger.add(out, 2, stream=True)

    health, totals = settle_and_read(gw, key_id)
    assert (health["inflight"], health["inflightLeases"]) == (0, 0)
    # exactly the settled usage: the answers plus the charged failures, no reservation left
    requests = ledger.answers + ledger.charged_failures
    assert_window_count(totals["requests/hourly"], requests, "hourly", since)
    tokens = totals["tokens/hourly"]
    lowest, _ = window_count_range(ledger.tokens, "hourly", since, TEST_CLOCK.now_ms())
    assert lowest <= tokens <= ledger.tokens + 40 * ledger.unknown_token_streams, (tokens, ledger)
    log = gw.output()[mark:]
    assert "Traceback" not in log
    assert UPSTREAM_SECRET not in log
    assert secret not in log


def scheduled_left(*mocks: Proc) -> int:
    return sum(len(httpx.get(m.url + "/_mock/stats").json()["scheduled"]) for m in mocks)


def wait_for_no_cooldowns(gw: Proc, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        res = httpx.get(gw.url + "/api/monitoring/health", headers=ADMIN).json()["resilience"]
        if not res["cooldowns"] and not res["lockouts"]:
            return
        time.sleep(0.1)
    raise AssertionError(f"cooldowns never passed: {res['cooldowns']} {res['lockouts']}")


#: The longest a storm request may take: two upstream timeouts, the cooldown waits, a margin.
STORM_BOUND_S = 2 * UPSTREAM_TIMEOUT_S + DEFAULT_MAX_WAIT_MS / 1000 + MARGIN_S


def test_storm_of_429s_and_5xx_under_concurrency(
    mocks: tuple[Proc, Proc], start_gateway: GatewayFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """Waves of concurrent requests (the plain model: quota-share routing over the pool) into a
    storm of 429s on A and a burst of 5xx and a timeout on B, until every scheduled fault was
    served. Every answer is a 200 or a clean error with diagnostics; none hangs; once the
    cooldowns pass, every request is served again; the counters end equal to the answers
    (failed attempts without a 200 are never charged)."""
    mock_a, mock_b = mocks
    secret = new_secret()
    since = TEST_CLOCK.now_ms()
    # short cooldowns: each consecutive failure doubles a connection's cooldown, so with the
    # defaults a storm of ten failures keeps a connection out for minutes (as it should in
    # production; here the test wants to see the storm end)
    env = {
        **GATEWAY_ENV,
        "RESILIENCE_APIKEY_BASE_COOLDOWN_MS": "100",
        "RESILIENCE_MAX_COOLDOWN_MS": "600",
    }
    gw = start_gateway(config(mock_a.url, mock_b.url, secret), extra_env=env)
    schedule(mock_a, *(["429:1"] * 6 + ["503"] * 3))
    schedule(mock_b, "500", "502", "overloaded", "timeout:3")
    statuses: dict[int, int] = {}

    def one(i: int) -> Outcome:
        with Client(gw, secret) as client:
            return client.ask("gpt-4o-mini", stream=bool(i % 2))

    t0 = time.monotonic()
    outcomes: list[Outcome] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        waves = 0
        while scheduled_left(mock_a, mock_b) and time.monotonic() - t0 < 60:
            outcomes += pool.map(one, range(waves * 8, waves * 8 + 8))
            waves += 1
            time.sleep(0.2)
        assert scheduled_left(mock_a, mock_b) == 0
        wait_for_no_cooldowns(gw)
        after = list(pool.map(one, range(8)))  # the storm is over: everyone is served
    wall = time.monotonic() - t0
    assert [o.status for o in after] == [200] * 8, [o.raw[:300] for o in after]
    outcomes += after
    for out in outcomes:
        statuses[out.status] = statuses.get(out.status, 0) + 1
        # two candidates, each at most one upstream timeout, plus the waits for a rate-limited
        # target to free (a plain model's maxWaitMs, in all): a request that meets several of
        # A's 429s in a row waits out each Retry-After (one did: 4.0 s, four 1 s waits)
        assert out.elapsed_s < STORM_BOUND_S, out
        if out.status == 200:
            assert out.text
            continue
        assert out.body["error"]["message"], out.raw
        assert "diagnostics" in out.body
        if out.status == 500:
            assert out.body["error"]["code"] == "upstream_error"
    health, totals = settle_and_read(gw)
    assert (health["inflight"], health["inflightLeases"]) == (0, 0)
    assert_window_count(totals["requests/hourly"], statuses[200], "hourly", since)
    assert "Traceback" not in gw.output()
    with capsys.disabled():
        print(
            f"\n[fault storm] {len(outcomes)} requests in {waves} waves + 1 after the storm, "
            f"{wall:.1f} s; statuses {dict(sorted(statuses.items()))}; the longest "
            f"{max(o.elapsed_s for o in outcomes):.2f} s (bound {STORM_BOUND_S:.1f} s)"
        )


def test_stream_silent_before_its_first_content_is_cut_at_the_upstream_timeout(
    mocks: tuple[Proc, Proc], start_gateway: GatewayFactory
) -> None:
    """Streams whose upstream sends its headers and first event, then goes silent: the
    gateway's read timeout cuts each attempt at ``upstream_timeout_s`` (not the mock's pace),
    falls through to the next target, and ends with a clean error -- no endless wait. The two
    attempts were 200s: each is settled with the prompt estimate, nothing stays reserved."""
    mock_a, mock_b = mocks
    secret = new_secret()
    since = TEST_CLOCK.now_ms()
    gw = start_gateway(config(mock_a.url, mock_b.url, secret), extra_env=GATEWAY_ENV)
    for m in (mock_a, mock_b):
        httpx.post(m.url + "/_mock/config", json={"chunk_delay_ms": 4000})
    try:
        client = Client(gw, secret)
        out = client.ask("prio", stream=True)
        client.close()
    finally:
        for m in (mock_a, mock_b):
            httpx.post(m.url + "/_mock/config", json={"chunk_delay_ms": 0})
    assert out.status in (502, 503, 504), out.raw
    assert logged_diagnostics(gw)[-1]["attemptOrder"] == [LABEL_A, LABEL_B]
    assert 2 * UPSTREAM_TIMEOUT_S * 0.9 <= out.elapsed_s < 2 * UPSTREAM_TIMEOUT_S + MARGIN_S
    TEST_CLOCK.cross_boundary(gw)
    health, totals = settle_and_read(gw)
    assert (health["inflight"], health["inflightLeases"]) == (0, 0)
    assert_window_count(totals["requests/hourly"], 2, "hourly", since)
    assert_window_count(totals["tokens/hourly"], 2 * PROMPT_TOKENS, "hourly", since)
