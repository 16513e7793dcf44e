"""Classification a client cannot steer, and the documented error bodies of every provider.

Two halves: (1) hostile echoes — upstreams repeat request fields in their 4xx answers, so a
field named ``insufficient_quota`` must leave a client error with no block; (2) the rows of the
real providers' documented errors (OpenAI, Anthropic, Gemini, Moonshot/Kimi, Zhipu/GLM, Codex).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from fairgate.resilience.classify import CODE_TABLE, FailureClass, classify

NOW = 1_700_000_000_000  # 2023-11-14T22:13:20Z (14:13:20 in Los Angeles)
F = FailureClass

#: Words an attacker names a request field after, hoping the echo reads as a provider signal.
HOSTILE_WORDS = [
    "insufficient_quota",
    "invalid_api_key",
    "rate_limit_exceeded",
    "credit balance is too low",
    "credit_balance_too_low",
    "billing_hard_limit_reached",
    "account has been deactivated",
    "authentication_error",
    "permission_denied",
    "resource_exhausted",
    "exceeded_current_quota_error",
    "usage_limit_reached",
    "model_not_found",
    "You have exceeded your daily quota",
    "Rate limit reached for requests. Please try again in 300s",
]


def _j(obj: object) -> bytes:
    return orjson.dumps(obj)


def openai_invalid(message: str, param: str | None = None, code: str | None = None) -> bytes:
    """An OpenAI ``invalid_request_error`` body."""
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return _j({"error": error})


def openai_echo(word: str) -> bytes:
    """OpenAI's real answer to an unknown body field."""
    return openai_invalid(f"Unrecognized request argument supplied: {word}")


def openai_param_echo(word: str) -> bytes:
    """An invalid value: OpenAI names the field in ``param`` and quotes the value."""
    message = f"Invalid type for '{word}': expected an object, but got a boolean."
    return openai_invalid(message, word, "invalid_type")


def anthropic_echo(word: str) -> bytes:
    """Anthropic's real answer to an unknown body field."""
    return _j(
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": f"{word}: Extra inputs are not permitted",
            },
            "request_id": "req_011",
        }
    )


def gemini_echo(word: str) -> bytes:
    """Gemini's answer to an unknown field: the name is in the message and in the details."""
    return _j(
        {
            "error": {
                "code": 400,
                "message": "Invalid JSON payload received. "
                f'Unknown name "{word}": Cannot find field.',
                "status": "INVALID_ARGUMENT",
                "details": [
                    {
                        "@type": "type.googleapis.com/google.rpc.BadRequest",
                        "fieldViolations": [{"description": f'Unknown name "{word}"'}],
                    }
                ],
            }
        }
    )


def fastapi_echo(word: str) -> bytes:
    """A 422 from an OpenAI-compatible server built on FastAPI (vLLM and friends)."""
    return _j({"detail": [{"loc": ["body", word], "msg": "Extra inputs are not permitted"}]})


ECHOES = [
    ("openai-400", 400, openai_echo),
    ("openai-400-param", 400, openai_param_echo),
    ("openai-404", 404, openai_echo),
    ("anthropic-400", 400, anthropic_echo),
    ("gemini-400", 400, gemini_echo),
    ("compatible-422", 422, fastapi_echo),
]


@pytest.mark.parametrize("word", HOSTILE_WORDS)
@pytest.mark.parametrize(("status", "make"), [pytest.param(s, m, id=i) for i, s, m in ECHOES])
def test_an_echoed_field_is_the_clients_error_and_blocks_nothing(
    word: str, status: int, make: Any
) -> None:
    c = classify(status, make(word), None, model="gpt-4o", now_ms=NOW)
    assert c.cls in (F.BAD_REQUEST, F.CONTEXT_OVERFLOW), c
    assert not c.provider_failure
    assert not c.permanent
    assert not c.account_level


@pytest.mark.parametrize("word", HOSTILE_WORDS)
def test_an_echo_in_a_429_cannot_make_it_permanent_or_auth(word: str) -> None:
    """Even where a provider would echo into a 429, free text only picks rate limit or
    temporary quota."""
    c = classify(429, openai_echo(word), None, now_ms=NOW)
    assert c.cls in (F.RATE_LIMIT, F.QUOTA_TEMPORARY)


def test_an_echoed_retry_hint_in_a_client_error_sets_no_hint_that_matters() -> None:
    c = classify(400, openai_echo("please try again in 99h"), None, now_ms=NOW)
    assert c.cls is F.BAD_REQUEST
    assert not c.provider_failure


