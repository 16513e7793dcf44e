"""The combo pipeline's target-loop checks of issue 46 through the whole request path: hedged
first tokens, reasoning held back, a context that fits the fallback, answers validated, and
auto's reset-window, success-rate and breaker factors in the diagnostics.

The upstream is an in-process handler per connection; time is a :class:`ManualTimer` the test
moves, so a hedge starts when the test says the first token is late, never by sleeping."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from inproc_support import ALICE, Harness, base_config, conn, failed_diagnostics, gateway

from fairgate.config import ConfigError
from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat
from fairgate.timers import ManualTimer

GPT = "gpt-4o-mini"


def config(combos: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return base_config(
        [conn("oa-1", models=(GPT,), **extra), conn("oa-2", models=(GPT,))], combos=combos
    )


def target(connection: str, **kw: Any) -> dict[str, Any]:
    return {"provider": "mock", "model": GPT, "connection": connection, **kw}


def combo(name: str, cfg: dict[str, Any], strategy: str = "priority") -> dict[str, Any]:
    return {
        "name": name,
        "strategy": strategy,
        "targets": [target("oa-1"), target("oa-2")],
        "config": cfg,
    }


def answers(by_conn: dict[str, str]) -> Any:
    async def handler(req: UpstreamRequest) -> Reply:
        return openai_chat(by_conn[req.conn.id])

    return handler


def content(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


# -- 5. answers validated ------------------------------------------------------------------


PERSON = {
    "type": "json_schema",
    "json_schema": {
        "name": "person",
        "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
    },
}


async def test_a_disallowed_pattern_fails_over_to_the_next_target(tmp_path: Path) -> None:
    cfg = config([combo("v", {"responseValidation": {"disallowedPatterns": ["(?i)as an ai"]}})])
    handler = answers({"oa-1": "As an AI I cannot", "oa-2": "Paris"})
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await h.chat("v")
        assert content(r) == "Paris"
        assert h.sent_to == ["oa-1", "oa-2"]


async def test_without_validation_the_same_answer_is_served(tmp_path: Path) -> None:
    cfg = config([combo("v", {})])
    handler = answers({"oa-1": "As an AI I cannot", "oa-2": "Paris"})
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        assert content(await h.chat("v")) == "As an AI I cannot"
        assert h.sent_to == ["oa-1"]


async def test_a_schema_violation_fails_over(tmp_path: Path) -> None:
    cfg = config([combo("v", {"responseValidation": {"jsonSchema": True}})])
    handler = answers({"oa-1": '{"nom": "x"}', "oa-2": '{"name": "x"}'})
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await h.chat("v", response_format=PERSON)
        assert content(r) == '{"name": "x"}'
        assert h.sent_to == ["oa-1", "oa-2"]
        # a request that asked for no schema is not checked against one
        r = await h.chat("v")
        assert content(r) == '{"nom": "x"}'


async def test_every_answer_invalid_names_the_check_and_releases_the_pin(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checks = {"responseValidation": {"jsonSchema": True}, "maxRetries": 0}
    cfg = config([combo("v", checks, "cache-optimized")])
    good = {"oa-1": '{"name": "x"}', "oa-2": '{"name": "y"}'}
    state: dict[str, str] = dict(good)

    async def handler(req: UpstreamRequest) -> Reply:
        return openai_chat(state[req.conn.id])

    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        assert content(await h.chat("v", response_format=PERSON)) == '{"name": "x"}'
        pinned = h.svc.strategy_state.session_target("v", "alice")
        assert pinned == f"mock/{GPT}@oa-1"
        state.update({"oa-1": "not json", "oa-2": '{"name": 3}'})
        with caplog.at_level(logging.INFO):
            r = await h.chat("v", response_format=PERSON)
        assert r.status_code == 502
        body = r.json()
        assert "response validation" in body["diagnostics"]["recoveryHint"]["action"]
        assert "schema violated at name" in body["error"]["message"]
        full = failed_diagnostics(caplog.records)[-1]
        assert [a["outcome"] for a in full["attempted"]] == ["validation", "validation"]
        # the session is no longer pinned to the target whose answer failed the check
        assert h.svc.strategy_state.session_target("v", "alice") is None


async def test_a_bad_pattern_is_refused_when_configured(tmp_path: Path) -> None:
    cfg = config([combo("v", {"responseValidation": {"disallowedPatterns": ["("]}})])
    with pytest.raises(ConfigError, match=r"responseValidation\.disallowedPatterns"):
        async with gateway(tmp_path, cfg, ManualTimer(), answers({})):
            pass


# -- 6. auto's reset-window affinity, success rate and breaker health -------------------------


def pool(pid: str, connection: str, window: str) -> dict[str, Any]:
    return {
        "id": pid,
        "name": pid,
        "connections": [connection],
        "dimensions": [{"unit": "requests", "window": window, "limit": 1000}],
        "allocations": [{"key": "alice", "weight": 100}],
    }


def auto_config() -> dict[str, Any]:
    auto = {
        "name": "a",
        "strategy": "auto",
        "targets": [target("oa-1"), target("oa-2")],
        "config": {"options": {"exploration": 0}, "maxRetries": 0, "maxWaitMs": 0},
    }
    cfg = config([auto])
    cfg["pools"] = [pool("daily", "oa-1", "daily"), pool("hourly", "oa-2", "hourly")]
    return cfg


async def test_auto_prefers_the_account_whose_window_resets_sooner(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    status = {"oa-1": 200, "oa-2": 200}

    async def handler(req: UpstreamRequest) -> Reply:
        if status[req.conn.id] != 200:
            return Reply(500, {"error": {"message": "boom", "type": "server_error"}})
        return openai_chat("ok")

    async with gateway(tmp_path, auto_config(), ManualTimer(), handler) as h:
        r = await h.chat("a")
        assert content(r) == "ok"
        # both have room; everything else is equal: the hourly window resets first
        assert h.sent_to == ["oa-2"]
        status.update({"oa-1": 500, "oa-2": 500})
        with caplog.at_level(logging.INFO):
            r = await h.chat("a")
        assert r.status_code >= 500
    full = failed_diagnostics(caplog.records)[-1]
    assert set(full["weights"]) >= {"reset_affinity", "health", "stability"}
    assert abs(sum(full["weights"].values()) - 1) < 1e-3
    by = {c["target"]: c for c in full["candidates"]}
    one, two = by[f"mock/{GPT}@oa-1"], by[f"mock/{GPT}@oa-2"]
    assert two["factors"]["reset_affinity"] == 1.0
    assert one["factors"]["reset_affinity"] < 1.0  # the daily window resets later
    # oa-2 answered the first request: its success rate is known, oa-1's is not (0.5)
    assert two["factors"]["stability"] == 1.0
    assert one["factors"]["stability"] == 0.5
    assert two["factors"]["health"] == 1.0
    assert two["score"] > one["score"]


# -- 2. reasoning held back ------------------------------------------------------------------


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    event = {
        "id": "chatcmpl-r",
        "object": "chat.completion.chunk",
        "model": GPT,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(event) + b"\n\n"


def reasoning_stream(thoughts: list[str], answer: str | None, finish: str) -> Reply:
    """A chat stream that reasons (``reasoning_content``), then answers ``answer`` (None: not
    at all) and finishes with ``finish``."""
    chunks: list[bytes | BaseException] = [_chunk({"role": "assistant", "content": ""})]
    chunks += [_chunk({"reasoning_content": t}) for t in thoughts]
    if answer is not None:
        chunks.append(_chunk({"content": answer}))
    chunks.append(_chunk({}, finish))
    usage = {"prompt_tokens": 5, "completion_tokens": 64, "total_tokens": 69}
    chunks.append(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
    chunks.append(b"data: [DONE]\n\n")
    return Reply(headers={"content-type": "text/event-stream"}, chunks=chunks)


def deltas(r: httpx.Response, field: str) -> list[str]:
    assert r.status_code == 200, r.text
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            for c in orjson.loads(line[6:]).get("choices", []):
                if c["delta"].get(field):
                    out.append(c["delta"][field])
    return out


def thinking_upstream() -> Any:
    """oa-1 spends its whole budget reasoning; oa-2 reasons a little, then answers."""

    async def handler(req: UpstreamRequest) -> Reply:
        if req.conn.id == "oa-1":
            return reasoning_stream(["hmm ", "still thinking"], None, "length")
        return reasoning_stream(["short ", "thought"], "42", "stop")

    return handler


async def test_a_reasoning_only_stream_fails_over_before_the_client_sees_it(
    tmp_path: Path,
) -> None:
    cfg = config([combo("r", {"reasoningBuffer": {"enabled": True}})])
    async with gateway(tmp_path, cfg, ManualTimer(), thinking_upstream()) as h:
        r = await h.chat("r", stream=True)
        assert h.sent_to == ["oa-1", "oa-2"]
        assert r.headers["x-fairgate-connection"] == "oa-2"
        # nothing of oa-1's reasoning reached the client; oa-2's held reasoning, then content,
        # in order
        assert deltas(r, "reasoning_content") == ["short ", "thought"]
        assert deltas(r, "content") == ["42"]
        assert r.text.index("thought") < r.text.index('"42"')
        # the failed attempt was charged (the upstream billed the reasoning)
        await h.settle_background()
        assert await h.open_reservations() == 0


async def test_without_the_buffer_the_reasoning_streams_live(tmp_path: Path) -> None:
    cfg = config([combo("r", {})])
    async with gateway(tmp_path, cfg, ManualTimer(), thinking_upstream()) as h:
        r = await h.chat("r", stream=True)
        assert h.sent_to == ["oa-1"]
        assert deltas(r, "reasoning_content") == ["hmm ", "still thinking"]


async def test_a_client_that_asks_for_live_reasoning_is_never_held(tmp_path: Path) -> None:
    cfg = config([combo("r", {"reasoningBuffer": {"enabled": True}})])
    async with gateway(tmp_path, cfg, ManualTimer(), thinking_upstream()) as h:
        r = await h.chat("r", stream=True, headers={"x-fairgate-reasoning": "live"})
        assert h.sent_to == ["oa-1"]
        assert deltas(r, "reasoning_content") == ["hmm ", "still thinking"]


async def test_the_buffer_is_bounded_in_bytes(tmp_path: Path) -> None:
    cfg = config([combo("r", {"reasoningBuffer": {"enabled": True, "maxBytes": 100}})])
    async with gateway(tmp_path, cfg, ManualTimer(), thinking_upstream()) as h:
        r = await h.chat("r", stream=True)
        # past 100 bytes held the stream is passed through: the client got oa-1's reasoning
        assert h.sent_to == ["oa-1"]
        assert deltas(r, "reasoning_content") == ["hmm ", "still thinking"]


# -- 3. a context that fits the fallback -----------------------------------------------------


def long_conversation() -> list[dict[str, Any]]:
    """A system prompt, then 10 exchanges of about 400 tokens each, a tool call and its result
    in the middle of the last ones, then the question."""
    filler = "lorem ipsum dolor sit amet " * 60  # ~1,600 characters, ~400 tokens
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(10):
        msgs.append({"role": "user", "content": f"turn {i} {filler}"})
        msgs.append({"role": "assistant", "content": f"answer {i}"})
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs.append({"role": "user", "content": "use the tool"})
    msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
    msgs.append({"role": "tool", "tool_call_id": "call_1", "content": "42"})
    msgs.append({"role": "user", "content": "and now"})
    return msgs


def small_window_combo(cfg: dict[str, Any]) -> dict[str, Any]:
    """oa-1 fails with a 500; oa-2, the fallback, has a 1,000-token window."""
    return {
        "name": "c",
        "strategy": "priority",
        "targets": [target("oa-1"), target("oa-2", contextWindow=1000)],
        "config": {"maxRetries": 0, "maxWaitMs": 0, **cfg},
    }


def first_fails() -> Any:
    async def handler(req: UpstreamRequest) -> Reply:
        if req.conn.id == "oa-1":
            return Reply(500, {"error": {"message": "boom", "type": "server_error"}})
        return openai_chat("fitted")

    return handler


async def test_a_small_window_fallback_gets_a_compressed_conversation(tmp_path: Path) -> None:
    cfg = config([small_window_combo({"contextCompression": {"keepLastTurns": 3}})])
    async with gateway(tmp_path, cfg, ManualTimer(), first_fails()) as h:
        r = await h.chat("c", messages=long_conversation(), max_tokens=100)
        assert content(r) == "fitted"
        assert h.sent_to == ["oa-1", "oa-2"]
        sent = h.upstream.requests[-1].json()["messages"]
        # the system prompt, then the tool call with its result and the question: the last
        # three messages would have begun at the tool result, so the cut moved back to the
        # user turn that asked for the tool
        assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "user"]
        assert sent[1]["content"] == "use the tool"
        assert h.upstream.requests[0].json()["messages"] == long_conversation()
        assert r.headers["x-fairgate-context-compressed"] == "dropped=20"


async def test_without_a_rule_the_small_window_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config([small_window_combo({})])
    async with gateway(tmp_path, cfg, ManualTimer(), first_fails()) as h:
        with caplog.at_level(logging.INFO):
            r = await h.chat("c", messages=long_conversation(), max_tokens=100)
        assert h.sent_to == ["oa-1"]  # no attempt spent on a certain 400
        assert r.status_code == 500
        excluded = r.json()["diagnostics"]["excluded"]
        assert excluded == [{"target": f"mock/{GPT}", "reason": "context_window"}]
        full = failed_diagnostics(caplog.records)[-1]
        assert full["excluded"] == [{"target": f"mock/{GPT}@oa-2", "reason": "context-window"}]
        # a short conversation still goes there
        r = await h.chat("c", max_tokens=100)
        assert content(r) == "fitted"


async def test_every_window_too_small_is_the_requests_400(tmp_path: Path) -> None:
    small = {
        "name": "s",
        "targets": [target("oa-1", contextWindow=500), target("oa-2", contextWindow=800)],
        "config": {"maxWaitMs": 0},
    }
    async with gateway(tmp_path, config([small]), ManualTimer(), first_fails()) as h:
        r = await h.chat("s", messages=long_conversation())
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert h.sent_to == []


# -- 1. hedged first token -------------------------------------------------------------------


def hedge_config(**cfg: Any) -> dict[str, Any]:
    hedged = {
        "name": "h",
        "targets": [target("oa-1"), target("oa-2")],
        "config": {"predictiveTtftMs": 500, "maxRetries": 0, **cfg},
    }
    out = config([hedged])
    out["pools"] = [pool("p1", "oa-1", "daily"), pool("p2", "oa-2", "daily")]
    return out


class Slow:
    """A handler whose connections answer when the test releases them (a slow first token),
    or at once when they are not held."""

    def __init__(self, *held: str) -> None:
        self.gates = {c: asyncio.Event() for c in held}
        self.cancelled: list[str] = []

    async def __call__(self, req: UpstreamRequest) -> Reply:
        gate = self.gates.get(req.conn.id)
        if gate is not None:
            try:
                await gate.wait()
            except asyncio.CancelledError:
                self.cancelled.append(req.conn.id)
                raise
        text = f"from {req.conn.id}"
        if req.json().get("stream"):
            return reasoning_stream([], text, "stop")
        return openai_chat(text)


async def requests_total(h: Harness, pool_id: str) -> float:
    usage = await h.gw.engine.usage(h.gw.registry.pools[pool_id])
    return float(usage.dimensions[0].total)


def hedges(metrics: str) -> dict[str, float]:
    out = {}
    for line in metrics.splitlines():
        if line.startswith('fairgate_combo_hedges_total{combo="h"'):
            outcome = line.split('outcome="')[1].split('"')[0]
            out[outcome] = float(line.rsplit(" ", 1)[1])
    return out


async def test_a_slow_first_token_is_hedged_and_the_hedge_wins(tmp_path: Path) -> None:
    slow = Slow("oa-1")
    timer = ManualTimer()
    async with gateway(tmp_path, hedge_config(), timer, slow) as h:
        task = asyncio.create_task(h.chat("h", stream=True))
        await timer.until_sleeping(1)  # the hedge delay runs; oa-1 has not answered
        assert h.sent_to == ["oa-1"]
        timer.advance(499)
        await asyncio.sleep(0)
        assert h.sent_to == ["oa-1"]  # not before the delay
        timer.advance(1)
        r = await task
        assert deltas(r, "content") == ["from oa-2"]
        assert r.headers["x-fairgate-hedged"] == "won"
        assert h.sent_to == ["oa-1", "oa-2"]
        assert slow.cancelled == ["oa-1"]  # the loser was cancelled at once
        await h.settle_background()
        assert await h.open_reservations() == 0
        # both attempts were charged to their pools: the upstream bills the started one too
        assert await requests_total(h, "p1") == 1
        assert await requests_total(h, "p2") == 1
        assert hedges((await h.client.get("/metrics")).text) == {"won": 1.0}


async def test_a_first_token_in_time_sends_no_hedge(tmp_path: Path) -> None:
    async with gateway(tmp_path, hedge_config(), ManualTimer(), Slow()) as h:
        r = await h.chat("h")
        assert content(r) == "from oa-1"
        assert h.sent_to == ["oa-1"]
        assert hedges((await h.client.get("/metrics")).text) == {}


async def test_the_first_target_answering_first_cancels_the_hedge(tmp_path: Path) -> None:
    slow = Slow("oa-1", "oa-2")
    timer = ManualTimer()
    async with gateway(tmp_path, hedge_config(), timer, slow) as h:
        task = asyncio.create_task(h.chat("h"))
        await timer.until_sleeping(1)
        timer.advance(500)
        for _ in range(100):  # the hedge is sent
            await asyncio.sleep(0)
            if len(h.sent_to) == 2:
                break
        assert h.sent_to == ["oa-1", "oa-2"]
        slow.gates["oa-1"].set()
        r = await task
        assert content(r) == "from oa-1"
        assert "x-fairgate-hedged" not in r.headers
        assert slow.cancelled == ["oa-2"]
        await h.settle_background()
        assert await h.open_reservations() == 0
        assert await requests_total(h, "p2") == 1  # the cancelled hedge is charged too
        assert hedges((await h.client.get("/metrics")).text) == {"cancelled": 1.0}


async def test_hedges_over_the_cap_are_not_sent(tmp_path: Path) -> None:
    slow = Slow("oa-1", "oa-2")
    timer = ManualTimer()
    async with gateway(tmp_path, hedge_config(maxHedgesInFlight=1), timer, slow) as h:
        tasks = [asyncio.create_task(h.chat("h")) for _ in range(2)]
        await timer.until_sleeping(2)
        timer.advance(500)
        for _ in range(100):
            await asyncio.sleep(0)
        assert sorted(h.sent_to) == ["oa-1", "oa-1", "oa-2"]  # one hedge, not two
        slow.gates["oa-1"].set()
        for t in tasks:
            assert content(await t) == "from oa-1"
        assert hedges((await h.client.get("/metrics")).text) == {"capped": 1.0, "cancelled": 1.0}
        await h.settle_background()
        assert await h.open_reservations() == 0


async def test_a_learned_p95_hedges_only_once_it_is_known(tmp_path: Path) -> None:
    slow = Slow("oa-1")
    timer = ManualTimer()
    async with gateway(tmp_path, hedge_config(predictiveTtftMs="p95"), timer, slow) as h:
        # no latency learned for oa-1 yet: no hedge, the request waits for oa-1
        task = asyncio.create_task(h.chat("h"))
        for _ in range(100):
            await asyncio.sleep(0)
        timer.advance(10_000)
        for _ in range(100):
            await asyncio.sleep(0)
        assert h.sent_to == ["oa-1"]
        slow.gates["oa-1"].set()
        assert content(await task) == "from oa-1"
        # now oa-1 has a p95: a slow first token past it is hedged
        slow.gates["oa-1"] = asyncio.Event()
        task = asyncio.create_task(h.chat("h"))
        await timer.until_sleeping(1)
        p95 = h.svc.target_metrics.p95_ms(f"mock/{GPT}@oa-1")
        assert p95 is not None
        timer.advance(int(p95) + 1)
        r = await task
        assert content(r) == "from oa-2"
        assert r.headers["x-fairgate-hedged"] == "won"


def anthropic_thinking_stream(text: str | None, stop: str) -> Reply:
    """A Messages stream that thinks, then says ``text`` (None: nothing), then stops."""

    def sse(kind: str, data: dict[str, Any]) -> bytes:
        return (
            f"event: {kind}\n".encode() + b"data: " + orjson.dumps({"type": kind, **data}) + b"\n\n"
        )

    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": []}
    thinking = {"type": "thinking", "thinking": ""}
    chunks: list[bytes | BaseException] = [
        sse("message_start", {"message": {**message, "usage": {"input_tokens": 9}}}),
        sse("content_block_start", {"index": 0, "content_block": thinking}),
        sse(
            "content_block_delta",
            {"index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}},
        ),
        sse("content_block_stop", {"index": 0}),
    ]
    if text is not None:
        block = {"type": "text", "text": ""}
        chunks += [
            sse("content_block_start", {"index": 1, "content_block": block}),
            sse("content_block_delta", {"index": 1, "delta": {"type": "text_delta", "text": text}}),
            sse("content_block_stop", {"index": 1}),
        ]
    chunks += [
        sse("message_delta", {"delta": {"stop_reason": stop}, "usage": {"output_tokens": 30}}),
        sse("message_stop", {}),
    ]
    return Reply(headers={"content-type": "text/event-stream"}, chunks=chunks)


async def test_anthropic_thinking_only_fails_over_on_the_messages_route(tmp_path: Path) -> None:
    claude = {"provider": "anthropic", "model": "claude-sonnet-4"}
    cfg = base_config(
        [
            conn("cl-1", "anthropic", models=("claude-sonnet-4",)),
            conn("cl-2", "anthropic", models=("claude-sonnet-4",)),
        ],
        combos=[
            {
                "name": "think",
                "targets": [{**claude, "connection": "cl-1"}, {**claude, "connection": "cl-2"}],
                "config": {"reasoningBuffer": True},
            }
        ],
    )

    async def handler(req: UpstreamRequest) -> Reply:
        if req.conn.id == "cl-1":
            return anthropic_thinking_stream(None, "max_tokens")
        return anthropic_thinking_stream("done", "end_turn")

    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await h.client.post(
            "/v1/messages",
            json={
                "model": "think",
                "max_tokens": 64,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            },
            headers={"authorization": f"Bearer {ALICE}"},
        )
        assert r.status_code == 200, r.text
        assert h.sent_to == ["cl-1", "cl-2"]
        assert r.headers["x-fairgate-connection"] == "cl-2"
        assert r.text.count("thinking_delta") == 1  # cl-2's only: nothing of cl-1's was sent
        assert r.text.index("thinking_delta") < r.text.index("text_delta")
