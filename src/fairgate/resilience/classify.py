"""What kind of failure an upstream answer (or a raised exception) is (SPEC §9).

Every resilience decision starts here: a rate limit cools a connection down, a permanent quota
block waits for an admin, a 5xx feeds the provider's breaker, and a client that hung up must
change nothing at all. Upstreams say the same thing in many ways, so the class comes from four
signals, strongest first:

1. the exception, when there was no answer (timeout, connection reset, the client went away);
2. the message text (``error.message``, ``error.type``, ``error.code``, Gemini's ``status`` and
   ``details``): it tells a monthly/billing quota from a per-minute limit, which no status does;
3. the status code;
4. the rate-limit headers (``retry-after``, ``retry-after-ms``, ``x-ratelimit-remaining-*: 0``
   with a reset), which give the retry hint and turn a 403 at a zero limit into a rate limit.

Permanent versus temporary quota: "insufficient_quota", "credit balance", "monthly quota",
"account deactivated" are permanent. "billing" and "credits" alone are weaker: Gemini's per-minute
``RESOURCE_EXHAUSTED`` answer also says "check your plan and billing details", so those words
count as permanent only when nothing marks the limit as temporary (a retry hint, a per-minute or
per-day metric, ``RESOURCE_EXHAUSTED``). Blocking a connection until an admin clears it because of
a one-minute limit would be far worse than retrying a billing problem a few more times.

Overload: a 429 is a rate limit whatever it says; a 5xx "overloaded" (Anthropic's 529) is a
server error: the whole provider is short of capacity, which is the breaker's business, not one
account's.

The retry hint is relative (milliseconds from ``now_ms``), parsed by the one parser in
:mod:`fairgate.resilience.retry_after`; the headers win over a ``retryDelay`` in the body, which
wins over "try again in 20s" in the message.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aiohttp
import orjson

from fairgate.clock import SYSTEM_CLOCK
from fairgate.providers.ratelimit import RateLimitSnapshot, parse_rate_limit_headers
from fairgate.resilience.retry_after import parse_delay_ms

__all__ = ["Classification", "ClientDisconnected", "FailureClass", "classify"]

#: The longest message kept on a Classification (diagnostics, logs); bodies can be huge.
MESSAGE_MAX = 500


class FailureClass(StrEnum):
    RATE_LIMIT = "rate_limit"
    QUOTA_TEMPORARY = "quota_temporary"
    QUOTA_PERMANENT = "quota_permanent"
    AUTH = "auth"
    MODEL_NOT_FOUND = "model_not_found"
    CONTEXT_OVERFLOW = "context_overflow"
    SERVER_ERROR = "server_error"
    TIMEOUT = "timeout"
    CLIENT_DISCONNECT = "client_disconnect"
    BAD_REQUEST = "bad_request"
    OK = "ok"


class ClientDisconnected(Exception):
    """Raise (or pass to :func:`classify`) when the downstream client went away mid-request.

    Never a provider failure: nothing about the upstream may change because a client hung up.
    """


#: Classes where the upstream (not the client, not us) is at fault.
_PROVIDER_FAILURES = frozenset(
    {
        FailureClass.RATE_LIMIT,
        FailureClass.QUOTA_TEMPORARY,
        FailureClass.QUOTA_PERMANENT,
        FailureClass.AUTH,
        FailureClass.SERVER_ERROR,
        FailureClass.TIMEOUT,
    }
)
#: Classes after which another target (connection, model) may well succeed.
_RETRY_ELSEWHERE = _PROVIDER_FAILURES | {
    FailureClass.MODEL_NOT_FOUND,
    FailureClass.CONTEXT_OVERFLOW,
}


@dataclass(frozen=True, slots=True)
class Classification:
    """One failure, classified.

    ``retry_after_ms`` is relative to the time of classification (None = no hint).
    ``provider_failure`` is True when the upstream is at fault (never for a client disconnect,
    a bad request or a context overflow). ``retry_elsewhere`` says whether another target may
    succeed (the proxy's fail-over decision). ``model_scoped`` says the limit names one model,
    so a model lockout fits better than cooling the whole connection.
    """

    cls: FailureClass
    retry_after_ms: int | None = None
    permanent: bool = False
    provider_failure: bool = False
    message: str = ""
    status: int | None = None
    model_scoped: bool = False
    retry_elsewhere: bool = False


def _rx(*parts: str) -> re.Pattern[str]:
    return re.compile("|".join(parts))


_STRONG_PERMANENT = _rx(
    r"insufficient[_ ]quota",
    r"credit balance",
    r"monthly (?:quota|limit|usage limit|spend(?:ing)? limit)",
    r"billing[_ ]hard[_ ]limit",
    r"account (?:has been |is |was )?(?:deactivated|disabled|suspended|terminated)",
    r"payment required",
)
_WEAK_PERMANENT = _rx(r"billing", r"\bcredits?\b", r"out of credit")
_TEMPORARY_MARKER = _rx(
    r"resource[_ ]exhausted",
    r"per[ _-]?(?:minute|second|hour|day)",
    r"\b(?:rpm|tpm|rpd|tpd)\b",
    r"(?:requests|tokens) per",
    r"quota metric",
    r"(?:try|retry) (?:again )?in",
)
_QUOTA_TEMPORARY = _rx(
    r"quota (?:reached|exceeded|exhausted)",
    r"exceeded (?:your |the )?(?:current )?quota",
    r"quota[_ ]exceeded",
    r"resource[_ ]exhausted",
    r"resource has been exhausted",
    r"usage limit (?:reached|exceeded)",
)
_RATE_LIMIT = _rx(
    r"rate[ _-]?limit",
    r"too many requests",
    r"throttl",
    r"capacity exceeded",
    r"exceeded capacity",
    r"slow down",
)
_OVERLOAD = _rx(r"overloaded", r"capacity exceeded", r"exceeded capacity", r"over capacity")
_AUTH = _rx(
    r"invalid[_ ]api[_ ]key",
    r"incorrect api key",
    r"api key not valid",
    r"invalid x-api-key",
    r"authentication[_ ]error",
    r"invalid authentication",
    r"\bunauthori[sz]ed\b",
    r"\bunauthenticated\b",
    r"permission[_ ]denied",
    r"invalid[_ ]token",
    r"token (?:has )?expired",
)
_CONTEXT = _rx(
    r"context[_ ]length",
    r"maximum context",
    r"context window",
    r"prompt is too long",
    r"input is too long",
    r"too many (?:input )?tokens",
    r"reduce the length of the (?:messages|prompt)",
    r"exceeds the context",
    r"exceeds the maximum (?:number of )?(?:input )?tokens",
    r"input token count",
)
_MODEL_NOT_FOUND = _rx(
    r"model[_ ]not[_ ]found",
    r"no such model",
    r"unknown model",
    r"model\b.{0,120}?(?:does not exist|not found|is not supported|not available)",
)
_MODEL_SCOPED = _rx(
    r"\bmodel\b\s*[:=]",
    r"\bfor (?:the )?model\b",
    r"\bper[ _-]model\b",
    r"quotadimensions",
)
_RETRY_IN = re.compile(
    r"(?:try|retry)(?: again)? (?:in|after) "
    r"((?:\d+(?:\.\d+)?(?:ms|h|m|s))+|\d+(?:\.\d+)? ?(?:seconds?|secs?))",
)
_SECONDS_WORD = re.compile(r"(\d+(?:\.\d+)?) ?(?:seconds?|secs?)")


@dataclass(frozen=True, slots=True)
class _Body:
    message: str
    haystack: str  # lower-cased text every pattern is matched against
    retry_delay: str | None  # Gemini RetryInfo.retryDelay


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _read_body(body: bytes | str | Mapping[str, Any] | None) -> _Body:
    """The human message, a haystack of every error field, and Gemini's retryDelay."""
    if body is None:
        return _Body("", "", None)
    obj: object = body
    if isinstance(body, bytes | str):
        raw = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        try:
            obj = orjson.loads(raw) if raw.strip() else None
        except orjson.JSONDecodeError:
            text = raw.strip()
            return _Body(text[:MESSAGE_MAX], text.lower(), None)
        if isinstance(obj, str | int | float) or obj is None:
            text = raw.strip()
            return _Body(text[:MESSAGE_MAX], text.lower(), None)
    if isinstance(obj, list) and obj:
        obj = obj[0]  # Gemini sometimes wraps the error in a list
    if not isinstance(obj, Mapping):
        return _Body("", "", None)
    err = obj.get("error", obj)
    parts: list[str] = []
    retry_delay: str | None = None
    if isinstance(err, str):
        message = err
        parts.extend((err, _text(obj.get("message")), _text(obj.get("code"))))
    elif isinstance(err, Mapping):
        message = _text(err.get("message")) or _text(obj.get("message")) or _text(obj.get("detail"))
        parts.append(message)
        for field in ("type", "code", "status", "param"):
            value = err.get(field)
            if isinstance(value, str | int):
                parts.append(str(value))
        details = err.get("details")
        if isinstance(details, list):
            parts.append(orjson.dumps(details).decode())
            for item in details:
                if isinstance(item, Mapping) and isinstance(item.get("retryDelay"), str):
                    retry_delay = item["retryDelay"]
    else:
        message = _text(obj.get("message")) or _text(obj.get("detail"))
        parts.append(message)
    return _Body(
        message.strip()[:MESSAGE_MAX], " ".join(p for p in parts if p).lower(), retry_delay
    )


def _header_hint(snap: RateLimitSnapshot | None, now_ms: int) -> tuple[int | None, bool]:
    """(relative retry hint from the headers, whether a limit is reported exhausted)."""
    if snap is None:
        return None, False
    resets = [
        reset
        for remaining, reset in (
            (snap.requests_remaining, snap.requests_reset_ms),
            (snap.tokens_remaining, snap.tokens_reset_ms),
            (snap.input_tokens_remaining, snap.input_tokens_reset_ms),
            (snap.output_tokens_remaining, snap.output_tokens_reset_ms),
        )
        if remaining == 0 and reset is not None
    ]
    exhausted = bool(resets) or any(
        u is not None and u >= 1.0
        for u in (snap.unified_5h_utilization, snap.unified_7d_utilization)
    )
    if snap.retry_after_ms is not None:
        return snap.retry_after_ms - now_ms, exhausted
    if resets:
        return max(resets) - now_ms, exhausted
    return None, exhausted


def _text_hint(body: _Body, now_ms: int) -> int | None:
    if body.retry_delay is not None:
        hint = parse_delay_ms(body.retry_delay, now_ms)
        if hint is not None:
            return hint
    m = _RETRY_IN.search(body.haystack)
    if m is None:
        return None
    value = m.group(1)
    word = _SECONDS_WORD.fullmatch(value)
    if word is not None:
        value = f"{word.group(1)}s"
    return parse_delay_ms(value, now_ms)


def _from_exception(exc: BaseException) -> tuple[FailureClass, bool, str] | None:
    """(class, provider_failure, message) for an exception; None defers to the status."""
    if isinstance(exc, ClientDisconnected | asyncio.CancelledError):
        return FailureClass.CLIENT_DISCONNECT, False, "client disconnected"
    if isinstance(exc, aiohttp.ClientResponseError):
        return None  # it carries the status: classify that
    message = f"{type(exc).__name__}: {exc}".strip().rstrip(":")[:MESSAGE_MAX]
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError and aiohttp's timeouts too
        return FailureClass.TIMEOUT, True, message
    if isinstance(exc, aiohttp.ClientError | OSError):
        return FailureClass.SERVER_ERROR, True, message
    # Anything else is most likely a bug on our side: a failure, but not the provider's.
    return FailureClass.SERVER_ERROR, False, message


def _is_permanent(text: str, hinted: bool) -> bool:
    if _STRONG_PERMANENT.search(text):
        return True
    return bool(_WEAK_PERMANENT.search(text)) and not hinted and not _TEMPORARY_MARKER.search(text)


def _limit_class(text: str) -> FailureClass | None:
    """A quota or rate-limit class when the text says so (overload words included)."""
    if _QUOTA_TEMPORARY.search(text):
        return FailureClass.QUOTA_TEMPORARY
    if _RATE_LIMIT.search(text) or _OVERLOAD.search(text):
        return FailureClass.RATE_LIMIT
    return None


def _client_error_class(status: int, text: str, exhausted: bool) -> FailureClass:
    """Class of a 4xx whose text named no quota or limit; ``exhausted``: the rate-limit
    headers report a limit at 0."""
    if status == 429:
        return FailureClass.RATE_LIMIT
    if status == 402:
        return FailureClass.QUOTA_PERMANENT
    if status == 403 and exhausted:  # GitHub-style: a 403 with the limit at 0 is a rate limit
        return FailureClass.RATE_LIMIT
    if status in (401, 403) or _AUTH.search(text):
        return FailureClass.AUTH
    if status == 408:
        return FailureClass.TIMEOUT
    if status == 404 or _MODEL_NOT_FOUND.search(text):
        return FailureClass.MODEL_NOT_FOUND
    if status == 413 or _CONTEXT.search(text):
        return FailureClass.CONTEXT_OVERFLOW
    # Not upgraded to a rate limit by exhausted headers: OpenAI sends them on every answer, and
    # a validation error must never cool a healthy connection down.
    return FailureClass.BAD_REQUEST


def _server_error_class(status: int, text: str) -> FailureClass:
    if status in (504, 524):
        return FailureClass.TIMEOUT
    if _QUOTA_TEMPORARY.search(text):
        return FailureClass.QUOTA_TEMPORARY
    if _RATE_LIMIT.search(text) and not _OVERLOAD.search(text):
        return FailureClass.RATE_LIMIT
    return FailureClass.SERVER_ERROR


def _status_class(status: int | None, text: str, *, hinted: bool, exhausted: bool) -> FailureClass:
    if status is not None and status < 400:
        return FailureClass.OK
    if status is not None and status >= 500:
        return _server_error_class(status, text)
    if _is_permanent(text, hinted):
        return FailureClass.QUOTA_PERMANENT
    limit = _limit_class(text)
    if limit is not None:
        return limit
    if status is None:  # no status and no exception: only the text can tell
        if _AUTH.search(text):
            return FailureClass.AUTH
        if _CONTEXT.search(text):
            return FailureClass.CONTEXT_OVERFLOW
        if _MODEL_NOT_FOUND.search(text):
            return FailureClass.MODEL_NOT_FOUND
        return FailureClass.RATE_LIMIT if exhausted else FailureClass.SERVER_ERROR
    return _client_error_class(status, text, exhausted)


def classify(
    status: int | None,
    body: bytes | str | Mapping[str, Any] | None,
    headers: Mapping[str, str] | None,
    *,
    exception: BaseException | None = None,
    model: str | None = None,
    now_ms: int | None = None,
) -> Classification:
    """Classify one upstream outcome; see the module docstring for the rules.

    ``model`` (the upstream model id asked for) lets a message naming it ("Rate limit reached
    for gpt-4o ...") count as model-scoped. ``now_ms`` anchors date-form hints (defaults to the
    system clock; pass the injected clock's time).
    """
    now = SYSTEM_CLOCK.now_ms() if now_ms is None else now_ms
    if exception is not None:
        if isinstance(exception, aiohttp.ClientResponseError) and status is None:
            status = exception.status
        verdict = _from_exception(exception)
        if verdict is not None:
            cls, provider_failure, message = verdict
            return Classification(
                cls,
                provider_failure=provider_failure,
                message=message,
                status=status,
                retry_elsewhere=provider_failure and cls in _RETRY_ELSEWHERE,
            )
    parsed = _read_body(body)
    snap = parse_rate_limit_headers(headers, now) if headers else None
    header_hint, exhausted = _header_hint(snap, now)
    text_hint = _text_hint(parsed, now)
    hint = header_hint if header_hint is not None else text_hint
    cls = _status_class(status, parsed.haystack, hinted=hint is not None, exhausted=exhausted)
    if cls is FailureClass.OK:
        return Classification(cls, status=status)
    message = parsed.message or (f"HTTP {status}" if status is not None else "upstream failure")
    scoped = bool(_MODEL_SCOPED.search(parsed.haystack)) or (
        bool(model) and model is not None and model.lower() in parsed.haystack
    )
    return Classification(
        cls,
        retry_after_ms=hint,
        permanent=cls is FailureClass.QUOTA_PERMANENT,
        provider_failure=cls in _PROVIDER_FAILURES,
        message=message,
        status=status,
        model_scoped=scoped,
        retry_elsewhere=cls in _RETRY_ELSEWHERE,
    )
