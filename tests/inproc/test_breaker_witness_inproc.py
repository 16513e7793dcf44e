"""Issue 43, N3: one tenant cannot open the provider-wide breaker for every pool.

Alice sends long generations (``max_tokens: 4000``) that run into the upstream timeout of 3 s
on her connection; Bob uses his own connection of the same provider. Before the fix Alice's
timeouts opened the provider's breaker and Bob got 503. Now a failure the request explains
fails that request only; the breaker needs a second key's witness, or a failure no request
explains (a quick 500 on a small request still opens it on one key's word)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inproc_support import ALICE, BOB, base_config, conn, gateway

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


async def test_one_keys_long_generations_do_not_open_the_breaker_for_another_pool(
    tmp_path: Path,
) -> None:
    timer = ManualTimer()
    up = Upstream(timer)
    async with gateway(tmp_path, two_connections(), timer, up, env=NO_COOLDOWN) as h:
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
    timer = ManualTimer()
    up = Upstream(timer)
    async with gateway(tmp_path, two_connections(), timer, up) as h:
        for _ in range(3):
            await h.chat("ma", key=ALICE, max_tokens=4000)
        assert [r.conn.id for r in h.upstream.requests] == ["conn-a"] * 3
        assert (await h.gw.resilience.snapshot())["cooldowns"] == []


async def test_a_second_key_witnessing_opens_the_breaker(tmp_path: Path) -> None:
    timer = ManualTimer()
    up = Upstream(timer)
    async with gateway(tmp_path, two_connections(), timer, up, env=NO_COOLDOWN) as h:
        for _ in range(5):
            await h.chat("ma", key=ALICE, max_tokens=4000)
        assert (await breaker(h))["state"] == "closed"
        await h.chat("ma", key=BOB, max_tokens=4000)  # Bob sees it too: the provider's
        assert (await breaker(h))["state"] == "open"


async def test_a_failure_no_request_explains_still_opens_it_on_one_key(tmp_path: Path) -> None:
    timer = ManualTimer()
    up = Upstream(timer)
    up.quick_500 = True
    async with gateway(tmp_path, two_connections(), timer, up, env=NO_COOLDOWN) as h:
        for _ in range(5):
            r = await h.chat("ma", key=ALICE, max_tokens=20)
            assert r.status_code >= 500
            timer.advance(200)
        assert (await breaker(h))["state"] == "open"


async def test_a_timeout_the_bound_cannot_explain_is_provider_evidence(tmp_path: Path) -> None:
    """``max_tokens: 20`` takes well under 3 s on any healthy provider: its timeout is the
    provider's, and opens the breaker on one key."""
    timer = ManualTimer()
    up = Upstream(timer)
    async with gateway(tmp_path, two_connections(), timer, up, env=NO_COOLDOWN) as h:
        for _ in range(5):
            await h.chat("ma", key=ALICE, max_tokens=20)
        assert (await breaker(h))["state"] == "open"
