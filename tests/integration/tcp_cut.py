"""A loopback TCP relay that a test can cut and restore: the network path to a real server
(PostgreSQL, Redis) fails the way it does in production (connections reset, new ones refused)
without stopping the server that other tests share. It can also show a test every byte that
crosses it (``tap``), before passing it on."""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

#: Sees each chunk the relay passes on: the relayed connection's number (from 0, in the order
#: accepted), ``True`` for the client's side (requests, commands) or ``False`` for the server's
#: (replies), then the bytes. Called on the relay's threads, one per connection and side.
Tap = Callable[[int, bool, bytes], None]


class TcpCut:
    """Relays ``127.0.0.1:port`` to ``target``. :meth:`cut` resets every relayed connection and
    refuses new ones; :meth:`restore` accepts again on the same port. :meth:`freeze` holds every
    byte instead (connections stay open, new ones are accepted, nothing answers: a server that
    hangs) until :meth:`thaw`. Threads, not asyncio: the code under test may block its event
    loop on a synchronous driver call."""

    def __init__(self, target: tuple[str, int], tap: Tap | None = None) -> None:
        self.target = target
        self._tap = tap
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port: int = probe.getsockname()[1]
        probe.close()
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._conns: list[socket.socket] = []
        #: chunks the client side sent that the relay holds back (frozen): a test's sign that
        #: the code under test is waiting on the server
        self.held = 0
        self._listener: socket.socket | None = None
        #: the server's URL through the relay (set by :meth:`for_url`)
        self.url = ""
        self.restore()

    @classmethod
    def for_url(cls, url: str, default_port: int, tap: Tap | None = None) -> TcpCut:
        """A relay in front of the server ``url`` names; :attr:`url` is the same URL through it
        (its user, database and options kept)."""
        u = urlsplit(url)
        relay = cls((u.hostname or "127.0.0.1", u.port or default_port), tap)
        auth = u.netloc.rpartition("@")[0]
        netloc = f"{auth}@127.0.0.1:{relay.port}" if auth else f"127.0.0.1:{relay.port}"
        relay.url = urlunsplit(u._replace(netloc=netloc))
        return relay

    def restore(self) -> None:
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(64)
        self._listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()

    def cut(self) -> None:
        ls, self._listener = self._listener, None
        if ls is not None:
            _kill(ls)
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            _kill(s)

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self.thaw()
        self.cut()

    def _hold(self) -> None:
        with self._lock:
            self.held += 1

    def _accept(self, ls: socket.socket) -> None:
        number = 0
        while True:
            try:
                client, _ = ls.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b, asks in ((client, upstream, True), (upstream, client, False)):
                tap = None if self._tap is None else functools.partial(self._tap, number, asks)
                held = self._hold if asks else None
                threading.Thread(
                    target=_pump, args=(a, b, self._flowing, tap, held), daemon=True
                ).start()
            number += 1


def _pump(
    src: socket.socket,
    dst: socket.socket,
    flowing: threading.Event,
    tap: Callable[[bytes], None] | None,
    held: Callable[[], None] | None = None,
) -> None:
    try:
        while data := src.recv(65536):
            if held is not None and not flowing.is_set():
                held()
            flowing.wait()
            if tap is not None:
                tap(data)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        _kill(src)
        _kill(dst)


def _kill(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()
