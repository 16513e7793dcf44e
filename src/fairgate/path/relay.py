"""Stream relays: upstream SSE → client SSE, event by event, never buffering the stream.

Each relay is an async generator of bytes for a ``StreamingResponse`` and fills a
:class:`StreamTally` as it goes (usage, text length, whether the stream finished), so that the
caller can settle the quota reservation with what was really streamed, also when the client goes
away mid-stream (the generator is then cancelled; settlement happens in the caller's ``finally``).
"""

from __future__ import annotations

import time
import typing
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from fairgate.domain.connections import Protocol
from fairgate.formats.responses import ChatToResponsesStream
from fairgate.formats.responses_upstream import ResponsesToChatStream
from fairgate.formats.sse import SSEParser, encode_event
from fairgate.formats.translate import AnthropicToOpenAIStream, OpenAIToAnthropicStream
from fairgate.formats.usage import (
    Usage,
    estimate_text_tokens,
    merge_anthropic_usage,
    usage_from_anthropic,
    usage_from_openai,
)
from fairgate.providers.transport import UpstreamResponse


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
    #: the relay says itself when the stream carried an error (``failed``); else the first
    #: chunks are scanned for an error object (a Responses stream names ``"error": null`` in
    #: every response object it carries, so its relays say it instead)
    scan_errors: bool = True
    failed: bool = False

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


def _object(data: str) -> dict[str, Any] | None:
    """An event's data as the JSON object it should be; None for anything else (``[DONE]``,
    a keep-alive, a line cut short), which a translation skips and a pass-through relays."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


async def _objects(resp: UpstreamResponse) -> AsyncIterator[tuple[str | None, dict[str, Any]]]:
    """The stream's events that are JSON objects, with their names: what a translation reads."""
    async for event, data in _events(resp):
        obj = _object(data)
        if obj is not None:
            yield event, obj


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
        obj = _object(data)
        if obj is not None:
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


class _ChunkTranslator(typing.Protocol):
    """An upstream event stream → chat chunks, one event at a time (both directions that end
    in the chat form: from Anthropic events and from Responses events)."""

    @property
    def usage(self) -> Usage | None: ...

    def feed(self, event: str | None, data: Mapping[str, Any]) -> list[dict[str, Any]]: ...

    def finish(self) -> list[dict[str, Any]]: ...


#: The wires whose streams are translated into chat chunks, and the translator of each.
_TO_CHAT: Mapping[Protocol, Callable[[str, bool, int, str], _ChunkTranslator]] = {
    Protocol.ANTHROPIC: AnthropicToOpenAIStream,
    Protocol.RESPONSES: ResponsesToChatStream,
}


def to_chat(
    resp: UpstreamResponse,
    tally: StreamTally,
    wire: Protocol,
    *,
    model: str,
    client_wants_usage: bool,
    created: int,
    id_: str,
) -> AsyncIterator[bytes]:
    """An Anthropic-wire or Responses-wire upstream → OpenAI chat chunks."""
    tr = _TO_CHAT[wire](model, client_wants_usage, created, id_)
    return _to_chat(resp, tally, tr)


async def _to_chat(
    resp: UpstreamResponse, tally: StreamTally, tr: _ChunkTranslator
) -> AsyncIterator[bytes]:
    async for event, obj in _objects(resp):
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


async def openai_to_anthropic(
    resp: UpstreamResponse, tally: StreamTally, *, model: str, id_: str
) -> AsyncIterator[bytes]:
    tr = OpenAIToAnthropicStream(model, id_)
    async for _event, obj in _objects(resp):
        for name, payload in _anthropic_events(tr, tally, obj):
            yield encode_event(orjson.dumps(payload), name)
        tally.usage = tr.usage
    for closing in _anthropic_finish(tr, tally):
        yield closing
    tally.usage = tr.usage


async def responses_to_anthropic(
    resp: UpstreamResponse, tally: StreamTally, *, model: str, created: int, id_: str
) -> AsyncIterator[bytes]:
    """A Responses-wire upstream → Anthropic events, through the chat chunk form."""
    chat = ResponsesToChatStream(model, True, created, id_)
    tr = OpenAIToAnthropicStream(model, id_)
    async for event, obj in _objects(resp):
        for chunk in chat.feed(event, obj):
            for name, payload in _anthropic_events(tr, tally, chunk):
                yield encode_event(orjson.dumps(payload), name)
    for chunk in chat.finish():
        for name, payload in _anthropic_events(tr, tally, chunk):
            yield encode_event(orjson.dumps(payload), name)
    for closing in _anthropic_finish(tr, tally):
        yield closing
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


def _anthropic_finish(tr: OpenAIToAnthropicStream, tally: StreamTally) -> list[bytes]:
    """The closing Anthropic events a translation owes once the upstream stream has ended."""
    out = []
    for name, payload in tr.finish():
        tally.finished = tally.finished or name == "message_stop"
        out.append(encode_event(orjson.dumps(payload), name))
    return out


# -- the Responses API's client route ------------------------------------------------------------

#: Responses events whose ``delta`` is output (text, tool-call input, reasoning a client sees).
_RESPONSES_OUTPUT = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
    }
)
#: The events that end a Responses stream with an answer.
_RESPONSES_DONE = frozenset({"response.completed", "response.incomplete"})


