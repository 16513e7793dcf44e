"""A gateway 429 or 503 told to a streaming Codex client as ``response.failed`` (issue 42).

Codex prints no body of an HTTP 429 or 503 it gave up retrying, only "exceeded retry limit,
last status: 429": the user never learns that fairgate's quota share, not the provider,
refused them, nor when to come back. Of a ``response.failed`` event it prints the error
message ("rate limit exceeded: <message>"). So the reason and the ``Retry-After`` go into that
message, worded "retry after N s" and not OpenAI's "Please try again in Ns": Codex would read
that as the delay of each of its five stream retries and sit silent for five times the wait
(seen: "Reconnecting... 1/5" for minutes); this way its retries, which the gateway refuses at
once without spending anything upstream, end in seconds with the reason shown. The HTTP
status and headers (``Retry-After``, ``x-ratelimit-*``) stay what they were for every other
client, which keeps the HTTP error: this is only for a streaming ``/v1/responses`` request
from a client that says it is Codex (its ``originator`` header).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.responses import Response

from fairgate.formats.responses import ChatToResponsesStream
from fairgate.formats.sse import encode_event

__all__ = ["codex_failed_stream"]

#: Refusals a streaming Codex client is told as ``response.failed`` (with the reason), and the
#: error code each gets there.
_SHOWN_AS_FAILED = {429: "rate_limit_exceeded", 503: "server_is_overloaded"}

#: Headers of the error answer that describe the transfer, not the answer: not copied over.
_FRAMING = frozenset({"content-length", "content-type", "transfer-encoding"})


def codex_failed_stream(
    resp: Response, body: Mapping[str, Any] | None, headers: Mapping[str, str], created: int
) -> Response | None:
    """``resp`` (a refusal of a Responses request) as the ``response.failed`` stream Codex
    reads, or None when it stays as it is: not a 429/503, not a stream, not Codex."""
    code = _SHOWN_AS_FAILED.get(resp.status_code)
    if code is None or body is None or body.get("stream") is not True:
        return None
    if not headers.get("originator", "").startswith("codex"):
        return None
    try:
        err = orjson.loads(bytes(resp.body)).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        err = {}
    message = str(err.get("message") or "the gateway refused the request")
    retry = resp.headers.get("retry-after")
    if retry and retry.isdigit():
        message += f"; retry after {retry} s"
    conv = ChatToResponsesStream(body, str(body.get("model")), created=created)
    events = conv.start() + conv.fail(message, code)
    return Response(
        b"".join(encode_event(orjson.dumps(e), e["type"]) for e in events),
        status_code=200,
        media_type="text/event-stream",
        headers={k: v for k, v in resp.headers.items() if k.lower() not in _FRAMING},
    )
