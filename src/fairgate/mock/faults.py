"""Fault specs of the mock upstream, the error bodies and the rate-limit headers it answers with.

The gateway's resilience code (classification, Retry-After parsing, cooldowns, breakers) reacts to
status codes, bodies and headers. It is only tested honestly if the mock fails the way OpenAI and
Anthropic really fail, so the bodies here copy their wire shapes and wording (the words matter:
classification looks for "quota", "billing", "credit balance").

A fault spec is the text of an ``x-mock-fault`` header or of one ``/_mock/schedule`` entry:

=====================  ==========================================================================
``ok``                 answer normally (a placeholder in a schedule)
``429[:s]``            429 with ``Retry-After: s`` in seconds (default 1)
``429-date[:s]``       429 with ``Retry-After`` as an HTTP date ``s`` seconds ahead (default 1)
``500`` ``502``        server errors in the provider's format
``503``                service unavailable
``overloaded``         529 ``overloaded_error`` on Anthropic routes, 503 on OpenAI routes
``quota[:status]``     insufficient quota / credit balance too low (status default 429)
``timeout:s``          hold the request ``s`` seconds (or until the client leaves), then answer
``latency:ms``         extra latency before the first byte, then answer normally
``reset``              abort the TCP connection (RST) without a response
``reset-mid-stream[:k]``  send ``k`` stream events (default 1), then abort the connection
``empty``              a 200 with no content and no ``finish_reason`` / ``stop_reason`` (broken)
``empty-turn``         a legitimate empty answer: no content, finish ``stop`` / ``end_turn``
                       (Anthropic documents it after tool results; never a failure)
``error-200``          a 200 whose body is an error object (an ``error`` event when streaming)
``no-finish``          a stream that ends without ``finish_reason`` / ``message_stop``
``slow-first-token:ms``  (chat completions) a stream sends its first event at once, its first
                       token ``ms`` later; a non-stream answer comes ``ms`` later
``reasoning-only``     (chat completions) the whole budget spent reasoning: ``reasoning_content``
                       only, finish ``length``, every completion token a reasoning token
``tool-calls[:n]``     ``n`` parallel calls to the request's tools (default 2), interleaved by
                       index in chat streams (:mod:`fairgate.mock.wire`)
``redacted-thinking``  a ``redacted_thinking`` block beside the thinking of an Anthropic answer
``usage-in-delta``     an Anthropic stream whose ``message_start`` counts 0 and whose
                       ``message_delta`` carries every count
``off-schema``         prose although the request asked for a JSON schema (a model without
                       strict structured output breaking it)
=====================  ==========================================================================

Besides faults, the mock answers what a request asks for as the providers do (forced tools,
structured output, thinking, reasoning items): see :mod:`fairgate.mock.wire`.

Echoing mode (``reject_unknown_fields`` in the mock's config): a body field the real API does not
know is refused with a 400 in the provider's own words, which repeat the field's name — OpenAI's
"Unrecognized request argument supplied: X", Anthropic's "X: Extra inputs are not permitted". A
client can thus put any text (``insufficient_quota``, ``invalid_api_key``) into an upstream error,
which is how tests reproduce the attack on failure classification (issue 19).
"""

from __future__ import annotations

import email.utils
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from fairgate.mock.wire import RESPONSES_FIELDS, anthropic_extra_fields

#: Which wire format an answer takes: OpenAI chat completions or Anthropic messages.
Wire = Literal["openai", "anthropic"]

#: Faults whose whole answer is an HTTP error status.
STATUS_FAULTS = frozenset({"429", "429-date", "500", "502", "503", "overloaded", "quota"})

_NO_ARG = frozenset(
    {
        "ok",
        "500",
        "502",
        "503",
        "overloaded",
        "reset",
        "empty",
        "empty-turn",
        "error-200",
        "no-finish",
        "reasoning-only",
        "redacted-thinking",
        "usage-in-delta",
        "off-schema",
    }
)
_OPTIONAL_ARG = {
    "429": 1.0,
    "429-date": 1.0,
    "reset-mid-stream": 1.0,
    "quota": 429.0,
    "tool-calls": 2.0,
}
_REQUIRED_ARG = frozenset({"timeout", "latency", "slow-first-token"})
FAULT_KINDS = _NO_ARG | _OPTIONAL_ARG.keys() | _REQUIRED_ARG


