"""OpenAI ↔ Anthropic translation, checked against the official SDKs' own models."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.message_create_params import (
    MessageCreateParamsNonStreaming,
    MessageCreateParamsStreaming,
)
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from pydantic import TypeAdapter
from wire_support import chat_usage, tool_call

from fairgate.formats.responses_upstream import chat_to_responses_request
from fairgate.formats.sse import SSEParser, encode_event
from fairgate.formats.translate import (
    AnthropicToOpenAIStream,
    CannotCarry,
    OpenAIToAnthropicStream,
    anthropic_to_openai_request,
    anthropic_to_openai_response,
    openai_to_anthropic_request,
    openai_to_anthropic_response,
)
from fairgate.formats.usage import Usage

EVENT = TypeAdapter[Any](RawMessageStreamEvent)
AN_REQ = TypeAdapter[Any](MessageCreateParamsNonStreaming)
AN_REQ_STREAM = TypeAdapter[Any](MessageCreateParamsStreaming)
OA_REQ = TypeAdapter[Any](CompletionCreateParamsNonStreaming)
OA_REQ_STREAM = TypeAdapter[Any](CompletionCreateParamsStreaming)

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def materialize(value: Any) -> Any:
    """Pydantic validates ``Iterable`` fields lazily: walk everything to force validation."""
    if isinstance(value, dict):
        return {k: materialize(v) for k, v in value.items()}
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        return value
    if hasattr(value, "__iter__"):
        return [materialize(v) for v in value]
    return value


def known_keys(params: Any) -> set[str]:
    return set(params.__required_keys__) | set(params.__optional_keys__)


def valid_anthropic_request(body: dict[str, Any]) -> dict[str, Any]:
    adapter = AN_REQ_STREAM if body.get("stream") else AN_REQ
    # no stray top-level field; the 2.x SDK dropped the sampling parameters (API version
    # 2026-10-21 rejects them) but the 2023-06-01 version the gateway sends still takes them
    sampling = {"temperature", "top_p", "top_k"}
    assert set(body) <= known_keys(MessageCreateParamsNonStreaming) | sampling
    out: dict[str, Any] = materialize(adapter.validate_python(body))
    return out


def valid_openai_request(body: dict[str, Any]) -> dict[str, Any]:
    adapter = OA_REQ_STREAM if body.get("stream") else OA_REQ
    assert set(body) <= known_keys(CompletionCreateParamsStreaming)
    out: dict[str, Any] = materialize(adapter.validate_python(body))
    return out


# -- requests -------------------------------------------------------------------------------------


def user_text_and_png(text: str) -> dict[str, Any]:
    """A Chat Completions user message of ``text`` and the test image (``PNG``) as a data URL."""
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    return {"role": "user", "content": [{"type": "text", "text": text}, image]}


def assistant_calling(text: str, *calls: dict[str, Any]) -> dict[str, Any]:
    """A Chat Completions assistant message of ``text`` that calls tools."""
    return {"role": "assistant", "content": text, "tool_calls": list(calls)}


OPENAI_CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    user_text_and_png("What is in this image, and the weather in Paris?"),
    assistant_calling(
        "Let me check.",
        tool_call("call_1", '{"city":"Paris"}'),
        tool_call("call_2", '{"city":"Lyon"}'),
    ),
    {"role": "tool", "tool_call_id": "call_1", "content": "18C sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "20C cloudy"},
    {"role": "assistant", "content": "A pixel. Paris: 18C, Lyon: 20C."},
    {"role": "user", "content": "Thanks!"},
]


def test_openai_to_anthropic_request_full() -> None:
    body = {
        "model": "claude",
        "messages": OPENAI_CONVERSATION,
        "max_completion_tokens": 300,
        "max_tokens": 100,
        "temperature": 1.5,
        "top_p": 0.9,
        "stop": "END",
        "n": 3,
        "logprobs": True,
        "tools": [WEATHER_TOOL, {"type": "custom", "custom": {"name": "x"}}],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "user": "user-42",
    }
    out = openai_to_anthropic_request(body, "claude-sonnet-4-20250514")
    valid_anthropic_request(out)
    assert out["model"] == "claude-sonnet-4-20250514"
    assert out["max_tokens"] == 300  # max_completion_tokens wins
    assert out["temperature"] == 1.0  # clamped to Anthropic's range
    assert "top_p" not in out  # never together with temperature
    assert out["stop_sequences"] == ["END"]
    assert out["system"] == "You are terse."
    assert out["metadata"] == {"user_id": "user-42"}
    assert out["tools"] == [
        {
            "name": "get_weather",
            "description": "Weather for a city",
            "input_schema": WEATHER_TOOL["function"]["parameters"],  # type: ignore[index]
        }
    ]
    assert out["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    for dropped in ("n", "logprobs", "response_format", "user", "max_completion_tokens"):
        assert dropped not in out
    msgs = out["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[0]["content"][1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
    }
    assert msgs[1]["content"] == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {"city": "Lyon"}},
    ]
    # consecutive tool messages merge into one user turn of tool_result blocks
    assert msgs[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "18C sunny"},
        {"type": "tool_result", "tool_use_id": "call_2", "content": "20C cloudy"},
    ]
    assert msgs[4]["content"] == "Thanks!"


def test_openai_to_anthropic_request_defaults_and_merging() -> None:
    body = {
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Rule one."}]},
            {"role": "system", "content": "Rule two."},
            {"role": "user", "content": "a"},
            {"role": "user", "content": [{"type": "text", "text": "b"}]},
            {"role": "user", "content": ""},  # empty: dropped
            {"role": "function", "name": "f", "content": "legacy"},  # unsupported: dropped
            {"role": "assistant", "content": "The answer is "},  # prefill
        ],
        "stop": ["  ", "STOP", 3],
        "stream": True,
        "metadata": {"user": "u1"},
    }
    out = openai_to_anthropic_request(body, "m", default_max_tokens=777)
    valid_anthropic_request(out)
    assert out["max_tokens"] == 777
    assert out["system"] == "Rule one.\n\nRule two."
    assert out["stream"] is True
    assert out["stop_sequences"] == ["STOP"]
    assert out["metadata"] == {"user_id": "u1"}
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "The answer is"},  # trailing whitespace removed
    ]
    assert "tools" not in out
    assert "tool_choice" not in out


def test_openai_to_anthropic_request_parts_and_cache_control() -> None:
    body = {
        "messages": [
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "Big doc", "cache_control": {"type": "ephemeral"}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                    {"type": "image_url", "image_url": {"url": "ftp://nope"}},
                    {"type": "file", "file": {"file_data": f"data:application/pdf;base64,{PNG}"}},
                    {"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}},
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": [{"type": "text", "text": "done"}]},
            {"role": "user", "content": "next"},
        ],
        "max_tokens": 50,
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    out = openai_to_anthropic_request(body, "m")
    valid_anthropic_request(out)
    assert out["system"] == [
        {"type": "text", "text": "Big doc", "cache_control": {"type": "ephemeral"}}
    ]
    assert out["tool_choice"] == {"type": "tool", "name": "get_weather"}
    content = out["messages"][0]["content"]
    # the tool result comes first in the merged user turn, as Anthropic requires
    assert [b["type"] for b in content] == ["tool_result", "image", "document", "text"]
    assert content[0]["content"] == [{"type": "text", "text": "done"}]
    assert content[1]["source"] == {"type": "url", "url": "https://example.com/cat.png"}


def test_sampling_parameters() -> None:
    base = {"messages": [{"role": "user", "content": "hi"}]}
    assert openai_to_anthropic_request({**base, "top_p": 0.8}, "m")["top_p"] == 0.8
    assert openai_to_anthropic_request({**base, "temperature": 0}, "m")["temperature"] == 0.0
    both = openai_to_anthropic_request({**base, "temperature": 0.2, "top_p": 0.8, "top_k": 5}, "m")
    assert (both["temperature"], "top_p" in both, "top_k" in both) == (0.2, False, False)
    off = openai_to_anthropic_request(
        {**base, "temperature": 0.2, "top_p": 0.8}, "m", sampling=False
    )
    assert "temperature" not in off
    assert "top_p" not in off
    thinking = {"type": "enabled", "budget_tokens": 1024}
    think = openai_to_anthropic_request({**base, "temperature": 0.2, "thinking": thinking}, "m")
    valid_anthropic_request(think)
    assert think["thinking"] == thinking
    assert "temperature" not in think


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        (None, None),
    ],
)
def test_tool_choice_mapping(choice: Any, expected: dict[str, Any] | None) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER_TOOL]}
    if choice is not None:
        body["tool_choice"] = choice
    out = openai_to_anthropic_request(body, "m")
    valid_anthropic_request(out)
    assert out.get("tool_choice") == expected


def test_bad_tool_arguments_become_an_object() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "a",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"trunc'},
                    },
                    {
                        "id": "b",
                        "type": "function",
                        "function": {"name": "f", "arguments": "[1, 2]"},
                    },
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}},
                ],
            },
        ]
    }
    out = openai_to_anthropic_request(body, "m")
    valid_anthropic_request(out)
    inputs = [b["input"] for b in out["messages"][1]["content"]]
    assert inputs == [{}, {"value": [1, 2]}, {}]


def test_odd_openai_bodies_do_not_raise() -> None:
    for body in ({}, {"messages": None}, {"messages": [None, 1, {"role": "user"}]}):
        out = openai_to_anthropic_request(body, "m")
        assert out["messages"] == []
        assert out["max_tokens"] == 1024


ANTHROPIC_BODY: dict[str, Any] = {
    "model": "claude-sonnet-4",
    "max_tokens": 512,
    "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather in Paris? And this:"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "need the tool", "signature": "sig"},
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "18C"}],
                },
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ],
    "stop_sequences": ["END"],
    "temperature": 0.3,
    "top_k": 40,
    "stream": True,
    "tools": [
        {
            "name": "get_weather",
            "description": "Weather for a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
    ],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "metadata": {"user_id": "u-7"},
}


def test_anthropic_to_openai_request_full() -> None:
    valid_anthropic_request(ANTHROPIC_BODY)
    out = anthropic_to_openai_request(ANTHROPIC_BODY, "gpt-4o")
    valid_openai_request(out)
    assert out["model"] == "gpt-4o"
    assert out["max_tokens"] == 512
    assert out["stop"] == ["END"]
    assert out["temperature"] == 0.3
    assert "top_k" not in out
    assert out["stream"] is True
    assert out["stream_options"] == {"include_usage": True}
    assert out["user"] == "u-7"
    assert out["tool_choice"] == "auto"
    assert out["parallel_tool_calls"] is False
    assert [t["function"]["name"] for t in out["tools"]] == ["get_weather"]  # server tool dropped
    assert out["messages"] == [
        {"role": "system", "content": "Be brief.\n\nBe kind."},
        user_text_and_png("Weather in Paris? And this:"),
        assistant_calling("Checking.", tool_call("toolu_1", '{"city":"Paris"}')),
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "user", "content": "And tomorrow?"},
    ]


def test_anthropic_to_openai_request_reasoning_models_get_max_completion_tokens() -> None:
    body = {"max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    for model in ("o3-mini", "openai/gpt-5", "o4-mini-2025-04-16"):
        out = anthropic_to_openai_request(body, model)
        valid_openai_request(out)
        assert out["max_completion_tokens"] == 100
        assert "max_tokens" not in out
    out = anthropic_to_openai_request(body, "deepseek-chat")
    assert out["max_tokens"] == 100


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        (
            {"type": "tool", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
        ),
    ],
)
def test_anthropic_tool_choice_mapping(choice: dict[str, Any], expected: Any) -> None:
    body = {**ANTHROPIC_BODY, "tool_choice": choice, "stream": False}
    out = anthropic_to_openai_request(body, "gpt-4o")
    valid_openai_request(out)
    assert out["tool_choice"] == expected
    assert "stream" not in out


def test_round_trip_openai_anthropic_openai_keeps_messages() -> None:
    body = {"messages": OPENAI_CONVERSATION, "max_tokens": 200, "stop": ["X"], "temperature": 0.5}
    anthropic = openai_to_anthropic_request(body, "claude")
    back = anthropic_to_openai_request(anthropic, "gpt")
    valid_openai_request(back)
    assert back["messages"] == OPENAI_CONVERSATION
    assert back["max_tokens"] == 200
    assert back["stop"] == ["X"]
    assert back["temperature"] == 0.5


def test_round_trip_anthropic_openai_anthropic_keeps_messages() -> None:
    body = {
        **ANTHROPIC_BODY,
        "system": "Be brief.",
        "stream": False,
        "tool_choice": {"type": "auto"},
    }
    messages = [
        {**m, "content": [b for b in m["content"] if b["type"] != "thinking"]}
        for m in body["messages"]
    ]
    body["messages"] = messages
    back = openai_to_anthropic_request(anthropic_to_openai_request(body, "gpt"), "claude")
    valid_anthropic_request(back)
    assert back["system"] == "Be brief."
    assert back["max_tokens"] == 512
    assert back["tool_choice"] == {"type": "auto"}
    assert back["messages"] == [
        messages[0],
        messages[1],
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]


# -- answers --------------------------------------------------------------------------------------

ANTHROPIC_MESSAGE: dict[str, Any] = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-20250514",
    "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "s"},
        {"type": "text", "text": "Hello "},
        {"type": "text", "text": "there."},
        {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"city": "Oslo"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 10,
        "cache_read_input_tokens": 90,
        "cache_creation_input_tokens": 0,
        "output_tokens": 25,
    },
}


def test_anthropic_to_openai_response() -> None:
    Message.model_validate(ANTHROPIC_MESSAGE)
    out = anthropic_to_openai_response(ANTHROPIC_MESSAGE, "my-model", created=123)
    completion = ChatCompletion.model_validate(out)
    assert completion.model == "my-model"
    assert completion.created == 123
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Hello there."
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.id == "toolu_9"
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert orjson.loads(call.function.arguments) == {"city": "Oslo"}
    assert out["choices"][0]["message"]["reasoning_content"] == "hmm"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 100
    assert completion.usage.completion_tokens == 25
    assert completion.usage.total_tokens == 125
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 90


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "stop"),
        (None, "stop"),
        ("something_new", "stop"),
    ],
)
def test_stop_reason_mapping(stop: str | None, finish: str) -> None:
    resp = {**ANTHROPIC_MESSAGE, "content": [{"type": "text", "text": "x"}], "stop_reason": stop}
    out = anthropic_to_openai_response(resp, "m", created=1)
    assert ChatCompletion.model_validate(out).choices[0].finish_reason == finish


def test_anthropic_to_openai_response_tool_only_has_null_content() -> None:
    resp = {**ANTHROPIC_MESSAGE, "content": [ANTHROPIC_MESSAGE["content"][3]]}
    out = anthropic_to_openai_response(resp, "m", created=1)
    assert ChatCompletion.model_validate(out).choices[0].message.content is None
    empty = anthropic_to_openai_response({"content": []}, "m", created=1)
    assert ChatCompletion.model_validate(empty).choices[0].message.content == ""


OPENAI_COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "gpt-4o-2024-08-06",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Sure.",
                "refusal": None,
                "tool_calls": [tool_call("call_a", '{"city":"Rome"}')],
            },
            "finish_reason": "tool_calls",
            "logprobs": None,
        }
    ],
    "usage": chat_usage(120, 30, cached=100, reasoning=0),
}


def test_openai_to_anthropic_response() -> None:
    ChatCompletion.model_validate(OPENAI_COMPLETION)
    out = openai_to_anthropic_response(OPENAI_COMPLETION, "claude-alias")
    msg = Message.model_validate(out)
    assert msg.model == "claude-alias"
    assert msg.stop_reason == "tool_use"
    assert [b.type for b in msg.content] == ["text", "tool_use"]
    assert out["content"][1] == {
        "type": "tool_use",
        "id": "call_a",
        "name": "get_weather",
        "input": {"city": "Rome"},
    }
    assert msg.usage.input_tokens == 20
    assert msg.usage.cache_read_input_tokens == 100
    assert msg.usage.output_tokens == 30


@pytest.mark.parametrize(
    ("finish", "stop"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("function_call", "tool_use"),
        ("content_filter", "refusal"),
        (None, "end_turn"),
    ],
)
def test_finish_reason_mapping(finish: str | None, stop: str) -> None:
    choice = {**OPENAI_COMPLETION["choices"][0], "finish_reason": finish}
    resp = {**OPENAI_COMPLETION, "choices": [choice]}
    assert Message.model_validate(openai_to_anthropic_response(resp, "m")).stop_reason == stop


def test_openai_to_anthropic_response_odd_inputs() -> None:
    msg = Message.model_validate(openai_to_anthropic_response({}, "m"))
    assert msg.content == []
    assert msg.usage.input_tokens == 0
    reasoning = {
        "choices": [
            {"message": {"content": "4", "reasoning_content": "2+2"}, "finish_reason": "stop"}
        ]
    }
    msg = Message.model_validate(openai_to_anthropic_response(reasoning, "m"))
    assert [b.type for b in msg.content] == ["thinking", "text"]


def test_response_usage_round_trip() -> None:
    there = openai_to_anthropic_response(OPENAI_COMPLETION, "m")
    back = anthropic_to_openai_response(there, "m", created=1)
    assert back["usage"]["prompt_tokens"] == 120
    assert back["usage"]["prompt_tokens_details"]["cached_tokens"] == 100
    assert back["choices"][0]["finish_reason"] == "tool_calls"


# -- streams: Anthropic → OpenAI ------------------------------------------------------------------

TEXT_PIECES = ["Hel", "lo, ", "wor", "ld! ", "✓"]
ARG_PIECES = ['{"ci', 'ty": ', '"Par', 'is"}']


def block_start(index: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """An Anthropic stream's ``content_block_start`` event (name and data) for ``block``."""
    return "content_block_start", {
        "type": "content_block_start",
        "index": index,
        "content_block": block,
    }


