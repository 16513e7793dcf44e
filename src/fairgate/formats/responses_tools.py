"""The tools of a Responses request, in front of an upstream that only runs function tools.

The Codex CLI sends more than function tools: ``namespace`` tools grouping function (and
freeform) tools, ``custom`` (freeform) tools whose call carries one raw string (``apply_patch``,
code mode's ``exec``), and hosted tools OpenAI's servers run (``web_search``, ``tool_search``,
``image_generation``…). Newer models put the tools in an ``additional_tools`` input item instead
of ``tools`` (Codex's lighter request form). A chat or Anthropic upstream runs none of that
itself, so, instead of refusing the whole request:

- a ``function`` tool is sent as it is;
- a ``custom`` tool becomes a function with one string argument, ``input``; its call comes back
  to the client as a ``custom_tool_call`` with that string as its ``input``;
- a ``namespace`` tool is expanded into its tools, each under its own name (``namespace__name``
  when two namespaces hold the same name); a call comes back under its own name with the
  ``namespace`` it was declared in;
- a hosted tool is left out of the upstream request, and the answer's
  ``x-fairgate-tools-omitted`` header names the tool types left out (the model is told nothing:
  it simply does not have the tool, as with a provider that lacks it).

:func:`tool_plan` is computed from the client's request on the way in and again on the way out
(pure and O(tools)), so nothing needs to travel between the two.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

JSON = dict[str, Any]

#: The answer header naming the hosted tool types left out of the upstream request.
TOOLS_OMITTED_HEADER = "x-fairgate-tools-omitted"

#: The one argument a freeform tool has as a function.
CUSTOM_ARGUMENT = "input"

_SAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")


class ToolPlanError(ValueError):
    """A tool the request declares that cannot be served, naming its place (``tools[2]``)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(message)
        self.where = where
        self.message = message


@dataclass(frozen=True, slots=True)
class ClientTool:
    """How an upstream function maps back to the client's tool."""

    name: str  # the tool's own name in the client's request
    custom: bool = False  # a freeform tool: the call is a custom_tool_call
    namespace: str | None = None  # the namespace it was declared in


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """The chat tools to send, how their calls map back, and the hosted tool types left out."""

    chat_tools: tuple[JSON, ...] = ()
    by_chat_name: Mapping[str, ClientTool] = field(default_factory=dict)
    omitted: tuple[str, ...] = ()

    def chat_name(self, name: str, namespace: str | None = None) -> str:
        """The upstream function name of the client's tool ``name`` (in ``namespace``)."""
        for chat, tool in self.by_chat_name.items():
            if tool.name == name and (namespace is None or tool.namespace == namespace):
                return chat
        return name

    def client_call(self, chat_name: str, arguments: str) -> JSON:
        """The fields of the client's call item for an upstream call of ``chat_name``: ``type``,
        ``name``, ``namespace`` when declared in one, and ``arguments`` or (freeform) ``input``."""
        tool = self.by_chat_name.get(chat_name)
        if tool is None:
            return {"type": "function_call", "name": chat_name, "arguments": arguments}
        out: JSON = {"name": tool.name}
        if tool.namespace is not None:
            out["namespace"] = tool.namespace
        if not tool.custom:
            return {"type": "function_call", **out, "arguments": arguments}
        return {"type": "custom_tool_call", **out, "input": custom_input(arguments)}

    def is_custom(self, chat_name: str) -> bool:
        tool = self.by_chat_name.get(chat_name)
        return tool is not None and tool.custom


def custom_input(arguments: str) -> str:
    """The raw input of a freeform call from its function arguments (``{"input": "…"}``); the
    arguments themselves when the model did not follow the one-string schema."""
    try:
        parsed = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get(CUSTOM_ARGUMENT), str):
        return str(parsed[CUSTOM_ARGUMENT])
    return arguments


