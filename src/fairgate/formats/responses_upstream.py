"""fairgate's chat form → a Responses-wire upstream (the Codex backend) and its answers back.

The Codex backend (what the Codex CLI calls with a ChatGPT subscription) speaks only the OpenAI
Responses API, and only streaming: the CLI always sends ``stream: true`` and ``store: false``,
the system prompt as ``instructions`` and the conversation as ``input`` items. So a chat request
bound for such a connection is translated here, always asked as a stream, and the upstream's
events are turned back into chat chunks (``ResponsesToChatStream``) — or, for a client that did
not ask for a stream, folded into one chat completion from ``response.completed``, which
carries the whole response (``chat_from_completed``). Pure: plain dicts in and out.

What maps where:

- system / developer messages → ``instructions`` (joined by blank lines); user and assistant
  turns → ``message`` items (``input_text`` / ``output_text`` / ``input_image`` parts);
  assistant ``tool_calls`` → ``function_call`` items; ``tool`` messages →
  ``function_call_output`` items.
- Function tools are flattened (``{"type": "function", "name", "parameters"}``); the sampling
  and length options are not sent: the Codex backend rejects ``max_output_tokens`` and
  ``temperature`` for its models, and the subscription has no per-request token budget.
- Events: ``response.output_text.delta`` → content; ``response.output_item.added`` of a
  ``function_call`` → a tool-call start; ``response.function_call_arguments.delta`` → its
  arguments; ``response.completed`` / ``response.incomplete`` → the finish chunk and usage;
  ``response.failed`` / ``error`` → an OpenAI-style error object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from fairgate.formats.sse import SSEParser
from fairgate.formats.translate import (
    ChatChunks,
    _dumps,
    _list,
    _map,
    _openai_usage,
    _text_of,
    answer_id,
    anthropic_to_openai_request,
    chat_answer_message,
    openai_to_anthropic_response,
)
from fairgate.formats.usage import Usage, usage_from_openai

__all__ = [
    "ResponsesToChatStream",
    "chat_from_completed",
    "chat_to_responses_request",
    "completed_of",
    "upstream_responses_answer",
    "upstream_responses_body",
]

JSON = dict[str, Any]


def _input_part(part: object, role: str) -> JSON | None:
    text_kind = "output_text" if role == "assistant" else "input_text"
    if isinstance(part, str):
        return {"type": text_kind, "text": part}
    p = _map(part)
    if p.get("type") == "text" and isinstance(p.get("text"), str):
        return {"type": text_kind, "text": p["text"]}
    if p.get("type") == "image_url" and role == "user":
        url = _map(p.get("image_url")).get("url")
        return {"type": "input_image", "image_url": url} if isinstance(url, str) else None
    return None


def _message_item(role: str, content: object) -> JSON | None:
    raw = [content] if isinstance(content, str) else _list(content)
    parts = [p for c in raw if (p := _input_part(c, role)) is not None]
    return {"type": "message", "role": role, "content": parts} if parts else None


def _items(msg: Mapping[str, Any]) -> list[JSON]:
    role = msg.get("role")
    if role == "tool":
        output = msg.get("content")
        return [
            {
                "type": "function_call_output",
                "call_id": str(msg.get("tool_call_id") or ""),
                "output": output if isinstance(output, str) else _text_of(output),
            }
        ]
    if role not in ("user", "assistant"):
        return []
    out: list[JSON] = []
    item = _message_item(str(role), msg.get("content"))
    if item is not None:
        out.append(item)
    for call in _list(msg.get("tool_calls")):
        fn = _map(_map(call).get("function"))
        args = fn.get("arguments")
        out.append(
            {
                "type": "function_call",
                "call_id": str(_map(call).get("id") or ""),
                "name": str(fn.get("name") or ""),
                "arguments": args if isinstance(args, str) else _dumps(args or {}),
            }
        )
    return out


def _tools(tools: object) -> list[JSON]:
    out: list[JSON] = []
    for raw in _list(tools):
        fn = _map(_map(raw).get("function"))
        if not isinstance(fn.get("name"), str):
            continue
        tool: JSON = {
            "type": "function",
            "name": fn["name"],
            "parameters": fn.get("parameters") or {"type": "object", "properties": {}},
        }
        if isinstance(fn.get("description"), str):
            tool["description"] = fn["description"]
        if isinstance(fn.get("strict"), bool):
            tool["strict"] = fn["strict"]
        out.append(tool)
    return out


def _tool_choice(choice: object) -> object:
    if isinstance(choice, str):
        return choice
    name = _map(_map(choice).get("function")).get("name")
    return {"type": "function", "name": name} if isinstance(name, str) else "auto"


def chat_to_responses_request(body: Mapping[str, Any], model: str) -> JSON:
    """A chat-completions request → the Responses request the Codex backend takes."""
    instructions: list[str] = []
    items: list[JSON] = []
    for raw in _list(body.get("messages")):
        msg = _map(raw)
        if msg.get("role") in ("system", "developer"):
            text = _text_of(msg.get("content"))
            if text:
                instructions.append(text)
        else:
            items.extend(_items(msg))
    out: JSON = {
        "model": model,
        "instructions": "\n\n".join(instructions),
        "input": items,
        "tools": _tools(body.get("tools")),
        "tool_choice": _tool_choice(body.get("tool_choice", "auto")),
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "store": False,
        "stream": True,
        "include": [],
    }
    effort = body.get("reasoning_effort")
    if isinstance(effort, str):
        out["reasoning"] = {"effort": effort}
    fmt = _text_format(body.get("response_format"))
    if fmt is not None:
        out["text"] = {"format": fmt}
    return out


def _text_format(response_format: object) -> JSON | None:
    """Chat ``response_format`` → the Responses API's ``text.format`` (the schema's fields
    beside its ``type``, not nested under ``json_schema``)."""
    rf = _map(response_format)
    kind = rf.get("type")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        js = _map(rf.get("json_schema"))
        fmt: JSON = {"type": "json_schema", "name": str(js.get("name") or "output")}
        fmt.update({k: js[k] for k in ("schema", "strict", "description") if k in js})
        return fmt
    return None


# -- answers ----------------------------------------------------------------------------------


def _finish_reason(resp: Mapping[str, Any], has_calls: bool) -> str:
    if resp.get("status") == "incomplete":
        reason = _map(resp.get("incomplete_details")).get("reason")
        return "content_filter" if reason == "content_filter" else "length"
    return "tool_calls" if has_calls else "stop"


def chat_from_completed(resp: Mapping[str, Any], model: str, *, created: int) -> JSON:
    """A whole Responses object (a non-stream answer, or ``response.completed``'s) → one chat
    completion; ``created`` is the upstream's ``created_at`` when it gave one, else the
    caller's clock (never this module's own)."""
    texts: list[str] = []
    calls: list[JSON] = []
    reasoning: list[str] = []
    for raw in _list(resp.get("output")):
        item = _map(raw)
        if item.get("type") == "reasoning":
            parts = [*_list(item.get("summary")), *_list(item.get("content"))]
            reasoning.extend(str(_map(p).get("text") or "") for p in parts)
        elif item.get("type") == "message":
            texts.extend(
                str(p.get("text") or "")
                for p in map(_map, _list(item.get("content")))
                if p.get("type") == "output_text"
            )
        elif item.get("type") == "function_call":
            calls.append(
                {
                    "id": str(item.get("call_id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(item.get("name") or ""),
                        "arguments": str(item.get("arguments") or ""),
                    },
                }
            )
    message = chat_answer_message(texts, calls, "".join(reasoning) if any(reasoning) else None)
    usage = usage_from_openai(resp) or Usage()
    return {
        "id": answer_id(resp, "chatcmpl-"),
        "object": "chat.completion",
        "created": stamp if isinstance(stamp := resp.get("created_at"), int) else created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": _finish_reason(resp, bool(calls)),
                "logprobs": None,
            }
        ],
        "usage": _openai_usage(usage),
    }


class ResponsesToChatStream(ChatChunks):
    """Responses stream events → chat ``chat.completion.chunk`` dicts, one event at a time.

    ``feed(event, data)`` takes the SSE event name (may be None; ``data["type"]`` wins) and the
    parsed data. ``done`` turns True at ``response.completed`` / ``.incomplete`` / ``.failed`` /
    ``error``; ``usage`` is the usage the upstream reported (None until then). ``completed``
    holds the final response object, for callers that fold the stream into one answer.
    """

    def __init__(self, model: str, include_usage: bool, created: int, id: str) -> None:
        super().__init__(model, include_usage, created, id)
        self._calls: dict[str, int] = {}  # Responses item id → chat tool-call index
        self._started = False
        self.usage: Usage | None = None
        self.completed: JSON | None = None
        self.done = False

    def _role(self) -> list[JSON]:
        if self._started:
            return []
        self._started = True
        return [self._chunk({"role": "assistant", "content": ""})]

    def _call_start(self, item: Mapping[str, Any]) -> list[JSON]:
        index = len(self._calls)
        self._calls[str(item.get("id") or index)] = index
        call = {
            "index": index,
            "id": str(item.get("call_id") or f"call_{index}"),
            "type": "function",
            "function": {"name": str(item.get("name") or ""), "arguments": ""},
        }
        return [*self._role(), self._chunk({"tool_calls": [call]})]

    def _close(self, resp: Mapping[str, Any]) -> list[JSON]:
        self.done = True
        self.completed = dict(resp)
        self.usage = usage_from_openai(resp)
        finish = _finish_reason(resp, bool(self._calls))
        out = [*self._role(), self._chunk({}, finish)]
        if self._include_usage:
            out.append(self._usage_chunk(_openai_usage(self.usage or Usage())))
        return out

    def _error(self, message: object, kind: object) -> list[JSON]:
        self.done = True
        text = message if isinstance(message, str) and message else "upstream error"
        return [{"error": {"message": text, "type": str(kind or "api_error"), "code": None}}]

    def feed(self, event: str | None, data: Mapping[str, Any]) -> list[JSON]:
        if self.done:
            return []
        kind = data.get("type") or event
        if kind == "response.output_text.delta":  # the hot path
            delta = data.get("delta")
            if not isinstance(delta, str) or not delta:
                return []
            return [*self._role(), self._chunk({"content": delta})]
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            delta = data.get("delta")  # the reasoning the upstream shows: the chat form's field
            if not isinstance(delta, str) or not delta:
                return []
            return [*self._role(), self._chunk({"reasoning_content": delta})]
        if kind == "response.function_call_arguments.delta":
            index = self._calls.get(str(data.get("item_id")))
            delta = data.get("delta")
            if index is None or not isinstance(delta, str) or not delta:
                return []
            return [
                self._chunk({"tool_calls": [{"index": index, "function": {"arguments": delta}}]})
            ]
        if kind == "response.output_item.added":
            item = _map(data.get("item"))
            return self._call_start(item) if item.get("type") == "function_call" else []
        if kind == "response.created":
            return self._role()
        if kind in ("response.completed", "response.incomplete"):
            return self._close(_map(data.get("response")))
        if kind == "response.failed":
            err = _map(_map(data.get("response")).get("error"))
            return self._error(err.get("message"), err.get("code"))
        if kind == "error":
            return self._error(data.get("message"), data.get("code"))
        return []  # in_progress, content parts, done events, reasoning, unknown

    def finish(self) -> list[JSON]:
        """A stream that ended without ``response.completed`` was cut off: an error object."""
        if self.done:
            return []
        return self._error("the upstream stream ended before response.completed", "api_error")


# -- the proxy's two entry points ---------------------------------------------------------------


def upstream_responses_body(
    anthropic_client: bool, body: Mapping[str, Any], model: str
) -> tuple[bytes, bool]:
    """The request for a Responses-wire connection, and whether the client asked for stream
    usage (an Anthropic client always gets it in ``message_delta``)."""
    if anthropic_client:
        chat = anthropic_to_openai_request(body, model)
        wants_usage = True
    else:
        chat = dict(body)
        opts = body.get("stream_options")
        wants_usage = isinstance(opts, Mapping) and bool(opts.get("include_usage"))
    return orjson.dumps(chat_to_responses_request(chat, model)), wants_usage


def completed_of(raw: bytes) -> JSON | None:
    """The final response object of a whole Responses event stream (or of a plain JSON
    answer, for an upstream that answered without streaming)."""
    stripped = raw.lstrip()
    if stripped.startswith(b"{"):
        try:
            obj = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            return None
        return obj if isinstance(obj, dict) else None
    parser = SSEParser()
    found: JSON | None = None
    for ev in [*parser.feed(raw), *parser.flush()]:
        try:
            data = orjson.loads(ev.data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(data, dict) and data.get("type") in (
            "response.completed",
            "response.incomplete",
            "response.failed",
        ):
            resp = data.get("response")
            found = dict(resp) if isinstance(resp, Mapping) else None
    return found


def upstream_responses_answer(
    raw: bytes, anthropic_client: bool, model: str, *, created: int
) -> tuple[bytes, Usage | None, JSON | None]:
    """A non-stream client's answer from a Responses-wire upstream's whole stream: the
    client's format, the usage, and the parsed answer (None when there was no final response:
    the quality check then refuses the 200)."""
    resp = completed_of(raw)
    if resp is None or resp.get("status") == "failed":
        return raw, None, None
    chat = chat_from_completed(resp, model, created=created)
    usage = usage_from_openai(resp)
    out = openai_to_anthropic_response(chat, model) if anthropic_client else chat
    return orjson.dumps(out), usage, out
