"""What kind of failure an upstream answer (or a raised exception) is (SPEC §9).

Every resilience decision starts here: a rate limit cools a connection down, a permanent quota
block waits for an admin, a 5xx feeds the provider's breaker, and a client that hung up must
change nothing at all. Because those decisions hit every client key sharing the connection,
**a client must not be able to steer them**. Upstreams echo request text in their errors
(OpenAI: "Unrecognized request argument supplied: insufficient_quota"; Anthropic:
"insufficient_quota: Extra inputs are not permitted"; Gemini: 'Unknown name
"insufficient_quota"'), so the free-text message is never evidence of anything that blocks.
The class comes from these signals, strongest first:

1. the exception, when there was no answer (timeout, connection reset, the client went away);
2. the *structured* error identifiers the provider documents — ``error.type``, ``error.code``
   (OpenAI, Anthropic, Moonshot/Kimi, Zhipu/GLM's numeric business codes, Codex), Gemini's
   ``error.status`` and ``ErrorInfo.reason``, Anthropic's ``error.details.error_code`` — looked
   up in :data:`CODE_TABLE`, most specific first. ``param`` and every free-text field are
   ignored: they may echo the request;
3. the status code (401 auth, 402 billing, 408/504 timeout, 413 too large, 429 rate limit,
   5xx server); a 403 or 404 *without* a documented identifier (a WAF's HTML page, a proxy's
   text) is the request's fault, not an auth failure or a missing model (issue 43, N6: the
   request provokes it on every account alike);
4. the rate-limit headers (``retry-after``, ``retry-after-ms``, ``x-ratelimit-remaining-*: 0``
   with a reset), which give the retry hint and turn a 403 at a zero limit into a rate limit.

Echoes of the request (issue 43, N9): some upstreams answer with the request body itself, or
copy a field of it into the error. :func:`classify` takes the body that was sent; a body that is
the request, or whose error object (or a ``details`` item) is a piece of it, has no structure
and no text, and an identifier the request itself holds is not read as the provider's.

The message text may only *refine* within what the structure already decided, in directions
that cannot hurt other keys: a 429 is a rate limit or a temporary quota ("daily quota",
"per day") and its retry hint ("try again in 1.4s"); a client error is a context overflow or a
plain bad request; a bare 401 may be softened to a rate limit. Text never yields a permanent
block, an auth block or a model lockout, and never turns the request's fault into the
provider's.

The request's fault: an answer whose status is a client status (400, 404, 409, 413, 422, ...)
and whose structure marks the request (``invalid_request_error``, ``INVALID_ARGUMENT``,
``content_filter``, ...) is the client's error whatever its text says. Anthropic's old
"Your credit balance is too low" answer is such a 400 ``invalid_request_error`` and is treated
as the client's: its structured form is ``billing_error``.

Account-level signals (:attr:`Classification.account_level`): a 402, or a structured billing
code on a 401/402/403/429 (``insufficient_quota``, ``billing_error``,
``credit_balance_too_low``, ``exceeded_current_quota_error``, GLM ``1113``, ...). The provider
only sends those about the account, and no request text can produce them; a permanent block
from any other answer (a billing code on a 400, Gemini's ``FAILED_PRECONDITION``) needs
corroboration by a second client key (:mod:`fairgate.resilience.manager`).

Temporary quota versus rate limit: Gemini's ``RESOURCE_EXHAUSTED``, Codex's
``usage_limit_reached``, GLM's 1304/1308/1310 and a 429 that speaks of a (daily, hourly) quota
are temporary quotas; a daily one without a reported reset lasts until the next day boundary
(midnight Pacific time for Gemini, whose per-day quotas reset then; midnight UTC otherwise).

Sources relied on (read, not copied): OpenAI "Error codes" guide (401 invalid_api_key, 429
rate_limit_exceeded / insufficient_quota, 400 context_length_exceeded, content_policy);
Anthropic "HTTP errors" (docs.claude.com/en/api/errors: the type per status, billing_error,
429 ``details.error_code`` enforced_spend_limit_reached); Gemini API troubleshooting and
google.rpc status codes (RESOURCE_EXHAUSTED, PERMISSION_DENIED, UNAUTHENTICATED,
INVALID_ARGUMENT, FAILED_PRECONDITION, ErrorInfo API_KEY_INVALID, RetryInfo); Moonshot/Kimi
error reference (invalid_authentication_error, exceeded_current_quota_error,
rate_limit_reached_error, engine_overloaded_error, resource_not_found_error, content_filter);
Z.AI/Zhipu "API code" (docs.z.ai/api-reference/api-code: 1000-1004 auth, 1110-1121 account,
1211 model, 1261 prompt too long, 1301 content, 1302/1303/1305 rate, 1304/1308/1310 usage
limits with reset time, 1309 plan expired); openai/codex (``usage_limit_reached`` with
``resets_in_seconds`` / ``resets_at`` on a 429, ``usage_not_included``).

Overload: a 429 is a rate limit; a 5xx "overloaded" (Anthropic's 529, Moonshot's
``engine_overloaded_error``) is a server error: the whole provider is short of capacity, which
is the breaker's business, not one account's.

The retry hint is relative (milliseconds from ``now_ms``), parsed by the one parser in
:mod:`fairgate.domain.retry_after`; the headers win over a structured reset in the body
(``retryDelay``, ``resets_in_seconds``, ``resets_at``, GLM's reset time), which wins over
"try again in 20s" in the message.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson

from fairgate.clock import SYSTEM_CLOCK
from fairgate.domain.readings import RateLimitSnapshot, parse_rate_limit_headers
from fairgate.domain.retry_after import parse_delay_ms

__all__ = ["CODE_TABLE", "Classification", "ClientDisconnected", "FailureClass", "classify"]

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
#: Classes that say the request itself is at fault: nothing about the upstream changes.
_CLIENT_FAULTS = frozenset({FailureClass.BAD_REQUEST, FailureClass.CONTEXT_OVERFLOW})
#: Statuses that only ever speak about the credentials or the account.
_ACCOUNT_STATUSES: Final = frozenset({401, 402, 403, 429})


@dataclass(frozen=True, slots=True)
class Classification:
    """One failure, classified.

    ``retry_after_ms`` is relative to the time of classification (None = no hint).
    ``provider_failure`` is True when the upstream is at fault (never for a client disconnect,
    a bad request or a context overflow). ``retry_elsewhere`` says whether another target may
    succeed (the proxy's fail-over decision). ``model_scoped`` says the limit names one model,
    so a model lockout fits better than cooling the whole connection. ``account_level`` says a
    permanent class comes from a signal the provider only sends about the account (a 402, a
    structured billing code on a 401/402/403/429): it blocks at once, where any other permanent
    class needs a second client key to agree. ``signal`` names what decided the class
    (``code:insufficient_quota``, ``status:402``): for logs and the health view.
    """

    cls: FailureClass
    retry_after_ms: int | None = None
    permanent: bool = False
    provider_failure: bool = False
    message: str = ""
    status: int | None = None
    model_scoped: bool = False
    retry_elsewhere: bool = False
    account_level: bool = False
    signal: str = ""


F = FailureClass

#: Structured error identifiers (lower-cased ``type``/``code``/Gemini ``status``/``reason``/
#: Anthropic ``details.error_code``) and the class each one means, per provider documentation.
CODE_TABLE: Final[Mapping[str, FailureClass]] = {
    # OpenAI (and OpenAI-compatible servers)
    "insufficient_quota": F.QUOTA_PERMANENT,
    "billing_hard_limit_reached": F.QUOTA_PERMANENT,
    "billing_not_active": F.QUOTA_PERMANENT,
    "account_deactivated": F.QUOTA_PERMANENT,
    "rate_limit_exceeded": F.RATE_LIMIT,
    "invalid_api_key": F.AUTH,
    "invalid_organization": F.AUTH,
    "context_length_exceeded": F.CONTEXT_OVERFLOW,
    "string_above_max_length": F.BAD_REQUEST,
    "content_policy_violation": F.BAD_REQUEST,
    "content_filter": F.BAD_REQUEST,  # also Moonshot's type
    "invalid_value": F.BAD_REQUEST,
    "model_not_found": F.MODEL_NOT_FOUND,
    "invalid_request_error": F.BAD_REQUEST,  # also Anthropic's and Moonshot's type
    "server_error": F.SERVER_ERROR,
    # Anthropic
    "authentication_error": F.AUTH,
    "permission_error": F.AUTH,
    "not_found_error": F.MODEL_NOT_FOUND,
    "request_too_large": F.CONTEXT_OVERFLOW,
    "rate_limit_error": F.RATE_LIMIT,
    "api_error": F.SERVER_ERROR,
    "overloaded_error": F.SERVER_ERROR,
    "timeout_error": F.TIMEOUT,
    "billing_error": F.QUOTA_PERMANENT,
    "credit_balance_too_low": F.QUOTA_PERMANENT,
    "enforced_spend_limit_reached": F.QUOTA_PERMANENT,
    # Gemini (google.rpc status names and ErrorInfo reasons)
    "resource_exhausted": F.QUOTA_TEMPORARY,
    "permission_denied": F.AUTH,
    "unauthenticated": F.AUTH,
    "api_key_invalid": F.AUTH,
    "api_key_expired": F.AUTH,
    "invalid_argument": F.BAD_REQUEST,
    "failed_precondition": F.QUOTA_PERMANENT,  # "enable billing on your project"
    "billing_disabled": F.QUOTA_PERMANENT,
    "not_found": F.MODEL_NOT_FOUND,
    "unavailable": F.SERVER_ERROR,
    "internal": F.SERVER_ERROR,
    "deadline_exceeded": F.TIMEOUT,
    # Moonshot / Kimi
    "invalid_authentication_error": F.AUTH,
    "permission_denied_error": F.AUTH,
    "resource_not_found_error": F.MODEL_NOT_FOUND,
    "exceeded_current_quota_error": F.QUOTA_PERMANENT,  # "check your account balance"
    "rate_limit_reached_error": F.RATE_LIMIT,
    "engine_overloaded_error": F.SERVER_ERROR,
    # Zhipu / GLM business codes (sent as strings or numbers in error.code)
    "1000": F.AUTH,
    "1001": F.AUTH,
    "1002": F.AUTH,
    "1003": F.AUTH,
    "1004": F.AUTH,
    "1110": F.QUOTA_PERMANENT,  # account inactive
    "1111": F.QUOTA_PERMANENT,  # account does not exist
    "1112": F.QUOTA_PERMANENT,  # account locked
    "1113": F.QUOTA_PERMANENT,  # in arrears: recharge
    "1121": F.QUOTA_PERMANENT,  # locked for irregular activity
    "1120": F.SERVER_ERROR,
    "1210": F.BAD_REQUEST,
    "1211": F.MODEL_NOT_FOUND,
    "1213": F.BAD_REQUEST,
    "1214": F.BAD_REQUEST,
    "1215": F.BAD_REQUEST,
    "1220": F.AUTH,  # no permission for this API
    "1230": F.SERVER_ERROR,
    "1234": F.SERVER_ERROR,
    "1261": F.CONTEXT_OVERFLOW,
    "1301": F.BAD_REQUEST,  # unsafe content in the input
    "1302": F.RATE_LIMIT,  # concurrency
    "1303": F.RATE_LIMIT,  # frequency
    "1305": F.RATE_LIMIT,  # traffic limit
    "1304": F.QUOTA_TEMPORARY,  # daily call limit
    "1308": F.QUOTA_TEMPORARY,  # usage limit, resets at a stated time
    "1310": F.QUOTA_TEMPORARY,  # weekly/monthly limit, resets at a stated time
    "1309": F.QUOTA_PERMANENT,  # plan expired
    # Codex (ChatGPT-plan backend)
    "usage_limit_reached": F.QUOTA_TEMPORARY,
    "usage_not_included": F.QUOTA_PERMANENT,
}

#: Identifiers that only say "the request is malformed" or "something failed" in general:
#: a more specific status (401/402/403/429) wins over them.
_GENERIC: Final = frozenset(
    {"invalid_request_error", "invalid_argument", "server_error", "api_error", "internal"}
)
#: Statuses that, without a documented identifier, say nothing about the account (issue 43,
#: N6): a WAF or a proxy in front of the provider answers a request's content with a bare 403
#: or 404 (an HTML page, a line of text), the same on every account. Read as an auth failure or
#: a missing model, one request cooled every connection down for 300 s or locked the model on
#: each, as failover repeated it on every sibling. Such an answer is the request's fault: the
#: sender gets it back, nothing is blocked and no sibling is tried. The providers' own 403/404
#: are structured (``permission_error``, ``PERMISSION_DENIED``, ``model_not_found``,
#: ``not_found_error``, ``NOT_FOUND`` ...) and keep their classes; a 403 whose rate-limit
#: headers report a limit at zero stays a rate limit (headers are the provider's, not text).
_UNSTRUCTURED_IS_THE_REQUESTS: Final = frozenset({403, 404})
#: Provider-wide overload, whatever the status (Moonshot sends it as a 429): the breaker's case.
_OVERLOAD_CODES: Final = frozenset({"overloaded_error", "engine_overloaded_error"})
#: Codes whose message carries a wall-clock reset time in China Standard Time (GLM).
_GLM_RESET_CODES: Final = frozenset({"1304", "1308", "1310"})
_CST = timedelta(hours=8)


def _rx(*parts: str) -> re.Pattern[str]:
    return re.compile("|".join(parts))


# Refinements of the message text: they never decide a block, see the module docstring.
_QUOTA_WORDS = _rx(
    r"quota",
    r"usage limit",
    r"resource[_ ]exhausted",
    r"resource has been exhausted",
)
_DAILY = _rx(r"\bdaily\b", r"per[ _-]?day", r"\b(?:rpd|tpd)\b", r"perday")
#: OpenAI's 429 for a request larger than the account's per-minute budget: "Request too large
#: for gpt-4o in organization ... on tokens per min (TPM): Limit 30000, Requested 50000".
_TOO_LARGE = _rx(r"request too large", r"must be reduced in order to run")
_LIMIT_REQUESTED = re.compile(r"limit:? (\d+), requested:? (\d+)", re.IGNORECASE)
_RATE_WORDS = _rx(
    r"rate[ _-]?limit",
    r"too many requests",
    r"throttl",
    r"capacity exceeded",
    r"exceeded capacity",
    r"slow down",
)
_OVERLOAD = _rx(r"overloaded", r"capacity exceeded", r"exceeded capacity", r"over capacity")
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
_WALL_TIME = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})")


@dataclass(frozen=True, slots=True)
class _Body:
    message: str  # the human message: display only, it may echo the request
    text: str  # lower-cased message, for refinements only
    codes: tuple[str, ...]  # structured identifiers, most specific first, lower-cased
    quota: str  # Gemini QuotaFailure/ErrorInfo details, lower-cased (provider-built)
    retry_delay: str | None  # Gemini RetryInfo.retryDelay
    resets: str | None  # Codex resets_in_seconds / resets_at, as the retry parser takes them


_EMPTY = _Body("", "", (), "", None, None)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _ident(value: object) -> str | None:
    """A structured identifier as a lower-cased string (GLM sends numbers or strings)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value.strip().lower()
    return None


def _details(
    err: Mapping[str, Any], sent: _Sent | None = None
) -> tuple[list[str], str, str | None]:
    """(ErrorInfo reasons, the quota details as text, RetryInfo.retryDelay) of a Gemini error;
    also Anthropic's ``details.error_code``. Details copied from the request (``sent``) are
    ignored."""
    reasons: list[str] = []
    quota: list[str] = []
    delay: str | None = None
    details = err.get("details")
    if sent is not None and isinstance(details, Mapping | list) and sent.contains(details):
        return reasons, "", delay
    if isinstance(details, Mapping):  # Anthropic: {"error_code": "..."}
        code = _ident(details.get("error_code"))
        if code is not None:
            reasons.append(code)
    elif isinstance(details, list):
        for item in details:
            if not isinstance(item, Mapping) or (sent is not None and sent.contains(item)):
                continue
            kind = _text(item.get("@type"))
            if kind.endswith("ErrorInfo"):
                reason = _ident(item.get("reason"))
                if reason is not None:
                    reasons.append(reason)
            elif kind.endswith("QuotaFailure"):
                quota.append(orjson.dumps(item.get("violations")).decode().lower())
            elif kind.endswith("RetryInfo") and isinstance(item.get("retryDelay"), str):
                delay = item["retryDelay"]
    return reasons, " ".join(quota), delay


def _resets(err: Mapping[str, Any]) -> str | None:
    for field in ("resets_in_seconds", "resets_at"):
        value = err.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            return f"{value:g}" if field == "resets_in_seconds" else str(int(value))
    return None


class _Sent:
    """What the request sent upstream contained (issue 43, N9), so that an error body which
    repeats it is not read as the provider's structure. Some upstreams answer with the request
    body itself, or copy a field of it into the error (a request field named ``error`` holding
    ``{"type": "insufficient_quota"}``): read as the provider's, the client would choose the
    class. Parsed lazily, only when an error body has JSON structure to check."""

    __slots__ = ("_obj", "_parsed", "_raw", "_tokens")

    def __init__(self, raw: bytes) -> None:
        self._raw = raw.strip()
        self._parsed = False
        self._obj: object = None
        self._tokens: frozenset[str] = frozenset()

    def _parse(self) -> None:
        if self._parsed:
            return
        self._parsed = True
        try:
            self._obj = orjson.loads(self._raw) if self._raw else None
        except orjson.JSONDecodeError:
            return
        tokens: set[str] = set()
        stack: list[object] = [self._obj]
        while stack:  # iterative: request bodies may nest deeply
            node = stack.pop()
            if isinstance(node, Mapping):
                for key, value in node.items():
                    ident = _ident(key)
                    if ident is not None and ident in CODE_TABLE:
                        tokens.add(ident)
                    stack.append(value)
            elif isinstance(node, list):
                stack.extend(node)
            else:
                ident = _ident(node)
                if ident is not None and ident in CODE_TABLE:
                    tokens.add(ident)
        self._tokens = frozenset(tokens)

    def is_raw(self, raw: str) -> bool:
        """The error body is the request's bytes."""
        return bool(self._raw) and raw.strip().encode() == self._raw

    def contains(self, part: object) -> bool:
        """``part`` (an error object or a detail of it) equals the request or a piece of it."""
        self._parse()
        stack: list[object] = [self._obj]
        while stack:
            node = stack.pop()
            if isinstance(node, Mapping | list) and node == part:
                return True
            if isinstance(node, Mapping):
                stack.extend(v for v in node.values() if isinstance(v, Mapping | list))
            elif isinstance(node, list):
                stack.extend(v for v in node if isinstance(v, Mapping | list))
        return False

    def names(self, ident: str) -> bool:
        """The request itself holds this documented identifier (as a key or a value)."""
        self._parse()
        return ident in self._tokens


def _read_body(body: bytes | str | Mapping[str, Any] | None, sent: _Sent | None = None) -> _Body:
    """The human message, the structured identifiers and the reset fields of an error body.

    With ``sent`` (the request as sent), nothing that may be the request's own echo counts as
    structure: a body that is the request (or whose error object is a piece of it) has no
    structure and no text; an identifier the request itself holds is dropped; a detail copied
    from the request is ignored. Losing a genuine code that way only falls back to the status,
    never to anything stronger."""
    if body is None:
        return _EMPTY
    obj: object = body
    if isinstance(body, bytes | str):
        raw = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        if sent is not None and sent.is_raw(raw):
            return _EMPTY
        try:
            obj = orjson.loads(raw) if raw.strip() else None
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, Mapping | list):
            text = raw.strip()
            return _Body(text[:MESSAGE_MAX], text.lower(), (), "", None, None)
    if isinstance(obj, list) and obj:
        obj = obj[0]  # Gemini sometimes wraps the error in a list
    if not isinstance(obj, Mapping):
        return _EMPTY
    if sent is not None and sent.contains(obj):
        return _EMPTY  # the request (or a piece of it) sent back: nothing of the provider's
    err = obj.get("error", obj)
    if sent is not None and isinstance(err, Mapping | list) and sent.contains(err):
        err = {}  # the error object is the request's own: no codes, no details, no resets

    def provider_codes(found: list[str]) -> tuple[str, ...]:
        return tuple(c for c in found if sent is None or not sent.names(c))

    if isinstance(err, str):  # {"error": "text", "code": ...}
        code = _ident(obj.get("code"))
        only = provider_codes([] if code is None else [code])
        return _Body(err.strip()[:MESSAGE_MAX], err.lower(), only, "", None, None)
    if not isinstance(err, Mapping):
        return _EMPTY
    message = (
        _text(err.get("message"))
        or _text(err.get("msg"))  # GLM's older top-level {"code": 1113, "msg": ...}
        or _text(obj.get("message"))
        or _text(obj.get("detail"))
    )
    reasons, quota, delay = _details(err, sent)
    codes: list[str] = [*reasons]
    for field in ("code", "type", "status"):
        ident = _ident(err.get(field))
        if ident is not None and ident not in codes:
            codes.append(ident)
    return _Body(
        message.strip()[:MESSAGE_MAX],
        message.lower(),
        provider_codes(codes),
        quota,
        delay,
        _resets(err),
    )


