"""OpenAI chat completions ↔ Anthropic messages, requests, answers and streams.

A client speaks one wire format and the connection chosen for it may speak the other, so the
proxy translates on the hot path. Everything here is pure: plain dicts in, plain dicts out,
nothing buffered beyond the current stream event. The translation covers what both APIs can
express — text, images, tool definitions, tool calls and results, stop sequences, sampling,
structured output, usage. What changes the answer and has no form on the other side is refused
(:class:`CannotCarry`, a 400 naming the field); what the other side has no place for and only
steers the provider's service (``logprobs``, ``seed``, ``n`` > 1 keeps one choice, …) is left
out and named in the answer's ``x-fairgate-omitted`` (:mod:`fairgate.formats.wire_loss`).

Notable decisions:

- OpenAI ``temperature`` (0..2) is clamped to Anthropic's 0..1; ``top_p`` only goes along
  without a temperature; ``top_k`` is not sent (see ``openai_to_anthropic_request``).
- Anthropic requires ``max_tokens``: ``max_completion_tokens`` > ``max_tokens`` > the default.
- Consecutive same-role messages merge (Anthropic wants alternation); ``tool`` messages become
  ``tool_result`` blocks of a user turn, placed before the turn's other content.
- A final assistant (prefill) turn loses trailing whitespace, which Anthropic rejects.
- Anthropic thinking maps to the de-facto ``reasoning_content`` field of OpenAI-compatible APIs
  (in answers and stream deltas) and back to ``thinking`` blocks.
- Usage: OpenAI's ``prompt_tokens`` includes cached tokens, Anthropic's ``input_tokens`` does
  not: ``input_tokens = prompt_tokens - cached_tokens``, ``cache_read_input_tokens = cached``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson

from fairgate.formats.usage import (
    Usage,
    merge_anthropic_usage,
    usage_from_anthropic,
    usage_from_openai,
)

__all__ = [
    "FINISH_TO_STOP",
    "STOP_TO_FINISH",
    "AnthropicToOpenAIStream",
    "CannotCarry",
    "OpenAIToAnthropicStream",
    "anthropic_to_openai_request",
    "anthropic_to_openai_response",
    "openai_to_anthropic_request",
    "openai_to_anthropic_response",
    "uses_max_completion_tokens",
]

JSON = dict[str, Any]

#: Anthropic ``stop_reason`` → OpenAI ``finish_reason``.
STOP_TO_FINISH: Mapping[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
#: OpenAI ``finish_reason`` → Anthropic ``stop_reason``.
FINISH_TO_STOP: Mapping[str, str] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}

_EMPTY_SCHEMA: JSON = {"type": "object", "properties": {}}


class CannotCarry(ValueError):
    """A request field the other wire cannot express faithfully, named (the request path
    answers 400 with it: a translation never drops what changes the answer)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


# -- small helpers ------------------------------------------------------------------------------


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _pos_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, float) and value.is_integer() and value > 0:
        return int(value)
    return None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _data_url(url: str) -> tuple[str, str] | None:
    """``data:<media>;base64,<data>`` → (media, data)."""
    if not url.startswith("data:"):
        return None
    head, sep, data = url[5:].partition(",")
    if not sep or not head.endswith(";base64"):
        return None
    return head[: -len(";base64")] or "application/octet-stream", data


def _dumps(value: object) -> str:
    try:
        return orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):
        return "{}"


