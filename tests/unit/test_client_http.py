"""The ``/v1`` request as the edge hands it to a handler (``server/client_http.py``) and how its
body is read (``bodies.read_body``): headers decoded once, the body straight from ``receive``."""

from __future__ import annotations

from typing import Any

import pytest

from fairgate.server.bodies import read_body
from fairgate.server.client_http import ClientRequest, decode_headers
from fairgate.server.errors import ApiError


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
