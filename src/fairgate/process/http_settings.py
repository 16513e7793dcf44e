"""The limits of the HTTP edge, declared in one place: what a client may send, how slowly, how
often.

Every knob is an environment variable with a safe default, declared once in
:class:`EdgeSettings` (the ``http`` area of the one settings object, ``fairgate.process.settings``,
which reads it from the environment snapshot); a value that does not parse or lies outside its
range stops the gateway at start (``fairgate serve`` prints the reason and exits 2): a typo in a
security limit must not silently mean "no limit". docs/security.md explains each.

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

import ipaddress
import math
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from fairgate.setting_source import From

__all__ = [
    "ADMIN_KEY_MIN_LENGTH",
    "EdgeSettings",
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

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class SettingsError(ValueError):
    """A setting that does not parse or is out of range; the message names the variable."""


def _whole(value: object) -> object:
    """A whole number written as text however a shell writes it (``8192``, ``8192.0``, ``1e3``)."""
    if not isinstance(value, str):
        return value
    try:
        number = float(value)
    except ValueError:
        raise ValueError("must be a number") from None
    if not math.isfinite(number) or number != int(number):
        raise ValueError("must be a whole number")
    return int(number)


def _host_names(value: object) -> object:
    """``FAIRGATE_ALLOWED_HOSTS`` checked: comma-separated host names (no scheme, path or port),
    or ``*``."""
    if not isinstance(value, str):
        return value
    for n in (n.strip().strip("[]").lower() for n in value.split(",") if n.strip()):
        if n != "*" and any(c in n for c in " /@:") and not _is_ipv6(n):
            raise ValueError(f"{n[:60]!r} is not a host name")
    return value


Whole = Annotated[int, BeforeValidator(_whole)]
Seconds = Annotated[float, Field(allow_inf_nan=False)]


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """The HTTP edge's limits as the edge uses them (built by :meth:`EdgeSettings.limits`;
    the defaults are :class:`EdgeSettings`' own, checked alike by a test)."""

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


_D = HttpSettings()
_DAY = 86_400


