"""What the mock provider answers beyond text, as the real APIs document it (issue 42, item 2).

The gateway's translation and relays are only tested honestly if the mock answers the way
OpenAI and Anthropic do when a request asks for more than text. Decided by the request itself,
as the providers decide it:

- **A forced tool** (chat ``tool_choice: {"type": "function", ...}`` or ``"required"``;
  Anthropic ``{"type": "tool" | "any"}``; Responses ``{"type": "function" | "custom", "name"}``
  or ``"required"``) is answered with a call to it whose arguments fit its JSON schema.
- **Structured output** (chat ``response_format: {"type": "json_schema"}``, Responses
  ``text.format``, Anthropic ``output_config.format`` or the beta ``output_format``): the text
  is a JSON document that fits the schema (``json_object``: a JSON object).
- **Anthropic thinking** (``thinking: {"type": "enabled" | "adaptive"}``): a ``thinking`` block
  with its ``signature`` before the answer (streamed as ``thinking_delta`` then
  ``signature_delta``).
- **Responses reasoning** (``reasoning`` set): a ``reasoning`` output item first, with a
  ``summary`` when ``reasoning.summary`` asks for one and ``encrypted_content`` when
  ``include`` lists ``reasoning.encrypted_content`` (an opaque string, as OpenAI's is).

And by the fault header (:mod:`fairgate.mock.faults`), for what a model chooses:
``tool-calls[:n]`` makes ``n`` parallel calls to the request's tools (OpenAI chat streams
interleave them by ``index``: every call's first chunk, then their arguments, as OpenAI's
parallel calls arrive), ``redacted-thinking`` adds a ``redacted_thinking`` block to an
Anthropic answer that thinks, ``usage-in-delta`` sends an Anthropic stream's counts in
``message_delta`` only (``message_start`` says 0, as Anthropic-compatible providers do).

Also here: the request fields each API accepts today (the echoing mode's check) and the fields
Anthropic accepts only beside an ``anthropic-beta`` flag (refused without it, always, in
Anthropic's words).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "BETA_FIELDS",
    "RESPONSES_FIELDS",
    "ToolCall",
    "anthropic_extra_fields",
    "beta_refusal",
    "planned_calls",
    "schema_instance",
    "structured_format",
]

JSON = dict[str, Any]

#: Fields of ``POST /v1/responses`` (the OpenAI Python SDK's ``ResponseCreateParams``).
RESPONSES_FIELDS = frozenset(
    [
        "model",
        "input",
        "instructions",
        "include",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "parallel_tool_calls",
        "previous_response_id",
        "prompt",
        "prompt_cache_key",
        "prompt_cache_retention",
        "reasoning",
        "safety_identifier",
        "service_tier",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "truncation",
        "user",
        "background",
        "conversation",
        "context_management",
    ]
)

#: Fields of ``POST /v1/messages`` added since the echoing mode's first list: the generally
#: available ``output_config`` (``effort``, ``format``: structured outputs) and the beta ones
#: of :data:`BETA_FIELDS`.
ANTHROPIC_NEW_FIELDS = frozenset({"output_config", "output_format", "inference_geo"})

#: Anthropic request fields that need a beta flag: field -> the flags that enable it.
BETA_FIELDS: Mapping[str, tuple[str, ...]] = {
    "output_format": ("structured-outputs-2025-11-13",),
    "context_management": ("context-management-2025-06-27",),
    "mcp_servers": ("mcp-client-2025-04-04", "mcp-client-2025-11-20"),
}


def anthropic_extra_fields() -> frozenset[str]:
    """The Messages fields the echoing mode's list gains (see :data:`ANTHROPIC_NEW_FIELDS`)."""
    return ANTHROPIC_NEW_FIELDS | frozenset(BETA_FIELDS)


def beta_refusal(body: Mapping[str, Any], beta_header: str | None) -> str | None:
    """Anthropic's 400 message for the first beta field sent without its flag, else None.
    Anthropic answers such a field as it answers an unknown one."""
    flags = {f.strip() for f in (beta_header or "").split(",") if f.strip()}
    for name, needs in BETA_FIELDS.items():
        if name in body and not flags & set(needs):
            return f"{name}: Extra inputs are not permitted"
    return None


# -- JSON that fits a schema ----------------------------------------------------------------------


