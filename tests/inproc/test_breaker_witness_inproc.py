"""Issue 43, N3: one tenant cannot open the provider-wide breaker for every pool.

Alice sends long generations (``max_tokens: 4000``) that run into the upstream timeout of 3 s
on her connection; Bob uses his own connection of the same provider. Before the fix Alice's
timeouts opened the provider's breaker and Bob got 503. Now a failure the request explains
fails that request only; the breaker needs a second key's witness, or a failure no request
explains (a quick 500 on a small request still opens it on one key's word)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
from inproc_support import ALICE, BOB, base_config, conn, gateway, openai_stream

from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat
from fairgate.timers import ManualTimer

TIMEOUT_MS = 3_000
#: No connection cooldown between the attempts, so every one reaches the upstream and the
#: breaker alone decides (a cooldown would otherwise keep Alice's later requests home).
NO_COOLDOWN = {"RESILIENCE_APIKEY_BASE_COOLDOWN_MS": "0"}


def two_connections() -> dict[str, Any]:
    """One provider, two accounts: Alice's model on conn-a, Bob's on conn-b."""
    return base_config([conn("conn-a", models=("ma",)), conn("conn-b", models=("mb",))])


class Upstream:
    """conn-a: each request takes ``TIMEOUT_MS`` and then times out (or answers 500 at once when
    ``quick_500``); conn-b answers."""

    def __init__(self, timer: ManualTimer) -> None:
        self.timer = timer
        self.quick_500 = False

    async def __call__(self, req: UpstreamRequest) -> Reply:
        if req.conn.id == "conn-b":
            return openai_chat("fine", model="mb")
        if self.quick_500:
            return Reply(500, {"error": {"message": "internal", "type": "server_error"}})
        self.timer.advance(TIMEOUT_MS)  # the generation runs until the upstream timeout
        raise TimeoutError("read timed out")


async def breaker(h: Any) -> dict[str, Any]:
    snap = await h.gw.resilience.snapshot()
    return dict(snap["breakers"]["mock"])


def _witnessed(
    tmp_path: Path, *, env: dict[str, str] | None = NO_COOLDOWN, quick_500: bool = False
) -> Any:
    """A gateway on a manual timer in front of the two connections, conn-a failing as
    :class:`Upstream` says (``quick_500``: at once); ``env`` its settings."""
    timer = ManualTimer()
    up = Upstream(timer)
    up.quick_500 = quick_500
    return gateway(tmp_path, two_connections(), timer, up, env=env)


async def test_one_keys_long_generations_do_not_open_the_breaker_for_another_pool(
    tmp_path: Path,
) -> None:
    async with _witnessed(tmp_path) as h:
        for _ in range(6):
            r = await h.chat("ma", key=ALICE, max_tokens=4000)
            assert r.status_code >= 500  # Alice's own request fails
        assert (await breaker(h))["state"] == "closed"
        assert (await breaker(h))["failures"] == 6  # counted, but one key's word only
        r = await h.chat("mb", key=BOB, max_tokens=50)
        assert r.status_code == 200, r.text


async def test_a_timeout_the_request_explains_cools_no_connection_down(tmp_path: Path) -> None:
    """The account is fine; the request was long: every one of Alice's requests reaches it
    (no cooldown), and the next key on that connection is not turned away."""
    async with _witnessed(tmp_path, env=None) as h:
        for _ in range(3):
            await h.chat("ma", key=ALICE, max_tokens=4000)
        assert [r.conn.id for r in h.upstream.requests] == ["conn-a"] * 3
        assert (await h.gw.resilience.snapshot())["cooldowns"] == []


async def test_a_second_key_witnessing_opens_the_breaker(tmp_path: Path) -> None:
    async with _witnessed(tmp_path) as h:
        for _ in range(5):
            await h.chat("ma", key=ALICE, max_tokens=4000)
        assert (await breaker(h))["state"] == "closed"
        await h.chat("ma", key=BOB, max_tokens=4000)  # Bob sees it too: the provider's
        assert (await breaker(h))["state"] == "open"


async def test_a_failure_no_request_explains_still_opens_it_on_one_key(tmp_path: Path) -> None:
    async with _witnessed(tmp_path, quick_500=True) as h:
        for _ in range(5):
            r = await h.chat("ma", key=ALICE, max_tokens=20)
            assert r.status_code >= 500
            h.timer.advance(200)
        assert (await breaker(h))["state"] == "open"


async def test_a_timeout_the_bound_cannot_explain_is_provider_evidence(tmp_path: Path) -> None:
    """``max_tokens: 20`` takes well under 3 s on any healthy provider: its timeout is the
    provider's, and opens the breaker on one key."""
    async with _witnessed(tmp_path) as h:
        for _ in range(5):
            await h.chat("ma", key=ALICE, max_tokens=20)
        assert (await breaker(h))["state"] == "open"


class StalledReader:
    """The ASGI server's side of a client that sends its request, reads the answer's head and
    first chunk, then stops reading without closing the connection."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.asked = False
        self.sent: list[dict[str, Any]] = []
        self.stalled = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if not self.asked:
            self.asked = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await asyncio.Event().wait()  # connected, silent
        raise AssertionError("unreachable")

    async def send(self, message: dict[str, Any]) -> None:
        if len(self.sent) >= 2:
            self.stalled.set()
            await asyncio.Event().wait()  # the socket buffer is full: never read
        self.sent.append(message)


async def test_a_client_that_stalls_a_stream_frees_it_and_blames_no_one_upstream(
    tmp_path: Path,
) -> None:
    """The send deadline (``FAIRGATE_HTTP_SEND_TIMEOUT_S``): a stream whose client stopped
    reading is closed after it; the upstream request is released, the reservation settled,
    and nothing is counted against the provider or the connection."""
    timer = ManualTimer()
    upstream_answers: list[Any] = []

    async def handler(req: UpstreamRequest) -> Reply:
        reply = Reply(chunks=openai_stream("word " * 200, model="ma"))
        upstream_answers.append(reply)
        return reply

    env = {"FAIRGATE_HTTP_SEND_TIMEOUT_S": "10"}
    async with gateway(tmp_path, two_connections(), timer, handler, env=env) as h:
        body = orjson.dumps(
            {"model": "ma", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        )
        client = StalledReader(body)
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
            "query_string": b"",
            "headers": [
                (b"host", b"gw"),
                (b"authorization", f"Bearer {ALICE}".encode()),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
            "client": ("127.0.0.1", 5000),
            "server": ("gw", 80),
        }
        app = h.client._transport.app  # type: ignore[attr-defined]
        serving = asyncio.ensure_future(app(scope, client.receive, client.send))
        await asyncio.wait_for(client.stalled.wait(), 5)
        for _ in range(4):  # past 1.5 deadlines, in steps the watcher sleeps through
            await asyncio.sleep(0)
            timer.advance(5_000)
            for _ in range(20):
                await asyncio.sleep(0)
        await asyncio.wait_for(serving, 5)  # a guard against a hang, not a measurement
        await h.settle_background()
        assert client.sent[0]["status"] == 200
        assert await h.open_reservations() == 0
        snap = await h.gw.resilience.snapshot()
        assert snap["breakers"]["mock"]["failures"] == 0
        assert snap["cooldowns"] == []