def block_delta(index: int, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """An Anthropic stream's ``content_block_delta`` event (name and data) for ``delta``."""
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}


def block_stop(index: int) -> tuple[str, dict[str, Any]]:
    """An Anthropic stream's ``content_block_stop`` event (name and data)."""
    return "content_block_stop", {"type": "content_block_stop", "index": index}


def anthropic_events(stop_reason: str = "tool_use") -> list[tuple[str, dict[str, Any]]]:
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-4-20250514",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": 40,
                        "cache_read_input_tokens": 60,
                        "cache_creation_input_tokens": 0,
                        "output_tokens": 1,
                    },
                },
            },
        ),
        ("ping", {"type": "ping"}),
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        block_delta(0, {"type": "thinking_delta", "thinking": "Let me think."}),
        block_delta(0, {"type": "signature_delta", "signature": "abc"}),
        block_stop(0),
        block_start(1, {"type": "text", "text": ""}),
        *(block_delta(1, {"type": "text_delta", "text": t}) for t in TEXT_PIECES),
        block_stop(1),
        block_start(2, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}),
        block_delta(2, {"type": "input_json_delta", "partial_json": ""}),
        *(block_delta(2, {"type": "input_json_delta", "partial_json": p}) for p in ARG_PIECES),
    ]
    events += [
        block_stop(2),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": 57},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    for _, data in events:
        if data["type"] != "ping":
            EVENT.validate_python(data)
    return events


def run_anthropic_to_openai(
    include_usage: bool, events: list[tuple[str, dict[str, Any]]]
) -> tuple[AnthropicToOpenAIStream, list[dict[str, Any]]]:
    tr = AnthropicToOpenAIStream("gpt-alias", include_usage, 1_700_000_000, "chatcmpl-xyz")
    chunks: list[dict[str, Any]] = []
    for name, data in events:
        chunks.extend(tr.feed(name, data))
    return tr, chunks


def test_anthropic_stream_to_openai_chunks() -> None:
    tr, chunks = run_anthropic_to_openai(True, anthropic_events())
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert all(c.id == "chatcmpl-xyz" and c.model == "gpt-alias" for c in parsed)
    assert parsed[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in parsed if c.choices)
    assert text == "".join(TEXT_PIECES)
    reasoning = "".join(
        c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks if c["choices"]
    )
    assert reasoning == "Let me think."
    calls = [tc for c in parsed if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert calls[0].id == "toolu_1"
    assert calls[0].function is not None
    assert calls[0].function.name == "get_weather"
    assert all(tc.index == 0 for tc in calls)
    args = "".join((tc.function.arguments or "") for tc in calls if tc.function)
    assert orjson.loads(args) == {"city": "Paris"}
    finish = [
        c.choices[0].finish_reason for c in parsed if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["tool_calls"]
    last = parsed[-1]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (
        100,
        57,
        157,
    )
    assert tr.usage == Usage(100, 57, 60)
    assert tr.done

    # the SDK's own accumulator rebuilds a valid completion from our chunks
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for c in parsed:
        list(state.handle_chunk(c))
    final = state.get_final_completion()
    assert final.choices[0].message.content == "".join(TEXT_PIECES)
    assert final.choices[0].finish_reason == "tool_calls"


def test_anthropic_stream_without_usage_chunk() -> None:
    tr, chunks = run_anthropic_to_openai(False, anthropic_events("end_turn"))
    assert all(c["choices"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert tr.usage.completion_tokens == 57


def test_anthropic_stream_through_sse_in_random_chunks() -> None:
    raw = b"".join(encode_event(orjson.dumps(d), n) for n, d in anthropic_events("max_tokens"))
    rng = random.Random(7)
    parser = SSEParser()
    tr = AnthropicToOpenAIStream("m", True, 1, "id")
    out: list[bytes] = []
    pos = 0
    while pos < len(raw):
        step = rng.randint(1, 40)
        for ev in parser.feed(raw[pos : pos + step]):
            out.extend(
                encode_event(orjson.dumps(c)) for c in tr.feed(ev.event, orjson.loads(ev.data))
            )
        pos += step
    # what a client receives parses back into valid chunks
    client = SSEParser()
    received = [ChatCompletionChunk.model_validate_json(e.data) for e in client.feed(b"".join(out))]
    text = "".join(c.choices[0].delta.content or "" for c in received if c.choices)
    assert text == "".join(TEXT_PIECES)
    assert [c.choices[0].finish_reason for c in received if c.choices][-1] == "length"


def test_anthropic_stream_error_and_cut_stream() -> None:
    tr = AnthropicToOpenAIStream("m", True, 1, "id")
    events = anthropic_events()
    for name, data in events[:8]:
        tr.feed(name, data)
    out = tr.feed(
        "error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    )
    assert out == [{"error": {"message": "Overloaded", "type": "overloaded_error", "code": None}}]
    assert tr.done
    assert tr.feed(*events[8]) == []
    assert tr.finish() == []

    cut = AnthropicToOpenAIStream("m", True, 1, "id")
    for name, data in events[:8]:
        cut.feed(name, data)
    closing = cut.finish()
    assert [ChatCompletionChunk.model_validate(c).choices for c in closing][1] == []
    assert closing[0]["choices"][0]["finish_reason"] == "stop"
    assert cut.finish() == []


def test_anthropic_stream_uses_cumulative_message_delta_usage() -> None:
    events = anthropic_events()
    name, delta = events[-2]
    delta = {
        **delta,
        "usage": {"output_tokens": 57, "input_tokens": 45, "cache_read_input_tokens": 60},
    }
    tr, _ = run_anthropic_to_openai(True, [*events[:-2], (name, delta), events[-1]])
    assert tr.usage == Usage(105, 57, 60)


# -- streams: OpenAI → Anthropic ------------------------------------------------------------------


def oa_chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "gpt-4o",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": None}],
        **extra,
    }
    ChatCompletionChunk.model_validate(chunk)
    return chunk


USAGE_CHUNK: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1_700_000_000,
    "model": "gpt-4o",
    "choices": [],
    "usage": {
        "prompt_tokens": 80,
        "completion_tokens": 33,
        "total_tokens": 113,
        "prompt_tokens_details": {"cached_tokens": 64},
    },
}


def openai_chunks() -> list[dict[str, Any]]:
    chunks = [oa_chunk({"role": "assistant", "content": "", "refusal": None})]
    chunks += [oa_chunk({"content": t}) for t in TEXT_PIECES]
    chunks.append(
        oa_chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        )
    )
    chunks += [
        oa_chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in ARG_PIECES
    ]
    chunks.append(
        oa_chunk(
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": "{}"},
                    }
                ]
            }
        )
    )
    chunks.append(oa_chunk({}, "tool_calls"))
    ChatCompletionChunk.model_validate(USAGE_CHUNK)
    return chunks