class EdgeSettings(BaseModel):
    """The HTTP edge's settings as the environment gives them (the area ``http`` of
    :class:`fairgate.process.settings.Settings`); :meth:`limits` makes the edge's view."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_header_bytes: Annotated[Whole, From(env="FAIRGATE_HTTP_MAX_HEADER_BYTES")] = Field(
        default=_D.max_header_bytes,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Largest request line + headers in bytes (431 above)",
    )
    max_headers: Annotated[Whole, From(env="FAIRGATE_HTTP_MAX_HEADERS")] = Field(
        default=_D.max_headers,
        ge=8,
        le=10_000,
        description="Most headers a request may send (431 above)",
    )
    header_timeout_s: Annotated[Seconds, From(env="FAIRGATE_HTTP_HEADER_TIMEOUT_S")] = Field(
        default=_D.header_timeout_s,
        ge=0.05,
        le=3600,
        description="Seconds from the first byte of a request to the end of its headers",
    )
    silent_timeout_s: Annotated[Seconds, From(env="FAIRGATE_HTTP_SILENT_TIMEOUT_S")] = Field(
        default=_D.silent_timeout_s,
        ge=0.05,
        le=_DAY,
        description="Seconds a new connection may send nothing (earlier when the connection cap "
        "needs room: the one silent longest first)",
    )
    body_timeout_s: Annotated[Seconds, From(env="FAIRGATE_HTTP_BODY_TIMEOUT_S")] = Field(
        default=_D.body_timeout_s,
        ge=0.05,
        le=_DAY,
        description="Seconds for a whole request body, from the end of its headers",
    )
    keep_alive_s: Annotated[Seconds, From(env="FAIRGATE_HTTP_KEEP_ALIVE_S")] = Field(
        default=_D.keep_alive_s, ge=0.05, le=3600, description="Idle seconds between two requests"
    )
    send_timeout_s: Annotated[Seconds, From(env="FAIRGATE_HTTP_SEND_TIMEOUT_S")] = Field(
        default=_D.send_timeout_s,
        ge=0.05,
        le=_DAY,
        description="Seconds one write of a streamed answer may wait for a client that stopped "
        "reading (then the stream is closed)",
    )
    max_connections: Annotated[Whole, From(env="FAIRGATE_HTTP_MAX_CONNECTIONS")] = Field(
        default=_D.max_connections,
        ge=1,
        le=1_000_000,
        description="Open connections; one more closes the one silent longest, or gets 503 and "
        "close when none is silent",
    )
    max_connections_per_address: Annotated[
        Whole, From(env="FAIRGATE_HTTP_MAX_CONNECTIONS_PER_ADDRESS")
    ] = Field(
        default=_D.max_connections_per_address,
        ge=1,
        le=1_000_000,
        description="Open connections of one client address (a trusted proxy's are counted by "
        "the client its X-Forwarded-For names)",
    )
    key_rate_per_s: Annotated[Seconds, From(env="FAIRGATE_KEY_RATE_PER_S")] = Field(
        default=_D.key_rate_per_s,
        ge=0,
        le=1_000_000,
        description="Requests a second per client key, in each process (0: off)",
    )
    key_rate_burst: Annotated[Whole, From(env="FAIRGATE_KEY_RATE_BURST")] = Field(
        default=_D.key_rate_burst,
        ge=1,
        le=10_000_000,
        description="Requests a client key may send at once above its rate",
    )
    max_messages: Annotated[Whole, From(env="FAIRGATE_MAX_MESSAGES")] = Field(
        default=_D.max_messages, ge=1, le=10_000_000, description="Messages per request"
    )
    max_message_bytes: Annotated[Whole, From(env="FAIRGATE_MAX_MESSAGE_BYTES")] = Field(
        default=_D.max_message_bytes, ge=1, le=1 << 40, description="Bytes of one message's content"
    )
    thread_parse_bytes: Annotated[Whole, From(env="FAIRGATE_THREAD_PARSE_BYTES")] = Field(
        default=_D.thread_parse_bytes,
        ge=0,
        le=1 << 40,
        description="Bodies this large or larger are parsed and checked off the event loop",
    )
    metrics_key: Annotated[str | None, From(env="FAIRGATE_METRICS_KEY")] = Field(
        default=None,
        repr=False,
        description="Set: `GET /metrics` wants `Authorization: Bearer <key>`; unset: loopback "
        "clients only",
    )
    metrics_public: Annotated[bool, From(env="FAIRGATE_METRICS_PUBLIC")] = Field(
        default=False, description="true: `/metrics` open to anyone"
    )
    allowed_hosts: Annotated[
        str | None, From(env="FAIRGATE_ALLOWED_HOSTS"), BeforeValidator(_host_names)
    ] = Field(
        default=None,
        description="Host names a request's Host may name, comma separated (`*`: any); unset: "
        "the loopback names and the bind address when bound to loopback, else any",
    )
    admin_free_failures: Annotated[Whole, From(env="FAIRGATE_ADMIN_FREE_FAILURES")] = Field(
        default=_D.admin_free_failures,
        ge=0,
        le=1000,
        description="Wrong admin keys from one address before the backoff starts",
    )
    admin_backoff_s: Annotated[Seconds, From(env="FAIRGATE_ADMIN_BACKOFF_S")] = Field(
        default=_D.admin_backoff_s,
        ge=0.01,
        le=3600,
        description="The first admin lockout in seconds; it doubles per further failure",
    )
    admin_backoff_max_s: Annotated[Seconds, From(env="FAIRGATE_ADMIN_BACKOFF_MAX_S")] = Field(
        default=_D.admin_backoff_max_s, ge=0.01, le=_DAY, description="The longest admin lockout"
    )
    trusted_proxies: Annotated[str, From(env="FORWARDED_ALLOW_IPS")] = Field(
        default=_D.trusted_proxies,
        description="Peers whose X-Forwarded-For and -Proto name the client (addresses, networks "
        "or `*`; uvicorn's own variable, kept)",
    )

    def limits(self, bind: str | None = None) -> HttpSettings:
        """The edge's limits for a server bound to ``bind`` (the allowed-hosts default depends
        on it; None: no host check unless configured)."""
        values = self.model_dump(exclude={"allowed_hosts"})
        return HttpSettings(**values, allowed_hosts=_allowed_hosts(self.allowed_hosts or "", bind))


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
        return None if "*" in names else frozenset(names)
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
