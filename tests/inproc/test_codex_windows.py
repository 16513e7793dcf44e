"""A Codex subscription shared by keys, in process: two Codex accounts (connections) and three
keys in one pool with ``percent/5h`` and ``percent/weekly``. The upstream is the mock's Codex
model (:class:`~fairgate.mock.codex.CodexWindows`, one per account, on the test's
clock), answering on the Responses wire with its ``x-codex-*`` readings.

The readings turn the pool strict, are attributed to the keys by their tokens, block the key
over its share, and anchor the pool's windows to the provider's reset: the keys' shares roll
over exactly when the account's 5-hour window does (not when an epoch-aligned bucket turns,
nor fading as a sliding window would), and ``Retry-After`` names that moment.

Numbers: every answer is 5,000 tokens, so 5 % of its account's 5-hour window (1 % per 1,000
tokens) and 1 % of its week. The pool's limit is 2 × 100 %, each key's share a third of it.
The test's clock starts at 10:30, mid epoch bucket; the accounts' windows start at their first
use and reset 5 hours later, at 15:30.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
from inproc_support import ALICE, BOB, UPSTREAM_SECRET, gateway

from fairgate.clock import ManualClock
from fairgate.domain.units import Window
from fairgate.mock.codex import CodexWindows, responses_events
from fairgate.providers.inprocess import Reply, UpstreamRequest
from fairgate.quota.window import Anchor
from fairgate.timers import ManualTimer

T = 1_782_297_000_000  # 2026-06-24T10:30Z: 2.5 h into an epoch-aligned 5-hour bucket
CAROL = "fg-carol-secret-0123456789"
ADMIN = "a" * 32
PROMPT, COMPLETION = 4_000, 1_000
FIVE_H = Window.FIVE_HOURS.ms
SHARE = 200 / 3  # two accounts' 100 % each, split three ways


class CodexBackend:
    """The mock's Codex backend as a handler: one account per connection."""

    def __init__(self, clock: ManualClock) -> None:
        self.accounts = {
            cid: CodexWindows(clock, percent_per_1k_tokens=1.0, weekly_ratio=0.2)
            for cid in ("codex-1", "codex-2")
        }
        self.served: list[str] = []

    async def __call__(self, req: UpstreamRequest) -> Reply:
        assert req.path.endswith("/responses"), req.path
        body = req.json()
        assert body["stream"] is True  # the Codex backend streams only
        windows = self.accounts[req.conn.id]
        full = windows.exhausted()
        if full is not None:
            return Reply(429, windows.limit_error(full), headers=windows.headers())
        windows.use(PROMPT + COMPLETION)
        self.served.append(req.conn.id)
        events = responses_events(
            "resp_1", body["model"], 0, ["mock ", "reply"], PROMPT, COMPLETION
        )
        chunks = [
            b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
            for name, data in events
        ]
        return Reply(200, chunks=chunks, headers=windows.headers())


def config() -> dict[str, Any]:
    def codex(cid: str) -> dict[str, Any]:
        return {
            "id": cid,
            "provider": "codex",
            "base_url": f"http://{cid}.invalid/backend-api/codex",
            "secret": f"{UPSTREAM_SECRET}-{cid}",
            "models": ["gpt-5-codex"],
        }

    keys = [("alice", ALICE), ("bob", BOB), ("carol", CAROL)]
    return {
        "connections": [codex("codex-1"), codex("codex-2")],
        "keys": [
            {"id": k, "name": k, "secret": s, "allowed_providers": ["codex"]} for k, s in keys
        ],
        "pools": [
            {
                "id": "cx",
                "name": "Codex",
                "connections": ["codex-1", "codex-2"],
                "dimensions": [
                    {"unit": "percent", "window": "5h", "limit": 100},
                    {"unit": "percent", "window": "weekly", "limit": 100},
                ],
                "allocations": [{"key": k, "weight": 0} for k, _ in keys],  # 100/3 % each
            }
        ],
        "combos": [
            {
                "name": "codex",
                "strategy": "round-robin",
                "targets": [
                    {"provider": "codex", "model": "gpt-5-codex", "connection": c}
                    for c in ("codex-1", "codex-2")
                ],
            }
        ],
    }


