"""What fairgate says to providers: the wire formats and their translations.

Chat completions, Anthropic messages and the Responses API: translation between them
(``translate``, ``responses``, ``responses_upstream``), server-sent events (``sse``), usage as
each wire reports it (``usage``) and prices (``pricing``). Pure functions over bodies and events:
how the bytes travel is ``fairgate.providers``' concern.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fairgate.surface import lazy_surface

if TYPE_CHECKING:
    from fairgate.formats.pricing import PriceTable
    from fairgate.formats.responses import (
        ChatToResponsesStream,
        chat_to_responses_response,
        omitted_tools,
        responses_to_chat_request,
    )
    from fairgate.formats.responses_tools import TOOLS_OMITTED_HEADER
    from fairgate.formats.responses_upstream import (
        ResponsesToChatStream,
        completed_of,
        upstream_responses_answer,
        upstream_responses_body,
    )
    from fairgate.formats.sse import SSEParser, encode_event
    from fairgate.formats.translate import (
        AnthropicToOpenAIStream,
        CannotCarry,
        OpenAIToAnthropicStream,
        anthropic_to_openai_request,
        anthropic_to_openai_response,
        openai_to_anthropic_request,
        openai_to_anthropic_response,
        uses_max_completion_tokens,
    )
    from fairgate.formats.usage import (
        Usage,
        estimate_prompt_tokens,
        estimate_text_tokens,
        merge_anthropic_usage,
        usage_from_anthropic,
        usage_from_openai,
    )
    from fairgate.formats.wire_loss import (
        OMITTED_HEADER,
        omitted_chat_to_anthropic,
        omitted_in_translation,
        omitted_messages_to_chat,
    )
else:  # mypy reads the imports; a run loads each name on first use
    __getattr__ = lazy_surface(__name__)

__all__ = [
    "OMITTED_HEADER",
    "TOOLS_OMITTED_HEADER",
    "AnthropicToOpenAIStream",
    "CannotCarry",
    "ChatToResponsesStream",
    "OpenAIToAnthropicStream",
    "PriceTable",
    "ResponsesToChatStream",
    "SSEParser",
    "Usage",
    "anthropic_to_openai_request",
    "anthropic_to_openai_response",
    "chat_to_responses_response",
    "completed_of",
    "encode_event",
    "estimate_prompt_tokens",
    "estimate_text_tokens",
    "merge_anthropic_usage",
    "omitted_chat_to_anthropic",
    "omitted_in_translation",
    "omitted_messages_to_chat",
    "omitted_tools",
    "openai_to_anthropic_request",
    "openai_to_anthropic_response",
    "responses_to_chat_request",
    "upstream_responses_answer",
    "upstream_responses_body",
    "usage_from_anthropic",
    "usage_from_openai",
    "uses_max_completion_tokens",
]
