"""``POST /v1/messages/count_tokens`` counts without spending quota (issue 42, item 5).

Claude Code's ``/context`` asks it; fairgate answered 404, so Claude Code fell back to 18
``max_tokens: 1`` calls to ``/v1/messages``, all charged to the pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inproc_support import ALICE, base_config, conn, gateway

from fairgate.providers.inprocess import Reply, UpstreamRequest, anthropic_message
from fairgate.timers import ManualTimer

BODY = {
    "model": "claude-x",
    "system": "You are terse.",
    "messages": [{"role": "user", "content": "How many tokens is this?"}],
}


def _pool(limit: int) -> dict[str, Any]:
    return {
        "id": "p",
        "connections": ["a1"],
        "dimensions": [{"unit": "requests", "window": "hourly", "limit": limit}],
        "allocations": [{"key": "alice", "weight": 100}],
    }


async def _count(h: Any, body: dict[str, Any]) -> Any:
    return await h.client.post(
        "/v1/messages/count_tokens",
        json=body,
        headers={"x-api-key": ALICE, "anthropic-version": "2023-06-01"},
    )


async def test_an_anthropic_connection_counts_and_nothing_is_charged(tmp_path: Path) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        if req.path == "/messages/count_tokens":
            assert "max_tokens" not in req.json()
            return Reply(body={"input_tokens": 42})
        return anthropic_message("hi")

    cfg = base_config([conn("a1", "anthropic", models=("claude-x",))], pools=[_pool(1)])
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        for _ in range(18):  # what Claude Code's /context sends
            r = await _count(h, BODY)
            assert r.status_code == 200, r.text
            assert r.json() == {"input_tokens": 42}
            assert r.headers["x-fairgate-token-count"] == "upstream"
        # the pool's one request an hour is still there
        r = await h.client.post(
            "/v1/messages",
            json={**BODY, "max_tokens": 5},
            headers={"x-api-key": ALICE, "anthropic-version": "2023-06-01"},
        )
        assert r.status_code == 200, r.text


async def test_other_upstreams_get_the_gateways_estimate(tmp_path: Path) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        raise AssertionError("an OpenAI connection has no token count to ask")

    cfg = base_config([conn("c1", models=("claude-x",))])
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await _count(h, BODY)
        assert r.status_code == 200, r.text
        assert r.headers["x-fairgate-token-count"] == "estimate"
        assert r.json()["input_tokens"] > 0


async def test_a_failing_count_falls_back_and_bad_input_is_named(tmp_path: Path) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        return Reply(status=500, body={"type": "error", "error": {"type": "api_error"}})

    cfg = base_config([conn("a1", "anthropic", models=("claude-x",))])
    cfg["keys"][0]["allowed_models"] = ["claude-x"]
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await _count(h, BODY)
        assert r.status_code == 200, r.text
        assert r.headers["x-fairgate-token-count"] == "estimate"
        r = await _count(h, {**BODY, "model": "other"})
        assert r.status_code == 403, r.text
        assert r.json()["type"] == "error"  # Anthropic's error shape
        r = await _count(h, {"model": "claude-x"})
        assert r.status_code == 400, r.text
        assert "messages" in r.text
        r = await h.client.post("/v1/messages/count_tokens", json=BODY)
        assert r.status_code == 401
