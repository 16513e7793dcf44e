"""OpenAI Responses API (``POST /v1/responses``) clients → fairgate's chat form and back.

fairgate's internal request form is the OpenAI chat-completions body: every upstream protocol
already translates from it (to Anthropic messages in ``translate``, to a Responses upstream in
``responses_upstream``). A Responses client is therefore served by translating its request to
chat form here, and the upstream's chat answer (or chunk stream) back to a Responses object (or
event stream). Everything is pure: plain dicts in, plain dicts out.

Contract followed (the OpenAI Responses API as its official Python SDK types it):

- Request: ``input`` is a string (one user turn) or a list of items: messages (``role`` user /
  assistant / system / developer, content a string or ``input_text`` / ``output_text`` /
  ``input_image`` parts), ``function_call`` and ``function_call_output`` items; ``reasoning``
  items are dropped (they only carry state for OpenAI's own store). ``instructions`` becomes
  the system message; function tools are flattened in the Responses form (``{"type":
  "function", "name", "parameters"}``) and nested for chat; ``max_output_tokens``,
  ``temperature``, ``top_p``, ``tool_choice``, ``parallel_tool_calls``, ``text.format`` and
  ``reasoning.effort`` map to their chat equivalents.
- ``previous_response_id`` is refused (``ResponsesInputError``, a 400 naming the field):
  fairgate stores no responses, and silently dropping the conversation it refers to would
  answer a different question. Clients send the whole conversation in ``input`` instead (what
  ``store: false`` clients, the Codex CLI among them, already do). Built-in tools (web search,
  file search, computer use) are refused the same way: no chat upstream can run them.
- Answer: a ``response`` object with ``output`` items (an assistant ``message`` with one
  ``output_text`` part; one ``function_call`` item per tool call) and ``usage``
  (``input_tokens`` with ``cached_tokens``, ``output_tokens`` with ``reasoning_tokens``). A
  ``length`` finish is ``status: incomplete`` with ``reason: max_output_tokens``.
- Stream: ``response.created``, ``response.in_progress``; per item ``response.output_item.added``,
  (``response.content_part.added``, ``response.output_text.delta``…, ``response.output_text.done``,
  ``response.content_part.done``) or ``response.function_call_arguments.delta``… / ``.done``,
  then ``response.output_item.done``; finally ``response.completed`` (or ``response.incomplete``)
  carrying the whole response with usage. Every event has a rising ``sequence_number``.
  Reasoning deltas are not streamed (a reasoning item's shape depends on OpenAI's encrypted
  state); their tokens are still counted in ``usage``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fairgate.formats.responses_tools import (
    CUSTOM_ARGUMENT,
    ToolPlan,
    ToolPlanError,
    tool_plan,
)
from fairgate.formats.translate import (
    CannotCarry,
    _dumps,
    _list,
    _map,
    _pos_int,
    uses_max_completion_tokens,
)
from fairgate.formats.usage import Usage, usage_from_openai

__all__ = [
    "ChatToResponsesStream",
    "ResponsesInputError",
    "chat_to_responses_response",
    "responses_to_chat_request",
    "responses_usage",
]

JSON = dict[str, Any]

#: Chat ``finish_reason`` → the Responses ``incomplete_details.reason`` (others complete).
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
#: Request fields echoed on the response object, with their default when absent.
_ECHO: Mapping[str, Any] = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "temperature": None,
    "tool_choice": "auto",
    "top_p": None,
    "reasoning": None,
    "text": {"format": {"type": "text"}},
    "user": None,
}


class ResponsesInputError(CannotCarry):
    """A Responses request fairgate cannot serve, naming the offending field (the request path
    answers 400 with it)."""


# -- request ----------------------------------------------------------------------------------


def _chat_part(part: object, where: str) -> JSON | None:
    """One Responses content part → a chat content part (None: nothing to send)."""
    if isinstance(part, str):
        return {"type": "text", "text": part}
    p = _map(part)
    kind = p.get("type")
    if kind in ("input_text", "output_text", "text", "refusal"):
        text = p.get("text") if kind != "refusal" else p.get("refusal")
        return {"type": "text", "text": text} if isinstance(text, str) else None
    if kind == "input_image":
        url = p.get("image_url")
        if not isinstance(url, str) or not url:
            raise ResponsesInputError(f"{where}.image_url", "input_image needs an image_url")
        image: JSON = {"url": url}
        if isinstance(p.get("detail"), str):
            image["detail"] = p["detail"]
        return {"type": "image_url", "image_url": image}
    raise ResponsesInputError(f"{where}.type", f"unsupported content part type {kind!r}")


def _chat_content(content: object, where: str, *, text_only: bool) -> str | list[JSON]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ResponsesInputError(where, "must be a string or an array of content parts")
    parts = [
        p for n, raw in enumerate(content) if (p := _chat_part(raw, f"{where}[{n}]")) is not None
    ]
    if text_only or all(p["type"] == "text" for p in parts):
        return "".join(str(p.get("text", "")) for p in parts)
    return parts


def _message(item: Mapping[str, Any], where: str) -> JSON:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise ResponsesInputError(f"{where}.role", f"unsupported role {role!r}")
    chat_role = "system" if role == "developer" else role
    content = _chat_content(item.get("content"), f"{where}.content", text_only=chat_role != "user")
    return {"role": chat_role, "content": content}


def _tool_call(item: Mapping[str, Any], where: str, plan: ToolPlan) -> JSON:
    """A ``function_call`` or ``custom_tool_call`` item → a chat tool call under the upstream
    function name the plan gives its tool (a freeform input as the one ``input`` argument)."""
    name = item.get("name")
    call_id = item.get("call_id")
    if not isinstance(name, str) or not isinstance(call_id, str):
        raise ResponsesInputError(where, f"a {item.get('type')} item needs call_id and name")
    ns = item.get("namespace")
    chat_name = plan.chat_name(name, ns if isinstance(ns, str) else None)
    if item.get("type") == "custom_tool_call":
        raw = item.get("input")
        arguments = _dumps({CUSTOM_ARGUMENT: raw if isinstance(raw, str) else ""})
    else:
        args = item.get("arguments")
        arguments = args if isinstance(args, str) else _dumps(args or {})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": chat_name, "arguments": arguments},
    }


def _append_call(messages: list[JSON], call: JSON) -> None:
    """Consecutive function calls (and a preceding assistant text) are one chat turn."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and "tool_calls" in last:
        last["tool_calls"].append(call)
    elif last is not None and last["role"] == "assistant" and isinstance(last["content"], str):
        last["tool_calls"] = [call]
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _tool_output(item: Mapping[str, Any], where: str) -> JSON:
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise ResponsesInputError(f"{where}.call_id", "a function_call_output needs call_id")
    output = item.get("output")
    text = (
        output
        if isinstance(output, str)
        else _chat_content(output, f"{where}.output", text_only=True)
    )
    return {"role": "tool", "tool_call_id": call_id, "content": text}