def _parse_args(arguments: object) -> JSON:
    """OpenAI tool-call arguments (a JSON string) → Anthropic ``input`` (an object).

    Anthropic insists on an object; empty or unparseable arguments (a truncated answer) give
    ``{}``, and a non-object JSON value is wrapped as ``{"value": ...}``.
    """
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def _text_of(content: object, sep: str = "") -> str:
    """The text of string or list-of-parts content (both formats use ``{"type": "text"}``)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in _list(content):
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping) and part.get("type") in ("text", "input_text"):
            text = part.get("text")
            if isinstance(text, str):
                parts.append(text)
    return sep.join(parts)


def _openai_usage(u: Usage) -> JSON:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    }


def _anthropic_usage(u: Usage) -> JSON:
    cached = min(u.cached_tokens, u.prompt_tokens)
    return {
        "input_tokens": u.prompt_tokens - cached,
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def uses_max_completion_tokens(model: str) -> bool:
    """OpenAI reasoning models reject ``max_tokens``; everyone else still wants it."""
    name = model.rpartition("/")[2].lower()
    return name.startswith(("o1", "o3", "o4", "gpt-5"))


# -- OpenAI request → Anthropic request -----------------------------------------------------------


def _oa_part(part: object) -> JSON | None:
    """One OpenAI content part → one Anthropic content block (None: empty or unsupported)."""
    if isinstance(part, str):
        return {"type": "text", "text": part} if part else None
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type")
    block: JSON
    if kind in ("text", "input_text"):
        text = part.get("text")
        if not isinstance(text, str) or not text:
            return None
        block = {"type": "text", "text": text}
    elif kind == "image_url":
        img = part.get("image_url")
        url = img.get("url") if isinstance(img, Mapping) else img
        if not isinstance(url, str):
            return None
        parsed = _data_url(url)
        if parsed is not None:
            block = {
                "type": "image",
                "source": {"type": "base64", "media_type": parsed[0], "data": parsed[1]},
            }
        elif url.startswith(("https://", "http://")):
            block = {"type": "image", "source": {"type": "url", "url": url}}
        else:
            return None
    elif kind == "file":
        data = _map(part.get("file")).get("file_data")
        parsed = _data_url(data) if isinstance(data, str) else None
        if parsed is None or parsed[0] != "application/pdf":
            return None
        block = {
            "type": "document",
            "source": {"type": "base64", "media_type": parsed[0], "data": parsed[1]},
        }
    else:
        return None
    cache = part.get("cache_control")
    if isinstance(cache, Mapping):
        block["cache_control"] = dict(cache)
    return block


def _oa_blocks(content: object) -> list[JSON]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [b for p in _list(content) if (b := _oa_part(p)) is not None]


def _tool_result(msg: Mapping[str, Any]) -> JSON:
    content = msg.get("content")
    block: JSON = {"type": "tool_result", "tool_use_id": str(msg.get("tool_call_id") or "")}
    if isinstance(content, str):
        block["content"] = content
    else:
        inner = [b for b in _oa_blocks(content) if b["type"] in ("text", "image")]
        if inner:
            block["content"] = inner
    return block


def _tool_use(call: object, n: int) -> JSON | None:
    if not isinstance(call, Mapping):
        return None
    fn = _map(call.get("function"))
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        return None
    call_id = call.get("id")
    return {
        "type": "tool_use",
        "id": call_id if isinstance(call_id, str) and call_id else f"toolu_{n}",
        "name": name,
        "input": _parse_args(fn.get("arguments")),
    }


def _collapse(content: list[JSON]) -> str | list[JSON]:
    """A single plain text block becomes a string: the common case, and what clients sent."""
    if len(content) == 1:
        only = content[0]
        if only["type"] == "text" and "cache_control" not in only:
            text: str = only["text"]
            return text
    return content


def _anthropic_messages(raw: object) -> tuple[list[JSON], list[JSON]]:
    """(system text blocks, alternating messages with block-list content)."""
    system: list[JSON] = []
    messages: list[JSON] = []
    n_calls = 0
    for msg in _list(raw):
        if not isinstance(msg, Mapping):
            continue
        role = msg.get("role")
        content = msg.get("content")
        if role in ("system", "developer"):
            system.extend(b for b in _oa_blocks(content) if b["type"] == "text")
            continue
        if role == "user":
            blocks = _oa_blocks(content)
        elif role == "assistant":
            blocks = [b for b in _oa_blocks(content) if b["type"] == "text"]
            for call in _list(msg.get("tool_calls")):
                n_calls += 1
                use = _tool_use(call, n_calls)
                if use is not None:
                    blocks.append(use)
        elif role == "tool":
            role = "user"
            blocks = [_tool_result(msg)]
        else:
            continue  # legacy "function" role and unknown roles
        if not blocks:
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    _tidy_turns(messages)
    return system, messages


def _tidy_turns(messages: list[JSON]) -> None:
    """What Anthropic insists on beyond alternation: a turn's tool results before its other
    content, and no trailing whitespace (or empty text) ending a final assistant turn."""
    for m in messages:
        blocks = m["content"]
        if (
            m["role"] == "user"
            and len(blocks) > 1
            and any(b["type"] == "tool_result" for b in blocks[1:])
        ):
            # Anthropic wants a turn's tool results before its other content
            blocks.sort(key=lambda b: b["type"] != "tool_result")
    if messages and messages[-1]["role"] == "assistant":
        blocks = messages[-1]["content"]
        if blocks and blocks[-1]["type"] == "text":
            text = blocks[-1]["text"].rstrip()
            if text:
                blocks[-1] = {**blocks[-1], "text": text}
            else:
                blocks.pop()
                if not messages[-1]["content"]:
                    messages.pop()


def _tool_spec(name: str, schema_key: str, schema: object, description: object) -> JSON:
    """A function tool as either wire names it (``input_schema`` on Anthropic's, ``parameters``
    in OpenAI's ``function``): a schema that is not an object becomes the empty one, a
    description that is not a string is left out."""
    spec: JSON = {
        "name": name,
        schema_key: dict(schema) if isinstance(schema, Mapping) else dict(_EMPTY_SCHEMA),
    }
    if isinstance(description, str):
        spec["description"] = description
    return spec


def _anthropic_tools(tools: object) -> list[JSON]:
    out: list[JSON] = []
    for tool in _list(tools):
        if not isinstance(tool, Mapping):
            continue
        if "input_schema" in tool:  # already Anthropic-shaped
            out.append(dict(tool))
            continue
        if tool.get("type") != "function":
            continue
        fn = _map(tool.get("function"))
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            continue
        spec = _tool_spec(name, "input_schema", fn.get("parameters"), fn.get("description"))
        if isinstance(tool.get("cache_control"), Mapping):
            spec["cache_control"] = dict(tool["cache_control"])
        out.append(spec)
    return out


def _anthropic_tool_choice(choice: object) -> JSON | None:
    if choice == "auto":
        return {"type": "auto"}
    if choice == "required":
        return {"type": "any"}
    if choice == "none":
        return {"type": "none"}
    if isinstance(choice, Mapping):
        name = _map(choice.get("function")).get("name")
        if isinstance(name, str) and name:
            return {"type": "tool", "name": name}
    return None


def anthropic_output_format(response_format: object) -> JSON | None:
    """Chat ``response_format`` → Anthropic's structured-output form (``output_config.format``,
    generally available; the JSON is the answer's text). ``json_schema`` carries over whole;
    ``json_object`` (any JSON object) has no Anthropic form: :class:`CannotCarry`, since
    answering free text to a client that parses JSON would be a silent loss."""
    rf = _map(response_format)
    kind = rf.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_schema":
        schema = _map(rf.get("json_schema")).get("schema")
        if not isinstance(schema, Mapping):
            raise CannotCarry("response_format.json_schema.schema", "a JSON schema is required")
        return {"type": "json_schema", "schema": dict(schema)}
    raise CannotCarry(
        "response_format",
        f"{kind!r} has no Anthropic form: send a json_schema (structured outputs)",
    )


def chat_response_format(fmt: object) -> JSON | None:
    """An Anthropic structured-output format (``output_config.format`` or the beta
    ``output_format``) → chat ``response_format`` (``json_schema``, named ``output``)."""
    f = _map(fmt)
    if f.get("type") != "json_schema" or not isinstance(f.get("schema"), Mapping):
        return None
    return {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": dict(f["schema"]), "strict": True},
    }


def openai_to_anthropic_request(
    body: Mapping[str, Any],
    model: str,
    default_max_tokens: int = 1024,
    *,
    sampling: bool = True,
) -> JSON:
    """An OpenAI ``/v1/chat/completions`` body → an Anthropic ``/v1/messages`` body.

    Sampling: ``temperature`` (clamped to 0..1) is sent, else ``top_p`` — never both, which
    newer Claude models reject. Pass ``sampling=False`` for an upstream that refuses sampling
    parameters altogether (API version 2026-10-21 and later, and some newer models even on
    2023-06-01); the 2.x Anthropic SDK no longer has them.
    """
    system, messages = _anthropic_messages(body.get("messages"))
    max_tokens = (
        _pos_int(body.get("max_completion_tokens"))
        or _pos_int(body.get("max_tokens"))
        or default_max_tokens
    )
    out: JSON = {"model": model, "messages": messages, "max_tokens": max_tokens}
    if system:
        if any("cache_control" in b for b in system):
            out["system"] = system
        else:
            out["system"] = "\n\n".join(b["text"] for b in system)
    for m in messages:
        m["content"] = _collapse(m["content"])
    if sampling:
        temperature = _number(body.get("temperature"))
        top_p = _number(body.get("top_p"))
        if temperature is not None:
            out["temperature"] = min(max(temperature, 0.0), 1.0)
        elif top_p is not None:  # newer Claude models reject temperature and top_p together
            out["top_p"] = top_p
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else _list(stop)
    stops = [s for s in stops if isinstance(s, str) and s.strip()]
    if stops:
        out["stop_sequences"] = stops
    if body.get("stream") is True:
        out["stream"] = True
    tools = _anthropic_tools(body.get("tools"))
    if tools:
        out["tools"] = tools
        choice = _anthropic_tool_choice(body.get("tool_choice"))
        if body.get("parallel_tool_calls") is False and (
            choice is None or choice["type"] != "none"
        ):
            choice = choice or {"type": "auto"}
            choice["disable_parallel_tool_use"] = True
        if choice is not None:
            out["tool_choice"] = choice
    user = _map(body.get("metadata")).get("user") or body.get("user")
    if isinstance(user, str) and user:
        out["metadata"] = {"user_id": user}
    fmt = anthropic_output_format(body.get("response_format"))
    if fmt is not None:
        out["output_config"] = {"format": fmt}
    thinking = body.get("thinking")
    if isinstance(thinking, Mapping):  # an Anthropic option some OpenAI-format clients send
        out["thinking"] = dict(thinking)
        out.pop("temperature", None)  # Anthropic rejects sampling changes while thinking
        out.pop("top_p", None)
    return out


# -- Anthropic request → OpenAI request -----------------------------------------------------------


def _an_part(block: Mapping[str, Any]) -> JSON | None:
    """One Anthropic user content block → one OpenAI content part (None: unsupported)."""
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        return {"type": "text", "text": text} if isinstance(text, str) else None
    source = _map(block.get("source"))
    src_type = source.get("type")
    if kind == "image":
        if src_type == "base64":
            url = f"data:{source.get('media_type')};base64,{source.get('data')}"
        elif src_type == "url" and isinstance(source.get("url"), str):
            url = source["url"]
        else:
            return None
        return {"type": "image_url", "image_url": {"url": url}}
    if (
        kind == "document"
        and src_type == "base64"
        and source.get("media_type") == "application/pdf"
    ):
        data_url = f"data:application/pdf;base64,{source.get('data')}"
        return {"type": "file", "file": {"file_data": data_url, "filename": "document.pdf"}}
    return None


def _tool_call_of(block: Mapping[str, Any]) -> JSON:
    """An Anthropic ``tool_use`` block → an OpenAI ``tool_calls`` entry: one mapping for the
    request's history and the answer alike, so the two never drift apart."""
    return {
        "id": str(block.get("id") or ""),
        "type": "function",
        "function": {
            "name": str(block.get("name") or ""),
            "arguments": _dumps(block.get("input") or {}),
        },
    }


def _openai_messages(raw: object) -> list[JSON]:
    out: list[JSON] = []
    for msg in _list(raw):
        if not isinstance(msg, Mapping):
            continue
        role = msg.get("role")
        content = msg.get("content")
        if role not in ("user", "assistant"):
            continue
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        blocks = [b for b in _list(content) if isinstance(b, Mapping)]
        if role == "assistant":
            texts: list[str] = []
            calls: list[JSON] = []
            for b in blocks:  # thinking is dropped: OpenAI-compatible APIs reject it as input
                kind = b.get("type")
                if kind == "text" and isinstance(b.get("text"), str):
                    texts.append(b["text"])
                elif kind == "tool_use":
                    calls.append(_tool_call_of(b))
            message: JSON = {
                "role": "assistant",
                "content": "".join(texts) if texts or not calls else None,
            }
            if calls:
                message["tool_calls"] = calls
            out.append(message)
            continue
        parts: list[JSON] = []
        for b in blocks:
            if b.get("type") == "tool_result":
                inner = b.get("content")
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(b.get("tool_use_id") or ""),
                        "content": _text_of(inner, "\n") if inner is not None else "",
                    }
                )
            else:
                part = _an_part(b)
                if part is not None:
                    parts.append(part)
        if parts:
            if len(parts) == 1 and parts[0]["type"] == "text":
                out.append({"role": "user", "content": parts[0]["text"]})
            else:
                out.append({"role": "user", "content": parts})
    return out


