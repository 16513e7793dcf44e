"""The limits of the HTTP edge, read in one place: what a client may send, how slowly, how often.

Every knob is an environment variable with a safe default; a value that does not parse or lies
outside its range stops the gateway at start (``fairgate serve`` prints the reason and exits 2):
a typo in a security limit must not silently mean "no limit". docs/security.md explains each.

=================  =====================================  ==========================================
field              environment variable                   default
=================  =====================================  ==========================================
max_header_bytes   FAIRGATE_HTTP_MAX_HEADER_BYTES         65536 (request line + headers; 431 above)
max_headers        FAIRGATE_HTTP_MAX_HEADERS              100 (431 above)
header_timeout_s   FAIRGATE_HTTP_HEADER_TIMEOUT_S         10 (from the first byte of a request to
                                                          the end of its headers)
silent_timeout_s   FAIRGATE_HTTP_SILENT_TIMEOUT_S         120 (a new connection that sends nothing;
                                                          earlier when the connection cap needs
                                                          room: the one silent longest first)
body_timeout_s     FAIRGATE_HTTP_BODY_TIMEOUT_S           60 (whole body, from the end of headers)
keep_alive_s       FAIRGATE_HTTP_KEEP_ALIVE_S             5 (idle between requests)
send_timeout_s     FAIRGATE_HTTP_SEND_TIMEOUT_S           60 (one write of a streamed answer that
                                                          the client does not read; then closed)
max_connections    FAIRGATE_HTTP_MAX_CONNECTIONS          1000 (open connections; one more closes
                                                          the connection silent longest, or gets
                                                          503 and close when none is silent)
max_conns_per_addr FAIRGATE_HTTP_MAX_CONNECTIONS_PER_ADDRESS 256 (open connections of one client
                                                          address; a trusted proxy's are counted
                                                          by the client its X-Forwarded-For names)
key_rate_per_s     FAIRGATE_KEY_RATE_PER_S                1000 (requests a second per client key;
                                                          0 = off)
key_rate_burst     FAIRGATE_KEY_RATE_BURST                2000
max_messages       FAIRGATE_MAX_MESSAGES                  10000 (per request)
max_message_bytes  FAIRGATE_MAX_MESSAGE_BYTES             8388608 (one message's content)
thread_parse_bytes FAIRGATE_THREAD_PARSE_BYTES            262144 (bodies this large or larger are
                                                          parsed and checked off the event loop)
metrics_key        FAIRGATE_METRICS_KEY                   unset: /metrics from loopback only
metrics_public     FAIRGATE_METRICS_PUBLIC                false (true: /metrics open to anyone)
allowed_hosts      FAIRGATE_ALLOWED_HOSTS                 loopback names + the bind address when
                                                          bound to loopback, else any; ``*`` = any
admin_free_fails   FAIRGATE_ADMIN_FREE_FAILURES           5 (wrong admin keys before backoff)
admin_backoff_s    FAIRGATE_ADMIN_BACKOFF_S               1 (first lockout; doubles per failure)
admin_backoff_max  FAIRGATE_ADMIN_BACKOFF_MAX_S           60
trusted_proxies    FORWARDED_ALLOW_IPS                    127.0.0.1 (peers whose X-Forwarded-For
                                                          and -Proto name the client; ``*`` = any;
                                                          uvicorn's own variable, kept)
=================  =====================================  ==========================================
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ADMIN_KEY_MIN_LENGTH",
    "HttpSettings",
    "SettingsError",
    "TrustedProxies",
    "admin_key_problem",
    "host_allowed",
    "is_loopback",
]

#: The shortest admin key ``fairgate serve`` starts with: 32 characters of a random key are far
#: beyond guessing at any rate the backoff allows.
ADMIN_KEY_MIN_LENGTH = 32

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class SettingsError(ValueError):
    """A setting that does not parse or is out of range; the message names the variable."""


# field -> (environment variable, lowest, highest)
_NUMBERS: dict[str, tuple[str, float, float]] = {
    "max_header_bytes": ("FAIRGATE_HTTP_MAX_HEADER_BYTES", 1024, 16 * 1024 * 1024),
    "max_headers": ("FAIRGATE_HTTP_MAX_HEADERS", 8, 10_000),
    "header_timeout_s": ("FAIRGATE_HTTP_HEADER_TIMEOUT_S", 0.05, 3600),
    "silent_timeout_s": ("FAIRGATE_HTTP_SILENT_TIMEOUT_S", 0.05, 86_400),
    "body_timeout_s": ("FAIRGATE_HTTP_BODY_TIMEOUT_S", 0.05, 86_400),
    "keep_alive_s": ("FAIRGATE_HTTP_KEEP_ALIVE_S", 0.05, 3600),
    "send_timeout_s": ("FAIRGATE_HTTP_SEND_TIMEOUT_S", 0.05, 86_400),
    "max_connections": ("FAIRGATE_HTTP_MAX_CONNECTIONS", 1, 1_000_000),
    "max_connections_per_address": ("FAIRGATE_HTTP_MAX_CONNECTIONS_PER_ADDRESS", 1, 1_000_000),
    "key_rate_per_s": ("FAIRGATE_KEY_RATE_PER_S", 0, 1_000_000),
    "key_rate_burst": ("FAIRGATE_KEY_RATE_BURST", 1, 10_000_000),
    "max_messages": ("FAIRGATE_MAX_MESSAGES", 1, 10_000_000),
    "max_message_bytes": ("FAIRGATE_MAX_MESSAGE_BYTES", 1, 1 << 40),
    "thread_parse_bytes": ("FAIRGATE_THREAD_PARSE_BYTES", 0, 1 << 40),
    "admin_free_failures": ("FAIRGATE_ADMIN_FREE_FAILURES", 0, 1000),
    "admin_backoff_s": ("FAIRGATE_ADMIN_BACKOFF_S", 0.01, 3600),
    "admin_backoff_max_s": ("FAIRGATE_ADMIN_BACKOFF_MAX_S", 0.01, 86_400),
}
_INTS = frozenset(
    {
        "max_header_bytes",
        "max_headers",
        "max_connections",
        "max_connections_per_address",
        "key_rate_burst",
        "max_messages",
        "max_message_bytes",
        "thread_parse_bytes",
        "admin_free_failures",
    }
)


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """The HTTP edge's limits (see the module docstring for the variables and defaults)."""

    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout_s: float = 10.0
    #: a new connection may wait this long for its first byte while the gateway has room
    #: (a busy client can take seconds between its connect and its request: issue 41)
    silent_timeout_s: float = 120.0
    body_timeout_s: float = 60.0
    keep_alive_s: float = 5.0
    #: how long one write of a streamed answer may wait for a client that stopped reading before
    #: the stream is closed (the upstream request and its slot are freed; the client's fault)
    send_timeout_s: float = 60.0
    max_connections: int = 1000
    #: open connections of one client address (issue 43, N5): one address cannot fill the
    #: whole cap with request heads it never finishes
    max_connections_per_address: int = 256
    key_rate_per_s: float = 1000.0
    key_rate_burst: int = 2000
    max_messages: int = 10_000
    max_message_bytes: int = 8 * 1024 * 1024
    thread_parse_bytes: int = 256 * 1024
    metrics_key: str | None = None
    metrics_public: bool = False
    #: lower-case host names (no port) a request's ``Host`` may name; None = any
    allowed_hosts: frozenset[str] | None = None
    admin_free_failures: int = 5
    admin_backoff_s: float = 1.0
    admin_backoff_max_s: float = 60.0
    #: ``FORWARDED_ALLOW_IPS`` as uvicorn reads it: addresses, networks or ``*``
    trusted_proxies: str = "127.0.0.1"

    @classmethod
    def from_env(cls, env: Mapping[str, str], bind: str | None = None) -> HttpSettings:
        """The settings from ``env``; ``bind`` is the address the server listens on (the
        allowed-hosts default depends on it; None: no host check unless configured).

        Raises :class:`SettingsError` naming the variable on a bad value."""
        values: dict[str, object] = {}
        for name, (var, lo, hi) in _NUMBERS.items():
            raw = env.get(var, "").strip()
            if raw:
                values[name] = _number(var, raw, lo, hi, integer=name in _INTS)
        key = env.get("FAIRGATE_METRICS_KEY", "").strip()
        if key:
            values["metrics_key"] = key
        public = env.get("FAIRGATE_METRICS_PUBLIC", "").strip().lower()
        if public:
            if public not in _TRUE | _FALSE:
                raise SettingsError("FAIRGATE_METRICS_PUBLIC must be true or false")
            values["metrics_public"] = public in _TRUE
        values["allowed_hosts"] = _allowed_hosts(env.get("FAIRGATE_ALLOWED_HOSTS", ""), bind)
        proxies = env.get("FORWARDED_ALLOW_IPS", "").strip()
        if proxies:
            values["trusted_proxies"] = proxies
        return dataclasses.replace(cls(), **values)  # type: ignore[arg-type]


