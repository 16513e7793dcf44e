"""The mock provider's subscription side: Codex usage windows and the Responses wire.

Modelled on what the Codex CLI reads from the ChatGPT backend (``…/backend-api/codex/
responses``): every answer carries ``x-codex-primary-used-percent`` / ``-window-minutes`` /
``-reset-at`` (epoch seconds) for the 5-hour window and the same three ``secondary`` headers for
the weekly one. A window starts at the account's first use after its previous reset (not at an
epoch boundary) and resets completely at ``reset-at``. When a window is full the backend answers
429 with ``{"error": {"type": "usage_limit_reached", "message", "plan_type", "resets_at",
"resets_in_seconds"}}``.

``CodexWindows`` is the pure model (injected clock): each answer raises both windows by
``tokens × percent_per_1k_tokens / 1000`` (the weekly one by a ``weekly_ratio`` of that, as a
week is worth several 5-hour windows). Tests assert exact percentages from it.

``responses_events`` / ``responses_object`` render the mock's deterministic reply in the
Responses API's shapes (``response.created`` … ``response.output_text.delta`` …
``response.completed`` with ``usage``), as the OpenAI Python SDK types them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fairgate.clock import Clock
from fairgate.mock.wire import ToolCall, signature

__all__ = [
    "CodexWindows",
    "ResponsesAnswer",
    "responses_events",
    "responses_input_text",
    "responses_object",
    "responses_output",
    "responses_stream",
    "responses_whole",
]

JSON = dict[str, Any]

FIVE_HOURS_MIN = 300
WEEK_MIN = 10_080


@dataclass
class _Window:
    minutes: int
    used: float = 0.0  # percent
    reset_at_ms: int | None = None  # None: not started (no use since the last reset)

    def roll(self, now_ms: int) -> None:
        if self.reset_at_ms is not None and now_ms >= self.reset_at_ms:
            self.used, self.reset_at_ms = 0.0, None

    def add(self, now_ms: int, percent: float) -> None:
        self.roll(now_ms)
        if self.reset_at_ms is None:
            self.reset_at_ms = now_ms + self.minutes * 60_000
        self.used = min(100.0, self.used + percent)


@dataclass
class CodexWindows:
    """One account's 5h (primary) and weekly (secondary) windows."""

    clock: Clock
    percent_per_1k_tokens: float = 1.0
    weekly_ratio: float = 0.2
    primary: _Window = field(default_factory=lambda: _Window(FIVE_HOURS_MIN))
    secondary: _Window = field(default_factory=lambda: _Window(WEEK_MIN))

    def use(self, tokens: int) -> None:
        now = self.clock.now_ms()
        pct = tokens * self.percent_per_1k_tokens / 1000.0
        self.primary.add(now, pct)
        self.secondary.add(now, pct * self.weekly_ratio)

    def exhausted(self) -> _Window | None:
        """The full window that refuses requests now (the one resetting last), else None."""
        now = self.clock.now_ms()
        full = []
        for w in (self.primary, self.secondary):
            w.roll(now)
            if w.used >= 100.0:
                full.append(w)
        return max(full, key=lambda w: w.reset_at_ms or 0) if full else None

    def headers(self) -> dict[str, str]:
        now = self.clock.now_ms()
        out: dict[str, str] = {}
        for slot, w in (("primary", self.primary), ("secondary", self.secondary)):
            w.roll(now)
            reset_ms = w.reset_at_ms if w.reset_at_ms is not None else now + w.minutes * 60_000
            out[f"x-codex-{slot}-used-percent"] = f"{w.used:g}"
            out[f"x-codex-{slot}-window-minutes"] = str(w.minutes)
            out[f"x-codex-{slot}-reset-at"] = str(math.ceil(reset_ms / 1000))
        out["x-codex-primary-over-secondary-limit-percent"] = "0"
        return out

    def limit_error(self, window: _Window) -> JSON:
        now = self.clock.now_ms()
        reset_ms = window.reset_at_ms or now
        return {
            "error": {
                "type": "usage_limit_reached",
                "message": "The usage limit has been reached",
                "plan_type": "plus",
                "resets_at": math.ceil(reset_ms / 1000),
                "resets_in_seconds": max(0, math.ceil((reset_ms - now) / 1000)),
            }
        }


