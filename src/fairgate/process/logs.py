"""Structured logs: one JSON event per line, a request id on every event of a request, and no
secret ever written.

Why JSON: operators ship gateway logs to a collector that indexes fields (pool, connection,
reason, request_id); one object per line needs no parsing rules. Why a contextvar for the request
id: the hot path logs from several places (admission, upstream, settlement in a background task)
and none of them should have to carry the id around; asyncio copies the context into the tasks a
request spawns, so their events carry it too.

Redaction is the last line of defence, applied to every record by a filter on the handler (so it
covers third-party loggers such as uvicorn's as well): client keys (``fg-...``), provider keys
(``sk-...``), Bearer tokens, passwords in URLs, ``key=value`` style secrets, and the exact secrets
the gateway knows (connection secrets, the admin key) are masked before a line is formatted. The
code should not log secrets in the first place; this makes a slip harmless.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any

import orjson

from fairgate.process.settings import Settings

#: The id of the request being handled (None outside a request).
REQUEST_ID: ContextVar[str | None] = ContextVar("fairgate_request_id", default=None)

HEADER = "x-request-id"
REQUEST_ID_HEADER = HEADER.encode()
#: An incoming id is echoed and logged as is, so only a short, harmless token is accepted.
_VALID_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")

MASK = "[redacted]"
#: Secrets shorter than this are not replaced verbatim: masking "abc" everywhere would garble
#: the logs and protect nothing.
MIN_SECRET_LEN = 8

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?i)\b(bearer|basic)\s+[^\s\"',;]+"), r"\1 " + MASK),
    (re.compile(r"\bfg-[A-Za-z0-9_\-]{12,}"), "fg-" + MASK),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"), "sk-" + MASK),
    # a JSON Web Token (OAuth access and id tokens) on its own, without a Bearer before it
    (re.compile(r"\beyJ[A-Za-z0-9_\-]{6,}\.[A-Za-z0-9_\-]{6,}\.[A-Za-z0-9_\-]*"), MASK),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^:/@\s]*:)[^@\s/]+@"), r"\1" + MASK + "@"),
    (
        re.compile(
            r"(?i)\b((?:x-)?(?:api[_-]?key|admin[_-]?key|secret|password|passwd|token)"
            r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;&}]+"
        ),
        r"\1" + MASK,
    ),
)

#: The attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName", "request_id"}
)


class _RequestIds:
    """Fresh request ids: 16 hex digits of the OS's randomness each, as ``os.urandom(8).hex()``
    per request gave, but the random bytes are drawn 512 ids at a time (one system call and one
    hex conversion, where there was one per request). Random rather than a counter: an id is
    echoed to the client, and a counter would tell a tenant how many requests the gateway
    serves. A forked child starts a pool of its own, so no two processes hand out the same ids.
    Used on the event loop (the edge), one caller at a time."""

    __slots__ = ("_at", "_hex")

    #: ids drawn per system call
    BATCH = 512
    #: hex digits per id (8 random bytes)
    DIGITS = 16

    def __init__(self) -> None:
        self._hex = ""
        self._at = 0

    def reset(self) -> None:
        """Forget the ids drawn (a forked child must not reuse its parent's)."""
        self._hex, self._at = "", 0

    def next(self) -> str:
        at = self._at
        if at >= len(self._hex):
            self._hex, at = os.urandom(self.BATCH * self.DIGITS // 2).hex(), 0
        self._at = at + self.DIGITS
        return self._hex[at : at + self.DIGITS]


_IDS = _RequestIds()
os.register_at_fork(after_in_child=_IDS.reset)


def new_request_id() -> str:
    """A new request id: 16 random hex digits (see :class:`_RequestIds`)."""
    return _IDS.next()


# -- redaction -----------------------------------------------------------------------------


class Redactor:
    """Masks secret-looking substrings and the exact secrets it is told about."""

    def __init__(self) -> None:
        self._secrets: tuple[str, ...] = ()
        self._source: Callable[[], Iterable[str]] | None = None

    def add_secrets(self, secrets: Iterable[str]) -> None:
        known = set(self._secrets)
        known.update(s for s in secrets if s and len(s) >= MIN_SECRET_LEN)
        # longest first: a secret that contains another is masked whole
        self._secrets = tuple(sorted(known, key=len, reverse=True))

    def set_source(self, source: Callable[[], Iterable[str]] | None) -> None:
        """Secrets that change at run time (connections added through the admin API)."""
        self._source = source

    def _current(self) -> tuple[str, ...]:
        if self._source is None:
            return self._secrets
        try:
            extra = [s for s in self._source() if s and len(s) >= MIN_SECRET_LEN]
        except Exception:  # the source reads live state; never let it break logging
            extra = []
        if not extra:
            return self._secrets
        return tuple(sorted({*self._secrets, *extra}, key=len, reverse=True))

    def __call__(self, text: str) -> str:
        for secret in self._current():
            if secret in text:
                text = text.replace(secret, MASK)
        for pattern, repl in _PATTERNS:
            text = pattern.sub(repl, text)
        return text

    def value(self, v: Any) -> Any:
        """Redact strings inside a log field (nested lists and dicts too)."""
        if isinstance(v, str):
            return self(v)
        if isinstance(v, dict):
            return {str(k): self.value(x) for k, x in v.items()}
        if isinstance(v, list | tuple | set | frozenset):
            return [self.value(x) for x in v]
        if v is None or isinstance(v, bool | int | float):
            return v
        return self(str(v))


#: The process-wide redactor the handler installed by :func:`configure_logging` uses.
REDACTOR = Redactor()


class RedactingFilter(logging.Filter):
    """Rewrites a record so that neither its message nor its extra fields hold a secret."""

    def __init__(self, redactor: Redactor = REDACTOR) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad %-format in someone's call: keep the raw text
            message = str(record.msg)
        record.msg = self.redactor(message)
        record.args = None
        for name, value in list(vars(record).items()):
            if name not in _STANDARD and not name.startswith("_"):
                setattr(record, name, self.redactor.value(value))
        return True


# -- formatting ----------------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, request_id, then the ``extra=`` fields
    (``pool``, ``connection``, ``error``, ...), then ``exc`` for a traceback."""

    def __init__(self, redactor: Redactor = REDACTOR) -> None:
        super().__init__()
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        ts = dt.datetime.fromtimestamp(record.created, dt.UTC)
        event: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or REQUEST_ID.get()
        if rid:
            event["request_id"] = self.redactor(str(rid))  # a client may send anything
        for name, value in vars(record).items():
            if name not in _STANDARD and not name.startswith("_") and name not in event:
                event[name] = value
        if record.exc_info:
            event["exc"] = self.redactor(self.formatException(record.exc_info))
        if record.stack_info:
            event["stack"] = self.redactor(self.formatStack(record.stack_info))
        return orjson.dumps(
            event, default=lambda o: self.redactor(str(o)), option=orjson.OPT_NON_STR_KEYS
        ).decode()


class TextFormatter(logging.Formatter):
    """Human-readable lines (``FAIRGATE_LOG_FORMAT=text``), with the request id if any."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        rid = REQUEST_ID.get()
        return f"{line} [request_id={rid}]" if rid else line


_HANDLER_MARK = "_fairgate_handler"


def configure_logging(
    level: str | int = "INFO",
    *,
    json: bool = True,
    secrets: Iterable[str] = (),
    stream: Any = None,
) -> logging.Handler:
    """Install the gateway's handler on the root logger (replacing one installed before).

    Every logger propagates to it: ``fairgate.*`` and third parties (uvicorn when started with
    ``log_config=None``, asyncio). Returns the handler (tests may attach it elsewhere).
    """
    REDACTOR.add_secrets(secrets)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    handler.addFilter(RedactingFilter())
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler


def configure_from_settings(settings: Settings, secrets: Iterable[str] = ()) -> None:
    """The handler as the settings say (``FAIRGATE_LOG_LEVEL``, ``FAIRGATE_LOG_FORMAT``)."""
    configure_logging(settings.log_level, json=settings.log_format == "json", secrets=secrets)


# -- request ids ---------------------------------------------------------------------------


def request_id_of(incoming: str | None) -> str:
    """The id of a request whose ``x-request-id`` header is ``incoming`` (None: absent;
    latin-1 decoded, as every header): the client's when it is a short, harmless ASCII token
    (it is echoed and logged as is), else a new one. The outermost ASGI layer
    (:mod:`fairgate.process.edge`) sets it for the logs and echoes it."""
    if incoming is not None and _VALID_ID.match(incoming):
        return incoming
    return new_request_id()