def schema_instance(schema: object, defs: Mapping[str, Any] | None = None, depth: int = 0) -> Any:
    """A small JSON value that validates against ``schema`` (the subset structured outputs
    allow: objects with required properties, arrays, enums, consts, ``anyOf``, ``$ref`` to
    ``$defs``, the scalar types). Deterministic, so tests can assert it."""
    if not isinstance(schema, Mapping) or depth > 12:
        return None
    defs = {**(defs or {}), **(schema.get("$defs") or {}), **(schema.get("definitions") or {})}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.rsplit("/", 1)[-1] in defs:
        return schema_instance(defs[ref.rsplit("/", 1)[-1]], defs, depth + 1)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return schema_instance(options[0], defs, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties") or {}
        return {name: schema_instance(sub, defs, depth + 1) for name, sub in props.items()}
    if kind == "array":
        low = schema.get("minItems")
        n = low if isinstance(low, int) and low > 0 else 1
        return [schema_instance(schema.get("items") or {}, defs, depth + 1) for _ in range(n)]
    if kind == "string":
        return "mock"
    if kind == "integer":
        low = schema.get("minimum")
        return low if isinstance(low, int) else 1
    if kind == "number":
        low = schema.get("minimum")
        return low if isinstance(low, int | float) else 1.5
    if kind == "boolean":
        return True
    return None


def structured_format(route: str, body: Mapping[str, Any]) -> JSON | None:
    """The structured output a request asks for, as ``{"type": "json_schema", "schema"}`` or
    ``{"type": "json_object"}``; None for free text."""
    fmt: object = None
    if route == "chat":
        rf = body.get("response_format")
        if isinstance(rf, Mapping) and rf.get("type") == "json_schema":
            js = rf.get("json_schema")
            fmt = {
                "type": "json_schema",
                "schema": js.get("schema") if isinstance(js, Mapping) else {},
            }
        elif isinstance(rf, Mapping):
            fmt = rf
    elif route == "responses":
        text = body.get("text")
        fmt = text.get("format") if isinstance(text, Mapping) else None
    else:
        config = body.get("output_config")
        fmt = config.get("format") if isinstance(config, Mapping) else None
        fmt = fmt or body.get("output_format")
    if isinstance(fmt, Mapping) and fmt.get("type") in ("json_schema", "json_object"):
        return {"type": fmt["type"], "schema": fmt.get("schema") or {}}
    return None


def structured_text(fmt: Mapping[str, Any], words: str) -> str:
    """The answer's text for a structured-output request."""
    if fmt["type"] == "json_object":
        return orjson.dumps({"reply": words}).decode()
    return orjson.dumps(schema_instance(fmt.get("schema"))).decode()


# -- tool calls ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the mock makes: ``kind`` is ``function`` (JSON arguments) or ``custom``
    (a Responses freeform tool: one string of input)."""

    call_id: str
    name: str
    arguments: str
    kind: str = "function"


def _tools(route: str, body: Mapping[str, Any]) -> list[tuple[str, object, str]]:
    """(name, input schema, kind) of each tool the request offers that the model may call."""
    out: list[tuple[str, object, str]] = []
    for raw in body.get("tools") or []:
        if not isinstance(raw, Mapping):
            continue
        if route == "chat":
            fn = raw.get("function")
            if raw.get("type") == "function" and isinstance(fn, Mapping) and fn.get("name"):
                out.append((str(fn["name"]), fn.get("parameters"), "function"))
        elif route == "messages":
            if isinstance(raw.get("name"), str) and "input_schema" in raw:
                out.append((raw["name"], raw["input_schema"], "function"))
        elif raw.get("type") in ("function", "custom") and isinstance(raw.get("name"), str):
            out.append((raw["name"], raw.get("parameters"), str(raw["type"])))
    return out


def _forced(route: str, body: Mapping[str, Any]) -> tuple[bool, str | None]:
    """(whether the request forces a tool call, the one it names or None for any)."""
    choice = body.get("tool_choice")
    if choice == "required":
        return True, None
    if not isinstance(choice, Mapping):
        return False, None
    kind = choice.get("type")
    if route == "chat" and kind == "function":
        fn = choice.get("function")
        return True, str(fn.get("name")) if isinstance(fn, Mapping) else None
    if route == "messages" and kind in ("tool", "any"):
        return True, str(choice["name"]) if kind == "tool" else None
    if route == "responses" and kind in ("function", "custom"):
        return True, str(choice.get("name"))
    return False, None


def planned_calls(route: str, body: Mapping[str, Any], parallel: int, seed: str) -> list[ToolCall]:
    """The calls the mock answers with: ``parallel`` calls over the request's tools when the
    fault header asks for them (``tool-calls:n``), else one when the request forces a tool,
    else none. Arguments fit each tool's schema; ``seed`` makes the call ids unique."""
    tools = _tools(route, body)
    if not tools:
        return []
    forced, name = _forced(route, body)
    if parallel <= 0 and not forced:
        return []
    if name is not None:
        tools = [t for t in tools if t[0] == name] or tools
    n = max(parallel, 1)
    calls = []
    for i in range(n):
        tool_name, schema, kind = tools[i % len(tools)]
        if kind == "custom":
            args = f"mock input {i}"
        else:
            value = schema_instance(schema) if schema else {}
            args = orjson.dumps(value if isinstance(value, dict) else {}).decode()
        calls.append(ToolCall(call_id(route, seed, i), tool_name, args, kind))
    return calls


def call_id(route: str, seed: str, i: int) -> str:
    """The id of the ``i``-th call of an answer, in the route's form (``toolu_`` on
    Anthropic's, ``call_`` on OpenAI's); ``seed`` (the request id) makes it unique."""
    digest = hashlib.sha256(f"{seed}:{i}".encode()).hexdigest()[:24]
    prefix = {"chat": "call_", "messages": "toolu_"}.get(route, "call_")
    return f"{prefix}{digest}"


# -- thinking and reasoning ------------------------------------------------------------------------


def signature(seed: str) -> str:
    """An opaque signature, as Anthropic's thinking blocks carry (base64 of bytes)."""
    return base64.b64encode(hashlib.sha512(f"sig:{seed}".encode()).digest()).decode()


def thinking_requested(body: Mapping[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")


def reasoning_wanted(body: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    """(a reasoning item, with a summary, with encrypted content) for a Responses request."""
    reasoning = body.get("reasoning")
    if not isinstance(reasoning, Mapping) or reasoning.get("effort") == "none":
        return False, False, False
    summary = reasoning.get("summary") not in (None, "none")
    include = body.get("include")
    encrypted = isinstance(include, list) and "reasoning.encrypted_content" in include
    return True, summary, encrypted
