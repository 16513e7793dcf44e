"""Combos through the whole request path with an upstream that answers like the mock provider:
fallback on 429, fusion with a judge, a pipeline chaining outputs, the all-failed diagnostics,
every public strategy in one matrix, quota-share routing over a pool's members with in-flight
counts back at zero, pins, fan-out, concurrency caps and the routing-defaults cascade.

Moved from ``tests/e2e/test_combos.py`` (a gateway process per test): the same behaviour, in
milliseconds; the official SDKs over real HTTP stay in ``tests/e2e/test_sdk_clients.py``."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from inproc_support import (
    ADMIN,
    ALICE,
    UPSTREAM_SECRET,
    Harness,
    MockUpstream,
    base_config,
    conn,
    failed_diagnostics,
    gateway,
)

from fairgate.providers.inprocess import Reply, UpstreamRequest
from fairgate.routing import PUBLIC_STRATEGIES
from fairgate.timers import ManualTimer

GPT = "gpt-4o-mini"


def config(
    combos: list[dict[str, Any]],
    pools: list[dict[str, Any]] | None = None,
    **oa1: Any,
) -> dict[str, Any]:
    """The e2e file's four connections: two OpenAI-style accounts, a judge, a Claude account."""
    return base_config(
        [
            conn("oa-1", models=(GPT,), **oa1),
            conn("oa-2", models=(GPT,)),
            conn("judge-1", "judge", models=("judge-model",)),
            conn("claude-1", "anthropic", models=("claude-sonnet-4",)),
        ],
        combos=combos,
        pools=pools,
    )


def target(connection: str, **kw: Any) -> dict[str, Any]:
    return {"provider": "mock", "model": GPT, "connection": connection, **kw}


def combo(name: str, targets: list[dict[str, Any]], strategy: str = "priority", **cfg: Any) -> Any:
    return {"name": name, "strategy": strategy, "targets": targets, "config": cfg}