class FaultSpecError(ValueError):
    """A fault spec the mock does not understand (answered with a 400, never ignored)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One parsed fault: its kind (the stats label) and its numeric argument, if any."""

    kind: str
    value: float = 0.0

    @property
    def is_status(self) -> bool:
        return self.kind in STATUS_FAULTS

    @property
    def spec(self) -> str:
        """The canonical text of this fault (what ``parse_fault`` turns back into it)."""
        return self.kind if self.kind in _NO_ARG else f"{self.kind}:{self.value:g}"


NO_FAULT = Fault("ok")


def parse_fault(spec: str) -> Fault:
    """Parse ``kind[:arg]``; unknown kinds and bad arguments raise :class:`FaultSpecError`."""
    kind, sep, arg = spec.strip().lower().partition(":")
    if kind not in FAULT_KINDS:
        msg = f"unknown fault {spec!r}; known: {', '.join(sorted(FAULT_KINDS))}"
        raise FaultSpecError(msg)
    if kind in _NO_ARG:
        if sep:
            raise FaultSpecError(f"fault {kind!r} takes no argument")
        return Fault(kind)
    if not sep:
        if kind in _REQUIRED_ARG:
            raise FaultSpecError(f"fault {kind!r} needs an argument, e.g. {kind}:1")
        return Fault(kind, _OPTIONAL_ARG[kind])
    try:
        value = float(arg)
    except ValueError:
        raise FaultSpecError(f"fault {kind!r}: {arg!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise FaultSpecError(f"fault {kind!r}: {arg!r} must be a finite number >= 0")
    if kind in ("reset-mid-stream", "tool-calls") and value != int(value):
        raise FaultSpecError(f"fault {kind!r}: the count must be an integer")
    if kind == "quota" and (value != int(value) or not 400 <= value <= 599):
        raise FaultSpecError("fault 'quota': the status must be an integer in 400..599")
    return Fault(kind, value)


def openai_error(
    message: str, type_: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """The error object of the OpenAI API (also used by most OpenAI-compatible providers)."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def anthropic_error(type_: str, message: str, request_id: str) -> dict[str, Any]:
    """The error object of the Anthropic API."""
    return {"type": "error", "error": {"type": type_, "message": message}, "request_id": request_id}


def error_body(
    wire: Wire, status: int, message: str, request_id: str, *, code: str | None = None
) -> dict[str, Any]:
    """A generic error in the wire's format, its type derived from the status as providers do."""
    if wire == "anthropic":
        a_type = {
            400: "invalid_request_error",
            401: "authentication_error",
            402: "billing_error",
            403: "permission_error",
            404: "not_found_error",
            413: "request_too_large",
            429: "rate_limit_error",
            529: "overloaded_error",
        }.get(status, "api_error")
        return anthropic_error(a_type, message, request_id)
    o_type = "invalid_request_error" if status < 500 else "server_error"
    return openai_error(message, o_type, code)


def _fields(names: str) -> frozenset[str]:
    return frozenset(names.split())


#: Top-level body fields the real APIs accept, per route (OpenAI chat completions and
#: embeddings, Anthropic messages); anything else is refused in echoing mode.
_LISTED_FIELDS: Mapping[str, frozenset[str]] = {
    "/v1/chat/completions": _fields(
        """model messages audio frequency_penalty function_call functions logit_bias logprobs
        max_completion_tokens max_tokens metadata modalities n parallel_tool_calls prediction
        presence_penalty prompt_cache_key reasoning_effort response_format safety_identifier
        seed service_tier stop store stream stream_options temperature tool_choice tools
        top_logprobs top_p user verbosity web_search_options"""
    ),
    "/v1/embeddings": _fields("model input dimensions encoding_format user"),
    "/v1/messages": _fields(
        """model messages max_tokens metadata stop_sequences stream system temperature thinking
        tool_choice tools top_k top_p container mcp_servers service_tier
        context_management"""
    ),
}


#: Every route's fields, with those the APIs added since (:mod:`fairgate.mock.wire`):
#: Anthropic's ``output_config`` and beta fields, the Responses API's (OpenAI's and Codex's).
KNOWN_FIELDS: Mapping[str, frozenset[str]] = {
    **_LISTED_FIELDS,
    "/v1/messages": _LISTED_FIELDS["/v1/messages"] | anthropic_extra_fields(),
    "/v1/responses": RESPONSES_FIELDS,
    "/backend-api/codex/responses": RESPONSES_FIELDS,
}


def unknown_field_error(
    wire: Wire, route: str, body: Mapping[str, Any], request_id: str
) -> dict[str, Any] | None:
    """The provider's 400 body for the first field it does not know (None if all are known).
    Like the real APIs, the answer repeats the field's name."""
    known = KNOWN_FIELDS.get(route)
    if known is None:
        return None
    name = next((k for k in body if k not in known), None)
    if name is None:
        return None
    if wire == "anthropic":
        return anthropic_error(
            "invalid_request_error", f"{name}: Extra inputs are not permitted", request_id
        )
    return openai_error(f"Unrecognized request argument supplied: {name}", "invalid_request_error")


def auth_error(wire: Wire, request_id: str) -> dict[str, Any]:
    """401 body. It never repeats the key it was given: the mock must not echo secrets."""
    if wire == "anthropic":
        return anthropic_error("authentication_error", "invalid x-api-key", request_id)
    return openai_error(
        "Incorrect API key provided. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        "invalid_request_error",
        "invalid_api_key",
    )


def error_200_body(wire: Wire, request_id: str) -> dict[str, Any]:
    """What a provider sends when it fails after committing to a 200 (quality checks catch it)."""
    if wire == "anthropic":
        return anthropic_error("overloaded_error", "Overloaded", request_id)
    return openai_error(
        "The server had an error processing your request. Sorry about that!", "server_error"
    )


def _retry_after(fault: Fault, now_s: float) -> str:
    if fault.kind == "429-date":
        return email.utils.formatdate(math.ceil(now_s + fault.value), usegmt=True)
    return f"{fault.value:g}"


def status_fault(
    fault: Fault, wire: Wire, request_id: str, now_s: float
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Status, body and extra headers of a :data:`STATUS_FAULTS` fault in the wire's format."""
    headers: dict[str, str] = {}
    kind = fault.kind
    if kind in ("429", "429-date"):
        headers["Retry-After"] = _retry_after(fault, now_s)
        status = 429
        if wire == "anthropic":
            body = anthropic_error(
                "rate_limit_error",
                "This request would exceed the rate limit for your organization of "
                "requests per minute. Please try again later.",
                request_id,
            )
        else:
            body = openai_error(
                "Rate limit reached for requests per min (RPM) on the mock upstream. "
                f"Please try again in {fault.value:g}s.",
                "requests",
                "rate_limit_exceeded",
            )
    elif kind == "quota":
        status = int(fault.value)
        if wire == "anthropic":
            body = anthropic_error(
                "billing_error",
                "Your credit balance is too low to access the Anthropic API. "
                "Please go to Plans & Billing to upgrade or purchase credits.",
                request_id,
            )
        else:
            body = openai_error(
                "You exceeded your current quota, please check your plan and billing details. "
                "For more information on this error, read the docs: "
                "https://platform.openai.com/docs/guides/error-codes/api-errors.",
                "insufficient_quota",
                "insufficient_quota",
            )
    elif kind == "overloaded":
        if wire == "anthropic":
            status = 529
            body = anthropic_error("overloaded_error", "Overloaded", request_id)
        else:
            status = 503
            body = openai_error(
                "The engine is currently overloaded, please try again later.", "server_error"
            )
    else:
        status = int(kind)
        message = {
            500: "The server had an error while processing your request. Sorry about that!",
            502: "Bad gateway.",
            503: "The server is temporarily unable to handle the request. Please retry later.",
        }[status]
        body = error_body(wire, status, message, request_id)
    if wire == "anthropic" and kind != "quota":
        headers["x-should-retry"] = "true"
    return status, body, headers


# ---------------------------------------------------------------------------------------------
# Rate-limit signals: the headers that tell the gateway how close an account is to its limits

#: The rolling window the mock's rate-limit headers count over.
WINDOW_S = 60.0


class RateWindow:
    """Requests and tokens answered in the last minute: the source of ``remaining`` headers."""

    def __init__(self) -> None:
        self._events: deque[tuple[float, int, int]] = deque()
        self._input = 0
        self._output = 0

    def record(self, now_s: float, input_tokens: int, output_tokens: int) -> None:
        self._events.append((now_s, input_tokens, output_tokens))
        self._input += input_tokens
        self._output += output_tokens

    def totals(self, now_s: float) -> tuple[int, int, int]:
        """(requests, input tokens, output tokens) inside the window ending at ``now_s``."""
        while self._events and self._events[0][0] <= now_s - WINDOW_S:
            _, i, o = self._events.popleft()
            self._input -= i
            self._output -= o
        return len(self._events), self._input, self._output

    def clear(self) -> None:
        self._events.clear()
        self._input = self._output = 0


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-minute limits and the unified subscription readings the headers report."""

    requests: int
    tokens: int  # Anthropic's output tokens get a fifth of it, as real tiers roughly do
    unified: Mapping[str, tuple[float | None, float]]  # window -> (utilization 0..1, reset in s)


def go_duration(seconds: float) -> str:
    """Format like Go's ``time.Duration`` as OpenAI's reset headers do: ``6m0s``, ``1.5s``,
    ``250ms``. Sub-second values are whole milliseconds (at least ``1ms`` when not zero)."""
    ms = math.ceil(max(0.0, seconds) * 1000 - 1e-9)
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def rfc3339(epoch_s: float) -> str:
    """Whole seconds, rounded up so a reset is never announced early."""
    return datetime.fromtimestamp(math.ceil(epoch_s), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _refill_s(used: int, limit: int) -> float:
    """Time until a bucket of ``limit`` per minute refills ``used`` units (token-bucket reset)."""
    return min(used, limit) / limit * WINDOW_S


def rate_limit_headers(
    wire: Wire, now_s: float, limits: Limits, totals: tuple[int, int, int]
) -> dict[str, str]:
    """OpenAI-style headers always; Anthropic's (and unified readings, if set) on its wire."""
    n, tin, tout = totals
    used_tokens = tin + tout
    h = {
        "x-ratelimit-limit-requests": str(limits.requests),
        "x-ratelimit-remaining-requests": str(max(0, limits.requests - n)),
        "x-ratelimit-reset-requests": go_duration(_refill_s(n, limits.requests)),
        "x-ratelimit-limit-tokens": str(limits.tokens),
        "x-ratelimit-remaining-tokens": str(max(0, limits.tokens - used_tokens)),
        "x-ratelimit-reset-tokens": go_duration(_refill_s(used_tokens, limits.tokens)),
    }
    if wire != "anthropic":
        return h
    for name, limit, used in (
        ("requests", limits.requests, n),
        ("tokens", limits.tokens, used_tokens),
        ("input-tokens", limits.tokens, tin),
        ("output-tokens", max(1, limits.tokens // 5), tout),
    ):
        h[f"anthropic-ratelimit-{name}-limit"] = str(limit)
        h[f"anthropic-ratelimit-{name}-remaining"] = str(max(0, limit - used))
        h[f"anthropic-ratelimit-{name}-reset"] = rfc3339(now_s + _refill_s(used, limit))
    statuses = []
    for window, (util, reset_s) in limits.unified.items():
        if util is None:
            continue
        status = "rejected" if util >= 1.0 else "allowed"
        statuses.append(status)
        h[f"anthropic-ratelimit-unified-{window}-utilization"] = f"{util:g}"
        h[f"anthropic-ratelimit-unified-{window}-reset"] = str(math.ceil(now_s + reset_s))
        h[f"anthropic-ratelimit-unified-{window}-status"] = status
    if statuses:
        h["anthropic-ratelimit-unified-status"] = (
            "rejected" if "rejected" in statuses else "allowed"
        )
    return h


def exhausted_headers(
    wire: Wire, now_s: float, requests_limit: int, retry_s: float
) -> dict[str, str]:
    """On a 429 the request counters read empty until the Retry-After moment."""
    if wire == "anthropic":
        return {
            "anthropic-ratelimit-requests-limit": str(requests_limit),
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": rfc3339(now_s + retry_s),
        }
    return {
        "x-ratelimit-limit-requests": str(requests_limit),
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": go_duration(retry_s),
    }
