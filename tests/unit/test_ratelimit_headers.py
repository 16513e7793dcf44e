"""Rate-limit header parsing (fairgate.domain.readings)."""

from __future__ import annotations

import pytest

from fairgate.domain.readings import (
    RateLimitSnapshot,
    parse_rate_limit_headers,
    used_fractions,
)

NOW = 1_700_000_000_000  # 2023-11-14T22:13:20Z

OPENAI = {
    "Date": "Tue, 14 Nov 2023 22:13:20 GMT",
    "Content-Type": "application/json",
    "openai-processing-ms": "412",
    "x-request-id": "req_abc",
    "x-ratelimit-limit-requests": "10000",
    "x-ratelimit-limit-tokens": "30000000",
    "x-ratelimit-remaining-requests": "9999",
    "x-ratelimit-remaining-tokens": "29999950",
    "x-ratelimit-reset-requests": "6ms",
    "x-ratelimit-reset-tokens": "0s",
}

ANTHROPIC = {
    "request-id": "req_011",
    "Anthropic-Ratelimit-Requests-Limit": "4000",
    "Anthropic-Ratelimit-Requests-Remaining": "3000",
    "Anthropic-Ratelimit-Requests-Reset": "2023-11-14T22:13:21Z",
    "anthropic-ratelimit-tokens-limit": "480000",
    "anthropic-ratelimit-tokens-remaining": "480000",
    "anthropic-ratelimit-tokens-reset": "2023-11-14T22:13:20Z",
    "anthropic-ratelimit-input-tokens-limit": "400000",
    "anthropic-ratelimit-input-tokens-remaining": "100000",
    "anthropic-ratelimit-input-tokens-reset": "2023-11-14T22:13:50Z",
    "anthropic-ratelimit-output-tokens-limit": "80000",
    "anthropic-ratelimit-output-tokens-remaining": "80000",
    "anthropic-ratelimit-output-tokens-reset": "2023-11-14T22:13:20Z",
}

ANTHROPIC_SUBSCRIPTION = {
    "anthropic-ratelimit-unified-status": "allowed",
    "anthropic-ratelimit-unified-5h-status": "allowed",
    "anthropic-ratelimit-unified-5h-reset": "1700010000",
    "anthropic-ratelimit-unified-5h-utilization": "0.42",
    "anthropic-ratelimit-unified-7d-status": "allowed",
    "anthropic-ratelimit-unified-7d-reset": "1700400000",
    "anthropic-ratelimit-unified-7d-utilization": "0.9",
    "anthropic-ratelimit-unified-representative-claim": "five_hour",
}


def test_openai_headers() -> None:
    snap = parse_rate_limit_headers(OPENAI, NOW)
    assert snap == RateLimitSnapshot(
        requests_limit=10000,
        requests_remaining=9999,
        requests_reset_ms=NOW + 6,
        tokens_limit=30_000_000,
        tokens_remaining=29_999_950,
        tokens_reset_ms=NOW,
    )
    assert used_fractions(snap) == {
        "requests": pytest.approx(0.0001),
        "tokens": pytest.approx(50 / 30_000_000),
    }


def test_anthropic_api_headers_any_case() -> None:
    snap = parse_rate_limit_headers(ANTHROPIC, NOW)
    assert snap is not None
    assert snap.requests_limit == 4000
    assert snap.requests_remaining == 3000
    assert snap.requests_reset_ms == NOW + 1_000
    assert snap.input_tokens_reset_ms == NOW + 30_000
    assert snap.output_tokens_limit == 80000
    fr = used_fractions(snap)
    assert fr["requests"] == pytest.approx(0.25)
    assert fr["tokens"] == pytest.approx(0.75)  # the fullest of tokens / input / output
    assert "percent/5h" not in fr