def check_anthropic_sequence(events: list[tuple[str, dict[str, Any]]]) -> Message:
    """Every event validates, names match types, order is legal; returns the SDK-rebuilt message."""
    for name, data in events:
        assert name == data["type"]
    parsed = [EVENT.validate_python(d) for _, d in events]
    types = [e.type for e in parsed]
    assert types[0] == "message_start"
    assert types[-2:] == ["message_delta", "message_stop"]
    assert (
        types.count("message_start")
        == types.count("message_delta")
        == types.count("message_stop")
        == 1
    )
    open_block: int | None = None
    seen: list[int] = []
    for e in parsed:
        if e.type == "content_block_start":
            assert open_block is None
            open_block = e.index
            seen.append(e.index)
        elif e.type == "content_block_delta":
            assert e.index == open_block
        elif e.type == "content_block_stop":
            assert e.index == open_block
            open_block = None
        elif e.type in ("message_delta", "message_stop"):
            assert open_block is None
    assert seen == list(range(len(seen)))
    snapshot: Any = None
    bufs: dict[int, bytes] = {}
    for e in parsed:
        snapshot = accumulate_event(event=e, current_snapshot=snapshot, json_bufs=bufs)
    return Message.model_validate(snapshot.model_dump())


def test_openai_stream_to_anthropic_events() -> None:
    tr = OpenAIToAnthropicStream("claude-alias", "msg_abc", input_tokens=12)
    events: list[tuple[str, dict[str, Any]]] = []
    for chunk in openai_chunks():
        events.extend(tr.feed(chunk))
    # the finish chunk closed the block but message_delta waits for the usage chunk
    assert [n for n, _ in events][-1] == "content_block_stop"
    open_before_usage = not tr.done
    assert open_before_usage
    closing = tr.feed(USAGE_CHUNK)
    assert [n for n, _ in closing] == ["message_delta", "message_stop"]
    assert closing[0][1]["usage"] == {
        "input_tokens": 16,
        "output_tokens": 33,
        "cache_read_input_tokens": 64,
    }
    assert closing[0][1]["delta"]["stop_reason"] == "tool_use"
    events.extend(closing)
    assert tr.finish() == []  # exactly once
    assert tr.feed(USAGE_CHUNK) == []
    assert tr.done
    assert tr.usage == Usage(80, 33, 64)
    assert events[0][1]["message"]["usage"]["input_tokens"] == 12

    msg = check_anthropic_sequence(events)
    assert msg.id == "msg_abc"
    assert msg.model == "claude-alias"
    assert msg.stop_reason == "tool_use"
    assert msg.usage.output_tokens == 33
    assert msg.usage.input_tokens == 16
    text = "".join(b.text for b in msg.content if b.type == "text")
    assert text == "".join(TEXT_PIECES)
    tools = [b for b in msg.content if b.type == "tool_use"]
    assert [(t.id, t.name, t.input) for t in tools] == [
        ("call_1", "get_weather", {"city": "Paris"}),
        ("call_2", "get_time", {}),
    ]