def content(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def stream_text(r: httpx.Response) -> str:
    """The text of a Chat Completions stream (its ``data:`` events)."""
    assert r.status_code == 200, r.text
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            event = orjson.loads(line[6:])
            out += [c["delta"].get("content") or "" for c in event.get("choices", [])]
    return "".join(out)


async def answered_by_oa2(h: Harness, mock: MockUpstream, model: str, first: str) -> httpx.Response:
    """Ask ``model`` (a combo of oa-1 then oa-2) once while oa-1's next answer is ``first`` (a
    mock schedule): the combo falls through and the answer, with content, is oa-2's."""
    mock.schedule(first)
    r = await h.chat(model, max_tokens=3)
    assert content(r)
    assert r.headers["x-fairgate-connection"] == "oa-2"
    return r


async def test_combo_falls_through_on_429_and_is_listed(tmp_path: Path) -> None:
    mock = MockUpstream()
    cfg = config([combo("fast", [target("oa-1"), target("oa-2")])])
    async with gateway(tmp_path, cfg, ManualTimer(), mock) as h:
        r = await answered_by_oa2(h, mock, "fast", "429:1")
        assert r.headers["x-fairgate-combo"] == "fast"
        assert h.sent_to == ["oa-1", "oa-2"]
        models = await h.client.get("/v1/models", headers={"authorization": f"Bearer {ALICE}"})
        ids = {m["id"] for m in models.json()["data"]}
    assert "fast" in ids
    assert not any(i.startswith("qtSd/") for i in ids)


async def test_fusion_returns_the_judges_merged_answer(tmp_path: Path) -> None:
    mock = MockUpstream()
    panel = combo(
        "panel",
        [target("oa-1"), {"provider": "anthropic", "model": "claude-sonnet-4"}],
        "fusion",
        judge={"provider": "judge", "model": "judge-model"},
    )
    async with gateway(tmp_path, config([panel]), ManualTimer(), mock) as h:
        r = await h.chat(
            "panel", messages=[{"role": "user", "content": "what is two plus two"}], max_tokens=40
        )
        answer = content(r)
        assert r.headers["x-fairgate-connection"] == "judge-1"  # the judge produced the answer
        # the mock echoes its last user message: the judge saw both panel answers in its prompt
        assert "mock" in answer
        assert sorted(h.sent_to) == ["claude-1", "judge-1", "oa-1"]  # two members + one judge
        assert h.sent_to[-1] == "judge-1"
        judge_prompt = h.upstream.requests[-1].body.decode()
        assert judge_prompt.count("mock reply: what is two plus two") == 2


async def test_fusion_with_one_survivor_answers_with_it_in_the_clients_shape(
    tmp_path: Path,
) -> None:
    """A fusion panel where one member fails: the survivor's answer is the combo's answer, no
    judge asked, as a chat completion (or one chunk and ``[DONE]`` when the client streams)."""
    mock = MockUpstream()
    panel = combo(
        "panel",
        [target("oa-1"), target("oa-2")],
        "fusion",
        judge={"provider": "judge", "model": "judge-model"},
        maxRetries=0,
    )
    async with gateway(tmp_path, config([panel]), ManualTimer(), mock) as h:
        mock.schedule("500")
        r = await h.chat("panel", messages=[{"role": "user", "content": "one survives"}])
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["id"] == "chatcmpl-fusion"
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"] == "mock reply: one survives"
        assert body["choices"][0]["finish_reason"] == "stop"
        assert "judge-1" not in h.sent_to
        mock.schedule("500")
        r = await h.chat("panel", messages=[{"role": "user", "content": "streamed"}], stream=True)
        assert r.status_code == 200, r.text
        events = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunk = orjson.loads(events[0])
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["choices"][0]["delta"]["content"] == "mock reply: streamed"
        assert "judge-1" not in h.sent_to


async def test_pipeline_chains_outputs(tmp_path: Path) -> None:
    mock = MockUpstream()
    chain = combo(
        "chain",
        [{"provider": "anthropic", "model": "claude-sonnet-4"}, target("oa-2")],
        "pipeline",
        options={"stepPrompts": [None, "polish this draft"]},
    )
    async with gateway(tmp_path, config([chain]), ManualTimer(), mock) as h:
        r = await h.chat(
            "chain", messages=[{"role": "user", "content": "draft a haiku"}], max_tokens=60
        )
        assert r.headers["x-fairgate-connection"] == "oa-2"  # the last step answered
        # step 2 answered the step prompt ...
        assert "polish" in content(r)
        # ... over a conversation that carried step 1's whole output
        assert h.sent_to == ["claude-1", "oa-2"]
        step2 = h.upstream.requests[1].json()["messages"]
        assert any(m.get("content") == "mock reply: draft a haiku" for m in step2), step2
        assert r.json()["usage"]["prompt_tokens"] > 4  # more than "draft a haiku" alone


async def test_all_targets_failing_returns_diagnostics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mock = MockUpstream()
    doomed = combo("doomed", [target("oa-1"), target("oa-2")], maxRetries=1, maxWaitMs=0)
    async with gateway(tmp_path, config([doomed]), ManualTimer(), mock) as h:
        mock.schedule("500", "500", "503", "503")
        with caplog.at_level(logging.INFO):
            r = await h.chat("doomed", messages=[{"role": "user", "content": "x"}])
    assert r.status_code in (502, 503)
    body = r.json()
    assert body["error"]["message"]
    diag = body["diagnostics"]
    assert diag["combo"] == "doomed"
    assert diag["terminalReason"] == "upstream_failed"
    # each target retried once on a transient 5xx before falling through; the client sees no
    # connection id, the admin's log line has them
    assert diag["attemptOrder"] == [f"mock/{GPT}"] * 4
    assert "oa-1" not in r.text
    full = failed_diagnostics(caplog.records)[-1]
    assert full["attemptOrder"] == [f"mock/{GPT}@oa-1"] * 2 + [f"mock/{GPT}@oa-2"] * 2
    assert diag["recoveryHint"]["action"]
    assert r.headers["x-fairgate-combo-terminal"] == "upstream_failed"
    assert UPSTREAM_SECRET not in r.text
    assert "Traceback" not in r.text


async def test_empty_200_is_a_failure_that_falls_through(tmp_path: Path) -> None:
    mock = MockUpstream()
    cfg = config([combo("q", [target("oa-1"), target("oa-2")])])
    async with gateway(tmp_path, cfg, ManualTimer(), mock) as h:
        await answered_by_oa2(h, mock, "q", "empty")
        # streams are validated on their first content chunk, then passed through live
        mock.schedule("error-200")
        r = await h.chat("q", stream=True)
        assert stream_text(r)
        assert r.headers["x-fairgate-connection"] == "oa-2"
        assert h.sent_to == ["oa-1", "oa-2", "oa-1", "oa-2"]


@pytest.mark.parametrize("strategy", list(PUBLIC_STRATEGIES))
async def test_every_public_strategy_answers_through_the_pipeline(
    tmp_path: Path, strategy: str
) -> None:
    targets = [
        target("oa-1", priceIn=1, priceOut=2),
        {"provider": "anthropic", "model": "claude-sonnet-4", "priceIn": 3, "priceOut": 15},
        target("oa-2", priceIn=0.5),
    ]
    async with gateway(
        tmp_path, config([combo("m", targets, strategy)]), ManualTimer(), MockUpstream()
    ) as h:
        for _ in range(2):
            assert content(await h.chat("m", messages=[{"role": "user", "content": "hi"}]))
        metrics = (await h.client.get("/metrics")).text
    assert 'model="m"' in metrics  # the combo's requests were recorded


async def _health(h: Harness) -> dict[str, Any]:
    r = await h.client.get("/health")
    return dict(r.json())


async def test_quota_share_spreads_over_pool_members_and_inflight_returns_to_zero(
    tmp_path: Path,
) -> None:
    mock = MockUpstream()
    pool = {
        "id": "qp",
        "name": "QP",
        "connections": ["oa-1", "oa-2"],
        "dimensions": [{"unit": "requests", "window": "hourly", "limit": 1000}],
        "allocations": [{"key": "alice", "weight": 100}],
    }
    async with gateway(tmp_path, config([], [pool]), ManualTimer(), mock) as h:
        used: dict[str, int] = {}
        for i in range(12):
            r = await h.chat(GPT, max_tokens=2, stream=bool(i % 2))
            assert stream_text(r) if i % 2 else content(r), r.text
            used[r.headers["x-fairgate-connection"]] = (
                used.get(r.headers["x-fairgate-connection"], 0) + 1
            )
        assert used == {"oa-1": 6, "oa-2": 6}  # equal weights: DRR alternates
        assert r.headers.get("x-fairgate-combo") == f"qtSd/qp/{GPT}"
        # a failing stream too
        mock.schedule("reset-mid-stream:2")
        broken = await h.chat(GPT, stream=True)
        assert "[DONE]" not in broken.text
        await h.settle_background()
        health = await _health(h)
        assert (health["inflightLeases"], health["inflight"]) == (0, 0)
        r = await h.chat(f"qtSd/qp/{GPT}")
        assert r.status_code == 400  # internal, not user-selectable
        combos = (await h.client.get("/api/combos?internal=true", headers=ADMIN)).json()
        assert any(c["name"] == f"qtSd/qp/{GPT}" for c in combos)


TWO = [
    combo("two", [target("oa-1"), target("oa-2")], options={"fanOut": 2}),
    combo("strict", [target("oa-1"), target("oa-2")], maxWaitMs=0, options={"strictPin": True}),
]


async def test_pinned_target_and_fan_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    mock = MockUpstream()
    async with gateway(tmp_path, config(TWO), ManualTimer(), mock) as h:
        # fan-out: both race; the held one loses and the answer comes from the other one
        mock.schedule("latency:800")
        r = await h.chat("two", max_tokens=2)
        assert r.status_code == 200, r.text
        assert r.headers["x-fairgate-fan-out"] == "2"
        assert not mock.release.is_set()  # answered while the first branch was still held
        assert mock.requests == 2
        assert r.headers["x-fairgate-connection"] == h.sent_to[1]
        # a pinned target goes first
        pin = {"x-fairgate-pin": f"mock/{GPT}@oa-2"}
        r = await h.chat("strict", max_tokens=2, headers=pin)
        assert (r.status_code, r.headers["x-fairgate-connection"]) == (200, "oa-2")
        # strict pin: the pinned target failing is the answer, nothing else is tried
        mock.schedule("500", "500")
        with caplog.at_level(logging.INFO):
            r = await h.chat("strict", max_tokens=2, headers=pin)
        assert r.status_code >= 500
        assert len(r.json()["diagnostics"]["attempted"]) == 2  # one target, retried once
        attempted = failed_diagnostics(caplog.records)[-1]["attempted"]
        assert {a["target"] for a in attempted} == {f"mock/{GPT}@oa-2"}
        r = await h.chat("strict", max_tokens=2, headers={"x-fairgate-pin": "nope/x"})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "x-fairgate-pin")


