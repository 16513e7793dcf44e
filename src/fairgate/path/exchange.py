"""The exchange: one entry per client route × upstream protocol.

A client speaks OpenAI chat completions, Anthropic messages or OpenAI embeddings; a connection
speaks OpenAI or Anthropic. Everything that depends on that pair is one :class:`Exchange` in
:data:`EXCHANGES`: the upstream path, how the client's body is encoded for the connection,
how the answer is decoded back (with its usage), and the stream relay. What depends on the
client route only (how a 200 is validated, how a stream reports a late error) is keyed by the
route. The request path looks the pair up once per attempt instead of branching on it in
several places; a pair missing from the table (embeddings to an Anthropic connection) is
never offered as a candidate.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from fairgate.domain.connections import BILLING_FIELDS, Connection, Protocol
from fairgate.formats.responses import (
    ChatToResponsesStream,
    chat_to_responses_response,
    omitted_tools,
    responses_to_chat_request,
)
from fairgate.formats.responses_upstream import (
    completed_of,
    upstream_responses_answer,
    upstream_responses_body,
)
from fairgate.formats.translate import (
    AnthropicToOpenAIStream,
    anthropic_to_openai_request,
    anthropic_to_openai_response,
    openai_to_anthropic_request,
    openai_to_anthropic_response,
    uses_max_completion_tokens,
)
from fairgate.formats.usage import Usage, usage_from_anthropic, usage_from_openai
from fairgate.formats.wire_loss import (
    omitted_chat_to_anthropic,
    omitted_in_translation,
    omitted_messages_to_chat,
)
from fairgate.path import relay
from fairgate.path.call import Call, Route
from fairgate.providers.transport import UpstreamResponse

__all__ = ["EXCHANGES", "Exchange", "carried", "quality_problem", "stream_error_event"]

JSON = dict[str, Any]
#: (payload for the upstream, whether the client asked for the stream's usage chunk)
#: A client body → the upstream's, given the upstream's model name and the output bound to send
#: when the client named none (None: leave the upstream's default; see ``_bounded``).
Encoder = Callable[[Call, str, int | None], tuple[JSON, bool]]
#: the upstream's parsed answer → (the client's answer, or None to pass the bytes as they are)
#: An upstream answer → the client's format, given the client's model name and ``created`` (the
#: gateway's clock, in seconds, for the answers it stamps); None when it is passed as it is.
Decoder = Callable[[JSON, str, int], JSON | None]
Relay = Callable[[Call, UpstreamResponse, bool, relay.StreamTally], AsyncIterator[bytes]]


#: A client body → the encoded upstream request, given the upstream's model name, the output
#: bound (as :data:`Encoder`) and the billing fields the connection lets clients set.
Body = Callable[[Call, str, int | None, tuple[str, ...]], tuple[bytes, bool]]
Answer = Callable[[Call, bytes, str], tuple[bytes, Usage | None, JSON | None]]


@dataclass(frozen=True, slots=True)
class Exchange:
    """``body``: the encoded request for the upstream and whether the client asked for stream
    usage (``orjson.JSONEncodeError`` when it cannot be encoded); ``answer``: a non-stream
    answer in the client's format, its usage and the parsed answer (for validation);
    ``relay``: the stream in the client's format."""

    path: str
    body: Body
    answer: Answer
    relay: Relay
    #: what the translation leaves out of the request, named in the answer's
    #: ``x-fairgate-omitted`` (fields no other wire has a place for; never what changes the
    #: answer, which is carried or refused)
    omitted: Callable[[Call], Sequence[str]] = lambda _call: ()
    #: the hosted tool types a Responses request offers that the upstream's wire cannot run,
    #: left out and named in ``x-fairgate-tools-omitted`` (none on the Responses wire itself,
    #: which takes every tool as it is)
    tools_omitted: Callable[[Call], Sequence[str]] = lambda _call: ()


def _json_exchange(
    path: str,
    encode: Encoder,
    decode: Decoder,
    usage: Callable[[Mapping[str, Any]], Usage | None],
    relay_: Relay,
) -> Exchange:
    """An exchange whose request and answer are JSON objects translated as such."""

    def body(
        call: Call, upstream_model: str, bound: int | None, billing: tuple[str, ...]
    ) -> tuple[bytes, bool]:
        payload, wants_usage = encode(call, upstream_model, bound)
        _billing_policy(payload, billing)
        return orjson.dumps(payload), wants_usage

    def answer(
        call: Call, raw: bytes, upstream_model: str
    ) -> tuple[bytes, Usage | None, JSON | None]:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw, None, None
        if not isinstance(obj, dict):
            return raw, None, None
        out = decode(obj, call.model, _created(call))
        if out is None:
            return raw, usage(obj), obj
        return orjson.dumps(out), usage(obj), out

    return Exchange(path, body, answer, relay_)