# ---------------------------------------------------------------------------------------------
# The documented error bodies, provider by provider


def oa(message: str, type_: str, code: str | None) -> bytes:
    return _j({"error": {"message": message, "type": type_, "param": None, "code": code}})


def an(type_: str, message: str, **extra: Any) -> bytes:
    return _j({"type": "error", "error": {"type": type_, "message": message, **extra}})


def gm(code: int, status: str, message: str, *details: dict[str, Any]) -> bytes:
    return _j(
        {"error": {"code": code, "message": message, "status": status, "details": list(details)}}
    )


def moon(type_: str, message: str) -> bytes:
    return _j({"error": {"message": message, "type": type_}})


def glm(code: str | int, message: str) -> bytes:
    return _j({"error": {"code": code, "message": message}})


def codex(**error: Any) -> bytes:
    return _j(
        {
            "error": {
                "type": "usage_limit_reached",
                "message": "The usage limit has been reached",
                **error,
            }
        }
    )


UTC_MIDNIGHT = 6_400_000  # 22:13:20Z → 00:00Z
PACIFIC_MIDNIGHT = 35_200_000  # 14:13:20 PST → 00:00 PST = 08:00Z

# (id, status, body, class, retry hint, account_level)
ROWS: list[tuple[str, int, bytes, FailureClass, int | None, bool]] = [
    # OpenAI
    (
        "openai-insufficient-quota-429",
        429,
        oa(
            "You exceeded your current quota, please check your plan and billing details.",
            "insufficient_quota",
            "insufficient_quota",
        ),
        F.QUOTA_PERMANENT,
        None,
        True,
    ),
    (
        "openai-rate-limit-429",
        429,
        oa(
            "Rate limit reached for requests. Please try again in 2s.",
            "requests",
            "rate_limit_exceeded",
        ),
        F.RATE_LIMIT,
        2_000,
        False,
    ),
    (
        "openai-rpd-429-is-a-daily-quota",
        429,
        oa(
            "Rate limit reached for gpt-4o on requests per day (RPD): Limit 10000, Used 10000.",
            "requests",
            "rate_limit_exceeded",
        ),
        F.QUOTA_TEMPORARY,
        UTC_MIDNIGHT,
        False,
    ),
    (
        "openai-invalid-api-key-401",
        401,
        oa("Incorrect API key provided: sk-****abcd.", "invalid_request_error", "invalid_api_key"),
        F.AUTH,
        None,
        False,
    ),
    (
        "openai-402-billing",
        402,
        oa(
            "You exceeded your current quota, please check your plan and billing details.",
            "billing_error",
            None,
        ),
        F.QUOTA_PERMANENT,
        None,
        True,
    ),
    (
        "openai-context-400",
        400,
        oa(
            "This model's maximum context length is 128000 tokens.",
            "invalid_request_error",
            "context_length_exceeded",
        ),
        F.CONTEXT_OVERFLOW,
        None,
        False,
    ),
    (
        "openai-content-policy-400",
        400,
        oa(
            "Your request was rejected as a result of our safety system.",
            "invalid_request_error",
            "content_policy_violation",
        ),
        F.BAD_REQUEST,
        None,
        False,
    ),
    # Anthropic: one row per documented type
    (
        "anthropic-invalid-request-400",
        400,
        an("invalid_request_error", "max_tokens: Field required"),
        F.BAD_REQUEST,
        None,
        False,
    ),
    (
        "anthropic-authentication-401",
        401,
        an("authentication_error", "invalid x-api-key"),
        F.AUTH,
        None,
        False,
    ),
    (
        "anthropic-billing-402",
        402,
        an("billing_error", "Your credit balance is too low."),
        F.QUOTA_PERMANENT,
        None,
        True,
    ),
    (
        "anthropic-permission-403",
        403,
        an(
            "permission_error",
            "Your API key does not have permission to use the specified resource.",
        ),
        F.AUTH,
        None,
        False,
    ),
    (
        "anthropic-not-found-404",
        404,
        an("not_found_error", "model: claude-9"),
        F.MODEL_NOT_FOUND,
        None,
        False,
    ),
    (
        "anthropic-too-large-413",
        413,
        an("request_too_large", "Request exceeds the maximum allowed number of bytes."),
        F.CONTEXT_OVERFLOW,
        None,
        False,
    ),
    (
        "anthropic-rate-limit-429",
        429,
        an("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
        F.RATE_LIMIT,
        None,
        False,
    ),
    (
        "anthropic-api-error-500",
        500,
        an("api_error", "Internal server error"),
        F.SERVER_ERROR,
        None,
        False,
    ),
    (
        "anthropic-overloaded-529",
        529,
        an("overloaded_error", "Overloaded"),
        F.SERVER_ERROR,
        None,
        False,
    ),
    (
        "anthropic-spend-limit-429",
        429,
        an(
            "rate_limit_error",
            "You have reached your monthly spend limit.",
            details={"error_code": "enforced_spend_limit_reached"},
        ),
        F.QUOTA_PERMANENT,
        None,
        True,
    ),
    (
        "credit-balance-too-low-429",
        429,
        an(
            "rate_limit_error",
            "Your credit balance is too low.",
            details={"error_code": "credit_balance_too_low"},
        ),
        F.QUOTA_PERMANENT,
        None,
        True,
    ),
    (
        "credit-balance-too-low-code-429",
        429,
        oa("credit balance too low", "insufficient_balance", "credit_balance_too_low"),
        F.QUOTA_PERMANENT,
        None,
        True,
    ),
    (
        "anthropic-billing-on-a-400-needs-corroboration",
        400,
        an("billing_error", "Your credit balance is too low."),
        F.QUOTA_PERMANENT,
        None,
        False,
    ),
    # Gemini
    (
        "gemini-per-day-429",
        429,
        gm(
            429,
            "RESOURCE_EXHAUSTED",
            "You exceeded your current quota, please check your plan and billing details.",
            {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}],
            },
        ),
        F.QUOTA_TEMPORARY,
        PACIFIC_MIDNIGHT,
        False,
    ),
    (
        "gemini-permission-denied-403",
        403,
        gm(403, "PERMISSION_DENIED", "Permission denied on resource project."),
        F.AUTH,
        None,
        False,
    ),
    (
        "gemini-unauthenticated-401",
        401,
        gm(401, "UNAUTHENTICATED", "Request had invalid authentication credentials."),
        F.AUTH,
        None,
        False,
    ),
    (
        "gemini-invalid-argument-400",
        400,
        gm(400, "INVALID_ARGUMENT", "Request contains an invalid argument."),
        F.BAD_REQUEST,
        None,
        False,
    ),
    (
        "gemini-failed-precondition-400-billing",
        400,
        gm(
            400,
            "FAILED_PRECONDITION",
            "Gemini API free tier is not available in your country. "
            "Please enable billing on your project.",
        ),
        F.QUOTA_PERMANENT,
        None,
        False,
    ),
    # Moonshot / Kimi
    (
        "kimi-invalid-authentication-401",
        401,
        moon("invalid_authentication_error", "Invalid Authentication"),
        F.AUTH,
        None,
        False,
    ),
    (
        "kimi-quota-429",
        429,
        moon(
            "exceeded_current_quota_error", "Your account is suspended due to insufficient balance"
        ),
        F.QUOTA_PERMANENT,
        None,
        True,
    ),
    (
        "kimi-quota-403",
        403,
        moon(
            "exceeded_current_quota_error",
            "Your account is not active, you may consider to check your account balance",
        ),
        F.QUOTA_PERMANENT,
        None,
        True,
    ),
    (
        "kimi-rate-limit-429",
        429,
        moon(
            "rate_limit_reached_error",
            "Your account reached max RPM: 3, please try again after 1 seconds",
        ),
        F.RATE_LIMIT,
        1_000,
        False,
    ),
    (
        "kimi-engine-overloaded-429",
        429,
        moon(
            "engine_overloaded_error", "The engine is currently overloaded, please try again later"
        ),
        F.SERVER_ERROR,
        None,
        False,
    ),
    (
        "kimi-not-found-404",
        404,
        moon("resource_not_found_error", "Not found the model or Permission denied"),
        F.MODEL_NOT_FOUND,
        None,
        False,
    ),
    (
        "kimi-content-filter-400",
        400,
        moon("content_filter", "The request was rejected because it was considered high risk"),
        F.BAD_REQUEST,
        None,
        False,
    ),
    # Zhipu / GLM
    (
        "glm-1113-balance-429",
        429,
        glm("1113", "Insufficient balance or no resource package. Please recharge."),
        F.QUOTA_PERMANENT,
        None,
        True,
    ),
    (
        "glm-1113-numeric",
        429,
        glm(1113, "余额不足或无可用资源包,请充值。"),
        F.QUOTA_PERMANENT,
        None,
        True,
    ),
    (
        "glm-top-level-code-and-msg",
        429,
        _j({"code": 1113, "msg": "余额不足或无可用资源包,请充值。", "success": False}),
        F.QUOTA_PERMANENT,
        None,
        True,
    ),
    (
        "glm-1302-concurrency-429",
        429,
        glm("1302", "High concurrency usage of this API, please reduce concurrency"),
        F.RATE_LIMIT,
        None,
        False,
    ),
    (
        "glm-1303-frequency-429",
        429,
        glm("1303", "High frequency usage of this API, please reduce frequency"),
        F.RATE_LIMIT,
        None,
        False,
    ),
    (
        "glm-1308-usage-limit-with-reset",
        429,
        glm("1308", "Usage limit reached for 5 hour. Your limit will reset at 2023-11-15 08:00:00"),
        F.QUOTA_TEMPORARY,
        UTC_MIDNIGHT,  # 08:00 China Standard Time is 00:00 UTC
        False,
    ),
    ("glm-1002-auth-401", 401, glm("1002", "Invalid Authentication Token"), F.AUTH, None, False),
    (
        "glm-1211-model-400",
        400,
        glm("1211", "Model does not exist, please check the model code"),
        F.MODEL_NOT_FOUND,
        None,
        False,
    ),
    (
        "glm-1261-prompt-too-long-400",
        400,
        glm("1261", "Prompt exceeds max length"),
        F.CONTEXT_OVERFLOW,
        None,
        False,
    ),
    (
        "glm-1301-unsafe-400",
        400,
        glm("1301", "System detected potentially unsafe or sensitive content"),
        F.BAD_REQUEST,
        None,
        False,
    ),
    # Codex
    (
        "codex-usage-limit-resets-in",
        429,
        codex(plan_type="plus", resets_in_seconds=3600),
        F.QUOTA_TEMPORARY,
        3_600_000,
        False,
    ),
    (
        "codex-usage-limit-resets-at",
        429,
        codex(plan_type="pro", resets_at=NOW // 1000 + 7200),
        F.QUOTA_TEMPORARY,
        7_200_000,
        False,
    ),
    (
        "codex-usage-not-included",
        403,
        _j(
            {
                "error": {
                    "type": "usage_not_included",
                    "message": "Your plan does not include Codex.",
                }
            }
        ),
        F.QUOTA_PERMANENT,
        None,
        True,
    ),
    # Daily quota in plain words on a 429: a temporary quota until the next UTC midnight
    (
        "daily-quota-429",
        429,
        _j({"error": {"message": "You have exceeded your daily quota"}}),
        F.QUOTA_TEMPORARY,
        UTC_MIDNIGHT,
        False,
    ),
]


