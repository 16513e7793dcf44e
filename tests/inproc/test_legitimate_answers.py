"""Legitimate answers are never failures (issue 42, item 6).

Anthropic documents an empty ``end_turn`` (``content: []``) after tool results; a model may also
think and stop, refuse, or only call a tool. The quality check took an empty answer for a broken
one: a 502, and Claude Code retried it ten times over three minutes, 11 upstream calls, all
charged, no answer. Broken is what has no stop reason, or spent its whole budget reasoning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from inproc_support import ALICE, base_config, conn, gateway, openai_stream

from fairgate.providers.inprocess import Reply, UpstreamRequest, anthropic_message, openai_chat
from fairgate.timers import ManualTimer

THINKING = {"type": "thinking", "thinking": "Nothing to add.", "signature": "sig-1"}


def _messages(h: Any, **extra: Any) -> Any:
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    return h.client.post(
        "/v1/messages",
        json={**body, **extra},
        headers={"x-api-key": ALICE, "anthropic-version": "2023-06-01"},
    )


def _anthropic(content: list[dict[str, Any]], stop: str | None) -> Reply:
    reply = anthropic_message("", stop_reason=stop)
    return Reply(body={**reply.body, "content": content})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("content", "stop"),
    [
        ([], "end_turn"),  # the documented empty turn
        ([THINKING], "end_turn"),  # thought, then nothing to say
        ([{"type": "tool_use", "id": "t1", "name": "f", "input": {}}], "tool_use"),
        ([{"type": "text", "text": ""}], "refusal"),
    ],
    ids=["empty-turn", "thinking-only", "tool-use-only", "refusal"],
)
async def test_an_anthropic_answer_with_a_stop_reason_is_served_once(
    tmp_path: Path, content: list[dict[str, Any]], stop: str
) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        return _anthropic(content, stop)

    cfg = base_config([conn("a1", "anthropic"), conn("a2", "anthropic")])
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await _messages(h)
        assert r.status_code == 200, r.text
        assert r.json()["stop_reason"] == stop
        assert len(h.upstream.requests) == 1  # no failover, no second charge
        r = await h.chat("m")  # the same answer translated for a chat client
        assert r.status_code == 200, r.text
        assert len(h.upstream.requests) == 2


async def test_an_empty_chat_answer_with_a_finish_is_served_stream_or_not(tmp_path: Path) -> None:
    async def handler(req: UpstreamRequest) -> Reply:
        if req.json().get("stream"):
            return Reply(chunks=list(openai_stream("", finish="stop")))
        return openai_chat("", completion_tokens=0)

    async with gateway(
        tmp_path, base_config([conn("c1"), conn("c2")]), ManualTimer(), handler
    ) as h:
        r = await h.chat("m")
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "stop"
        r = await h.chat("m", stream=True)
        assert r.status_code == 200, r.text
        assert '"finish_reason":"stop"' in r.text.replace(" ", "")
        assert len(h.upstream.requests) == 2


@pytest.mark.parametrize(
    ("content", "stop"),
    [([THINKING], "max_tokens"), ([], None), ([{"type": "text", "text": "cut"}], None)],
    ids=["reasoning-spent-the-budget", "nothing-no-stop", "no-stop-reason"],
)
async def test_what_is_really_broken_still_fails_over(
    tmp_path: Path, content: list[dict[str, Any]], stop: str | None
) -> None:
    """No stop reason, or a budget spent on reasoning alone: the other connection answers."""

    async def handler(req: UpstreamRequest) -> Reply:
        broken = len(h.upstream.requests) == 1  # the first attempt, wherever it went
        return _anthropic(content, stop) if broken else anthropic_message("fine")

    cfg = base_config([conn("a1", "anthropic"), conn("a2", "anthropic")])
    async with gateway(tmp_path, cfg, ManualTimer(), handler) as h:
        r = await _messages(h)
        assert r.status_code == 200, r.text
        assert r.json()["content"][0]["text"] == "fine"
        first, second = (q.conn.id for q in h.upstream.requests)
        assert first != second