def _call(index: int, *, id_: str | None = None, name: str | None = None, args: str = "") -> Any:
    fn: dict[str, Any] = {"arguments": args}
    if name is not None:
        fn["name"] = name
    call: dict[str, Any] = {"index": index, "function": fn}
    if id_ is not None:
        call.update(id=id_, type="function")
    return call


@pytest.mark.parametrize(
    "order",
    [
        # start:0 start:1 args:0 args:1 (issue 42: the first call reached Claude Code as {})
        [(0, "start"), (1, "start"), (0, "a"), (1, "a"), (0, "b"), (1, "b")],
        [(0, "start"), (0, "a"), (1, "start"), (1, "a"), (0, "b"), (1, "b"), (2, "start")],
        [(0, "start"), (0, "a"), (0, "b"), (1, "start"), (1, "a"), (1, "b")],  # in order
    ],
    ids=["interleaved", "revisited", "sequential"],
)
def test_parallel_tool_calls_land_whole_in_their_own_blocks(order: list[tuple[int, str]]) -> None:
    args = {0: ('{"cmd": ', '"ls"}'), 1: ('{"path": ', '"/tmp"}'), 2: ("", "")}
    tr = OpenAIToAnthropicStream("m", "msg_1")
    events: list[tuple[str, dict[str, Any]]] = []
    events += tr.feed(oa_chunk({"role": "assistant", "content": "Running both."}))
    for index, what in order:
        if what == "start":
            call = _call(index, id_=f"call_{index}", name=f"tool_{index}")
        else:
            call = _call(index, args=args[index][0 if what == "a" else 1])
        events += tr.feed(oa_chunk({"tool_calls": [call]}))
    events += tr.feed(oa_chunk({}, "tool_calls"))
    events += tr.finish()
    msg = check_anthropic_sequence(events)  # every delta inside its own block
    tools = {b.id: b for b in msg.content if b.type == "tool_use"}
    assert tools["call_0"].input == {"cmd": "ls"}
    assert tools["call_1"].input == {"path": "/tmp"}
    assert msg.content[0].type == "text"
    assert msg.stop_reason == "tool_use"