async def test_codex_pool_turns_strict_blocks_by_share_and_rolls_over_at_the_providers_reset(
    tmp_path: Path,
) -> None:
    timer = ManualTimer(ManualClock(T))
    backend = CodexBackend(timer.clock)
    async with gateway(tmp_path, config(), timer, backend) as h:
        h.gw.admin_key = ADMIN
        store = h.gw.engine.store
        writes: list[str] = []  # the anchor writes: one per window that moves, no more
        real_set_anchor = store.set_anchor

        async def counting(
            pool_id: str, counter: str, window_ms: int, reset_ms: int, now_ms: int, source: str
        ) -> Anchor | None:
            writes.append(counter)
            return await real_set_anchor(pool_id, counter, window_ms, reset_ms, now_ms, source)

        store.set_anchor = counting  # type: ignore[method-assign]

        async def ask(secret: str) -> Any:
            r = await h.chat("codex", key=secret)
            await h.settle_background()
            timer.advance(1_100)  # readings are taken at most once a second per connection
            return r

        async def usage() -> dict[str, Any]:
            r = await h.client.get(
                "/api/quota/pools/cx/usage", headers={"authorization": f"Bearer {ADMIN}"}
            )
            assert r.status_code == 200, r.text
            return {d["key"]: d for d in r.json()["dimensions"]}

        def consumed(u: dict[str, Any], dim: str) -> dict[str, float]:
            return {k["keyId"]: k["consumed"] for k in u[dim]["keys"]}

        # bob and carol use a little, alice the rest until the pool is strict and she is over
        for secret in (BOB, CAROL, BOB, CAROL):
            assert (await ask(secret)).status_code == 200
        blocked = None
        for _ in range(40):
            r = await ask(ALICE)
            if r.status_code == 429:
                blocked = r
                break
            assert r.status_code == 200, r.text
        assert blocked is not None, "alice was never blocked"
        assert set(backend.served) == {"codex-1", "codex-2"}  # both accounts were used
        err = blocked.json()["error"]
        assert (err["reason"], err["dimension"]) == ("fair-share", "percent/5h")

        # the pool's windows follow the accounts' own: codex-1 reported first (its first use
        # was at 10:30), so its reset anchors the pool; codex-2's, 1.1 s later, is the same
        # window within the tolerance and leaves it be
        first = backend.accounts["codex-1"]
        reset_5h = first.primary.reset_at_ms
        reset_week = first.secondary.reset_at_ms
        assert reset_5h == T + FIVE_H
        assert reset_week is not None
        u = await usage()
        assert u["percent/5h"]["anchorSource"] == "codex-1"
        assert u["percent/5h"]["resetsAtMs"] == reset_5h
        assert u["percent/weekly"]["resetsAtMs"] == reset_week
        assert u["percent/5h"]["strict"] is True
        # two dozen readings, two writes: confirming readings cost no store call
        assert sorted(writes) == ["percent/5h", "percent/weekly"]
        five = consumed(u, "percent/5h")
        assert five["alice"] >= SHARE > five["bob"]
        # the readings' rises were attributed: the keys hold what the accounts rose by after
        # each account's first reading (the baseline, 5 % each)
        rises = sum(w.primary.used for w in backend.accounts.values()) - 2 * 5
        assert abs(sum(five.values()) - rises) < 1e-6
        week = consumed(u, "percent/weekly")
        assert abs(sum(week.values()) - rises / 5) < 1e-6  # the weekly reading, a fifth of it

        # Retry-After is the provider's reset, not the epoch bucket's turn (13:00)
        now = timer.clock.now_ms() - 1_100  # when alice was refused
        assert int(blocked.headers["retry-after"]) == math.ceil((reset_5h - now) / 1000)
        # bob and carol are under their shares: they go on until the pool is half used by
        # our own count too (the provider's signal lives 30 s, the counts the whole window)
        while sum(consumed(await usage(), "percent/5h").values()) < 100:
            assert (await ask(BOB)).status_code == 200
            assert (await ask(CAROL)).status_code == 200
        u = await usage()
        five, week = consumed(u, "percent/5h"), consumed(u, "percent/weekly")

        # 13:00 passes (an epoch-aligned window would roll here); alice stays blocked until
        # the account's reset, one second before it too
        timer.set(reset_5h - 1_000)
        assert consumed(await usage(), "percent/5h") == five
        assert (await ask(ALICE)).status_code == 429

        # 15:30: the account's 5-hour window resets, and so does every key's share of it
        timer.set(reset_5h)
        after = await usage()
        assert consumed(after, "percent/5h") == {"alice": 0.0, "bob": 0.0, "carol": 0.0}
        assert after["percent/5h"]["resetsAtMs"] == reset_5h + FIVE_H
        # the weekly window did not reset: its counts stay
        assert consumed(after, "percent/weekly") == week
        assert week["alice"] > 0
        # (to the anchoring account: codex-2's window resets 1.1 s later, so its reading now
        # would restate its running window, which writes nothing)
        pin = {"x-fairgate-pin": "codex/gpt-5-codex@codex-1"}
        r = await h.chat("codex", key=ALICE, headers=pin)
        assert r.status_code == 200, r.text
        await h.settle_background()
        assert backend.served[-1] == "codex-1"
        # the anchoring account's new window is the next one at the same phase: one write
        # moves the stated reset along, the bucket in use stays
        assert sorted(writes) == ["percent/5h", "percent/5h", "percent/weekly"]
        assert (await usage())["percent/5h"]["resetsAtMs"] == reset_5h + FIVE_H


