"""Usage readers and the prompt estimate (fairgate.formats.usage)."""

from __future__ import annotations

from typing import Any

import pytest

from fairgate.formats.usage import (
    IMAGE_TOKENS,
    Usage,
    estimate_prompt_tokens,
    estimate_text_tokens,
    usage_from_anthropic,
    usage_from_openai,
)


def test_usage_total() -> None:
    assert Usage(10, 5).total == 15
    assert Usage().total == 0


def test_openai_usage_with_details() -> None:
    resp = {
        "usage": {
            "prompt_tokens": 1200,
            "completion_tokens": 300,
            "total_tokens": 1500,
            "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 128},
        }
    }
    assert usage_from_openai(resp) == Usage(1200, 300, 1024, 128)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({}, None),
        ({"usage": None}, None),
        ({"usage": "lots"}, None),
        ({"choices": []}, None),
        ({"usage": {"prompt_tokens": 5}}, Usage(5, 0)),
        ({"usage": {"prompt_tokens": None, "completion_tokens": "7"}}, Usage(0, 7)),
        ({"usage": {"prompt_tokens": -3, "completion_tokens": 2.9}}, Usage(0, 2)),
        ({"usage": {"prompt_tokens": True, "completion_tokens": float("nan")}}, Usage(0, 0)),
        (
            {"usage": {"prompt_tokens": 5, "prompt_tokens_details": None}},
            Usage(5, 0),
        ),
        (
            {"usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}}},
            Usage(5, 0, 5),  # cached never exceeds prompt
        ),
        # a bare usage object, and the Responses API names
        ({"prompt_tokens": 3, "completion_tokens": 4}, Usage(3, 4)),
        (
            {
                "usage": {
                    "input_tokens": 10,
                    "output_tokens": 20,
                    "input_tokens_details": {"cached_tokens": 4},
                    "output_tokens_details": {"reasoning_tokens": 6},
                }
            },
            Usage(10, 20, 4, 6),
        ),
    ],
)
def test_openai_usage_is_tolerant(obj: dict[str, Any], expected: Usage | None) -> None:
    assert usage_from_openai(obj) == expected


def test_anthropic_message_usage_adds_cache_to_prompt() -> None:
    msg = {
        "type": "message",
        "usage": {
            "input_tokens": 50,
            "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 200,
            "output_tokens": 80,
        },
    }
    assert usage_from_anthropic(msg) == Usage(1250, 80, 1000, 0)


def test_anthropic_stream_events() -> None:
    start = {
        "type": "message_start",
        "message": {"usage": {"input_tokens": 25, "output_tokens": 1}},
    }
    assert usage_from_anthropic(start) == Usage(25, 1)
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"output_tokens": 42},
    }
    assert usage_from_anthropic(delta) == Usage(0, 42)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({}, None),
        ({"usage": None}, None),
        ({"type": "ping"}, None),
        ({"message": {"content": []}}, None),
        ({"usage": {"input_tokens": None, "output_tokens": "3"}}, Usage(0, 3)),
        ({"input_tokens": 2, "output_tokens": 3}, Usage(2, 3)),
        (
            {
                "usage": {
                    "input_tokens": 1,
                    "output_tokens": 9,
                    "output_tokens_details": {"thinking_tokens": 4},
                }
            },
            Usage(1, 9, 0, 4),
        ),
    ],
)
def test_anthropic_usage_is_tolerant(obj: dict[str, Any], expected: Usage | None) -> None:
    assert usage_from_anthropic(obj) == expected


def test_estimate_text_tokens() -> None:
    assert estimate_text_tokens("") == 0
    assert estimate_text_tokens("abcd") == 1
    assert estimate_text_tokens("abcde") == 2


def test_estimate_prompt_counts_every_text() -> None:
    body = {
        "system": "s" * 40,  # Anthropic-style system
        "messages": [
            {"role": "system", "content": "x" * 40},
            {"role": "user", "content": [{"type": "text", "text": "y" * 40}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "abcd", "arguments": "z" * 36}}],
            },
            {"role": "tool", "content": "w" * 40},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "content": [{"type": "text", "text": "v" * 40}]},
                    {"type": "tool_use", "input": {"k": "u" * 32}},  # {"k":"uu…"} = 40 chars
                ],
            },
        ],
    }
    assert estimate_prompt_tokens(body) == 7 * 10


def test_estimate_prompt_counts_tools_json_and_images() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    base = estimate_prompt_tokens({"messages": [{"role": "user", "content": "hi"}]})
    with_tools = estimate_prompt_tokens(
        {"messages": [{"role": "user", "content": "hi"}], "tools": tools}
    )
    assert with_tools > base
    img = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 10_000}}
    with_image = estimate_prompt_tokens({"messages": [{"role": "user", "content": [img]}]})
    assert with_image == IMAGE_TOKENS  # the base64 payload is not counted as text


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"messages": None},
        {"messages": "oops"},
        {"messages": [None, 3, "x", {"content": {"weird": True}}]},
        {
            "messages": [
                {"content": [None, 1, {"text": None}, {"type": "tool_result", "content": 5}]}
            ]
        },
        {"tools": {1, 2}},  # not JSON-serialisable
        {"system": [{"type": "text", "text": None}]},
        {
            "messages": [
                {"tool_calls": [None, {"function": None}, {"function": {"arguments": {"a": 1}}}]}
            ]
        },
    ],
)
def test_estimate_prompt_never_raises(body: dict[str, Any]) -> None:
    assert estimate_prompt_tokens(body) >= 1


def test_estimate_prompt_deep_nesting_is_bounded() -> None:
    content: Any = "x" * 8
    for _ in range(100):
        content = [{"type": "tool_result", "content": content}]
    assert estimate_prompt_tokens({"messages": [{"content": content}]}) >= 1
