"""The mock answers what a request asks for as the providers do (issue 42, item 2), and the
official SDKs accept it: tool calls (parallel, interleaved by index in chat streams; Anthropic
``tool_use`` blocks; Responses ``function_call`` and ``custom_tool_call`` items), thinking with
signatures and ``redacted_thinking``, reasoning items with a summary and encrypted content,
schema JSON, usage in ``message_delta``, beta-header gating and the current field lists.

Before, the mock never answered with any of these, so nothing the gateway does with them could
fail in the suite.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
import pytest_asyncio
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from fairgate.formats.sse import SSEParser
from fairgate.mock.server import MockConfig, MockUpstream

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 2}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
CHAT_TOOL = {"type": "function", "function": {"name": "weather", "parameters": WEATHER}}
CHAT_TOOLS = [CHAT_TOOL, {"type": "function", "function": {"name": "clock", "parameters": {}}}]
AN_TOOLS: list[Any] = [
    {"name": "weather", "input_schema": WEATHER},
    {"name": "clock", "input_schema": {"type": "object", "properties": {}}},
]
USER = [{"role": "user", "content": "What is the weather?"}]
EVENTS = TypeAdapter[Any](ResponseStreamEvent)


#: the SDK clients a test made, closed when it ends
_OPEN: list[Any] = []


@pytest_asyncio.fixture
async def up() -> AsyncIterator[MockUpstream]:
    async with MockUpstream(MockConfig(reject_unknown_fields=True)) as upstream:
        try:
            yield upstream
        finally:
            while _OPEN:
                await _OPEN.pop().close()


def _oai(up: MockUpstream, fault: str | None = None) -> openai.AsyncOpenAI:
    headers = {"x-mock-fault": fault} if fault else None
    client = openai.AsyncOpenAI(
        base_url=up.url + "/v1", api_key="k", max_retries=0, default_headers=headers
    )
    _OPEN.append(client)
    return client


def _an(up: MockUpstream, fault: str | None = None) -> anthropic.AsyncAnthropic:
    headers = {"x-mock-fault": fault} if fault else None
    client = anthropic.AsyncAnthropic(
        base_url=up.url, api_key="k", max_retries=0, default_headers=headers
    )
    _OPEN.append(client)
    return client


async def test_chat_forced_tool_and_parallel_calls_interleaved_by_index(up: MockUpstream) -> None:
    forced = await _oai(up).chat.completions.create(
        model="gpt-4o",
        messages=USER,  # type: ignore[arg-type]
        tools=CHAT_TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "weather"}},
    )
    choice = forced.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "weather"  # type: ignore[union-attr]
    assert orjson.loads(call.function.arguments) == {"city": "mock", "days": 2}  # type: ignore[union-attr]
    chunks = []
    stream = await _oai(up, "tool-calls:2").chat.completions.create(
        model="gpt-4o",
        messages=USER,  # type: ignore[arg-type]
        tools=CHAT_TOOLS,  # type: ignore[arg-type]
        stream=True,
    )
    async for chunk in stream:
        chunks.append(chunk)
    order = [
        (d.index, bool(d.id))
        for c in chunks
        if c.choices
        for d in c.choices[0].delta.tool_calls or []
    ]
    # every call opens first, then their arguments alternate: start:0 start:1 args:0 args:1 …
    assert order[:4] == [(0, True), (1, True), (0, False), (1, False)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_anthropic_thinking_signatures_redacted_thinking_and_tool_use(
    up: MockUpstream,
) -> None:
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    async with _an(up, "redacted-thinking").messages.stream(
        model="claude-x",
        max_tokens=2048,
        messages=USER,
        thinking=thinking,  # type: ignore[arg-type]
    ) as stream:
        final = await stream.get_final_message()
    kinds = [b.type for b in final.content]
    assert kinds == ["thinking", "redacted_thinking", "text"]
    assert final.content[0].signature  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    calls = await _an(up, "tool-calls:2").messages.create(
        model="claude-x",
        max_tokens=100,
        messages=USER,
        tools=AN_TOOLS,  # type: ignore[arg-type]
    )
    assert [b.type for b in calls.content] == ["tool_use", "tool_use"]
    assert calls.stop_reason == "tool_use"
    async with _an(up).messages.stream(
        model="claude-x",
        max_tokens=100,
        messages=USER,  # type: ignore[arg-type]
        tools=AN_TOOLS,
        tool_choice={"type": "tool", "name": "weather"},
    ) as stream:
        forced = await stream.get_final_message()
    (use,) = forced.content
    assert use.type == "tool_use"
    assert use.input == {"city": "mock", "days": 2}


async def test_anthropic_usage_in_message_delta(up: MockUpstream) -> None:
    async with httpx.AsyncClient() as http:
        r = await http.post(
            f"{up.url}/v1/messages",
            json={"model": "c", "max_tokens": 50, "messages": USER, "stream": True},
            headers={"x-mock-fault": "usage-in-delta", "anthropic-version": "2023-06-01"},
        )
    events = [orjson.loads(e.data) for e in SSEParser().feed(r.content)]
    start = events[0]["message"]["usage"]
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    assert start["input_tokens"] == start["output_tokens"] == 0
    assert delta["usage"]["input_tokens"] > 0
    assert delta["usage"]["output_tokens"] > 0


async def test_beta_fields_need_their_flag_and_structured_output_fits_the_schema(
    up: MockUpstream,
) -> None:
    fmt = {"type": "json_schema", "schema": WEATHER}
    body = {"model": "c", "max_tokens": 50, "messages": USER, "output_format": fmt}
    base = {"anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{up.url}/v1/messages", json=body, headers=base)
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "output_format: Extra inputs are not permitted"
        beta = {**base, "anthropic-beta": "structured-outputs-2025-11-13"}
        r = await http.post(f"{up.url}/v1/messages", json=body, headers=beta)
        assert r.status_code == 200, r.text
        assert orjson.loads(r.json()["content"][0]["text"]) == {"city": "mock", "days": 2}
        ga = {k: v for k, v in body.items() if k != "output_format"}
        ga["output_config"] = {"format": fmt, "effort": "high"}  # generally available: no flag
        r = await http.post(f"{up.url}/v1/messages", json=ga, headers=base)
        assert r.status_code == 200, r.text
        assert orjson.loads(r.json()["content"][0]["text"]) == {"city": "mock", "days": 2}
        r = await http.post(
            f"{up.url}/v1/responses",
            json={"model": "gpt-5", "input": "hi", "frobnicate": 1},
            headers={"authorization": "Bearer k"},
        )
        assert r.status_code == 400
        assert "frobnicate" in r.json()["error"]["message"]


async def test_responses_reasoning_items_and_custom_tool_calls(up: MockUpstream) -> None:
    tools: Any = [
        {"type": "function", "name": "shell", "parameters": {"type": "object"}},
        {"type": "custom", "name": "apply_patch"},
    ]
    client = _oai(up, "tool-calls:2")
    events = []
    stream = await client.responses.create(
        model="gpt-5-codex",
        input="fix it",
        tools=tools,
        reasoning={"effort": "medium", "summary": "auto"},
        include=["reasoning.encrypted_content"],
        stream=True,
    )
    async for event in stream:
        events.append(event)
    for event in events:  # every event is one the SDK knows, in its documented shape
        EVENTS.validate_python(event.model_dump(by_alias=True, exclude_unset=True))
    kinds = [e.type for e in events]
    assert "response.reasoning_summary_text.delta" in kinds
    assert "response.custom_tool_call_input.delta" in kinds
    final = events[-1].response  # type: ignore[union-attr]
    assert [i.type for i in final.output] == ["reasoning", "function_call", "custom_tool_call"]
    assert final.output[0].encrypted_content  # type: ignore[union-attr]
    assert final.output[0].summary[0].text  # type: ignore[union-attr]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    plain = await _oai(up).responses.create(model="gpt-5", input="hi", reasoning={"effort": "low"})
    assert [i.type for i in plain.output] == ["reasoning", "message"]
    assert plain.output[0].encrypted_content is None  # type: ignore[union-attr]
    assert plain.usage is not None
    assert plain.usage.output_tokens_details.reasoning_tokens > 0


@pytest.mark.parametrize("wire", ["chat", "responses"])
async def test_json_that_fits_a_requested_schema(up: MockUpstream, wire: str) -> None:
    schema = {"name": "weather", "schema": WEATHER, "strict": True}
    if wire == "chat":
        done = await _oai(up).chat.completions.create(
            model="gpt-4o",
            messages=USER,  # type: ignore[arg-type]
            response_format={"type": "json_schema", "json_schema": schema},  # type: ignore[typeddict-item]
        )
        text = done.choices[0].message.content or ""
    else:
        resp = await _oai(up).responses.create(
            model="gpt-5", input="hi", text={"format": {"type": "json_schema", **schema}}
        )
        text = resp.output_text
    assert orjson.loads(text) == {"city": "mock", "days": 2}
