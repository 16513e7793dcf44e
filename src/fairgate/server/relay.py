"""Stream relays: upstream SSE → client SSE, event by event, never buffering the stream.

Each relay is an async generator of bytes for a ``StreamingResponse`` and fills a
:class:`StreamTally` as it goes (usage, text length, whether the stream finished), so that the
caller can settle the quota reservation with what was really streamed, also when the client goes
away mid-stream (the generator is then cancelled; settlement happens in the caller's ``finally``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from fairgate.providers.responses_upstream import ResponsesToChatStream
from fairgate.providers.sse import SSEParser, encode_event
from fairgate.providers.translate import AnthropicToOpenAIStream, OpenAIToAnthropicStream
from fairgate.providers.transport import UpstreamResponse
from fairgate.providers.usage import (
    Usage,
    estimate_text_tokens,
    merge_anthropic_usage,
    usage_from_anthropic,
    usage_from_openai,
)


@dataclass
class StreamTally:
    usage: Usage | None = None
    #: characters of output so far, reasoning included (the usage estimate of a cut stream)
    text_chars: int = 0
    #: of which reasoning / thinking (what a held-back stream may not show yet)
    reasoning_chars: int = 0
    #: the finish reason the stream stated (``length``, ``max_tokens``, ``stop``...), if any
    finish_reason: str | None = None
    finished: bool = False
    chunks: int = 0
    first_chunk_at: float | None = None
    prompt_estimate: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def effective_usage(self) -> Usage:
        """The provider's usage block when it came; otherwise what we saw (a client disconnect
        or a cut stream must still be charged for the text already produced)."""
        if self.usage is not None and (self.usage.prompt_tokens or self.usage.completion_tokens):
            return self.usage
        completion = estimate_text_tokens("x" * self.text_chars) if self.text_chars else 0
        return Usage(prompt_tokens=self.prompt_estimate, completion_tokens=completion)

    @property
    def answer_chars(self) -> int:
        """Characters of content or tool call: what is no longer reasoning alone."""
        return self.text_chars - self.reasoning_chars

    @property
    def truncated(self) -> bool:
        """The stream said its output budget ran out."""
        return self.finish_reason in ("length", "max_tokens")

    def mark_chunk(self) -> None:
        self.chunks += 1
        if self.first_chunk_at is None:
            self.first_chunk_at = time.perf_counter()


async def _events(resp: UpstreamResponse) -> AsyncIterator[tuple[str | None, str]]:
    parser = SSEParser()
    async for raw in resp.chunks():
        for ev in parser.feed(raw):
            yield ev.event, ev.data
    for ev in parser.flush():  # a last event whose closing blank line never came
        yield ev.event, ev.data


def _openai_text(obj: dict[str, Any], tally: StreamTally) -> tuple[int, bool]:
    """(characters of output in this chunk, whether it carries a finish_reason). Tool-call
    names and arguments count as output: a tool call is an answer too. The reasoning part of
    the output and the finish reason are noted in ``tally``."""
    n = 0
    finished = False
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta") or {}
        if isinstance(delta, dict):
            v = delta.get("content")
            if isinstance(v, str):
                n += len(v)
            v = delta.get("reasoning_content")
            if isinstance(v, str):
                n += len(v)
                tally.reasoning_chars += len(v)
            for call in delta.get("tool_calls") or ():
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    n += len(fn.get("name") or "") + len(fn.get("arguments") or "")
        reason = choice.get("finish_reason")
        if reason:
            finished = True
            tally.finish_reason = str(reason)
    return n, finished


async def openai_to_openai(
    resp: UpstreamResponse, tally: StreamTally, *, client_wants_usage: bool
) -> AsyncIterator[bytes]:
    """Pass OpenAI chunks through; drop the usage-only chunk we asked for on the client's behalf.
    The events are parsed here rather than through :func:`_events` (one generator less per
    event on the most common stream)."""
    parser = SSEParser()
    async for raw in resp.chunks():
        for ev in parser.feed(raw):
            out = _openai_event(ev.data, tally, client_wants_usage)
            if out is not None:
                yield out
    for ev in parser.flush():  # a last event whose closing blank line never came
        out = _openai_event(ev.data, tally, client_wants_usage)
        if out is not None:
            yield out


def _openai_event(data: str, tally: StreamTally, client_wants_usage: bool) -> bytes | None:
    """One OpenAI stream event as the client gets it (None: dropped), counted in ``tally``."""
    if data == "[DONE]":
        return b"data: [DONE]\n\n"
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return encode_event(data)
    if isinstance(obj, dict):
        u = usage_from_openai(obj)
        if u is not None:
            tally.usage = u
            if not obj.get("choices") and not client_wants_usage:
                return None
        n, finished = _openai_text(obj, tally)
        tally.text_chars += n
        tally.finished = tally.finished or finished
    tally.mark_chunk()
    return encode_event(data)


async def anthropic_to_anthropic(
    resp: UpstreamResponse, tally: StreamTally
) -> AsyncIterator[bytes]:
    seen: dict[str, Any] = {}  # the usage fields so far, the latest of each
    async for event, data in _events(resp):
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            kind = obj.get("type")
            if kind in ("message_start", "message_delta"):
                msg = obj.get("message") if kind == "message_start" else obj
                merge_anthropic_usage(seen, msg.get("usage") if isinstance(msg, dict) else None)
                delta = obj.get("delta") if kind == "message_delta" else None
                stop = delta.get("stop_reason") if isinstance(delta, dict) else None
                if isinstance(stop, str):
                    tally.finish_reason = stop
                if seen:
                    tally.usage = usage_from_anthropic({"usage": seen})
            elif kind == "content_block_delta":
                delta = obj.get("delta") or {}
                if isinstance(delta, dict):
                    for k in ("text", "thinking", "partial_json"):
                        v = delta.get(k)
                        if isinstance(v, str):
                            tally.text_chars += len(v)
                            if k == "thinking":
                                tally.reasoning_chars += len(v)
            elif kind == "message_stop":
                tally.finished = True
        tally.mark_chunk()
        yield encode_event(data, event)


class _ChunkTranslator(Protocol):
    """An upstream event stream → chat chunks, one event at a time (both directions that end
    in the chat form: from Anthropic events and from Responses events)."""

    @property
    def usage(self) -> Usage | None: ...

    def feed(self, event: str | None, data: Mapping[str, Any]) -> list[dict[str, Any]]: ...

    def finish(self) -> list[dict[str, Any]]: ...


async def _to_openai(
    resp: UpstreamResponse, tally: StreamTally, tr: _ChunkTranslator
) -> AsyncIterator[bytes]:
    async for event, data in _events(resp):
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        for chunk in tr.feed(event, obj):
            n, finished = _openai_text(chunk, tally)
            tally.text_chars += n
            tally.finished = tally.finished or finished
            tally.mark_chunk()
            yield encode_event(orjson.dumps(chunk))
        if tr.usage is not None:
            tally.usage = tr.usage
    for chunk in tr.finish():  # an upstream that stopped without its closing event
        yield encode_event(orjson.dumps(chunk))
    if tr.usage is not None:
        tally.usage = tr.usage
    yield b"data: [DONE]\n\n"


def anthropic_to_openai(
    resp: UpstreamResponse,
    tally: StreamTally,
    *,
    model: str,
    client_wants_usage: bool,
    created: int,
    id_: str,
) -> AsyncIterator[bytes]:
    return _to_openai(resp, tally, AnthropicToOpenAIStream(model, client_wants_usage, created, id_))


async def openai_to_anthropic(
    resp: UpstreamResponse, tally: StreamTally, *, model: str, id_: str
) -> AsyncIterator[bytes]:
    tr = OpenAIToAnthropicStream(model, id_)
    async for _event, data in _events(resp):
        if data == "[DONE]":
            continue
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        n, _ = _openai_text(obj, tally)
        tally.text_chars += n
        for name, payload in tr.feed(obj):
            tally.finished = tally.finished or name == "message_stop"
            tally.mark_chunk()
            yield encode_event(orjson.dumps(payload), name)
        tally.usage = tr.usage
    for name, payload in tr.finish():
        tally.finished = tally.finished or name == "message_stop"
        yield encode_event(orjson.dumps(payload), name)
    tally.usage = tr.usage


def responses_to_openai(
    resp: UpstreamResponse,
    tally: StreamTally,
    *,
    model: str,
    client_wants_usage: bool,
    created: int,
    id_: str,
) -> AsyncIterator[bytes]:
    """A Responses-wire upstream (the Codex backend) → OpenAI chat chunks."""
    return _to_openai(resp, tally, ResponsesToChatStream(model, client_wants_usage, created, id_))


async def responses_to_anthropic(
    resp: UpstreamResponse, tally: StreamTally, *, model: str, created: int, id_: str
) -> AsyncIterator[bytes]:
    """A Responses-wire upstream → Anthropic events, through the chat chunk form."""
    chat = ResponsesToChatStream(model, True, created, id_)
    tr = OpenAIToAnthropicStream(model, id_)
    async for event, data in _events(resp):
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        for chunk in chat.feed(event, obj):
            for name, payload in _anthropic_events(tr, tally, chunk):
                yield encode_event(orjson.dumps(payload), name)
    for chunk in chat.finish():
        for name, payload in _anthropic_events(tr, tally, chunk):
            yield encode_event(orjson.dumps(payload), name)
    for name, payload in tr.finish():
        tally.finished = tally.finished or name == "message_stop"
        yield encode_event(orjson.dumps(payload), name)
    tally.usage = chat.usage or tr.usage


def _anthropic_events(
    tr: OpenAIToAnthropicStream, tally: StreamTally, chunk: dict[str, Any]
) -> list[tuple[str, Any]]:
    n, _ = _openai_text(chunk, tally)
    tally.text_chars += n
    out = list(tr.feed(chunk))
    for name, _payload in out:
        tally.finished = tally.finished or name == "message_stop"
        tally.mark_chunk()
    return out