def test_anthropic_subscription_headers() -> None:
    snap = parse_rate_limit_headers(ANTHROPIC_SUBSCRIPTION, NOW)
    assert snap == RateLimitSnapshot(
        unified_5h_utilization=0.42,
        unified_5h_reset_ms=1_700_010_000_000,
        unified_7d_utilization=0.9,
        unified_7d_reset_ms=1_700_400_000_000,
    )
    assert used_fractions(snap) == {"percent/5h": 0.42, "percent/weekly": 0.9}


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0.42", 0.42), ("1", 1.0), ("1.0", 1.0), ("42", 0.42), ("42%", 0.42), ("0.5%", 0.005)],
)
def test_utilization_percentages(value: str, expected: float) -> None:
    snap = parse_rate_limit_headers({"anthropic-ratelimit-unified-5h-utilization": value}, NOW)
    assert snap is not None
    assert snap.unified_5h_utilization == pytest.approx(expected)


def test_rejected_status_means_exhausted() -> None:
    snap = parse_rate_limit_headers(
        {
            "anthropic-ratelimit-unified-7d-status": "rejected",
            "anthropic-ratelimit-unified-7d-reset": "1700400000",
            "anthropic-ratelimit-unified-5h-status": "rejected",
            "anthropic-ratelimit-unified-5h-utilization": "0.97",
        },
        NOW,
    )
    assert snap is not None
    assert snap.unified_7d_utilization == 1.0
    assert snap.unified_5h_utilization == 1.0


def test_retry_after_forms() -> None:
    assert parse_rate_limit_headers({"Retry-After": "20"}, NOW) == RateLimitSnapshot(
        retry_after_ms=NOW + 20_000
    )
    snap = parse_rate_limit_headers({"retry-after": "Tue, 14 Nov 2023 22:14:20 GMT"}, NOW)
    assert snap == RateLimitSnapshot(retry_after_ms=NOW + 60_000)
    # retry-after-ms is more precise and wins whatever the header order
    for headers in (
        {"retry-after": "2", "retry-after-ms": "1500"},
        {"retry-after-ms": "1500", "retry-after": "2"},
    ):
        assert parse_rate_limit_headers(headers, NOW) == RateLimitSnapshot(
            retry_after_ms=NOW + 1_500
        )


def test_suffixless_generic_headers_count_as_requests() -> None:
    snap = parse_rate_limit_headers(
        {
            "X-RateLimit-Limit": "60",
            "X-RateLimit-Remaining": "15",
            "X-RateLimit-Reset": "1700000030",
        },
        NOW,
    )
    assert snap == RateLimitSnapshot(
        requests_limit=60, requests_remaining=15, requests_reset_ms=NOW + 30_000
    )
    # the specific header wins over the generic one
    both = parse_rate_limit_headers(
        {"x-ratelimit-limit": "60", "x-ratelimit-limit-requests": "100"}, NOW
    )
    assert both is not None
    assert both.requests_limit == 100


def test_no_rate_limit_headers() -> None:
    assert parse_rate_limit_headers({}, NOW) is None
    assert parse_rate_limit_headers({"content-type": "text/event-stream"}, NOW) is None
    # present but all garbage: nothing usable either
    assert parse_rate_limit_headers({"x-ratelimit-limit-requests": "many"}, NOW) is None


def test_garbage_values_are_skipped() -> None:
    snap = parse_rate_limit_headers(
        {
            "x-ratelimit-limit-requests": "-1",
            "x-ratelimit-remaining-requests": "nan",
            "x-ratelimit-reset-requests": "soon",
            "x-ratelimit-limit-tokens": "1000",
            "x-ratelimit-remaining-tokens": "250.0",
        },
        NOW,
    )
    assert snap == RateLimitSnapshot(tokens_limit=1000, tokens_remaining=250)


def test_used_fractions_edge_cases() -> None:
    assert used_fractions(RateLimitSnapshot()) == {}
    assert used_fractions(RateLimitSnapshot(requests_limit=0, requests_remaining=0)) == {}
    assert used_fractions(RateLimitSnapshot(requests_limit=10)) == {}
    # remaining above the limit (a limit raise mid-window) never gives a negative fraction
    assert used_fractions(RateLimitSnapshot(requests_limit=10, requests_remaining=20)) == {
        "requests": 0.0
    }
    assert used_fractions(RateLimitSnapshot(tokens_limit=10, tokens_remaining=0)) == {"tokens": 1.0}


