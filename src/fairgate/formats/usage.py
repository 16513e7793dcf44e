"""Token usage: one shape for both wire formats, and a cheap prompt estimate.

Settlement charges what the upstream reports, so the readers here are tolerant: a provider that
omits a field, sends ``null`` or a string must still settle (missing numbers count 0), and an
answer with no usage at all returns ``None`` so the caller can fall back to the estimate.

Convention (OpenAI's): ``prompt_tokens`` counts every input token including cached ones, and
``cached_tokens`` is the cached subset; ``completion_tokens`` includes ``reasoning_tokens``.
Anthropic's ``input_tokens`` excludes cache reads and writes, so they are added back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import orjson

__all__ = [
    "Usage",
    "estimate_prompt_tokens",
    "estimate_text_tokens",
    "usage_from_anthropic",
    "usage_from_openai",
]

#: Flat allowance per image or file part: counting base64 characters would overcharge wildly.
IMAGE_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def _int(value: object) -> int:
    """A non-negative int from whatever the provider sent; 0 for anything unusable."""
    if type(value) is int:  # what providers send: answered before the checks below
        return value if value > 0 else 0
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float):
        return max(int(value), 0) if math.isfinite(value) else 0
    if isinstance(value, str):
        try:
            f = float(value)
        except ValueError:
            return 0
        return max(int(f), 0) if math.isfinite(f) else 0
    return 0


def _mapping(obj: object) -> TypeGuard[Mapping[Any, Any]]:
    """``isinstance(obj, Mapping)``, answered at once for the dicts a JSON parser makes (the
    abstract class's check is a Python call each time)."""
    return type(obj) is dict or isinstance(obj, Mapping)


def _get(obj: object, key: str) -> Any:
    return None if obj is None else obj.get(key) if _mapping(obj) else None


def usage_from_openai(obj: Mapping[str, Any]) -> Usage | None:
    """Usage of an OpenAI chat completion or stream chunk (``obj["usage"]``), or of a bare usage
    object. Also reads the Responses API names (``input_tokens``/``output_tokens``).

    None when there is no usage object (e.g. every stream chunk but the last).
    """
    u = obj.get("usage") if "usage" in obj else obj
    if not _mapping(u):
        return None
    if "prompt_tokens" in u or "completion_tokens" in u:
        prompt = _int(u.get("prompt_tokens"))
        completion = _int(u.get("completion_tokens"))
        pdet = u.get("prompt_tokens_details")
        cdet = u.get("completion_tokens_details")
    elif "input_tokens" in u or "output_tokens" in u:
        prompt = _int(u.get("input_tokens"))
        completion = _int(u.get("output_tokens"))
        pdet = u.get("input_tokens_details")
        cdet = u.get("output_tokens_details")
    else:
        return None
    cached = min(_int(_get(pdet, "cached_tokens")), prompt)
    reasoning = min(_int(_get(cdet, "reasoning_tokens")), completion)
    return Usage(prompt, completion, cached, reasoning)


def usage_from_anthropic(obj: Mapping[str, Any]) -> Usage | None:
    """Usage of an Anthropic message, a ``message_start`` event (``obj["message"]["usage"]``), a
    ``message_delta`` event (``obj["usage"]``, often only ``output_tokens``), or a bare usage.

    None when none of the token fields is present.
    """
    u: Any = obj.get("usage")
    if u is None:
        msg = obj.get("message")
        u = _get(msg, "usage") if msg is not None else obj
    if not _mapping(u):
        return None
    if not ("input_tokens" in u or "output_tokens" in u or "cache_read_input_tokens" in u):
        return None
    cache_read = _int(u.get("cache_read_input_tokens"))
    prompt = _int(u.get("input_tokens")) + cache_read + _int(u.get("cache_creation_input_tokens"))
    completion = _int(u.get("output_tokens"))
    reasoning = min(_int(_get(u.get("output_tokens_details"), "thinking_tokens")), completion)
    return Usage(prompt, completion, cache_read, reasoning)


#: The fields of an Anthropic usage block that a stream repeats, cumulatively.
ANTHROPIC_USAGE_FIELDS = (
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens",
)


def merge_anthropic_usage(acc: dict[str, Any], usage: object) -> None:
    """Fold one stream event's usage into ``acc``: Anthropic's fields are cumulative, so the
    latest value of each field present wins. ``message_start`` may say ``input_tokens: 0`` and
    ``message_delta`` the real count (Anthropic-compatible providers do), or the reverse: a
    field a later event leaves out keeps its earlier value."""
    if not _mapping(usage):
        return
    for key in ANTHROPIC_USAGE_FIELDS:
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            acc[key] = value
    details = usage.get("output_tokens_details")
    if _mapping(details):
        acc["output_tokens_details"] = details


def estimate_text_tokens(text: str) -> int:
    """About four characters per token: cheap, and good enough to reserve quota with."""
    return (len(text) + 3) // 4


def _json_len(value: object) -> int:
    if isinstance(value, str):
        return len(value)
    try:
        return len(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):
        return 0


class _Counter:
    __slots__ = ("chars", "images")

    def __init__(self) -> None:
        self.chars = 0
        self.images = 0

    def content(self, content: object, depth: int = 0) -> None:
        if isinstance(content, str):
            self.chars += len(content)
        elif isinstance(content, list) and depth < 4:
            for part in content:
                if isinstance(part, str):
                    self.chars += len(part)
                elif _mapping(part):
                    self.part(part, depth)

    def part(self, part: Mapping[Any, Any], depth: int) -> None:
        text = part.get("text")
        if isinstance(text, str):
            self.chars += len(text)
        kind = part.get("type")
        if kind in ("image_url", "image", "input_image", "file", "document", "input_audio"):
            self.images += 1
        elif kind == "tool_use":
            self.chars += _json_len(part.get("input"))
        elif kind == "tool_result":
            self.content(part.get("content"), depth + 1)
        elif kind == "thinking":
            thinking = part.get("thinking")
            if isinstance(thinking, str):
                self.chars += len(thinking)


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """Estimate the input tokens of an OpenAI or Anthropic request body (at least 1).

    Counts message text (string or list-of-parts content, tool results, assistant tool-call
    arguments), the system prompt, legacy ``prompt``/Responses ``input``, and the tools' JSON,
    at four characters per token, plus a flat ``IMAGE_TOKENS`` per image/file part. Never
    raises: the estimate only sizes a reservation that settlement corrects.
    """
    c = _Counter()
    try:
        c.content(body.get("system"))
        for key in ("prompt", "input", "instructions"):
            c.content(body.get(key))
        messages = body.get("messages")
        if isinstance(messages, list):
            for msg in messages:
                if not _mapping(msg):
                    continue
                c.content(msg.get("content"))
                calls = msg.get("tool_calls")
                if isinstance(calls, list):
                    for call in calls:
                        fn = _get(call, "function")
                        c.chars += _json_len(_get(fn, "name") or "")
                        c.chars += _json_len(_get(fn, "arguments") or "")
        tools = body.get("tools")
        if tools:
            c.chars += _json_len(tools)
    except Exception:  # odd input must never fail a request
        pass
    return max(1, (c.chars + 3) // 4 + c.images * IMAGE_TOKENS)
