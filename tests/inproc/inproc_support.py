"""The gateway's ASGI app run in the test's event loop over an in-process upstream.

Everything but the provider is real: the Starlette app and its lifespan, the metadata DB and
the SQLite quota store in ``tmp_path``, admission, routing, resilience, translation. The
upstream is a :class:`~fairgate.providers.inprocess.HandlerUpstream`; the clock is a
:class:`~fairgate.timers.ManualTimer` the test moves (a wait in the request path wakes when
the test advances it past the deadline, never by sleeping).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import orjson

from fairgate.clock import Clock
from fairgate.config import parse_config
from fairgate.mock.faults import (
    Fault,
    Limits,
    RateWindow,
    Wire,
    error_200_body,
    exhausted_headers,
    parse_fault,
    rate_limit_headers,
    status_fault,
    unknown_field_error,
)
from fairgate.path.call import Services
from fairgate.process.state import Gateway
from fairgate.providers.inprocess import (
    Handler,
    HandlerUpstream,
    Reply,
    UpstreamRequest,
    anthropic_message,
    openai_chat,
)
from fairgate.server.app import create_app
from fairgate.store.sqlite.store import SqliteQuotaStore
from fairgate.timers import ManualTimer

ALICE = "fg-alice-secret-0123456789"
BOB = "fg-bob-secret-0123456789"
UPSTREAM_SECRET = "upstream-secret-abcdef"
ADMIN_KEY = "fg-admin-inproc-key-0123456789abcdef"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


def conn(
    cid: str, provider: str = "mock", *, models: tuple[str, ...] = ("m",), **kw: Any
) -> dict[str, Any]:
    return {
        "id": cid,
        "provider": provider,
        "base_url": f"http://{cid}.invalid/v1",
        "secret": f"{UPSTREAM_SECRET}-{cid}",
        "models": list(models),
        **kw,
    }


def target(connection: str, model: str = "m", provider: str = "mock", **kw: Any) -> dict[str, Any]:
    """A combo target: ``model`` of ``provider`` on ``connection``, with the target fields
    ``kw`` (camelCase, as the admin API takes them: ``priceIn``, ``contextWindow``)."""
    return {"provider": provider, "model": model, "connection": connection, **kw}


def combo(
    name: str,
    conns: list[str | dict[str, Any]],
    model: str = "m",
    strategy: str = "priority",
    **config: Any,
) -> dict[str, Any]:
    """A combo over ``conns`` in that order, with ``config`` (camelCase, as the admin API takes
    it) when any is given. A connection id stands for the mock target serving ``model``; a
    target of another provider, model or fields is given whole, as :func:`target` makes it."""
    targets = [target(c, model) if isinstance(c, str) else c for c in conns]
    return {"name": name, "strategy": strategy, "targets": targets} | (
        {"config": config} if config else {}
    )


def base_config(
    connections: list[dict[str, Any]],
    *,
    combos: list[dict[str, Any]] | None = None,
    pools: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    # every key may use the connections outside every pool (their providers are listed); a
    # pooled one needs an allocation (server.require_allocation, on by default)
    providers = sorted({c["provider"] for c in connections})
    return {
        "connections": connections,
        "keys": [
            {"id": "alice", "name": "Alice", "secret": ALICE, "allowed_providers": providers},
            {"id": "bob", "name": "Bob", "secret": BOB, "allowed_providers": providers},
        ],
        "pools": pools or [],
        "combos": combos or [],
    }


def two_mock_members(keys: dict[str, str], pool: dict[str, Any]) -> dict[str, Any]:
    """A configuration whose default provider ``mock`` has two members (mock-1, and mock-2 at
    half weight) and one ``pool``; each of ``keys`` (id → secret) may use the provider."""
    return {
        "server": {"default_provider": "mock"},
        "connections": [
            conn("mock-1", models=("gpt-4o-mini",)),
            conn("mock-2", models=("gpt-4o-mini",), weight=0.5),
        ],
        "keys": [
            {"id": k, "name": k, "secret": s, "allowed_providers": ["mock"]}
            for k, s in keys.items()
        ],
        "pools": [pool],
    }


@dataclass
class Harness:
    gw: Gateway
    upstream: HandlerUpstream
    client: httpx.AsyncClient
    timer: ManualTimer
    svc: Services

    def set_handler(self, handler: Handler) -> None:
        self.upstream.handler = handler

    @property
    def sent_to(self) -> list[str]:
        """The connection of every upstream request, in order."""
        return [r.conn.id for r in self.upstream.requests]

    async def chat(
        self, model: str, *, key: str = ALICE, headers: dict[str, str] | None = None, **body: Any
    ) -> httpx.Response:
        payload = {"model": model, "messages": [{"role": "user", "content": "hi"}], **body}
        return await self.client.post(
            "/v1/chat/completions",
            json=payload,
            headers={"authorization": f"Bearer {key}", **(headers or {})},
        )

    async def messages(
        self, model: str, max_tokens: int, *, text: str = "hi", **body: Any
    ) -> httpx.Response:
        """An Anthropic Messages request of ``text`` by alice, as the Anthropic SDK sends it."""
        payload = {"model": model, "max_tokens": max_tokens, **body}
        payload["messages"] = [{"role": "user", "content": text}]
        return await self.client.post(
            "/v1/messages",
            json=payload,
            headers={"x-api-key": ALICE, "anthropic-version": "2023-06-01"},
        )

    async def open_reservations(self) -> int:
        """Reservations the quota store still holds (every pool), read from its SQLite file
        by a connection of our own, after the store committed what its memory mode (the
        default) holds: the file alone lags the last few milliseconds."""
        store = self.gw.engine.store
        assert isinstance(store, SqliteQuotaStore)
        await store.flush()
        with contextlib.closing(sqlite3.connect(self.gw.quota_store_path)) as db:
            return int(db.execute("SELECT COUNT(*) FROM quota_reservation").fetchone()[0])

    async def settle_background(self) -> None:
        await self.svc.drain()


async def _no_handler(req: UpstreamRequest) -> Any:
    raise AssertionError(f"no handler set; request to {req.conn.id}")


@contextlib.asynccontextmanager
async def gateway(
    tmp_path: Path,
    config: dict[str, Any],
    timer: ManualTimer,
    handler: Handler | None = None,
    *,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Harness]:
    """The app on ``config`` (the config file's shape), its admin API open to :data:`ADMIN`."""
    gw = Gateway(
        data_dir=tmp_path,
        config=parse_config(config, {}),
        env=env or {},
        clock=timer.clock,
        admin_key=ADMIN_KEY,
    )
    gw.timer = timer
    upstream = HandlerUpstream(handler or _no_handler)
    app = create_app(gw, upstream=upstream)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield Harness(gw, upstream, client, timer, app.state.services)


def failed_diagnostics(records: list[logging.LogRecord]) -> list[dict[str, Any]]:
    """The admin's full diagnostics of every failed request in ``records`` (``caplog.records``),
    oldest first: what the gateway's log line carries (a client's error body has only reason
    codes)."""
    return [r.__dict__["diagnostics"] for r in records if r.getMessage() == "request failed"]


def _last_user_text(messages: list[Any]) -> str:
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return content if isinstance(content, str) else ""
    return ""


def _sse(payload: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


def anthropic_stream(
    text: str,
    *,
    start_usage: dict[str, int] | None = None,
    delta_usage: dict[str, int] | None = None,
) -> Reply:
    """A Messages stream answering ``text`` in one delta, its usage split between
    ``message_start`` and ``message_delta`` as given (Anthropic: input in the start, output in
    the delta; some compatible providers put it all in the delta)."""
    start = {"input_tokens": 10, "output_tokens": 0} if start_usage is None else start_usage
    delta = {"output_tokens": 1} if delta_usage is None else delta_usage
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m"}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"message": {**message, "content": [], "usage": start}}),
        ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}}),
        ("content_block_stop", {"index": 0}),
        ("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": delta}),
        ("message_stop", {}),
    ]
    chunks: list[bytes | BaseException] = [_sse({"type": e, **d}, e) for e, d in events]
    return Reply(headers={"content-type": "text/event-stream"}, chunks=chunks)


