"""How the ``/v1`` edge sends a stream (``edge.send_stream``): from the request's own task, with
one watcher that cancels it when the client leaves mid-stream, never after the stream ended,
and never hiding a cancellation that came from elsewhere (a shutdown)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fairgate.process.client_http import Later, StreamAnswer
from fairgate.process.edge import SendDeadline, send_stream
from fairgate.timers import ManualTimer


class Client:
    """An ASGI server's side of one streamed answer: ``receive`` says disconnect when the
    client leaves, or (as uvicorn does) once the answer is complete."""

    def __init__(self, leave_after: int | None = None) -> None:
        self.sent: list[dict[str, Any]] = []
        self.leave_after = leave_after
        self.gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if not message.get("more_body", False) and message["type"] == "http.response.body":
            self.gone.set()  # the answer is complete
        bodies = [m for m in self.sent if m["type"] == "http.response.body"]
        if self.leave_after is not None and len(bodies) >= self.leave_after:
            self.gone.set()


def _answer(events: list[str], n: int = 3, fail: bool = False) -> StreamAnswer:
    async def chunks() -> AsyncIterator[bytes]:
        try:
            for i in range(n):
                await asyncio.sleep(0)  # the upstream's next chunk
                yield f"data: {i}\n\n".encode()
            if fail:
                raise RuntimeError("stream broke")
        finally:
            events.append("closed")

    async def settle() -> None:
        events.append("settled")

    resp = StreamAnswer(chunks())
    resp.background = Later(settle)
    return resp


async def test_a_whole_stream_is_sent_and_then_settled() -> None:
    events: list[str] = []
    client = Client()
    await send_stream(_answer(events), client.receive, client.send)
    bodies = [m["body"] for m in client.sent if m["type"] == "http.response.body"]
    assert bodies == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert events == ["closed", "settled"]
    await asyncio.sleep(0)  # the watcher saw the disconnect after the end: nothing cancelled
    assert asyncio.current_task() is not None
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]


async def test_a_client_that_leaves_mid_stream_stops_it_and_it_still_settles() -> None:
    events: list[str] = []
    client = Client(leave_after=1)
    await send_stream(_answer(events, n=50), client.receive, client.send)
    bodies = [m for m in client.sent if m["type"] == "http.response.body"]
    assert 1 <= len(bodies) < 50
    assert events == ["closed", "settled"]
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]


async def test_a_cancellation_from_elsewhere_is_not_swallowed() -> None:
    events: list[str] = []
    client = Client()
    task = asyncio.ensure_future(
        send_stream(_answer(events, n=10_000), client.receive, client.send)
    )
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events == ["closed"]  # stopped before its end: the stream's own clean-up ran


async def test_a_cancellation_from_elsewhere_wins_when_the_client_leaves_too() -> None:
    events: list[str] = []
    client = Client(leave_after=1)
    task = asyncio.ensure_future(
        send_stream(_answer(events, n=10_000), client.receive, client.send)
    )
    await client.gone.wait()
    task.cancel()  # a shutdown, as the client goes
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_error_of_the_stream_is_raised() -> None:
    events: list[str] = []
    client = Client()
    with pytest.raises(RuntimeError, match="stream broke"):
        await send_stream(_answer(events, fail=True), client.receive, client.send)
    assert events == ["closed"]


class StalledClient(Client):
    """A client that reads the first ``reads`` writes and then stops reading without leaving:
    every later write waits (a full socket buffer) until the stream is given up."""

    def __init__(self, reads: int) -> None:
        super().__init__()
        self.reads = reads
        self.stalled = asyncio.Event()  # set once a write waits

    async def send(self, message: dict[str, Any]) -> None:
        if len(self.sent) >= self.reads:
            self.stalled.set()
            await asyncio.Event().wait()  # never read
        await super().send(message)


async def test_a_client_that_stops_reading_is_cut_at_the_send_deadline() -> None:
    """Issue 43, N3: a stalled client must not hold the relay (and the upstream request, its
    slot) until the upstream gives up; the stream is closed and settled like a disconnect."""
    timer = ManualTimer()
    events: list[str] = []
    client = StalledClient(reads=2)  # the head and one chunk
    sending = asyncio.ensure_future(
        send_stream(_answer(events, n=50), client.receive, client.send, SendDeadline(timer, 1_000))
    )
    await client.stalled.wait()
    await timer.until_sleeping()
    timer.advance(500)
    await timer.until_sleeping()
    assert not sending.done()  # half the deadline: still waiting on the client
    timer.advance(500)
    await asyncio.wait_for(sending, 5)  # a guard against a hang, not a measurement
    assert events == ["closed", "settled"]
    assert len([m for m in client.sent if m["type"] == "http.response.body"]) == 1
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]


async def test_a_slow_upstream_is_no_stalled_client() -> None:
    """The deadline bounds a write waiting on the client, not the time between chunks: an
    upstream that takes longer than the deadline between chunks is streamed whole."""
    timer = ManualTimer()
    events: list[str] = []

    async def chunks() -> AsyncIterator[bytes]:
        try:
            for i in range(3):
                timer.advance(5_000)  # the upstream thinks for 5 deadlines
                await asyncio.sleep(0)
                yield f"data: {i}\n\n".encode()
        finally:
            events.append("closed")

    client = Client()
    await send_stream(
        StreamAnswer(chunks()), client.receive, client.send, SendDeadline(timer, 1_000)
    )
    bodies = [m["body"] for m in client.sent if m["type"] == "http.response.body"]
    assert bodies == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert events == ["closed"]
