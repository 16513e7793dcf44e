"""Quota-share selection (SPEC §7): gating, caps, DRR, P2C, in-flight leases, bounded state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence

import pytest

from fairgate.clock import ManualClock
from fairgate.domain.connections import Connection
from fairgate.quota.signals import AccountBuckets
from fairgate.routing.combo import Combo
from fairgate.routing.model import Target
from fairgate.routing.quota_share import (
    DEFICIT_BOUND,
    DrrState,
    InflightTracker,
    QuotaShareResult,
    is_internal,
    parse_qtsd,
    qtsd_name,
    quota_share_combo,
    saturation_gate,
    select_quota_share,
)

T0 = 1_700_002_800_000
COMBO = "qtSd/pool/claude-sonnet-4"
H = Target("claude", "claude-sonnet-4", "h", weight=2)
L = Target("claude", "claude-sonnet-4", "l", weight=1)


def never(t: Target) -> bool:
    return False


def select(
    targets: Sequence[Target],
    drr: DrrState,
    inflight: InflightTracker | None = None,
    *,
    saturated: Callable[[Target], bool] = never,
    caps: Mapping[str, int | None] | None = None,
    now_ms: int = T0,
) -> QuotaShareResult:
    return select_quota_share(
        targets,
        COMBO,
        "claude-sonnet-4",
        now_ms,
        saturated=saturated,
        max_concurrent=caps or {},
        inflight=inflight or InflightTracker(),
        drr=drr,
    )


def ids(order: Sequence[Target]) -> list[str]:
    return [t.connection_id or "" for t in order]


# -- DRR ----------------------------------------------------------------------------------------


def test_drr_weights_2_to_1_give_h_l_h_repeating() -> None:
    """The worked example of the module doc: quanta 2/3 and 1/3, charge −1 to the winner.
    deficits after quanta → winner: (0.667, 0.333) H; (0.333, 0.667) L; (1.0, 0.0) H; then the
    deficits are back to (0, 0) and the cycle repeats."""
    drr = DrrState()
    winners = []
    for _ in range(9):
        res = select([H, L], drr)
        with res.ticket as ticket:
            ticket.dispatch(res.winner)
        winners.append(res.winner.connection_id)
    assert winners == ["h", "l", "h", "h", "l", "h", "h", "l", "h"]
    assert drr.deficits(COMBO) == pytest.approx({H.key: 0.0, L.key: 0.0}, abs=1e-9)
    assert drr.holds(COMBO) == 0


def test_drr_equal_weights_rotate_in_input_order_and_non_positive_weight_counts_one() -> None:
    a, b, c = (Target("p", "m", x, weight=w) for x, w in (("a", 1), ("b", 0), ("c", -3)))
    drr = DrrState()
    seq = []
    for _ in range(6):
        res = select([a, b, c], drr)
        res.ticket.charge(res.winner)
        seq.append(res.winner.connection_id)
    assert seq == ["a", "b", "c", "a", "b", "c"]


def test_drr_long_run_shares_follow_weights() -> None:
    t = [Target("p", "m", f"c{i}", weight=w) for i, w in enumerate((5, 3, 2))]
    drr = DrrState()
    counts = dict.fromkeys(("c0", "c1", "c2"), 0)
    for _ in range(1_000):
        res = select(t, drr)
        res.ticket.charge(res.winner)
        counts[res.winner.connection_id or ""] += 1
    assert counts == {"c0": 500, "c1": 300, "c2": 200}


def test_drr_is_charged_to_the_target_actually_dispatched() -> None:
    drr = DrrState()
    res = select([H, L], drr)
    assert res.winner == H
    assert drr.deficits(COMBO) == pytest.approx({H.key: 2 / 3, L.key: 1 / 3})  # quanta only
    with res.ticket as ticket:
        ticket.dispatch(H)  # H failed (429)…
        ticket.dispatch(L)  # …and L served the request
    assert drr.deficits(COMBO) == pytest.approx({H.key: 2 / 3, L.key: 1 / 3 - 1})
    res.ticket.close()  # idempotent: no second charge
    assert drr.deficits(COMBO)[L.key] == pytest.approx(1 / 3 - 1)


def test_nothing_dispatched_nothing_charged() -> None:
    drr = DrrState()
    res = select([H, L], drr)
    assert drr.holds(COMBO) == 1
    res.ticket.close()
    assert drr.holds(COMBO) == 0
    assert drr.deficits(COMBO) == pytest.approx({H.key: 2 / 3, L.key: 1 / 3})


def test_concurrent_selections_spread_before_any_charge() -> None:
    """Two requests selected before either is dispatched must not both go to H: the first
    selection's provisional hold counts for the second."""
    drr = DrrState()
    first = select([H, L], drr)
    second = select([H, L], drr)
    assert (first.winner, second.winner) == (H, L)
    first.ticket.charge(H)
    second.ticket.charge(L)
    third = select([H, L], drr)
    assert third.winner == H  # same as the sequential H L H


