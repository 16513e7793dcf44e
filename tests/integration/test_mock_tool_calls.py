"""The mock's scripted tool calls (``mock-tool NAME {args}`` lines in the last user turn), read
by the official SDKs on each wire: what lets the suite drive Claude Code's and Codex's tool
loops."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest_asyncio

from fairgate.mock.script import parse_calls
from fairgate.mock.server import MockConfig, MockUpstream

SECRET = "sk-mock-tools-secret-0123456789"
SCRIPT = 'do it\nmock-tool Bash {"command": "echo a"}\nmock-tool Bash {"command": "echo b"}'
TOOL = {
    "type": "function",
    "function": {
        "name": "Bash",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


@pytest_asyncio.fixture
async def mock() -> AsyncIterator[MockUpstream]:
    async with MockUpstream(MockConfig(secret=SECRET)) as upstream:
        yield upstream


def test_directives_are_whole_lines_with_a_json_object() -> None:
    calls = parse_calls(
        'x mock-tool A {"a": 1}\nmock-tool B {"b": 2}\nmock-tool C [1]\nmock-tool D {'
    )
    assert [(c.name, c.arguments) for c in calls] == [("B", {"b": 2})]


async def test_chat_tool_calls_then_an_answer_from_the_tool_output(mock: MockUpstream) -> None:
    async with openai.AsyncOpenAI(base_url=mock.url + "/v1", api_key=SECRET) as client:
        messages: list[Any] = [{"role": "user", "content": SCRIPT}]
        first = await client.chat.completions.create(
            model="m",
            messages=messages,
            tools=[TOOL],  # type: ignore[list-item]
        )
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls or []
        assert [json.loads(c.function.arguments) for c in calls] == [  # type: ignore[union-attr]
            {"command": "echo a"},
            {"command": "echo b"},
        ]
        # streamed: the SDK's accumulator rebuilds both calls from interleaved deltas
        async with client.chat.completions.stream(
            model="m",
            messages=messages,
            tools=[TOOL],  # type: ignore[list-item]
        ) as stream:
            final = await stream.get_final_completion()
        streamed = final.choices[0].message.tool_calls or []
        assert [c.function.arguments for c in streamed] == [  # type: ignore[union-attr]
            c.function.arguments
            for c in calls  # type: ignore[union-attr]
        ]
        messages.append(choice.message.model_dump(exclude_none=True))
        for c in calls:
            messages.append({"role": "tool", "tool_call_id": c.id, "content": "tool said hello"})
        second = await client.chat.completions.create(model="m", messages=messages, tools=[TOOL])  # type: ignore[list-item]
    assert second.choices[0].finish_reason == "stop"
    assert "tool said hello" in (second.choices[0].message.content or "")


async def test_anthropic_tool_use_blocks_stream_and_round_trip(mock: MockUpstream) -> None:
    tool = {"name": "Bash", "input_schema": TOOL["function"]["parameters"]}  # type: ignore[index]
    async with anthropic.AsyncAnthropic(base_url=mock.url, api_key=SECRET) as client:
        messages: list[Any] = [{"role": "user", "content": [{"type": "text", "text": SCRIPT}]}]
        async with client.messages.stream(
            model="m",
            max_tokens=100,
            messages=messages,
            tools=[tool],  # type: ignore[list-item]
        ) as stream:
            msg = await stream.get_final_message()
        assert msg.stop_reason == "tool_use"
        uses = [b for b in msg.content if b.type == "tool_use"]
        assert [u.input for u in uses] == [{"command": "echo a"}, {"command": "echo b"}]
        messages.append({"role": "assistant", "content": [u.model_dump() for u in uses]})
        results = [
            {"type": "tool_result", "tool_use_id": u.id, "content": "tool said hello"} for u in uses
        ]
        messages.append({"role": "user", "content": results})
        again = await client.messages.create(
            model="m",
            max_tokens=100,
            messages=messages,
            tools=[tool],  # type: ignore[list-item]
        )
    assert again.stop_reason == "end_turn"
    assert "tool said hello" in again.content[0].text  # type: ignore[union-attr]


async def test_responses_custom_and_function_calls(mock: MockUpstream) -> None:
    tools: list[Any] = [
        {"type": "custom", "name": "apply_patch"},
        {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
    ]
    script = (
        'mock-tool apply_patch {"input": "*** Begin Patch"}\nmock-tool exec_command {"cmd": "ls"}'
    )
    async with openai.AsyncOpenAI(base_url=mock.url + "/v1", api_key=SECRET) as client:
        resp = await client.responses.create(model="m", input=script, tools=tools)
        async with client.responses.stream(model="m", input=script, tools=tools) as stream:
            streamed = await stream.get_final_response()
    for out in (resp, streamed):
        kinds = [
            (i.type, getattr(i, "input", None) or getattr(i, "arguments", None)) for i in out.output
        ]
        assert kinds == [("custom_tool_call", "*** Begin Patch"), ("function_call", '{"cmd":"ls"}')]
