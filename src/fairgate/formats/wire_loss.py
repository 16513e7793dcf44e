"""What a translated request leaves out, named (issue 42, item 3).

A Responses request relayed to a Responses-wire connection keeps every field. Translated to an
OpenAI chat or Anthropic connection, the fields that change the answer are carried or refused
with a 400 naming them (:mod:`fairgate.formats.responses`); what remains are fields that
only steer OpenAI's own service (its prompt cache, its stored state, its tiers) or ask for
OpenAI-only output (encrypted reasoning, a reasoning summary): no other wire has a place for
them. Those are left out, and never silently: the answer names them in
``x-fairgate-omitted``, so a client can see why, say, no reasoning summary came back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "OMITTED_HEADER",
    "omitted_chat_to_anthropic",
    "omitted_in_translation",
    "omitted_messages_to_chat",
]

#: The answer header that names what the translation left out (comma separated).
OMITTED_HEADER = "x-fairgate-omitted"

#: Top-level Responses fields with no chat or Anthropic equivalent.
_NO_PLACE = (
    "include",
    "prompt_cache_key",
    "prompt_cache_retention",
    "service_tier",
    "truncation",
    "metadata",
    "max_tool_calls",
    "top_logprobs",
    "background",
)


def omitted_in_translation(body: Mapping[str, Any]) -> list[str]:
    """The fields of a Responses ``body`` the chat form leaves out, as ``a.b`` paths, in a
    stable order: top-level fields, ``text.verbosity``, ``reasoning.summary``, and
    ``input.reasoning`` when the input holds reasoning items (OpenAI's encrypted state, which
    only OpenAI can read). O(fields + input items)."""
    out = [name for name in _NO_PLACE if body.get(name) not in (None, [], {})]
    text = body.get("text")
    if isinstance(text, Mapping) and text.get("verbosity") is not None:
        out.append("text.verbosity")
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and reasoning.get("summary") not in (None, "none"):
        out.append("reasoning.summary")
    items = body.get("input")
    if isinstance(items, list) and any(
        isinstance(i, Mapping) and i.get("type") == "reasoning" for i in items
    ):
        out.append("input.reasoning")
    return out


#: Chat fields an Anthropic request has no place for (sampling penalties, log probabilities,
#: a seed, OpenAI's service options and reasoning effort, which Anthropic sets per model).
_CHAT_ONLY = (
    "logprobs",
    "top_logprobs",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "reasoning_effort",
    "service_tier",
    "prediction",
    "prompt_cache_key",
    "verbosity",
    "web_search_options",
)


def omitted_chat_to_anthropic(body: Mapping[str, Any]) -> list[str]:
    """The fields of a chat ``body`` an Anthropic request leaves out (``n`` above 1: one
    choice is answered)."""
    out = [name for name in _CHAT_ONLY if body.get(name) not in (None, False)]
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        out.append("n")
    return out


#: Anthropic Messages fields an OpenAI chat request has no place for: ``thinking`` (OpenAI's
#: reasoning models think by their own effort setting, and sending one to a model without
#: reasoning is refused, so a budget is not turned into an effort), Anthropic's tools and
#: context services, its tiers.
_MESSAGES_ONLY = ("top_k", "thinking", "container", "mcp_servers", "context_management")


def omitted_messages_to_chat(body: Mapping[str, Any]) -> list[str]:
    """The fields of an Anthropic ``body`` a chat (or Responses) request leaves out."""
    out = [name for name in _MESSAGES_ONLY if body.get(name) not in (None, [], {})]
    if body.get("service_tier") not in (None, "auto"):
        out.append("service_tier")
    config = body.get("output_config")
    if isinstance(config, Mapping) and config.get("effort") is not None:
        out.append("output_config.effort")
    return out
