"""An in-process :class:`~fairgate.providers.transport.Upstream`: a handler function answers.

What httpx's ``MockTransport`` is to httpx: the whole request path (admission, routing,
failover, translation, streaming, settlement) runs for real, only the provider is a Python
function in the same event loop. A handler receives the :class:`UpstreamRequest` exactly as it
would go over the wire (path, encoded body, the headers with our credentials) and returns a
:class:`Reply`, or raises what a network would (``ConnectionRefusedError``, ``TimeoutError``).
Tests then take milliseconds and need no ports, processes or sleeps; the subprocess tests
against the mock provider cover the wire itself.

:func:`openai_chat` and :func:`anthropic_message` build the providers' documented answer
shapes, so a handler can stay one line.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from fairgate.domain.connections import Connection
from fairgate.providers.transport import UpstreamBroken, UpstreamResponse
from fairgate.providers.upstream import upstream_headers

__all__ = [
    "Handler",
    "HandlerUpstream",
    "Reply",
    "UpstreamRequest",
    "anthropic_message",
    "openai_chat",
]


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    """One request as the provider would receive it."""

    conn: Connection
    path: str
    body: bytes
    headers: Mapping[str, str]

    def json(self) -> dict[str, Any]:
        obj = orjson.loads(self.body)
        assert isinstance(obj, dict)
        return obj


@dataclass(frozen=True, slots=True)
class Reply:
    """A handler's answer. ``body``: bytes, or a JSON-able object encoded for you. ``chunks``
    makes it a stream (SSE bytes as they would arrive); an exception among them is raised at
    that point of the read, as a connection that broke mid-stream."""

    status: int = 200
    body: bytes | dict[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    chunks: Sequence[bytes | BaseException] | None = None


Handler = Callable[[UpstreamRequest], Awaitable[Reply]]


class _Response:
    __slots__ = ("_chunks", "_headers", "_status", "released")

    def __init__(self, reply: Reply) -> None:
        self._status = reply.status
        headers = CIMultiDict(reply.headers)
        body = reply.body
        if reply.chunks is not None:
            self._chunks: list[bytes | BaseException] = list(reply.chunks)
            headers.setdefault("content-type", "text/event-stream")
        else:
            raw = body if isinstance(body, bytes) else orjson.dumps(body or {})
            self._chunks = [raw]
            headers.setdefault("content-type", "application/json")
        self._headers = CIMultiDictProxy(headers)
        self.released = False

    @property
    def status(self) -> int:
        return self._status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._headers

    async def read(self) -> bytes:
        out = bytearray()
        async for chunk in self.chunks():
            out += chunk
        return bytes(out)

    async def read_prefix(self, limit: int) -> bytes:
        return (await self.read())[:limit]

    async def chunks(self) -> AsyncIterator[bytes]:
        while self._chunks:
            chunk = self._chunks.pop(0)
            if isinstance(chunk, BaseException):
                raise UpstreamBroken(type(chunk).__name__) from chunk
            yield chunk

    def release(self) -> None:
        self.released = True


class HandlerUpstream:
    """The :class:`~fairgate.providers.transport.Upstream` port answered by ``handler``.
    ``requests`` keeps every request it saw, in order (what a test asserts on)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[UpstreamRequest] = []

    async def post(
        self, conn: Connection, path: str, body: bytes, client_headers: Mapping[str, str]
    ) -> UpstreamResponse:
        req = UpstreamRequest(conn, path, body, upstream_headers(conn, client_headers))
        self.requests.append(req)
        return _Response(await self.handler(req))

    async def close(self) -> None:
        return None


def openai_chat(
    text: str,
    *,
    model: str = "m",
    prompt_tokens: int = 10,
    completion_tokens: int = 5,
    finish_reason: str | None = "stop",
) -> Reply:
    """A Chat Completions answer with usage."""
    return Reply(
        body={
            "id": "chatcmpl-inprocess",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


def anthropic_message(
    text: str,
    *,
    model: str = "m",
    input_tokens: int = 10,
    output_tokens: int = 5,
    stop_reason: str | None = "end_turn",
    thinking: str = "",
) -> Reply:
    """A Messages API answer with usage (an empty ``text`` is ``content: []``, as Anthropic
    answers an empty turn); a ``thinking`` text comes first, as a signed thinking block (the
    signature means nothing: only the provider that made one can read it)."""
    thought = [{"type": "thinking", "thinking": thinking, "signature": "sig"}] if thinking else []
    return Reply(
        body={
            "id": "msg_inprocess",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": thought + ([{"type": "text", "text": text}] if text else []),
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }
    )