def _number(var: str, raw: str, lo: float, hi: float, *, integer: bool) -> float | int:
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{var} must be a number, got {raw[:40]!r}") from None
    if not math.isfinite(value) or not lo <= value <= hi:
        raise SettingsError(f"{var} must be between {lo:g} and {hi:g}, got {raw[:40]!r}")
    if integer:
        if value != int(value):
            raise SettingsError(f"{var} must be a whole number, got {raw[:40]!r}")
        return int(value)
    return value


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class TrustedProxies:
    """``FORWARDED_ALLOW_IPS`` (comma-separated addresses, networks, or ``*``) as the connection
    cap reads it: whether a peer is a trusted proxy, and which client a trusted proxy's
    ``X-Forwarded-For`` names (the rightmost address that is not itself a trusted proxy, as
    uvicorn's proxy-headers middleware picks it for the routes). A name that is no address
    is compared as text (a unix socket path)."""

    __slots__ = ("_any", "_hosts", "_literals", "_networks")

    def __init__(self, raw: str) -> None:
        parts = [p.strip() for p in raw.split(",") if p.strip()]
        self._any = "*" in parts
        self._hosts: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
        self._networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        self._literals: set[str] = set()
        for p in parts:
            try:
                if "/" in p:
                    self._networks.append(ipaddress.ip_network(p, strict=False))
                else:
                    self._hosts.add(ipaddress.ip_address(p))
            except ValueError:
                self._literals.add(p)

    def trusts(self, host: str | None) -> bool:
        if self._any:
            return True
        if not host:
            return False
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return host in self._literals
        return ip in self._hosts or any(ip in n for n in self._networks)

    def client_of(self, forwarded_for: str) -> str | None:
        """The client a trusted proxy's ``X-Forwarded-For`` names (None: an empty header)."""
        hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
        if not hops:
            return None
        if self._any:
            return _host_of(hops[0])
        for hop in reversed(hops):
            host = _host_of(hop)
            if not self.trusts(host):
                return host
        return _host_of(hops[0])  # every hop a trusted proxy: the first is the client