async def test_concurrency_cap_defers_a_busy_connection_without_dropping_it(
    tmp_path: Path,
) -> None:
    mock = MockUpstream()
    cfg = config([combo("capped", [target("oa-1"), target("oa-2")])], max_concurrent=1)
    async with gateway(tmp_path, cfg, ManualTimer(), mock) as h:
        mock.schedule("latency:800")
        slow = asyncio.create_task(h.chat("capped", max_tokens=2))
        await mock.holding.wait()  # oa-1 now holds its one slot
        r = await h.chat("capped", max_tokens=2)
        assert (r.status_code, r.headers["x-fairgate-connection"]) == (200, "oa-2")
        mock.release.set()
        assert (await slow).headers["x-fairgate-connection"] == "oa-1"
        r = await h.chat("capped", max_tokens=2)
        assert r.headers["x-fairgate-connection"] == "oa-1"  # free again: back to first choice


async def test_routing_defaults_cascade_under_combo_config(tmp_path: Path) -> None:
    mock = MockUpstream()
    async with gateway(tmp_path, config([combo("c", [target("oa-1")])]), ManualTimer(), mock) as h:
        bad = await h.client.put(
            "/api/routing/defaults", headers=ADMIN, json={"global": {"maxRetries": -3}}
        )
        assert bad.status_code == 422
        assert bad.json()["error"]["fields"][0]["field"] == "global"
        ok = await h.client.put(
            "/api/routing/defaults",
            headers=ADMIN,
            json={
                "global": {"maxRetries": 0, "maxWaitMs": 0},
                "providers": {"mock": {"maxRetries": 2}},
            },
        )
        assert ok.status_code == 200
        mock.schedule("500", "500", "500")
        r = await h.chat("c")
        # the provider layer (2 retries) beats the global layer (0): three attempts in all
        assert len(r.json()["diagnostics"]["attempted"]) == 3
        assert h.sent_to == ["oa-1"] * 3


