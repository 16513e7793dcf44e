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

__all__ = ["CodexWindows", "responses_events", "responses_input_text", "responses_object"]

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
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def responses_object(
    rid: str, model: str, created: int, text: str, prompt: int, completion: int, *, done: bool
) -> JSON:
    message = {
        "type": "message",
        "id": f"msg_{rid}",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "model": model,
        "status": "completed" if done else "in_progress",
        "error": None,
        "incomplete_details": None,
        "output": [message] if done else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": _usage(prompt, completion) if done else None,
    }


def responses_events(
    rid: str, model: str, created: int, pieces: list[str], prompt: int, completion: int
) -> list[tuple[str, JSON]]:
    """The stream of one text answer: (event name, data) pairs with sequence numbers."""
    text = "".join(pieces)
    item_id = f"msg_{rid}"
    start = responses_object(rid, model, created, "", 0, 0, done=False)
    part = {"type": "output_text", "text": "", "annotations": []}
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    empty_item = {**responses_object(rid, model, created, "", 0, 0, done=True)["output"][0]}
    empty_item.update(status="in_progress", content=[])
    events: list[JSON] = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
        {"type": "response.output_item.added", "output_index": 0, "item": empty_item},
        {"type": "response.content_part.added", "part": part, **where},
        *(
            {"type": "response.output_text.delta", "delta": p, "logprobs": [], **where}
            for p in pieces
        ),
        {"type": "response.output_text.done", "text": text, "logprobs": [], **where},
        {"type": "response.content_part.done", "part": {**part, "text": text}, **where},
    ]
    final = responses_object(rid, model, created, text, prompt, completion, done=True)
    events.append(
        {"type": "response.output_item.done", "output_index": 0, "item": final["output"][0]}
    )
    events.append({"type": "response.completed", "response": final})
    return [(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(events)]