def _responses_body(
    call: Call, upstream_model: str, bound: int | None, billing: tuple[str, ...]
) -> tuple[bytes, bool]:
    # no bound: the Codex backend refuses max_output_tokens (its quota is the account's percent);
    # no billing field: the body is built field by field, with store: false and no service_tier
    return upstream_responses_body(call.route is Route.MESSAGES, call.body, upstream_model)


def _responses_answer(
    call: Call, raw: bytes, upstream_model: str
) -> tuple[bytes, Usage | None, JSON | None]:
    return upstream_responses_answer(
        raw, call.route is Route.MESSAGES, call.model, created=_created(call)
    )


def _billing_policy(payload: JSON, allowed: tuple[str, ...]) -> None:
    """Remove the billing-relevant fields (:data:`~fairgate.domain.connections.BILLING_FIELDS`) the
    connection does not let clients set: the upstream then applies the account's own default
    (OpenAI's and Anthropic's ``service_tier``: the project's tier; ``store``: not kept). Up to
    issue 43 (N13) any tenant's ``service_tier: priority`` or ``store: true`` reached the shared
    account as sent. Two dictionary lookups a request when nothing is allowed."""
    for name in BILLING_FIELDS:
        if name in payload and name not in allowed:
            del payload[name]


def _stream_usage_asked(body: Mapping[str, Any]) -> bool:
    opts = body.get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


# -- encoders -------------------------------------------------------------------------------


def _as_is(call: Call, upstream_model: str, bound: int | None) -> tuple[JSON, bool]:
    return {**call.body, "model": upstream_model}, False


def _bounded(call: Call, upstream_model: str, payload: JSON, bound: int | None) -> None:
    """A chat request that names no output bound gets ``bound``, the one admission reserved,
    when a pool counts its tokens, dollars or percent: without it the upstream may generate up
    to the model's own limit, and a pool that reserved 1,024 tokens would be billed 16,000.
    Traffic no pool meters that way keeps the upstream's default. OpenAI's reasoning models take
    ``max_completion_tokens`` only."""
    body = payload  # the client's fields, or their chat form: positive integers or null
    if bound is None or body.get("max_completion_tokens") is not None:
        return
    if body.get("max_tokens") is not None:
        return
    field = "max_completion_tokens" if uses_max_completion_tokens(upstream_model) else "max_tokens"
    payload[field] = bound


