"""The mock upstream on a real loopback socket, driven by the official OpenAI and Anthropic SDKs.

If the real SDKs accept what the mock sends (and fail the way they fail against the real APIs),
the gateway tests that run against the mock exercise the gateway's real code paths.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import aiohttp
import anthropic
import httpx
import httpx2
import openai
import pytest
import pytest_asyncio

from fairgate.mock.faults import FaultSpecError, go_duration, parse_fault
from fairgate.mock.server import MockConfig, MockUpstream

SECRET = "sk-mock-test-secret-0123456789"
WRONG = "sk-wrong-key-should-never-be-echoed"
TOKENS = 12
CHUNKS = 4
USER_TEXT = "Tell me about fair sharing of quota"
MESSAGES: list[Any] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": USER_TEXT},
]
# ceil(characters of all message contents / 4)
PROMPT_TOKENS = math.ceil((len("You are terse.") + len(USER_TEXT)) / 4)
ANTHROPIC_PROMPT_TOKENS = math.ceil(len(USER_TEXT) / 4)
GO_DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+(\.\d+)?s|\d+ms)$")


@pytest_asyncio.fixture
async def mock() -> AsyncIterator[MockUpstream]:
    config = MockConfig(
        secret=SECRET,
        completion_tokens=TOKENS,
        stream_chunks=CHUNKS,
        unified_5h_utilization=0.42,
        unified_7d_utilization=0.3,
    )
    async with MockUpstream(config) as upstream:
        yield upstream


@pytest_asyncio.fixture
async def oai(mock: MockUpstream) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        base_url=mock.url + "/v1", api_key=SECRET, max_retries=0, timeout=5.0
    )
    async with client:
        yield client


@pytest_asyncio.fixture
async def ant(mock: MockUpstream) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(base_url=mock.url, api_key=SECRET, max_retries=0, timeout=5.0)
    async with client:
        yield client


@pytest_asyncio.fixture
async def http(mock: MockUpstream) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=mock.url) as session:
        yield session


OPENAI_AUTH = {"Authorization": f"Bearer {SECRET}"}
ANTHROPIC_AUTH = {"x-api-key": SECRET, "anthropic-version": "2023-06-01"}
CHAT = {"model": "mock-gpt-4o", "messages": MESSAGES}
MSG = {"model": "mock-claude-sonnet-4", "max_tokens": 100, "messages": MESSAGES[1:]}


async def _sse_lines(
    http: aiohttp.ClientSession, path: str, body: dict[str, Any], headers: dict[str, str]
) -> list[str]:
    async with http.post(path, json=body, headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        return (await resp.text()).splitlines()


# ---------------------------------------------------------------------------------------------
# OpenAI chat completions, embeddings, models


async def test_chat_non_stream(oai: openai.AsyncOpenAI) -> None:
    resp = await oai.chat.completions.create(model="mock-gpt-4o", messages=MESSAGES)
    assert resp.object == "chat.completion"
    assert resp.model == "mock-gpt-4o"
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    text = choice.message.content or ""
    assert text.startswith("mock reply: tell me about")
    assert len(text.split()) == TOKENS
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == PROMPT_TOKENS
    assert resp.usage.completion_tokens == TOKENS
    assert resp.usage.total_tokens == PROMPT_TOKENS + TOKENS
    assert resp.usage.prompt_tokens_details is not None
    assert resp.usage.prompt_tokens_details.cached_tokens == 0
    # deterministic
    again = await oai.chat.completions.create(model="mock-gpt-4o", messages=MESSAGES)
    assert again.choices[0].message.content == text


async def test_chat_max_tokens_truncates(oai: openai.AsyncOpenAI) -> None:
    resp = await oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=5)
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 5
    assert len((resp.choices[0].message.content or "").split()) == 5
    # a cap above the configured length changes nothing
    resp = await oai.chat.completions.create(model="m", messages=MESSAGES, max_tokens=500)
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage is not None
    assert resp.usage.completion_tokens == TOKENS


async def test_chat_stream_without_usage(oai: openai.AsyncOpenAI) -> None:
    full = await oai.chat.completions.create(model="m", messages=MESSAGES)
    stream = await oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    chunks = [c async for c in stream]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert all(c.usage is None for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "stop"
    content = [c.choices[0].delta.content for c in chunks[1:-1]]
    assert len(content) == CHUNKS
    assert "".join(p or "" for p in content) == full.choices[0].message.content


async def test_chat_stream_with_include_usage(oai: openai.AsyncOpenAI) -> None:
    stream = await oai.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert chunks[-2].choices[0].finish_reason == "stop"
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == TOKENS
    assert last.usage.prompt_tokens == PROMPT_TOKENS
    assert all(c.usage is None for c in chunks[:-1])


async def test_chat_stream_wire_format(http: aiohttp.ClientSession) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    lines = await _sse_lines(http, "/v1/chat/completions", body, OPENAI_AUTH)
    data = [line for line in lines if line]
    assert all(line.startswith("data: ") for line in data)
    assert data[-1] == "data: [DONE]"
    assert len(data) == 1 + CHUNKS + 1 + 1 + 1  # role, content, finish, usage, DONE
    usage_chunk = json.loads(data[-2][len("data: ") :])
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == TOKENS


async def test_embeddings(oai: openai.AsyncOpenAI, http: aiohttp.ClientSession) -> None:
    one = await oai.embeddings.create(model="mock-text-embedding-3-small", input="hello")
    assert len(one.data) == 1
    vec = one.data[0].embedding
    assert len(vec) == 8
    assert math.isclose(sum(v * v for v in vec), 1.0, rel_tol=1e-5)
    assert one.usage.prompt_tokens == one.usage.total_tokens == 2
    many = await oai.embeddings.create(model="e", input=["hello", "world"], dimensions=16)
    assert [d.index for d in many.data] == [0, 1]
    assert all(len(d.embedding) == 16 for d in many.data)
    assert many.data[0].embedding != many.data[1].embedding
    again = await oai.embeddings.create(model="e", input="hello")
    assert again.data[0].embedding == vec
    # the float encoding carries the same float32 values as the SDK's default
    body = {"model": "e", "input": "hello", "encoding_format": "float"}
    async with http.post("/v1/embeddings", json=body, headers=OPENAI_AUTH) as resp:
        raw = await resp.json()
    assert raw["data"][0]["embedding"] == pytest.approx(vec)


async def test_models(oai: openai.AsyncOpenAI, ant: anthropic.AsyncAnthropic) -> None:
    ids = [m.id async for m in oai.models.list()]
    assert "mock-gpt-4o" in ids
    assert "mock-claude-sonnet-4" in ids
    anthropic_ids = [m.id async for m in ant.models.list()]
    assert anthropic_ids == ids


# ---------------------------------------------------------------------------------------------
# Anthropic messages


async def test_messages_non_stream(ant: anthropic.AsyncAnthropic) -> None:
    msg = await ant.messages.create(
        model="mock-claude-sonnet-4",
        max_tokens=100,
        messages=[{"role": "user", "content": USER_TEXT}],
    )
    assert msg.type == "message"
    assert msg.role == "assistant"
    assert msg.stop_reason == "end_turn"
    block = msg.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    assert len(block.text.split()) == TOKENS
    assert msg.usage.input_tokens == ANTHROPIC_PROMPT_TOKENS
    assert msg.usage.output_tokens == TOKENS
    short = await ant.messages.create(
        model="m",
        max_tokens=3,
        system="be brief",
        messages=[{"role": "user", "content": USER_TEXT}],
    )
    assert short.stop_reason == "max_tokens"
    assert short.usage.output_tokens == 3
    assert short.usage.input_tokens == math.ceil((len(USER_TEXT) + len("be brief")) / 4)


async def test_messages_stream(ant: anthropic.AsyncAnthropic) -> None:
    full = await ant.messages.create(**MSG)
    async with ant.messages.stream(**MSG) as stream:
        pieces = [t async for t in stream.text_stream]
        final = await stream.get_final_message()
    assert len(pieces) == CHUNKS
    block = full.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    assert "".join(pieces) == block.text
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == TOKENS
    assert final.usage.input_tokens == ANTHROPIC_PROMPT_TOKENS


async def test_messages_stream_event_sequence(http: aiohttp.ClientSession) -> None:
    lines = await _sse_lines(http, "/v1/messages", {**MSG, "stream": True}, ANTHROPIC_AUTH)
    events = [line[len("event: ") :] for line in lines if line.startswith("event: ")]
    assert events == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * CHUNKS,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    data = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
    assert data[0]["message"]["usage"]["output_tokens"] == 1
    assert data[-2]["usage"] == {"output_tokens": TOKENS}
    assert data[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


# ---------------------------------------------------------------------------------------------
# Auth


async def test_wrong_secret_is_401_in_both_formats(mock: MockUpstream) -> None:
    async with openai.AsyncOpenAI(base_url=mock.url + "/v1", api_key=WRONG, max_retries=0) as oc:
        with pytest.raises(openai.AuthenticationError) as oerr:
            await oc.chat.completions.create(model="m", messages=MESSAGES)
    assert oerr.value.code == "invalid_api_key"
    assert mock.stats()["last_auth_ok"] is False
    async with anthropic.AsyncAnthropic(base_url=mock.url, api_key=WRONG, max_retries=0) as ac:
        with pytest.raises(anthropic.AuthenticationError) as aerr:
            await ac.messages.create(**MSG)
    assert isinstance(aerr.value.body, dict)
    assert aerr.value.body["error"]["type"] == "authentication_error"
    for err in (oerr.value, aerr.value):
        assert WRONG not in err.response.text
        assert SECRET not in err.response.text


async def test_auth_header_per_wire(http: aiohttp.ClientSession, mock: MockUpstream) -> None:
    # Anthropic routes take x-api-key, or a Bearer token (what the anthropic SDK 2.x sends)
    bearer = {"Authorization": f"Bearer {SECRET}", "anthropic-version": "2023-06-01"}
    async with http.post("/v1/messages", json=MSG, headers=bearer) as resp:
        assert resp.status == 200
    assert mock.stats()["last_auth_scheme"] == "bearer"
    async with http.post("/v1/messages", json=MSG, headers=ANTHROPIC_AUTH) as resp:
        assert resp.status == 200
    assert mock.stats()["last_auth_scheme"] == "x-api-key"
    # a present x-api-key is the one that counts
    async with http.post("/v1/messages", json=MSG, headers={**bearer, "x-api-key": WRONG}) as r:
        assert r.status == 401
    # OpenAI routes take only Bearer
    async with http.post("/v1/chat/completions", json=CHAT, headers=ANTHROPIC_AUTH) as resp:
        assert resp.status == 401
        assert (await resp.json())["error"]["code"] == "invalid_api_key"
    assert mock.stats()["last_auth_scheme"] is None


async def test_no_secret_means_no_auth() -> None:
    async with (
        MockUpstream() as up,
        aiohttp.ClientSession(base_url=up.url) as http,
        http.post("/v1/chat/completions", json=CHAT) as resp,
    ):
        assert resp.status == 200
        assert up.stats()["last_auth_ok"] is True


# ---------------------------------------------------------------------------------------------
# Faults


def _fault(spec: str) -> dict[str, str]:
    return {"x-mock-fault": spec}


async def _drain(stream: AsyncIterable[Any], into: list[Any]) -> None:
    """Collect what a stream yields until it ends or fails (the caller checks how it failed)."""
    async for item in stream:
        into.append(item)


async def test_429_retry_after_seconds(
    oai: openai.AsyncOpenAI, ant: anthropic.AsyncAnthropic
) -> None:
    with pytest.raises(openai.RateLimitError) as oerr:
        await oai.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers=_fault("429:7")
        )
    assert oerr.value.response.headers["retry-after"] == "7"
    assert oerr.value.code == "rate_limit_exceeded"
    assert oerr.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(anthropic.RateLimitError) as aerr:
        await ant.messages.create(**MSG, extra_headers=_fault("429"))
    assert aerr.value.response.headers["retry-after"] == "1"
    assert aerr.value.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert isinstance(aerr.value.body, dict)
    assert aerr.value.body["error"]["type"] == "rate_limit_error"


async def test_429_retry_after_http_date(oai: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.RateLimitError) as err:
        await oai.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers=_fault("429-date:30")
        )
    when = email.utils.parsedate_to_datetime(err.value.response.headers["retry-after"])
    assert 29 <= when.timestamp() - time.time() <= 32


@pytest.mark.parametrize(
    ("spec", "path", "status", "error_type"),
    [
        ("500", "/v1/chat/completions", 500, "server_error"),
        ("502", "/v1/chat/completions", 502, "server_error"),
        ("503", "/v1/chat/completions", 503, "server_error"),
        ("overloaded", "/v1/chat/completions", 503, "server_error"),
        ("quota", "/v1/chat/completions", 429, "insufficient_quota"),
        ("500", "/v1/messages", 500, "api_error"),
        ("502", "/v1/messages", 502, "api_error"),
        ("503", "/v1/messages", 503, "api_error"),
        ("overloaded", "/v1/messages", 529, "overloaded_error"),
        ("quota", "/v1/messages", 429, "billing_error"),
        ("quota:400", "/v1/messages", 400, "billing_error"),
        ("500", "/v1/embeddings", 500, "server_error"),
    ],
)
async def test_status_faults_in_provider_format(
    http: aiohttp.ClientSession, spec: str, path: str, status: int, error_type: str
) -> None:
    anthropic_wire = path == "/v1/messages"
    headers = {**(ANTHROPIC_AUTH if anthropic_wire else OPENAI_AUTH), **_fault(spec)}
    body = MSG if anthropic_wire else {"model": "e", "input": "x", **CHAT}
    async with http.post(path, json=body, headers=headers) as resp:
        assert resp.status == status
        payload = await resp.json()
    if anthropic_wire:
        assert payload["type"] == "error"
        assert payload["error"]["type"] == error_type
        assert isinstance(payload["error"]["message"], str)
    else:
        assert set(payload["error"]) == {"message", "type", "param", "code"}
        assert payload["error"]["type"] == error_type


async def test_quota_bodies(oai: openai.AsyncOpenAI, ant: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(openai.RateLimitError) as oerr:
        await oai.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers=_fault("quota")
        )
    assert oerr.value.code == "insufficient_quota"
    assert "You exceeded your current quota, please check your plan and billing details." in str(
        oerr.value
    )
    assert "retry-after" not in oerr.value.response.headers
    with pytest.raises(anthropic.RateLimitError) as aerr:
        await ant.messages.create(**MSG, extra_headers=_fault("quota"))
    assert "credit balance" in aerr.value.message
    assert "Billing" in aerr.value.message


async def test_overloaded_sdk_errors(
    oai: openai.AsyncOpenAI, ant: anthropic.AsyncAnthropic
) -> None:
    with pytest.raises(anthropic.OverloadedError):
        await ant.messages.create(**MSG, extra_headers=_fault("overloaded"))
    with pytest.raises(openai.InternalServerError) as err:
        await oai.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers=_fault("overloaded")
        )
    assert err.value.status_code == 503


async def test_timeout_holds_then_answers(oai: openai.AsyncOpenAI) -> None:
    start = time.monotonic()
    resp = await oai.chat.completions.create(
        model="m", messages=MESSAGES, extra_headers=_fault("timeout:0.3")
    )
    assert time.monotonic() - start >= 0.3
    assert resp.choices[0].finish_reason == "stop"


async def test_timeout_ends_when_the_client_leaves(
    http: aiohttp.ClientSession, mock: MockUpstream
) -> None:
    with pytest.raises(asyncio.TimeoutError):
        async with http.post(
            "/v1/chat/completions",
            json=CHAT,
            headers={**OPENAI_AUTH, **_fault("timeout:30")},
            timeout=aiohttp.ClientTimeout(total=0.2),
        ):
            pass
    for _ in range(50):
        if mock.stats()["in_flight"] == 0:
            break
        await asyncio.sleep(0.02)
    stats = mock.stats()
    assert stats["in_flight"] == 0
    assert stats["by_status"] == {"aborted": 1}


async def test_latency(oai: openai.AsyncOpenAI, mock: MockUpstream) -> None:
    start = time.monotonic()
    await oai.chat.completions.create(
        model="m", messages=MESSAGES, extra_headers=_fault("latency:200")
    )
    assert time.monotonic() - start >= 0.2
    mock.config.update({"latency_ms": 150})
    start = time.monotonic()
    await oai.models.list()
    assert time.monotonic() - start >= 0.15


async def test_slow_first_token(oai: openai.AsyncOpenAI) -> None:
    start = time.monotonic()
    stream = await oai.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, extra_headers=_fault("slow-first-token:200")
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks[1:])
    assert time.monotonic() - start >= 0.2  # the first token came no sooner


async def test_reasoning_only(oai: openai.AsyncOpenAI) -> None:
    resp = await oai.chat.completions.create(
        model="m", messages=MESSAGES, extra_headers=_fault("reasoning-only")
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.content is None
    assert (choice.message.model_extra or {})["reasoning_content"]
    assert resp.usage is not None
    assert resp.usage.completion_tokens_details is not None
    assert resp.usage.completion_tokens_details.reasoning_tokens == resp.usage.completion_tokens
    stream = await oai.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, extra_headers=_fault("reasoning-only")
    )
    chunks = [c async for c in stream]
    assert all(not c.choices[0].delta.content for c in chunks)
    assert any((c.choices[0].delta.model_extra or {}).get("reasoning_content") for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_reset_is_a_connection_error(
    oai: openai.AsyncOpenAI, http: aiohttp.ClientSession, mock: MockUpstream
) -> None:
    with pytest.raises(openai.APIConnectionError):
        await oai.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers=_fault("reset")
        )
    with pytest.raises(aiohttp.ClientConnectionError):
        async with http.post(
            "/v1/messages", json=MSG, headers={**ANTHROPIC_AUTH, **_fault("reset")}
        ) as resp:
            await resp.read()
    assert mock.stats()["by_fault"] == {"reset": 2}
    assert mock.stats()["by_status"] == {"aborted": 2}
    # the server is fine afterwards
    resp = await oai.chat.completions.create(model="m", messages=MESSAGES)
    assert resp.choices[0].finish_reason == "stop"


async def test_reset_mid_stream_openai(oai: openai.AsyncOpenAI) -> None:
    stream = await oai.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, extra_headers=_fault("reset-mid-stream:2")
    )
    got: list[Any] = []
    with pytest.raises((httpx2.HTTPError, openai.APIError)):
        await _drain(stream, got)
    assert len(got) == 2


async def test_reset_mid_stream_anthropic(ant: anthropic.AsyncAnthropic) -> None:
    got: list[Any] = []

    async def consume() -> None:
        async with ant.messages.stream(**MSG, extra_headers=_fault("reset-mid-stream:4")) as s:
            await _drain(s, got)

    with pytest.raises((httpx2.HTTPError, anthropic.APIError)):
        await consume()
    got = [event.type for event in got]
    # raw: message_start, content_block_start, ping, one delta (the SDK hides pings)
    assert got.count("content_block_delta") == 1
    assert "message_stop" not in got


async def test_reset_mid_stream_sends_exactly_k_events(http: aiohttp.ClientSession) -> None:
    headers = {**ANTHROPIC_AUTH, **_fault("reset-mid-stream:3")}
    lines: list[bytes] = []

    async def consume() -> None:
        async with http.post("/v1/messages", json={**MSG, "stream": True}, headers=headers) as r:
            assert r.status == 200
            await _drain(r.content, lines)

    with pytest.raises(aiohttp.ClientPayloadError):
        await consume()
    events = [line.decode().strip()[7:] for line in lines if line.startswith(b"event: ")]
    assert events == ["message_start", "content_block_start", "ping"]


async def test_reset_mid_stream_non_stream_body(oai: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.APIConnectionError):
        await oai.chat.completions.create(
            model="m", messages=MESSAGES, extra_headers=_fault("reset-mid-stream")
        )


@pytest.mark.parametrize(
    ("fault", "finish", "stop"), [("empty", None, None), ("empty-turn", "stop", "end_turn")]
)
async def test_empty(
    oai: openai.AsyncOpenAI,
    ant: anthropic.AsyncAnthropic,
    fault: str,
    finish: str | None,
    stop: str | None,
) -> None:
    """``empty``: nothing and no finish (broken); ``empty-turn``: nothing and a finish, the
    empty answer Anthropic documents after tool results (``content: []``, ``end_turn``)."""
    resp = await oai.chat.completions.create(
        model="m", messages=MESSAGES, extra_headers=_fault(fault)
    )
    assert resp.choices[0].message.content == ""
    assert resp.choices[0].finish_reason == finish
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 0
    msg = await ant.messages.create(**MSG, extra_headers=_fault(fault))
    assert msg.content == []
    assert msg.stop_reason == stop
    stream = await oai.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, extra_headers=_fault(fault)
    )
    chunks = [c async for c in stream if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == (
        [finish] if finish else []
    )


async def test_error_200(
    http: aiohttp.ClientSession, oai: openai.AsyncOpenAI, ant: anthropic.AsyncAnthropic
) -> None:
    async with http.post(
        "/v1/chat/completions", json=CHAT, headers={**OPENAI_AUTH, **_fault("error-200")}
    ) as resp:
        assert resp.status == 200
        assert set((await resp.json())["error"]) == {"message", "type", "param", "code"}
    async with http.post(
        "/v1/messages", json=MSG, headers={**ANTHROPIC_AUTH, **_fault("error-200")}
    ) as resp:
        assert resp.status == 200
        assert (await resp.json())["type"] == "error"
    # streaming: the error arrives as an event, and the SDKs raise it
    stream = await oai.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, extra_headers=_fault("error-200")
    )
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass
    with pytest.raises(anthropic.APIStatusError):
        async with ant.messages.stream(**MSG, extra_headers=_fault("error-200")) as s:
            await s.get_final_message()


async def test_no_finish(http: aiohttp.ClientSession, oai: openai.AsyncOpenAI) -> None:
    stream = await oai.chat.completions.create(
        model="m", messages=MESSAGES, stream=True, extra_headers=_fault("no-finish")
    )
    chunks = [c async for c in stream]
    assert len(chunks) == 1 + CHUNKS
    assert all(c.choices[0].finish_reason is None for c in chunks)
    lines = await _sse_lines(
        http, "/v1/messages", {**MSG, "stream": True}, {**ANTHROPIC_AUTH, **_fault("no-finish")}
    )
    assert "event: content_block_delta" in lines
    assert "event: message_stop" not in lines
    assert "event: message_delta" not in lines


async def test_unknown_fault_is_400(http: aiohttp.ClientSession) -> None:
    async with http.post(
        "/v1/chat/completions", json=CHAT, headers={**OPENAI_AUTH, **_fault("boom")}
    ) as resp:
        assert resp.status == 400
        assert "unknown fault" in (await resp.json())["error"]["message"]


@pytest.mark.parametrize("spec", ["boom", "timeout", "latency:x", "500:1", "quota:200", "429:-1"])
def test_parse_fault_rejects(spec: str) -> None:
    with pytest.raises(FaultSpecError):
        parse_fault(spec)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.25, "250ms"), (0.0004, "1ms"), (1, "1s"), (1.5, "1.5s"), (360, "6m0s"),
     (5415, "1h30m15s")],
)  # fmt: skip
def test_go_duration(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


# ---------------------------------------------------------------------------------------------
# Control endpoints, stats and rate-limit headers


async def test_schedule_then_normal(http: aiohttp.ClientSession, mock: MockUpstream) -> None:
    async with http.post("/_mock/schedule", json={"faults": ["429:2", "500", "ok", "503"]}) as r:
        assert (await r.json())["scheduled"] == ["429:2", "500", "ok", "503"]
    statuses = []
    for path, body, headers in [
        ("/v1/chat/completions", CHAT, OPENAI_AUTH),
        ("/v1/messages", MSG, ANTHROPIC_AUTH),
        ("/v1/chat/completions", CHAT, OPENAI_AUTH),
        ("/v1/embeddings", {"model": "e", "input": "x"}, OPENAI_AUTH),
        ("/v1/chat/completions", CHAT, OPENAI_AUTH),
    ]:
        async with http.post(path, json=body, headers=headers) as resp:
            statuses.append(resp.status)
            if resp.status == 429:
                assert resp.headers["Retry-After"] == "2"
    assert statuses == [429, 500, 200, 503, 200]
    assert mock.stats()["by_fault"] == {"429": 1, "500": 1, "503": 1}
    async with http.post("/_mock/schedule", json={"faults": ["nope"]}) as resp:
        assert resp.status == 400


async def test_schedule_is_not_spent_on_401(
    http: aiohttp.ClientSession, mock: MockUpstream
) -> None:
    mock.schedule("500")
    async with http.post("/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 401
    async with http.post("/v1/chat/completions", json=CHAT, headers=OPENAI_AUTH) as resp:
        assert resp.status == 500


async def test_stats_count_and_never_hold_secrets(
    http: aiohttp.ClientSession, oai: openai.AsyncOpenAI, mock: MockUpstream
) -> None:
    await oai.chat.completions.create(model="mock-gpt-4o", messages=MESSAGES)
    await oai.embeddings.create(model="e", input="x")
    async with http.post(
        "/v1/messages", json=MSG, headers={"x-api-key": WRONG, "anthropic-version": "2023-06-01"}
    ) as resp:
        assert resp.status == 401
    async with http.get("/_mock/stats") as resp:
        text = await resp.text()
    stats = json.loads(text)
    assert stats["requests"] == 3
    assert stats["by_route"] == {
        "/v1/chat/completions": 1,
        "/v1/embeddings": 1,
        "/v1/messages": 1,
    }
    assert stats["by_status"] == {"200": 2, "401": 1}
    assert stats["by_model"] == {"mock-gpt-4o": 1, "e": 1}
    assert stats["last_auth_ok"] is False
    assert stats["in_flight"] == 0
    assert SECRET not in text
    assert WRONG not in text
    async with http.get("/_mock/config") as resp:
        config_text = await resp.text()
    assert SECRET not in config_text
    assert json.loads(config_text)["secret"] == "***"


async def test_reset_endpoint(http: aiohttp.ClientSession, oai: openai.AsyncOpenAI) -> None:
    first = await oai.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    async with http.post("/_mock/schedule", json={"faults": ["500"]}):
        pass
    async with http.post("/_mock/reset") as resp:
        assert resp.status == 200
    async with http.get("/_mock/stats") as resp:
        stats = await resp.json()
    assert stats["requests"] == 0
    assert stats["scheduled"] == []
    again = await oai.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert again.status_code == 200
    name = "x-ratelimit-remaining-requests"
    assert again.headers[name] == first.headers[name]  # the rolling counters were cleared too


async def test_config_at_run_time(http: aiohttp.ClientSession, oai: openai.AsyncOpenAI) -> None:
    async with http.post("/_mock/config", json={"completion_tokens": 3, "stream_chunks": 2}) as r:
        assert r.status == 200
        assert (await r.json())["completion_tokens"] == 3
    resp = await oai.chat.completions.create(model="m", messages=MESSAGES)
    assert resp.usage is not None
    assert resp.usage.completion_tokens == 3
    for bad in (
        {"nope": 1},
        {"completion_tokens": "3"},
        {"stream_chunks": 0},
        {"latency_ms": True},
    ):
        async with http.post("/_mock/config", json=bad) as r:
            assert r.status == 400, bad


async def test_openai_rate_limit_headers(oai: openai.AsyncOpenAI) -> None:
    first = await oai.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    second = await oai.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    h1, h2 = first.headers, second.headers
    assert h1["x-ratelimit-limit-requests"] == "1500"
    assert h1["x-ratelimit-limit-tokens"] == "1000000"
    assert (
        int(h2["x-ratelimit-remaining-requests"]) == int(h1["x-ratelimit-remaining-requests"]) - 1
    )
    used = PROMPT_TOKENS + TOKENS
    assert int(h1["x-ratelimit-remaining-tokens"]) == 1_000_000 - used
    assert int(h2["x-ratelimit-remaining-tokens"]) == 1_000_000 - 2 * used
    for h in (h1, h2):
        assert GO_DURATION.match(h["x-ratelimit-reset-requests"])
        assert GO_DURATION.match(h["x-ratelimit-reset-tokens"])
        assert h["x-request-id"].startswith("req_")
    assert h1["x-ratelimit-reset-requests"] == "40ms"  # 1 of 1500 per minute refills in 40 ms
    assert "anthropic-ratelimit-requests-limit" not in h1


async def test_anthropic_rate_limit_headers(ant: anthropic.AsyncAnthropic) -> None:
    first = await ant.messages.with_raw_response.create(**MSG)
    second = await ant.messages.with_raw_response.create(**MSG)
    h1, h2 = first.headers, second.headers
    for kind in ("requests", "tokens", "input-tokens", "output-tokens"):
        for part in ("limit", "remaining"):
            assert h1[f"anthropic-ratelimit-{kind}-{part}"].isdigit()
        assert re.fullmatch(
            r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", h1[f"anthropic-ratelimit-{kind}-reset"]
        )
        name = f"anthropic-ratelimit-{kind}-remaining"
        assert int(h2[name]) < int(h1[name])
    assert h1["anthropic-ratelimit-output-tokens-limit"] == "200000"
    assert h1["anthropic-ratelimit-unified-5h-utilization"] == "0.42"
    assert h1["anthropic-ratelimit-unified-7d-utilization"] == "0.3"
    assert int(h1["anthropic-ratelimit-unified-5h-reset"]) > time.time() + 3500
    assert h1["anthropic-ratelimit-unified-status"] == "allowed"
    assert h1["x-ratelimit-remaining-requests"].isdigit()
    assert h1["request-id"].startswith("req_")


async def test_concurrency_is_counted(mock: MockUpstream, oai: openai.AsyncOpenAI) -> None:
    mock.config.update({"latency_ms": 100})
    await asyncio.gather(*(oai.models.list() for _ in range(5)))
    stats = mock.stats()
    assert stats["max_in_flight"] == 5
    assert stats["in_flight"] == 0


async def test_chunk_delay(mock: MockUpstream, oai: openai.AsyncOpenAI) -> None:
    mock.config.update({"chunk_delay_ms": 40})
    stream = await oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    start = time.monotonic()
    chunks = [c async for c in stream]
    # 1 role + 4 content + 1 finish: 5 gaps between 6 events
    assert len(chunks) == 6
    assert time.monotonic() - start >= 0.15


# ---------------------------------------------------------------------------------------------
# The blocking entry point behind `fairgate mock-upstream`


def test_run_mock_upstream_until_sigterm() -> None:
    code = (
        "from fairgate.mock.server import MockConfig, run_mock_upstream\n"
        "run_mock_upstream('127.0.0.1', 0, MockConfig(completion_tokens=2))\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            match = re.fullmatch(r"mock upstream listening on (http://127\.0\.0\.1:\d+)", line)
            assert match, line
            resp = httpx.post(match.group(1) + "/v1/chat/completions", json=CHAT, timeout=5.0)
            assert resp.json()["usage"]["completion_tokens"] == 2
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=5) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def test_echoing_mode_answers_unknown_fields_in_the_providers_words(
    http: aiohttp.ClientSession, oai: openai.AsyncOpenAI, ant: anthropic.AsyncAnthropic
) -> None:
    """``reject_unknown_fields``: the 400 repeats the field's name, as OpenAI and Anthropic do."""
    hostile = {"insufficient_quota": True}
    plain = await oai.chat.completions.create(model="m", messages=MESSAGES, extra_body=hostile)
    assert plain.choices[0].message.content  # off by default: unknown fields are ignored
    async with http.post("/_mock/config", json={"reject_unknown_fields": True}) as r:
        assert r.status == 200
    with pytest.raises(openai.BadRequestError) as oe:
        await oai.chat.completions.create(model="m", messages=MESSAGES, extra_body=hostile)
    assert oe.value.body == {
        "message": "Unrecognized request argument supplied: insufficient_quota",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    with pytest.raises(anthropic.BadRequestError) as ae:
        await ant.messages.create(
            model="claude-x",
            max_tokens=5,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"invalid_api_key": 1},
        )
    body = ae.value.body
    assert isinstance(body, dict)
    assert body["error"] == {
        "type": "invalid_request_error",
        "message": "invalid_api_key: Extra inputs are not permitted",
    }
    ok = await oai.chat.completions.create(model="m", messages=MESSAGES, temperature=0.5)
    assert ok.choices[0].message.content  # known fields still pass
    async with http.post("/_mock/config", json={"reject_unknown_fields": "yes"}) as r:
        assert r.status == 400