#: Input items that only carry the client's own state or tool declarations (the tools are read
#: by the tool plan): nothing of them goes into the chat messages.
_STATE_ITEMS = frozenset({"reasoning", "additional_tools", "configuration_update"})


def _chat_messages(raw: object, plan: ToolPlan) -> list[JSON]:
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise ResponsesInputError("input", "must be a string or an array of input items")
    messages: list[JSON] = []
    for n, entry in enumerate(raw):
        where = f"input[{n}]"
        if not isinstance(entry, Mapping):
            raise ResponsesInputError(where, "must be an object")
        kind = entry.get("type", "message")
        if kind == "message":
            messages.append(_message(entry, where))
        elif kind in ("function_call", "custom_tool_call"):
            _append_call(messages, _tool_call(entry, where, plan))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append(_tool_output(entry, where))
        elif kind not in _STATE_ITEMS:
            raise ResponsesInputError(f"{where}.type", f"unsupported input item type {kind!r}")
    return messages


def _chat_tool_choice(choice: object, plan: ToolPlan) -> object:
    if isinstance(choice, str):
        return choice
    c = _map(choice)
    if c.get("type") in ("function", "custom") and isinstance(c.get("name"), str):
        return {"type": "function", "function": {"name": plan.chat_name(c["name"])}}
    return None


def _response_format(text: object) -> JSON | None:
    fmt = _map(_map(text).get("format"))
    kind = fmt.get("type")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return None


def _plan(body: Mapping[str, Any]) -> ToolPlan:
    try:
        return tool_plan(body)
    except ToolPlanError as exc:
        raise ResponsesInputError(exc.where, exc.message) from None


