"""Codex's tools in front of a chat or Anthropic upstream (issue 42, item 4): namespaces expanded,
freeform tools as one-string functions that come back as ``custom_tool_call``, hosted tools left
out and named, and Codex's lighter request form (tools in an ``additional_tools`` input item)."""

from __future__ import annotations

from typing import Any

import orjson

from fairgate.formats.responses import (
    ChatToResponsesStream,
    chat_to_responses_response,
    omitted_tools,
    responses_to_chat_request,
)

APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
}
SHELL = {
    "type": "function",
    "name": "exec_command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
NAMESPACE = {
    "type": "namespace",
    "name": "mcp__files",
    "description": "",
    "tools": [
        {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {}}},
        {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
    ],
}
CODEX_TOOLS: list[dict[str, Any]] = [
    SHELL,
    APPLY_PATCH,
    NAMESPACE,
    {"type": "web_search", "external_web_access": False},
    {"type": "tool_search"},
]


def _names(chat: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in chat["tools"]]


def test_codex_tools_become_function_tools_and_hosted_ones_are_named() -> None:
    body = {"model": "m", "input": "hi", "tools": CODEX_TOOLS}
    chat = responses_to_chat_request(body, "m")
    # a name two namespaces share gets its namespace as a prefix; the others keep theirs
    assert _names(chat) == ["exec_command", "apply_patch", "read", "mcp__files__exec_command"]
    patch = chat["tools"][1]["function"]
    assert patch["parameters"]["required"] == ["input"]
    assert patch["parameters"]["properties"]["input"]["type"] == "string"
    assert "start: /.+/" in patch["description"]  # the grammar is told to the model
    assert omitted_tools(body) == ("web_search", "tool_search")


def test_tools_of_an_additional_tools_item_are_served_and_the_item_is_no_message() -> None:
    body = {
        "model": "m",
        "tools": [],
        "input": [
            {"type": "additional_tools", "role": "developer", "tools": [NAMESPACE, APPLY_PATCH]},
            {"type": "configuration_update", "reasoning": {"effort": "low"}},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        ],
    }
    chat = responses_to_chat_request(body, "m")
    assert _names(chat) == ["read", "exec_command", "apply_patch"]
    assert chat["messages"] == [{"role": "user", "content": "go"}]


def test_custom_and_namespaced_calls_round_trip() -> None:
    body = {
        "model": "m",
        "tools": CODEX_TOOLS,
        "input": [
            {"type": "message", "role": "user", "content": "patch it"},
            {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** x"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
            {
                "type": "function_call",
                "call_id": "c2",
                "name": "exec_command",
                "namespace": "mcp__files",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": "c2", "output": "ok"},
        ],
    }
    chat = responses_to_chat_request(body, "m")
    calls = [m for m in chat["messages"] if m.get("tool_calls")]
    fns = [c["function"] for m in calls for c in m["tool_calls"]]
    assert fns[0] == {"name": "apply_patch", "arguments": '{"input":"*** x"}'}
    assert fns[1]["name"] == "mcp__files__exec_command"
    assert [m["content"] for m in chat["messages"] if m["role"] == "tool"] == ["done", "ok"]


def _chat_answer(*calls: tuple[str, str]) -> dict[str, Any]:
    tool_calls = [
        {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": args}}
        for n, (name, args) in enumerate(calls)
    ]
    message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }


def test_an_upstream_call_of_a_freeform_tool_reaches_the_client_as_custom_tool_call() -> None:
    request = {"model": "m", "input": "hi", "tools": CODEX_TOOLS}
    answer = _chat_answer(
        ("apply_patch", '{"input": "*** Begin Patch"}'),
        ("mcp__files__exec_command", "{}"),
        ("exec_command", '{"cmd": "ls"}'),
    )
    out = chat_to_responses_response(answer, request, "m", created=1)["output"]
    assert out[0]["type"] == "custom_tool_call"
    assert out[0]["name"] == "apply_patch"
    assert out[0]["input"] == "*** Begin Patch"
    assert out[0]["call_id"] == "call_0"
    assert out[1]["type"] == "function_call"
    assert (out[1]["name"], out[1]["namespace"]) == ("exec_command", "mcp__files")
    assert out[2]["type"] == "function_call"
    assert "namespace" not in out[2]
    assert orjson.loads(out[2]["arguments"]) == {"cmd": "ls"}


def test_a_streamed_freeform_call_is_sent_whole_as_custom_tool_call_input() -> None:
    request = {"model": "m", "input": "hi", "tools": CODEX_TOOLS, "stream": True}
    conv = ChatToResponsesStream(request, "m", created=1)
    events = conv.start()
    call = {"index": 0, "id": "call_0", "type": "function"}
    for piece in ('{"input": "*** Be', 'gin Patch"}'):
        fn = {"name": "apply_patch", "arguments": piece} if "Be" in piece else {"arguments": piece}
        events += conv.feed(
            {"choices": [{"index": 0, "delta": {"tool_calls": [{**call, "function": fn}]}}]}
        )
    events += conv.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    events += conv.finish()
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" not in kinds
    assert kinds[-4:] == [
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = next(e for e in events if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == "*** Begin Patch"
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["type"] == "custom_tool_call"
    final = events[-1]["response"]["output"][0]
    assert (final["type"], final["input"]) == ("custom_tool_call", "*** Begin Patch")
