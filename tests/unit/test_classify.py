"""Failure classification from real provider error bodies, statuses, headers and exceptions."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from fairgate.providers.transport import UpstreamBroken, UpstreamUnreachable
from fairgate.resilience.classify import (
    Classification,
    ClientDisconnected,
    FailureClass,
    classify,
)
from fairgate.resilience.failover import Step, step_after

NOW = 1_700_000_000_000  # 2023-11-14T22:13:20Z
F = FailureClass


def body(obj: object) -> bytes:
    return orjson.dumps(obj)


# ---------------------------------------------------------------------------------------------
# Real bodies, as the providers send them (identifiers shortened).

OPENAI_RATE_LIMIT = body(
    {
        "error": {
            "message": "Rate limit reached for gpt-4o in organization org-abc123 on tokens per "
            "min (TPM): Limit 30000, Used 29500, Requested 1200. Please try again in 1.4s. "
            "Visit https://platform.openai.com/account/rate-limits to learn more.",
            "type": "tokens",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
)
OPENAI_REQUESTS_LIMIT = body(
    {
        "error": {
            "message": "Rate limit reached for requests",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
)
OPENAI_INSUFFICIENT_QUOTA = body(
    {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing "
            "details. For more information on this error, read the docs: "
            "https://platform.openai.com/docs/guides/error-codes/api-errors.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
)
OPENAI_CONTEXT = body(
    {
        "error": {
            "message": "This model's maximum context length is 128000 tokens. However, your "
            "messages resulted in 130512 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
)
OPENAI_BAD_KEY = body(
    {
        "error": {
            "message": "Incorrect API key provided: sk-proj-****abcd. You can find your API key "
            "at https://platform.openai.com/account/api-keys.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
)
OPENAI_MODEL_NOT_FOUND = body(
    {
        "error": {
            "message": "The model `gpt-5-turbo` does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    }
)
OPENAI_VALIDATION = body(
    {
        "error": {
            "message": "Invalid value for 'temperature': expected a number less than or "
            "equal to 2.",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_value",
        }
    }
)
OPENAI_SERVER = body(
    {
        "error": {
            "message": "The server had an error while processing your request. Sorry about that!",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
)
OPENAI_ENGINE_OVERLOADED = body(
    {
        "error": {
            "message": "The engine is currently overloaded, please try again later",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
)

ANTHROPIC_RATE_LIMIT = body(
    {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "This request would exceed the rate limit for your organization "
            "(0f1e2d3c) of 50,000 input tokens per minute. For details, refer to: "
            "https://docs.claude.com/en/api/rate-limits. You can see the response headers "
            "for current usage. Please reduce the prompt length or the maximum tokens "
            "requested, or try again later. You may also contact sales at "
            "https://www.anthropic.com/contact-sales to discuss your options for a rate "
            "limit increase.",
        },
    }
)
ANTHROPIC_OVERLOADED = body(
    {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
)
ANTHROPIC_PROMPT_TOO_LONG = body(
    {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 215634 tokens > 200000 maximum",
        },
    }
)
ANTHROPIC_CREDIT = body(
    {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "Your credit balance is too low to access the Anthropic API. Please go "
            "to Plans & Billing to upgrade or purchase credits.",
        },
    }
)
ANTHROPIC_AUTH = body(
    {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
)
ANTHROPIC_PERMISSION = body(
    {
        "type": "error",
        "error": {
            "type": "permission_error",
            "message": "Your API key does not have permission to use the specified resource.",
        },
    }
)
ANTHROPIC_NOT_FOUND = body(
    {"type": "error", "error": {"type": "not_found_error", "message": "model: claude-3-opus-2099"}}
)
ANTHROPIC_API_ERROR = body(
    {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}
)

GEMINI_FREE_TIER_429 = body(
    {
        "error": {
            "code": 429,
            "message": "You exceeded your current quota, please check your plan and billing "
            "details. For more information on this error, head to: "
            "https://ai.google.dev/gemini-api/docs/rate-limits.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [
                        {
                            "quotaMetric": "generativelanguage.googleapis.com/"
                            "generate_content_free_tier_requests",
                            "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                            "quotaDimensions": {"location": "global", "model": "gemini-2.0-pro"},
                            "quotaValue": "2",
                        }
                    ],
                },
                {
                    "@type": "type.googleapis.com/google.rpc.Help",
                    "links": [{"description": "Learn more", "url": "https://ai.google.dev"}],
                },
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "39s"},
            ],
        }
    }
)
GEMINI_QUOTA_METRIC = body(
    {
        "error": {
            "code": 429,
            "message": "Quota exceeded for quota metric 'Generate Content API requests per "
            "minute' and limit 'GenerateContent request limit per minute for a region' of "
            "service 'generativelanguage.googleapis.com' for consumer "
            "'project_number:123456'.",
            "status": "RESOURCE_EXHAUSTED",
        }
    }
)
GEMINI_EXHAUSTED = body(
    {
        "error": {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
        }
    }
)
GEMINI_BAD_KEY = body(
    {
        "error": {
            "code": 400,
            "message": "API key not valid. Please pass a valid API key.",
            "status": "INVALID_ARGUMENT",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "API_KEY_INVALID",
                    "domain": "googleapis.com",
                }
            ],
        }
    }
)
GEMINI_NOT_FOUND = body(
    {
        "error": {
            "code": 404,
            "message": "models/gemini-9.0-pro is not found for API version v1beta, or is not "
            "supported for generateContent. Call ListModels to see the list of available "
            "models and their supported methods.",
            "status": "NOT_FOUND",
        }
    }
)
GEMINI_TOO_MANY_TOKENS = body(
    {
        "error": {
            "code": 400,
            "message": "The input token count (1200345) exceeds the maximum number of tokens "
            "allowed (1048576).",
            "status": "INVALID_ARGUMENT",
        }
    }
)
GEMINI_UNAVAILABLE = body(
    {
        "error": {
            "code": 503,
            "message": "The model is overloaded. Please try again later.",
            "status": "UNAVAILABLE",
        }
    }
)
GEMINI_LIST_WRAPPED = body(
    [{"error": {"code": 429, "message": "Resource exhausted", "status": "RESOURCE_EXHAUSTED"}}]
)
AZURE_429 = body(
    {
        "error": {
            "code": "429",
            "message": "Requests to the ChatCompletions_Create Operation under Azure OpenAI API "
            "version 2024-02-01 have exceeded token rate limit of your current OpenAI S0 pricing "
            "tier. Please retry after 6 seconds.",
        }
    }
)

# (id, status, body, headers, class, retry_after_ms)
TABLE: list[tuple[str, int | None, object, dict[str, str] | None, FailureClass, int | None]] = [
    # OpenAI
    ("openai-429-tpm", 429, OPENAI_RATE_LIMIT, None, F.RATE_LIMIT, 1_400),
    (
        "openai-429-headers",
        429,
        OPENAI_REQUESTS_LIMIT,
        {
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "6m0s",
            "x-ratelimit-limit-tokens": "30000",
            "x-ratelimit-remaining-tokens": "29000",
            "x-ratelimit-reset-tokens": "2ms",
        },
        F.RATE_LIMIT,
        360_000,
    ),
    ("openai-insufficient-quota", 429, OPENAI_INSUFFICIENT_QUOTA, None, F.QUOTA_PERMANENT, None),
    ("openai-context", 400, OPENAI_CONTEXT, None, F.CONTEXT_OVERFLOW, None),
    ("openai-invalid-key", 401, OPENAI_BAD_KEY, None, F.AUTH, None),
    ("openai-model-not-found", 404, OPENAI_MODEL_NOT_FOUND, None, F.MODEL_NOT_FOUND, None),
    ("openai-validation", 400, OPENAI_VALIDATION, None, F.BAD_REQUEST, None),
    ("openai-500", 500, OPENAI_SERVER, None, F.SERVER_ERROR, None),
    ("openai-503-overloaded", 503, OPENAI_ENGINE_OVERLOADED, None, F.SERVER_ERROR, None),
    # Anthropic
    (
        "anthropic-429",
        429,
        ANTHROPIC_RATE_LIMIT,
        {
            "retry-after": "17",
            "anthropic-ratelimit-input-tokens-limit": "50000",
            "anthropic-ratelimit-input-tokens-remaining": "0",
            "anthropic-ratelimit-input-tokens-reset": "2023-11-14T22:13:40Z",
        },
        F.RATE_LIMIT,
        17_000,
    ),
    ("anthropic-529", 529, ANTHROPIC_OVERLOADED, None, F.SERVER_ERROR, None),
    (
        "anthropic-529-retry-after",
        529,
        ANTHROPIC_OVERLOADED,
        {"retry-after": "30"},
        F.SERVER_ERROR,
        30_000,
    ),
    ("anthropic-prompt-too-long", 400, ANTHROPIC_PROMPT_TOO_LONG, None, F.CONTEXT_OVERFLOW, None),
    # the old text-only billing answer is a 400 invalid_request_error: the request's fault
    ("anthropic-credit-balance", 400, ANTHROPIC_CREDIT, None, F.BAD_REQUEST, None),
    ("anthropic-auth", 401, ANTHROPIC_AUTH, None, F.AUTH, None),
    ("anthropic-permission", 403, ANTHROPIC_PERMISSION, None, F.AUTH, None),
    ("anthropic-not-found", 404, ANTHROPIC_NOT_FOUND, None, F.MODEL_NOT_FOUND, None),
    ("anthropic-500", 500, ANTHROPIC_API_ERROR, None, F.SERVER_ERROR, None),
    # Gemini
    ("gemini-free-tier", 429, GEMINI_FREE_TIER_429, None, F.QUOTA_TEMPORARY, 39_000),
    ("gemini-quota-metric", 429, GEMINI_QUOTA_METRIC, None, F.QUOTA_TEMPORARY, None),
    ("gemini-exhausted", 429, GEMINI_EXHAUSTED, None, F.QUOTA_TEMPORARY, None),
    ("gemini-bad-key-400", 400, GEMINI_BAD_KEY, None, F.AUTH, None),
    ("gemini-not-found", 404, GEMINI_NOT_FOUND, None, F.MODEL_NOT_FOUND, None),
    ("gemini-too-many-tokens", 400, GEMINI_TOO_MANY_TOKENS, None, F.CONTEXT_OVERFLOW, None),
    ("gemini-503", 503, GEMINI_UNAVAILABLE, None, F.SERVER_ERROR, None),
    ("gemini-list-wrapped", 429, GEMINI_LIST_WRAPPED, None, F.QUOTA_TEMPORARY, None),
    # Azure and generic text bodies: free text never blocks (it may echo the request)
    ("azure-429-retry-after-text", 429, AZURE_429, None, F.RATE_LIMIT, 6_000),
    ("text-429", 429, "Too Many Requests", None, F.RATE_LIMIT, None),
    ("text-429-empty", 429, b"", {"Retry-After": "20"}, F.RATE_LIMIT, 20_000),
    # a bare 403/404 is the request's (issue 43, N6): its text neither blocks nor softens it
    ("text-403-rate-limit", 403, "API rate limit exceeded for user", None, F.BAD_REQUEST, None),
    ("text-400-throttled", 400, "Request was throttled.", None, F.BAD_REQUEST, None),
    ("text-429-capacity", 429, "capacity exceeded, retry later", None, F.RATE_LIMIT, None),
    ("text-503-capacity", 503, "capacity exceeded", None, F.SERVER_ERROR, None),
    ("text-503-rate-limit", 503, "rate limit exceeded", None, F.RATE_LIMIT, None),
    ("text-quota-reached", 429, "Quota reached for this hour", None, F.QUOTA_TEMPORARY, None),
    ("text-monthly-quota", 429, "Monthly quota exceeded", None, F.QUOTA_TEMPORARY, None),
    ("text-billing", 403, "Billing account not active", None, F.BAD_REQUEST, None),
    ("text-credits", 400, "You have run out of credits", None, F.BAD_REQUEST, None),
    ("text-deactivated", 403, "Your account has been deactivated", None, F.BAD_REQUEST, None),
    ("text-disabled", 401, "account disabled", None, F.AUTH, None),
    ("text-402", 402, "Payment Required", None, F.QUOTA_PERMANENT, None),
    ("text-408", 408, "Request Timeout", None, F.TIMEOUT, None),
    ("text-504", 504, "Gateway Timeout", None, F.TIMEOUT, None),
    ("text-502-html", 502, "<html><body>Bad Gateway</body></html>", None, F.SERVER_ERROR, None),
    ("text-413", 413, "Payload Too Large", None, F.CONTEXT_OVERFLOW, None),
    ("text-422", 422, {"detail": "field required"}, None, F.BAD_REQUEST, None),
    ("text-model-missing", 400, "model 'llama-9' not found", None, F.BAD_REQUEST, None),
    ("no-status-text-rate-limit", None, "rate limit exceeded", None, F.SERVER_ERROR, None),
    ("no-status-nothing", None, None, None, F.SERVER_ERROR, None),
    ("ok-200", 200, b'{"id":"chatcmpl-1"}', None, F.OK, None),
    # headers alone
    (
        "403-github-style",
        403,
        "Forbidden",
        {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1700000060"},
        F.RATE_LIMIT,
        60_000,
    ),
    (
        "429-retry-after-ms-wins",
        429,
        None,
        {"retry-after": "20", "retry-after-ms": "1500"},
        F.RATE_LIMIT,
        1_500,
    ),
    (
        "429-http-date",
        429,
        None,
        {"Retry-After": "Tue, 14 Nov 2023 22:14:20 GMT"},
        F.RATE_LIMIT,
        60_000,
    ),
    (
        "429-header-beats-body-delay",
        429,
        GEMINI_FREE_TIER_429,
        {"retry-after": "5"},
        F.QUOTA_TEMPORARY,
        5_000,
    ),
]


@pytest.mark.parametrize(
    ("status", "raw", "headers", "expected", "hint"),
    [pytest.param(*row[1:], id=row[0]) for row in TABLE],
)
def test_classification_table(
    status: int | None,
    raw: Any,
    headers: dict[str, str] | None,
    expected: FailureClass,
    hint: int | None,
) -> None:
    c = classify(status, raw, headers, now_ms=NOW)
    assert c.cls is expected, c
    assert c.retry_after_ms == hint
    assert c.permanent is (expected is F.QUOTA_PERMANENT)
    assert c.status == status


PROVIDER_FAILURE = {
    F.RATE_LIMIT: True,
    F.QUOTA_TEMPORARY: True,
    F.QUOTA_PERMANENT: True,
    F.AUTH: True,
    F.SERVER_ERROR: True,
    F.TIMEOUT: True,
    F.MODEL_NOT_FOUND: False,
    F.CONTEXT_OVERFLOW: False,
    F.BAD_REQUEST: False,
    F.OK: False,
}


@pytest.mark.parametrize("row", TABLE, ids=[r[0] for r in TABLE])
def test_provider_failure_follows_the_class(row: tuple[Any, ...]) -> None:
    _, status, raw, headers, expected, _ = row
    c = classify(status, raw, headers, now_ms=NOW)
    assert c.provider_failure is PROVIDER_FAILURE[expected]


def test_message_is_the_human_message() -> None:
    c = classify(401, ANTHROPIC_AUTH, None, now_ms=NOW)
    assert c.message == "invalid x-api-key"
    assert classify(429, b"", None, now_ms=NOW).message == "HTTP 429"


def test_message_is_bounded() -> None:
    c = classify(500, "x" * 10_000, None, now_ms=NOW)
    assert len(c.message) == 500


def test_body_as_mapping_and_str() -> None:
    as_map = classify(429, orjson.loads(OPENAI_RATE_LIMIT), None, now_ms=NOW)
    as_str = classify(429, OPENAI_RATE_LIMIT.decode(), None, now_ms=NOW)
    as_bytes = classify(429, OPENAI_RATE_LIMIT, None, now_ms=NOW)
    assert as_map == as_str == as_bytes


def test_model_scope_from_the_message_naming_the_model() -> None:
    assert classify(429, OPENAI_RATE_LIMIT, None, model="gpt-4o", now_ms=NOW).model_scoped
    assert not classify(429, OPENAI_REQUESTS_LIMIT, None, model="gpt-4o", now_ms=NOW).model_scoped


def test_model_scope_from_gemini_quota_dimensions() -> None:
    assert classify(429, GEMINI_FREE_TIER_429, None, now_ms=NOW).model_scoped


def test_gemini_billing_words_with_a_retry_delay_are_not_permanent() -> None:
    """The free-tier answer says "billing" but is a per-minute limit: blocking the connection
    until an admin clears it would be far worse than one more retry."""
    c = classify(429, GEMINI_FREE_TIER_429, None, now_ms=NOW)
    assert not c.permanent
    assert c.retry_after_ms == 39_000


def test_insufficient_quota_is_permanent_even_with_a_retry_after() -> None:
    c = classify(429, OPENAI_INSUFFICIENT_QUOTA, {"retry-after": "20"}, now_ms=NOW)
    assert c.cls is F.QUOTA_PERMANENT
    assert c.permanent


def test_weak_permanent_words_yield_to_a_header_hint() -> None:
    c = classify(429, "check your billing details", {"retry-after": "10"}, now_ms=NOW)
    assert c.cls is F.RATE_LIMIT
    assert not c.permanent


def test_hint_is_clamped_by_the_one_parser() -> None:
    c = classify(429, None, {"retry-after": "99999h"}, now_ms=NOW)
    assert c.retry_after_ms == 8 * 86_400_000


def test_unparseable_retry_after_gives_no_hint() -> None:
    assert classify(429, None, {"retry-after": "soon"}, now_ms=NOW).retry_after_ms is None


def test_retry_elsewhere() -> None:
    assert classify(429, None, None, now_ms=NOW).retry_elsewhere
    assert classify(404, OPENAI_MODEL_NOT_FOUND, None, now_ms=NOW).retry_elsewhere
    assert classify(400, OPENAI_CONTEXT, None, now_ms=NOW).retry_elsewhere
    assert not classify(400, OPENAI_VALIDATION, None, now_ms=NOW).retry_elsewhere


@pytest.mark.parametrize(
    ("exc", "expected", "provider_failure"),
    [
        pytest.param(TimeoutError(), F.TIMEOUT, True, id="timeout"),
        pytest.param(UpstreamUnreachable("refused"), F.SERVER_ERROR, True, id="unreachable"),
        pytest.param(UpstreamBroken("cut"), F.SERVER_ERROR, True, id="broken-mid-answer"),
        pytest.param(ConnectionResetError(104, "reset"), F.SERVER_ERROR, True, id="reset"),
        pytest.param(asyncio.CancelledError(), F.CLIENT_DISCONNECT, False, id="cancelled"),
        pytest.param(ClientDisconnected(), F.CLIENT_DISCONNECT, False, id="client-gone"),
        pytest.param(ValueError("our bug"), F.SERVER_ERROR, False, id="our-bug"),
    ],
)
def test_exceptions(exc: BaseException, expected: FailureClass, provider_failure: bool) -> None:
    c = classify(None, None, None, exception=exc, now_ms=NOW)
    assert c.cls is expected
    assert c.provider_failure is provider_failure


def test_client_disconnect_is_never_a_provider_failure_whatever_the_status() -> None:
    c = classify(500, OPENAI_SERVER, None, exception=ClientDisconnected(), now_ms=NOW)
    assert c == Classification(
        F.CLIENT_DISCONNECT,
        message="client disconnected",
        status=500,
        provider_failure=False,
        signal="exception",
    )
    assert not c.retry_elsewhere


def test_default_now_is_the_system_clock() -> None:
    c = classify(429, None, {"retry-after": "20"})
    assert c.retry_after_ms == 20_000


# --- issue 43, N9: an error body that echoes the request is not the provider's structure ---

#: A request that carries what a provider's error would: a field named ``error`` holding a
#: billing code, and the code once more as a value elsewhere.
HOSTILE_REQUEST = orjson.dumps(
    {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "hi"}],
        "error": {"type": "insufficient_quota", "code": "insufficient_quota"},
        "metadata": {"tag": "billing_error"},
    }
)


@pytest.mark.parametrize("status", [400, 422, 429, 403])
def test_a_body_that_is_the_request_has_no_provider_structure(status: int) -> None:
    """The upstream answered with the request body itself: its ``error`` field is the client's,
    so no billing class (at most what the bare status says)."""
    c = classify(status, HOSTILE_REQUEST, None, now_ms=NOW, request=HOSTILE_REQUEST)
    assert c.cls is not F.QUOTA_PERMANENT
    assert not c.permanent
    assert not c.signal.startswith("code:")
    assert c.message == f"HTTP {status}"  # no text of the client's shown as the provider's


def test_an_error_object_copied_from_a_request_field_is_no_structure() -> None:
    """A partial echo: the upstream wraps the request's own ``error`` field."""
    answer = orjson.dumps({"error": orjson.loads(HOSTILE_REQUEST)["error"]})
    c = classify(400, answer, None, now_ms=NOW, request=HOSTILE_REQUEST)
    assert c.cls is F.BAD_REQUEST
    assert c.signal == "status:400"


