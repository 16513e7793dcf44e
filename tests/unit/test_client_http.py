"""The ``/v1`` request as the edge hands it to a handler (``process/client_http.py``) and how its
body is read (``bodies.read_body``): headers decoded once, the body straight from ``receive``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.responses import Response, StreamingResponse

from fairgate.path.bodies import read_body
from fairgate.process.client_http import Answer, ClientRequest, Later, StreamAnswer, decode_headers
from fairgate.process.errors import ApiError


def test_headers_keep_the_first_value_of_a_repeated_name_and_decode_latin1() -> None:
    raw = [
        (b"host", b"gw.test"),
        (b"x-tag", b"first"),
        (b"authorization", b"Bearer k"),
        (b"x-tag", b"second"),
        (b"x-latin", "caf\xe9".encode("latin-1")),
    ]
    headers = decode_headers(raw)
    assert headers == {
        "host": "gw.test",
        "x-tag": "first",
        "authorization": "Bearer k",
        "x-latin": "caf\xe9",
    }
    assert decode_headers([]) == {}


def _request(messages: list[dict[str, Any]], headers: dict[str, str] | None = None) -> Any:
    queue = list(messages)
    asked: list[int] = []

    async def receive() -> dict[str, Any]:
        asked.append(1)
        return queue.pop(0)

    req = ClientRequest({"type": "http", "headers": []}, receive, headers or {}, None)
    return req, asked


async def test_a_body_in_one_message_is_returned_as_it_came() -> None:
    body = b'{"model": "m"}'
    req, asked = _request([{"type": "http.request", "body": body}])
    got = await read_body(req, 100)
    assert got is body
    assert len(asked) == 1


async def test_a_body_in_several_messages_is_joined_in_order() -> None:
    parts = [b'{"a":', b"", b' "b"', b"}"]
    msgs = [{"type": "http.request", "body": p, "more_body": True} for p in parts]
    msgs.append({"type": "http.request", "body": b"", "more_body": False})
    req, _ = _request(msgs)
    assert await read_body(req, 100) == b'{"a": "b"}'


async def test_the_limit_is_checked_on_the_declared_length_and_while_reading() -> None:
    req, asked = _request([], {"content-length": "101"})
    with pytest.raises(ApiError) as declared:
        await read_body(req, 100)
    assert declared.value.status == 413
    assert asked == []  # refused before a byte was read
    chunk = {"type": "http.request", "body": b"x" * 60, "more_body": True}
    req, _ = _request([chunk, dict(chunk)], {"content-length": "10"})  # the header lies
    with pytest.raises(ApiError) as read:
        await read_body(req, 100)
    assert read.value.status == 413
    assert read.value.code == "request_too_large"


async def test_a_bad_length_is_a_400_and_a_client_gone_mid_body_a_499() -> None:
    req, _ = _request([], {"content-length": "lots"})
    with pytest.raises(ApiError) as bad:
        await read_body(req, 100)
    assert bad.value.status == 400
    req, _ = _request(
        [{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}]
    )
    with pytest.raises(ApiError) as gone:
        await read_body(req, 100)
    assert gone.value.status == 499
    assert gone.value.code == "client_closed"


@pytest.mark.parametrize(
    "headers",
    [
        None,
        {},
        {"x-fairgate-connection": "c1", "x-ratelimit-limit-requests": "100"},
        {"Retry-After": "3", "X-Fairgate-Combo": "c"},
        {"content-type": "application/problem+json"},
        {"content-length": "2"},
    ],
)
@pytest.mark.parametrize("status", [200, 404, 429, 502])
def test_an_answer_sends_the_headers_starlette_would(
    headers: dict[str, str] | None, status: int
) -> None:
    body = b'{"ok": true}'
    ours = Answer(body, status, headers)
    theirs = Response(body, status, headers, media_type="application/json")
    assert ours.raw_headers == theirs.raw_headers
    assert ours.status_code == theirs.status_code
    assert ours.body == theirs.body
    assert ours.served_by is None
    assert ours.overhead_ms is None


def test_a_bodiless_status_gets_no_length_as_with_starlette() -> None:
    theirs = Response(b"", 204, media_type="application/json")
    assert Answer(b"", 204).raw_headers == theirs.raw_headers


@pytest.mark.parametrize(
    "headers", [None, {"x-fairgate-connection": "c1", "cache-control": "no-cache"}]
)
def test_a_stream_answer_sends_the_headers_starlette_would(headers: dict[str, str] | None) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: x\n\n"

    ours = StreamAnswer(chunks(), headers, served_by="c1", overhead_ms=0.25)
    theirs = StreamingResponse(chunks(), headers=headers, media_type="text/event-stream")
    assert ours.raw_headers == theirs.raw_headers
    assert ours.status_code == 200
    assert ours.background is None
    assert (ours.served_by, ours.overhead_ms) == ("c1", 0.25)


async def test_later_awaits_its_function_with_its_arguments() -> None:
    got: list[tuple[int, str]] = []

    async def settle(n: int, what: str) -> None:
        got.append((n, what))

    task = Later(settle, 1, "x")
    await task()
    assert got == [(1, "x")]
    answer = Answer(b"{}", background=task)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        raise AssertionError("not read")

    await answer({"type": "http"}, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert got == [(1, "x"), (1, "x")]  # the answer ran its task after the body
