"""A real HTTP mock upstream speaking the OpenAI and Anthropic wire formats.

Why a real server and not a patched client: the gateway's value is in its real code paths —
connection pooling, SSE pass-through, Retry-After parsing, rate-limit header signals, failure
classification, client disconnects. Only bytes on a socket exercise all of them, so tests,
benchmarks and ``fairgate demo`` point real connections at this server (``fairgate mock-upstream``).

What it serves (all deterministic, so tests can assert exact numbers):

- ``POST /v1/chat/completions`` (OpenAI), ``POST /v1/messages`` (Anthropic), streaming or not;
  ``POST /v1/messages/count_tokens`` (Anthropic's free token count).
  The reply is ``"mock reply: "`` followed by words of the last user message; one word counts as
  one token, so ``usage`` equals ``min(max_tokens, completion_tokens)`` exactly. Prompt tokens are
  ``ceil(characters of all message contents / 4)`` (at least 1).
- ``POST /v1/embeddings`` (unit vectors from a hash of each input; ``float`` or ``base64``) and
  ``GET /v1/models`` (OpenAI list, or Anthropic's when an ``anthropic-version`` header is sent).
- Rate-limit headers on every normal answer, with ``remaining`` counted over a rolling minute.
- Faults per request (header ``x-mock-fault``) or by schedule (``POST /_mock/schedule``); see
  :mod:`fairgate.mock.faults` for the specs.
- Subscriptions (:mod:`fairgate.mock.codex`, :mod:`fairgate.mock.oauth`):
  ``POST /v1/responses`` (the OpenAI Responses API, stream or not); ``POST
  /backend-api/codex/responses`` (the Codex backend: OAuth bearer token + matching
  ``chatgpt-account-id``, stream only, ``x-codex-*`` window headers, 429
  ``usage_limit_reached`` when a window is full); ``POST /oauth/token`` and ``/v1/oauth/token``
  (refresh with rotating refresh tokens); OAuth bearer tokens on ``/v1/messages`` need the
  ``anthropic-beta: oauth-2025-04-20`` flag, as Anthropic's do; an expired token is a 401.
  ``POST /_mock/oauth/login`` ``{"account_id"}`` hands out a first token pair (the interactive
  login a user would do), ``/_mock/oauth/authorize`` ``{"account_id", "code_challenge",
  "redirect_uri"}`` the one-time code of a PKCE login (exchanged at ``/oauth/token`` with
  ``grant_type=authorization_code``), ``/_mock/oauth/revoke`` kills an account's refresh tokens.
- Control endpoints without auth: ``/_mock/schedule``, ``/_mock/config``, ``/_mock/stats``,
  ``/_mock/reset``. Credentials the mock receives are compared, never stored or echoed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import itertools
import math
import re
import signal
import socket
import struct
import sys
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Self

import orjson
from aiohttp import web

from fairgate.clock import Clock, SystemClock
from fairgate.mock.codex import (
    REASONING_TOKENS,
    CodexWindows,
    ResponsesAnswer,
    responses_input_text,
    responses_stream,
    responses_whole,
)
from fairgate.mock.faults import (
    NO_FAULT,
    Fault,
    FaultSpecError,
    Limits,
    RateWindow,
    Wire,
    auth_error,
    error_200_body,
    error_body,
    exhausted_headers,
    parse_fault,
    rate_limit_headers,
    rfc3339,
    status_fault,
    unknown_field_error,
)
from fairgate.mock.oauth import ACCESS_PREFIX, OAUTH_BETA, MockTokenIssuer
from fairgate.mock.script import last_turn, scripted_calls
from fairgate.mock.wire import (
    ToolCall,
    beta_refusal,
    planned_calls,
    reasoning_wanted,
    signature,
    structured_format,
    structured_text,
    thinking_requested,
)
from fairgate.providers.closing import AsyncClosing
from fairgate.testclock import ShiftedClock, TestClockError, advance_ms_of, clock_view

JSON = dict[str, Any]

#: Model ids ``GET /v1/models`` lists. Any model id is accepted and echoed back, though.
MOCK_MODELS = (
    "mock-gpt-4o",
    "mock-gpt-4o-mini",
    "mock-claude-sonnet-4",
    "mock-claude-haiku-4",
    "mock-text-embedding-3-small",
)

#: Header carrying a per-request fault spec.
FAULT_HEADER = "x-mock-fault"

_FILLER = ("lorem", "ipsum", "dolor", "sit", "amet")
_CREATED = 1_700_000_000  # the models' fixed creation time, so listings are deterministic


@dataclass
class MockConfig:
    """Behaviour knobs of the mock; changeable at run time through ``POST /_mock/config``."""

    latency_ms: float = 0.0  # before the first byte of every data-route answer
    chunk_delay_ms: float = 0.0  # between two stream events
    completion_tokens: int = 16  # reply length when the request sets no smaller max_tokens
    stream_chunks: int = 4  # content events per stream
    secret: str | None = None  # required key: Bearer (OpenAI), x-api-key or Bearer (Anthropic)
    requests_limit: int = 1500  # per minute, for the rate-limit headers
    tokens_limit: int = 1_000_000  # per minute; Anthropic output tokens get a fifth of it
    unified_5h_utilization: float | None = None  # fraction 0..1, as Anthropic subscriptions send
    unified_7d_utilization: float | None = None
    unified_5h_reset_s: float = 3600.0  # seconds until the unified 5h window resets
    unified_7d_reset_s: float = 259_200.0
    embedding_dimensions: int = 8  # when the request has no `dimensions`
    reject_unknown_fields: bool = False  # echoing mode: 400 naming an unknown field (real wording)
    codex_percent_per_1k_tokens: float = 1.0  # how fast the Codex windows fill
    codex_weekly_ratio: float = 0.2  # the weekly window moves this fraction of the 5h one
    oauth_access_ttl_s: float = 3600.0  # lifetime of the access tokens /oauth/token issues

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_field(f.name, getattr(self, f.name))

    def update(self, changes: Mapping[str, object]) -> None:
        """Apply a partial change; all fields are checked before any is set."""
        checked = {name: _check_field(name, value) for name, value in changes.items()}
        for name, value in checked.items():
            setattr(self, name, value)

    def public(self) -> JSON:
        """The settings as JSON, the secret masked (the mock never echoes credentials)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["secret"] = None if self.secret is None else "***"
        return out