def _untouched(snap: RateLimitSnapshot | None) -> bool:
    """The headers show the account's token budget whole and requests left: every token limit
    they report has all of it remaining (a rate limit on tokens never looks like this; a
    request too large for the limit does, as nothing of it was spent)."""
    if snap is None or snap.requests_remaining == 0:
        return False
    pairs = [
        (snap.tokens_remaining, snap.tokens_limit),
        (snap.input_tokens_remaining, snap.input_tokens_limit),
        (snap.output_tokens_remaining, snap.output_tokens_limit),
    ]
    known = [(r, lim) for r, lim in pairs if r is not None and lim]
    return bool(known) and all(r >= lim for r, lim in known)


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


def _body_hint(body: _Body, code: str | None, now_ms: int) -> int | None:
    """The provider's structured reset (retryDelay, Codex resets, GLM's stated reset time);
    else "try again in 20s" in the message."""
    for value in (body.retry_delay, body.resets):
        if value is not None:
            hint = parse_delay_ms(value, now_ms)
            if hint is not None:
                return hint
    if code in _GLM_RESET_CODES:
        m = _WALL_TIME.search(body.message)
        if m is not None:
            hint = parse_delay_ms(f"{m.group(1)}T{m.group(2)}+08:00", now_ms)
            if hint is not None:
                return hint
    m = _RETRY_IN.search(body.text)
    if m is None:
        return None
    value = m.group(1)
    word = _SECONDS_WORD.fullmatch(value)
    if word is not None:
        value = f"{word.group(1)}s"
    return parse_delay_ms(value, now_ms)


