"""The in-process harness serves a request end to end (the base every other test here uses)."""

from __future__ import annotations

from pathlib import Path

from inproc_support import base_config, conn, gateway

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
