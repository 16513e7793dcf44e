"""``POST /v1/responses``: the OpenAI Responses API for clients, served by the chat route.

The request is translated to fairgate's chat form (:mod:`fairgate.providers.responses`), then
admitted, routed, settled and translated to whatever upstream the chat route picks, exactly as
a chat completion; only the answer is rendered back in the Responses shapes: a ``response``
object, or the ``response.*`` event stream. Errors keep the OpenAI error body, which is what
Responses clients read too.

Decided here (see the module notes of the translation for the field mapping):
``previous_response_id`` is a 400 naming the field — fairgate stores no responses, so clients
send the whole conversation (as ``store: false`` clients do); ``store`` is accepted and
answered ``false``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse

from fairgate.providers.responses import (
    ChatToResponsesStream,
    ResponsesInputError,
    chat_to_responses_response,
    omitted_tools,
    responses_to_chat_request,
)
from fairgate.providers.responses_tools import TOOLS_OMITTED_HEADER
from fairgate.providers.sse import SSEParser, encode_event
from fairgate.server import proxy
from fairgate.server.client_http import ClientRequest
from fairgate.server.errors import ApiError

__all__ = ["responses"]

#: Headers of the chat answer that describe the transfer, not the answer: not copied over.
_FRAMING = frozenset({"content-length", "content-type", "transfer-encoding"})


def _carry(resp: Response, original: dict[str, Any]) -> dict[str, str]:
    """The chat answer's headers, and the hosted tools of the request that were left out of the
    upstream request (Codex sends web_search and tool_search; a chat upstream runs neither)."""
    out = {k: v for k, v in resp.headers.items() if k.lower() not in _FRAMING}
    omitted = omitted_tools(original)
    if omitted:
        out[TOOLS_OMITTED_HEADER] = ", ".join(omitted)
    return out


async def responses(request: ClientRequest) -> Response:
    original: dict[str, Any] = {}

    def prepare(body: dict[str, Any]) -> dict[str, Any]:
        original.update(body)
        model = body.get("model")
        try:
            return responses_to_chat_request(body, model if isinstance(model, str) else "")
        except ResponsesInputError as exc:
            raise ApiError(400, f"'{exc.field}': {exc.message}", param=exc.field) from None

    resp = await proxy.chat_from(request, prepare)
    if (
        resp.status_code in _SHOWN_AS_FAILED
        and original.get("stream") is True
        and request.headers.get("originator", "").startswith("codex")
    ):
        return _failed_stream(resp, original, proxy.now_s(request))
    if resp.status_code != 200 or not original:
        return resp  # an error: the OpenAI error body is the Responses API's too
    model = str(original.get("model"))
    if isinstance(resp, StreamingResponse):
        return StreamingResponse(
            _events(resp, original, model, proxy.now_s(request)),
            status_code=200,
            media_type="text/event-stream",
            headers=_carry(resp, original),
        )
    chat = orjson.loads(bytes(resp.body))
    stamp = chat.get("created")
    created = stamp if isinstance(stamp, int) else proxy.now_s(request)
    out = chat_to_responses_response(chat, original, model, created=created)
    return Response(
        orjson.dumps(out),
        status_code=200,
        media_type="application/json",
        headers=_carry(resp, original),
        background=resp.background,  # the settlement of the chat answer
    )


#: Refusals a streaming Codex client is told as ``response.failed`` (with the reason), and the
#: error code each gets there.
_SHOWN_AS_FAILED = {429: "rate_limit_exceeded", 503: "server_is_overloaded"}


def _failed_stream(resp: Response, original: dict[str, Any], created: int) -> Response:
    """A 429 or 503 of the gateway as the ``response.failed`` stream the Codex CLI reads.

    Codex prints no body of an HTTP 429 or 503 it gave up retrying, only "exceeded retry limit,
    last status: 429" (issue 42): the user never learns that fairgate's quota share, not the
    provider, refused them, nor when to come back. Of a ``response.failed`` event it prints the
    error message ("rate limit exceeded: <message>"). So the reason and the ``Retry-After`` go
    into that message, worded "retry after N s" and not OpenAI's "Please try again in Ns":
    Codex would read that as the delay of each of its five stream retries and sit silent for
    five times the wait (seen: "Reconnecting... 1/5" for minutes); this way its retries, which
    the gateway refuses at once without spending anything upstream, end in seconds with the
    reason shown. The HTTP status and headers (``Retry-After``,
    ``x-ratelimit-*``) stay what they were for every other client, which keeps the HTTP error:
    this is only for a client that says it is Codex (its ``originator`` header)."""
    try:
        err = orjson.loads(bytes(resp.body)).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        err = {}
    message = str(err.get("message") or "the gateway refused the request")
    retry = resp.headers.get("retry-after")
    if retry and retry.isdigit():
        message += f"; retry after {retry} s"
    conv = ChatToResponsesStream(original, str(original.get("model")), created=created)
    events = conv.start() + conv.fail(message, _SHOWN_AS_FAILED[resp.status_code])
    return Response(
        _encode(events),
        status_code=200,
        media_type="text/event-stream",
        headers=_carry(resp, original),
    )


def _encode(events: list[dict[str, Any]]) -> bytes:
    return b"".join(encode_event(orjson.dumps(e), e["type"]) for e in events)


async def _events(
    resp: StreamingResponse, original: dict[str, Any], model: str, created: int
) -> AsyncIterator[bytes]:
    """The chat chunk stream re-rendered as Responses events, one chunk at a time. Closing
    this generator (the client left) closes the chat stream, whose own clean-up settles."""
    conv = ChatToResponsesStream(original, model, created=created)
    parser = SSEParser()
    inner = resp.body_iterator
    yield _encode(conv.start())
    try:
        async for raw in inner:
            chunk = raw if isinstance(raw, bytes) else str(raw).encode()
            out: list[dict[str, Any]] = []
            for ev in parser.feed(chunk):
                out += _convert(conv, ev.data)
            if out:
                yield _encode(out)
        tail = [e for ev in parser.flush() for e in _convert(conv, ev.data)]
        yield _encode(tail + conv.finish())
    finally:
        aclose = getattr(inner, "aclose", None)
        if aclose is not None:
            await aclose()


def _convert(conv: ChatToResponsesStream, data: str) -> list[dict[str, Any]]:
    if data == "[DONE]":
        return []
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return []
    if not isinstance(obj, dict):
        return []
    err = obj.get("error")
    if isinstance(err, dict) and "choices" not in obj:
        return conv.fail(str(err.get("message") or "upstream error"))
    return conv.feed(obj)
