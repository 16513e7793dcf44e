"""A Responses API request served by the chat route, its answer rendered back.

Fusion and pipeline combos compose chat answers (they judge, chain and merge chat messages),
so a Responses request for such a combo is translated to the chat form once, served as a chat
completion, and the combo's answer (an object or a chunk stream) rendered as a Responses
object or event stream. Every other Responses request goes through the exchange table per
attempt instead (relayed as it is to a Responses-wire connection). Errors keep the OpenAI
error body, which is what Responses clients read too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson

from fairgate.formats.responses import (
    ChatToResponsesStream,
    chat_to_responses_response,
    omitted_tools,
    responses_to_chat_request,
)
from fairgate.formats.translate import CannotCarry
from fairgate.path import relay
from fairgate.path.call import Call, Route
from fairgate.path.outcome import Outcome
from fairgate.process.errors import ApiError

__all__ = ["served_as_chat"]


async def served_as_chat(call: Call, serve: Callable[[Call], Awaitable[Outcome]]) -> Outcome:
    """Serve a Responses ``call`` through ``serve`` as a chat completion (a 400 naming the
    field for what the chat form cannot carry), the answer in the Responses shapes; it keeps
    the chat answer's facts (who served, its admission, its settlement) and adds the hosted
    tools of the request the chat form left out (Codex sends ``web_search``; a chat upstream
    runs none)."""
    try:
        chat = responses_to_chat_request(call.body, call.model)
    except CannotCarry as exc:
        raise ApiError(400, f"'{exc.field}': {exc.message}", param=exc.field) from None
    out = await serve(dataclasses.replace(call, route=Route.CHAT, body=chat))
    omitted = omitted_tools(call.body)
    if omitted:
        out.tools_omitted = ", ".join(omitted)
    created = call.svc.state.clock.now_ms() // 1000
    if out.chunks is not None:
        conv = ChatToResponsesStream(call.body, call.model, created=created)
        out.chunks = relay.chat_sse_to_responses(_closing(out.chunks), relay.StreamTally(), conv)
        return out
    answer = orjson.loads(out.body)
    stamp = answer.get("created")
    out.body = orjson.dumps(
        chat_to_responses_response(
            answer, call.body, call.model, created=stamp if isinstance(stamp, int) else created
        )
    )
    return out


async def _closing(inner: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The chat stream's chunks; closing this generator (the client left) closes the chat
    stream, whose own clean-up settles."""
    try:
        async for raw in inner:
            yield raw
    finally:
        aclose = getattr(inner, "aclose", None)
        if aclose is not None:
            await aclose()