def _openai_to_openai(call: Call, upstream_model: str, bound: int | None) -> tuple[JSON, bool]:
    payload = {**call.body, "model": upstream_model}
    _bounded(call, upstream_model, payload, bound)
    if not call.stream:
        return payload, False
    opts = call.body.get("stream_options")
    # always ask for the usage chunk: settlement needs the real token counts
    payload["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
    return payload, _stream_usage_asked(call.body)


def _chat_to_anthropic(call: Call, upstream_model: str, bound: int | None) -> tuple[JSON, bool]:
    default = call.svc.state.config.server.default_max_tokens
    payload = openai_to_anthropic_request(call.body, upstream_model, default_max_tokens=default)
    return payload, _stream_usage_asked(call.body)


# -- the Responses client route (issue 42, item 3) ------------------------------------------------
# To a Responses-wire connection the request and its answer are relayed as they are: the model
# name is the upstream's, the request is asked as a stream (the Codex backend serves streams
# only; a client that asked for none gets the final response object of the stream, which is
# the whole answer) and ``store`` is false unless the client said otherwise (fairgate keeps no
# responses, and a later request may go to another account). No output bound is added, as for
# every Responses-wire request: the Codex backend refuses ``max_output_tokens``. To the other
# wires the request is translated through the chat form (``responses_to_chat_request``, which
# refuses with a 400 naming the field what it cannot carry) and the answer rendered back.


def _responses_as_is(
    call: Call, upstream_model: str, bound: int | None, billing: tuple[str, ...]
) -> tuple[bytes, bool]:
    payload = {**call.body, "model": upstream_model, "stream": True}
    _billing_policy(payload, billing)
    payload.setdefault("store", False)
    return orjson.dumps(payload), False


def _responses_final(
    call: Call, raw: bytes, upstream_model: str
) -> tuple[bytes, Usage | None, JSON | None]:
    resp = completed_of(raw)
    if resp is None:
        return raw, None, None
    return orjson.dumps(resp), usage_from_openai(resp), resp


def _responses_to_chat(call: Call, upstream_model: str, bound: int | None) -> JSON:
    chat = responses_to_chat_request(call.body, upstream_model)
    _bounded(call, upstream_model, chat, bound)
    return chat


def _responses_to_openai(
    call: Call, upstream_model: str, bound: int | None, billing: tuple[str, ...]
) -> tuple[bytes, bool]:
    payload = _responses_to_chat(call, upstream_model, bound)
    _billing_policy(payload, billing)
    return orjson.dumps(payload), True


def _responses_to_anthropic(
    call: Call, upstream_model: str, bound: int | None, billing: tuple[str, ...]
) -> tuple[bytes, bool]:
    chat = _responses_to_chat(call, upstream_model, bound)
    default = call.svc.state.config.server.default_max_tokens
    payload = openai_to_anthropic_request(chat, upstream_model, default_max_tokens=default)
    _billing_policy(payload, billing)
    return orjson.dumps(payload), True


def _as_responses(
    call: Call, chat: JSON, usage: Usage | None
) -> tuple[bytes, Usage | None, JSON | None]:
    stamp = chat.get("created")
    created = stamp if isinstance(stamp, int) else _created(call)
    out = chat_to_responses_response(chat, call.body, call.model, created=created)
    return orjson.dumps(out), usage, out


def _json_object(raw: bytes) -> JSON | None:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _openai_to_responses_answer(
    call: Call, raw: bytes, upstream_model: str
) -> tuple[bytes, Usage | None, JSON | None]:
    obj = _json_object(raw)
    if obj is None or "choices" not in obj:
        return raw, None, obj
    return _as_responses(call, obj, usage_from_openai(obj))


def _anthropic_to_responses_answer(
    call: Call, raw: bytes, upstream_model: str
) -> tuple[bytes, Usage | None, JSON | None]:
    obj = _json_object(raw)
    if obj is None or obj.get("type") != "message":
        return raw, None, obj
    chat = anthropic_to_openai_response(obj, call.model, created=_created(call))
    return _as_responses(call, chat, usage_from_anthropic(obj))


def _omitted(call: Call) -> Sequence[str]:
    return omitted_in_translation(call.body)


def _omitted_to_anthropic(call: Call) -> Sequence[str]:
    """What a Responses request leaves out on the way to Anthropic: what the chat form leaves
    out, then what the chat form has and Anthropic has not (``reasoning.effort``)."""
    left = omitted_in_translation(call.body)
    effort = call.body.get("reasoning")
    if isinstance(effort, Mapping) and effort.get("effort") is not None:
        left.append("reasoning.effort")
    return left


def _tools_omitted(call: Call) -> Sequence[str]:
    return omitted_tools(call.body)


def _omitted_chat(call: Call) -> Sequence[str]:
    return omitted_chat_to_anthropic(call.body)


def _omitted_messages(call: Call) -> Sequence[str]:
    return omitted_messages_to_chat(call.body)


def _conv(call: Call) -> ChatToResponsesStream:
    return ChatToResponsesStream(call.body, call.model, created=_created(call))


def _relay_responses(
    call: Call, resp: UpstreamResponse, wants_usage: bool, tally: relay.StreamTally
) -> AsyncIterator[bytes]:
    return relay.responses_to_responses(resp, tally)


def _relay_openai_to_responses(
    call: Call, resp: UpstreamResponse, wants_usage: bool, tally: relay.StreamTally
) -> AsyncIterator[bytes]:
    return relay.chat_sse_to_responses(resp.chunks(), tally, _conv(call))


def _relay_anthropic_to_responses(
    call: Call, resp: UpstreamResponse, wants_usage: bool, tally: relay.StreamTally
) -> AsyncIterator[bytes]:
    tr = AnthropicToOpenAIStream(call.model, True, _created(call), f"chatcmpl-{_stream_id()}")
    return relay.anthropic_to_responses(resp, tally, _conv(call), tr)


def _messages_to_openai(call: Call, upstream_model: str, bound: int | None) -> tuple[JSON, bool]:
    return anthropic_to_openai_request(call.body, upstream_model), True


# -- decoders and relays --------------------------------------------------------------------


def _unchanged(obj: JSON, model: str, created: int) -> JSON | None:
    return None


def _anthropic_to_chat(obj: JSON, model: str, created: int) -> JSON | None:
    return anthropic_to_openai_response(obj, model, created=created)


def _openai_to_messages(obj: JSON, model: str, created: int) -> JSON | None:
    return openai_to_anthropic_response(obj, model)  # a message carries no timestamp


def _stream_id() -> str:
    return uuid.uuid4().hex[:24]


def _relay_openai(
    call: Call, resp: UpstreamResponse, wants_usage: bool, tally: relay.StreamTally
) -> AsyncIterator[bytes]:
    return relay.openai_to_openai(resp, tally, client_wants_usage=wants_usage)


def _relay_anthropic(
    call: Call, resp: UpstreamResponse, wants_usage: bool, tally: relay.StreamTally
) -> AsyncIterator[bytes]:
    return relay.anthropic_to_anthropic(resp, tally)


def _created(call: Call) -> int:
    """``created`` of a translated stream's chunks, in seconds, from the gateway's clock (the
    injected one in tests), as the upstream would stamp it."""
    return call.svc.state.clock.now_ms() // 1000


def _relay_to_chat(wire: Protocol) -> Relay:
    """The relay of a ``wire`` stream translated into chat chunks (with the client's model,
    its usage wish, the gateway's timestamp and a fresh id)."""

    def run(
        call: Call, resp: UpstreamResponse, wants_usage: bool, tally: relay.StreamTally
    ) -> AsyncIterator[bytes]:
        return relay.to_chat(
            resp,
            tally,
            wire,
            model=call.model,
            client_wants_usage=wants_usage,
            created=_created(call),
            id_=f"chatcmpl-{_stream_id()}",
        )

    return run


def _relay_openai_to_messages(
    call: Call, resp: UpstreamResponse, wants_usage: bool, tally: relay.StreamTally
) -> AsyncIterator[bytes]:
    return relay.openai_to_anthropic(resp, tally, model=call.model, id_=f"msg_{_stream_id()}")


def _relay_responses_to_messages(
    call: Call, resp: UpstreamResponse, wants_usage: bool, tally: relay.StreamTally
) -> AsyncIterator[bytes]:
    return relay.responses_to_anthropic(
        resp, tally, model=call.model, created=_created(call), id_=f"msg_{_stream_id()}"
    )


EXCHANGES: Mapping[tuple[Route, Protocol], Exchange] = {
    (Route.CHAT, Protocol.OPENAI): _json_exchange(
        "/chat/completions", _openai_to_openai, _unchanged, usage_from_openai, _relay_openai
    ),
    (Route.CHAT, Protocol.ANTHROPIC): dataclasses.replace(
        _json_exchange(
            "/messages",
            _chat_to_anthropic,
            _anthropic_to_chat,
            usage_from_anthropic,
            _relay_to_chat(Protocol.ANTHROPIC),
        ),
        omitted=_omitted_chat,
    ),
    (Route.CHAT, Protocol.RESPONSES): Exchange(
        "/responses", _responses_body, _responses_answer, _relay_to_chat(Protocol.RESPONSES)
    ),
    (Route.MESSAGES, Protocol.ANTHROPIC): _json_exchange(
        "/messages", _as_is, _unchanged, usage_from_anthropic, _relay_anthropic
    ),
    (Route.MESSAGES, Protocol.OPENAI): dataclasses.replace(
        _json_exchange(
            "/chat/completions",
            _messages_to_openai,
            _openai_to_messages,
            usage_from_openai,
            _relay_openai_to_messages,
        ),
        omitted=_omitted_messages,
    ),
    (Route.MESSAGES, Protocol.RESPONSES): Exchange(
        "/responses",
        _responses_body,
        _responses_answer,
        _relay_responses_to_messages,
        _omitted_messages,
    ),
    (Route.EMBEDDINGS, Protocol.OPENAI): _json_exchange(
        "/embeddings", _as_is, _unchanged, usage_from_openai, _relay_openai
    ),
    (Route.RESPONSES, Protocol.RESPONSES): Exchange(
        "/responses", _responses_as_is, _responses_final, _relay_responses
    ),
    (Route.RESPONSES, Protocol.OPENAI): Exchange(
        "/chat/completions",
        _responses_to_openai,
        _openai_to_responses_answer,
        _relay_openai_to_responses,
        _omitted,
        _tools_omitted,
    ),
    (Route.RESPONSES, Protocol.ANTHROPIC): Exchange(
        "/messages",
        _responses_to_anthropic,
        _anthropic_to_responses_answer,
        _relay_anthropic_to_responses,
        _omitted_to_anthropic,
        _tools_omitted,
    ),
}


def carried(route: Route, conns: Iterable[Connection]) -> tuple[Connection, ...]:
    """The connections whose wire can carry ``route`` (an entry of :data:`EXCHANGES`).

    The one filter of candidates by wire, for plain models and every combo target alike: an
    embeddings request never reaches an Anthropic or Responses connection (there is no such
    exchange), so no attempt looks up a missing entry (issue 47: a combo's first target on
    Anthropic answered embeddings with a 500)."""
    return tuple(c for c in conns if (route, c.protocol) in EXCHANGES)


# -- per client route -----------------------------------------------------------------------


def _embeddings_problem(obj: JSON) -> str | None:
    return None if obj.get("data") else "no embeddings"


# Legitimate answers are never failures (issue 42): a model may answer nothing (Anthropic
# documents an empty ``end_turn`` after tool results), think and stop, refuse, or only call a
# tool. What is broken is an answer with no stop reason (cut off, or never finished) and one
# whose whole output budget went to reasoning: failing those over is what the client wants,
# and the failed attempt is charged what the upstream reported (the work was done).


def _messages_problem(obj: JSON) -> str | None:
    stop = obj.get("stop_reason")
    if not stop:
        return "no stop reason"
    blocks = [b for b in obj.get("content") or [] if isinstance(b, dict)]
    said = any(
        (b.get("type") == "text" and b.get("text")) or b.get("type") == "tool_use" for b in blocks
    )
    thought = any(b.get("type") in ("thinking", "redacted_thinking") for b in blocks)
    if stop == "max_tokens" and thought and not said:
        return "reasoning used the whole budget, no content"
    return None


def _chat_problem(obj: JSON) -> str | None:
    choices = obj.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return "no choices"
    choice = choices[0]
    finish = choice.get("finish_reason")
    if not finish:
        return "no finish reason"
    msg = choice.get("message") or {}
    said = isinstance(msg, dict) and bool(
        msg.get("content") or msg.get("tool_calls") or msg.get("refusal")
    )
    details = (obj.get("usage") or {}).get("completion_tokens_details") or {}
    if finish == "length" and not said and details.get("reasoning_tokens"):
        return "reasoning used the whole budget, no content"
    return None


def _responses_problem(obj: JSON) -> str | None:
    status = obj.get("status")
    if status == "failed":
        return "response failed"
    if status not in ("completed", "incomplete"):
        return "no final status"
    kinds = [i.get("type") for i in obj.get("output") or [] if isinstance(i, dict)]
    said = any(k != "reasoning" for k in kinds)
    reason = (obj.get("incomplete_details") or {}).get("reason")
    if status == "incomplete" and reason == "max_output_tokens" and kinds and not said:
        return "reasoning used the whole budget, no content"
    return None


_PROBLEMS: Mapping[Route, Callable[[JSON], str | None]] = {
    Route.CHAT: _chat_problem,
    Route.MESSAGES: _messages_problem,
    Route.EMBEDDINGS: _embeddings_problem,
    Route.RESPONSES: _responses_problem,
}


def quality_problem(route: Route, obj: JSON | None) -> str | None:
    """Why a 200 is not a usable answer (SPEC §8): empty, an error inside, no finish, or a
    reasoning model that spent the whole budget thinking. None when it is fine."""
    if obj is None:
        return "not JSON"
    if obj.get("error"):
        return "error object in a 200"
    return _PROBLEMS[route](obj)


def stream_error_event(route: Route, what: str) -> bytes:
    """The event that tells a streaming client the upstream broke off, in its format."""
    msg = f"Upstream stream interrupted ({what})"
    if route is Route.RESPONSES:
        failed = {"type": "error", "code": "upstream_error", "message": msg, "param": None}
        return b"event: error\ndata: " + orjson.dumps(failed) + b"\n\n"
    if route is Route.MESSAGES:
        data = {"type": "error", "error": {"type": "api_error", "message": msg}}
        return b"event: error\ndata: " + orjson.dumps(data) + b"\n\n"
    return (
        b"data: "
        + orjson.dumps({"error": {"message": msg, "type": "api_error", "code": "upstream_error"}})
        + b"\n\n"
    )
