"""What the request path builds once instead of per request (issue 15): a plain model's
candidates per registry snapshot, and our own upstream headers and URLs per connection. A
cache must never outlive what it was built from, nor hand a request something another
request can change."""

from __future__ import annotations

import dataclasses

from fairgate.providers.upstream import _PER_CONNECTION, upstream_headers
from fairgate.registry import Connection, Protocol, Registry
from fairgate.server.call import PlainCandidates


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


def test_upstream_urls_are_parsed_once_per_connection_and_path() -> None:
    conn = _conn("u")
    url = _PER_CONNECTION.url(conn, "/chat/completions")
    assert str(url) == "http://up/v1/chat/completions"
    assert _PER_CONNECTION.url(conn, "/chat/completions") is url
    moved = dataclasses.replace(conn, base_url="http://elsewhere/v1/")
    assert str(_PER_CONNECTION.url(moved, "/chat/completions")) == (
        "http://elsewhere/v1/chat/completions"
    )