def _next_day_ms(now_ms: int, gemini: bool) -> int:
    """Milliseconds until the next day boundary: midnight Pacific time for Gemini (its per-day
    quotas reset then), midnight UTC otherwise."""
    tz: Any = UTC
    if gemini:
        try:
            tz = ZoneInfo("America/Los_Angeles")
        except ZoneInfoNotFoundError:  # no tz database: UTC is the documented fallback
            tz = UTC
    now = datetime.fromtimestamp(now_ms / 1000, tz)
    midnight = datetime.combine(now.date() + timedelta(days=1), datetime.min.time(), now.tzinfo)
    return max(1, int((midnight - now).total_seconds() * 1000))


def _from_exception(exc: BaseException) -> tuple[FailureClass, bool, str] | None:
    """(class, provider_failure, message) for an exception; None defers to the status."""
    if isinstance(exc, ClientDisconnected | asyncio.CancelledError):
        return FailureClass.CLIENT_DISCONNECT, False, "client disconnected"
    message = f"{type(exc).__name__}: {exc}".strip().rstrip(":")[:MESSAGE_MAX]
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError and aiohttp's timeouts too
        return FailureClass.TIMEOUT, True, message
    # the upstream port's UpstreamUnreachable / UpstreamBroken are ConnectionErrors
    if isinstance(exc, OSError):
        return FailureClass.SERVER_ERROR, True, message
    # Anything else is most likely a bug on our side: a failure, but not the provider's.
    return FailureClass.SERVER_ERROR, False, message


