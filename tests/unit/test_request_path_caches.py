"""What the request path builds once instead of per request (issue 15): a plain model's
candidates per registry snapshot, and our own upstream headers and URLs per connection. A
cache must never outlive what it was built from, nor hand a request something another
request can change."""

from __future__ import annotations

import dataclasses

from fairgate.domain.connections import Connection, Protocol
from fairgate.path.call import PlainCandidates
from fairgate.providers.upstream import _PER_CONNECTION, upstream_headers
from fairgate.snapshot import Registry


def _conn(cid: str, weight: float = 1.0, **kw: object) -> Connection:
    return Connection(
        cid,
        "mock",
        "http://up/v1",
        f"sk-{cid}",
        weight=weight,
        models=("m",),
        **kw,  # type: ignore[arg-type]
    )


def test_plain_candidates_are_heaviest_first_and_rebuilt_for_a_new_registry() -> None:
    light, heavy = _conn("a", 1.0), _conn("b", 5.0)
    reg = Registry.build([light, heavy], [], [])
    cache = PlainCandidates()
    first = cache.of(reg, "m", (light, heavy))
    assert [c.conn.id for c in first] == ["b", "a"]
    assert [c.target.key for c in first] == ["mock/m@b", "mock/m@a"]
    assert cache.of(reg, "m", (light, heavy)) is first  # built once per snapshot
    assert [c.model for c in cache.of(reg, "other", (light,))] == ["other"]
    heavier = dataclasses.replace(light, weight=9.0)
    reg2 = Registry.build([heavier, heavy], [], [])
    again = cache.of(reg2, "m", (heavier, heavy))
    assert [c.conn.id for c in again] == ["a", "b"]  # the new snapshot's weights
    assert again[0].conn is heavier


def test_upstream_headers_are_a_new_dict_per_request_and_follow_a_changed_connection() -> None:
    conn = _conn("h", forward_headers=("openai-project",))
    first = upstream_headers(conn, {"openai-project": "p1"})
    assert first["authorization"] == "Bearer sk-h"
    assert first["openai-project"] == "p1"
    first["x-added"] = "by the caller"
    second = upstream_headers(conn, {})
    assert "x-added" not in second
    assert "openai-project" not in second
    rotated = dataclasses.replace(conn, secret="sk-rotated")  # an OAuth token, a new key
    assert upstream_headers(rotated, {})["authorization"] == "Bearer sk-rotated"
    anthropic = dataclasses.replace(conn, protocol=Protocol.ANTHROPIC)
    got = upstream_headers(anthropic, {})
    assert got["x-api-key"] == "sk-h"
    assert "authorization" not in got


def test_upstream_targets_are_built_once_per_connection_and_path() -> None:
    conn = dataclasses.replace(_conn("u"), provider="openai")
    target = _PER_CONNECTION.target(conn, "/chat/completions")
    assert target.origin == ("http", "up", 80)
    assert (target.path, target.host) == ("/v1/chat/completions", "up")
    assert target.head is not None
    assert target.head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: up\r\n")
    assert b"authorization: Bearer sk-u\r\n" in target.head
    assert target.head.endswith(b"Accept: */*\r\nContent-Length: ")
    assert _PER_CONNECTION.target(conn, "/chat/completions") is target
    moved = dataclasses.replace(conn, base_url="https://elsewhere:8443/v1/")
    there = _PER_CONNECTION.target(moved, "/chat/completions")
    assert there.origin == ("https", "elsewhere", 8443)
    assert there.host == "elsewhere:8443"
    # a connection that may add client headers names them; a request that carries none of
    # them still sends the fixed head (issue 42, item 9: Anthropic connections forward
    # anthropic-beta by default, and most of their requests carry none)
    forwarding = dataclasses.replace(conn, forward_headers=("openai-project",))
    assert _PER_CONNECTION.target(forwarding, "/chat/completions").forwarded == ("openai-project",)
    anthropic = dataclasses.replace(conn, id="a", protocol=Protocol.ANTHROPIC)
    assert _PER_CONNECTION.target(anthropic, "/messages").forwarded == (
        "anthropic-beta",
        "anthropic-version",
    )
    assert _PER_CONNECTION.target(conn, "/chat/completions").forwarded == ()
    # the mock is no exception (it once took every x-mock-* header): its head is fixed too
    assert _PER_CONNECTION.target(_conn("mock"), "/chat/completions").head is not None


def test_an_equal_copy_of_a_connection_keeps_its_cached_head() -> None:
    """An OAuth request sends a copy of its connection with the current access token: while
    the token holds, the copy is equal and the head cached for it serves; a new token builds
    a new head."""
    conn = dataclasses.replace(_conn("o"), provider="openai", secret="tok-1")
    first = _PER_CONNECTION.target(conn, "/chat/completions")
    copy = dataclasses.replace(conn, secret="tok-1")
    assert copy is not conn
    assert _PER_CONNECTION.target(copy, "/chat/completions") is first
    rotated = _PER_CONNECTION.target(dataclasses.replace(conn, secret="tok-2"), "/chat/completions")
    assert rotated is not first
    assert rotated.head is not None
    assert b"authorization: Bearer tok-2\r\n" in rotated.head


def test_the_demos_mock_takes_no_fault_from_a_tenant() -> None:
    """Issue 43, N17: the gateway forwarded every ``x-mock-*`` header to a mock connection, so
    in ``fairgate demo`` any client key could make the shared mock fail for everyone. A mock
    connection follows the one rule, its ``forward_headers`` allow-list, and the demo lists
    none."""
    from fairgate.cli import demo_config_yaml
    from fairgate.config import load_config_text

    keys = {k: k[0] * 20 for k in ("alice", "bob", "carol")}
    cfg = load_config_text(demo_config_yaml("http://127.0.0.1:9", "s" * 16, keys))
    assert all(c.forward_headers == [] for c in cfg.connections)
    fault = {"x-mock-fault": "500", "x-mock-note": "n"}
    mock = _conn("d")
    assert mock.provider == "mock"
    assert not set(upstream_headers(mock, fault)) & set(fault)
    allowed = _conn("t", forward_headers=("x-mock-fault",))  # a test's own connection
    assert upstream_headers(allowed, fault)["x-mock-fault"] == "500"
    assert "x-mock-note" not in upstream_headers(allowed, fault)