# -- the Responses wire -----------------------------------------------------------------------


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") in ("input_text", "output_text")
        )
    return ""


def responses_input_text(body: JSON) -> tuple[str, int]:
    """(last user text, characters of every input text and the instructions)."""
    raw = body.get("input")
    items: list[Any] = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw or []
    last, chars = "", len(_text(body.get("instructions")))
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type", "message") == "message":
            text = _text(item.get("content"))
            chars += len(text)
            if item.get("role") == "user":
                last = text
        elif item.get("type") == "function_call_output":
            chars += len(str(item.get("output", "")))
    return last, chars


def _usage(prompt: int, completion: int) -> JSON:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def responses_object(
    rid: str,
    model: str,
    created: int,
    text: str,
    prompt: int,
    completion: int,
    *,
    done: bool,
    output: list[JSON] | None = None,
    reasoning_tokens: int = 0,
    incomplete: bool = False,
) -> JSON:
    """The response object; ``output`` (the items) defaults to one message of ``text``."""
    message = _message_item(rid, text, "completed")
    usage = _usage(prompt, completion)
    usage["output_tokens_details"]["reasoning_tokens"] = reasoning_tokens
    status = "incomplete" if incomplete else "completed"
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "model": model,
        "status": status if done else "in_progress",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if done and incomplete else None,
        "output": (output if output is not None else [message]) if done else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage if done else None,
    }


def _message_item(rid: str, text: str, status: str) -> JSON:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {
        "type": "message",
        "id": f"msg_{rid}",
        "status": status,
        "role": "assistant",
        "content": content if status == "completed" else [],
    }


@dataclass
class ResponsesAnswer:
    """What one Responses answer holds besides its ids: text pieces (the stream's deltas),
    tool calls (``function_call`` / ``custom_tool_call`` items), and a reasoning item (with a
    summary, with ``encrypted_content``) when the request asked for reasoning."""

    pieces: list[str]
    prompt: int
    completion: int
    calls: list[ToolCall] = field(default_factory=list)
    reasoning: bool = False
    summary: bool = False
    encrypted: bool = False
    incomplete: bool = False

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def reasoning_tokens(self) -> int:
        return REASONING_TOKENS if self.reasoning else 0


#: Reasoning tokens a reasoning answer spends (counted in its ``output_tokens`` as well).
REASONING_TOKENS = 8
#: The reasoning summary the mock writes.
SUMMARY = "Considering the request."


def _reasoning_item(rid: str, ans: ResponsesAnswer, *, done: bool) -> JSON:
    item: JSON = {
        "type": "reasoning",
        "id": f"rs_{rid}",
        "summary": [{"type": "summary_text", "text": SUMMARY}] if ans.summary and done else [],
    }
    if ans.encrypted:  # opaque state a client sends back in its next request's input
        item["encrypted_content"] = "gAAAAB" + signature(rid)
    return item


def _call_item(rid: str, n: int, call: ToolCall, *, done: bool) -> JSON:
    custom = call.kind == "custom"
    item: JSON = {
        "type": "custom_tool_call" if custom else "function_call",
        "id": f"{'ctc' if custom else 'fc'}_{rid}_{n}",
        "call_id": call.call_id,
        "name": call.name,
        "input" if custom else "arguments": call.arguments if done else "",
    }
    if not custom:  # a custom tool call's item carries no status
        item["status"] = "completed" if done else "in_progress"
    return item


def responses_output(rid: str, ans: ResponsesAnswer) -> list[JSON]:
    """The answer's output items, in order: reasoning, the message, the calls."""
    out: list[JSON] = []
    if ans.reasoning:
        out.append(_reasoning_item(rid, ans, done=True))
    if ans.text or not ans.calls:
        message = _message_item(rid, ans.text, "completed")
        out.append(message)
    out += [_call_item(rid, n, c, done=True) for n, c in enumerate(ans.calls)]
    return out