def test_openai_stream_without_usage_chunk_closes_on_finish() -> None:
    tr = OpenAIToAnthropicStream("m", "msg_1")
    events: list[tuple[str, dict[str, Any]]] = []
    for chunk in [
        oa_chunk({"role": "assistant"}),
        oa_chunk({"content": "hi"}),
        oa_chunk({}, "length"),
    ]:
        events.extend(tr.feed(chunk))
    assert not tr.done
    closing = tr.finish()
    events.extend(closing)
    assert closing[0][1]["delta"]["stop_reason"] == "max_tokens"
    assert closing[0][1]["usage"] == {"output_tokens": 0}
    assert tr.finish() == []
    msg = check_anthropic_sequence(events)
    assert msg.content[0].type == "text"


def test_openai_stream_usage_in_the_finish_chunk() -> None:
    tr = OpenAIToAnthropicStream("m", "msg_1")
    events: list[tuple[str, dict[str, Any]]] = []
    events += tr.feed(oa_chunk({"content": "x"}))
    events += tr.feed(oa_chunk({}, "stop", usage=USAGE_CHUNK["usage"]))
    events += tr.finish()
    msg = check_anthropic_sequence(events)
    assert msg.usage.output_tokens == 33
    assert msg.stop_reason == "end_turn"


def test_openai_stream_cut_mid_text() -> None:
    tr = OpenAIToAnthropicStream("m", "msg_1")
    events = tr.feed(oa_chunk({"content": "partial"}))
    events += tr.finish()
    msg = check_anthropic_sequence(events)
    assert msg.stop_reason == "end_turn"


