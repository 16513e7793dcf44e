"""Counts what crosses the network to Redis: a loopback relay (``tcp_cut.py``) whose tap parses
both directions (RESP), for the tests that hold a path to a number of round trips."""

from __future__ import annotations

import threading

import hiredis
from tcp_cut import TcpCut


class Wire:
    """Counts what really crosses the network: a loopback relay (``tcp_cut.py``) in front of
    Redis whose tap parses both directions (RESP) and counts the commands sent (by name) and
    the replies read, each before the relay passes it on."""

    def __init__(self, redis_url: str) -> None:
        self.commands: list[str] = []
        self.read = 0
        self._lock = threading.Lock()
        self._parsers: dict[tuple[int, bool], hiredis.Reader] = {}
        self.relay = TcpCut.for_url(redis_url, 6379, tap=self._tap)

    @property
    def url(self) -> str:
        return self.relay.url

    @property
    def sent(self) -> int:
        return len(self.commands)

    def reset(self) -> None:
        with self._lock:
            self.read = 0
            self.commands = []

    def _tap(self, connection: int, asks: bool, data: bytes) -> None:
        with self._lock:  # a parser per connection and direction; the counts are shared
            parser = self._parsers.setdefault((connection, asks), hiredis.Reader())
            parser.feed(data)
            while (message := parser.gets()) is not False:
                if asks:
                    self.commands.append(message[0].decode().upper())
                else:
                    self.read += 1