def _responses_tally(obj: Mapping[str, Any], tally: StreamTally) -> None:
    """Count one Responses event: output characters, the final usage, how it ended."""
    kind = obj.get("type")
    if kind in _RESPONSES_OUTPUT:
        delta = obj.get("delta")
        if isinstance(delta, str):
            tally.text_chars += len(delta)
    elif kind in _RESPONSES_DONE or kind == "response.failed":
        resp = obj.get("response")
        usage = usage_from_openai(resp) if isinstance(resp, Mapping) else None
        if usage is not None:
            tally.usage = usage
        if kind == "response.failed":
            tally.failed = True
        else:
            tally.finished = True
    elif kind == "error":
        tally.failed = True


def cut_off_event(last: Mapping[str, Any] | None, sequence_number: int) -> dict[str, Any]:
    """``response.failed`` for a Responses stream the upstream ended before its last event:
    never silence, which a client could take for the whole answer (issue 42)."""
    resp: dict[str, Any] = dict(last) if last is not None else {"object": "response"}
    resp["status"] = "failed"
    resp["error"] = {
        "code": "server_error",
        "message": "the upstream ended the stream before it finished",
    }
    return {"type": "response.failed", "sequence_number": sequence_number, "response": resp}


async def responses_to_responses(
    resp: UpstreamResponse, tally: StreamTally
) -> AsyncIterator[bytes]:
    """A Responses-wire upstream to a Responses client: every event as it came (reasoning
    items, encrypted content, summaries, custom tool calls, whatever a newer API adds), only
    read for the usage ``response.completed`` carries. A stream cut off before its last event
    ends with ``response.failed``."""
    tally.scan_errors = False
    last: Mapping[str, Any] | None = None
    seq = -1
    ended = False
    async for event, data in _events(resp):
        obj = _object(data)
        if obj is not None:
            _responses_tally(obj, tally)
            snapshot = obj.get("response")
            if isinstance(snapshot, Mapping):
                last = snapshot
            n = obj.get("sequence_number")
            if isinstance(n, int) and not isinstance(n, bool):
                seq = max(seq, n)
            ended = ended or tally.finished or tally.failed
        tally.mark_chunk()
        yield encode_event(data, event)
    if not ended:
        failed = cut_off_event(last, seq + 1)
        tally.failed = True
        yield encode_event(orjson.dumps(failed), "response.failed")


def _responses_encoded(events: list[dict[str, Any]], tally: StreamTally) -> bytes:
    for e in events:
        _responses_tally(e, tally)
        tally.mark_chunk()
    return b"".join(encode_event(orjson.dumps(e), e["type"]) for e in events)


async def chat_chunks_to_responses(
    chunks: AsyncIterator[dict[str, Any]], tally: StreamTally, conv: ChatToResponsesStream
) -> AsyncIterator[bytes]:
    """Chat chunk dicts → a Responses client's events, one chunk at a time: the one
    re-rendering of every translated Responses stream (from an OpenAI chat upstream, from an
    Anthropic upstream through the chat form, from a combo's chat answer). An error object
    among the chunks closes with ``response.failed``; a stream that ends without its finish
    reason too (``ChatToResponsesStream.finish``)."""
    tally.scan_errors = False
    yield _responses_encoded(conv.start(), tally)
    async for chunk in chunks:
        err = chunk.get("error")
        if isinstance(err, Mapping) and "choices" not in chunk:
            out = conv.fail(str(err.get("message") or "upstream error"))
        else:
            out = conv.feed(chunk)
        if out:
            yield _responses_encoded(out, tally)
    tail = conv.finish()
    if tail:
        yield _responses_encoded(tail, tally)


async def _chat_sse_chunks(raw: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """The chunk dicts of a chat SSE byte stream (``[DONE]`` and what is no object left out)."""
    parser = SSEParser()

    def objects(events: list[Any]) -> list[dict[str, Any]]:
        out = []
        for ev in events:
            if ev.data == "[DONE]":
                continue
            try:
                obj = orjson.loads(ev.data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out

    async for chunk in raw:
        for obj in objects(parser.feed(chunk)):
            yield obj
    for obj in objects(parser.flush()):
        yield obj


def chat_sse_to_responses(
    raw: AsyncIterator[bytes], tally: StreamTally, conv: ChatToResponsesStream
) -> AsyncIterator[bytes]:
    """A chat SSE byte stream (an OpenAI upstream's, a combo's answer) → Responses events."""
    return chat_chunks_to_responses(_chat_sse_chunks(raw), tally, conv)


async def _anthropic_chat_chunks(
    resp: UpstreamResponse, tr: AnthropicToOpenAIStream
) -> AsyncIterator[dict[str, Any]]:
    async for event, obj in _objects(resp):
        for chunk in tr.feed(event, obj):
            yield chunk
    for chunk in tr.finish():
        yield chunk


def anthropic_to_responses(
    resp: UpstreamResponse,
    tally: StreamTally,
    conv: ChatToResponsesStream,
    tr: AnthropicToOpenAIStream,
) -> AsyncIterator[bytes]:
    """An Anthropic upstream → Responses events, through the chat chunk form."""
    return chat_chunks_to_responses(_anthropic_chat_chunks(resp, tr), tally, conv)