def _openai_tools(tools: object) -> list[JSON]:
    out: list[JSON] = []
    for tool in _list(tools):
        if not isinstance(tool, Mapping) or tool.get("type") not in (None, "custom"):
            continue  # server tools (web search, bash, ...) have no OpenAI equivalent
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            continue
        fn = _tool_spec(name, "parameters", tool.get("input_schema"), tool.get("description"))
        out.append({"type": "function", "function": fn})
    return out


def anthropic_to_openai_request(body: Mapping[str, Any], model: str) -> JSON:
    """An Anthropic ``/v1/messages`` body → an OpenAI ``/v1/chat/completions`` body.

    Streams always ask for the usage chunk (``stream_options.include_usage``): settlement needs
    real token counts. ``max_tokens`` is sent as ``max_completion_tokens`` to OpenAI reasoning
    models (o1/o3/o4/gpt-5), which reject the old name, and as ``max_tokens`` to everyone else.
    """
    messages: list[JSON] = []
    system = body.get("system")
    system_text = _text_of(system, "\n\n")
    if system_text:
        messages.append({"role": "system", "content": system_text})
    messages.extend(_openai_messages(body.get("messages")))
    out: JSON = {"model": model, "messages": messages}
    max_tokens = _pos_int(body.get("max_tokens"))
    if max_tokens is not None:
        key = "max_completion_tokens" if uses_max_completion_tokens(model) else "max_tokens"
        out[key] = max_tokens
    for name in ("temperature", "top_p"):
        value = _number(body.get(name))
        if value is not None:
            out[name] = value
    stops = [s for s in _list(body.get("stop_sequences")) if isinstance(s, str)]
    if stops:
        out["stop"] = stops
    if body.get("stream") is True:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    tools = _openai_tools(body.get("tools"))
    if tools:
        out["tools"] = tools
        choice = _map(body.get("tool_choice"))
        kind = choice.get("type")
        if kind == "auto":
            out["tool_choice"] = "auto"
        elif kind == "any":
            out["tool_choice"] = "required"
        elif kind == "none":
            out["tool_choice"] = "none"
        elif kind == "tool" and isinstance(choice.get("name"), str):
            out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        if choice.get("disable_parallel_tool_use") is True:
            out["parallel_tool_calls"] = False
    user = _map(body.get("metadata")).get("user_id")
    if isinstance(user, str) and user:
        out["user"] = user
    rf = _chat_format_of(body)
    if rf is not None:
        out["response_format"] = rf
    return out


