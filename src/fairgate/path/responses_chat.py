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
from collections.abc import Awaitable, Callable

import orjson
from starlette.responses import Response, StreamingResponse

from fairgate.formats.responses import (
    ChatToResponsesStream,
    chat_to_responses_response,
    omitted_tools,
    responses_to_chat_request,
)
from fairgate.formats.responses_tools import TOOLS_OMITTED_HEADER
from fairgate.formats.translate import CannotCarry
from fairgate.path import relay
from fairgate.path.call import Call, Route
from fairgate.process.errors import ApiError

__all__ = ["served_as_chat"]

#: Headers of the chat answer that describe the transfer, not the answer: not copied over.
_FRAMING = frozenset({"content-length", "content-type", "transfer-encoding"})


def _carry(resp: Response, call: Call) -> dict[str, str]:
    """The chat answer's headers, and the hosted tools of the request left out of the chat
    form (Codex sends ``web_search``; a chat upstream runs none)."""
    out = {k: v for k, v in resp.headers.items() if k.lower() not in _FRAMING}
    omitted = omitted_tools(call.body)
    if omitted:
        out[TOOLS_OMITTED_HEADER] = ", ".join(omitted)
    return out


async def served_as_chat(call: Call, serve: Callable[[Call], Awaitable[Response]]) -> Response:
    """Serve a Responses ``call`` through ``serve`` as a chat completion (a 400 naming the
    field for what the chat form cannot carry), the answer in the Responses shapes."""
    try:
        chat = responses_to_chat_request(call.body, call.model)
    except CannotCarry as exc:
        raise ApiError(400, f"'{exc.field}': {exc.message}", param=exc.field) from None
    resp = await serve(dataclasses.replace(call, route=Route.CHAT, body=chat))
    if resp.status_code != 200:
        return resp  # an error: the OpenAI error body is the Responses API's too
    created = call.svc.state.clock.now_ms() // 1000
    if isinstance(resp, StreamingResponse):
        conv = ChatToResponsesStream(call.body, call.model, created=created)
        return StreamingResponse(
            relay.chat_sse_to_responses(_bytes(resp), relay.StreamTally(), conv),
            status_code=200,
            media_type="text/event-stream",
            headers=_carry(resp, call),
        )
    answer = orjson.loads(bytes(resp.body))
    stamp = answer.get("created")
    out = chat_to_responses_response(
        answer, call.body, call.model, created=stamp if isinstance(stamp, int) else created
    )
    return Response(
        orjson.dumps(out),
        status_code=200,
        media_type="application/json",
        headers=_carry(resp, call),
        background=resp.background,  # the settlement of the chat answer
    )


async def _bytes(resp: StreamingResponse):  # type: ignore[no-untyped-def]
    """The chat stream's chunks as bytes; closing this generator (the client left) closes
    the chat stream, whose own clean-up settles."""
    inner = resp.body_iterator
    try:
        async for raw in inner:
            yield raw if isinstance(raw, bytes) else str(raw).encode()
    finally:
        aclose = getattr(inner, "aclose", None)
        if aclose is not None:
            await aclose()
