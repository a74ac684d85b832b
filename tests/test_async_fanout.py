"""Fan-out on the ring through the asyncio client (AsyncRingQueue, AsyncSubscription), against
the real server: every subscription reads every message in order; the async consumers of one
subscription compete, each message once; an expired lease gives a message back within its
subscription, and the late ack matches nothing; nack; subscribe, unsubscribe, subscriptions;
a fan-out ring's enqueue publishes and its plain dequeue is refused, in the blocking client's
words (both clients run the same calls: RingCalls, SubscriptionCalls)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from queuectl.client import QueueFullError, RingQueue, SubscriptionInfo
from queuectl.client.aio import AsyncRingQueue, AsyncSubscription, open_async_queue
from queuectl.errors import UsageError
from queuectl.install import install_queue
from queuectl.kindspec import RingSettings

from conftest import statements_sent


def fanout(engine, size: int, name: str = "f", **options) -> None:
    install_queue(engine, name, "ring", RingSettings(size=size, fanout=True, **options))


def texts(items) -> list[str]:
    return [m.text for m in items]


async def ring(db_url: str, name: str = "f") -> AsyncRingQueue:
    queue = await open_async_queue(db_url, name)
    assert isinstance(queue, AsyncRingQueue)
    return queue


def test_each_subscription_gets_every_message_in_order(engine, db_url):
    fanout(engine, 16)

    async def run() -> None:
        async with await ring(db_url) as q:
            assert q.fanout
            await q.subscribe("a")
            await q.subscribe("b")
            assert await q.enqueue_many([f"m{i}" for i in range(10)]) == list(range(10))
            a, b = q.subscription("a"), q.subscription("b")
            assert isinstance(a, AsyncSubscription) and q.subscription("a") is a  # one consumer per name
            got_a = await a.dequeue(4) + await a.dequeue(10)
            got_b = await b.dequeue(10)
            assert texts(got_a) == texts(got_b) == [f"m{i}" for i in range(10)]
            assert [m.id for m in got_a] == list(range(10)) and [a.tries(m) for m in got_a] == [1] * 10
            assert await a.ack(got_a) == list(range(10))
            assert await b.ack(got_b) == list(range(10))
            assert await a.dequeue(5) == [] and await b.dequeue(5) == []
            assert await a.ack([]) == []

    asyncio.run(run())


def test_two_async_consumers_of_one_subscription_get_distinct_messages_and_together_all(engine, db_url):
    fanout(engine, 64)

    async def consume(sub: AsyncSubscription, batch: int) -> list[int]:
        seen: list[int] = []
        while got := await sub.dequeue(batch):
            seen += [m.id for m in got]
            assert await sub.ack(got) == sorted(m.id for m in got)
            await asyncio.sleep(0)  # let the other consumer claim in between
        return seen

    async def run() -> None:
        async with await ring(db_url) as producer, await ring(db_url) as c1, await ring(db_url) as c2:
            await producer.subscribe("a")
            await producer.subscribe("b")
            ids = await producer.enqueue_many([f"m{i}" for i in range(40)])
            seen1, seen2 = await asyncio.gather(consume(c1.subscription("a"), 3), consume(c2.subscription("a"), 5))
            assert seen1 and seen2 and not set(seen1) & set(seen2)  # each message to one of them
            assert sorted(seen1 + seen2) == ids  # and together all, once
            assert [m.id for m in await producer.subscription("b").dequeue(100)] == ids  # all again in "b"

    asyncio.run(run())


def test_expired_lease_gives_the_message_back_within_its_subscription_and_the_late_ack_matches_nothing(
        engine, db_url):
    fanout(engine, 8)

    async def run() -> None:
        async with await ring(db_url) as producer, await ring(db_url) as dying, await ring(db_url) as other:
            await producer.subscribe("a")
            await producer.subscribe("b")
            await producer.enqueue_many(["x", "y"])
            first = await dying.subscription("a").dequeue(1, lease=0.2)
            assert texts(first) == ["x"]
            a2 = other.subscription("a")
            assert texts(await a2.dequeue(5)) == ["y"]  # the leased one is not handed out again yet
            deadline = time.monotonic() + 10
            while not (again := await a2.dequeue(5, timeout=0.2)):
                assert time.monotonic() < deadline, "the expired claim never came back"
            assert [(m.id, m.text) for m in again] == [(0, "x")] and a2.tries(again[0]) == 2
            assert await dying.subscription("a").ack(first) == []  # taken again: the late ack matches nothing
            assert await a2.ack(again + [1]) == [0, 1]
            b = producer.subscription("b")
            got_b = await b.dequeue(5)
            assert texts(got_b) == ["x", "y"] and [b.tries(m) for m in got_b] == [1, 1]  # "b" untouched

    asyncio.run(run())


def test_nack_gives_the_message_back_at_once(engine, db_url):
    fanout(engine, 8)

    async def run() -> None:
        async with await ring(db_url) as q:
            await q.subscribe("a")
            await q.enqueue_many(["x", "y"])
            a = q.subscription("a")
            got = await a.dequeue(1)
            assert await a.nack(got) == [0]
            again = await a.dequeue(5)
            assert [(m.id, m.text, a.tries(m)) for m in again] == [(0, "x", 2), (1, "y", 1)]
            with pytest.raises(UsageError, match=r"messages \[7\] were not claimed by this consumer of subscription"):
                await a.nack([0, 7])
            assert await a.ack(again) == [0, 1]

    asyncio.run(run())


def test_subscribe_unsubscribe_and_subscriptions(engine, db_url):
    fanout(engine, 16, lag_limit=4)
    install_queue(engine, "p", "ring", RingSettings(size=8))

    async def run() -> None:
        async with await ring(db_url) as q, await ring(db_url, "p") as plain:
            first = await q.subscribe("early")
            assert isinstance(first, SubscriptionInfo)
            assert (first.name, first.start_pos, first.lag_limit, first.drop_when_behind) == ("early", 0, 4, False)
            await q.enqueue_many(["before1", "before2"])
            late = await q.subscribe("late", lag_limit=8, drop_when_behind=True)
            assert (late.start_pos, late.lag_limit, late.drop_when_behind) == (2, 8, True)
            await q.enqueue("after")
            listed = await q.subscriptions()
            assert [(s.name, s.lag, s.behind, s.claimed) for s in listed] == [
                ("early", 3, False, 0), ("late", 1, False, 0)]
            assert texts(await q.subscription("late").dequeue(10)) == ["after"]
            assert [s.claimed for s in await q.subscriptions()] == [0, 1]
            with pytest.raises(sa.exc.DBAPIError, match="exists"):
                await q.subscribe("late")
            with pytest.raises(UsageError, match="lag_limit must be a whole number"):
                await q.subscribe("c", lag_limit=True)
            assert await q.unsubscribe("late") is True
            assert await q.unsubscribe("late") is False
            assert [s.name for s in await q.subscriptions()] == ["early"]
            for call in (plain.subscribe("a"), plain.unsubscribe("a"), plain.subscriptions()):
                with pytest.raises(UsageError, match="ring 'p' does not fan out: install it with --fanout"):
                    await call
            with pytest.raises(UsageError, match="does not fan out"):
                plain.subscription("a")
            assert await plain.enqueue("x") == 0 and texts(await plain.dequeue(1)) == ["x"]  # a plain ring as before

    asyncio.run(run())


def test_plain_dequeue_on_a_fanout_ring_raises_the_blocking_clients_error(engine, db_url):
    fanout(engine, 8)

    async def run() -> None:
        async with await ring(db_url) as q:
            await q.subscribe("a")
            await q.enqueue("x")
            with pytest.raises(UsageError) as async_err:
                await q.dequeue(1)
            with pytest.raises(UsageError, match="dequeue through a subscription"):
                async with q.processing(1):
                    pass
            assert texts(await q.subscription("a").dequeue(1)) == ["x"]  # nothing was taken
        return str(async_err.value)

    async_text = asyncio.run(run())
    with RingQueue(engine, "f") as sync, pytest.raises(UsageError) as sync_err:
        sync.dequeue(1)
    assert async_text == str(sync_err.value) == (
        "ring 'f' fans out: dequeue through a subscription (queue.subscription(name).dequeue(n))")


def test_enqueue_on_a_fanout_ring_publishes(engine, db_url):
    fanout(engine, 4)

    async def run() -> None:
        async with await ring(db_url) as q:
            await q.subscribe("a")
            await q.subscribe("b")
            driver = SimpleNamespace(connection=SimpleNamespace(driver_connection=q._driver))
            with statements_sent(driver) as sent:
                one = await q.enqueue("x", headers={"k": 1})
                many = await q.enqueue_many(["y", "z"], headers=[None, {"k": 2}])
            assert (one, many) == (0, [1, 2])
            assert len(sent) == 2 and all("f_publish" in text for text in sent)  # one publish per call
            for name in ("a", "b"):
                got = await q.subscription(name).dequeue(5)
                assert [(m.text, m.headers) for m in got] == [("x", {"k": 1}), ("y", None), ("z", {"k": 2})]
            assert await q.enqueue_many([]) == []
            with pytest.raises(UsageError, match="ring queues have no priorities"):
                await q.enqueue("w", priority=1)
            # "a" and "b" hold 0..2 unacknowledged: one free slot, then the ring is full for them
            assert await q.enqueue("w") == 3
            with pytest.raises(QueueFullError) as one_full:
                await q.enqueue("v", timeout=0.1)
            with pytest.raises(QueueFullError) as many_full:
                await q.enqueue_many(["v", "u"], timeout=0.1)
            assert many_full.value.enqueued == []
        return str(one_full.value), str(many_full.value)

    one_text, many_text = asyncio.run(run())
    assert one_text == "ring 'f' stayed full for 0.1 s: nothing was enqueued"
    assert many_text == "ring 'f' stayed full for 0.1 s: 0 of 2 messages enqueued"
    with RingQueue(engine, "f") as sync:  # what the async client published, as the blocking one reads it
        assert texts(sync.subscription("a").dequeue(10)) == ["w"]  # x, y, z: still leased to the async consumer
