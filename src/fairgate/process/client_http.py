"""What a ``/v1`` handler takes and returns: the client's request and its answer.

Starlette's ``Request`` decodes the raw header list again on every lookup (four per request on
the hot path: authorization, x-api-key, content-length, then the pin and forwarded headers), and
reads the body through an async generator over ``receive``. :class:`ClientRequest` is built by
the edge (:mod:`fairgate.process.edge`) from the one pass it makes over the headers anyway: a
plain dict of the decoded headers, and the ASGI ``receive`` for the body and the disconnect.
It has only what the request path reads; the admin API, the dashboard, ``/health`` and
``/metrics`` keep Starlette's. It lives in :mod:`fairgate.process.client_request` (re-exported
here), which imports no Starlette: the request path below its edge takes requests from there.

The answers are Starlette's ``Response`` and ``StreamingResponse`` (what the request path's
edge renders an outcome as, :mod:`fairgate.path.render`, and Starlette's router handles),
built without Starlette's per-answer header normalisation and background-task inspection,
and carrying the two facts the request's metrics
need (the serving connection, the gateway's own time) as attributes instead of headers to be
parsed back. What goes on the wire is what Starlette would send for the same arguments: the
given headers (names lower-cased), then ``content-length`` and ``content-type`` unless given.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from fairgate.process.client_request import ClientRequest, decode_headers
from fairgate.process.errors import ApiError, anthropic_error_body, openai_error_body

__all__ = ["Answer", "ClientRequest", "Later", "StreamAnswer", "decode_headers"]

_JSON = (b"content-type", b"application/json")
#: what Starlette sends for ``media_type="text/event-stream"`` (a text type gets a charset)
_SSE = (b"content-type", b"text/event-stream; charset=utf-8")


class Later(BackgroundTask):
    """Starlette's ``BackgroundTask`` for a function that returns an awaitable (a coroutine
    function, or a traced one), without the inspection Starlette's runs for every answer to
    tell coroutine functions from functions it must run in a thread."""

    def __init__(self, func: Callable[..., Awaitable[Any]], *args: Any) -> None:
        # the attributes Starlette's __init__ sets (typed there by its ParamSpec)
        self.func = func
        self.args = args  # type: ignore[assignment]
        self.kwargs = {}  # type: ignore[assignment]
        self.is_async = True


def _raw(
    headers: Mapping[str, str] | None, length: int | None, content_type: tuple[bytes, bytes]
) -> list[tuple[bytes, bytes]]:
    """The header list Starlette's ``init_headers`` builds: the given headers, names
    lower-cased, then a content length (``length`` None: none) and the content type unless
    they were given."""
    if not headers:
        raw: list[tuple[bytes, bytes]] = []
        if length is not None:
            raw.append((b"content-length", str(length).encode("latin-1")))
        raw.append(content_type)
        return raw
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    names = {name for name, _ in raw}
    if length is not None and b"content-length" not in names:
        raw.append((b"content-length", str(length).encode("latin-1")))
    if b"content-type" not in names:
        raw.append(content_type)
    return raw


class Answer(Response):
    """A whole JSON answer (a success or an error). ``served_by``: the connection that served
    it; ``overhead_ms``: the time the gateway itself added (both None on an error)."""

    media_type = "application/json"

    def __init__(
        self,
        body: bytes,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        background: BackgroundTask | None = None,
        *,
        served_by: str | None = None,
        overhead_ms: float | None = None,
    ) -> None:
        self.status_code = status_code
        self.body = body
        self.background = background
        # Starlette sends no length on a 1xx, 204 or 304 (no JSON answer has those)
        bodiless = status_code < 200 or status_code in (204, 304)
        self.raw_headers = _raw(headers, None if bodiless else len(body), _JSON)
        self.served_by = served_by
        self.overhead_ms = overhead_ms


class StreamAnswer(StreamingResponse):
    """A streamed answer (server-sent events); ``served_by`` and ``overhead_ms`` as
    :class:`Answer`'s."""

    media_type = "text/event-stream"

    def __init__(
        self,
        chunks: AsyncIterable[bytes],
        headers: Mapping[str, str] | None = None,
        *,
        served_by: str | None = None,
        overhead_ms: float | None = None,
    ) -> None:
        self.body_iterator = chunks
        self.status_code = 200
        self.background = None
        self.raw_headers = _raw(headers, None, _SSE)
        self.served_by = served_by
        self.overhead_ms = overhead_ms


def error_response(
    err: ApiError, *, anthropic: bool = False, headers: Mapping[str, str] | None = None
) -> Answer:
    """``err`` as the JSON answer its client's SDK understands (OpenAI's shape, or Anthropic's
    on ``/v1/messages``)."""
    body = anthropic_error_body(err) if anthropic else openai_error_body(err)
    if err.client_diagnostics is not None:
        body["diagnostics"] = err.client_diagnostics
    merged = {**err.headers, **headers} if headers else err.headers
    return Answer(orjson.dumps(body), err.status, merged)


#: The proxy's own answers, which carry the serving connection and the overhead.
_OURS = (Answer, StreamAnswer)


def answered(resp: Response) -> tuple[int, str | None, float | None]:
    """What the metrics count of an answer: its status, the connection that served it and the
    time the gateway added, from the attributes of the proxy's own answers, else from the
    ``x-fairgate-connection`` and ``x-fairgate-overhead-ms`` headers."""
    if isinstance(resp, _OURS):  # a tuple: a union would be built on every call
        return resp.status_code, resp.served_by, resp.overhead_ms
    headers = resp.headers
    raw = headers.get("x-fairgate-overhead-ms")
    try:
        overhead_ms = None if raw is None else float(raw)
    except ValueError:
        overhead_ms = None
    return resp.status_code, headers.get("x-fairgate-connection"), overhead_ms
