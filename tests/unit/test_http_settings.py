"""The HTTP edge's settings, guards and access rules, in-process (issue 19)."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from fairgate.process.guards import AdminBackoff, KeyRateGuard
from fairgate.process.http_settings import (
    EdgeSettings,
    HttpSettings,
    SettingsError,
    TrustedProxies,
    admin_key_problem,
    host_allowed,
)
from fairgate.process.metrics_http import metrics_access_problem
from fairgate.process.settings import Settings


def limits_of(env: dict[str, str], bind: str | None = None) -> HttpSettings:
    """The edge's limits the settings read from ``env`` describe, for ``bind``."""
    return Settings.load(env).http.limits(bind)


def test_the_edge_defaults_are_declared_once() -> None:
    # HttpSettings (the edge's view) and EdgeSettings (the declaration) agree on every default
    declared = EdgeSettings().limits()
    assert declared == HttpSettings()


def test_defaults_are_bounded() -> None:
    s = limits_of({})
    assert s.max_header_bytes == 65536
    assert s.max_headers == 100
    assert s.header_timeout_s == 10
    assert s.silent_timeout_s == 120
    assert s.body_timeout_s == 60
    assert s.keep_alive_s == 5
    assert s.max_connections == 1000
    assert s.max_messages == 10_000
    assert s.metrics_key is None
    assert not s.metrics_public
    assert s.allowed_hosts is None  # no bind address known: no host check


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("FAIRGATE_HTTP_MAX_HEADER_BYTES", "lots"),
        ("FAIRGATE_HTTP_MAX_HEADER_BYTES", "10"),  # below the floor: a typo, not a limit
        ("FAIRGATE_HTTP_MAX_HEADERS", "1.5"),
        ("FAIRGATE_HTTP_BODY_TIMEOUT_S", "inf"),
        ("FAIRGATE_HTTP_KEEP_ALIVE_S", "-1"),
        ("FAIRGATE_HTTP_SEND_TIMEOUT_S", "0"),
        ("FAIRGATE_METRICS_PUBLIC", "maybe"),
        ("FAIRGATE_ALLOWED_HOSTS", "http://gw.example.com/"),
    ],
)
def test_a_bad_value_names_its_variable(var: str, value: str) -> None:
    with pytest.raises(SettingsError, match=var):
        limits_of({var: value})


def test_allowed_hosts_default_to_loopback_names_when_bound_to_loopback() -> None:
    assert limits_of({}, bind="127.0.0.1").allowed_hosts == frozenset(
        {"localhost", "127.0.0.1", "::1"}
    )
    assert "127.0.0.2" in (limits_of({}, bind="127.0.0.2").allowed_hosts or ())
    assert limits_of({}, bind="0.0.0.0").allowed_hosts is None
    assert limits_of({"FAIRGATE_ALLOWED_HOSTS": "*"}, bind="::1").allowed_hosts is None
    # the names as set, whatever the bind address (spaces and an IPv6 name's brackets dropped)
    named = limits_of({"FAIRGATE_ALLOWED_HOSTS": "gw.example.com, [::1]"}, bind="127.0.0.1")
    assert named.allowed_hosts == frozenset({"gw.example.com", "::1"})


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("localhost:20128", True),
        ("LOCALHOST", True),
        ("127.0.0.1", True),
        ("[::1]:20128", True),
        ("localhost.:20128", True),
        (None, True),  # HTTP/1.0 tools send none; a browser always does
        ("evil.example:20128", False),
        ("localhost.evil.example", False),
        ("[::2]:20128", False),
        ("", False),
    ],
)
def test_host_allowed(header: str | None, ok: bool) -> None:
    allowed = limits_of({}, bind="127.0.0.1").allowed_hosts
    assert host_allowed(allowed, header) is ok
    assert host_allowed(None, header)


def test_admin_key_minimum_length() -> None:
    assert admin_key_problem(None) is None  # no key: the admin API is off
    assert "at least 32" in (admin_key_problem("a") or "")
    assert "at least 32" in (admin_key_problem("x" * 31) or "")
    assert admin_key_problem("x" * 32) is None


def test_the_rate_guard_allows_a_burst_then_the_rate() -> None:
    guard = KeyRateGuard(rate_per_s=10, burst=3)
    now = 1_000_000
    assert [guard.take("a", now) for _ in range(3)] == [0, 0, 0]
    assert guard.take("a", now) == 100  # one token every 100 ms
    assert guard.take("b", now) == 0  # keys do not share a bucket
    assert guard.take("a", now + 99) > 0
    assert guard.take("a", now + 100) == 0
    assert guard.take("a", now + 10_000) == 0  # refilled, but never above the burst
    assert [guard.take("a", now + 10_000) for _ in range(3)] == [0, 0, 100]
    assert len(guard) == 2