# field -> (type, nullable, minimum)
_FIELD_RULES: dict[str, tuple[type, bool, float]] = {
    "latency_ms": (float, False, 0),
    "chunk_delay_ms": (float, False, 0),
    "completion_tokens": (int, False, 0),
    "stream_chunks": (int, False, 1),
    "secret": (str, True, 0),
    "requests_limit": (int, False, 1),
    "tokens_limit": (int, False, 5),
    "unified_5h_utilization": (float, True, 0),
    "unified_7d_utilization": (float, True, 0),
    "unified_5h_reset_s": (float, False, 0),
    "unified_7d_reset_s": (float, False, 0),
    "embedding_dimensions": (int, False, 1),
    "reject_unknown_fields": (bool, False, 0),
    "codex_percent_per_1k_tokens": (float, False, 0),
    "codex_weekly_ratio": (float, False, 0),
    "oauth_access_ttl_s": (float, False, 1),
}


def _check_field(name: str, value: object) -> object:
    rule = _FIELD_RULES.get(name)
    if rule is None:
        raise ValueError(f"unknown config field {name!r}")
    kind, nullable, minimum = rule
    if value is None and nullable:
        return None
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false")
        return value
    if kind is str:
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a non-empty string or null")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number")
    if kind is int and not isinstance(value, int):
        raise ValueError(f"{name} must be an integer")
    if not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}")
    return float(value) if kind is float else value


#: Headers that choose what a provider bills or enables (never credentials): recorded per
#: request in the stats.
RECORDED_HEADERS = ("openai-organization", "openai-project", "anthropic-beta", "anthropic-version")


@dataclass
class _Stats:
    requests: int = 0
    by_route: Counter[str] = field(default_factory=Counter)
    by_fault: Counter[str] = field(default_factory=Counter)
    by_model: Counter[str] = field(default_factory=Counter)
    by_status: Counter[str] = field(default_factory=Counter)
    last_auth_ok: bool | None = None
    last_auth_scheme: str | None = None  # "bearer" | "x-api-key" | None, never the value
    #: the provider-selecting headers of the last data request (:data:`RECORDED_HEADERS`), so
    #: tests can see what a gateway forwards
    last_headers: dict[str, str] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0


class MockState:
    """Everything the mock remembers: config, fault schedule, stats and the rate window."""

    def __init__(self, config: MockConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.schedule: deque[Fault] = deque()
        self.stats = _Stats()
        self.window = RateWindow()
        self._seq = 0
        self.issuer = MockTokenIssuer(clock, access_ttl_ms=int(config.oauth_access_ttl_s * 1000))
        self.codex: dict[str, CodexWindows] = {}  # account id → its usage windows

    def codex_windows(self, account_id: str) -> CodexWindows:
        w = self.codex.get(account_id)
        if w is None:
            w = self.codex[account_id] = CodexWindows(self.clock)
        w.percent_per_1k_tokens = self.config.codex_percent_per_1k_tokens
        w.weekly_ratio = self.config.codex_weekly_ratio
        return w

    def now_s(self) -> float:
        return self.clock.now_ms() / 1000.0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def take_fault(self, header: str | None) -> Fault:
        """The header's fault wins (and leaves the schedule alone); else the next scheduled one."""
        if header is not None and header.strip():
            return parse_fault(header)
        return self.schedule.popleft() if self.schedule else NO_FAULT

    def set_schedule(self, specs: list[str], *, append: bool = False) -> None:
        parsed = [parse_fault(s) for s in specs]  # all or nothing
        if not append:
            self.schedule.clear()
        self.schedule.extend(parsed)

    def reset(self) -> None:
        """Forget stats, schedule and rate counters; requests still running stay counted."""
        in_flight = self.stats.in_flight
        self.stats = _Stats(in_flight=in_flight, max_in_flight=in_flight)
        self.schedule.clear()
        self.window.clear()
        self._seq = 0
        self.codex.clear()

    def stats_json(self) -> JSON:
        s = self.stats
        return {
            "requests": s.requests,
            "by_route": dict(s.by_route),
            "by_fault": dict(s.by_fault),
            "by_model": dict(s.by_model),
            "by_status": dict(s.by_status),
            "last_auth_ok": s.last_auth_ok,
            "last_auth_scheme": s.last_auth_scheme,
            "last_headers": dict(s.last_headers),
            "in_flight": s.in_flight,
            "max_in_flight": s.max_in_flight,
            "scheduled": [f.spec for f in self.schedule],
            "oauth_refreshes": self.issuer.refresh_calls,
        }


STATE_KEY = web.AppKey("fairgate_mock_state", MockState)


# ---------------------------------------------------------------------------------------------
# Small helpers: ids, headers, text and token accounting


def _id_headers(wire: Wire, request_id: str) -> JSON:
    return {"request-id" if wire == "anthropic" else "x-request-id": request_id}


def _json(status: int, payload: JSON, headers: Mapping[str, str]) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(payload), headers=headers, content_type="application/json"
    )


