"""Account limits the provider states, through the whole request path (issue 12):

- OpenAI's ``x-ratelimit-*`` (remaining 0, reset ``6m0s``) puts the connection behind the
  other member of its pool until the stated reset;
- Codex's 429 ``usage_limit_reached`` (``resets_at`` / ``resets_in_seconds``, the body the
  ChatGPT backend sends and the Codex CLI parses) marks the account saturated until that reset
  — days for a weekly window, beyond the one-hour cap of a resilience cooldown — the pool
  routes to the other connection, and when none is left the key gets a 429 with Retry-After.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
from inproc_support import base_config, conn, gateway

from fairgate.clock import ManualClock
from fairgate.mock.codex import CodexWindows, responses_events
from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat
from fairgate.timers import ManualTimer

HOUR = 3_600_000
#: one listed model: a pool's members share it through quota-share routing (a "*" connection
#: serves any model, but no per-model pool combo is minted for it)
MODEL = "gpt-5-codex"


def _pool(members: list[str], dimensions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "p",
        "connections": members,
        "dimensions": dimensions,
        "allocations": [{"key": "alice", "weight": 50}, {"key": "bob", "weight": 50}],
    }


async def test_openai_ratelimit_headers_move_the_connection_back_until_the_reset(
    tmp_path: Path,
) -> None:
    timer = ManualTimer()
    remaining = {"c1": "0"}

    async def handler(req: UpstreamRequest) -> Reply:
        reply = openai_chat(f"from {req.conn.id}", model="gpt-4o")
        return replace(
            reply,
            headers={
                "x-ratelimit-limit-requests": "10000",
                "x-ratelimit-remaining-requests": "9999",
                "x-ratelimit-reset-requests": "6ms",
                "x-ratelimit-limit-tokens": "30000",
                "x-ratelimit-remaining-tokens": remaining.get(req.conn.id, "29000"),
                "x-ratelimit-reset-tokens": "6m0s",
            },
        )

    cfg = base_config(
        [conn("c1", "openai", models=(MODEL,), weight=100), conn("c2", "openai", models=(MODEL,))],
        pools=[_pool(["c1", "c2"], [{"unit": "requests", "window": "hourly", "limit": 10_000}])],
    )
    cfg["server"] = {"default_provider": "openai"}
    async with gateway(tmp_path, cfg, timer, handler) as h:
        assert (await h.chat(MODEL)).status_code == 200
        assert h.sent_to == ["c1"]  # the heavier member first; it says: tokens used up
        assert h.svc.signals.buckets.buckets("c1")[f"tokens:{MODEL}"].saturated
        timer.clock.advance(1_000)  # (headers are read at most once a second per connection)
        assert (await h.chat(MODEL)).status_code == 200
        assert h.sent_to[-1] == "c2"
        remaining["c1"] = "29000"
        timer.clock.advance(358_000)  # 5m59s after the reading: still within 6m0s
        assert (await h.chat(MODEL)).status_code == 200
        assert h.sent_to[-1] == "c2"
        timer.clock.advance(1_000)  # the stated reset passed
        assert (await h.chat(MODEL)).status_code == 200
        assert h.sent_to[-1] == "c1"


def _sse(events: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
    return [
        f"event: {name}\ndata: {orjson.dumps(data).decode()}\n\n".encode() for name, data in events
    ]


class CodexAccounts:
    """The mock's Codex windows per connection (its documented headers and 429 body)."""

    def __init__(self, clock: ManualClock) -> None:
        self.windows = {c: CodexWindows(clock, percent_per_1k_tokens=1.0) for c in ("x1", "x2")}

    async def handler(self, req: UpstreamRequest) -> Reply:
        w = self.windows[req.conn.id]
        full = w.exhausted()
        if full is not None:
            return Reply(429, w.limit_error(full), headers=w.headers())
        w.use(1_000)
        events = responses_events("resp_1", "gpt-5-codex", 0, [f"from {req.conn.id}"], 600, 400)
        return Reply(
            200,
            headers={"content-type": "text/event-stream", **w.headers()},
            chunks=_sse(events),
        )


async def test_codex_usage_limit_reached_saturates_until_the_reset_then_429(
    tmp_path: Path,
) -> None:
    timer = ManualTimer()
    accounts = CodexAccounts(timer.clock)
    week = accounts.windows["x1"].secondary
    week.add(timer.clock.now_ms(), 100.0)  # x1's weekly window is full: reset in 7 days
    assert week.reset_at_ms is not None
    cfg = base_config(
        [
            conn(
                "x1",
                "codex",
                models=(MODEL,),
                weight=100,
                base_url="http://x1.invalid/backend-api/codex",
            ),
            conn("x2", "codex", models=(MODEL,), base_url="http://x2.invalid/backend-api/codex"),
        ],
        pools=[
            _pool(
                ["x1", "x2"],
                [
                    {"unit": "percent", "window": "5h", "limit": 100},
                    {"unit": "percent", "window": "weekly", "limit": 100},
                ],
            )
        ],
    )
    cfg["server"] = {"default_provider": "codex"}
    async with gateway(tmp_path, cfg, timer, accounts.handler) as h:
        r = await h.chat(MODEL)
        assert r.status_code == 200, r.text
        assert h.sent_to == ["x1", "x2"]  # refused by x1 (usage_limit_reached): served by x2
        state = h.svc.signals.buckets.buckets("x1")["limit"]
        assert state.reset_ms == week.reset_at_ms  # resets_at, to the second
        # beyond any cooldown (capped at one hour): x2 first, x1 not even tried
        timer.clock.advance(2 * HOUR)
        r = await h.chat(MODEL, key="fg-bob-secret-0123456789")
        assert r.status_code == 200, r.text
        assert h.sent_to[2:] == ["x2"]

        # x2's 5-hour window fills up too: nothing is left
        accounts.windows["x2"].primary.add(timer.clock.now_ms(), 100.0)
        r = await h.chat(MODEL)
        assert r.status_code == 429, r.text
        retry = int(r.headers["retry-after"])
        x2_reset = accounts.windows["x2"].primary.reset_at_ms
        assert x2_reset is not None
        # the soonest stated reset (x2's 5 hours, not x1's week), from the 429 bodies
        assert retry == math.ceil((x2_reset - timer.clock.now_ms()) / 1000)
        assert r.json()["diagnostics"]["recoveryHint"]["retry_after_seconds"] == retry
        assert "x1" not in r.text
        assert "x2" not in r.text

        # x1's week resets: it serves again
        timer.clock.advance(week.reset_at_ms - timer.clock.now_ms())
        r = await h.chat(MODEL)
        assert r.status_code == 200, r.text
        assert h.sent_to[-1] == "x1"
