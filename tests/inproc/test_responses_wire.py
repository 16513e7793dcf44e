"""Same wire, no loss (issue 42, item 3): ``/v1/responses`` to a Responses-wire connection.

Before, every Responses request went Responses → chat → Responses, even when the connection
spoke Responses (the Codex backend, ``protocol: responses``): ``reasoning`` items,
``reasoning.summary``, ``include``, ``prompt_cache_key``, ``text.verbosity`` were dropped on
the way up, and reasoning items, encrypted content and summaries on the way down. Now the
request is relayed as it is (the upstream's model name; asked as a stream) and every event
arrives as the upstream sent it; the usage charged is ``response.completed``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from inproc_support import ADMIN_KEY, ALICE, MockUpstream, base_config, conn, gateway

from fairgate.formats.sse import SSEParser
from fairgate.mock.codex import ResponsesAnswer, responses_stream
from fairgate.mock.wire import ToolCall
from fairgate.providers.inprocess import Reply, UpstreamRequest, anthropic_message
from fairgate.timers import ManualTimer

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}

#: A Codex CLI turn: everything the chat form had no place for.
CODEX_TURN: dict[str, Any] = {
    "model": "gpt-5-codex",
    "instructions": "You are Codex.",
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix"}]},
        {
            "type": "reasoning",
            "id": "rs_prev",
            "summary": [{"type": "summary_text", "text": "Earlier thought."}],
            "encrypted_content": "gAAAAB-earlier-opaque-state",
        },
        {"type": "custom_tool_call", "call_id": "c0", "name": "apply_patch", "input": "*** x"},
        {"type": "custom_tool_call_output", "call_id": "c0", "output": "done"},
    ],
    "tools": [
        {"type": "function", "name": "shell", "parameters": {"type": "object"}},
        {"type": "custom", "name": "apply_patch", "description": "Patch files"},
        {"type": "web_search"},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "session-1234",
    "text": {"verbosity": "low"},
    "store": False,
    "stream": True,
}

ANSWER = ResponsesAnswer(
    ["All ", "done."],
    prompt=150,
    completion=57,
    calls=[
        ToolCall("call_1", "shell", '{"cmd":"ls"}'),
        ToolCall("call_2", "apply_patch", "*** Begin Patch", "custom"),
    ],
    reasoning=True,
    summary=True,
    encrypted=True,
)


def _config() -> dict[str, Any]:
    pool = {
        "id": "p",
        "connections": ["codex-1"],
        "dimensions": [{"unit": "tokens", "window": "hourly", "limit": 1_000_000}],
        "allocations": [{"key": "alice", "weight": 100}],
    }
    codex = conn("codex-1", "codex", models=("gpt-5-codex",), protocol="responses")
    return base_config([codex], pools=[pool])


def _events(raw: bytes) -> list[tuple[str | None, str]]:
    parser = SSEParser()
    return [(e.event, e.data) for e in [*parser.feed(raw), *parser.flush()]]


def _upstream_stream(cut_after: int | None = None) -> list[bytes]:
    events = responses_stream("resp_up", "gpt-5-codex", 1_700_000_000, ANSWER)
    sent = [f"event: {n}\ndata: ".encode() + orjson.dumps(d) + b"\n\n" for n, d in events]
    return sent if cut_after is None else sent[:cut_after]


async def _used(h: Any) -> float:
    await h.settle_background()
    usage = (await h.client.get("/api/quota/pools/p/usage", headers=ADMIN)).json()
    return float(usage["dimensions"][0]["total"])


async def test_a_codex_turn_reaches_the_upstream_unchanged_and_its_events_come_back_unchanged(
    tmp_path: Path,
) -> None:
    seen: list[UpstreamRequest] = []

    async def handler(req: UpstreamRequest) -> Reply:
        seen.append(req)
        return Reply(chunks=_upstream_stream())

    async with gateway(tmp_path, _config(), ManualTimer(), handler) as h:
        r = await h.client.post(
            "/v1/responses",
            json=CODEX_TURN,
            headers={"authorization": f"Bearer {ALICE}", "openai-beta": "responses=v1"},
        )
        assert r.status_code == 200, r.text
        (req,) = seen
        assert req.path == "/responses"
        assert req.json() == CODEX_TURN  # every field, the reasoning and custom items too
        assert req.headers["openai-beta"] == "responses=v1"  # item 9
        # web_search went up as it is: nothing is left out, so no tool is named as omitted
        assert "x-fairgate-tools-omitted" not in r.headers
        got = _events(r.content)
        want = [
            (n, orjson.dumps(d).decode())
            for n, d in responses_stream("resp_up", "gpt-5-codex", 1_700_000_000, ANSWER)
        ]
        assert got == want  # every event, byte for byte
        kinds = {n for n, _ in got}
        assert "response.reasoning_summary_text.delta" in kinds
        assert "response.custom_tool_call_input.delta" in kinds
        done = [orjson.loads(d) for n, d in got if n == "response.output_item.done"]
        assert done[0]["item"]["encrypted_content"].startswith("gAAAAB")
        # charged what response.completed says, not an estimate
        assert await _used(h) == 150 + 57


async def test_a_non_stream_client_gets_the_upstreams_whole_response(tmp_path: Path) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        body = req.json()
        assert body["stream"] is True  # the Codex backend serves streams only
        assert body["store"] is False  # fairgate keeps no responses: not stored upstream
        assert body["text"] == {"verbosity": "high"}
        return Reply(chunks=_upstream_stream())

    async with gateway(tmp_path, _config(), ManualTimer(), handler) as h:
        turn = {k: v for k, v in CODEX_TURN.items() if k not in ("stream", "store")}
        r = await h.client.post(
            "/v1/responses",
            json={**turn, "text": {"verbosity": "high"}},
            headers={"authorization": f"Bearer {ALICE}"},
        )
        assert r.status_code == 200, r.text
        final = dict(responses_stream("resp_up", "gpt-5-codex", 1_700_000_000, ANSWER))
        assert r.json() == final["response.completed"]["response"]
        kinds = [item["type"] for item in r.json()["output"]]
        assert kinds == ["reasoning", "message", "function_call", "custom_tool_call"]


async def test_a_passthrough_stream_cut_off_ends_failed_and_is_charged_what_came(
    tmp_path: Path,
) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        return Reply(chunks=_upstream_stream(cut_after=12))

    async with gateway(tmp_path, _config(), ManualTimer(), handler) as h:
        r = await h.client.post(
            "/v1/responses", json=CODEX_TURN, headers={"authorization": f"Bearer {ALICE}"}
        )
        assert r.status_code == 200, r.text
        got = _events(r.content)
        assert len(got) == 13
        name, data = got[-1]
        assert name == "response.failed"
        failed = orjson.loads(data)
        assert failed["response"]["status"] == "failed"
        assert failed["sequence_number"] == 12
        assert "response.completed" not in {n for n, _ in got}
        assert await _used(h) > 0  # the text already produced is charged


# -- across wires: faithful, refused by name, or named as left out -------------------------------

#: A Responses turn with fields only OpenAI's service has a place for.
OPENAI_ONLY: dict[str, Any] = {
    "model": "m",
    "input": [
        {"type": "message", "role": "user", "content": "hello there"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB-x"},
    ],
    "reasoning": {"effort": "low", "summary": "auto"},
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "session-1",
    "text": {"verbosity": "low"},
}


async def test_translated_to_chat_or_anthropic_what_is_left_out_is_named(tmp_path: Path) -> None:
    """Before, these fields vanished on the way to a chat or Anthropic upstream and the client
    could not tell; now the answer names each one in ``x-fairgate-omitted``, and what the wire
    can carry (the reasoning effort, to chat) is carried."""
    cfg = base_config([conn("oa", models=("m",)), conn("an", "anthropic", models=("a",))])
    async with gateway(tmp_path, cfg, ManualTimer(), MockUpstream()) as h:
        left = "include, prompt_cache_key, text.verbosity, reasoning.summary, input.reasoning"
        auth = {"authorization": f"Bearer {ALICE}"}
        r = await h.client.post("/v1/responses", json=OPENAI_ONLY, headers=auth)
        assert r.status_code == 200, r.text
        assert r.headers["x-fairgate-omitted"] == left
        sent = h.upstream.requests[-1].json()
        assert sent["reasoning_effort"] == "low"
        assert not {"include", "prompt_cache_key", "text", "reasoning"} & set(sent)
        r = await h.client.post("/v1/responses", json={**OPENAI_ONLY, "model": "a"}, headers=auth)
        assert r.status_code == 200, r.text
        assert r.headers["x-fairgate-omitted"] == left + ", reasoning.effort"
        # a chat client's OpenAI-only fields on the way to Anthropic, named too
        r = await h.chat("a", seed=7, logprobs=True, n=2)
        assert r.status_code == 200, r.text
        assert r.headers["x-fairgate-omitted"] == "logprobs, seed, n"
        # nothing left out: no header
        r = await h.chat("m", seed=7)
        assert "x-fairgate-omitted" not in r.headers
        # an Anthropic client's thinking and effort on the way to an OpenAI chat upstream
        r = await h.messages(
            "m",
            2048,
            thinking={"type": "enabled", "budget_tokens": 1024},
            output_config={"effort": "high"},
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-fairgate-omitted"] == "thinking, output_config.effort"


async def test_reasoning_maps_both_ways_where_the_wires_allow(tmp_path: Path) -> None:
    """Before, an Anthropic upstream's thinking (and an OpenAI-compatible model's
    ``reasoning_content``) never reached a Responses client, and a Responses upstream's
    reasoning summary never reached a chat or Anthropic client. Now thinking is a reasoning
    item's summary one way, and the summary is ``reasoning_content`` / a thinking block the
    other (no signature or encrypted content: only the provider that made one can read it)."""

    async def handler(req: UpstreamRequest) -> Reply:
        if req.conn.id == "an":
            return anthropic_message(
                "Yes.", thinking="Weighing it.", model="a", input_tokens=5, output_tokens=7
            )
        if req.conn.id == "oa":

            def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
                c = {
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "m",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
                return b"data: " + orjson.dumps(c) + b"\n\n"

            return Reply(
                chunks=[
                    chunk({"role": "assistant", "reasoning_content": "Think"}),
                    chunk({"reasoning_content": "ing."}),
                    chunk({"content": "Done."}),
                    chunk({}, "stop"),
                    b"data: [DONE]\n\n",
                ]
            )
        return Reply(chunks=_upstream_stream())  # the Responses upstream: with a summary

    conns = [
        conn("an", "anthropic", models=("a",)),
        conn("oa", models=("m",)),
        conn("codex-1", "codex", models=("gpt-5-codex",), protocol="responses"),
    ]
    auth = {"authorization": f"Bearer {ALICE}"}
    async with gateway(tmp_path, base_config(conns), ManualTimer(), handler) as h:
        r = await h.client.post("/v1/responses", json={"model": "a", "input": "q"}, headers=auth)
        assert r.status_code == 200, r.text
        out = r.json()["output"]
        assert out[0]["type"] == "reasoning"
        assert out[0]["summary"] == [{"type": "summary_text", "text": "Weighing it."}]
        assert out[1]["content"][0]["text"] == "Yes."
        r = await h.client.post(
            "/v1/responses", json={"model": "m", "input": "q", "stream": True}, headers=auth
        )
        got = [(n, orjson.loads(d)) for n, d in _events(r.content)]
        deltas = [d["delta"] for n, d in got if n == "response.reasoning_summary_text.delta"]
        assert deltas == ["Think", "ing."]
        final = got[-1][1]["response"]
        assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
        assert final["output"][0]["summary"][0]["text"] == "Thinking."
        # a Responses upstream's summary to an Anthropic client: a thinking block
        r = await h.messages("gpt-5-codex", 100, text="q")
        assert r.status_code == 200, r.text
        blocks = r.json()["content"]
        assert blocks[0]["type"] == "thinking"
        assert blocks[0]["thinking"] == "Considering the request."