async def test_embeddings_skip_combo_targets_whose_wire_has_no_embeddings(tmp_path: Path) -> None:
    # issue 47: the combo's first target is an Anthropic account, which has no embeddings
    # endpoint; the attempt looked up a missing exchange and answered 500 (KeyError)
    paths: list[str] = []

    async def upstream(req: UpstreamRequest) -> Reply:
        paths.append(req.path)
        assert req.path.endswith("/embeddings")
        vector = {"object": "embedding", "index": 0, "embedding": [0.25, -0.5]}
        usage = {"prompt_tokens": 2, "total_tokens": 2}
        return Reply(200, {"object": "list", "data": [vector], "model": GPT, "usage": usage})

    claude = {"provider": "anthropic", "model": "claude-sonnet-4", "connection": "claude-1"}
    cfg = config([combo("mixed", [claude, target("oa-1")]), combo("claude-only", [claude])])
    async with gateway(tmp_path, cfg, ManualTimer(), upstream) as h:
        auth = {"authorization": f"Bearer {ALICE}"}
        r = await h.client.post(
            "/v1/embeddings", json={"model": "mixed", "input": "hi"}, headers=auth
        )
        assert r.status_code == 200, r.text
        assert r.json()["data"][0]["embedding"] == [0.25, -0.5]
        assert r.headers["x-fairgate-connection"] == "oa-1"
        assert h.sent_to == ["oa-1"]  # the Anthropic target was never attempted
        r = await h.client.post(
            "/v1/embeddings", json={"model": "claude-only", "input": "hi"}, headers=auth
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "model"
        assert "/v1/embeddings" in r.json()["error"]["message"]
        assert paths == ["/embeddings"]