def test_openai_stream_empty() -> None:
    tr = OpenAIToAnthropicStream("m", "msg_1")
    msg = check_anthropic_sequence(tr.finish())
    assert msg.content == []


def test_openai_stream_reasoning_then_text() -> None:
    tr = OpenAIToAnthropicStream("m", "msg_1")
    events = tr.feed(oa_chunk({"reasoning_content": "think"}))
    events += tr.feed(oa_chunk({"reasoning_content": "ing"}))
    events += tr.feed(oa_chunk({"content": "answer"}))
    events += tr.feed(oa_chunk({}, "stop"))
    events += tr.finish()
    msg = check_anthropic_sequence(events)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].type == "thinking"
    assert msg.content[0].thinking == "thinking"


def test_openai_stream_tool_calls_without_index_or_id() -> None:
    tr = OpenAIToAnthropicStream("m", "msg_1")
    # some OpenAI-compatible upstreams send each whole call at index 0 with its own id
    events = tr.feed(
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}]
                    }
                }
            ]
        }
    )
    events += tr.feed(
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {"id": "b", "function": {"name": "g", "arguments": '{"x":1}'}}
                        ]
                    }
                }
            ]
        }
    )
    events += tr.feed({"choices": [{"delta": {"tool_calls": [{"function": {"name": "h"}}]}}]})
    events += tr.feed(oa_chunk({}, "tool_calls"))
    events += tr.finish()
    msg = check_anthropic_sequence(events)
    tools = [(b.id, b.name, b.input) for b in msg.content if b.type == "tool_use"]
    assert tools == [("a", "f", {}), ("b", "g", {"x": 1})]


