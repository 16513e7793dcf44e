"""The one failover rule, through the whole request path with an in-process upstream.

Every failure of an account (rate limit, temporary or permanent quota, billing, credit
balance, a server error, a timeout, a refused connection, our credentials refused, a model the
account does not have) moves the request to the next candidate, and the client gets that
candidate's answer; only the client's own error ends it. On the old request path a 402 or
Anthropic's credit-balance 400 went to the client as the answer while the next account was
never tried.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from inproc_support import base_config, combo, conn, gateway, target

from fairgate.providers.inprocess import (
    Reply,
    UpstreamRequest,
    anthropic_message,
    openai_chat,
)
from fairgate.timers import ManualTimer


def _err(message: str, type_: str = "error", code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": code}}


def _error(case_id: str, status: int, message: str, *type_and_code: str) -> Any:
    """A parametrize case: the upstream answers ``status`` with an OpenAI-shaped error."""
    return pytest.param(Reply(status, _err(message, *type_and_code)), id=case_id)


FAILOVER = [
    _error("rate-limit", 429, "Rate limit reached", "rate_limit_error"),
    _error("quota-permanent-429", 429, "You exceeded your current quota", "insufficient_quota"),
    _error("billing-402", 402, "Payment required: check your plan and billing details"),
    _error("server-error", 500, "internal error", "server_error"),
    _error("overloaded", 503, "overloaded", "overloaded_error"),
    _error("timeout-504", 504, "gateway timeout"),
    _error("our-credentials", 401, "Incorrect API key provided"),
    # a 403/404 is the account's only in the provider's documented structure: a bare one is
    # the request's (issue 43, N6), see test_classification_attack_inproc.py
    _error("forbidden", 403, "This account is not allowed", "permission_error"),
    _error(
        "model-not-found",
        404,
        "The model `m` does not exist",
        "invalid_request_error",
        "model_not_found",
    ),
    pytest.param(ConnectionRefusedError("refused"), id="connect-error"),
    pytest.param(TimeoutError(), id="timeout"),
    pytest.param(Reply(200, {"choices": []}), id="unusable-200"),
]


@pytest.mark.parametrize("failure", FAILOVER)
async def test_an_accounts_failure_moves_to_the_next_candidate(
    tmp_path: Path, failure: Reply | BaseException
) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        if req.conn.id == "c1":
            if isinstance(failure, BaseException):
                raise failure
            return failure
        return openai_chat("from c2")

    cfg = base_config([conn("c1", weight=2), conn("c2")])
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await h.chat("m", max_tokens=5)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "from c2"
        assert r.headers["x-fairgate-connection"] == "c2"
        assert h.sent_to == ["c1", "c2"]


async def test_anthropic_credit_balance_400_falls_through(tmp_path: Path) -> None:
    """Anthropic answers an empty balance with HTTP 400 ``billing_error`` (its documented
    structured form): the account's problem, not the client's. (The same words under
    ``invalid_request_error`` are the client's: a client cannot steer classification by text,
    see docs/security.md.)"""

    async def handler(req: UpstreamRequest) -> Reply:
        if req.conn.id == "a1":
            return Reply(
                400,
                {
                    "type": "error",
                    "error": {
                        "type": "billing_error",
                        "message": "Your credit balance is too low to access the Anthropic "
                        "API. Please go to Plans & Billing to upgrade or purchase credits.",
                    },
                },
            )
        return anthropic_message("from a2")

    cfg = base_config(
        [
            conn("a1", "anthropic", protocol="anthropic", weight=2),
            conn("a2", "anthropic", protocol="anthropic"),
        ]
    )
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await h.client.post(
            "/v1/messages",
            json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
            headers={"x-api-key": "fg-alice-secret-0123456789"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["content"][0]["text"] == "from a2"
        assert h.sent_to == ["a1", "a2"]
        # and the account is blocked until an admin clears it: the next request skips it
        r2 = await h.client.post(
            "/v1/messages",
            json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
            headers={"x-api-key": "fg-alice-secret-0123456789"},
        )
        assert r2.status_code == 200
        assert h.sent_to == ["a1", "a2", "a2"]


@pytest.mark.parametrize(
    "reply",
    [
        _error("bad-request", 400, "Invalid value for 'temperature'", "invalid_request_error"),
        _error("content-policy", 400, "Your request was rejected by our content policy"),
    ],
)
async def test_the_clients_own_error_ends_the_request(tmp_path: Path, reply: Reply) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        return reply if req.conn.id == "c1" else openai_chat("never")

    cfg = base_config([conn("c1", weight=2), conn("c2")])
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await h.chat("m", max_tokens=5)
        assert r.status_code == 400
        assert r.json()["diagnostics"]["terminalReason"] == "client_error"
        assert h.sent_to == ["c1"]


async def test_context_overflow_skips_the_same_model_elsewhere(tmp_path: Path) -> None:
    """Another account of the same model has the same window: skipped; another model next."""

    async def handler(req: UpstreamRequest) -> Reply:
        if req.json()["model"] == "small":
            return Reply(400, _err("This model's maximum context length is 8192 tokens"))
        return openai_chat("big one")

    cfg = base_config(
        [
            conn("c1", models=("small",)),
            conn("c2", models=("small",)),
            conn("c3", models=("large",)),
        ],
        combos=[
            combo("ctx", [target("c1", "small"), target("c2", "small"), target("c3", "large")])
        ],
    )
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await h.chat("ctx", max_tokens=5)
        assert r.status_code == 200, r.text
        assert h.sent_to == ["c1", "c3"]


async def test_server_error_is_retried_on_the_same_target_first(tmp_path: Path) -> None:
    calls = {"c1": 0}

    async def handler(req: UpstreamRequest) -> Reply:
        calls["c1"] += 1
        return Reply(500, _err("boom")) if calls["c1"] == 1 else openai_chat("second try")

    cfg = base_config([conn("c1")], combos=[combo("retry", ["c1"], maxRetries=1)])
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await h.chat("retry", max_tokens=5)
        assert r.status_code == 200, r.text
        assert h.sent_to == ["c1", "c1"]


async def test_a_rate_limit_is_not_retried_on_the_same_target(tmp_path: Path) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        return Reply(429, _err("Rate limit reached")) if req.conn.id == "c1" else openai_chat("ok")

    cfg = base_config([conn("c1"), conn("c2")], combos=[combo("rl", ["c1", "c2"], maxRetries=2)])
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await h.chat("rl", max_tokens=5)
        assert r.status_code == 200
        assert h.sent_to == ["c1", "c2"]


async def test_fallback_delay_is_honoured_between_fall_throughs(tmp_path: Path) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        return Reply(500, _err("boom")) if req.conn.id == "c1" else openai_chat("ok")

    slow = combo("slow", ["c1", "c2"], maxRetries=0, fallbackDelayMs=300)
    timer = ManualTimer()
    cfg = base_config([conn("c1"), conn("c2")], combos=[slow])
    async with gateway(tmp_path, cfg, timer, handler) as h:
        task = asyncio.create_task(h.chat("slow", max_tokens=5))
        await timer.until_sleeping(1)
        assert h.sent_to == ["c1"]  # paused before the next target
        timer.advance(299)
        await asyncio.sleep(0)
        assert not task.done()
        assert h.sent_to == ["c1"]
        timer.advance(1)
        r = await task
        assert r.status_code == 200
        assert h.sent_to == ["c1", "c2"]


async def test_when_every_candidate_fails_the_last_error_is_shown(tmp_path: Path) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        return Reply(402, _err("Payment required"))

    cfg = base_config([conn("c1", weight=2), conn("c2")])
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await h.chat("m", max_tokens=5)
        assert r.status_code == 402
        assert h.sent_to == ["c1", "c2"]
        diag = r.json()["diagnostics"]
        assert diag["terminalReason"] == "upstream_failed"
        assert [a["outcome"] for a in diag["attempted"]] == ["failed"] * 2