@pytest.mark.parametrize(
    ("status", "raw", "expected", "hint", "account"),
    [pytest.param(*row[1:], id=row[0]) for row in ROWS],
)
def test_documented_provider_errors(
    status: int, raw: bytes, expected: FailureClass, hint: int | None, account: bool
) -> None:
    c = classify(status, raw, None, now_ms=NOW)
    assert c.cls is expected, c
    assert c.retry_after_ms == hint
    assert c.account_level is account
    assert c.permanent is (expected is F.QUOTA_PERMANENT)


def test_the_header_hint_beats_a_reported_reset() -> None:
    c = classify(429, codex(resets_in_seconds=3600), {"retry-after": "30"}, now_ms=NOW)
    assert c.retry_after_ms == 30_000


def test_a_reported_reset_beats_the_day_boundary() -> None:
    raw = _j(
        {
            "error": {
                "message": "daily quota exceeded",
                "type": "usage_limit_reached",
                "resets_in_seconds": 60,
            }
        }
    )
    assert classify(429, raw, None, now_ms=NOW).retry_after_ms == 60_000


def test_permanent_codes_on_a_server_error_do_not_block() -> None:
    c = classify(500, oa("oops", "insufficient_quota", "insufficient_quota"), None, now_ms=NOW)
    assert c.cls is F.SERVER_ERROR
    assert not c.permanent


def test_the_signal_names_what_decided() -> None:
    assert classify(429, glm("1113", "x"), None, now_ms=NOW).signal == "code:1113"
    assert classify(402, "Payment Required", None, now_ms=NOW).signal == "status:402"


def test_every_table_entry_is_lower_case() -> None:
    """Identifiers are matched lower-cased: an upper-case key would never match."""
    assert all(code == code.lower() for code in CODE_TABLE)
