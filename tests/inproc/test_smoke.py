"""The in-process harness serves a request end to end (the base every other test here uses)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from inproc_support import ALICE, BOB, anthropic_stream, base_config, conn, gateway

from fairgate.clock import ManualClock
from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat
from fairgate.timers import ManualTimer


async def test_answer_through_the_whole_path(tmp_path: Path) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        assert req.path == "/chat/completions"
        assert req.headers["authorization"] == f"Bearer {req.conn.secret}"
        return openai_chat("hello")

    cfg = base_config([conn("c1")])
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await h.chat("m", max_tokens=5)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "hello"
        assert r.headers["x-fairgate-connection"] == "c1"


async def test_a_translated_stream_stamps_created_from_the_gateways_clock(tmp_path: Path) -> None:
    """Chat chunks made from an Anthropic stream carry ``created`` from the injected clock."""

    async def handler(req: UpstreamRequest) -> Reply:
        return anthropic_stream("hi")

    timer = ManualTimer(ManualClock(1_234_567_890_123))
    async with gateway(tmp_path, base_config([conn("c1", "anthropic")]), timer, handler) as h:
        r = await h.chat("m", stream=True)
        assert r.status_code == 200, r.text
        chunks = [
            json.loads(line[len("data: ") :])
            for line in r.text.splitlines()
            if line.startswith("data: {")
        ]
        assert chunks
        assert {c["created"] for c in chunks} == {1_234_567_890}


ANTHROPIC_ANSWER = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 3, "output_tokens": 1},
}


async def test_a_translated_answer_stamps_created_from_the_gateways_clock(tmp_path: Path) -> None:
    """The non-stream form of the test above: a chat completion made from an Anthropic message,
    and a Responses object made from it, are stamped by the injected clock, not the host's."""

    async def handler(req: UpstreamRequest) -> Reply:
        return Reply(body=json.dumps(ANTHROPIC_ANSWER).encode())

    timer = ManualTimer(ManualClock(1_234_567_890_123))
    async with gateway(tmp_path, base_config([conn("c1", "anthropic")]), timer, handler) as h:
        r = await h.chat("m")
        assert r.status_code == 200, r.text
        assert r.json()["created"] == 1_234_567_890
        r = await h.client.post(
            "/v1/responses",
            json={"model": "m", "input": "hi"},
            headers={"authorization": f"Bearer {ALICE}"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["created_at"] == 1_234_567_890


def _hourly_pool(*, requests: int, tokens: int) -> dict[str, object]:
    """Pool ``p`` on connection ``c1``: hourly requests and tokens, alice and bob equal."""
    return {
        "id": "p",
        "connections": ["c1"],
        "dimensions": [
            {"unit": "requests", "window": "hourly", "limit": requests},
            {"unit": "tokens", "window": "hourly", "limit": tokens},
        ],
        "allocations": [{"key": "alice", "weight": 50}, {"key": "bob", "weight": 50}],
    }


async def test_a_governed_answer_carries_each_quota_header_once(tmp_path: Path) -> None:
    """SPEC §4's ``x-ratelimit-*`` on the answer, stream or not: each once, with the key's
    standing after this request (the headers are added to the answer's raw header list)."""
    from inproc_support import openai_stream

    async def handler(req: UpstreamRequest) -> Reply:
        if req.json().get("stream"):
            return Reply(
                chunks=openai_stream("hi there"), headers={"content-type": "text/event-stream"}
            )
        return openai_chat("hello")

    cfg = base_config([conn("c1")], pools=[_hourly_pool(requests=100, tokens=10_000)])
    async with gateway(tmp_path, cfg, ManualTimer(ManualClock(1_700_002_800_000)), handler) as h:
        for stream in (False, True):
            r = await h.chat("m", max_tokens=5, stream=stream)
            assert r.status_code == 200, r.text
            names = [k for k, _ in r.headers.multi_items() if k.startswith("x-ratelimit-")]
            assert sorted(names) == sorted(set(names))  # each once
            assert set(names) == {
                "x-ratelimit-limit-requests-hourly",
                "x-ratelimit-reset-requests-hourly",
                "x-ratelimit-remaining-requests-hourly",
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-limit-tokens-hourly",
                "x-ratelimit-reset-tokens-hourly",
                "x-ratelimit-remaining-tokens-hourly",
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
            }
            assert r.headers["x-ratelimit-limit-requests"] == "50"  # alice's share
            assert r.headers["x-ratelimit-reset-requests-hourly"] == "3600s"
            # what is left of alice's own share, this request's reservation counted
            used = 1 if not stream else 2
            assert r.headers["x-ratelimit-remaining-requests"] == f"{50 - used:g}"
            assert r.headers["x-fairgate-connection"] == "c1"
            await h.settle_background()


async def test_quota_headers_show_the_keys_own_room_not_the_other_keys_use(
    tmp_path: Path,
) -> None:
    """Issue 43, N11: in a generous pool the headers showed the pool's free room, so a tenant
    read another key's use request by request (999, then 898 after the other key's 100). A
    key is told its own room: its share less its own use, whatever the others send."""

    async def handler(req: UpstreamRequest) -> Reply:
        return openai_chat("hello")

    cfg = base_config([conn("c1")], pools=[_hourly_pool(requests=1000, tokens=1_000_000)])
    async with gateway(tmp_path, cfg, ManualTimer(ManualClock(1_700_002_800_000)), handler) as h:
        first = await h.chat("m", max_tokens=5)
        assert first.status_code == 200, first.text
        assert first.headers["x-ratelimit-limit-requests"] == "500"
        assert first.headers["x-ratelimit-remaining-requests"] == "499"
        for _ in range(100):  # bob's 100 requests: the pool stays generous (101 of 1000)
            r = await h.chat("m", key=BOB, max_tokens=5)
            assert r.status_code == 200, r.text
        assert r.headers["x-ratelimit-remaining-requests"] == "400"  # bob's own room
        await h.settle_background()
        second = await h.chat("m", max_tokens=5)
        assert second.status_code == 200, second.text
        assert second.headers["x-ratelimit-limit-requests"] == "500"
        assert second.headers["x-ratelimit-remaining-requests"] == "498"  # only her own request
        await h.settle_background()


async def test_quota_header_counts_are_whole_numbers_as_providers_send_them(
    tmp_path: Path,
) -> None:
    """Clients read ``x-ratelimit-*`` with ``int()`` (OpenAI and Anthropic send digits): a
    1M-token share is ``1000000``, not ``1e+06``, and what remains of it is exact, not rounded
    to six significant digits."""

    async def handler(req: UpstreamRequest) -> Reply:
        return openai_chat("hello")

    pool = _hourly_pool(requests=10_000_000, tokens=2_000_000)
    cfg = base_config([conn("c1")], pools=[pool])
    async with gateway(tmp_path, cfg, ManualTimer(ManualClock(1_700_002_800_000)), handler) as h:
        r = await h.chat("m", max_tokens=5)
        assert r.status_code == 200, r.text
        # alice's half of the pool (her own room, issue 43 N11)
        assert r.headers["x-ratelimit-limit-tokens"] == "1000000"
        assert r.headers["x-ratelimit-limit-requests"] == "5000000"
        assert r.headers["x-ratelimit-remaining-requests"] == "4999999"
        left = r.headers["x-ratelimit-remaining-tokens"]
        assert left.isdigit(), left
        assert 999_000 < int(left) < 1_000_000  # this request's reservation taken off, exactly
        await h.settle_background()


async def test_an_upstream_error_shows_no_credential_the_gateway_sent(tmp_path: Path) -> None:
    """Issue 43, N7: an OAuth connection sends a live access token, not its stored secret, so
    masking the stored secret alone let an upstream that quotes the credential (``Invalid
    token: Bearer eyJ...``) hand it to a tenant. Every credential-looking value is masked."""
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhY2N0LTEifQ.c2lnbmF0dXJlLXBhcnQ"

    async def handler(req: UpstreamRequest) -> Reply:
        msg = f"Invalid request with token {jwt} (header: Bearer {jwt}; key sk-ant-oat01-abcdef12)"
        return Reply(status=400, body={"error": {"message": msg, "type": "invalid_request"}})

    async with gateway(tmp_path, base_config([conn("c1")]), ManualTimer(), handler) as h:
        r = await h.chat("m")
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "eyJ" not in message
        assert "abcdef12" not in message
        assert "[redacted]" in message
        assert message.startswith("Invalid request with token")


async def test_responses_refuses_cheaply_before_translating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 43, N15: a key that may not use the model, or an input over the message cap, is
    refused before the Responses input is translated (it was translated first, 0.5 s of work
    on a large input before a 403). The translation is the exchange's, per attempt, since a
    Responses request to a Responses-wire connection is not translated at all (issue 42)."""
    from fairgate.path import exchange

    translated: list[object] = []
    real = exchange.responses_to_chat_request

    def counting(body: Any, model: str) -> Any:
        translated.append(model)
        return real(body, model)

    monkeypatch.setattr(exchange, "responses_to_chat_request", counting)

    async def handler(req: UpstreamRequest) -> Reply:
        return openai_chat("ok")

    cfg = base_config([conn("c1", models=("m", "other"))])
    cfg["keys"][0]["allowed_models"] = ["m"]
    auth = {"authorization": f"Bearer {ALICE}"}
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        items = [{"role": "user", "content": "x"}] * 10_001  # FAIRGATE_MAX_MESSAGES + 1
        r = await h.client.post(
            "/v1/responses", json={"model": "other", "input": items}, headers=auth
        )
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "model_not_allowed"
        r = await h.client.post("/v1/responses", json={"model": "m", "input": items}, headers=auth)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "input"
        assert translated == []
        r = await h.client.post("/v1/responses", json={"model": "m", "input": "hi"}, headers=auth)
        assert r.status_code == 200, r.text
        assert translated == ["m"]


async def test_an_account_error_reaches_the_tenant_as_fairgates_words(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 43, N14: an upstream's text about the shared account (its organisation id, its
    limits and use) reached every tenant. A 402/429/5xx answer now reads as fairgate's words
    and the provider's error type; the text goes to the log, for the admin."""
    text = "Service unavailable for organization org-shared-123 (Limit 30000, Used 29990)"

    async def handler(req: UpstreamRequest) -> Reply:
        return Reply(status=503, body={"error": {"message": text, "type": "server_error"}})

    async with gateway(tmp_path, base_config([conn("c1")]), ManualTimer(), handler) as h:
        with caplog.at_level("INFO", logger="fairgate.proxy"):
            r = await h.chat("m")
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        assert "org-shared-123" not in r.text
        assert "29990" not in r.text
        assert message == "Upstream HTTP 503: the upstream failed or is overloaded (server_error)"
        assert any(getattr(rec, "error", None) == text for rec in caplog.records)
