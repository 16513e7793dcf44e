"""Shared subscriptions, exact (issue 44), in process: the soft penalty's factor, the
credential gate, wildcard connections, the percent estimate and its attribution, the readings'
age and the retry time of subscription windows. The upstream is an in-process handler; the
clock is the test's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from inproc_support import ADMIN, ALICE, BOB, Harness, base_config, combo, conn, gateway, target

from fairgate.clock import ManualClock
from fairgate.mock.codex import CodexWindows, responses_events, responses_input_text
from fairgate.providers.inprocess import Reply, UpstreamRequest, openai_chat
from fairgate.timers import ManualTimer


async def _answer(req: UpstreamRequest) -> Reply:
    return openai_chat(f"from {req.conn.id}")


# -- item 7: the soft penalty is × factor in the scoring, and the executor keeps that order ----


def _soft_pools() -> list[dict[str, Any]]:
    """alice is soft-penalised on s1 (weight 0: over her share from the start), not on k1."""
    dims = [{"unit": "requests", "window": "hourly", "limit": 1000}]
    return [
        {
            "id": "ps1",
            "connections": ["s1"],
            "dimensions": dims,
            "allocations": [
                {"key": "alice", "weight": 0, "policy": "soft"},
                {"key": "bob", "weight": 1},
            ],
        },
        {
            "id": "pk1",
            "connections": ["k1"],
            "dimensions": dims,
            "allocations": [{"key": "alice", "weight": 1}, {"key": "bob", "weight": 1}],
        },
    ]


@pytest.mark.parametrize(
    ("other_price", "served"),
    [
        pytest.param(100.0, "s1", id="penalised-1-beats-100"),
        pytest.param(1.5, "s1", id="penalised-1-beats-1.5"),  # 1 / 0.7 = 1.43 < 1.5
        pytest.param(1.4, "k1", id="penalised-1-loses-to-1.4"),  # 1.43 > 1.4
    ],
)
async def test_soft_penalty_scales_the_cost_by_the_factor(
    tmp_path: Path, other_price: float, served: str
) -> None:
    cheapest = combo(
        "c",
        [
            target("s1", provider="sub", priceIn=1, priceOut=1),
            target("k1", provider="kimi", priceIn=other_price, priceOut=other_price),
        ],
        strategy="cost-optimized",
    )
    cfg = base_config(
        [conn("s1", "sub"), conn("k1", "kimi")], pools=_soft_pools(), combos=[cheapest]
    )
    async with gateway(tmp_path, cfg, ManualTimer(), _answer) as h:
        r = await h.chat("c", max_tokens=5)
        assert r.status_code == 200, r.text
        assert h.sent_to == [served]
        assert r.headers["x-fairgate-connection"] == served


# -- item 2: the credential gate, for every kind of credential ---------------------------------


@pytest.mark.parametrize(
    "s1",
    [
        pytest.param(conn("s1", "sub", models=("other",)), id="model-not-served"),
        pytest.param(
            {**conn("s1", "sub", base_url="https://s1.invalid/v1"), "secret": ""},
            id="api-key-missing",
        ),
    ],
)
async def test_an_unusable_credential_is_skipped_before_any_attempt(
    tmp_path: Path, s1: dict[str, Any]
) -> None:
    sub, kimi = target("s1", provider="sub"), target("k1", provider="kimi")
    both = combo("c", [sub, kimi], maxWaitMs=0)
    only = combo("only", [sub], maxWaitMs=0)
    cfg = base_config([s1, conn("k1", "kimi")], combos=[both, only])
    async with gateway(tmp_path, cfg, ManualTimer(), _answer) as h:
        for _ in range(3):
            r = await h.chat("c", max_tokens=5)
            assert r.status_code == 200, r.text
        assert h.sent_to == ["k1"] * 3  # s1 never attempted
        mgr = h.gw.resilience
        assert mgr is not None
        snap = await mgr.snapshot()
        assert snap["breakers"].get("sub", {}).get("failures", 0) == 0
        # alone, it is a 503 that names what to do, still without an attempt
        r = await h.chat("only", max_tokens=5)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "credential_unusable"
        assert "s1: " in err["message"]
        assert h.sent_to == ["k1"] * 3


# -- items 1 and 3: the percent estimate and its attribution ---------------------------------

CAROL = "fg-carol-secret-0123456789"
T0 = 1_782_297_000_000  # 2026-06-24T10:30Z


class CodexAccount:
    """The mock's Codex backend for one account: ``per_1k`` percent of the 5-hour window per
    1,000 tokens; a prompt costs a token per four characters, the answer 16 tokens (the
    mock's), and the reading in the answer's headers counts this request already."""

    def __init__(self, clock: Any, per_1k: float) -> None:
        self.windows = CodexWindows(clock, percent_per_1k_tokens=per_1k, weekly_ratio=0.2)
        self.served = 0

    async def __call__(self, req: UpstreamRequest) -> Reply:
        body = req.json()
        full = self.windows.exhausted()
        if full is not None:
            return Reply(429, self.windows.limit_error(full), headers=self.windows.headers())
        _, chars = responses_input_text(body)
        prompt = max(1, -(-chars // 4))
        self.windows.use(prompt + 16)
        self.served += 1
        events = responses_events("resp_1", body["model"], 0, ["mock ", "reply"], prompt, 16)
        chunks = [
            b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
            for name, data in events
        ]
        return Reply(200, chunks=chunks, headers=self.windows.headers())


def codex_config(keys: dict[str, str], *, models: list[str] | None = None) -> dict[str, Any]:
    return {
        "server": {"default_provider": "codex"},
        "connections": [
            {
                "id": "codex-1",
                "provider": "codex",
                "base_url": "http://codex-1.invalid/backend-api/codex",
                "secret": "upstream-secret-codex-1",
                "models": models or ["gpt-5-codex"],
            }
        ],
        "keys": [{"id": k, "name": k, "secret": s} for k, s in keys.items()],
        "pools": [
            {
                "id": "codex",
                "name": "Codex Plus",
                "connections": ["codex-1"],
                "dimensions": [
                    {"unit": "percent", "window": "5h", "limit": 100},
                    {"unit": "percent", "window": "weekly", "limit": 100},
                ],
                "allocations": [{"key": k, "weight": 50} for k in keys],
            }
        ],
    }


async def _consumed(h: Harness, dim: str = "percent/5h") -> dict[str, float]:
    r = await h.client.get("/api/quota/pools/codex/usage", headers=ADMIN)
    assert r.status_code == 200, r.text
    (d,) = [d for d in r.json()["dimensions"] if d["key"] == dim]
    return {k["keyId"]: k["consumed"] for k in d["keys"]}


async def test_each_rise_is_charged_to_the_request_whose_answer_reported_it(
    tmp_path: Path,
) -> None:
    """Issue 44, item 3: each request adds 2.1 % (21 tokens at 100 % per 1,000); alice ×4,
    bob ×2, carol ×2, a second apart. The first answer's reading is the baseline (it counts
    alice's first request); every later rise is its own request's: 6.3 / 4.2 / 4.2 (before:
    8.4 / 4.2 / 2.1, each rise billed to the previous caller). Then the account's owner uses
    it outside the gateway (+30 %): carol's next request is charged what her tokens explain at
    most, never the owner's use (before: the whole 32.1 %)."""
    timer = ManualTimer(ManualClock(T0))
    account = CodexAccount(timer.clock, per_1k=100.0)
    keys = {"alice": ALICE, "bob": BOB, "carol": CAROL}
    async with gateway(tmp_path, codex_config(keys), timer, account) as h:
        for who in ("alice",) * 4 + ("bob",) * 2 + ("carol",) * 2:
            r = await h.chat("gpt-5-codex", key=keys[who], messages=[_say("x" * 20)])
            assert r.status_code == 200, r.text
            await h.settle_background()
            timer.advance(1_000)
        assert account.windows.primary.used == pytest.approx(8 * 2.1)
        assert await _consumed(h) == pytest.approx({"alice": 6.3, "bob": 4.2, "carol": 4.2})

        account.windows.use(300)  # the owner's own Codex session: +30 %
        r = await h.chat("gpt-5-codex", key=CAROL, messages=[_say("x" * 20)])
        assert r.status_code == 200, r.text
        await h.settle_background()
        carol = (await _consumed(h))["carol"] - 4.2
        assert 2.1 - 1e-6 <= carol <= 3 * 2.1 + 1e-6  # her own use, not the owner's 30 %


def _say(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def test_one_big_prompt_does_not_wedge_the_pool(tmp_path: Path) -> None:
    """Issue 44, item 1 (the docs' walkthrough, the mock's 1 % per 1,000 tokens): alice "hi"
    ×2, bob "hi", then alice a 3,766-token prompt (3.8 % of the window). Before, the rise was
    priced over the ~17 tokens counted before it (0.22 % a token), so every ordinary request's
    1,025-token estimate exceeded the 96 % left: 429 global-saturated for everyone. Now the
    estimate is the request's own reading, smoothed and bounded by the plan, and the preview
    agrees with admission."""
    timer = ManualTimer(ManualClock(T0))
    account = CodexAccount(timer.clock, per_1k=1.0)
    keys = {"alice": ALICE, "bob": BOB}
    async with gateway(tmp_path, codex_config(keys), timer, account) as h:
        steps = [("alice", "hi"), ("alice", "hi"), ("bob", "hi"), ("alice", "y" * 15_000)]
        for who, text in steps:
            r = await h.chat("gpt-5-codex", key=keys[who], messages=[_say(text)])
            assert r.status_code == 200, r.text
            await h.settle_background()
            timer.advance(1_200)
        assert 3.7 < account.windows.primary.used < 3.9
        for i in range(8):  # ordinary requests, no max_tokens (the default output budget)
            who = ("alice", "bob")[i % 2]
            r = await h.chat("gpt-5-codex", key=keys[who], messages=[_say("hi")])
            assert r.status_code == 200, r.text
            await h.settle_background()
            timer.advance(1_200)
        signals = h.svc.signals
        estimate = signals.percent_estimate("codex-1", 1_025)
        assert estimate < 1.1  # ~0.001 % a token, as the account really fills
        # the preview prices the same request the same way, and says what admission does
        q = {"pool": "codex", "key": "alice", "tokens": "1025"}
        r = await h.client.get("/api/quota/preview", params=q, headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json()["outcome"] == "allow"
        # a request the estimate cannot fit is refused by both alike: 99 % of it is used
        account.windows.use(95_000)
        r = await h.chat("gpt-5-codex", key=ALICE, messages=[_say("hi")])
        await h.settle_background()
        timer.advance(1_200)
        big = {"pool": "codex", "key": "bob", "tokens": str(500_000)}
        preview = (await h.client.get("/api/quota/preview", params=big, headers=ADMIN)).json()
        assert preview["outcome"] == "block", preview


# -- item 5: wildcard connections (models: ["*"]) --------------------------------------------


async def test_a_wildcard_pool_shares_its_load_like_a_named_one(tmp_path: Path) -> None:
    """Two Codex accounts listed ``models: ["*"]`` in one pool: the quota-share combo is minted
    (at the model's first request), listed with the internal combos, and 16 requests of three
    keys split between the accounts (before: no combo, every request to codex-1)."""
    timer = ManualTimer(ManualClock(T0))
    accounts = {c: CodexAccount(timer.clock, per_1k=0.01) for c in ("codex-1", "codex-2")}

    async def backend(req: UpstreamRequest) -> Reply:
        return await accounts[req.conn.id](req)

    keys = {"alice": ALICE, "bob": BOB, "carol": CAROL}
    cfg = codex_config(keys, models=["*"])
    second = {**cfg["connections"][0], "id": "codex-2", "base_url": "http://codex-2.invalid/x"}
    cfg["connections"].append(second)
    cfg["pools"][0]["connections"] = ["codex-1", "codex-2"]
    async with gateway(tmp_path, cfg, timer, backend) as h:
        for i in range(16):
            who = ("alice", "bob", "carol")[i % 3]
            r = await h.chat("gpt-5-codex", key=keys[who], messages=[_say("hi")])
            assert r.status_code == 200, r.text
            await h.settle_background()
            timer.advance(100)
        served = {c: a.served for c, a in accounts.items()}
        assert served["codex-1"] + served["codex-2"] == 16
        assert min(served.values()) >= 6, served  # shared, not all on codex-1
        r = await h.client.get("/api/combos", params={"internal": "true"}, headers=ADMIN)
        assert [c["name"] for c in r.json()] == ["qtSd/codex/gpt-5-codex"]
        # /v1/models lists what the pool served (a wildcard has no list of its own)
        models = await h.client.get("/v1/models", headers={"authorization": f"Bearer {ALICE}"})
        ids = {m["id"] for m in models.json()["data"]}
        assert {"gpt-5-codex", "codex/gpt-5-codex"} <= ids


async def test_wildcard_openai_connections_serve_any_model_asked(tmp_path: Path) -> None:
    """Two OpenAI-wire connections ``models: "*"`` and no default provider: ``gpt-4o-mini``
    is served (before: 404 model_not_found; only ``openai/gpt-4o-mini`` worked), and once
    served it is in ``/v1/models``."""
    served: list[str] = []

    async def answer(req: UpstreamRequest) -> Reply:
        served.append(req.conn.id)
        return openai_chat("hello", model=str(req.json()["model"]))

    cfg = base_config([conn("oa-1", "openai", models=("*",)), conn("oa-2", "openai", models="*")])
    async with gateway(tmp_path, cfg, ManualTimer(), answer) as h:
        before = await h.client.get("/v1/models", headers={"authorization": f"Bearer {ALICE}"})
        assert before.json()["data"] == []
        for model in ("gpt-4o-mini", "openai/gpt-4o-mini", "gpt-4.1"):
            r = await h.chat(model, max_tokens=5)
            assert r.status_code == 200, r.text
        assert len(served) == 3
        after = await h.client.get("/v1/models", headers={"authorization": f"Bearer {ALICE}"})
        ids = [m["id"] for m in after.json()["data"]]
        assert ids == ["openai/gpt-4.1", "openai/gpt-4o-mini"]


# -- item 6: a provider reading holds until the provider's own reset ---------------------------


async def test_a_reading_holds_after_an_idle_spell_until_the_providers_reset(
    tmp_path: Path,
) -> None:
    """The account is 60 % full (its owner's own use); by our own counters the pool is at 20 %
    (all alice's, over her 10 % share). The reading keeps the pool strict: alice is refused,
    and still after a minute's idle spell (before: the reading expired after 30 s and her next
    request went through); when the provider's 5-hour window resets, the reading goes."""
    timer = ManualTimer(ManualClock(T0))
    account = CodexAccount(timer.clock, per_1k=1.0)
    keys = {"alice": ALICE, "bob": BOB}
    cfg = codex_config(keys)
    cfg["pools"][0]["allocations"] = [{"key": "alice", "weight": 1}, {"key": "bob", "weight": 9}]
    async with gateway(tmp_path, cfg, timer, account) as h:
        pool = h.gw.registry.pools["codex"]
        await h.gw.engine.record(pool, "alice", {"percent/5h": 20.0})
        account.windows.use(60_000)  # 60 %
        r = await h.chat("gpt-5-codex", key=BOB, messages=[_say("hi")])
        assert r.status_code == 200, r.text
        await h.settle_background()
        timer.advance(1_000)
        refused = await h.chat("gpt-5-codex", key=ALICE, messages=[_say("hi")])
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["reason"] == "fair-share"
        timer.advance(60_000)  # an idle minute: no newer reading came
        again = await h.chat("gpt-5-codex", key=ALICE, messages=[_say("hi")])
        assert again.status_code == 429, again.text
        reset = account.windows.primary.reset_at_ms
        assert reset is not None
        assert h.svc.signals.saturation.fraction("codex-1", "percent", "5h") > 0.6
        timer.set(reset + 1)  # the provider's window reset: its reading no longer holds
        assert h.svc.signals.saturation.fraction("codex-1", "percent", "5h") == 0.0


# -- item 4: Retry-After on subscription windows ---------------------------------------------


async def test_full_accounts_give_the_stated_reset_not_the_cooldowns_cap(tmp_path: Path) -> None:
    """Two full Codex accounts (usage_limit_reached, resetting in about 5 hours): the first
    refusal says the soonest stated reset, and so does every later one while the accounts
    cool down (before: 3,599 s, the cooldown's one-hour cap, so a client that obeyed it was
    refused again)."""
    timer = ManualTimer(ManualClock(T0))
    accounts = {c: CodexAccount(timer.clock, per_1k=1.0) for c in ("codex-1", "codex-2")}
    accounts["codex-1"].windows.use(100_000)
    timer.advance(60_000)
    accounts["codex-2"].windows.use(100_000)  # resets a minute after codex-1

    async def backend(req: UpstreamRequest) -> Reply:
        return await accounts[req.conn.id](req)

    cfg = codex_config({"alice": ALICE, "bob": BOB}, models=["*"])
    second = {**cfg["connections"][0], "id": "codex-2", "base_url": "http://codex-2.invalid/x"}
    cfg["connections"].append(second)
    cfg["pools"] = []
    for k in cfg["keys"]:
        k["allowed_providers"] = ["codex"]
    soonest = accounts["codex-1"].windows.primary.reset_at_ms
    assert soonest is not None
    async with gateway(tmp_path, cfg, timer, backend) as h:
        for wait_ms in (0, 10_000, 30 * 60_000, 2 * 3_600_000):
            timer.advance(wait_ms)
            r = await h.chat("gpt-5-codex", messages=[_say("hi")])
            assert r.status_code == 429, r.text
            expected = -(-(soonest - timer.clock.now_ms()) // 1000)
            assert abs(int(r.headers["retry-after"]) - expected) <= 1, (wait_ms, r.headers)
            assert int(r.headers["retry-after"]) > 3_600


async def test_a_request_larger_than_the_pool_is_a_413_not_a_retry(tmp_path: Path) -> None:
    """A request whose estimate alone is more than the pool's whole limit can never fit: a
    413 that says so (before: 429 with Retry-After: 1, again and again)."""
    pool = {
        "id": "small",
        "connections": ["s1"],
        "dimensions": [{"unit": "tokens", "window": "hourly", "limit": 1_000}],
        "allocations": [{"key": "alice", "weight": 1}],
    }
    cfg = base_config([conn("s1", "sub")], pools=[pool])
    async with gateway(tmp_path, cfg, ManualTimer(), _answer) as h:
        r = await h.chat("m", max_tokens=5_000)
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert err["code"] == "request_too_large"
        assert "too large for the pool 'small'" in err["message"]
        assert "retry-after" not in r.headers
        assert r.json()["diagnostics"]["terminalReason"] == "client_error"
        assert h.sent_to == []
        assert (await h.chat("m", max_tokens=50)).status_code == 200
