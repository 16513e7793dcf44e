"""The coalescer: a group's calls wait while one batch is in flight and then go together; each
caller gets its own result or the batch's error. No clock: batches are released by hand."""

from __future__ import annotations

import asyncio

import pytest

from fairgate.store.coalesce import Coalescer


class Sender:
    """A store that answers each batch only when the test lets it (``release``)."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[int]]] = []
        self.gates: list[asyncio.Future[None]] = []
        self.fail: BaseException | None = None

    async def __call__(self, group: str, items: list[int]) -> list[int]:
        self.batches.append((group, items))
        gate = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        await gate
        if self.fail is not None:
            raise self.fail
        return [i * 10 for i in items]

    def release(self, n: int = -1) -> None:
        self.gates[n].set_result(None)


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def coalescer(max_batch: int = 64) -> tuple[Sender, Coalescer[str, int, int]]:
    """A coalescer over a fresh :class:`Sender` (batches released by hand)."""
    send = Sender()
    return send, Coalescer(send, max_batch=max_batch)


async def submitted(c: Coalescer[str, int, int], group: str, item: int) -> asyncio.Future[int]:
    """Submit one call and let the loop turn, so it is in a batch (or queued) before the next."""
    call = asyncio.ensure_future(c.submit(group, item))
    await turns()
    return call


async def fail_in_flight_then_the_next_goes(
    send: Sender,
    in_flight: list[asyncio.Future[int]],
    waiting: asyncio.Future[int],
    item: int,
    error: Exception,
) -> None:
    """Fail the batch in flight with ``error``: each of its callers gets that error, and the call
    that waited behind it (``waiting``, for ``item``) still goes, in a batch of its own, and gets
    its own answer."""
    send.fail = error
    send.release()
    for call in in_flight:
        with pytest.raises(type(error), match=str(error)):
            await call
    send.fail = None
    await turns()
    assert send.batches[-1] == ("p1", [item])
    send.release()
    assert await waiting == item * 10


async def test_a_call_to_an_idle_group_goes_at_once_and_the_next_ones_go_together() -> None:
    send, c = coalescer()
    calls = [asyncio.ensure_future(c.submit("p1", i)) for i in range(5)]
    await turns()
    assert send.batches == [("p1", [0])]  # the first found the group idle: it went alone
    send.release()
    await turns()
    assert send.batches == [("p1", [0]), ("p1", [1, 2, 3, 4])]
    send.release()
    assert await asyncio.gather(*calls) == [0, 10, 20, 30, 40]


async def test_a_call_to_an_idle_group_is_sent_on_its_own_loop_turn() -> None:
    sent: list[list[int]] = []

    async def send(group: str, items: list[int]) -> list[int]:
        sent.append(items)  # called synchronously from submit: no task, no loop turn first
        return items

    c = Coalescer(send, max_batch=64)
    call = c.submit("p1", 7).__await__()
    with pytest.raises(StopIteration) as done:
        call.send(None)  # one step of the coroutine: it finishes without yielding to the loop
    assert done.value.value == 7
    assert sent == [[7]]
    assert c._groups == {}


async def test_calls_made_while_a_batch_is_in_flight_wait_and_go_together() -> None:
    send, c = coalescer()
    first = await submitted(c, "p1", 1)
    later = [asyncio.ensure_future(c.submit("p1", i)) for i in (2, 3, 4)]
    await turns()
    assert send.batches == [("p1", [1])]  # nothing more goes out while the first is in flight
    send.release()
    assert await first == 10
    await turns()
    assert send.batches == [("p1", [1]), ("p1", [2, 3, 4])]
    send.release()
    assert await asyncio.gather(*later) == [20, 30, 40]


async def test_groups_do_not_wait_for_each_other() -> None:
    send, c = coalescer()
    a = await submitted(c, "p1", 1)
    b = await submitted(c, "p2", 2)
    assert send.batches == [("p1", [1]), ("p2", [2])]
    send.release(1)
    assert await b == 20
    assert not a.done()
    send.release(0)
    assert await a == 10


async def test_a_batch_is_at_most_max_batch_calls() -> None:
    send = Sender()
    c = Coalescer(send, max_batch=2)
    calls = [asyncio.ensure_future(c.submit("p1", i)) for i in range(6)]
    await turns()
    for expected in ([0], [1, 2], [3, 4], [5]):
        assert send.batches[-1] == ("p1", expected)
        send.release()
        await turns()
    assert await asyncio.gather(*calls) == [0, 10, 20, 30, 40, 50]


async def test_a_failed_batch_fails_each_of_its_calls_and_the_next_batch_still_goes() -> None:
    send, c = coalescer()
    first = await submitted(c, "p1", 0)
    failing = [asyncio.ensure_future(c.submit("p1", i)) for i in (1, 2)]
    await turns()
    send.release()
    assert await first == 0
    await turns()
    assert send.batches[-1] == ("p1", [1, 2])
    later = await submitted(c, "p1", 3)
    await fail_in_flight_then_the_next_goes(send, failing, later, 3, ConnectionError("gone"))


async def test_a_failed_lone_call_raises_to_its_caller_and_what_waited_still_goes() -> None:
    send, c = coalescer()
    lone = await submitted(c, "p1", 1)
    waiting = await submitted(c, "p1", 2)
    await fail_in_flight_then_the_next_goes(send, [lone], waiting, 2, TimeoutError("slow"))


async def test_a_cancelled_caller_leaves_its_call_in_the_batch() -> None:
    send, c = coalescer()
    a = await submitted(c, "p1", 1)
    b = await submitted(c, "p1", 2)
    b.cancel()  # its caller gives up while it waits behind the batch in flight
    await turns()
    send.release()
    assert await a == 10
    await turns()
    assert send.batches[-1] == ("p1", [2])  # still sent: a store write is never dropped
    send.release()
    await c.drain()
    assert b.cancelled()


async def test_drain_waits_for_every_call_handed_in() -> None:
    send, c = coalescer()
    calls = [asyncio.ensure_future(c.submit("p1", 1))]
    await turns()
    calls.append(asyncio.ensure_future(c.submit("p1", 2)))
    drained = asyncio.ensure_future(c.drain())
    await turns()
    assert not drained.done()
    send.release()
    await turns()
    assert not drained.done()  # the second batch is not answered yet
    send.release()
    await drained
    assert [call.result() for call in calls] == [10, 20]
    assert c._groups == {}  # nothing held for an idle group


async def test_a_batch_answered_with_the_wrong_count_fails_its_calls() -> None:
    async def short(group: str, items: list[int]) -> list[int]:
        await asyncio.sleep(0)
        return items[:-1]

    c = Coalescer(short, max_batch=64)
    calls = [asyncio.ensure_future(c.submit("p1", i)) for i in (1, 2, 3)]
    with pytest.raises(RuntimeError, match="a batch of 1 answered 0"):
        await calls[0]
    for call in calls[1:]:
        with pytest.raises(RuntimeError, match="a batch of 2 answered 1"):
            await call


def test_max_batch_must_be_positive() -> None:
    async def send(group: str, items: list[int]) -> list[int]:
        return items

    with pytest.raises(ValueError, match="max_batch"):
        Coalescer(send, max_batch=0)
