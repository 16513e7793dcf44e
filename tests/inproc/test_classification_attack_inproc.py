"""One client key must not be able to switch shared connections off (issue 19, item 1).

The whole request path over an upstream in the mock's echoing mode, which answers an unknown
body field with the provider's real 400 ("Unrecognized request argument supplied: X", "X: Extra
inputs are not permitted"). On the old classifier a key that sent ``{"insufficient_quota":
true}`` twice blocked both connections of the pool for good (persisted across restarts), and
every other key got 503.

Moved from ``tests/e2e/test_classification_attack.py`` (a gateway and a mock process per test);
a restart is a new app on the same data directory.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from inproc_support import ADMIN, UPSTREAM_SECRET, Harness, MockUpstream, conn, gateway

from fairgate.timers import ManualTimer

ATTACKER = "fg-test-attacker-6d2c1b0a9f8e7d6c5b4a"
VICTIM = "fg-test-victim-1a2b3c4d5e6f7a8b9c0d"
#: Field names an attacker picks so that the echo reads like a provider signal.
HOSTILE_FIELDS = [
    "insufficient_quota",
    "invalid_api_key",
    "rate_limit_exceeded",
    "credit balance is too low",
    "billing_hard_limit_reached",
    "model_not_found",
]


def _pool(pool_id: str, members: list[str]) -> dict[str, Any]:
    return {
        "id": pool_id,
        "name": pool_id,
        "connections": members,
        "dimensions": [{"unit": "requests", "window": "hourly", "limit": 100000}],
        "allocations": [{"key": "attacker", "weight": 50}, {"key": "victim", "weight": 50}],
    }


def config() -> dict[str, Any]:
    gpt, claude = ("gpt-4o-mini",), ("claude-sonnet-4",)
    return {
        "connections": [
            conn("conn-a", models=gpt),
            conn("conn-b", models=gpt),
            conn("claude-a", "anthropic", models=claude),
            conn("claude-b", "anthropic", models=claude),
        ],
        "pools": [_pool("shared", ["conn-a", "conn-b"]), _pool("claude", ["claude-a", "claude-b"])],
        "keys": [
            {"id": "attacker", "name": "attacker", "secret": ATTACKER},
            {"id": "victim", "name": "victim", "secret": VICTIM},
        ],
    }


def echoing() -> MockUpstream:
    return MockUpstream(reject_unknown_fields=True)


async def chat(h: Harness, secret: str, **extra: object) -> httpx.Response:
    return await h.chat("gpt-4o-mini", key=secret, max_tokens=3, **extra)


async def message(h: Harness, secret: str, **extra: object) -> httpx.Response:
    """Anthropic's wire: the upstream's echo is "X: Extra inputs are not permitted"."""
    return await h.client.post(
        "/v1/messages",
        headers={"x-api-key": secret, "anthropic-version": "2023-06-01"},
        json={
            "model": "claude-sonnet-4",
            "max_tokens": 3,
            "messages": [{"role": "user", "content": "x"}],
            **extra,
        },
    )


async def health(h: Harness) -> dict[str, Any]:
    r = await h.client.get("/api/monitoring/health", headers=ADMIN)
    assert r.status_code == 200
    resilience: dict[str, Any] = r.json()["resilience"]
    return resilience


def persisted_rows(data_dir: Path) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(data_dir / "fairgate.sqlite")) as db:
        return db.execute("SELECT scope, kind, reason FROM resilience_state").fetchall()


async def test_echoed_provider_words_block_no_connection(tmp_path: Path) -> None:
    timer, up = ManualTimer(), echoing()
    async with gateway(tmp_path, config(), timer, up) as h:
        for _ in range(3):
            for field in HOSTILE_FIELDS:
                r = await chat(h, ATTACKER, **{field: True})
                assert r.status_code == 400, r.text  # the attacker's own request fails, only
                assert "Unrecognized request argument supplied" in r.text
                r = await message(h, ATTACKER, **{field: True})
                assert r.status_code == 400, r.text
                assert "Extra inputs are not permitted" in r.text
        state = await health(h)
        assert (state["cooldowns"], state["lockouts"], state["permanent"]) == ([], [], [])
        served = {(await chat(h, VICTIM)).headers["x-fairgate-connection"] for _ in range(6)}
        assert served == {"conn-a", "conn-b"}  # both connections still serve the other key
        claude = {(await message(h, VICTIM)).headers["x-fairgate-connection"] for _ in range(6)}
        assert claude == {"claude-a", "claude-b"}
    assert persisted_rows(tmp_path) == []
    async with gateway(tmp_path, config(), timer, up) as again:  # nothing comes back
        assert (await chat(again, VICTIM)).status_code == 200
        assert (await health(again))["permanent"] == []


async def test_health_names_the_key_and_request_behind_a_real_block(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    up = echoing()
    async with gateway(tmp_path, config(), ManualTimer(), up) as h:
        # a real account-level signal: OpenAI's 429 insufficient_quota, answered to the victim
        up.schedule("quota", "429:30")
        with caplog.at_level(logging.INFO):
            first = await chat(h, VICTIM)
        assert first.status_code == 429  # both connections failed: one quota, one rate limit
        rid = first.headers["x-request-id"]
        state = await health(h)
        [perm] = state["permanent"]
        assert perm["caused_by"] == {"key_id": "victim", "request_id": rid}
        [cd] = state["cooldowns"]
        assert cd["caused_by"]["key_id"] == "victim"
        assert cd["caused_by"]["request_id"] == rid
        assert cd["connection_id"] != perm["scope"].removeprefix("conn:")
        text = (await h.client.get("/api/monitoring/health", headers=ADMIN)).text
        assert VICTIM not in text
        assert ATTACKER not in text
        assert UPSTREAM_SECRET not in text
        blocks = [r.__dict__ for r in caplog.records if "block" in r.__dict__]
        assert any(b["block"] == "permanent" and b["request_id"] == rid for b in blocks)
    [row] = [r for r in persisted_rows(tmp_path) if r[1] == "permanent"]
    assert str(row[0]).startswith("perm:conn:")


def _too_large_for_tpm(with_text: bool) -> Any:
    """OpenAI's answer to a prompt over the account's tokens-per-minute limit: a 429 whose
    headers show the budget untouched (with its documented text, or without any)."""
    from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat

    async def handler(req: UpstreamRequest) -> Reply:
        if len(req.body) < 50_000:
            return openai_chat("ok", model="gpt-4o-mini")
        text = (
            "Request too large for gpt-4o-mini in organization org-shared on tokens per min "
            "(TPM): Limit 30000, Requested 50000. The input or output tokens must be reduced "
            "in order to run successfully."
        )
        return Reply(
            status=429,
            body={
                "error": {
                    "message": text if with_text else "",
                    "type": "tokens",
                    "param": None,
                    "code": "rate_limit_exceeded",
                }
            },
            headers={
                "x-ratelimit-limit-requests": "500",
                "x-ratelimit-remaining-requests": "499",
                "x-ratelimit-limit-tokens": "30000",
                "x-ratelimit-remaining-tokens": "30000",
                "x-ratelimit-reset-tokens": "0s",
            },
        )

    return handler


@pytest.mark.parametrize("with_text", [True, False], ids=["text", "headers-only"])
async def test_a_prompt_too_large_for_the_tpm_limit_blocks_nothing(
    tmp_path: Path, with_text: bool
) -> None:
    """Issue 43, N1: OpenAI answers a prompt over the account's tokens-per-minute limit with a
    429 while its headers show the budget untouched. It was taken for the account being
    limited: a failover to the sibling and a model lockout on both (6, 12, 24 ... s), every
    other tenant refused. It is the request's: a 413 for the sender, not retried on the same
    model, no cooldown or lockout anywhere."""
    big = "x" * 60_000
    async with gateway(tmp_path, config(), ManualTimer(), _too_large_for_tpm(with_text)) as h:
        for _ in range(5):
            r = await h.chat(
                "gpt-4o-mini",
                key=ATTACKER,
                max_tokens=3,
                messages=[{"role": "user", "content": big}],
            )
            assert r.status_code == 413, r.text
            assert r.json()["error"]["code"] == "request_too_large"
            assert "retry-after" not in r.headers
            assert "org-shared" not in r.text
        assert len(h.upstream.requests) == 5  # one attempt each: the sibling has the same limit
        state = await health(h)
        assert (state["cooldowns"], state["lockouts"], state["permanent"]) == ([], [], [])
        served = {(await chat(h, VICTIM)).headers["x-fairgate-connection"] for _ in range(6)}
        assert served == {"conn-a", "conn-b"}


def _echoing_the_request(status: int) -> Any:
    """An upstream that answers a request it refuses with the request body itself (some
    OpenAI-compatible servers and proxies do): the client then writes the "error"."""
    from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat

    async def handler(req: UpstreamRequest) -> Reply:
        if "error" not in req.json():
            return openai_chat("ok", model="gpt-4o-mini")
        return Reply(status=status, body=req.body, headers={"content-type": "application/json"})

    return handler


@pytest.mark.parametrize("status", [400, 422])
async def test_an_upstream_echoing_the_request_lets_no_client_write_the_error(
    tmp_path: Path, status: int
) -> None:
    """Issue 43, N9: the error body was the request body, so its ``error`` field was read as
    the provider's: one key cooled every connection down (a failover to each, a quota each
    time), a second key blocked them for good. The request's own JSON is no provider
    structure: the sender gets its error back, one attempt, nothing blocked."""
    hostile = {"type": "insufficient_quota", "code": "insufficient_quota"}
    async with gateway(tmp_path, config(), ManualTimer(), _echoing_the_request(status)) as h:
        for secret in (ATTACKER, VICTIM, ATTACKER):
            r = await chat(h, secret, error=hostile)
            assert r.status_code == status, r.text
        assert len(h.upstream.requests) == 3  # no failover: the request fails everywhere
        state = await health(h)
        assert (state["cooldowns"], state["lockouts"], state["permanent"]) == ([], [], [])
        served = {(await chat(h, VICTIM)).headers["x-fairgate-connection"] for _ in range(6)}
        assert served == {"conn-a", "conn-b"}
    assert persisted_rows(tmp_path) == []


def _waf(status: int) -> Any:
    """A WAF in front of the provider: a request whose content it dislikes gets a bare HTML
    403 (or a proxy's 404 page), the same on every account."""
    from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat

    async def handler(req: UpstreamRequest) -> Reply:
        if b"<script>" not in req.body:
            return openai_chat("ok", model="gpt-4o-mini")
        page = f"<html><body><h1>{status}</h1>Request blocked.</body></html>"
        return Reply(status=status, body=page.encode(), headers={"content-type": "text/html"})

    return handler


@pytest.mark.parametrize("status", [403, 404])
async def test_a_bare_403_or_404_provoked_by_the_request_blocks_nothing(
    tmp_path: Path, status: int
) -> None:
    """Issue 43, N6: a WAF page was read as our credentials refused (a 300 s auth cooldown) or
    the model missing (a lockout), and failover repeated the request on each sibling, so one
    request took every connection away. It is the request's: the sender gets the status back
    after one attempt, and nothing is cooled down or locked."""
    hostile = [{"role": "user", "content": "<script>alert(1)</script>"}]
    async with gateway(tmp_path, config(), ManualTimer(), _waf(status)) as h:
        for _ in range(3):
            r = await chat(h, ATTACKER, messages=hostile)
            assert r.status_code == status, r.text
        assert len(h.upstream.requests) == 3  # not failed over to the sibling
        state = await health(h)
        assert (state["cooldowns"], state["lockouts"], state["permanent"]) == ([], [], [])
        served = {(await chat(h, VICTIM)).headers["x-fairgate-connection"] for _ in range(6)}
        assert served == {"conn-a", "conn-b"}
