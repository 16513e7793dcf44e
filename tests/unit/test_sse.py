"""Incremental SSE parsing and encoding (fairgate.formats.sse)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairgate.formats.sse import SSEEvent, SSEParser, encode_event

STREAM = (
    b": keep-alive comment\n"
    b"event: message_start\n"
    b'data: {"type":"message_start"}\n'
    b"\n"
    b"id: 7\n"
    b"data: line one\n"
    b"data: line two\n"
    b"\n"
    b"data: [DONE]\n"
    b"\n"
)
EXPECTED = [
    SSEEvent("message_start", '{"type":"message_start"}'),
    SSEEvent(None, "line one\nline two", "7"),
    SSEEvent(None, "[DONE]", "7"),
]


def _feed_all(chunks: list[bytes]) -> list[SSEEvent]:
    parser = SSEParser()
    out: list[SSEEvent] = []
    for chunk in chunks:
        out.extend(parser.feed(chunk))
    return out


def test_whole_stream_in_one_chunk() -> None:
    assert _feed_all([STREAM]) == EXPECTED


def test_byte_by_byte() -> None:
    assert _feed_all([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


@pytest.mark.parametrize("newline", [b"\r\n", b"\r"])
def test_other_line_endings_byte_by_byte(newline: bytes) -> None:
    stream = STREAM.replace(b"\n", newline)
    assert _feed_all([stream]) == EXPECTED
    assert _feed_all([stream[i : i + 1] for i in range(len(stream))]) == EXPECTED


def test_crlf_split_between_chunks_is_one_line_ending() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\n\r") == [SSEEvent(None, "a")]
    assert parser.feed(b"\n") == []  # the "\n" of the blank line's "\r\n": not another line
    assert parser.feed(b"data: b\n\n") == [SSEEvent(None, "b")]


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert _feed_all(chunks) == EXPECTED


def test_field_rules() -> None:
    parser = SSEParser()
    events = parser.feed(
        b"data:no-space\n\n"  # the space after the colon is optional
        b"data:  two spaces\n\n"  # only one space is dropped
        b"data\n\n"  # a field without a colon has an empty value
        b"event: only-a-name\n\n"  # no data: not dispatched
        b"retry: 10\ndata: x\nunknown: y\n\n"
    )
    assert events == [
        SSEEvent(None, "no-space"),
        SSEEvent(None, " two spaces"),
        SSEEvent(None, ""),
        SSEEvent(None, "x"),
    ]


def test_event_name_resets_after_dispatch() -> None:
    events = SSEParser().feed(b"event: ping\ndata: {}\n\ndata: after\n\n")
    assert [e.event for e in events] == ["ping", None]


def test_bom_and_utf8_split_across_chunks() -> None:
    text = "data: héllo — ✓\n\n".encode()
    chunks = [b"\xef\xbb\xbf" + text[:8], text[8:9], text[9:]]
    assert _feed_all(chunks) == [SSEEvent(None, "héllo — ✓")]


def test_flush_dispatches_an_unterminated_event() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"usage": 1}') == []
    assert parser.flush() == [SSEEvent(None, '{"usage": 1}')]
    assert parser.flush() == []


def test_large_line_in_many_chunks() -> None:
    payload = b"x" * 100_000
    chunks = [b"data: "] + [payload[i : i + 100] for i in range(0, len(payload), 100)] + [b"\n\n"]
    assert _feed_all(chunks) == [SSEEvent(None, payload.decode())]


def test_empty_feed() -> None:
    assert SSEParser().feed(b"") == []


def test_encode_event() -> None:
    assert encode_event(b'{"a":1}') == b'data: {"a":1}\n\n'
    assert encode_event("[DONE]") == b"data: [DONE]\n\n"
    assert encode_event(b"{}", "message_stop") == b"event: message_stop\ndata: {}\n\n"
    assert encode_event("a\nb") == b"data: a\ndata: b\n\n"


@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=50))
def test_encode_then_parse_round_trips(text: str) -> None:
    normalized = text.replace("\r\n", "\n").replace("\r", "\n")
    events = SSEParser().feed(encode_event(text, "e"))
    assert events == [SSEEvent("e", normalized)]