def test_unclosed_tickets_stop_counting_after_the_hold_ttl() -> None:
    drr = DrrState(hold_ttl_ms=1_000)
    leaked = select([H, L], drr)
    assert leaked.winner == H
    later = select([H, L], drr, now_ms=T0 + 5_000)
    assert later.winner == H  # H 1.333 vs L 0.667: the leaked hold expired
    assert drr.holds(COMBO) == 1  # only the new selection's hold


def test_drr_state_is_lru_bounded() -> None:
    drr = DrrState(max_combos=3)
    for i in range(10):
        select_quota_share(
            [H, L],
            f"qtSd/p{i}/m",
            "m",
            T0,
            saturated=never,
            max_concurrent={},
            inflight=InflightTracker(),
            drr=drr,
        ).ticket.close()
    assert len(drr) == 3
    assert "qtSd/p9/m" in drr
    assert "qtSd/p0/m" not in drr


def test_members_that_left_are_pruned_and_deficits_are_clamped() -> None:
    drr = DrrState()
    gone = Target("claude", "claude-sonnet-4", "gone")
    select([H, L, gone], drr).ticket.close()
    assert gone.key in drr.deficits(COMBO)
    select([H, L], drr).ticket.close()
    assert gone.key not in drr.deficits(COMBO)
    for _ in range(100):
        drr.charge(COMBO, H)
    assert drr.deficits(COMBO)[H.key] == -DEFICIT_BOUND


# -- gating and caps ----------------------------------------------------------------------------


def test_saturated_targets_go_last_but_are_never_dropped() -> None:
    a, b, c = (Target("p", "m", x) for x in "abc")
    res = select([a, b, c], DrrState(), saturated=lambda t: t.connection_id == "a")
    assert ids(res.order) == ["b", "c", "a"]
    assert res.saturated == (a.key,)


def test_all_saturated_means_all_eligible() -> None:
    a, b = Target("p", "m", "a", weight=1), Target("p", "m", "b", weight=3)
    res = select([a, b], DrrState(), saturated=lambda t: True)
    assert sorted(ids(res.order)) == ["a", "b"]
    assert res.winner == b  # DRR over both
    assert res.saturated == ()


def test_concurrency_caps_order_at_cap_after_room() -> None:
    inflight = InflightTracker()
    leases = [inflight.acquire(H), inflight.acquire(H)]
    res = select([H, L], DrrState(), inflight, caps={"h": 2, "l": None})
    assert ids(res.order) == ["l", "h"]
    assert res.at_cap == (H.key,)
    for unlimited in (None, 0, -1):
        res = select([H, L], DrrState(), inflight, caps={"h": unlimited})
        assert res.at_cap == ()
    for lease in leases:
        lease.release()


def test_none_with_room_means_all_count() -> None:
    inflight = InflightTracker()
    leases = [inflight.acquire(H), inflight.acquire(L)]
    res = select([H, L], DrrState(), inflight, caps={"h": 1, "l": 1})
    assert res.at_cap == ()
    assert sorted(ids(res.order)) == ["h", "l"]
    for lease in leases:
        lease.release()


def test_final_order_is_winner_room_cap_saturated() -> None:
    t = {x: Target("p", "m", x) for x in "abcd"}
    inflight = InflightTracker()
    lease = inflight.acquire(t["b"])
    res = select(
        list(t.values()),
        DrrState(),
        inflight,
        saturated=lambda x: x.connection_id == "a",
        caps={"b": 1},
    )
    assert ids(res.order) == ["c", "d", "b", "a"]
    lease.release()


# -- P2C ----------------------------------------------------------------------------------------