def _host_of(hop: str) -> str:
    """An ``X-Forwarded-For`` entry without its port (``1.2.3.4:5``, ``[::1]:5``)."""
    if hop.startswith("["):
        return hop[1:].split("]", 1)[0]
    if hop.count(":") == 1:
        return hop.split(":", 1)[0]
    return hop


def _allowed_hosts(raw: str, bind: str | None) -> frozenset[str] | None:
    """``FAIRGATE_ALLOWED_HOSTS`` (comma-separated names, ``*`` for any), else the default: the
    loopback names and the bind address when bound to loopback (a browser tricked by DNS
    rebinding sends another name), no check otherwise (a public bind has names we cannot guess)."""
    names = [n.strip().strip("[]").lower() for n in raw.split(",") if n.strip()]
    if names:
        if "*" in names:
            return None
        for n in names:
            if any(c in n for c in " /@:") and not _is_ipv6(n):
                raise SettingsError(f"FAIRGATE_ALLOWED_HOSTS: {n[:60]!r} is not a host name")
        return frozenset(names)
    if bind is not None and is_loopback(bind):
        return frozenset({*_LOOPBACK_NAMES, bind.strip("[]").lower()})
    return None


def _is_ipv6(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).version == 6
    except ValueError:
        return False


def host_allowed(allowed: frozenset[str] | None, host_header: str | None) -> bool:
    """Whether a request whose ``Host`` header is ``host_header`` may be served. No header
    (HTTP/1.0 tools) is allowed: a browser, the DNS-rebinding vector, always sends one."""
    if allowed is None or host_header is None:
        return True
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8080
        name = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        name = host.partition(":")[0]
    else:
        name = host
    return name.rstrip(".") in allowed


def admin_key_problem(key: str | None) -> str | None:
    """Why ``key`` may not be the admin key, or None (no key: the admin API is off)."""
    if key is None or key == "":
        return None
    if len(key) < ADMIN_KEY_MIN_LENGTH:
        return (
            f"FAIRGATE_ADMIN_KEY must be at least {ADMIN_KEY_MIN_LENGTH} characters "
            f"(it has {len(key)}); generate one with: python3 -c "
            "'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return None
