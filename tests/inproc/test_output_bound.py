"""A request never settles above what admission reserved (issue 43, N2).

The reservation is ``prompt + output``; the upstream bills every choice (``n``) up to the output
bound, and with no bound it generates up to the model's own limit. Before: ``{"n": 128,
"max_tokens": 100}`` was admitted on 50 % of a 10,000-token pool and used 12,805, and a request
with no ``max_tokens`` reserved 1,024 and was billed 16,389. Now the reservation counts every
choice, and a request without a bound is sent the bound admission reserved.

The upstream here bills as OpenAI does: ``n`` × the bound (all choices run to it), or 16,000
when no bound was sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inproc_support import ADMIN_KEY, ALICE, BOB, anthropic_stream, base_config, conn, gateway

from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat
from fairgate.timers import ManualTimer

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
UNBOUNDED = 16_000  # what a model generates when nothing stops it


def _pool(limit: int) -> dict[str, Any]:
    return {
        "id": "p",
        "connections": ["c1"],
        "dimensions": [{"unit": "tokens", "window": "hourly", "limit": limit}],
        "allocations": [{"key": "alice", "weight": 50}, {"key": "bob", "weight": 50}],
    }


async def _billing(req: UpstreamRequest) -> Reply:
    body = req.json()
    bound = body.get("max_completion_tokens") or body.get("max_tokens") or UNBOUNDED
    return openai_chat("x", model=body["model"], completion_tokens=int(body.get("n", 1)) * bound)


async def _used(h: Any) -> dict[str, float]:
    usage = (await h.client.get("/api/quota/pools/p/usage", headers=ADMIN)).json()
    (dim,) = usage["dimensions"]
    return {"total": dim["total"], **{k["keyId"]: k["consumed"] for k in dim["keys"]}}


async def test_n_choices_are_reserved_and_cannot_overrun_the_pool(tmp_path: Path) -> None:
    cfg = base_config([conn("c1")], pools=[_pool(10_000)])
    async with gateway(tmp_path, cfg, ManualTimer(), _billing) as h:
        r = await h.chat("m", n=128, max_tokens=100)
        # 12,800 output tokens never fit in the pool's 10,000: too large, not "retry later"
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == "request_too_large"
        assert h.upstream.requests == []  # refused before anything was billed
        r = await h.chat("m", n=4, max_tokens=100)
        assert r.status_code == 200, r.text
        await h.settle_background()
        used = await _used(h)
        assert used["total"] == 410  # 10 prompt + 4 x 100, as reserved
        assert used["total"] <= 10_000
        # the other key was not crowded out
        r = await h.chat("m", key=BOB, max_tokens=100)
        assert r.status_code == 200, r.text


async def test_no_output_bound_sends_the_reserved_one(tmp_path: Path) -> None:
    cfg = base_config([conn("c1", models=("m", "o3-mini"))], pools=[_pool(20_000)])
    cfg["server"] = {"default_max_tokens": 1_000}
    async with gateway(tmp_path, cfg, ManualTimer(), _billing) as h:
        r = await h.chat("m")
        assert r.status_code == 200, r.text
        sent = h.upstream.requests[-1].json()
        assert sent["max_tokens"] == 1_000
        assert "max_completion_tokens" not in sent
        # a reasoning model takes max_completion_tokens only
        r = await h.chat("o3-mini", key=ALICE)
        assert r.status_code == 200, r.text
        sent = h.upstream.requests[-1].json()
        assert sent["max_completion_tokens"] == 1_000
        assert "max_tokens" not in sent
        # a client's own bound goes as it was given
        r = await h.chat("m", max_completion_tokens=7)
        assert r.status_code == 200, r.text
        sent = h.upstream.requests[-1].json()
        assert sent["max_completion_tokens"] == 7
        assert "max_tokens" not in sent
        await h.settle_background()
        used = await _used(h)
        assert used["total"] == 10 + 1_000 + 10 + 1_000 + 10 + 7  # never the model's 16,000


async def test_traffic_no_pool_meters_by_tokens_keeps_the_upstreams_default(
    tmp_path: Path,
) -> None:
    """Only a reservation an answer could overrun needs the bound: a pool of requests, or no
    pool, leaves the request as the client sent it (the model's own limit applies)."""
    requests_only = {
        "id": "p",
        "connections": ["c1"],
        "dimensions": [{"unit": "requests", "window": "hourly", "limit": 100}],
        "allocations": [{"key": "alice", "weight": 50}, {"key": "bob", "weight": 50}],
    }
    cfg = base_config([conn("c1"), conn("c2", models=("free",))], pools=[requests_only])
    async with gateway(tmp_path, cfg, ManualTimer(), _billing) as h:
        for model in ("m", "free"):
            r = await h.chat(model)
            assert r.status_code == 200, r.text
            sent = h.upstream.requests[-1].json()
            assert "max_tokens" not in sent
            assert "max_completion_tokens" not in sent


async def test_anthropic_stream_usage_counts_in_message_delta_are_charged(tmp_path: Path) -> None:
    """Issue 42: an Anthropic-compatible upstream whose ``message_start`` says ``input_tokens:
    0`` and whose ``message_delta`` carries the real counts was charged 57 tokens instead of
    207 on the passthrough: the start's zero won. Each field's latest value wins."""

    async def handler(req: UpstreamRequest) -> Reply:
        return anthropic_stream(
            "hi",
            start_usage={"input_tokens": 0, "output_tokens": 0},
            delta_usage={"input_tokens": 150, "output_tokens": 57},
        )

    pool = {**_pool(100_000), "connections": ["a1"]}
    cfg = base_config([conn("a1", "anthropic")], pools=[pool])
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await h.messages("m", 64, stream=True)
        assert r.status_code == 200, r.text
        await h.settle_background()
        assert (await _used(h))["total"] == 207
