"""The resilience manager when its shared store (Redis) is unreachable: fail open, and leave the
store alone for a moment instead of paying a socket timeout on every request."""

from __future__ import annotations

from fairgate.clock import ManualClock
from fairgate.resilience.manager import STORE_RETRY_MS, RateLimitManager
from fairgate.resilience.state import MemoryResilienceStore, TargetState

P, C, M = "openai", "c1", "gpt-4o"


class Unreachable(Exception):
    """What a Redis client raises when the server is gone."""


class FlakyStore(MemoryResilienceStore):
    unavailable_errors = (Unreachable,)

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.down = False
        self.reads = 0

    async def read_target(self, provider: str, conn_id: str, model: str) -> TargetState:
        self.reads += 1
        if self.down:
            raise Unreachable("connection refused")
        return await super().read_target(provider, conn_id, model)


async def test_unreachable_store_is_skipped_for_a_moment_then_tried_again(
    clock: ManualClock,
) -> None:
    store = FlakyStore(clock)
    mgr = RateLimitManager(store, clock=clock)
    store.down = True
    assert await mgr.check(P, C, M) is None  # fails open
    assert store.reads == 1
    for _ in range(10):  # within the retry wait: not even asked
        assert await mgr.check(P, C, M) is None
    assert store.reads == 1
    snap = await mgr.snapshot()
    assert snap["store"]["errors"] == 1 + 10 + 2  # the failure, the skipped checks, ping+snapshot
    clock.advance(STORE_RETRY_MS)
    assert await mgr.check(P, C, M) is None  # the one probe: still down
    assert store.reads == 2
    assert await mgr.check(P, C, M) is None  # and the wait starts again
    assert store.reads == 2
    store.down = False
    clock.advance(STORE_RETRY_MS)
    assert await mgr.check(P, C, M) is None  # the probe succeeds: back to normal
    assert await mgr.check(P, C, M) is None
    assert store.reads == 4


async def test_other_errors_do_not_stop_the_store_being_asked(clock: ManualClock) -> None:
    class Odd(FlakyStore):
        async def read_target(self, provider: str, conn_id: str, model: str) -> TargetState:
            self.reads += 1
            raise RuntimeError("a bug, not an outage")

    store = Odd(clock)
    mgr = RateLimitManager(store, clock=clock)
    for _ in range(3):
        assert await mgr.check(P, C, M) is None
    assert store.reads == 3