def _custom_function(tool: Mapping[str, Any]) -> tuple[JSON, str]:
    """The parameters and description of a freeform tool as a function: one string, the tool's
    grammar (if it has one) told in the description, where a model can read it."""
    fmt = tool.get("format")
    hint = ""
    if isinstance(fmt, Mapping) and fmt.get("type") == "grammar":
        syntax, definition = fmt.get("syntax", ""), fmt.get("definition", "")
        hint = f"\n\nThe input follows this {syntax} grammar:\n{definition}"
    description = str(tool.get("description") or "") + hint
    return {
        "type": "object",
        "properties": {CUSTOM_ARGUMENT: {"type": "string", "description": "The tool's raw input."}},
        "required": [CUSTOM_ARGUMENT],
        "additionalProperties": False,
    }, description


def _declared(body: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(place, tool) of every tool the request declares: ``tools`` and ``additional_tools``."""
    out: list[tuple[str, Any]] = []
    tools = body.get("tools")
    if isinstance(tools, list):
        out += [(f"tools[{n}]", t) for n, t in enumerate(tools)]
    items = body.get("input")
    if isinstance(items, list):
        for i, item in enumerate(items):
            if isinstance(item, Mapping) and item.get("type") == "additional_tools":
                extra = item.get("tools")
                if isinstance(extra, list):
                    out += [(f"input[{i}].tools[{n}]", t) for n, t in enumerate(extra)]
    return out


def _leaves(
    body: Mapping[str, Any],
) -> tuple[list[tuple[str, Mapping[str, Any], str | None]], list[str]]:
    """(place, tool, namespace) of every function and freeform tool, namespaces expanded; and
    the hosted tool types, in the order first declared."""
    leaves: list[tuple[str, Mapping[str, Any], str | None]] = []
    omitted: list[str] = []
    for where, raw in _declared(body):
        if not isinstance(raw, Mapping):
            raise ToolPlanError(where, "a tool must be an object")
        kind = raw.get("type")
        if kind == "namespace":
            ns = raw.get("name")
            if not isinstance(ns, str) or not ns:
                raise ToolPlanError(f"{where}.name", "a namespace tool needs a name")
            for n, child in enumerate(raw.get("tools") or []):
                if not isinstance(child, Mapping) or child.get("type") not in (
                    "function",
                    "custom",
                ):
                    raise ToolPlanError(
                        f"{where}.tools[{n}].type",
                        "a namespace holds function and custom tools only",
                    )
                leaves.append((f"{where}.tools[{n}]", child, ns))
        elif kind in ("function", "custom"):
            leaves.append((where, raw, None))
        elif isinstance(kind, str) and kind:
            if kind not in omitted:
                omitted.append(kind)  # hosted: the upstream cannot run it
        else:
            raise ToolPlanError(f"{where}.type", "a tool needs a type")
    return leaves, omitted


def _function(tool: Mapping[str, Any], chat_name: str) -> JSON:
    """A function or freeform tool as a chat function tool named ``chat_name``."""
    if tool.get("type") == "custom":
        parameters, description = _custom_function(tool)
    else:
        parameters = tool.get("parameters") or {"type": "object", "properties": {}}
        description = str(tool.get("description") or "")
    fn: JSON = {"name": chat_name, "parameters": parameters}
    if description:
        fn["description"] = description
    if tool.get("type") == "function" and isinstance(tool.get("strict"), bool):
        fn["strict"] = tool["strict"]
    return {"type": "function", "function": fn}


def tool_plan(body: Mapping[str, Any]) -> ToolPlan:
    """The plan for a Responses request's tools (see the module notes). Raises
    :class:`ToolPlanError` for a tool without a name or of an unknown shape."""
    leaves, omitted = _leaves(body)
    names = [t.get("name") for _, t, _ in leaves]
    counts = Counter(n for n in names if isinstance(n, str))
    chat_tools: list[JSON] = []
    by_chat: dict[str, ClientTool] = {}
    for (where, tool, ns), name in zip(leaves, names, strict=True):
        if not isinstance(name, str) or not name:
            raise ToolPlanError(f"{where}.name", "a tool needs a name")
        chat_name = name
        if ns is not None and (counts[name] > 1 or name in by_chat):
            chat_name = _SAFE_NAME.sub("_", f"{ns}__{name}")[:64]
        if chat_name in by_chat:
            continue  # the same tool declared twice: one function
        chat_tools.append(_function(tool, chat_name))
        by_chat[chat_name] = ClientTool(name, tool.get("type") == "custom", ns)
    return ToolPlan(tuple(chat_tools), by_chat, tuple(omitted))
