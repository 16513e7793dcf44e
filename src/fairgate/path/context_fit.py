"""A context that fits the fallback (issue 46): the window check and the compression rule.

When a combo's next target has a context window (its own ``contextWindow``, else the
catalogue's, :mod:`fairgate.providers.context_windows`) smaller than the conversation plus the
output it may produce, sending it is a certain 400 that costs an attempt. With the combo's
``contextCompression`` rule the target gets a version that fits: the system prompt and the last
``keepLastTurns`` messages, the middle dropped, never a tool call split from its result (nor a
conversation that starts anywhere but at a user turn); the answer says so in the
``x-fairgate-context-compressed`` header. Without a rule, or when even that does not fit, the
target is skipped with the reason ``context-window`` in the diagnostics.

The size is the project's one estimate (:func:`~fairgate.formats.usage.estimate_prompt_tokens`,
four characters a token): the tokenizers that count exactly (tiktoken's BPE tables) load their
data from the network at run time, which a gateway cannot count on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fairgate.providers.context_windows import context_window

__all__ = ["COMPRESSED_HEADER", "compress_messages", "window_of"]

#: The answer header that says the conversation was compressed to fit, and how many messages
#: of its middle were left out.
COMPRESSED_HEADER = "x-fairgate-context-compressed"

_SYSTEM_ROLES = frozenset({"system", "developer"})


def window_of(configured: int | None, model: str) -> int | None:
    """A target's context window: as configured, else the catalogue's for its model."""
    return configured if configured is not None else context_window(model)


def _is_tool_result(msg: Mapping[str, Any]) -> bool:
    """An OpenAI ``tool`` message, or an Anthropic user turn carrying ``tool_result`` blocks:
    it belongs with the assistant turn before it."""
    if msg.get("role") in ("tool", "function"):
        return True
    content = msg.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def _cut(messages: Sequence[Any], start: int, keep_last: int) -> int:
    """Where the kept tail begins: ``keep_last`` messages from the end, moved earlier while
    it would begin with a tool result (its call kept with it) or a non-user turn."""
    cut = max(start, len(messages) - keep_last)
    while cut > start:
        msg = messages[cut]
        if not isinstance(msg, dict):
            break
        if _is_tool_result(msg) or msg.get("role") != "user":
            cut -= 1
            continue
        break
    return cut


def compress_messages(body: Mapping[str, Any], keep_last: int) -> tuple[dict[str, Any], int] | None:
    """``body`` with its conversation's middle dropped (system messages at its start and the
    last ``keep_last`` messages kept, see :func:`_cut`) and how many messages were dropped;
    None when nothing can be dropped."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    start = 0
    while (
        start < len(messages)
        and isinstance(messages[start], dict)
        and messages[start].get("role") in _SYSTEM_ROLES
    ):
        start += 1
    cut = _cut(messages, start, keep_last)
    dropped = cut - start
    if dropped <= 0:
        return None
    return {**body, "messages": messages[:start] + messages[cut:]}, dropped
