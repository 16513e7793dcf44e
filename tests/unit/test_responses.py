"""Responses API translation (fairgate.formats.responses / responses_upstream).

The shapes are checked against the official ``openai`` SDK's own types (strict pydantic
validation of ``Response`` and every stream event), not against hand-written expectations.
"""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from wire_support import chat_usage, tool_call

from fairgate.formats.responses import (
    ChatToResponsesStream,
    ResponsesInputError,
    chat_to_responses_response,
    responses_to_chat_request,
)
from fairgate.formats.responses_upstream import (
    ResponsesToChatStream,
    chat_from_completed,
    chat_to_responses_request,
)
from fairgate.formats.usage import Usage

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def chat_answer(text: str | None, calls: list[dict[str, Any]] | None = None, finish: str = "stop"):  # type: ignore[no-untyped-def]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": chat_usage(12, 5, cached=2, reasoning=1),
    }


# -- client request → chat ----------------------------------------------------------------------


def test_string_input_and_instructions() -> None:
    body = {"model": "x", "input": "Hi", "instructions": "Be brief", "max_output_tokens": 50}
    chat = responses_to_chat_request(body, "gpt-4o-mini")
    assert chat == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Be brief"},
            {"role": "user", "content": "Hi"},
        ],
        "max_tokens": 50,
    }
    # reasoning models take max_completion_tokens; a stream asks for usage
    chat = responses_to_chat_request({**body, "stream": True}, "gpt-5")
    assert chat["max_completion_tokens"] == 50
    assert chat["stream_options"] == {"include_usage": True}


def test_items_with_a_tool_round_trip() -> None:
    body = {
        "input": [
            {"role": "developer", "content": "Use tools"},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Weather in "},
                    {"type": "input_text", "text": "Paris?"},
                ],
            },
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city":"Paris"}',
            },
            {
                "type": "function_call",
                "call_id": "call_2",
                "name": "get_weather",
                "arguments": '{"city":"Lyon"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_2", "output": "rain"},
        ],
        "tools": [TOOL],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        "reasoning": {"effort": "low"},
    }
    chat = responses_to_chat_request(body, "m")
    assert chat["messages"] == [
        {"role": "system", "content": "Use tools"},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                tool_call("call_1", '{"city":"Paris"}'),
                tool_call("call_2", '{"city":"Lyon"}'),
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": TOOL["parameters"],
                "description": "Weather in a city",
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}},
    }
    assert chat["reasoning_effort"] == "low"


def test_images_stay_parts() -> None:
    body = {
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {
                        "type": "input_image",
                        "image_url": "data:image/png;base64,AAAA",
                        "detail": "low",
                    },
                ],
            }
        ]
    }
    (msg,) = responses_to_chat_request(body, "m")["messages"]
    assert msg["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({}, "input"),
        ({"input": 7}, "input"),
        ({"input": ["x"]}, "input[0]"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": "hi", "tools": [{"name": "untyped"}]}, "tools[0].type"),
        ({"input": "hi", "tools": [{"type": "namespace", "tools": []}]}, "tools[0].name"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ],
)
def test_unservable_requests_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ResponsesInputError) as exc:
        responses_to_chat_request(body, "m")
    assert exc.value.field == field


# -- chat answer → Responses object -------------------------------------------------------------


def test_answer_is_a_valid_sdk_response() -> None:
    request = {"model": "alias", "input": "hi", "tools": [TOOL], "instructions": "Be brief"}
    calls = [tool_call("call_9", '{"city":"Oslo"}')]
    out = chat_to_responses_response(
        chat_answer("Checking.", calls, "tool_calls"),
        request,
        "alias",
        response_id="resp_1",
        created=1_700_000_000,
    )
    resp = Response.model_validate(out)
    assert resp.output_text == "Checking."
    assert resp.status == "completed"
    fc = resp.output[1]
    assert fc.type == "function_call"
    assert (fc.call_id, fc.name, fc.arguments) == ("call_9", "get_weather", '{"city":"Oslo"}')
    assert resp.usage is not None
    assert (resp.usage.input_tokens, resp.usage.output_tokens, resp.usage.total_tokens) == (
        12,
        5,
        17,
    )
    assert resp.usage.input_tokens_details.cached_tokens == 2
    assert resp.usage.output_tokens_details.reasoning_tokens == 1
    assert resp.instructions == "Be brief"


def test_length_finish_is_incomplete() -> None:
    out = chat_to_responses_response(
        chat_answer("abc", finish="length"), {"input": "x"}, "m", created=1
    )
    resp = Response.model_validate(out)
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"


# -- chat stream → Responses events -------------------------------------------------------------


def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
    out: dict[str, Any] = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage:
        out["usage"] = usage
    return out