def test_p2c_prefers_strictly_fewer_in_flight() -> None:
    inflight = InflightTracker()
    busy = [inflight.acquire(H), inflight.acquire(H), inflight.acquire(L)]
    res = select([H, L], DrrState(), inflight)
    assert res.winner == L  # DRR says H, but H has 2 in flight vs 1
    assert ids(res.order) == ["l", "h"]
    busy[0].release()
    res = select([H, L], DrrState(), inflight)
    assert res.winner == H  # 1 vs 1: not strictly fewer, DRR stands
    for lease in busy:
        lease.release()


# -- in-flight leases ---------------------------------------------------------------------------


def test_inflight_returns_to_zero_after_every_lease() -> None:
    inflight = InflightTracker()
    with inflight.acquire(H):
        assert inflight.count(H) == 1
    assert inflight.count(H) == 0
    with pytest.raises(RuntimeError), inflight.acquire(H):
        raise RuntimeError("upstream failed")
    assert inflight.count(H) == 0
    lease = inflight.acquire(L)
    lease.release()
    lease.release()  # idempotent
    assert lease.released
    assert inflight.total == 0
    assert len(inflight) == 0  # no zero entries kept


async def test_inflight_returns_to_zero_for_streams_cancellation_and_disconnects() -> None:
    inflight = InflightTracker()

    async def stream(target: Target) -> AsyncGenerator[str]:
        with inflight.acquire(target):
            for i in range(100):
                yield f"chunk {i}"
                await asyncio.sleep(0)

    # a stream consumed to the end
    async for _ in stream(H):
        assert inflight.count(H) == 1
    # a client that disconnects after two chunks (the server closes the generator)
    gen = stream(L)
    assert await anext(gen) == "chunk 0"
    assert inflight.count(L) == 1
    await gen.aclose()
    # a request task cancelled mid-flight
    started = asyncio.Event()

    async def request() -> None:
        with inflight.acquire(H):
            started.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(request())
    await started.wait()
    assert inflight.count(H) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert inflight.total == 0


def test_inflight_is_per_connection_across_combos() -> None:
    inflight = InflightTracker()
    sonnet = Target("claude", "claude-sonnet-4", "c1")
    opus = Target("claude", "claude-opus-4", "c1")
    with inflight.acquire(sonnet), inflight.acquire(opus):
        assert inflight.count(sonnet) == 2
        assert inflight.snapshot([sonnet, opus]) == {sonnet.key: 2, opus.key: 2}


# -- names, minting, buckets --------------------------------------------------------------------


def test_qtsd_names() -> None:
    assert qtsd_name("pool1", "anthropic/claude-opus-4") == "qtSd/pool1/anthropic/claude-opus-4"
    assert parse_qtsd("qtSd/pool1/anthropic/claude-opus-4") == (
        "pool1",
        "anthropic/claude-opus-4",
    )
    assert parse_qtsd("mine") is None
    assert is_internal("qtSd/x/y")
    assert not is_internal("my-combo")
    with pytest.raises(ValueError, match="pool id"):
        qtsd_name("a/b", "m")


def _conn(cid: str, weight: float = 1.0, enabled: bool = True) -> Connection:
    return Connection(
        id=cid,
        provider="claude",
        base_url="http://x",
        secret="s",
        weight=weight,
        enabled=enabled,
        models=("*",),
    )


def test_quota_share_combo_is_internal_and_follows_the_members() -> None:
    combo = quota_share_combo("pool1", "claude-sonnet-4", [_conn("c1", 2), _conn("c2", 1)])
    assert combo is not None
    assert combo.internal
    assert combo.strategy == "quota-share"
    assert combo.name == "qtSd/pool1/claude-sonnet-4"
    assert [(t.connection_id, t.weight) for t in combo.targets] == [("c1", 2.0), ("c2", 1.0)]
    assert quota_share_combo("pool1", "m", [_conn("c1", enabled=False)]) is None
    with pytest.raises(ValueError, match="internal"):
        Combo("mine", "quota-share", combo.targets)


def test_saturation_gate_reads_account_buckets() -> None:
    clock = ManualClock(T0)
    buckets = AccountBuckets(clock)
    buckets.observe("h", "7d:sonnet", 1.0, T0 + 60_000)
    gate = saturation_gate(buckets, "claude-sonnet-4")
    res = select([H, L], DrrState(), saturated=gate)
    assert ids(res.order) == ["l", "h"]
    clock.advance(60_000)  # the weekly sonnet window reset
    res = select([H, L], DrrState(), saturated=gate)
    assert res.saturated == ()
