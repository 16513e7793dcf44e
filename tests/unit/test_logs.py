"""Structured logs: one JSON object per event, the request id from the context, and redaction of
everything that looks like a secret, wherever in the record it hides."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fairgate.process.logs import (
    REDACTOR,
    REQUEST_ID,
    JsonFormatter,
    RedactingFilter,
    Redactor,
    _RequestIds,
    configure_logging,
    new_request_id,
    request_id_of,
)

CLIENT_KEY = "fg-" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789_-xy"
PROVIDER_KEY = "sk-proj-0123456789abcdefABCDEF"
CONFIGURED = "upstream-very-secret-value"


@pytest.fixture
def capture() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    redactor = Redactor()
    redactor.add_secrets([CONFIGURED, "short"])
    handler.setFormatter(JsonFormatter(redactor))
    handler.addFilter(RedactingFilter(redactor))
    logger = logging.getLogger("fairgate.test.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, stream
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def events(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        (f"key {CLIENT_KEY} used", CLIENT_KEY),
        (f"provider said {PROVIDER_KEY}", PROVIDER_KEY),
        ("Authorization: Bearer abc.def-ghi", "abc.def-ghi"),
        ("redis://user:hunter2pass@db:6379/0", "hunter2pass"),
        ("redis://:hunter2pass@db:6379/0", "hunter2pass"),
        ('{"api_key": "plain-value-123"}', "plain-value-123"),
        ("x-api-key=plain-value-123&x=1", "plain-value-123"),
        (f"the secret is {CONFIGURED}!", CONFIGURED),
    ],
)
def test_redactor_masks_secret_shapes(text: str, hidden: str) -> None:
    r = Redactor()
    r.add_secrets([CONFIGURED])
    out = r(text)
    assert hidden not in out
    assert "[redacted]" in out


def test_redactor_keeps_ordinary_text() -> None:
    r = Redactor()
    r.add_secrets(["short"])  # too short to mask verbatim: it would garble ordinary words
    text = "pool demo: 12 of 20 requests, key alice (prefix fg-AbCd), max_tokens=5, short"
    assert r(text) == text


def test_redactor_source_is_read_live() -> None:
    r = Redactor()
    live: list[str] = []
    r.set_source(lambda: live)
    assert r("added-later-secret") == "added-later-secret"
    live.append("added-later-secret")
    assert r("x added-later-secret y") == "x [redacted] y"


def test_one_json_object_per_event_with_extras_and_request_id(
    capture: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = capture
    logger.info("outside a request", extra={"pool": "p"})
    token = REQUEST_ID.set("rid-1")
    try:
        logger.warning(
            "upstream error", extra={"connection": "mock-1", "status": 500, "tags": ["a", "b"]}
        )
    finally:
        REQUEST_ID.reset(token)
    first, second = events(stream)
    assert first["msg"] == "outside a request"
    assert first["pool"] == "p"
    assert first["level"] == "info"
    assert first["logger"] == "fairgate.test.logs"
    assert "request_id" not in first
    assert str(first["ts"]).endswith("Z")
    assert second == {
        "ts": second["ts"],
        "level": "warning",
        "logger": "fairgate.test.logs",
        "msg": "upstream error",
        "request_id": "rid-1",
        "connection": "mock-1",
        "status": 500,
        "tags": ["a", "b"],
    }


def test_secrets_are_masked_in_message_args_extras_and_tracebacks(
    capture: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = capture
    logger.info("key %s and %s", CLIENT_KEY, PROVIDER_KEY)
    logger.info("extra", extra={"header": f"Bearer {CLIENT_KEY}", "nested": {"k": [CONFIGURED]}})
    try:
        raise ValueError(f"bad secret {CONFIGURED}")
    except ValueError:
        logger.exception("failed")
    out = stream.getvalue()
    for secret in (CLIENT_KEY, PROVIDER_KEY, CONFIGURED):
        assert secret not in out
    first, second, third = events(stream)
    assert first["msg"] == "key fg-[redacted] and sk-[redacted]"
    assert second["header"] == "Bearer [redacted]"
    assert second["nested"] == {"k": ["[redacted]"]}
    assert "ValueError: bad secret [redacted]" in str(third["exc"])


def test_request_id_that_is_a_secret_is_masked(
    capture: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = capture
    token = REQUEST_ID.set(CLIENT_KEY)
    try:
        logger.info("blocked")
    finally:
        REQUEST_ID.reset(token)
    assert CLIENT_KEY not in stream.getvalue()


def test_configure_logging_replaces_its_own_handler() -> None:
    root = logging.getLogger()
    saved_level = root.level
    stream = io.StringIO()
    try:
        first = configure_logging("INFO", stream=io.StringIO())
        second = configure_logging("DEBUG", stream=stream, secrets=["configured-secret-1"])
        assert first not in root.handlers
        assert second in root.handlers
        logging.getLogger("fairgate.test.cfg").debug("with configured-secret-1 inside")
        (event,) = events(stream)
        assert event["msg"] == "with [redacted] inside"
    finally:
        for h in list(root.handlers):
            if getattr(h, "_fairgate_handler", False):
                root.removeHandler(h)
        root.setLevel(saved_level)
        REDACTOR.set_source(None)


# -- request ids ---------------------------------------------------------------------------

_ID_SCRIPT = (
    "from fairgate.process.logs import new_request_id\n"
    "print('\\n'.join(new_request_id() for _ in range(2000)))\n"
)


def _ids_of_a_process() -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", _ID_SCRIPT], check=True, capture_output=True, text=True
    ).stdout
    return out.split()


def test_request_ids_are_16_hex_digits_and_unique_across_batches() -> None:
    ids = [new_request_id() for _ in range(3 * _RequestIds.BATCH + 7)]
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)
    assert len(set(ids)) == len(ids)


def test_request_ids_of_two_processes_never_meet() -> None:
    first, second = _ids_of_a_process(), _ids_of_a_process()
    assert len(first) == len(second) == 2000
    assert not set(first) & set(second)
    assert len(set(first)) == len(first)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_draws_ids_of_its_own() -> None:
    new_request_id()  # the parent holds a drawn batch now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the ids it hands out next, then leave at once
        try:
            os.write(write, " ".join(new_request_id() for _ in range(20)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = f.read().split()
    os.waitpid(pid, 0)
    parent = [new_request_id() for _ in range(20)]
    assert len(child) == 20
    assert not set(child) & set(parent)


def test_a_sane_incoming_id_is_kept_and_anything_else_replaced() -> None:
    assert request_id_of("trace-1:abc.DEF_2") == "trace-1:abc.DEF_2"
    # headers arrive latin-1 decoded: a non-ASCII byte is a non-ASCII character here
    for bad in ("", "has space", "x" * 129, b"\xff\xfe".decode("latin-1"), "semi;colon"):
        fresh = request_id_of(bad)
        assert fresh != bad
        assert len(fresh) == 16
    assert len(request_id_of(None)) == 16
