"""Request checks of the HTTP edge that need no socket (issue 19): the cheap refusals come
before the walks over the body, and a flooding key is refused before its body is parsed.

Moved from ``tests/e2e/test_http_limits.py`` (a gateway process each); the wire limits (header
sizes, deadlines, connection caps, a large body off the event loop) stay there."""

from __future__ import annotations

from pathlib import Path

import orjson
from inproc_support import ALICE, BOB, MockUpstream, base_config, conn, gateway

from fairgate.timers import ManualTimer


def _chat(messages: list[object], model: str = "m") -> bytes:
    return orjson.dumps({"model": model, "messages": messages, "max_tokens": 4})


async def test_an_oversized_message_is_a_400_naming_it(tmp_path: Path) -> None:
    env = {"FAIRGATE_MAX_MESSAGE_BYTES": "1000"}
    cfg = base_config([conn("c1")])
    async with gateway(tmp_path, cfg, ManualTimer(), MockUpstream(), env=env) as h:
        body = _chat([{"role": "user", "content": "hi"}, {"role": "user", "content": "x" * 1001}])
        r = await h.client.post(
            "/v1/chat/completions", content=body, headers={"authorization": f"Bearer {ALICE}"}
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "messages[1].content"
        assert h.sent_to == []


async def test_a_model_the_key_may_not_use_is_refused_before_validation(tmp_path: Path) -> None:
    """The body is invalid too (messages[3] is a number): the 403 comes first, so the gateway
    spent nothing on walking its messages."""
    cfg = base_config([conn("c1"), conn("claude-1", "anthropic", models=("claude-sonnet-4",))])
    cfg["keys"][0]["allowed_models"] = ["claude-sonnet-4"]
    async with gateway(tmp_path, cfg, ManualTimer(), MockUpstream()) as h:
        msgs: list[object] = [{"role": "user", "content": "hi"}] * 5000
        msgs[3] = 5
        auth = {"authorization": f"Bearer {ALICE}"}
        r = await h.client.post("/v1/chat/completions", content=_chat(msgs), headers=auth)
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "model_not_allowed"
        # the same body for its model: now validation speaks
        r = await h.client.post(
            "/v1/chat/completions", content=_chat(msgs, "claude-sonnet-4"), headers=auth
        )
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "messages[3]"


async def test_a_flooding_key_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    """The per-key rate guard: a burst of 3, then 429 ``key_rate_limited`` -- even for a body
    that is not JSON at all (the guard runs before the body is read); other keys go on."""
    env = {"FAIRGATE_KEY_RATE_PER_S": "0.01", "FAIRGATE_KEY_RATE_BURST": "3"}
    cfg = base_config([conn("c1")])
    async with gateway(tmp_path, cfg, ManualTimer(), MockUpstream(), env=env) as h:

        async def post(secret: str, content: bytes) -> int:
            r = await h.client.post(
                "/v1/chat/completions",
                content=content,
                headers={"authorization": f"Bearer {secret}"},
            )
            return r.status_code

        ok = _chat([{"role": "user", "content": "hi"}])
        assert [await post(ALICE, ok) for _ in range(3)] == [200, 200, 200]
        auth = {"authorization": f"Bearer {ALICE}"}
        r = await h.client.post("/v1/chat/completions", content=b"{not json", headers=auth)
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "key_rate_limited"
        assert int(r.headers["retry-after"]) >= 1
        assert await post(BOB, ok) == 200