def run_stream(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    s = ChatToResponsesStream({"input": "x", "tools": [TOOL]}, "m", response_id="resp_s", created=1)
    events = s.start()
    for c in chunks:
        events += s.feed(c)
    events += s.finish()
    return events


STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Let me "}),
    chunk({"content": "check."}),
    chunk(
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
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Rome"}'}}]}),
    chunk({}, "tool_calls"),
    chunk({}, usage={"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}),
]


def test_stream_events_are_valid_and_ordered() -> None:
    events = run_stream(STREAM)
    parsed = [EVENTS.validate_python(e) for e in events]  # each one a valid SDK event
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = parsed[-1].response
    assert final.output_text == "Let me check."
    assert final.output[1].arguments == '{"city":"Rome"}'
    assert [i.id for i in final.output] == [events[2]["item"]["id"], events[9]["item"]["id"]]
    assert final.usage.input_tokens == 30
    assert final.usage.output_tokens == 9


def test_stream_without_usage_takes_the_callers_estimate() -> None:
    s = ChatToResponsesStream({"input": "x"}, "m", created=1)
    s.start()
    s.feed(chunk({"content": "hi"}, "length"))
    (done,) = [e for e in s.finish(Usage(7, 1)) if e["type"].startswith("response.inc")]
    resp = EVENTS.validate_python(done).response
    assert resp.status == "incomplete"
    assert resp.usage.input_tokens == 7
    assert s.finish() == []  # closes once


def test_stream_failure_is_a_failed_response() -> None:
    s = ChatToResponsesStream({"input": "x"}, "m", created=1)
    s.start()
    (failed,) = s.fail("upstream went away")
    resp = EVENTS.validate_python(failed).response
    assert resp.status == "failed"
    assert resp.error is not None
    assert resp.error.message == "upstream went away"


# -- chat → Responses upstream (Codex) and back -------------------------------------------------


def test_chat_request_for_a_codex_upstream() -> None:
    chat = {
        "model": "alias",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call("call_1", "{}")],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather"}}],
        "max_tokens": 100,
        "temperature": 0.2,
    }
    out = chat_to_responses_request(chat, "gpt-5-codex")
    assert out["instructions"] == "You are terse."
    assert out["input"] == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Weather?"}],
        },
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    assert out["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {}},
        }
    ]
    assert (out["stream"], out["store"]) == (True, False)  # what the Codex backend requires
    assert "max_output_tokens" not in out
    assert "temperature" not in out


def test_round_trip_through_both_directions() -> None:
    """A chat stream rendered as Responses events and read back is the same answer."""
    events = run_stream(STREAM)
    back = ResponsesToChatStream("m", include_usage=True, created=1, id="c")
    chunks = [c for e in events for c in back.feed(e["type"], e)]
    assert back.done
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Let me check."
    calls = [
        tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert calls[0]["id"] == "call_1"
    assert "".join(tc["function"]["arguments"] for tc in calls) == '{"city":"Rome"}'
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish[-1] == "tool_calls"
    assert chunks[-1]["usage"]["prompt_tokens"] == 30
    assert back.usage == Usage(30, 9)
    # the folded non-stream answer from response.completed says the same
    assert back.completed is not None
    folded = chat_from_completed(back.completed, "m", created=1)
    assert folded["choices"][0]["message"]["content"] == "Let me check."
    assert folded["choices"][0]["finish_reason"] == "tool_calls"
    assert folded["usage"]["total_tokens"] == 39


def test_upstream_stream_errors() -> None:
    s = ResponsesToChatStream("m", include_usage=False, created=1, id="c")
    (err,) = s.feed(
        "response.failed",
        {
            "type": "response.failed",
            "response": {"error": {"code": "rate_limit_exceeded", "message": "slow down"}},
        },
    )
    assert err == {"error": {"message": "slow down", "type": "rate_limit_exceeded", "code": None}}
    cut = ResponsesToChatStream("m", include_usage=False, created=1, id="c")
    cut.feed(None, {"type": "response.output_text.delta", "delta": "par"})
    (err,) = cut.finish()
    assert "ended before response.completed" in err["error"]["message"]


def test_a_stream_cut_off_before_its_finish_is_failed_not_completed() -> None:
    """Issue 42: a chat stream the upstream ended early (text, then nothing: no finish reason)
    was closed as ``response.completed``, and a client took the part for the whole answer."""
    s = ChatToResponsesStream({"input": "x"}, "m", created=1)
    s.start()
    s.feed(chunk({"content": "the first half"}))
    events = s.finish(Usage(7, 3))
    assert [e["type"] for e in events] == ["response.failed"]
    resp = EVENTS.validate_python(events[0]).response
    assert resp.status == "failed"
    assert resp.error is not None
    assert "before it finished" in resp.error.message
    assert resp.usage is not None
    assert resp.usage.input_tokens == 7
    assert s.finish() == []