def _structured(codes: tuple[str, ...], status: int | None) -> tuple[FailureClass, str] | None:
    """The class the most specific documented identifier names, and that identifier. A generic
    one ("invalid_request_error") yields to an account status (401/402/403/429)."""
    for code in codes:
        cls = CODE_TABLE.get(code)
        if cls is None:
            continue
        if code in _GENERIC and status in _ACCOUNT_STATUSES:
            continue
        return cls, code
    return None


def _by_status(status: int, exhausted: bool) -> FailureClass:
    """Class of a 4xx that carried no documented identifier."""
    if status == 429:
        return F.RATE_LIMIT
    if status == 402:
        return F.QUOTA_PERMANENT
    if status == 403 and exhausted:  # GitHub-style: a 403 with the limit at 0 is a rate limit
        return F.RATE_LIMIT
    if status in (401, 403):
        return F.AUTH
    if status == 408:
        return F.TIMEOUT
    if status == 404:
        return F.MODEL_NOT_FOUND
    if status == 413:
        return F.CONTEXT_OVERFLOW
    # Not upgraded to a rate limit by exhausted headers: OpenAI sends them on every answer, and
    # a validation error must never cool a healthy connection down.
    return F.BAD_REQUEST


def _refine(cls: FailureClass, text: str, daily: bool, *, by_status: bool) -> FailureClass:
    """The text's say, in the directions that cannot hurt other keys (module docstring). An
    auth class is softened only when the bare status decided it, never a documented code."""
    if cls is F.RATE_LIMIT and (daily or _QUOTA_WORDS.search(text)):
        return F.QUOTA_TEMPORARY
    if cls is F.BAD_REQUEST and _CONTEXT.search(text):
        return F.CONTEXT_OVERFLOW
    if cls is F.AUTH and by_status and (daily or _QUOTA_WORDS.search(text)):
        return F.QUOTA_TEMPORARY  # "daily limit exceeded" on a 403: milder than an auth block
    if cls is F.AUTH and by_status and _RATE_WORDS.search(text):
        return F.RATE_LIMIT
    return cls