# -- Codex (ChatGPT subscription backend) -------------------------------------------------------

#: As the Codex backend sends them: which slot holds which window is stated by its length.
CODEX = {
    "x-codex-primary-used-percent": "37.5",
    "x-codex-primary-window-minutes": "300",
    "x-codex-primary-reset-at": str(NOW // 1000 + 3_600),
    "x-codex-secondary-used-percent": "12",
    "x-codex-secondary-window-minutes": "10080",
    "x-codex-secondary-reset-at": str(NOW // 1000 + 400_000),
    "x-codex-primary-over-secondary-limit-percent": "0",
}


def test_codex_windows_are_named_by_their_stated_length() -> None:
    snap = parse_rate_limit_headers(CODEX, NOW)
    assert snap is not None
    five, week = snap.window("5h"), snap.window("weekly")
    assert five is not None
    assert week is not None
    assert five.used == pytest.approx(0.375)
    assert five.reset_ms == NOW + 3_600_000
    assert five.window_ms == 5 * 3_600_000
    assert week.used == pytest.approx(0.12)
    assert week.reset_ms == NOW + 400_000_000
    assert used_fractions(snap) == {
        "percent/5h": pytest.approx(0.375),
        "percent/weekly": pytest.approx(0.12),
    }
    # slots swapped (some backends put the weekly window first): the names follow the lengths
    swapped = {
        k.replace("primary", "tmp").replace("secondary", "primary").replace("tmp", "secondary"): v
        for k, v in CODEX.items()
    }
    snap2 = parse_rate_limit_headers(swapped, NOW)
    assert snap2 is not None
    assert snap2.window("5h") == five


def test_codex_reset_after_seconds_and_unknown_lengths() -> None:
    snap = parse_rate_limit_headers(
        {
            "X-Codex-Primary-Used-Percent": "50",
            "X-Codex-Primary-Window-Minutes": "43200",  # 30 days: the monthly window
            "X-Codex-Primary-Reset-After-Seconds": "120",
            "x-codex-secondary-used-percent": "20",
            "x-codex-secondary-window-minutes": "90",  # no such pool window: its own name
            "x-codex-tertiary-used-percent": "99",  # not a slot we know
        },
        NOW,
    )
    assert snap is not None
    assert [(w.window, w.used, w.reset_ms) for w in snap.percent_windows] == [
        ("monthly", 0.5, NOW + 120_000),
        ("90m", 0.2, None),
    ]


@pytest.mark.parametrize(
    "headers",
    [
        {"x-codex-primary-used-percent": "40"},  # no window length: cannot be named
        {"x-codex-primary-used-percent": "nan", "x-codex-primary-window-minutes": "300"},
        {"x-codex-primary-used-percent": "-3", "x-codex-primary-window-minutes": "300"},
        {"x-codex-primary-used-percent": "40", "x-codex-primary-window-minutes": "0"},
    ],
)
def test_codex_unusable_readings_are_skipped(headers: dict[str, str]) -> None:
    assert parse_rate_limit_headers(headers, NOW) is None


def test_anthropic_unified_utilizations_are_window_readings_too() -> None:
    snap = parse_rate_limit_headers(ANTHROPIC_SUBSCRIPTION, NOW)
    assert snap is not None
    assert [(w.window, w.used, w.reset_ms) for w in snap.percent_windows] == [
        ("5h", 0.42, 1_700_010_000_000),
        ("weekly", 0.9, 1_700_400_000_000),
    ]
    # built by hand (the mock, tests): the same readings
    built = RateLimitSnapshot(unified_7d_utilization=0.5)
    assert [w.window for w in built.percent_windows] == ["weekly"]
