"""The request path's result (:class:`Outcome`) and the edge's rendering of it: a settlement
runs exactly once, an unsent stream is closed (its clean-up settles), and the headers a client
reads are the ones the edge writes from the outcome's facts."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.responses import Response

from fairgate.path.outcome import Outcome
from fairgate.path.render import render
from fairgate.process.client_http import Answer, StreamAnswer
from fairgate.quota.decision import Outcome as Decision
from fairgate.quota.outcomes import Admission, DimensionStatus


async def test_a_settlement_runs_once_however_often_it_is_asked_for() -> None:
    runs: list[int] = []

    async def settle() -> None:
        runs.append(1)

    out = Outcome(b"{}", pending=settle)
    assert out.settles
    await out.settle()
    await out.settle()
    await out.discard()
    assert runs == [1]
    assert not out.settles


async def test_an_unsent_stream_is_started_and_closed() -> None:
    state: list[str] = []

    async def chunks() -> AsyncIterator[bytes]:
        try:
            state.append("started")
            yield b"data: 1\n\n"
            yield b"data: 2\n\n"
        finally:
            state.append("closed")  # where a stream gives its slot back and settles

    await Outcome(chunks=chunks(), sse=True).discard()
    assert state == ["started", "closed"]


def names(resp: Response) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in resp.raw_headers}


def test_an_answer_is_rendered_with_who_served_and_its_quota() -> None:
    adm = Admission(
        Decision.ALLOW,
        status=(DimensionStatus("requests/minute", "requests", 10, 7.0, 30_000),),
    )
    out = Outcome(
        b'{"ok":true}',
        served_by="c1",
        combo="fast",
        overhead_ms=0.25,
        admission=adm,
        omitted="logprobs",
        compressed_dropped=3,
        hedged=True,
    )
    resp = render(out)
    assert isinstance(resp, Answer)
    assert resp.served_by == "c1"
    assert resp.background is None  # nothing to settle
    h = names(resp)
    assert h["x-fairgate-connection"] == "c1"
    assert h["x-fairgate-combo"] == "fast"
    assert h["x-fairgate-overhead-ms"] == "0.250"
    assert h["x-fairgate-omitted"] == "logprobs"
    assert h["x-fairgate-context-compressed"] == "dropped=3"
    assert h["x-fairgate-hedged"] == "won"
    assert h["x-ratelimit-limit-requests"] == "10"
    assert h["x-ratelimit-remaining-requests"] == "7"
    assert h["content-type"] == "application/json"
    assert h["content-length"] == str(len(b'{"ok":true}'))


async def test_a_whole_answers_settlement_is_its_background_task() -> None:
    runs: list[int] = []

    async def settle() -> None:
        runs.append(1)

    out = Outcome(b"{}", served_by="c1", pending=settle)
    resp = render(out)
    assert resp.background is not None
    assert not out.settles  # the answer owns it now
    await out.settle()
    await resp.background()
    assert runs == [1]


async def test_a_stream_and_a_composed_event_stream() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: [DONE]\n\n"

    streamed = render(Outcome(chunks=chunks(), sse=True, served_by="c2", fan_out=2))
    assert isinstance(streamed, StreamAnswer)
    h = names(streamed)
    assert h["cache-control"] == "no-cache"
    assert h["x-fairgate-fan-out"] == "2"
    assert h["content-type"] == "text/event-stream; charset=utf-8"
    composed = render(Outcome(b"data: [DONE]\n\n", sse=True, combo="panel"))
    h = names(composed)
    assert "x-fairgate-connection" not in h
    assert h["x-fairgate-combo"] == "panel"
    assert h["content-type"] == "text/event-stream; charset=utf-8"
    assert "cache-control" not in h