def responses_whole(rid: str, model: str, created: int, ans: ResponsesAnswer) -> JSON:
    """The non-stream answer (and what ``response.completed`` carries)."""
    return responses_object(
        rid,
        model,
        created,
        ans.text,
        ans.prompt,
        ans.completion,
        done=True,
        output=responses_output(rid, ans),
        reasoning_tokens=ans.reasoning_tokens,
        incomplete=ans.incomplete,
    )


def responses_stream(
    rid: str, model: str, created: int, ans: ResponsesAnswer
) -> list[tuple[str, JSON]]:
    """The stream of one answer: (event name, data) pairs with rising sequence numbers, each
    item added, its deltas, its done events and the item done, as the Responses API sends
    them; then ``response.completed`` (``response.incomplete`` when capped) with the whole
    response."""
    start = responses_object(rid, model, created, "", 0, 0, done=False)
    final = responses_whole(rid, model, created, ans)
    events: list[JSON] = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
    ]
    for index, item in enumerate(final["output"]):
        kind = item["type"]
        item_id = item["id"]
        where = {"item_id": item_id, "output_index": index}
        if kind == "reasoning":
            added = _reasoning_item(rid, ans, done=False)
            events.append(
                {"type": "response.output_item.added", "output_index": index, "item": added}
            )
            if ans.summary:
                part = {"type": "summary_text", "text": ""}
                at = {**where, "summary_index": 0}
                events += [
                    {"type": "response.reasoning_summary_part.added", "part": part, **at},
                    {"type": "response.reasoning_summary_text.delta", "delta": SUMMARY, **at},
                    {"type": "response.reasoning_summary_text.done", "text": SUMMARY, **at},
                    {
                        "type": "response.reasoning_summary_part.done",
                        "part": {**part, "text": SUMMARY},
                        **at,
                    },
                ]
        elif kind == "message":
            added = _message_item(rid, "", "in_progress")
            events.append(
                {"type": "response.output_item.added", "output_index": index, "item": added}
            )
            text_part: JSON = {"type": "output_text", "text": "", "annotations": []}
            at = {**where, "content_index": 0}
            text = ans.text
            events.append({"type": "response.content_part.added", "part": text_part, **at})
            events += [
                {"type": "response.output_text.delta", "delta": p, "logprobs": [], **at}
                for p in ans.pieces
            ]
            events += [
                {"type": "response.output_text.done", "text": text, "logprobs": [], **at},
                {"type": "response.content_part.done", "part": {**text_part, "text": text}, **at},
            ]
        else:
            n = index - (len(final["output"]) - len(ans.calls))
            call = ans.calls[n]
            added = _call_item(rid, n, call, done=False)
            events.append(
                {"type": "response.output_item.added", "output_index": index, "item": added}
            )
            if call.kind == "custom":
                events += [
                    {
                        "type": "response.custom_tool_call_input.delta",
                        "delta": call.arguments,
                        **where,
                    },
                    {
                        "type": "response.custom_tool_call_input.done",
                        "input": call.arguments,
                        **where,
                    },
                ]
            else:
                half = len(call.arguments) // 2
                events += [
                    {"type": "response.function_call_arguments.delta", "delta": d, **where}
                    for d in (call.arguments[:half], call.arguments[half:])
                    if d
                ]
                events.append(
                    {
                        "type": "response.function_call_arguments.done",
                        "arguments": call.arguments,
                        **where,
                    }
                )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    closing = "response.incomplete" if ans.incomplete else "response.completed"
    events.append({"type": closing, "response": final})
    return [(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(events)]


def responses_events(
    rid: str, model: str, created: int, pieces: list[str], prompt: int, completion: int
) -> list[tuple[str, JSON]]:
    """The stream of one text answer: (event name, data) pairs with sequence numbers."""
    return responses_stream(rid, model, created, ResponsesAnswer(pieces, prompt, completion))