def _chat_format_of(body: Mapping[str, Any]) -> JSON | None:
    """An Anthropic body's structured output as chat ``response_format`` (None: free text)."""
    fmt = _map(body.get("output_config")).get("format") or body.get("output_format")
    if fmt is None:
        return None
    rf = chat_response_format(fmt)
    if rf is None:
        raise CannotCarry("output_config.format", "only a json_schema format can be carried")
    return rf


# -- answers --------------------------------------------------------------------------------------


def chat_answer_message(texts: list[str], calls: list[JSON], reasoning: str | None) -> JSON:
    """The assistant message of a chat completion translated from another wire: content
    ``None`` when the answer is only tool calls (as OpenAI writes it), the calls and the
    reasoning (``reasoning_content``, left out when ``None``) only when there are some."""
    message: JSON = {
        "role": "assistant",
        "content": "".join(texts) if texts or not calls else None,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def _mapped(reason: object, table: Mapping[str, str], default: str) -> str:
    """A stop or finish reason in the other wire's words (``default`` for one it lacks)."""
    return table.get(reason, default) if isinstance(reason, str) else default


def answer_id(resp: Mapping[str, Any], prefix: str) -> str:
    """The upstream answer's own id, kept through a translation; one made up (``prefix``
    and the time) where it sent none."""
    rid = resp.get("id")
    return rid if isinstance(rid, str) and rid else f"{prefix}{time.time_ns():x}"


def anthropic_to_openai_response(resp: Mapping[str, Any], model: str, *, created: int) -> JSON:
    """An Anthropic message → an OpenAI ``chat.completion``. ``created`` (seconds) is the
    caller's: the gateway's clock, so that a test clock or a replayed trace stamps it too."""
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[JSON] = []
    for block in _list(resp.get("content")):
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            calls.append(_tool_call_of(block))
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
    message = chat_answer_message(texts, calls, "".join(reasoning) if reasoning else None)
    finish = _mapped(resp.get("stop_reason"), STOP_TO_FINISH, "stop")
    usage = usage_from_anthropic(resp) or Usage()
    return {
        "id": answer_id(resp, "chatcmpl-"),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": _openai_usage(usage),
    }


def openai_to_anthropic_response(resp: Mapping[str, Any], model: str) -> JSON:
    """An OpenAI ``chat.completion`` → an Anthropic message (first choice only)."""
    choices = _list(resp.get("choices"))
    choice = _map(choices[0]) if choices else {}
    message = _map(choice.get("message"))
    content: list[JSON] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = _text_of(message.get("content"))
    if text:
        content.append({"type": "text", "text": text})
    for n, call in enumerate(_list(message.get("tool_calls")), 1):
        use = _tool_use(call, n)
        if use is not None:
            content.append(use)
    stop = _mapped(choice.get("finish_reason"), FINISH_TO_STOP, "end_turn")
    usage = usage_from_openai(resp) or Usage()
    return {
        "id": answer_id(resp, "msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": _anthropic_usage(usage),
    }


# -- streams --------------------------------------------------------------------------------------


class ChatChunks:
    """The ``chat.completion.chunk`` envelope every stream that speaks OpenAI chat writes: one
    place for its fixed fields, shared by the Anthropic and the Responses stream translators.
    A subclass calls ``super().__init__`` and adds its own state."""

    __slots__ = ("_base", "_include_usage")

    def __init__(self, model: str, include_usage: bool, created: int, id: str) -> None:
        self._base: JSON = {
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        self._include_usage = include_usage

    def _chunk(self, delta: JSON, finish: str | None = None) -> JSON:
        return {
            **self._base,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    def _usage_chunk(self, usage: JSON) -> JSON:
        """The usage chunk (``choices: []``) sent last when the client asked for usage."""
        return {**self._base, "choices": [], "usage": usage}


class AnthropicToOpenAIStream(ChatChunks):
    """Anthropic stream events → OpenAI ``chat.completion.chunk`` dicts, one event at a time.

    ``feed(event, data)`` takes the SSE event name (may be None; ``data["type"]`` is used) and
    the parsed data. Mapping: ``message_start`` → role chunk; ``text_delta`` → content;
    ``thinking_delta`` → ``reasoning_content``; ``tool_use`` start / ``input_json_delta`` → tool
    call deltas; ``message_delta`` → the finish chunk and, with ``include_usage``, the usage
    chunk (``choices: []``; input from ``message_start``, output from ``message_delta``);
    ``error`` → an OpenAI-style ``{"error": {...}}`` object (not a chunk) and ``done``.
    ``done`` turns True at ``message_stop`` or ``error``; the caller then sends ``[DONE]``.
    """

    __slots__ = ("_finished", "_seen", "_tools", "done")

    def __init__(self, model: str, include_usage: bool, created: int, id: str) -> None:
        super().__init__(model, include_usage, created, id)
        self._tools: dict[Any, int] = {}  # Anthropic block index → OpenAI tool_calls index
        self._seen: dict[str, Any] = {}  # the usage fields so far, the latest of each
        self._finished = False
        self.done = False

    @property
    def usage(self) -> Usage:
        return usage_from_anthropic({"usage": self._seen}) or Usage()

    def _take_usage(self, usage: object) -> None:
        """Anthropic usage fields are cumulative: the latest value of each one wins (the one
        rule the passthrough relay uses too, :func:`merge_anthropic_usage`)."""
        merge_anthropic_usage(self._seen, usage)

    def _close(self, stop_reason: object) -> list[JSON]:
        self._finished = True
        finish = _mapped(stop_reason, STOP_TO_FINISH, "stop")
        out = [self._chunk({}, finish)]
        if self._include_usage:
            out.append(self._usage_chunk(_openai_usage(self.usage)))
        return out

    def _delta(self, data: Mapping[str, Any]) -> list[JSON]:
        """A ``content_block_delta``: text, tool-call arguments or thinking."""
        delta = _map(data.get("delta"))
        dtype = delta.get("type")
        if dtype == "text_delta":
            text = delta.get("text")
            return [self._chunk({"content": text})] if isinstance(text, str) and text else []
        if dtype == "input_json_delta":
            partial = delta.get("partial_json")
            index = self._tools.get(data.get("index"))
            if index is None or not isinstance(partial, str) or not partial:
                return []
            call = {"index": index, "function": {"arguments": partial}}
            return [self._chunk({"tool_calls": [call]})]
        if dtype == "thinking_delta":
            thinking = delta.get("thinking")
            if isinstance(thinking, str) and thinking:
                return [self._chunk({"reasoning_content": thinking})]
        return []

    def feed(self, event: str | None, data: Mapping[str, Any]) -> list[JSON]:
        if self.done:
            return []
        kind = data.get("type") or event
        if kind == "content_block_delta":  # the hot path: one per token batch
            return self._delta(data)
        if kind == "message_start":
            self._take_usage(_map(data.get("message")).get("usage"))
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            block = _map(data.get("content_block"))
            btype = block.get("type")
            if btype == "tool_use":
                index = len(self._tools)
                self._tools[data.get("index")] = index
                call = {
                    "index": index,
                    "id": str(block.get("id") or f"call_{index}"),
                    "type": "function",
                    "function": {"name": str(block.get("name") or ""), "arguments": ""},
                }
                return [self._chunk({"tool_calls": [call]})]
            text = block.get("text")
            if btype == "text" and isinstance(text, str) and text:
                return [self._chunk({"content": text})]
            return []
        if kind == "message_delta":
            self._take_usage(data.get("usage"))
            if self._finished:
                return []
            return self._close(_map(data.get("delta")).get("stop_reason"))
        if kind == "message_stop":
            self.done = True
            return [] if self._finished else self._close(None)
        if kind == "error":
            self.done = True
            err = _map(data.get("error"))
            message = err.get("message")
            return [
                {
                    "error": {
                        "message": message if isinstance(message, str) else "upstream error",
                        "type": str(err.get("type") or "api_error"),
                        "code": None,
                    }
                }
            ]
        return []  # ping, content_block_stop, unknown events

    def finish(self) -> list[JSON]:
        """Close a stream that ended without ``message_stop`` (finish and usage chunks once)."""
        if self.done:
            return []
        self.done = True
        return [] if self._finished else self._close(None)


class OpenAIToAnthropicStream:
    """OpenAI ``chat.completion.chunk`` dicts → Anthropic ``(event, data)`` pairs.

    The output is a valid Anthropic sequence: ``message_start``; for each text / reasoning /
    tool call run a ``content_block_start``, its ``content_block_delta`` events and a
    ``content_block_stop``; then ``message_delta`` (stop reason and usage) and ``message_stop``.

    When the closing events go out: OpenAI sends ``finish_reason`` first and the usage chunk
    (``choices: []``) after it, but Anthropic's ``message_delta`` must carry the output tokens.
    So the open block is closed at the finish chunk, and ``message_delta`` + ``message_stop``
    wait until both the finish reason and the usage are in: they go out with the usage chunk
    (``choices: []``) when it follows the finish chunk, else on ``finish()`` (call it on
    ``[DONE]`` and at the end of the stream) — exactly once either way. An upstream that never
    sends a usage chunk is closed by ``finish()`` with whatever usage it did see.

    ``input_tokens`` (an estimate) fills ``message_start``; the real counts follow in
    ``message_delta``. An upstream error chunk (``{"error": ...}``) becomes an ``error`` event
    and ends the stream.
    """

    __slots__ = (
        "_block",
        "_closed",
        "_id",
        "_input_estimate",
        "_kind",
        "_model",
        "_next",
        "_pending",
        "_started",
        "_stop",
        "_tool_ids",
        "_tools",
        "_usage",
    )

    def __init__(self, model: str, id: str, *, input_tokens: int = 0) -> None:
        self._model = model
        self._id = id
        self._input_estimate = input_tokens
        self._started = False
        self._closed = False
        self._block = -1  # index of the open content block, -1 when none is open
        self._kind: str | None = None  # "text" | "thinking" | "tool"
        self._next = 0
        self._tools: dict[Any, int] = {}  # OpenAI tool_call index → Anthropic block index
        self._tool_ids: dict[Any, str] = {}
        # calls that began while another call's block was open: held whole (its block, its
        # argument pieces) and sent after it, because an Anthropic block cannot take deltas
        # once the next one has started
        self._pending: dict[Any, tuple[JSON, list[str]]] = {}
        self._stop: str | None = None
        self._usage: Usage | None = None

    @property
    def usage(self) -> Usage:
        return self._usage or Usage()

    @property
    def done(self) -> bool:
        return self._closed

    def _start(self, out: list[tuple[str, JSON]]) -> None:
        self._started = True
        message: JSON = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._input_estimate, "output_tokens": 0},
        }
        out.append(("message_start", {"type": "message_start", "message": message}))

    def _stop_block(self, out: list[tuple[str, JSON]]) -> None:
        if self._block >= 0:
            out.append(("content_block_stop", {"type": "content_block_stop", "index": self._block}))
            self._block = -1
            self._kind = None

    def _open(self, out: list[tuple[str, JSON]], kind: str, block: JSON) -> int:
        self._stop_block(out)
        index = self._next
        self._next += 1
        self._block = index
        self._kind = kind
        out.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": block},
            )
        )
        return index

    def _delta(self, out: list[tuple[str, JSON]], index: int, delta: JSON) -> None:
        out.append(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        )

    def _tool_calls(self, out: list[tuple[str, JSON]], calls: list[Any]) -> None:
        """OpenAI streams parallel tool calls by ``index``, and some upstreams interleave them
        (``start:0 start:1 args:0 args:1``). The first call streams live in its block; a call
        that begins while another's block is open is held whole and sent after it
        (:meth:`_flush_pending`), so every argument lands inside its own block: a delta after
        its block's stop reached Claude Code as ``input: {}``."""
        for call in calls:
            if not isinstance(call, Mapping):
                continue
            key = call.get("index", 0)
            call_id = call.get("id")
            fn = _map(call.get("function"))
            known = (key in self._tools or key in self._pending) and not (
                isinstance(call_id, str) and call_id and self._tool_ids.get(key) != call_id
            )
            if not known:
                tool_id = (
                    call_id if isinstance(call_id, str) and call_id else f"toolu_{self._id}_{key}"
                )
                self._tool_ids[key] = tool_id
                name = fn.get("name")
                block = {
                    "type": "tool_use",
                    "id": tool_id,
                    "name": name if isinstance(name, str) else "",
                    "input": {},
                }
                if self._kind == "tool" or self._pending:
                    self._pending[key] = (block, [])
                    self._tools.pop(key, None)
                else:
                    self._tools[key] = self._open(out, "tool", block)
            args = fn.get("arguments")
            if not (isinstance(args, str) and args):
                continue
            if key in self._pending:
                self._pending[key][1].append(args)
            else:
                self._delta(
                    out, self._tools[key], {"type": "input_json_delta", "partial_json": args}
                )

    def _flush_pending(self, out: list[tuple[str, JSON]]) -> None:
        """The held calls, each as a whole block, in the order they began."""
        for key, (block, pieces) in self._pending.items():
            index = self._open(out, "tool", block)
            self._tools[key] = index
            if pieces:
                delta = {"type": "input_json_delta", "partial_json": "".join(pieces)}
                self._delta(out, index, delta)
        self._pending.clear()
        self._stop_block(out)

    def _close(self, out: list[tuple[str, JSON]]) -> None:
        if not self._started:
            self._start(out)
        self._stop_block(out)
        self._flush_pending(out)
        usage: JSON = {"output_tokens": 0}
        if self._usage is not None:
            usage = _anthropic_usage(self._usage)
            del usage["cache_creation_input_tokens"]
        delta = {"stop_reason": self._stop or "end_turn", "stop_sequence": None}
        out.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        out.append(("message_stop", {"type": "message_stop"}))
        self._closed = True

    def feed(self, chunk: Mapping[str, Any]) -> list[tuple[str, JSON]]:
        if self._closed:
            return []
        out: list[tuple[str, JSON]] = []
        error = chunk.get("error")
        if error is not None:
            err = _map(error)
            message = err.get("message") if err else error
            payload = {
                "type": "error",
                "error": {
                    "type": str(err.get("type") or "api_error"),
                    "message": message if isinstance(message, str) else "upstream error",
                },
            }
            out.append(("error", payload))
            self._closed = True
            return out
        if not self._started:
            self._start(out)
        usage = chunk.get("usage")
        if usage is not None:
            parsed = usage_from_openai(chunk)
            if parsed is not None:
                self._usage = parsed
        choices = chunk.get("choices")
        if isinstance(choices, list) and choices:
            choice = choices[0]
            if isinstance(choice, Mapping):
                delta = _map(choice.get("delta"))
                reasoning = delta.get("reasoning_content")
                if isinstance(reasoning, str) and reasoning:
                    if self._kind != "thinking":
                        self._open(
                            out, "thinking", {"type": "thinking", "thinking": "", "signature": ""}
                        )
                    self._delta(out, self._block, {"type": "thinking_delta", "thinking": reasoning})
                text = delta.get("content")
                if isinstance(text, str) and text:
                    if self._kind != "text":
                        self._open(out, "text", {"type": "text", "text": ""})
                    self._delta(out, self._block, {"type": "text_delta", "text": text})
                calls = delta.get("tool_calls")
                if isinstance(calls, list):
                    self._tool_calls(out, calls)
                finish = choice.get("finish_reason")
                if isinstance(finish, str) and finish:
                    self._stop = FINISH_TO_STOP.get(finish, "end_turn")
                    self._stop_block(out)
                    self._flush_pending(out)
        elif self._stop is not None and self._usage is not None:
            self._close(out)  # the usage chunk after the finish chunk
        return out

    def finish(self) -> list[tuple[str, JSON]]:
        """Close the message (``[DONE]`` or the upstream ended); a no-op once closed."""
        if self._closed:
            return []
        out: list[tuple[str, JSON]] = []
        self._close(out)
        return out
