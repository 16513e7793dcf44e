"""The start-up port check of ``fairgate serve`` / ``mock-upstream`` / ``demo`` (issue 20): a
port held only by connections in TIME_WAIT is free, one another socket listens on is not."""

from __future__ import annotations

import socket
import time

from fairgate.cli import _port_free


def _plain_bind_fails(port: int) -> bool:
    """What the check did before: a bind without SO_REUSEADDR."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_a_port_held_only_by_time_wait_connections_is_free() -> None:
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()  # the server closes first, as a stopping server does: its side waits
        client.close()
    # the listener is gone; only the server side's TIME_WAIT connection holds the port
    deadline = time.monotonic() + 5
    while not _plain_bind_fails(port) and time.monotonic() < deadline:
        time.sleep(0.01)  # the close handshake on loopback is quick, but not synchronous
    assert _plain_bind_fails(port), "no TIME_WAIT connection: the test would prove nothing"
    assert _port_free("127.0.0.1", port)


def test_a_port_another_socket_listens_on_is_not_free() -> None:
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # even with the option
        other.bind(("127.0.0.1", 0))
        other.listen()
        assert not _port_free("127.0.0.1", other.getsockname()[1])