def test_an_identifier_the_request_holds_is_not_read_as_the_providers() -> None:
    """The provider's own error object, but its code is a value the client sent: dropped,
    the generic type and the status decide."""
    answer = body(
        {
            "error": {
                "message": "Invalid value for 'metadata.tag'.",
                "type": "invalid_request_error",
                "code": "billing_error",
            }
        }
    )
    c = classify(400, answer, None, now_ms=NOW, request=HOSTILE_REQUEST)
    assert c.cls is F.BAD_REQUEST
    assert c.signal == "code:invalid_request_error"


def test_a_genuine_structured_error_still_counts_next_to_an_ordinary_request() -> None:
    request = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})
    c = classify(429, OPENAI_INSUFFICIENT_QUOTA, None, now_ms=NOW, request=request)
    assert c.cls is F.QUOTA_PERMANENT
    assert c.account_level


# --- issue 43, N6: a bare 403/404 is the request's, not the account's ---

WAF_PAGE = "<html><head><title>403 Forbidden</title></head><body>Request blocked.</body></html>"


@pytest.mark.parametrize(
    ("status", "answer"),
    [
        (403, WAF_PAGE),
        (403, None),
        (403, {"detail": "Forbidden"}),
        (404, "<html><body>Not Found</body></html>"),
        (404, None),
        (404, "404 page not found"),
    ],
)
def test_an_unstructured_403_or_404_blocks_nothing_and_is_not_failed_over(
    status: int, answer: object
) -> None:
    """A WAF or proxy answers a request's content with a bare 403/404, the same on every
    account: no auth cooldown, no model lockout, no sibling tried."""
    c = classify(status, answer, None, now_ms=NOW)  # type: ignore[arg-type]
    assert c.cls is F.BAD_REQUEST
    assert c.signal == f"status:{status}:unstructured"
    assert not c.provider_failure
    assert not c.retry_elsewhere
    assert step_after(c.cls) is Step.END


def test_a_structured_403_or_404_keeps_its_class() -> None:
    assert classify(403, ANTHROPIC_PERMISSION, None, now_ms=NOW).cls is F.AUTH
    assert classify(404, OPENAI_MODEL_NOT_FOUND, None, now_ms=NOW).cls is F.MODEL_NOT_FOUND
    assert classify(401, WAF_PAGE, None, now_ms=NOW).cls is F.AUTH  # 401 is about credentials