async def test_window_anchor_epoch_keeps_a_percent_window_on_the_epoch_grid(
    tmp_path: Path,
) -> None:
    """``window_anchor: epoch`` (config, admin API): that window ignores the provider's reset;
    the others still follow it."""
    timer = ManualTimer(ManualClock(T))
    backend = CodexBackend(timer.clock)
    cfg = config()
    cfg["pools"][0]["dimensions"][0]["window_anchor"] = "epoch"
    async with gateway(tmp_path, cfg, timer, backend) as h:
        h.gw.admin_key = ADMIN
        auth = {"authorization": f"Bearer {ADMIN}"}
        assert (await h.chat("codex", key=ALICE)).status_code == 200
        await h.settle_background()
        r = await h.client.get("/api/quota/pools/cx/usage", headers=auth)
        dims = {d["key"]: d for d in r.json()["dimensions"]}
        assert dims["percent/5h"]["anchorSource"] is None
        assert dims["percent/5h"]["resetsAtMs"] == (T // FIVE_H + 1) * FIVE_H  # 13:00
        assert dims["percent/weekly"]["anchorSource"] == "codex-1"
        pool = (await h.client.get("/api/quota/pools/cx", headers=auth)).json()
        assert [d["windowAnchor"] for d in pool["dimensions"]] == ["epoch", "provider"]

        dims_in: list[dict[str, Any]] = [
            {"unit": "percent", "window": "5h", "limit": 100, "windowAnchor": "sliding"},
            {"unit": "percent", "window": "weekly", "limit": 100},
        ]
        r = await h.client.patch("/api/quota/pools/cx", json={"dimensions": dims_in}, headers=auth)
        assert r.status_code == 422, r.text
        assert "dimensions.0.windowAnchor" in r.text
        dims_in[0]["windowAnchor"] = "provider"
        r = await h.client.patch("/api/quota/pools/cx", json={"dimensions": dims_in}, headers=auth)
        assert r.status_code == 200, r.text
        assert [d["windowAnchor"] for d in r.json()["dimensions"]] == ["provider", "provider"]