def test_a_zero_rate_turns_the_guard_off() -> None:
    guard = KeyRateGuard(rate_per_s=0, burst=1)
    assert all(guard.take("a", 0) == 0 for _ in range(10_000))
    assert len(guard) == 0


def test_admin_backoff_doubles_per_failure_and_forgets_on_success() -> None:
    b = AdminBackoff(free=2, base_ms=1000, max_ms=5000)
    t = 0
    assert b.failed("10.0.0.1", t) == 1
    assert b.locked_for("10.0.0.1", t) == 0
    b.failed("10.0.0.1", t)
    assert b.locked_for("10.0.0.1", t) == 0  # two free failures
    b.failed("10.0.0.1", t)
    assert b.locked_for("10.0.0.1", t) == 1000
    assert b.locked_for("10.0.0.2", t) == 0  # per address
    t = 1000
    b.failed("10.0.0.1", t)
    assert b.locked_for("10.0.0.1", t) == 2000
    for _ in range(10):
        b.failed("10.0.0.1", t)
    assert b.locked_for("10.0.0.1", t) == 5000  # capped
    assert b.locked_for("10.0.0.1", t + 5000) == 0
    b.succeeded("10.0.0.1")
    b.failed("10.0.0.1", t)
    assert b.locked_for("10.0.0.1", t) == 0


def test_admin_backoff_remembers_a_bounded_number_of_addresses() -> None:
    b = AdminBackoff(free=0, base_ms=1000, max_ms=1000, capacity=100)
    for i in range(1000):
        b.failed(f"10.0.{i // 256}.{i % 256}", 0)
    assert len(b) == 100
    assert b.locked_for("10.0.3.231", 0) == 1000  # the newest are kept
    assert b.locked_for("10.0.0.0", 0) == 0


def _request(client: str, auth: str | None = None) -> Request:
    headers = [(b"authorization", auth.encode())] if auth else []
    return Request(
        {
            "type": "http",
            "method": "GET",
            "path": "/metrics",
            "headers": headers,
            "client": (client, 5555),
        }
    )


def test_metrics_are_for_loopback_or_the_metrics_key() -> None:
    default = HttpSettings()
    assert metrics_access_problem(default, _request("127.0.0.1")) is None
    assert metrics_access_problem(default, _request("::1")) is None
    problem = metrics_access_problem(default, _request("192.0.2.7"))
    assert problem is not None
    assert problem[0] == 403
    assert "FAIRGATE_METRICS_KEY" in problem[1]
    public = HttpSettings(metrics_public=True)
    assert metrics_access_problem(public, _request("192.0.2.7")) is None
    keyed = HttpSettings(metrics_key="scrape-me-123")
    assert metrics_access_problem(keyed, _request("192.0.2.7", "Bearer scrape-me-123")) is None
    for auth in (None, "Bearer wrong", "Basic scrape-me-123"):
        got = metrics_access_problem(keyed, _request("127.0.0.1", auth))
        assert got is not None
        assert got[0] == 401


def test_the_per_address_cap_is_read_and_checked() -> None:
    env = {"FAIRGATE_HTTP_MAX_CONNECTIONS_PER_ADDRESS": "12"}
    assert limits_of(env).max_connections_per_address == 12
    assert limits_of({}).max_connections_per_address == 256
    with pytest.raises(SettingsError, match="FAIRGATE_HTTP_MAX_CONNECTIONS_PER_ADDRESS"):
        limits_of({"FAIRGATE_HTTP_MAX_CONNECTIONS_PER_ADDRESS": "0"})


def test_a_trusted_proxys_forwarded_client_is_the_rightmost_untrusted_hop() -> None:
    proxies = TrustedProxies("127.0.0.1, 10.0.0.0/8")
    assert proxies.trusts("127.0.0.1")
    assert proxies.trusts("10.2.3.4")
    assert not proxies.trusts("203.0.113.7")
    # a client-written first hop cannot choose the address: the last untrusted one counts
    assert proxies.client_of("192.0.2.1, 203.0.113.7, 10.0.0.5") == "203.0.113.7"
    assert proxies.client_of("203.0.113.7:4711") == "203.0.113.7"
    assert proxies.client_of("[2001:db8::1]:443") == "2001:db8::1"
    assert proxies.client_of("10.0.0.5, 127.0.0.1") == "10.0.0.5"  # all trusted: the first
    assert proxies.client_of(" , ") is None
    assert TrustedProxies("*").client_of("192.0.2.1, 203.0.113.7") == "192.0.2.1"
