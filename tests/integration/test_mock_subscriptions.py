"""The mock's subscription side on a real socket: the Responses wire (driven by the official
``openai`` SDK), the Codex backend's windows and errors, the OAuth authority, Anthropic OAuth.

Time is the injected ``ManualClock``: windows and token lifetimes move only when the test says.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
import pytest_asyncio

from fairgate.clock import ManualClock
from fairgate.domain.readings import WindowReading, parse_rate_limit_headers
from fairgate.mock.oauth import OAUTH_BETA
from fairgate.mock.server import CODEX_PATH, MockConfig, MockUpstream

SECRET = "sk-mock-sub-secret-0123456789"
TOKENS = 10
PER_1K = 2.0  # percent of the 5h window per 1,000 tokens


@pytest_asyncio.fixture
async def up(clock: ManualClock) -> AsyncIterator[MockUpstream]:
    cfg = MockConfig(
        secret=SECRET,
        completion_tokens=TOKENS,
        codex_percent_per_1k_tokens=PER_1K,
        codex_weekly_ratio=0.25,
        oauth_access_ttl_s=600,
    )
    async with MockUpstream(cfg, clock=clock) as upstream:
        yield upstream


async def login(up: MockUpstream, account: str = "acct-1") -> dict[str, str]:
    async with aiohttp.ClientSession() as s:
        r = await s.post(f"{up.url}/_mock/oauth/login", json={"account_id": account})
        return dict(await r.json())


async def test_responses_api_with_the_openai_sdk(up: MockUpstream) -> None:
    async with openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=SECRET, max_retries=0) as c:
        await _responses_with(c)
    async with openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key="wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            await c.responses.create(model="m", input="x")


async def _responses_with(client: openai.AsyncOpenAI) -> None:
    raw = await client.responses.with_raw_response.create(
        model="mock-gpt-4o", input="fair shares please"
    )
    resp = raw.parse()
    # the answer's input and output tokens count in the rolling minute its headers report
    used = int(raw.headers["x-ratelimit-limit-tokens"]) - int(
        raw.headers["x-ratelimit-remaining-tokens"]
    )
    assert resp.usage is not None
    assert used == resp.usage.total_tokens
    assert resp.output_text.startswith("mock reply: fair shares please")
    assert resp.usage is not None
    assert resp.usage.output_tokens == TOKENS
    assert resp.usage.input_tokens == math.ceil(len("fair shares please") / 4)
    async with client.responses.stream(model="mock-gpt-4o", input="stream it") as stream:
        deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(deltas) == final.output_text
    assert final.usage is not None
    assert final.usage.output_tokens == TOKENS


async def test_codex_backend_windows_move_with_use_and_reset(
    up: MockUpstream, clock: ManualClock
) -> None:
    tokens = await login(up)
    client = openai.AsyncOpenAI(
        base_url=f"{up.url}/backend-api/codex",
        api_key=tokens["access_token"],
        default_headers={"chatgpt-account-id": "acct-1"},
        max_retries=0,
    )
    async with client:
        readings = await _three_codex_calls(client, clock)
    _check_readings(readings, clock)
    # the window runs from the first use, not from an epoch boundary, and resets completely
    clock.advance(5 * 3_600_000)
    async with aiohttp.ClientSession() as s:
        r = await s.post(
            f"{up.url}{CODEX_PATH}",
            json={"model": "gpt-5-codex", "input": "again", "stream": True},
            headers={
                "authorization": f"Bearer {tokens['access_token']}",
                "chatgpt-account-id": "acct-1",
            },
        )
        # the access token lived 600 s: expired now, as a real one would be
        assert r.status == 401


Reading = tuple[WindowReading | None, WindowReading | None, int]


async def _three_codex_calls(client: openai.AsyncOpenAI, clock: ManualClock) -> list[Reading]:
    readings: list[Reading] = []
    for _ in range(3):
        raw = await client.responses.with_raw_response.create(
            model="gpt-5-codex", input="hello codex", instructions="be terse", stream=True
        )
        stream = raw.parse()
        events = [e async for e in stream]
        assert events[-1].type == "response.completed"
        usage = events[-1].response.usage
        assert usage is not None
        snap = parse_rate_limit_headers(raw.headers, clock.now_ms())
        assert snap is not None
        readings.append((snap.window("5h"), snap.window("weekly"), usage.total_tokens))
    return readings


def _check_readings(readings: list[Reading], clock: ManualClock) -> None:
    per_call = readings[0][2]
    for n, (five, week, _) in enumerate(readings, 1):
        assert five is not None
        assert week is not None
        assert five.used == pytest.approx(n * per_call * PER_1K / 1000 / 100)
        assert week.used == pytest.approx(five.used * 0.25)
    first_reset = readings[0][0].reset_ms  # type: ignore[union-attr]
    assert first_reset == math.ceil((clock.now_ms() + 5 * 3_600_000) / 1000) * 1000


async def test_codex_usage_limit_reached(up: MockUpstream, clock: ManualClock) -> None:
    tokens = await login(up)
    up.config.codex_percent_per_1k_tokens = 100_000.0  # one answer fills the 5h window…
    up.config.codex_weekly_ratio = 0.0  # …and not the weekly one
    headers = {"authorization": f"Bearer {tokens['access_token']}", "chatgpt-account-id": "acct-1"}
    body = {"model": "gpt-5-codex", "input": "fill it", "stream": True}
    async with aiohttp.ClientSession() as s:
        r = await s.post(f"{up.url}{CODEX_PATH}", json=body, headers=headers)
        assert r.status == 200
        await r.read()
        r = await s.post(f"{up.url}{CODEX_PATH}", json=body, headers=headers)
        assert r.status == 429
        err = (await r.json())["error"]
        assert err["type"] == "usage_limit_reached"
        assert err["resets_in_seconds"] == 5 * 3600
        assert r.headers["x-codex-primary-used-percent"] == "100"
        # the wrong account, or a non-stream request, is refused before any use
        r = await s.post(
            f"{up.url}{CODEX_PATH}", json=body, headers={**headers, "chatgpt-account-id": "acct-2"}
        )
        assert r.status == 403
        r = await s.post(f"{up.url}{CODEX_PATH}", json={**body, "stream": False}, headers=headers)
        assert r.status == 400


async def test_token_endpoint_rotates_and_refuses_reuse(up: MockUpstream) -> None:
    tokens = await login(up)
    async with aiohttp.ClientSession() as s:
        grant = {
            "grant_type": "refresh_token",
            "refresh_token": tokens["refresh_token"],
            "client_id": "app_test",
        }
        r = await s.post(f"{up.url}/oauth/token", json=grant)
        assert r.status == 200
        fresh = await r.json()
        assert fresh["refresh_token"] != tokens["refresh_token"]
        assert fresh["expires_in"] == 600
        r = await s.post(f"{up.url}/oauth/token", data=grant)  # form body, the used token
        assert r.status == 400
        assert (await r.json())["error"] == "invalid_grant"
        assert tokens["refresh_token"] not in await r.text()


async def test_anthropic_oauth_needs_the_beta_flag(up: MockUpstream) -> None:
    tokens = await login(up, "claude-acct")
    body = {
        "model": "claude-sonnet-4",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}],
    }
    base = {"authorization": f"Bearer {tokens['access_token']}", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as s:
        r = await s.post(f"{up.url}/v1/messages", json=body, headers=base)
        assert r.status == 401
        r = await s.post(
            f"{up.url}/v1/messages", json=body, headers={**base, "anthropic-beta": OAUTH_BETA}
        )
        assert r.status == 200
        assert up.stats()["last_auth_scheme"] == "oauth"
