"""The Responses route's stream relays, per event (issue 42, item 3): a Codex turn relayed as
it is to a Responses-wire connection, against the path it took before (the upstream's events
translated to chat chunks and the chunks rendered back as Responses events).

Prints microseconds per upstream event for each; no assertion (a figure, not a test).
Run: ``python benchmarks/responses_relay.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import ClassVar

import orjson

from fairgate.formats.responses import ChatToResponsesStream
from fairgate.formats.responses_upstream import ResponsesToChatStream
from fairgate.mock.codex import ResponsesAnswer, responses_stream
from fairgate.mock.wire import ToolCall
from fairgate.path import relay

PIECES = [f"word{i} " for i in range(200)]
ANSWER = ResponsesAnswer(
    PIECES, 500, 300, [ToolCall("c1", "shell", '{"cmd":"ls -la"}')], True, True, True
)
EVENTS = responses_stream("resp_b", "gpt-5-codex", 0, ANSWER)
RAW = [f"event: {n}\ndata: ".encode() + orjson.dumps(d) + b"\n\n" for n, d in EVENTS]
ROUNDS = 200


class _Resp:
    status = 200
    headers: ClassVar[dict[str, str]] = {}

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in RAW:
            yield chunk


async def _drain(source: AsyncIterator[bytes]) -> None:
    async for _ in source:
        pass


async def _passthrough() -> None:
    await _drain(relay.responses_to_responses(_Resp(), relay.StreamTally()))  # type: ignore[arg-type]


async def _round_trip() -> None:
    """Before: Responses events → chat chunks → Responses events."""
    to_chat = ResponsesToChatStream("m", True, 0, "c")

    async def chunks() -> AsyncIterator[dict[str, object]]:
        async for event, data in relay._events(_Resp()):  # type: ignore[arg-type]
            for chunk in to_chat.feed(event, orjson.loads(data)):
                yield chunk

    conv = ChatToResponsesStream({"model": "m"}, "m", created=0)
    await _drain(relay.chat_chunks_to_responses(chunks(), relay.StreamTally(), conv))


def _time(fn: object) -> float:
    async def run() -> float:
        t0 = time.perf_counter()
        for _ in range(ROUNDS):
            await fn()  # type: ignore[operator]
        return time.perf_counter() - t0

    return asyncio.run(run())


def main() -> None:
    n = len(RAW) * ROUNDS
    for name, fn in (("passthrough", _passthrough), ("via chat (before)", _round_trip)):
        secs = _time(fn)
        print(f"{name:>18}: {secs / n * 1e6:6.2f} us per upstream event ({len(RAW)} events)")


if __name__ == "__main__":
    main()