def test_openai_stream_error_chunk() -> None:
    tr = OpenAIToAnthropicStream("m", "msg_1")
    tr.feed(oa_chunk({"content": "x"}))
    out = tr.feed({"error": {"message": "boom", "type": "server_error"}})
    assert out == [
        ("error", {"type": "error", "error": {"type": "server_error", "message": "boom"}})
    ]
    assert tr.done
    assert tr.finish() == []


def test_openai_stream_through_sse() -> None:
    raw = b"".join(encode_event(orjson.dumps(c)) for c in [*openai_chunks(), USAGE_CHUNK])
    raw += b"data: [DONE]\n\n"
    tr = OpenAIToAnthropicStream("m", "msg_1")
    out: list[bytes] = []
    parser = SSEParser()
    for i in range(0, len(raw), 13):
        for ev in parser.feed(raw[i : i + 13]):
            pairs = tr.finish() if ev.data == "[DONE]" else tr.feed(orjson.loads(ev.data))
            out.extend(encode_event(orjson.dumps(d), n) for n, d in pairs)
    received = [(e.event or "", orjson.loads(e.data)) for e in SSEParser().feed(b"".join(out))]
    msg = check_anthropic_sequence(received)
    assert "".join(b.text for b in msg.content if b.type == "text") == "".join(TEXT_PIECES)


