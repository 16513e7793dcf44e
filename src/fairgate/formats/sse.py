"""Incremental Server-Sent Events parsing and encoding.

Upstream streams arrive as arbitrary byte chunks (TCP segments, HTTP chunks), so an event — or
even a line, or a ``\\r\\n`` pair — may be split anywhere. ``SSEParser`` keeps only the unfinished
tail between calls and hands back complete events as soon as their blank line arrives, so the
proxy can translate and forward each event without buffering the stream.

The parser follows the WHATWG ``text/event-stream`` rules: lines end in ``\\n``, ``\\r\\n`` or a
lone ``\\r``; lines starting with ``:`` are comments (keep-alives); a field line is
``name: value`` (one space after the colon is dropped); several ``data`` lines join with ``\\n``;
an event is dispatched on a blank line, and only if it carried data.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSEEvent", "SSEParser", "encode_event"]


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event: its ``event:`` name (None when absent), joined data, last ``id:``."""

    event: str | None
    data: str
    id: str | None = None


class SSEParser:
    """Feed raw bytes, get complete events back.

    The unfinished tail is kept as a list of byte pieces, so a huge line split over many chunks
    costs linear time, not quadratic. ``retry:`` fields are ignored: the proxy never reconnects.
    """

    __slots__ = ("_data", "_event", "_first", "_id", "_pending", "_skip_lf")

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # bytes of the current unterminated line
        self._skip_lf = False  # the previous chunk ended in "\r": drop a leading "\n"
        self._first = True  # strip a UTF-8 BOM from the very first line
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Consume ``data`` and return the events it completed (often none, sometimes many)."""
        if not data:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if data[:1] == b"\n":
                data = data[1:]
                if not data:
                    return []
        # find, not ``in``: ``bytes in bytes`` first tries its operand as an integer, and the
        # TypeError it raises and clears costs more than the search (twice per event here)
        has_cr = data.find(b"\r") != -1
        if not has_cr and data.find(b"\n") == -1:
            self._pending.append(data)
            return []
        if has_cr:
            # A trailing "\r" already ends its line; its "\n" may be the next chunk's first byte.
            self._skip_lf = data[-1:] == b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self._pending:
            self._pending.append(data)
            data = b"".join(self._pending)
            self._pending = []
        lines = data.split(b"\n")
        tail = lines.pop()
        if tail:
            self._pending.append(tail)
        out: list[SSEEvent] = []
        for raw in lines:
            self._line(raw, out)
        return out

    def flush(self) -> list[SSEEvent]:
        """End of stream: dispatch an event whose final blank line never came.

        Strict SSE discards such an event; upstreams that close right after their last
        ``data:`` line are common enough that losing it (often the usage chunk) is worse.
        """
        out: list[SSEEvent] = []
        if self._pending:
            raw = b"".join(self._pending)
            self._pending = []
            self._line(raw, out)
        self._skip_lf = False
        self._line(b"", out)
        return out

    def _line(self, raw: bytes, out: list[SSEEvent]) -> None:
        if not raw:
            if self._data:
                out.append(SSEEvent(self._event, "\n".join(self._data), self._id))
                self._data = []
            self._event = None  # the id persists across events, the name does not
            return
        line = raw.decode("utf-8", "replace")
        if self._first:
            self._first = False
            if line.startswith("\ufeff"):
                line = line[1:]
        if line.startswith(":"):
            return
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value


def encode_event(data: bytes | str, event: str | None = None) -> bytes:
    """Encode one SSE event: ``event: <name>\\n`` (when named), ``data: ...`` lines, blank line.

    Data containing newlines is split into several ``data:`` lines so that a parser joins it
    back to the same text; the usual single-line JSON payload takes the fast path.
    """
    payload = data.encode() if isinstance(data, str) else data
    if payload.find(b"\n") != -1 or payload.find(b"\r") != -1:  # find: see SSEParser.feed
        lines = payload.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        body = b"".join(b"data: " + line + b"\n" for line in lines)
    else:
        body = b"data: " + payload + b"\n"
    if event is not None:
        return b"event: " + event.encode() + b"\n" + body + b"\n"
    return body + b"\n"