def _server_class(
    status: int, text: str, structured: tuple[FailureClass, str] | None
) -> FailureClass:
    if status in (504, 524):
        return F.TIMEOUT
    if structured is not None and structured[0] in (F.RATE_LIMIT, F.QUOTA_TEMPORARY, F.TIMEOUT):
        return structured[0]
    if _RATE_WORDS.search(text) and not _OVERLOAD.search(text):
        return F.RATE_LIMIT
    return F.SERVER_ERROR


def _request_too_large(status: int, body: _Body, untouched: bool) -> str | None:
    """The signal that a 429 is about the request, not the account (issue 43, N1): its text
    says the request is too large (or asks for more than the limit it names), or its own
    rate-limit headers show the account's budget untouched. Such a request fails the same way
    on every account with that limit, and nobody else's requests are limited: treated as a
    context overflow (the client's fault, no block, not retried on the same model). Text may
    decide this because it only lowers what the answer does to other keys."""
    if status != 429:
        return None
    if _TOO_LARGE.search(body.text):
        return "text:request-too-large"
    m = _LIMIT_REQUESTED.search(body.text)
    if m is not None and int(m.group(2)) > int(m.group(1)):
        return "text:requested-over-limit"
    return "headers:budget-untouched" if untouched else None


def _decide(
    status: int | None, body: _Body, exhausted: bool, daily: bool, untouched: bool = False
) -> tuple[FailureClass, str]:
    """(class, the signal that decided it)."""
    if status is None:  # no status and no exception: nothing structured to go by
        return (F.RATE_LIMIT, "headers") if exhausted else (F.SERVER_ERROR, "no status")
    if status < 400:
        return F.OK, f"status:{status}"
    too_large = _request_too_large(status, body, untouched)
    if too_large is not None:
        return F.CONTEXT_OVERFLOW, too_large
    structured = _structured(body.codes, status)
    if status >= 500:
        cls = _server_class(status, body.text, structured)
        return cls, f"status:{status}"
    if structured is not None:
        cls, code = structured
        if cls is F.SERVER_ERROR and code not in _OVERLOAD_CODES:
            cls = _by_status(status, exhausted)  # a 4xx that says "server error": trust the 4xx
        if cls in _CLIENT_FAULTS and status == 429:
            cls = F.RATE_LIMIT  # a 429 is never the request's fault
        return _refine(cls, body.text, daily, by_status=False), f"code:{code}"
    cls = _by_status(status, exhausted)
    if status in _UNSTRUCTURED_IS_THE_REQUESTS and cls is not F.RATE_LIMIT:
        # issue 43, N6: no documented identifier (a WAF's HTML page, a proxy's text): the
        # request may well have provoked it, and it would on every sibling
        return F.BAD_REQUEST, f"status:{status}:unstructured"
    return _refine(cls, body.text, daily, by_status=True), f"status:{status}"


