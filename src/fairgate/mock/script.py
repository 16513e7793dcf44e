"""Tool calls the mock upstream answers with, scripted by the request's content.

A real agent (Claude Code, the Codex CLI) only runs its tool loop when the model asks for a
tool. So that the suite can drive those clients through the gateway, the mock answers with tool
calls when the conversation's last turn is a user message holding one or more directives::

    mock-tool NAME {"json": "arguments"}

one per line (several lines: parallel calls, in that order). ``NAME`` is the tool the request
declares; the JSON object is its input. For a freeform (``custom``) tool of the Responses wire
the call's raw input is the object's ``input`` string (the form the gateway gives such a tool in
front of a chat or Anthropic upstream: a function with one string argument ``input``).

Once the last turn is a tool result, the mock answers in text again, with words of the tool's
output, so a test sees that the client really ran the tool and sent its result back. A script in
the user's words (rather than a header) is what a client that cannot set headers per turn can
still carry, and it never loops: a tool result is never a user text turn.

Everything here is pure: request bodies in, the calls to answer with out (each wire's form is
:mod:`fairgate.mock.server`'s, shared with the calls :mod:`mock_wire` plans).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from fairgate.mock import wire

JSON = dict[str, Any]

_DIRECTIVE = re.compile(r"^\s*mock-tool\s+([A-Za-z0-9_.:-]{1,128})\s+(\{.*\})\s*$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    """One scripted call: the tool's name and its input object."""

    name: str
    arguments: JSON

    @property
    def arguments_json(self) -> str:
        return orjson.dumps(self.arguments).decode()


@dataclass(frozen=True, slots=True)
class LastTurn:
    """What the conversation ends with: the scripted calls of a user turn (empty when it holds
    none), or the text of the tool results it ends with (``tool_result`` is then set)."""

    calls: tuple[ScriptedCall, ...] = ()
    tool_result: str | None = None


def parse_calls(text: str) -> tuple[ScriptedCall, ...]:
    """The ``mock-tool`` directives of a user's text (a line whose JSON does not parse to an
    object is no directive)."""
    out: list[ScriptedCall] = []
    for m in _DIRECTIVE.finditer(text):
        try:
            args = orjson.loads(m.group(2))
        except orjson.JSONDecodeError:
            continue
        if isinstance(args, dict):
            out.append(ScriptedCall(m.group(1), args))
    return tuple(out)


def _text(content: object, kinds: tuple[str, ...] = ("text", "input_text")) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") in kinds and isinstance(p.get("text"), str)
        )
    return ""


def _result_text(content: object) -> str:
    """Text of a tool result's content (a string or text parts)."""
    return _text(content, ("text", "input_text", "output_text"))


def chat_last_turn(messages: object) -> LastTurn:
    """OpenAI chat: the last message is a user text (directives) or a ``tool`` result."""
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return LastTurn()
    last = messages[-1]
    if last.get("role") == "tool":
        results = []
        for m in reversed(messages):
            if not isinstance(m, dict) or m.get("role") != "tool":
                break
            results.append(_result_text(m.get("content")))
        return LastTurn(tool_result="\n".join(reversed(results)))
    if last.get("role") == "user":
        return LastTurn(parse_calls(_text(last.get("content"))))
    return LastTurn()


def anthropic_last_turn(messages: object) -> LastTurn:
    """Anthropic messages: a user turn with ``tool_result`` blocks is a tool result, else its
    text holds the directives."""
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return LastTurn()
    last = messages[-1]
    if last.get("role") != "user":
        return LastTurn()
    content = last.get("content")
    if isinstance(content, list):
        results = [
            _result_text(b.get("content"))
            for b in content
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        if results:
            return LastTurn(tool_result="\n".join(results))
    return LastTurn(parse_calls(_text(content)))


_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")


def responses_last_turn(body: Mapping[str, Any]) -> LastTurn:
    """Responses input: tool outputs at the end are a tool result; a user message, the
    directives. Items that only carry state (reasoning, configuration updates) are skipped."""
    raw = body.get("input")
    if isinstance(raw, str):
        return LastTurn(parse_calls(raw))
    if not isinstance(raw, list):
        return LastTurn()
    results: list[str] = []
    for item in reversed(raw):
        if not isinstance(item, dict):
            break
        kind = item.get("type", "message")
        if kind in _OUTPUT_ITEMS:
            out = item.get("output")
            results.append(out if isinstance(out, str) else _result_text(out))
            continue
        if results:
            break
        if kind == "message":
            if item.get("role") == "user":
                return LastTurn(parse_calls(_text(item.get("content"))))
            return LastTurn()
    if results:
        return LastTurn(tool_result="\n".join(reversed(results)))
    return LastTurn()


def responses_custom_tools(body: Mapping[str, Any]) -> frozenset[str]:
    """Names of the freeform (``custom``) tools a Responses request declares: in ``tools``, in
    ``namespace`` tools, and in ``additional_tools`` input items (Codex's lighter request form)."""
    names: set[str] = set()

    def walk(tools: object) -> None:
        if not isinstance(tools, list):
            return
        for t in tools:
            if not isinstance(t, dict):
                continue
            if t.get("type") == "custom" and isinstance(t.get("name"), str):
                names.add(t["name"])
            elif t.get("type") == "namespace":
                walk(t.get("tools"))

    walk(body.get("tools"))
    raw = body.get("input")
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict) and item.get("type") == "additional_tools":
                walk(item.get("tools"))
    return frozenset(names)


# -- the calls the mock answers with ----------------------------------------------------------


def scripted_calls(
    route: str, body: Mapping[str, Any], turn: LastTurn, seed: str
) -> list[wire.ToolCall]:
    """The turn's directives as the calls the mock answers with (rendered on each wire by
    :mod:`fairgate.mock.server`, like the calls :func:`mock_wire.planned_calls` plans): on
    the Responses wire a declared freeform tool's call is ``custom`` with the directive's
    ``input`` string as its raw input."""
    custom = responses_custom_tools(body) if route == "responses" else frozenset()
    out: list[wire.ToolCall] = []
    for n, c in enumerate(turn.calls):
        if c.name in custom:
            raw = c.arguments.get("input")
            args, kind = (raw if isinstance(raw, str) else c.arguments_json), "custom"
        else:
            args, kind = c.arguments_json, "function"
        out.append(wire.ToolCall(wire.call_id(route, seed, n), c.name, args, kind))
    return out


def last_turn(route: str, body: Mapping[str, Any]) -> LastTurn:
    """What the request's conversation ends with, on the route's wire (``chat``,
    ``messages`` or ``responses``)."""
    if route == "responses":
        return responses_last_turn(body)
    messages = body.get("messages")
    return chat_last_turn(messages) if route == "chat" else anthropic_last_turn(messages)
