"""Who may use what, as pure functions of the registry snapshot (``Registry.denial``), the
client's view of the diagnostics and the unallocated row of a pool's usage."""

from __future__ import annotations

from fairgate.domain.connections import Connection
from fairgate.domain.keys import ClientKey, Denial
from fairgate.domain.units import Unit, Window
from fairgate.path.diagnostics import Diagnostics, Terminal, public_label, public_reason
from fairgate.quota.model import Allocation, Dimension
from fairgate.quota.usage import UNALLOCATED, build_usage
from fairgate.quota.window import Count
from fairgate.snapshot import Registry
from quota_support import make_pool

DIM = Dimension(Unit.REQUESTS, Window.HOURLY, 100)
POOL = make_pool(
    DIM, allocations=(Allocation("alice", 100),), id="shared", provider="mock", connections=("p-1",)
)
CONNS = [
    Connection("p-1", "mock", "http://x/v1", "s", models=("m",)),
    Connection("free-1", "mock", "http://x/v1", "s", models=("m",)),
    Connection("other-1", "other", "http://x/v1", "s", models=("*",)),
]
ALICE = ClientKey("alice", "alice", "a" * 64)
BOB = ClientKey("bob", "bob", "b" * 64)
CAROL = ClientKey("carol", "carol", "c" * 64, allowed_connections=frozenset({"free-1"}))
DAVE = ClientKey("dave", "dave", "d" * 64, allowed_providers=frozenset({"other", "mock"}))


def reg(require: bool = True) -> Registry:
    return Registry.build(CONNS, [ALICE, BOB, CAROL, DAVE], [POOL], require_allocation=require)


def test_a_pooled_connection_needs_an_allocation_in_its_pool() -> None:
    r = reg()
    p1 = r.connections["p-1"]
    assert r.denial(ALICE, p1) is None
    assert r.denial(BOB, p1) is Denial.NO_ALLOCATION
    # an allow-list opens connections outside every pool only, never a pooled one
    assert r.denial(DAVE, p1) is Denial.NO_ALLOCATION


def test_a_connection_outside_every_pool_needs_the_key_to_list_it_or_its_provider() -> None:
    r = reg()
    free, other = r.connections["free-1"], r.connections["other-1"]
    assert r.denial(ALICE, free) is Denial.CONNECTION_NOT_ALLOWED
    assert r.denial(CAROL, free) is None
    assert r.denial(CAROL, other) is Denial.CONNECTION_NOT_ALLOWED
    assert r.denial(DAVE, free) is None
    assert r.denial(DAVE, other) is None


def test_off_every_key_may_use_every_connection() -> None:
    r = reg(require=False)
    assert all(r.denial(BOB, c) is None for c in r.connections.values())


def test_a_connection_serves_what_it_lists_or_star() -> None:
    named = Connection("a", "mock", "http://x", "s", models=("m1",))
    star = Connection("b", "mock", "http://x", "s", models=("*",))
    none = Connection("c", "mock", "http://x", "s")
    assert named.serves("m1")
    assert not named.serves("m2")
    assert star.serves("anything")
    assert not star.serves("*")
    assert not none.serves("m1")  # an empty list serves nothing
    assert star.named_models == ()


def _usage(per_key: dict[str, float], total: float, allowed: bool) -> dict[str, tuple[float, bool]]:
    counts = {k: {DIM.key: Count(curr=v)} for k, v in per_key.items()}
    u = build_usage(
        POOL, {DIM.key: Count(curr=total)}, counts, 0, 0.5, {}, unallocated_allowed=allowed
    )
    return {k.key_id: (k.consumed, k.allocated) for k in u.dimensions[0].keys}


def test_unallocated_use_is_one_row() -> None:
    assert _usage({"alice": 3}, 5, allowed=True) == {
        "alice": (3, True),
        UNALLOCATED: (2, False),
    }
    assert _usage({"alice": 3}, 3, allowed=True)[UNALLOCATED] == (0, False)  # shown at 0
    assert UNALLOCATED not in _usage({"alice": 3}, 3, allowed=False)
    # refused now, but used before (or by a shadow copy): still shown
    assert _usage({"alice": 3}, 4, allowed=False)[UNALLOCATED] == (1, False)


def test_clients_see_reason_codes_admins_see_everything() -> None:
    d = Diagnostics(pool_size=2, combo="c", strategy="priority")
    d.exclude("mock/m@p-1", "permanent")
    d.exclude("mock/m@p-2", "cooldown", 2_000, 1_000)
    d.exclude("mock/m@p-3", "quota:fair-share")
    d.attempt("mock/m@p-4", "auth_error", status=401, latency_ms=3)
    err = d.error(503, "nothing", code="all_targets_unavailable", terminal=Terminal.ALL_UNAVAILABLE)
    assert err.diagnostics is not None
    assert err.diagnostics["excluded"][0] == {"target": "mock/m@p-1", "reason": "permanent"}
    client = err.client_diagnostics
    assert client is not None
    assert client["excluded"] == [
        {"target": "mock/m", "reason": "unavailable"},
        {"target": "mock/m", "reason": "cooling_down", "retryAfterMs": 1000},
        {"target": "mock/m", "reason": "quota:fair-share"},
    ]
    assert client["attempted"] == [{"target": "mock/m", "outcome": "failed"}]
    assert "p-" not in str(client)
    assert "permanent" not in str(client)
    assert "401" not in str(client)
    assert public_label("openai/gpt@x@conn") == "openai/gpt@x"
    assert public_reason("something-new") == "unavailable"