def _text_of(content: object) -> str:
    """Text of a message content: a string, or the ``text`` of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def _estimate_tokens(chars: int) -> int:
    return max(1, math.ceil(chars / 4))


def _prompt_tokens(messages: list[Any], system: object = None) -> int:
    chars = len(_text_of(system))
    chars += sum(len(_text_of(m.get("content"))) for m in messages if isinstance(m, dict))
    return _estimate_tokens(chars)


def _last_user_text(messages: list[Any]) -> str:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            return _text_of(m.get("content"))
    return ""


def _token_cap(body: JSON, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer")
        return value
    return None


#: Faults whose answer holds no text: ``empty`` (and no finish: broken), ``empty-turn`` (a
#: finish: a legitimate empty answer).
_NOTHING = frozenset({"empty", "empty-turn"})
#: Faults whose answer has no finish reason.
_NO_FINISH = frozenset({"no-finish", "empty"})


def _reply(
    cfg: MockConfig,
    messages: list[Any],
    cap: int | None,
    fault: Fault,
    source: str | None = None,
) -> tuple[str, int, bool]:
    """(text, tokens, truncated): one word per token, words taken from the last user message
    (or from ``source``: the tool output a conversation ends with, see :mod:`mock_script`)."""
    if fault.kind in _NOTHING:
        return "", 0, False
    n = cfg.completion_tokens if cap is None else min(cap, cfg.completion_tokens)
    text = _last_user_text(messages) if source is None else source
    words = re.findall(r"[a-z0-9]+", text.lower()) or list(_FILLER)
    chosen = list(itertools.islice(itertools.chain(("mock", "reply:"), itertools.cycle(words)), n))
    return " ".join(chosen), n, cap is not None and cap < cfg.completion_tokens


@dataclass(frozen=True, slots=True)
class _Plan:
    """An answer beyond plain text (:mod:`fairgate.mock.wire`): its text (schema
    JSON for structured output), its tool calls, and the tokens they add."""

    text: str
    completion: int
    truncated: bool
    calls: list[ToolCall]


def _plan(call: _Call, route: str, messages: list[Any], cap: int | None) -> _Plan:
    """What to answer: the fault's and the request's choices on top of :func:`_reply`. The
    calls are the ``mock-tool`` lines of the last user turn first (:mod:`mock_script`, what
    the real clients' tool loops are driven by), else those the request forces or the
    ``tool-calls:n`` fault asks for; after a tool result the text is made of its output."""
    cfg, fault, body = call.state.config, call.fault, call.body
    turn = last_turn(route, body)
    text, completion, truncated = _reply(cfg, messages, cap, fault, turn.tool_result)
    if fault.kind in _NOTHING:
        return _Plan(text, completion, truncated, [])
    fmt = None if fault.kind == "off-schema" else structured_format(route, body)
    if fmt is not None:
        text = structured_text(fmt, text)
        completion = _estimate_tokens(len(text))
        truncated = cap is not None and cap < completion
        if truncated and cap is not None:
            text, completion = text[: cap * 4], cap
    parallel = int(fault.value) if fault.kind == "tool-calls" else 0
    calls = scripted_calls(route, body, turn, call.request_id) or planned_calls(
        route, body, parallel, call.request_id
    )
    if calls:
        if fmt is None:
            text, completion, truncated = "", 0, False
        completion += sum(_estimate_tokens(len(c.arguments)) for c in calls)
    return _Plan(text, completion, truncated, calls)


def _pieces(text: str, k: int) -> list[str]:
    """``k`` stream pieces that concatenate to ``text``, split at word boundaries."""
    if not text:
        return []
    words = text.split(" ")
    n = len(words)
    out = []
    for i in range(k):
        seg = words[i * n // k : (i + 1) * n // k]
        piece = " ".join(seg)
        out.append(" " + piece if seg and i * n // k > 0 else piece)
    return out


def _sse(payload: JSON, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


# ---------------------------------------------------------------------------------------------
# Connection faults and stream writing


async def _abort(request: web.Request) -> None:
    """Reset the TCP connection (RST, not FIN) after what was written has left the process."""
    transport = request.transport
    if transport is None:
        return
    for _ in range(100):  # a bounded wait for the write buffer to drain
        if transport.get_write_buffer_size() == 0:
            break
        await asyncio.sleep(0.005)
    sock = transport.get_extra_info("socket")
    with contextlib.suppress(AttributeError, OSError, TypeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _aborted_response() -> web.Response:
    """Returned by a handler whose connection is gone; nothing of it reaches the wire."""
    return web.Response(status=499, reason="Client Closed Request")


@dataclass
class _Call:
    """One data-route request, once auth, body and fault are settled."""

    request: web.Request
    state: MockState
    wire: Wire
    fault: Fault
    body: JSON
    request_id: str
    #: more headers once the answer's tokens are known (the Codex windows move with use)
    extra_headers: Callable[[int, int], Mapping[str, str]] = lambda _p, _c: {}

    def bad_request(self, message: str, param: str | None = None) -> web.Response:
        body = error_body(self.wire, 400, message, self.request_id)
        if self.wire == "openai":
            body["error"]["param"] = param
        return _json(400, body, _id_headers(self.wire, self.request_id))

    def headers(self, input_tokens: int, output_tokens: int) -> JSON:
        """Count this answer in the rolling minute; rate-limit and request-id headers."""
        state, cfg = self.state, self.state.config
        now = state.now_s()
        state.window.record(now, input_tokens, output_tokens)
        limits = Limits(
            cfg.requests_limit,
            cfg.tokens_limit,
            {
                "5h": (cfg.unified_5h_utilization, cfg.unified_5h_reset_s),
                "7d": (cfg.unified_7d_utilization, cfg.unified_7d_reset_s),
            },
        )
        h: JSON = rate_limit_headers(self.wire, now, limits, state.window.totals(now))
        h.update(_id_headers(self.wire, self.request_id))
        return h

    async def partial_json(self, payload: JSON, headers: JSON) -> web.StreamResponse:
        """``reset-mid-stream`` on a non-streaming request: half a body, then a reset."""
        data = orjson.dumps(payload)
        resp = web.StreamResponse(status=200, headers=headers)
        resp.content_type = "application/json"
        resp.content_length = len(data)
        await resp.prepare(self.request)
        await resp.write(data[: len(data) // 2])
        await _abort(self.request)
        return resp

    async def stream(self, events: list[bytes], headers: JSON) -> web.StreamResponse:
        """Send SSE events with the configured delay; ``reset-mid-stream:k`` aborts after k."""
        resp = web.StreamResponse(status=200, headers=headers)
        resp.content_type = "text/event-stream"
        resp.charset = "utf-8"
        resp.headers["Cache-Control"] = "no-cache"
        delay = self.state.config.chunk_delay_ms / 1000.0
        stop_after = int(self.fault.value) if self.fault.kind == "reset-mid-stream" else None
        try:
            await resp.prepare(self.request)
            for i, event in enumerate(events):
                if stop_after is not None and i >= stop_after:
                    break
                if i and delay > 0:
                    await asyncio.sleep(delay)
                if i == 1 and self.fault.kind == "slow-first-token":
                    await asyncio.sleep(self.fault.value / 1000.0)
                await resp.write(event)
            if stop_after is not None:
                await _abort(self.request)
                return resp
            await resp.write_eof()
        except ConnectionError:  # the client went away mid-stream: nothing left to do
            pass
        return resp


# ---------------------------------------------------------------------------------------------
# Route implementations


def _chat_message(text: str, plan: _Plan, *, thinking: bool) -> JSON:
    """A non-stream chat answer's message: the text, or only reasoning (``reasoning-only``),
    and the plan's tool calls (content null when there is no text beside them)."""
    message: JSON = {
        "role": "assistant",
        "content": text if text or not plan.calls else None,
        "refusal": None,
    }
    if thinking:
        message = {"role": "assistant", "content": None, "reasoning_content": text}
    if plan.calls:
        message["tool_calls"] = [
            {
                "id": c.call_id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in plan.calls
        ]
    return message


async def _chat(call: _Call) -> web.StreamResponse:
    body = call.body
    model, messages = body.get("model"), body.get("messages")
    if not isinstance(model, str) or not model:
        return call.bad_request("you must provide a model parameter", "model")
    if not isinstance(messages, list) or not messages:
        return call.bad_request("'messages' must be a non-empty array", "messages")
    try:
        cap = _token_cap(body, ("max_completion_tokens", "max_tokens"))
    except ValueError as exc:
        return call.bad_request(str(exc), "max_tokens")
    prompt = _prompt_tokens(messages)
    plan = _plan(call, "chat", messages, cap)
    text, completion, truncated = plan.text, plan.completion, plan.truncated
    finish = None if call.fault.kind in _NO_FINISH else ("length" if truncated else "stop")
    if plan.calls and finish == "stop":
        finish = "tool_calls"
    headers = call.headers(prompt, completion)
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    seq = call.state.next_seq()
    base = {
        "id": f"chatcmpl-mock{seq:08d}",
        "created": int(call.state.now_s()),
        "model": model,
        "system_fingerprint": "fp_mock",
    }
    thinking = call.fault.kind == "reasoning-only"
    if thinking:  # the budget went to reasoning: no content, finish length
        usage["completion_tokens_details"] = {"reasoning_tokens": completion}
        finish = "length"
    if body.get("stream") is not True:
        if call.fault.kind == "error-200":
            return _json(200, error_200_body("openai", call.request_id), headers)
        if call.fault.kind == "slow-first-token":
            await asyncio.sleep(call.fault.value / 1000.0)
        message = _chat_message(text, plan, thinking=thinking)
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        payload = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
        if call.fault.kind == "reset-mid-stream":
            return await call.partial_json(payload, headers)
        return _json(200, payload, headers)

    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True

    def chunk(delta: JSON, finish_reason: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        payload = {**base, "object": "chat.completion.chunk", "choices": [choice]}
        if include_usage:  # the official API then puts "usage": null on every other chunk
            payload["usage"] = None
        return _sse(payload)

    if call.fault.kind == "error-200":
        return await call.stream([_sse(error_200_body("openai", call.request_id))], headers)
    events = [chunk({"role": "assistant", "content": "", "refusal": None}, None)]
    field = "reasoning_content" if thinking else "content"
    events += [chunk({field: p}, None) for p in _pieces(text, call.state.config.stream_chunks)]
    events += [chunk({"tool_calls": [d]}, None) for d in _interleaved_calls(plan.calls)]
    if finish is not None:
        events.append(chunk({}, finish))
        if include_usage:
            events.append(
                _sse({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
            )
        events.append(b"data: [DONE]\n\n")
    return await call.stream(events, headers)


def _interleaved_calls(calls: list[ToolCall]) -> list[JSON]:
    """Tool-call deltas of a chat stream as OpenAI sends parallel calls: interleaved by
    ``index`` (every call's opening delta with its id and name, then each call's first half
    of arguments, then each call's second half), so a translator that assumes one call at a
    time breaks here as it would on the real API."""
    opening = [
        {
            "index": i,
            "id": c.call_id,
            "type": "function",
            "function": {"name": c.name, "arguments": ""},
        }
        for i, c in enumerate(calls)
    ]
    halves = [
        (c.arguments[: len(c.arguments) // 2], c.arguments[len(c.arguments) // 2 :]) for c in calls
    ]
    firsts = [{"index": i, "function": {"arguments": h[0]}} for i, h in enumerate(halves) if h[0]]
    seconds = [{"index": i, "function": {"arguments": h[1]}} for i, h in enumerate(halves) if h[1]]
    return opening + firsts + seconds


#: Anthropic's token counting (free, rate limited apart from messages; Claude Code's /context).
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"


def _messages_refusal(call: _Call) -> web.Response | None:
    """Anthropic's 400 for a Messages body without a model or messages (both routes)."""
    body = call.body
    model, messages = body.get("model"), body.get("messages")
    if not isinstance(model, str) or not model:
        return call.bad_request("model: Field required")
    if not isinstance(messages, list) or not messages:
        return call.bad_request("messages: at least one message is required")
    return None


async def _count_tokens(call: _Call) -> web.StreamResponse:
    """``{"input_tokens": n}`` for a Messages body, as Anthropic counts it: no ``max_tokens``
    needed, nothing generated, no usage spent (the mock's estimate: four characters a token)."""
    refusal = _messages_refusal(call)
    if refusal is not None:
        return refusal
    body = call.body
    return _json(200, {"input_tokens": _prompt_tokens(body["messages"], body.get("system"))}, {})


async def _messages(call: _Call) -> web.StreamResponse:
    refusal = _messages_refusal(call)
    if refusal is not None:
        return refusal
    body = call.body
    model, messages = body["model"], body["messages"]
    try:
        cap = _token_cap(body, ("max_tokens",))
    except ValueError as exc:
        return call.bad_request(f"max_tokens: {exc}")
    if cap is None:
        return call.bad_request("max_tokens: Field required")
    prompt = _prompt_tokens(messages, body.get("system"))
    plan = _plan(call, "messages", messages, cap)
    blocks = _anthropic_blocks(call, plan)
    thought = bool(blocks) and blocks[0]["type"] == "thinking"
    completion = plan.completion + (THINKING_TOKENS if thought else 0)
    stop = None
    if call.fault.kind not in _NO_FINISH:
        stop = "max_tokens" if plan.truncated else "tool_use" if plan.calls else "end_turn"
    headers = call.headers(prompt, completion)
    usage = {
        "input_tokens": prompt,
        "output_tokens": completion,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }
    message: JSON = {
        "id": f"msg_mock{call.state.next_seq():08d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        # an empty turn is ``content: []``, as Anthropic documents it
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }
    if body.get("stream") is not True:
        if call.fault.kind == "error-200":
            return _json(200, error_200_body("anthropic", call.request_id), headers)
        if call.fault.kind == "reset-mid-stream":
            return await call.partial_json(message, headers)
        return _json(200, message, headers)

    if call.fault.kind == "error-200":
        event = _sse(error_200_body("anthropic", call.request_id), "error")
        return await call.stream([event], headers)
    in_delta = call.fault.kind == "usage-in-delta"
    start_usage = dict.fromkeys(usage, 0) if in_delta else {**usage, "output_tokens": 1}
    start = {**message, "content": [], "stop_reason": None, "usage": start_usage}
    events = [_sse({"type": "message_start", "message": start}, "message_start")]
    stream_blocks = blocks or [{"type": "text", "text": ""}]  # an empty turn: one empty block
    for index, block in enumerate(stream_blocks):
        block_events = _block_events(index, block, call.state.config.stream_chunks)
        if index == 0:  # Anthropic's ping follows the first block's start
            block_events.insert(1, _sse({"type": "ping"}, "ping"))
        events += block_events
    if stop is None:
        events.pop()  # cut off: the last block never stops, the message never ends
    else:
        delta_usage = usage if in_delta else {"output_tokens": completion}
        events += [
            _sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": delta_usage,
                },
                "message_delta",
            ),
            _sse({"type": "message_stop"}, "message_stop"),
        ]
    return await call.stream(events, headers)


#: What the mock thinks aloud when a request enables Anthropic's extended thinking, and the
#: tokens it counts for it (in ``output_tokens``, as Anthropic bills thinking).
THINKING = "Let me think about the request."
THINKING_TOKENS = 8


def _anthropic_blocks(call: _Call, plan: _Plan) -> list[JSON]:
    """The content blocks of an Anthropic answer: thinking (with its signature; a
    ``redacted_thinking`` block too under the ``redacted-thinking`` fault) when the request
    enables it, the text, the tool calls."""
    kind = call.fault.kind
    if kind in _NOTHING:
        return []
    blocks: list[JSON] = []
    if thinking_requested(call.body):
        blocks.append(
            {"type": "thinking", "thinking": THINKING, "signature": signature(call.request_id)}
        )
        if kind == "redacted-thinking":
            data = signature(f"redacted:{call.request_id}")
            blocks.append({"type": "redacted_thinking", "data": data})
    if plan.text or not plan.calls:
        blocks.append({"type": "text", "text": plan.text})
    blocks += [
        {"type": "tool_use", "id": c.call_id, "name": c.name, "input": orjson.loads(c.arguments)}
        for c in plan.calls
    ]
    return blocks


def _block_events(index: int, block: JSON, chunks: int) -> list[bytes]:
    """One content block streamed as Anthropic streams it: its start (the block with its
    content empty), its deltas, its stop."""

    def delta(d: JSON) -> bytes:
        return _sse(
            {"type": "content_block_delta", "index": index, "delta": d}, "content_block_delta"
        )

    kind = block["type"]
    deltas: list[bytes] = []
    if kind == "text":
        opened: JSON = {"type": "text", "text": ""}
        deltas = [delta({"type": "text_delta", "text": p}) for p in _pieces(block["text"], chunks)]
    elif kind == "thinking":
        opened = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            delta({"type": "thinking_delta", "thinking": block["thinking"]}),
            delta({"type": "signature_delta", "signature": block["signature"]}),
        ]
    elif kind == "tool_use":
        opened = {**block, "input": {}}
        args = orjson.dumps(block["input"]).decode()
        half = len(args) // 2
        deltas = [
            delta({"type": "input_json_delta", "partial_json": part})
            for part in (args[:half], args[half:])
            if part
        ]
    else:  # redacted_thinking arrives whole in its start
        opened = block
    start = {"type": "content_block_start", "index": index, "content_block": opened}
    stop = {"type": "content_block_stop", "index": index}
    return [
        _sse(start, "content_block_start"),
        *deltas,
        _sse(stop, "content_block_stop"),
    ]


def _embedding_inputs(raw: object) -> list[tuple[bytes, int]] | None:
    """(bytes to hash, tokens) per input: a string, strings, a token array or token arrays."""

    def is_tokens(x: object) -> bool:
        return isinstance(x, list) and bool(x) and all(type(t) is int for t in x)

    if isinstance(raw, str):
        return [(raw.encode(), _estimate_tokens(len(raw)))]
    if not isinstance(raw, list) or not raw:
        return None
    if all(isinstance(x, str) for x in raw):
        return [(x.encode(), _estimate_tokens(len(x))) for x in raw]
    if is_tokens(raw):
        return [(orjson.dumps(raw), len(raw))]
    if all(is_tokens(x) for x in raw):
        return [(orjson.dumps(x), len(x)) for x in raw]
    return None


def _embedding(item: bytes, dims: int) -> bytes:
    """A deterministic unit vector as little-endian float32 (OpenAI's base64 encoding)."""
    raw = hashlib.shake_256(b"fairgate-mock-embedding\0" + item).digest(4 * dims)
    values = [u / 2**31 - 1.0 for u in struct.unpack(f"<{dims}I", raw)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return struct.pack(f"<{dims}f", *(v / norm for v in values))


async def _embeddings(call: _Call) -> web.StreamResponse:
    body = call.body
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return call.bad_request("you must provide a model parameter", "model")
    inputs = _embedding_inputs(body.get("input"))
    if inputs is None:
        return call.bad_request("'input' must be a string, strings or token arrays", "input")
    dims = body.get("dimensions", call.state.config.embedding_dimensions)
    if type(dims) is not int or not 1 <= dims <= 4096:
        return call.bad_request("'dimensions' must be an integer in 1..4096", "dimensions")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        return call.bad_request("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    tokens = sum(t for _, t in inputs)
    headers = call.headers(tokens, 0)
    if call.fault.kind == "error-200":
        return _json(200, error_200_body("openai", call.request_id), headers)
    data = []
    if call.fault.kind != "empty":
        for i, (item, _) in enumerate(inputs):
            packed = _embedding(item, dims)
            vector: object = (
                base64.b64encode(packed).decode()
                if encoding == "base64"
                else list(struct.unpack(f"<{dims}f", packed))
            )
            data.append({"object": "embedding", "index": i, "embedding": vector})
    payload = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    if call.fault.kind == "reset-mid-stream":
        return await call.partial_json(payload, headers)
    return _json(200, payload, headers)


async def _models(call: _Call) -> web.StreamResponse:
    headers = call.headers(0, 0)
    if call.fault.kind == "error-200":
        return _json(200, error_200_body(call.wire, call.request_id), headers)
    ids = [] if call.fault.kind == "empty" else list(MOCK_MODELS)
    payload: JSON
    if call.wire == "anthropic":
        created = rfc3339(_CREATED)
        data: list[JSON] = [
            {"type": "model", "id": m, "display_name": m, "created_at": created} for m in ids
        ]
        first, last = (ids[0], ids[-1]) if ids else (None, None)
        payload = {"data": data, "has_more": False, "first_id": first, "last_id": last}
    else:
        data = [
            {"id": m, "object": "model", "created": _CREATED, "owned_by": "fairgate-mock"}
            for m in ids
        ]
        payload = {"object": "list", "data": data}
    if call.fault.kind == "reset-mid-stream":
        return await call.partial_json(payload, headers)
    return _json(200, payload, headers)


# ---------------------------------------------------------------------------------------------
# The request pipeline shared by data routes


def _bearer(value: str | None) -> str | None:
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _check_auth(request: web.Request, wire: Wire, state: MockState) -> tuple[bool, str | None]:
    """(ok, scheme seen). OpenAI routes take ``Authorization: Bearer``. Anthropic routes take
    ``x-api-key`` or, when it is absent, ``Authorization: Bearer`` (OAuth tokens, and what the
    ``anthropic`` SDK 2.x sends for an API key). A bearer token the mock's OAuth authority
    issued must be live, and on the Anthropic wire come with the OAuth beta flag."""
    h = request.headers
    key: str | None = None
    scheme = "bearer"
    if wire == "anthropic" and "x-api-key" in h:
        key, scheme = h["x-api-key"], "x-api-key"
    else:
        key = _bearer(h.get("authorization"))
    seen = scheme if key is not None else None
    if key is not None and scheme == "bearer" and key.startswith(ACCESS_PREFIX):
        account, _why = state.issuer.check(f"Bearer {key}")
        beta_ok = wire != "anthropic" or OAUTH_BETA in h.get("anthropic-beta", "")
        return account is not None and beta_ok, "oauth"
    secret = state.config.secret
    if secret is None:
        return True, seen
    return key is not None and hmac.compare_digest(key.encode(), secret.encode()), seen


def _wire_of(request: web.Request, route: str) -> Wire:
    if route in ("/v1/messages", COUNT_TOKENS_PATH):
        return "anthropic"
    if route == "/v1/models" and "anthropic-version" in request.headers:
        return "anthropic"
    return "openai"


_Impl = Callable[[_Call], Awaitable[web.StreamResponse]]


async def _body(
    request: web.Request, state: MockState, wire: Wire, route: str, request_id: str
) -> JSON | web.Response:
    """The request's JSON object, or the provider's 400: not an object, a field the API does
    not know (echoing mode), a beta field without its ``anthropic-beta`` flag (always, as
    Anthropic refuses one)."""
    ids = _id_headers(wire, request_id)
    try:
        parsed = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        return _json(400, error_body(wire, 400, "body must be a JSON object", request_id), ids)
    if state.config.reject_unknown_fields:
        echoed = unknown_field_error(wire, route, parsed, request_id)
        if echoed is not None:
            return _json(400, echoed, ids)
    if wire == "anthropic":
        refused = beta_refusal(parsed, request.headers.get("anthropic-beta"))
        if refused is not None:
            return _json(400, error_body(wire, 400, refused, request_id), ids)
    return parsed


async def _serve(
    request: web.Request, state: MockState, route: str, impl: _Impl
) -> web.StreamResponse:
    """latency → auth → body → fault → the route. Scheduled faults are not spent on 401s/400s."""
    wire = _wire_of(request, route)
    request_id = f"req_mock{state.next_seq():012d}"
    ids = _id_headers(wire, request_id)
    if state.config.latency_ms > 0:
        await asyncio.sleep(state.config.latency_ms / 1000.0)
    ok, scheme = _check_auth(request, wire, state)
    state.stats.last_auth_ok, state.stats.last_auth_scheme = ok, scheme
    state.stats.last_headers = {
        h: v for h in RECORDED_HEADERS if (v := request.headers.get(h)) is not None
    }
    if not ok:
        return _json(401, auth_error(wire, request_id), ids)
    body: JSON = {}
    if request.method == "POST":
        read = await _body(request, state, wire, route, request_id)
        if isinstance(read, web.Response):
            return read
        body = read
    try:
        fault = state.take_fault(request.headers.get(FAULT_HEADER))
    except FaultSpecError as exc:
        return _json(400, error_body(wire, 400, str(exc), request_id), ids)
    if isinstance(body.get("model"), str):
        state.stats.by_model[body["model"]] += 1
    if fault.kind != "ok":
        state.stats.by_fault[fault.kind] += 1
    if fault.kind in ("latency", "timeout"):  # a client disconnect cancels this sleep
        await asyncio.sleep(fault.value / 1000.0 if fault.kind == "latency" else fault.value)
    if fault.kind == "reset":
        await _abort(request)
        return _aborted_response()
    if fault.is_status:
        status, payload, headers = status_fault(fault, wire, request_id, state.now_s())
        if status == 429 and fault.kind != "quota":
            limit = state.config.requests_limit
            headers.update(exhausted_headers(wire, state.now_s(), limit, fault.value))
        return _json(status, payload, {**headers, **ids})
    return await impl(_Call(request, state, wire, fault, body, request_id))


def _data_route(route: str, impl: _Impl) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        state = request.app[STATE_KEY]
        stats = state.stats
        stats.requests += 1
        stats.by_route[route] += 1
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        outcome = "aborted"
        try:
            resp = await _serve(request, state, route, impl)
            transport = request.transport
            if transport is not None and not transport.is_closing():  # else reset or gone
                outcome = str(resp.status)
            return resp
        finally:
            state.stats.in_flight = max(0, state.stats.in_flight - 1)
            state.stats.by_status[outcome] += 1

    return handler


# ---------------------------------------------------------------------------------------------
# The Responses wire and the Codex backend

#: Where the Codex CLI sends its requests under a ChatGPT login (base ``…/backend-api/codex``).
CODEX_PATH = "/backend-api/codex/responses"


def _responses_reply(call: _Call) -> ResponsesAnswer:
    """The answer to a Responses request: text like the chat routes', or schema JSON, tool
    calls, a reasoning item, as the request asks (:mod:`fairgate.mock.wire`)."""
    last, chars = responses_input_text(call.body)
    cap = call.body.get("max_output_tokens")
    cap = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None
    user = [{"role": "user", "content": last}]
    plan = _plan(call, "responses", user, cap)
    reasoning, summary, encrypted = reasoning_wanted(call.body)
    pieces = _pieces(plan.text, call.state.config.stream_chunks)
    completion = plan.completion + (REASONING_TOKENS if reasoning else 0)
    return ResponsesAnswer(
        pieces,
        _estimate_tokens(chars),
        completion,
        plan.calls,
        reasoning,
        summary,
        encrypted,
        plan.truncated,
    )


async def _responses_answer(call: _Call, headers: JSON, *, stream: bool) -> web.StreamResponse:
    model = call.body.get("model")
    if not isinstance(model, str) or not model:
        return call.bad_request("Missing required parameter: 'model'.", "model")
    if not isinstance(call.body.get("input"), str | list):
        return call.bad_request("Missing required parameter: 'input'.", "input")
    ans = _responses_reply(call)
    rid = f"resp_mock{call.state.next_seq():08d}"
    created = int(call.state.now_s())
    headers = {**headers, **call.extra_headers(ans.prompt, ans.completion)}
    if not stream:
        return _json(200, responses_whole(rid, model, created, ans), headers)
    events = responses_stream(rid, model, created, ans)
    return await call.stream([_sse(data, name) for name, data in events], headers)


async def _responses(call: _Call) -> web.StreamResponse:
    """``POST /v1/responses``: the OpenAI Responses API with an API key, stream or not."""
    call.extra_headers = call.headers  # the answer's input and output count in the minute
    return await _responses_answer(call, {}, stream=call.body.get("stream") is True)


async def _codex_responses(call: _Call) -> web.StreamResponse:
    """The Codex backend: an OAuth token of the account named by ``chatgpt-account-id``, stream
    only, the account's windows in ``x-codex-*`` headers, 429 once a window is full."""
    account, why = call.state.issuer.check(call.request.headers.get("authorization"))
    if account is None:
        return _json(401, {"detail": why or "Unauthorized"}, _id_headers("openai", call.request_id))
    if call.request.headers.get("chatgpt-account-id") != account:
        return _json(
            403,
            {"detail": "chatgpt-account-id does not match the token's account"},
            _id_headers("openai", call.request_id),
        )
    if call.body.get("stream") is not True:
        return _json(
            400, {"detail": "Stream must be set to true"}, _id_headers("openai", call.request_id)
        )
    windows = call.state.codex_windows(account)
    full = windows.exhausted()
    ids = _id_headers("openai", call.request_id)
    if full is not None:
        return _json(429, windows.limit_error(full), {**windows.headers(), **ids})

    def used(prompt: int, completion: int) -> Mapping[str, str]:
        windows.use(prompt + completion)  # the answer counts in the headers it carries
        return windows.headers()

    call.extra_headers = used
    return await _responses_answer(call, ids, stream=True)


# ---------------------------------------------------------------------------------------------
# The OAuth authority (no gateway credentials: a token endpoint authenticates by its body)


async def _oauth_token(request: web.Request) -> web.Response:
    """Refresh as the providers' token endpoints do; a JSON or form body."""
    state = request.app[STATE_KEY]
    state.issuer.access_ttl_ms = int(state.config.oauth_access_ttl_s * 1000)
    if request.content_type == "application/x-www-form-urlencoded":
        body: JSON = dict(await request.post())
    else:
        try:
            parsed = orjson.loads(await request.read() or b"{}")
        except orjson.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            return _json(400, {"error": "invalid_request"}, {})
        body = parsed
    status, payload = state.issuer.token(body)
    payload.pop("account_id", None)  # the real endpoints say it inside the id token
    return _json(status, payload, {"cache-control": "no-store"})


async def _oauth_login(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    state.issuer.access_ttl_ms = int(state.config.oauth_access_ttl_s * 1000)
    account = (await _control_body(request)).get("account_id")
    if not isinstance(account, str) or not account:
        return _control_error("'account_id' must be a non-empty string")
    return _json(200, state.issuer.login(account), {})


async def _oauth_authorize(request: web.Request) -> web.Response:
    """The browser step of a login (``{"account_id", "code_challenge", "redirect_uri"}``): the
    one-time code the provider would put in the redirect."""
    body = await _control_body(request)
    fields = [body.get(k) for k in ("account_id", "code_challenge", "redirect_uri")]
    if not all(isinstance(v, str) and v for v in fields):
        return _control_error("'account_id', 'code_challenge', 'redirect_uri' must be strings")
    account, challenge, redirect = (str(v) for v in fields)
    return _json(
        200, {"code": request.app[STATE_KEY].issuer.authorize(account, challenge, redirect)}, {}
    )


async def _oauth_revoke(request: web.Request) -> web.Response:
    account = (await _control_body(request)).get("account_id")
    if not isinstance(account, str) or not account:
        return _control_error("'account_id' must be a non-empty string")
    request.app[STATE_KEY].issuer.revoke_all(account)
    return _json(200, {"revoked": account}, {})


# ---------------------------------------------------------------------------------------------
# Control endpoints (no auth: they exist for tests and benchmarks on loopback)


async def _control_body(request: web.Request) -> JSON:
    try:
        parsed = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise web.HTTPBadRequest(
            body=orjson.dumps({"error": "body must be a JSON object"}),
            content_type="application/json",
        )
    return parsed


def _control_error(message: str) -> web.Response:
    return _json(400, {"error": message}, {})


async def _post_schedule(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    body = await _control_body(request)
    faults = body.get("faults")
    if not isinstance(faults, list) or not all(isinstance(f, str) for f in faults):
        return _control_error("'faults' must be a list of fault specs")
    try:
        state.set_schedule(faults, append=body.get("append") is True)
    except FaultSpecError as exc:
        return _control_error(str(exc))
    return _json(200, {"scheduled": [f.spec for f in state.schedule]}, {})


async def _get_config(request: web.Request) -> web.Response:
    return _json(200, request.app[STATE_KEY].config.public(), {})


async def _post_config(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    body = await _control_body(request)
    try:
        state.config.update(body)
    except ValueError as exc:
        return _control_error(str(exc))
    return _json(200, state.config.public(), {})


async def _clock(request: web.Request) -> web.Response:
    """GET: the test clock; POST ``{"advanceMs": n}``: move it forward. 404 unless the mock runs
    on the test clock (``FAIRGATE_TESTING=1``, see :mod:`fairgate.testclock`)."""
    clock = request.app[STATE_KEY].clock
    if not isinstance(clock, ShiftedClock):
        return _json(404, {"error": "no test clock: start the mock with FAIRGATE_TESTING=1"}, {})
    if request.method == "POST":
        try:
            clock.advance(advance_ms_of(await _control_body(request)))
        except TestClockError as exc:
            return _control_error(str(exc))
    return _json(200, clock_view(clock), {})


async def _get_stats(request: web.Request) -> web.Response:
    return _json(200, request.app[STATE_KEY].stats_json(), {})


async def _post_reset(request: web.Request) -> web.Response:
    request.app[STATE_KEY].reset()
    return _json(200, {"reset": True}, {})


#: The provider API the mock serves: (method, path, what answers it when no fault is scheduled).
_DATA_ROUTES: tuple[tuple[str, str, _Impl], ...] = (
    ("POST", "/v1/chat/completions", _chat),
    ("POST", "/v1/messages", _messages),
    ("POST", COUNT_TOKENS_PATH, _count_tokens),
    ("POST", "/v1/embeddings", _embeddings),
    ("GET", "/v1/models", _models),
    ("POST", "/v1/responses", _responses),
    ("POST", CODEX_PATH, _codex_responses),
)

#: The OAuth endpoints and the test controls, answered as they are (no faults).
_CONTROL_ROUTES: tuple[
    tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]], ...
] = (
    ("POST", "/oauth/token", _oauth_token),
    ("POST", "/v1/oauth/token", _oauth_token),
    ("POST", "/_mock/oauth/login", _oauth_login),
    ("POST", "/_mock/oauth/revoke", _oauth_revoke),
    ("POST", "/_mock/oauth/authorize", _oauth_authorize),
    ("POST", "/_mock/schedule", _post_schedule),
    ("GET", "/_mock/config", _get_config),
    ("POST", "/_mock/config", _post_config),
    ("GET", "/_mock/stats", _get_stats),
    ("GET", "/_mock/clock", _clock),
    ("POST", "/_mock/clock", _clock),
    ("POST", "/_mock/reset", _post_reset),
)


def create_mock_app(
    config: MockConfig | None = None, *, clock: Clock | None = None
) -> web.Application:
    """The mock's aiohttp application. Run it with ``handler_cancellation=True`` (as
    :class:`MockUpstream` does) so a client that leaves ends its held request at once."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE_KEY] = MockState(
        config if config is not None else MockConfig(), clock or SystemClock()
    )
    add = {"GET": app.router.add_get, "POST": app.router.add_post}  # a GET answers HEAD too
    for method, path, impl in _DATA_ROUTES:  # the provider API, faults and all
        add[method](path, _data_route(path, impl))
    for method, path, handler in _CONTROL_ROUTES:
        add[method](path, handler)
    return app


# ---------------------------------------------------------------------------------------------
# Running it


class MockUpstream(AsyncClosing):
    """The mock on a real socket: ``async with MockUpstream(cfg) as up: ... up.url ...``."""

    def __init__(self, config: MockConfig | None = None, *, clock: Clock | None = None) -> None:
        self.app = create_mock_app(config, clock=clock)
        self._runner: web.AppRunner | None = None
        self._host = "127.0.0.1"
        self._port: int | None = None

    @property
    def state(self) -> MockState:
        return self.app[STATE_KEY]

    @property
    def config(self) -> MockConfig:
        """The live config: changes apply to the next request."""
        return self.state.config

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the mock upstream is not started")
        return self._port

    @property
    def url(self) -> str:
        """Base URL without ``/v1`` (OpenAI clients add ``/v1``, Anthropic's SDK adds it itself)."""
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(self._host, self._host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port``; port 0 picks a free port (read it from :attr:`port`)."""
        if self._runner is not None:
            raise RuntimeError("the mock upstream is already started")
        runner = web.AppRunner(
            self.app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5
        )
        await runner.setup()
        try:
            family, kind, proto, _, addr = socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(addr)
                sock.setblocking(False)
                await web.SockSite(runner, sock).start()
            except BaseException:
                sock.close()
                raise
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._host, self._port = runner, host, int(sock.getsockname()[1])

    async def stop(self) -> None:
        """Stop listening; requests still held are cancelled after half a second."""
        runner, self._runner, self._port = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    close = stop  # what leaving ``async with`` does

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    # in-process shortcuts to the control endpoints
    def schedule(self, *specs: str, append: bool = False) -> None:
        self.state.set_schedule(list(specs), append=append)

    def stats(self) -> JSON:
        return self.state.stats_json()

    def reset(self) -> None:
        self.state.reset()


async def _serve_until_signal(
    host: str, port: int, config: MockConfig, clock: Clock | None
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
    upstream = MockUpstream(config, clock=clock)
    await upstream.start(host, port)
    try:
        shown = f"[{host}]" if ":" in host else host
        sys.stdout.write(f"mock upstream listening on http://{shown}:{upstream.port}\n")
        sys.stdout.flush()
        await stop.wait()
    finally:
        await upstream.stop()
        for sig in handled:
            loop.remove_signal_handler(sig)


def run_mock_upstream(
    host: str, port: int, config: MockConfig, *, clock: Clock | None = None
) -> None:
    """Serve until SIGINT or SIGTERM (``fairgate mock-upstream``); prints the URL once."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_until_signal(host, port, config, clock))
