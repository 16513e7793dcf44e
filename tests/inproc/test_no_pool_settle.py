"""A request to a connection outside every pool reserves nothing, so there is nothing to settle:
no settle task runs for it (unless tracing records one), and its tokens still reach the
connection's percent attribution (a subscription's next reading is split by them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from inproc_support import ALICE, base_config, conn, gateway, openai_stream

from fairgate.path import attempt
from fairgate.path.provider_signals import ProviderSignals
from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat
from fairgate.timers import ManualTimer

POOL = {
    "id": "p",
    "name": "P",
    "connections": ["pooled"],
    "dimensions": [{"unit": "requests", "window": "hourly", "limit": 100}],
    "allocations": [{"key": "alice", "weight": 100}],
}


async def _answer(req: UpstreamRequest) -> Reply:
    if req.json().get("stream"):
        return Reply(chunks=openai_stream("hello there"))
    return openai_chat("hello", prompt_tokens=7, completion_tokens=3)


@pytest.mark.parametrize("stream", [False, True])
async def test_no_settle_task_without_a_reservation_but_tokens_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    settles: list[str] = []
    counted: list[tuple[str, str, float]] = []
    real_settle = attempt._settle

    def spy_settle(svc: Any, res: Any, conn: Any, *rest: Any) -> Any:
        settles.append(conn.id)
        return real_settle(svc, res, conn, *rest)

    def spy_tokens(
        self: ProviderSignals, conn_id: str, key_id: str, tokens: float, reading: Any
    ) -> list[Any]:
        counted.append((conn_id, key_id, tokens))
        return []

    monkeypatch.setattr(attempt, "_settle", spy_settle)
    monkeypatch.setattr(ProviderSignals, "attribute", spy_tokens)
    cfg = base_config([conn("free", models=("a",)), conn("pooled", models=("b",))], pools=[POOL])
    async with gateway(tmp_path, cfg, ManualTimer(), _answer) as h:
        for model in ("a", "b"):
            r = await h.chat(model, key=ALICE, stream=stream, max_tokens=5)
            assert r.status_code == 200, r.text
            await h.settle_background()
        assert await h.open_reservations() == 0
    assert settles == ["pooled"]  # only the request that reserved something settled
    assert [c[:2] for c in counted] == [("free", "alice"), ("pooled", "alice")]
    assert all(tokens > 0 for *_, tokens in counted)