def omitted_tools(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The hosted tool types of a Responses request that a chat upstream cannot run, left out
    of the translated request (the edge names them in ``x-fairgate-tools-omitted``)."""
    try:
        return tool_plan(body).omitted
    except ToolPlanError:
        return ()


def responses_to_chat_request(body: Mapping[str, Any], model: str) -> JSON:
    """A Responses request → a chat-completions request for ``model``.

    Raises ``ResponsesInputError`` for what cannot be served (see the module notes)."""
    if body.get("previous_response_id") is not None:
        raise ResponsesInputError(
            "previous_response_id",
            "fairgate does not store responses: send the whole conversation in `input`",
        )
    if "input" not in body:
        raise ResponsesInputError("input", "is required")
    plan = _plan(body)
    messages = _chat_messages(body.get("input"), plan)
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    out: JSON = {"model": model, "messages": messages}
    raw_limit = body.get("max_output_tokens")
    if raw_limit is not None:
        limit = _pos_int(raw_limit)
        if limit is None:
            raise ResponsesInputError("max_output_tokens", "must be a positive integer")
        key = "max_completion_tokens" if uses_max_completion_tokens(model) else "max_tokens"
        out[key] = limit
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:  # same name and range in chat: checked there
            out[name] = body[name]
    if plan.chat_tools:
        out["tools"] = list(plan.chat_tools)
        choice = _chat_tool_choice(body.get("tool_choice"), plan)
        if choice is not None:
            out["tool_choice"] = choice
        if isinstance(body.get("parallel_tool_calls"), bool):
            out["parallel_tool_calls"] = body["parallel_tool_calls"]
    fmt = _response_format(body.get("text"))
    if fmt is not None:
        out["response_format"] = fmt
    effort = _map(body.get("reasoning")).get("effort")
    if isinstance(effort, str):
        out["reasoning_effort"] = effort
    user = body.get("safety_identifier") or body.get("user")
    if isinstance(user, str):
        out["user"] = user
    if body.get("stream") is True:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


# -- answer -----------------------------------------------------------------------------------


def responses_usage(u: Usage) -> JSON:
    """fairgate's usage in the Responses API's shape."""
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.total,
    }


def _shell(request: Mapping[str, Any], model: str, rid: str, created: int) -> JSON:
    """The response object without output, status or usage: what the request asked for."""
    out: JSON = {
        "id": rid,
        "object": "response",
        "created_at": created,
        "model": model,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "output": [],
        "previous_response_id": None,
        "store": False,
        "tools": list(_list(request.get("tools"))),
        "usage": None,
    }
    for name, default in _ECHO.items():
        value = request.get(name)
        out[name] = default if value is None else value
    return out


def _finish(resp: JSON, finish_reason: object, usage: Usage) -> JSON:
    reason = _INCOMPLETE.get(finish_reason) if isinstance(finish_reason, str) else None
    resp["status"] = "incomplete" if reason else "completed"
    resp["incomplete_details"] = {"reason": reason} if reason else None
    resp["usage"] = responses_usage(usage)
    return resp


def _text_item(item_id: str, text: str, status: str = "completed") -> JSON:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]
        if text or status == "completed"
        else [],
    }


def _reasoning_item(item_id: str, summary: str | None) -> JSON:
    """A reasoning item whose summary is the reasoning a chat answer showed
    (``reasoning_content``: an Anthropic upstream's thinking, an OpenAI-compatible model's
    reasoning); no ``encrypted_content``, which only OpenAI can make."""
    parts = [] if summary is None else [{"type": "summary_text", "text": summary}]
    return {"type": "reasoning", "id": item_id, "summary": parts}


def _call_item(
    item_id: str, call_id: str, name: str, args: str, status: str, plan: ToolPlan | None = None
) -> JSON:
    """The client's call item for an upstream call of function ``name``: a ``function_call``,
    or what the tool plan makes of it (a ``custom_tool_call``, a namespaced call)."""
    fields = (plan or ToolPlan()).client_call(name, args)
    return {
        "type": fields.pop("type"),
        "id": item_id,
        "call_id": call_id,
        **fields,
        "status": status,
    }


def _safe_plan(request: Mapping[str, Any]) -> ToolPlan:
    """The request's tool plan on the way out (its errors were answered on the way in)."""
    try:
        return tool_plan(request)
    except ToolPlanError:
        return ToolPlan()


def _new_id(prefix: str) -> str:
    return f"{prefix}_{time.time_ns():x}"


def chat_to_responses_response(
    chat: Mapping[str, Any],
    request: Mapping[str, Any],
    model: str,
    *,
    response_id: str | None = None,
    created: int,
) -> JSON:
    """A chat completion → the Responses object answering ``request`` (first choice only)."""
    rid = response_id or _new_id("resp")
    resp = _shell(request, model, rid, created)
    plan = _safe_plan(request)
    choices = _list(chat.get("choices"))
    choice = _map(choices[0]) if choices else {}
    message = _map(choice.get("message"))
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    output: list[JSON] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:  # a thinking upstream's reasoning, shown
        output.append(_reasoning_item(f"rs_{rid}", reasoning))
    if text:
        output.append(_text_item(f"msg_{rid}", text))
    for n, raw in enumerate(_list(message.get("tool_calls"))):
        fn = _map(_map(raw).get("function"))
        call_id = str(_map(raw).get("id") or f"call_{n}")
        args = fn.get("arguments")
        output.append(
            _call_item(
                f"fc_{rid}_{n}",
                call_id,
                str(fn.get("name") or ""),
                args if isinstance(args, str) else _dumps(args or {}),
                "completed",
                plan,
            )
        )
    resp["output"] = output
    return _finish(resp, choice.get("finish_reason"), usage_from_openai(chat) or Usage())


# -- stream -----------------------------------------------------------------------------------


@dataclass
class _Call:
    output_index: int
    item_id: str
    call_id: str
    name: str
    args: list[str] = field(default_factory=list)


class ChatToResponsesStream:
    """Chat ``chat.completion.chunk`` dicts → Responses stream events, one chunk at a time.

    ``start()`` gives the opening events, ``feed(chunk)`` the events a chunk causes, and
    ``finish()`` the closing ones (every open item done, then ``response.completed`` with the
    whole response and usage); ``fail(message)`` closes with ``response.failed`` instead.
    Callers frame each event as SSE ``event: <type>`` / ``data: <json>``.
    """

    def __init__(
        self,
        request: Mapping[str, Any],
        model: str,
        *,
        response_id: str | None = None,
        created: int,
    ) -> None:
        rid = response_id or _new_id("resp")
        self._resp = _shell(request, model, rid, created)
        self._plan = _safe_plan(request)
        self._seq = 0
        self._output: list[JSON] = []  # finished items, in output order
        self._text_index: int | None = None
        self._text: list[str] = []
        self._reasoning_index: int | None = None
        self._reasoning: list[str] = []
        self._calls: dict[int, _Call] = {}  # chat tool-call index → its item
        self._finish_reason: object = None
        self._usage: Usage | None = None
        self.done = False

    @property
    def usage(self) -> Usage | None:
        return self._usage

    @property
    def response_id(self) -> str:
        return str(self._resp["id"])

    def _event(self, kind: str, **fields: Any) -> JSON:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def _snapshot(self) -> JSON:
        return {**self._resp, "output": list(self._output)}

    def start(self) -> list[JSON]:
        return [
            self._event("response.created", response=self._snapshot()),
            self._event("response.in_progress", response=self._snapshot()),
        ]

    def _next_index(self) -> int:
        opened = (self._text_index is not None) + (self._reasoning_index is not None)
        return len(self._output) + opened + len(self._calls)

    def _reasoning_delta(self, text: str) -> list[JSON]:
        events: list[JSON] = []
        item_id = f"rs_{self.response_id}"
        at: JSON
        if self._reasoning_index is None:
            events += self._close_text() + self._close_calls()
            self._reasoning_index = self._next_index()
            at = {"item_id": item_id, "output_index": self._reasoning_index, "summary_index": 0}
            events.append(
                self._event(
                    "response.output_item.added",
                    output_index=self._reasoning_index,
                    item=_reasoning_item(item_id, None),
                )
            )
            part = {"type": "summary_text", "text": ""}
            events.append(self._event("response.reasoning_summary_part.added", part=part, **at))
        at = {"item_id": item_id, "output_index": self._reasoning_index, "summary_index": 0}
        self._reasoning.append(text)
        events.append(self._event("response.reasoning_summary_text.delta", delta=text, **at))
        return events

    def _close_reasoning(self) -> list[JSON]:
        if self._reasoning_index is None:
            return []
        item_id, index = f"rs_{self.response_id}", self._reasoning_index
        text = "".join(self._reasoning)
        item = _reasoning_item(item_id, text)
        self._reasoning_index = None
        self._output.append(item)
        at = {"item_id": item_id, "output_index": index, "summary_index": 0}
        part = {"type": "summary_text", "text": text}
        return [
            self._event("response.reasoning_summary_text.done", text=text, **at),
            self._event("response.reasoning_summary_part.done", part=part, **at),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _text_delta(self, text: str) -> list[JSON]:
        events: list[JSON] = []
        item_id = f"msg_{self.response_id}"
        if self._text_index is None:
            # an item is finished before the next one starts
            events += self._close_reasoning() + self._close_calls()
            self._text_index = self._next_index()
            events.append(
                self._event(
                    "response.output_item.added",
                    output_index=self._text_index,
                    item=_text_item(item_id, "", "in_progress"),
                )
            )
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item_id,
                    output_index=self._text_index,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                )
            )
        self._text.append(text)
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=item_id,
                output_index=self._text_index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return events

    def _close_text(self) -> list[JSON]:
        if self._text_index is None:
            return []
        item_id, index, text = f"msg_{self.response_id}", self._text_index, "".join(self._text)
        part = {"type": "output_text", "text": text, "annotations": []}
        item = _text_item(item_id, text)
        self._text_index = None
        self._output.append(item)
        common = {"item_id": item_id, "output_index": index, "content_index": 0}
        return [
            self._event("response.output_text.done", text=text, logprobs=[], **common),
            self._event("response.content_part.done", part=part, **common),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _tool_delta(self, raw: Mapping[str, Any]) -> list[JSON]:
        events: list[JSON] = []
        index = raw.get("index", 0)
        fn = _map(raw.get("function"))
        call = self._calls.get(index) if isinstance(index, int) else None
        if call is None:
            # an item is finished before the next one starts
            events += self._close_reasoning() + self._close_text()
            n = self._next_index()
            call = _Call(
                n,
                f"fc_{self.response_id}_{n}",
                str(raw.get("id") or f"call_{n}"),
                str(fn.get("name") or ""),
            )
            self._calls[index if isinstance(index, int) else n] = call
            item = _call_item(call.item_id, call.call_id, call.name, "", "in_progress", self._plan)
            events.append(self._event("response.output_item.added", output_index=n, item=item))
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            call.args.append(args)
            if self._plan.is_custom(call.name):
                return events  # a freeform input is known once its arguments are whole
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=call.item_id,
                    output_index=call.output_index,
                    delta=args,
                )
            )
        return events

    def _close_calls(self) -> list[JSON]:
        events: list[JSON] = []
        for call in self._calls.values():
            args = "".join(call.args)
            item = _call_item(call.item_id, call.call_id, call.name, args, "completed", self._plan)
            self._output.append(item)
            where = {"item_id": call.item_id, "output_index": call.output_index}
            if item["type"] == "custom_tool_call":
                raw = item["input"]
                events.append(
                    self._event("response.custom_tool_call_input.delta", delta=raw, **where)
                )
                events.append(
                    self._event("response.custom_tool_call_input.done", input=raw, **where)
                )
            else:
                events.append(
                    self._event("response.function_call_arguments.done", arguments=args, **where)
                )
            events.append(
                self._event("response.output_item.done", output_index=call.output_index, item=item)
            )
        self._calls.clear()
        return events

    def feed(self, chunk: Mapping[str, Any]) -> list[JSON]:
        if self.done:
            return []
        usage = usage_from_openai(chunk) if chunk.get("usage") else None
        if usage is not None:
            self._usage = usage
        events: list[JSON] = []
        for raw_choice in _list(chunk.get("choices"))[:1]:
            choice = _map(raw_choice)
            delta = _map(choice.get("delta"))
            thought = delta.get("reasoning_content")
            if isinstance(thought, str) and thought:
                events += self._reasoning_delta(thought)
            text = delta.get("content")
            if isinstance(text, str) and text:
                events += self._text_delta(text)
            for call in _list(delta.get("tool_calls")):
                events += self._tool_delta(_map(call))
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return events

    def finish(self, usage: Usage | None = None) -> list[JSON]:
        """Close every open item and the response; ``usage`` (e.g. the gateway's estimate when
        the upstream reported none) is used only if the stream carried no usage. A stream that
        ended without a finish reason was cut off: ``response.failed``, never a completed
        response a client would take for the whole answer (issue 42)."""
        if self.done:
            return []
        if self._finish_reason is None:
            if usage is not None and self._usage is None:
                self._usage = usage
            return self.fail("the upstream ended the stream before it finished")
        self.done = True
        events = self._close_reasoning() + self._close_text() + self._close_calls()
        resp = _finish(self._snapshot(), self._finish_reason, self._usage or usage or Usage())
        kind = "response.completed" if resp["status"] == "completed" else "response.incomplete"
        events.append(self._event(kind, response=resp))
        return events

    def fail(self, message: str, code: str = "server_error") -> list[JSON]:
        """Close with ``response.failed`` (the upstream broke off or sent an error)."""
        if self.done:
            return []
        self.done = True
        resp = {**self._snapshot(), "status": "failed", "error": {"code": code, "message": message}}
        resp["usage"] = responses_usage(self._usage or Usage())
        return [self._event("response.failed", response=resp)]
