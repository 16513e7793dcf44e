"""The context window of a model, by name, for the models whose window is published.

A combo target may state its own (``contextWindow``); this catalogue answers for the rest, so
that a combo does not spend an attempt on a fallback whose window is certain to refuse the
conversation (issue 46). Matched by the longest known prefix of the model name, after any
``provider/`` part; an unknown model has no window (the upstream decides).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

__all__ = ["CONTEXT_WINDOWS", "context_window"]

#: Tokens of context per model family, from the providers' model pages.
CONTEXT_WINDOWS: Mapping[str, int] = {
    "gpt-3.5-turbo": 16_385,
    "gpt-4": 8_192,
    "gpt-4-32k": 32_768,
    "gpt-4-turbo": 128_000,
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "claude-3": 200_000,
    "claude-3-5": 200_000,
    "claude-3-7": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-opus-4": 200_000,
    "claude-haiku-4": 200_000,
    "gemini-1.5-pro": 2_097_152,
    "gemini-1.5-flash": 1_048_576,
    "gemini-2.0-flash": 1_048_576,
    "gemini-2.5-pro": 1_048_576,
    "gemini-2.5-flash": 1_048_576,
}

_BY_LENGTH = sorted(CONTEXT_WINDOWS, key=len, reverse=True)


@functools.lru_cache(maxsize=1024)
def context_window(model: str) -> int | None:
    """The catalogue's window for ``model`` (the longest matching prefix), or None; cached, so a
    request's check is a dict lookup per target."""
    name = model.rsplit("/", 1)[-1].lower()
    for prefix in _BY_LENGTH:
        if name == prefix or name.startswith(prefix + "-"):
            return CONTEXT_WINDOWS[prefix]
    return None