def classify(
    status: int | None,
    body: bytes | str | Mapping[str, Any] | None,
    headers: Mapping[str, str] | None,
    *,
    exception: BaseException | None = None,
    model: str | None = None,
    now_ms: int | None = None,
    request: bytes | None = None,
) -> Classification:
    """Classify one upstream outcome; see the module docstring for the rules.

    ``request`` (the body sent upstream) keeps an error body that echoes it from being read as
    the provider's structure (issue 43, N9): pass it whenever it is known.

    ``model`` (the upstream model id asked for) lets a message naming it ("Rate limit reached
    for gpt-4o ...") count as model-scoped. ``now_ms`` anchors date-form hints (defaults to the
    system clock; pass the injected clock's time).
    """
    now = SYSTEM_CLOCK.now_ms() if now_ms is None else now_ms
    if exception is not None:
        verdict = _from_exception(exception)
        if verdict is not None:
            cls, provider_failure, message = verdict
            return Classification(
                cls,
                provider_failure=provider_failure,
                message=message,
                status=status,
                retry_elsewhere=provider_failure and cls in _RETRY_ELSEWHERE,
                signal="exception",
            )
    parsed = _read_body(body, None if request is None else _Sent(request))
    snap = parse_rate_limit_headers(headers, now) if headers else None
    header_hint, exhausted = _header_hint(snap, now)
    daily = bool(_DAILY.search(parsed.text) or _DAILY.search(parsed.quota))
    cls, signal = _decide(status, parsed, exhausted, daily, _untouched(snap))
    if cls is FailureClass.OK:
        return Classification(cls, status=status, signal=signal)
    code = signal.removeprefix("code:") if signal.startswith("code:") else None
    hint = header_hint if header_hint is not None else _body_hint(parsed, code, now)
    if hint is None and cls is F.QUOTA_TEMPORARY and daily:
        hint = _next_day_ms(now, gemini="resource_exhausted" in parsed.codes)
    message = parsed.message or (f"HTTP {status}" if status is not None else "upstream failure")
    haystack = f"{parsed.text} {parsed.quota}"
    scoped = bool(_MODEL_SCOPED.search(haystack)) or (
        bool(model) and model is not None and model.lower() in haystack
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
        account_level=cls is F.QUOTA_PERMANENT and status in _ACCOUNT_STATUSES,
        signal=signal,
    )