def openai_stream(text: str, *, model: str = "m", finish: str | None = "stop") -> list[bytes]:
    """The SSE events of a Chat Completions stream answering ``text`` word by word (no
    finish chunk when ``finish`` is None; no content chunk for an empty ``text``)."""
    base = {"id": "chatcmpl-stream", "object": "chat.completion.chunk", "model": model}
    words = text.split(" ") if text else []
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]

    def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
        return _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    end = [chunk({}, finish), b"data: [DONE]\n\n"] if finish is not None else []
    return [
        chunk({"role": "assistant", "content": ""}, None),
        *(chunk({"content": p}, None) for p in pieces),
        *end,
    ]


class Gate:
    """An upstream whose answers wait until the test lets each one through (the hold and
    concurrency-queue tests); a request whose message is ``fail…`` is answered 400 (its
    reservation goes back: room frees)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[str, asyncio.Event]] = []

    async def handler(self, req: UpstreamRequest) -> Reply:
        tag = req.json()["messages"][0]["content"]
        ev = asyncio.Event()
        self.waiting.append((tag, ev))
        await ev.wait()
        if tag.startswith("fail"):
            return Reply(400, {"error": {"message": "bad", "type": "invalid_request_error"}})
        return openai_chat(f"done {tag}")

    @property
    def seen(self) -> list[str]:
        return [t for t, _ in self.waiting]

    async def until(self, n: int) -> None:
        for _ in range(10_000):
            if len(self.waiting) >= n:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"expected {n} upstream requests, have {self.seen}")

    def let_through(self, tag: str) -> None:
        for t, ev in self.waiting:
            if t == tag:
                ev.set()


@dataclass
class MockUpstream:
    """A handler that answers like the mock provider (``fairgate mock-upstream``), for tests
    moved from subprocess e2e: every request takes the fault of its ``x-mock-fault`` header,
    else the next fault of :meth:`schedule` (the mock's spec language and error bodies,
    ``mock/faults.py``), else it answers in its route's shape with "mock reply:" and
    the words of the last user message, about one prompt token per four characters.
    ``latency``/``timeout`` faults hold the request until the test sets :attr:`release` (or
    the gateway gives up on it); :attr:`holding` tells a test one is held.

    With :attr:`requests_limit` set, answers carry the mock's rate-limit headers (per minute
    of ``clock``, every connection counted together, as one mock process behind several
    connections), plus Anthropic's unified 5-hour reading :attr:`unified_5h` when set. With
    :attr:`reject_unknown_fields` (the mock's echoing mode) a body field the real API does not
    know is refused with the provider's 400, which repeats the field's name."""

    faults: list[Fault] = field(default_factory=list)
    requests: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    #: set once a request is held by a ``latency``/``timeout`` fault
    holding: asyncio.Event = field(default_factory=asyncio.Event)
    requests_limit: int | None = None
    unified_5h: float | None = None
    clock: Clock | None = None
    window: RateWindow = field(default_factory=RateWindow)
    reject_unknown_fields: bool = False

    def schedule(self, *specs: str) -> None:
        self.faults.extend(parse_fault(s) for s in specs)

    async def __call__(self, req: UpstreamRequest) -> Reply:
        self.requests += 1
        wire: Wire = "anthropic" if req.path.endswith("/messages") else "openai"
        request_id = f"req_{self.requests}"
        if self.reject_unknown_fields:
            echoed = unknown_field_error(wire, "/v1" + req.path, req.json(), request_id)
            if echoed is not None:
                return Reply(400, echoed)
        header = req.headers.get("x-mock-fault", "").strip()  # wins, as in the mock
        fault = parse_fault(header or "ok") if header or not self.faults else self.faults.pop(0)
        if fault.is_status:
            now_s = 0.0 if self.clock is None else self.clock.now_ms() / 1000
            status, body, headers = status_fault(fault, wire, request_id, now_s)
            if status == 429 and fault.kind != "quota" and self.requests_limit is not None:
                headers.update(exhausted_headers(wire, now_s, self.requests_limit, fault.value))
            return Reply(status, body, headers=headers)
        if fault.kind in ("latency", "timeout"):
            self.holding.set()
            await self.release.wait()
        if fault.kind == "reset":
            raise ConnectionResetError("reset by the mock")
        body = req.json()
        messages = body.get("messages") or []
        words = re.findall(r"[a-z0-9]+", _last_user_text(messages).lower()) or ["hello"]
        text = "" if fault.kind in ("empty", "empty-turn") else " ".join(["mock", "reply:", *words])
        finish = None if fault.kind == "empty" else "stop"
        chars = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
        prompt, completion = max(1, -(-chars // 4)), len(text.split())
        model = str(body.get("model", "m"))
        if fault.kind == "error-200":
            err = error_200_body(wire, request_id)
            return Reply(chunks=[_sse(err)]) if body.get("stream") else Reply(200, err)
        if wire == "anthropic":
            assert body.get("stream") is not True, "MockUpstream streams the OpenAI wire only"
            reply = anthropic_message(
                text,
                model=model,
                input_tokens=prompt,
                output_tokens=completion,
                stop_reason=None if finish is None else "end_turn",
            )
        elif body.get("stream") is True:
            events: list[bytes | BaseException] = list(
                openai_stream(text, model=model, finish=finish)
            )
            if fault.kind == "reset-mid-stream":
                events = [*events[: int(fault.value)], ConnectionResetError("reset mid-stream")]
            reply = Reply(chunks=events)
        else:
            reply = openai_chat(
                text,
                model=model,
                prompt_tokens=prompt,
                completion_tokens=completion,
                finish_reason=finish,
            )
        return replace(reply, headers=self._signals(wire, prompt, completion))

    def _signals(self, wire: Wire, prompt: int, completion: int) -> dict[str, str]:
        """The mock's rate-limit headers for one more answer (none without a limit)."""
        if self.requests_limit is None:
            return {}
        assert self.clock is not None, "rate-limit headers need the clock"
        now_s = self.clock.now_ms() / 1000
        self.window.record(now_s, prompt, completion)
        unified = {"5h": (self.unified_5h, 3600.0)}
        limits = Limits(self.requests_limit, 1_000_000, unified)
        return rate_limit_headers(wire, now_s, limits, self.window.totals(now_s))
