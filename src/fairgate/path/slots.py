"""Per-connection concurrency slots: a real semaphore with a bounded FIFO queue.

A connection's ``max_concurrent`` is how many requests the account takes at once. The executor
first tries every candidate with a free slot; when every remaining candidate is at its cap, the
request queues for a slot on *any* of them, first come first served, up to the combo's
``queueTimeoutMs`` (then 503 ``concurrency_full`` with ``Retry-After``), instead of overloading
an account or failing at once.

The slots are the :class:`~fairgate.routing.InflightTracker`'s counts (the same numbers the
strategies read), so a slot *is* a :class:`~fairgate.routing.Lease`. A freed slot is handed
straight to the first waiter (its lease is taken on its behalf before it wakes), so a request
arriving meanwhile cannot jump the queue; a waiter that gives up or was cancelled after the
hand-over releases that lease, which hands it on to the next.

**Shared slots** (the Redis quota store, :mod:`fairgate.store.redis.slots`): the cap then holds
for all replicas together. Besides the local count, a slot needs a lease in Redis, which lasts
``lease_ttl_ms`` and is renewed every third of that while the request runs (a long stream), and
is given back when the request ends; a replica that dies loses its leases when they expire, so
its slots return within one lease lifetime. The FIFO queue stays per process: a freed local
slot wakes the first local waiter, which then asks Redis, and waiters also ask again every
``poll_ms`` (a slot freed on another replica wakes nobody here). So the order is first come
first served within a replica, not across replicas: a request arriving on replica B can take a
slot that replica A's oldest waiter would have had at its next poll. When Redis fails the slots
fail open to the local count, like admission does.

**A key's share when others wait** (issue 43, N4): first come first served let one client key
hold every slot of a connection and keep the queue's head with its next requests (four
streams it never read held both slots of ``max_concurrent: 2``; the other key waited out its
queue timeout for as long as the attacker kept sending). Each slot now records the client key
it serves, and a freed slot goes to the first waiter whose key holds fewer than its share of
the connection (the cap divided among the keys that hold or wait for it), before waiters of
keys already at their share; with none under its share, the order stays first come first
served. A running request is never cut for it: a stream the client stops reading ends at the
send deadline (``FAIRGATE_HTTP_SEND_TIMEOUT_S``), and its slot then goes to the waiting key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fairgate.path.background import Background
from fairgate.quota.ports import SlotLeases
from fairgate.routing import InflightTracker, Lease, Target
from fairgate.timers import Timer

__all__ = ["Slots"]

log = logging.getLogger("fairgate.slots")

#: how long a shared lease lasts without renewal: a dead replica's slots return after this
LEASE_TTL_MS = 30_000
#: how often a waiter asks Redis again when no local release woke it
POLL_MS = 250


@dataclass(eq=False)
class _Waiter:
    wants: dict[str, tuple[Target, int]]  # load key → (target, cap)
    client: str | None = None  # the client key it waits for (None: no share applies)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    granted: tuple[Target, Lease] | None = None
    gone: bool = False


class _KeyedLease(Lease):
    """A slot that knows the client key it serves, so the key's count on the connection is
    given back before the slot is handed on (:meth:`Slots._on_release` reads the counts)."""

    __slots__ = ("_client", "_slots")

    def __init__(self, tracker: InflightTracker, key: str, client: str, slots: Slots) -> None:
        super().__init__(tracker, key)
        self._client = client
        self._slots = slots

    def release(self) -> None:
        if not self.released:
            self._slots._drop(self.key, self._client)
        super().release()


#: a held shared lease: where it was taken (the store may be swapped meanwhile) and its id;
#: None when Redis failed and the slot was granted on the local count alone
_Held = tuple[SlotLeases, str] | None


class Slots:
    def __init__(
        self,
        tracker: InflightTracker,
        shared: Callable[[], SlotLeases | None] = lambda: None,
        *,
        timer: Callable[[], Timer] | None = None,
        lease_ttl_ms: int = LEASE_TTL_MS,
        poll_ms: int = POLL_MS,
    ) -> None:
        self._tracker = tracker
        self._queues: dict[str, deque[_Waiter]] = {}
        self._shared = shared
        self._timer = timer
        self.lease_ttl_ms = lease_ttl_ms
        self.poll_ms = poll_ms
        #: load key → the shared leases held by this process's requests on it
        self._held: dict[str, list[_Held]] = {}
        #: load key → shared acquisitions under way (counted against the local cap meanwhile)
        self._pending: dict[str, int] = {}
        self._tasks = Background()
        self._renewer: asyncio.Task[None] | None = None
        #: load key → client key → the slots this process's requests of that key hold on it
        self._holders: dict[str, dict[str, int]] = {}
        tracker.on_release = self._on_release

    @staticmethod
    def capped(cap: int | None) -> bool:
        return cap is not None and cap > 0

    async def try_acquire(
        self, target: Target, cap: int | None, client: str | None = None
    ) -> Lease | None:
        """A slot now, or None when the connection is at its cap or others queue for it.
        ``client``: the client key the slot serves (its share when others wait)."""
        if not self.capped(cap):
            return self._tracker.acquire(target)
        assert cap is not None
        if self._queues.get(target.load_key):
            return None
        return await self._take(target, cap, client)

    def _grant(self, target: Target, client: str | None) -> Lease:
        """A slot on ``target`` counted for ``client``."""
        lease = self._tracker.acquire(target)
        if client is None:
            return lease
        key = target.load_key
        held = self._holders.setdefault(key, {})
        held[client] = held.get(client, 0) + 1
        # the tracker counted the slot; this handle releases it and the key's count together
        return _KeyedLease(self._tracker, key, client, self)

    def _drop(self, key: str, client: str) -> None:
        held = self._holders.get(key)
        if held is None:
            return
        n = held.get(client, 0) - 1
        if n > 0:
            held[client] = n
            return
        held.pop(client, None)
        if not held:
            del self._holders[key]

    async def _take(self, target: Target, cap: int, client: str | None = None) -> Lease | None:
        key = target.load_key
        if self._tracker.count(target) + self._pending.get(key, 0) >= cap:
            return None
        shared = self._shared()
        if shared is None:
            return self._grant(target, client)
        self._pending[key] = self._pending.get(key, 0) + 1
        try:
            held = await self._acquire_shared(shared, key, cap)
        finally:
            n = self._pending[key] - 1
            if n:
                self._pending[key] = n
            else:
                del self._pending[key]
        if held is False:
            return None
        self._held.setdefault(key, []).append(held)
        self._start_renewer()
        return self._grant(target, client)

    async def _acquire_shared(
        self, shared: SlotLeases, key: str, cap: int
    ) -> _Held | Literal[False]:
        """The lease, False when every replica's leases fill the cap, None when Redis failed
        (fail open on the local count)."""
        lease_id = uuid.uuid4().hex
        now = self._now_ms()
        try:
            ok = await shared.acquire(key, cap, lease_id, now, self.lease_ttl_ms)
        except asyncio.CancelledError:
            # the client left while Redis answered: the lease may have been taken, give it back
            self._spawn(self._release_shared(key, shared, lease_id))
            raise
        except (ConnectionError, TimeoutError, OSError) as exc:
            log.warning("shared slots unavailable (%s): local count only", type(exc).__name__)
            return None
        except Exception as exc:  # redis errors that are neither (a script error)
            log.warning("shared slots failed (%s): local count only", type(exc).__name__)
            return None
        return (shared, lease_id) if ok else False

    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def wait(
        self,
        wants: Sequence[tuple[Target, int]],
        deadline_ms: int,
        timer: Timer,
        client: str | None = None,
    ) -> tuple[Target, Lease] | None:
        """Queue for a slot on any of ``wants`` until ``deadline_ms``; the target that freed
        and its slot, or None on timeout. Cancellation gives a granted slot back."""
        waiter = _Waiter({t.load_key: (t, cap) for t, cap in wants}, client)
        for key in waiter.wants:
            self._queues.setdefault(key, deque()).append(waiter)
        if self._shared() is not None:
            return await self._wait_shared(waiter, deadline_ms, timer)
        try:
            await timer.sleep_until(deadline_ms, waiter.event)
        except BaseException:
            self._leave(waiter)
            if waiter.granted is not None:
                waiter.granted[1].release()
            raise
        self._leave(waiter)
        return waiter.granted

    async def _wait_shared(
        self, waiter: _Waiter, deadline_ms: int, timer: Timer
    ) -> tuple[Target, Lease] | None:
        """Shared slots: the head of a local queue asks Redis when woken by a local release or
        every ``poll_ms``; others wait their turn here."""
        try:
            while True:
                for key, (target, cap) in waiter.wants.items():
                    q = self._queues.get(key)
                    if q and q[0] is waiter:
                        lease = await self._take(target, cap, waiter.client)
                        if lease is not None:
                            return target, lease
                now = timer.clock.now_ms()
                if now >= deadline_ms:
                    return None
                waiter.event.clear()
                await timer.sleep_until(min(deadline_ms, now + self.poll_ms), waiter.event)
        finally:
            self._leave(waiter)

    def _leave(self, waiter: _Waiter) -> None:
        waiter.gone = True
        for key in waiter.wants:
            q = self._queues.get(key)
            if q is None:
                continue
            was_head = bool(q) and q[0] is waiter
            with contextlib.suppress(ValueError):
                q.remove(waiter)
            if not q:
                del self._queues[key]
            elif was_head and self._shared() is not None:
                q[0].event.set()  # the next in line asks now

    def _on_release(self, key: str) -> None:
        held = self._held.get(key)
        if held:
            lease = held.pop()
            if not held:
                del self._held[key]
            if lease is not None:
                self._spawn(self._release_shared(key, *lease))
        q = self._queues.get(key)
        if q:
            self._under_share_first(key, q)
        if q and self._shared() is not None:
            q[0].event.set()  # the head asks Redis for the slot (and may lose it to a replica)
            return
        while q:
            waiter = q[0]
            if waiter.gone or waiter.granted is not None:
                q.popleft()
                continue
            target, cap = waiter.wants[key]
            if self._tracker.count(target) >= cap:
                return
            waiter.granted = (target, self._grant(target, waiter.client))
            self._leave(waiter)
            waiter.event.set()
            return

    def _under_share_first(self, key: str, q: deque[_Waiter]) -> None:
        """Put at the head of ``q`` the first waiter whose client key holds fewer than its
        share of the connection ``key``: the cap divided among the keys that hold a slot on it
        or wait for one. No such waiter: the order stays. One pass over the queue, on a
        release that finds waiters only."""
        holders = self._holders.get(key, {})
        live = [w for w in q if not w.gone and w.granted is None]
        if len(live) < 2 or live[0].client is None:
            return
        keys = set(holders) | {w.client for w in live if w.client is not None}
        share = live[0].wants[key][1] / len(keys)
        if holders.get(live[0].client, 0) < share:
            return  # the head is under its share: first come first served
        for w in live[1:]:
            if w.client is not None and holders.get(w.client, 0) < share:
                q.remove(w)
                q.appendleft(w)
                return

    # -- shared leases: release and renewal off the request path -----------------------------

    async def _release_shared(self, key: str, shared: SlotLeases, lease_id: str) -> None:
        try:
            await shared.release(key, lease_id)
        except Exception as exc:  # the lease expires by itself
            log.warning("shared slot release failed (%s)", type(exc).__name__)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(coro)

    async def settle(self) -> None:
        """Wait for the shared releases still being sent (shutdown, tests)."""
        await self._tasks.settle()

    def held_leases(self) -> int:
        """Shared leases this process holds (its requests running on capped connections)."""
        return sum(len(v) for v in self._held.values())

    async def renew(self) -> int:
        """Push the expiry of every shared lease this process holds; how many were renewed."""
        now = self._now_ms()
        renewed = 0
        by_store: dict[tuple[int, str], tuple[SlotLeases, list[str]]] = {}
        for key, held in self._held.items():
            for lease in held:
                if lease is not None:
                    by_store.setdefault((id(lease[0]), key), (lease[0], []))[1].append(lease[1])
        for (_, key), (shared, ids) in by_store.items():
            try:
                renewed += await shared.renew(key, ids, now, self.lease_ttl_ms)
            except Exception as exc:  # fail open: the request goes on either way
                log.warning("shared slot renewal failed (%s)", type(exc).__name__)
        return renewed

    def _start_renewer(self) -> None:
        if self._timer is not None and (self._renewer is None or self._renewer.done()):
            self._renewer = asyncio.get_running_loop().create_task(
                self._renew_while_held(self._timer()), name="fairgate-slot-renewal"
            )

    async def _renew_while_held(self, timer: Timer) -> None:
        """Renew every third of a lease's life while any lease is held; ends when none is."""
        while self._held:
            await timer.sleep_until(timer.clock.now_ms() + self.lease_ttl_ms // 3)
            if self._held:
                await self.renew()

    async def aclose(self) -> None:
        """Stop renewing and send the releases still under way."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        await self.settle()

    def _now_ms(self) -> int:
        if self._timer is None:
            raise RuntimeError("shared slots need the gateway's timer (its injected clock)")
        return self._timer().clock.now_ms()