# -- structured output across wires (issue 42, item 3) --------------------------------------------

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_a_json_schema_becomes_anthropics_output_config_format_and_back() -> None:
    """Before, ``response_format`` was dropped on the way to Anthropic: the client's parser got
    free text. Now it is Anthropic's structured output (``output_config.format``), and an
    Anthropic client's format reaches an OpenAI upstream as ``response_format``."""
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": rf}
    out = openai_to_anthropic_request(body, "claude")
    valid_anthropic_request(out)
    assert out["output_config"] == {"format": {"type": "json_schema", "schema": PERSON}}
    back = anthropic_to_openai_request({**out, "max_tokens": 5}, "gpt-4o")
    assert back["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": PERSON, "strict": True},
    }
    beta = {"model": "claude", "max_tokens": 5, "messages": out["messages"]}
    beta["output_format"] = {"type": "json_schema", "schema": PERSON}
    assert anthropic_to_openai_request(beta, "gpt-4o")["response_format"] == back["response_format"]


def test_a_json_mode_anthropic_cannot_express_is_refused_by_name() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(CannotCarry) as exc:
        openai_to_anthropic_request({**body, "response_format": {"type": "json_object"}}, "c")
    assert exc.value.field == "response_format"
    assert "response_format" not in openai_to_anthropic_request(
        {**body, "response_format": {"type": "text"}}, "c"
    )


def test_a_json_schema_becomes_the_responses_text_format() -> None:
    rf = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON, "strict": True},
    }
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "response_format": rf}
    out = chat_to_responses_request(body, "gpt-5")
    assert out["text"] == {
        "format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    }
    json_mode = {**body, "response_format": {"type": "json_object"}}
    assert chat_to_responses_request(json_mode, "gpt-5")["text"] == {
        "format": {"type": "json_object"}
    }
