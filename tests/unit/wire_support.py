"""What the translation tests (``test_translate.py``, ``test_responses.py``) write in more than one
wire's terms: an OpenAI Chat Completions tool call."""

from __future__ import annotations

from typing import Any


def tool_call(call_id: str, arguments: str, name: str = "get_weather") -> dict[str, Any]:
    """A Chat Completions assistant message's tool call: ``arguments`` is the JSON text as the
    wire carries it (a string, not an object)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_usage(prompt: int, completion: int, cached: int, reasoning: int) -> dict[str, Any]:
    """A Chat Completions answer's ``usage`` with its details: ``cached`` of the prompt tokens
    read from the cache, ``reasoning`` of the completion tokens spent thinking."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
