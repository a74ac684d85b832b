"""The asyncio clients (queuectl.client.aio) and the async worker (queuectl.asyncworker),
against the real server: the blocking clients' calls, results, errors and reconnect rules;
every kind through open_async_queue; a business row and its task in one transaction; an
async worker that wakes on notifications, keeps slow handlers' leases, nacks failures, and
on SIGTERM loses nothing and runs nothing twice."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

from queuectl.client import EnqueueOutcomeUnknown, Queue
from queuectl.client.aio import (
    AsyncFifoQueue, AsyncHeapQueue, AsyncPendingQueue, AsyncQueue, AsyncRingQueue, AsyncStackQueue,
    AsyncWatermarkQueue, open_async_queue,
)
from queuectl.errors import ConnectionFailed, NotInstalledError, PayloadTooLarge, UsageError
from queuectl.install import install_queue
from queuectl.kindspec import settings_for

from conftest import statements_sent

ROOT = Path(__file__).resolve().parent.parent


def _terminate(admin_engine, pid: int) -> None:
    with admin_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid}).scalar_one()


def _sent(queue):
    """statements_sent() on an async client's psycopg connection."""
    return statements_sent(SimpleNamespace(connection=SimpleNamespace(driver_connection=queue._driver)))


def test_async_queue_makes_the_blocking_queues_calls_one_statement_each(orders, db_url):
    async def run() -> None:
        queue = await AsyncQueue.open(db_url, "orders", worker="w1")
        try:
            with _sent(queue) as sent:
                first = await queue.enqueue(b"a", title="first", headers={"k": 1})
                more = await queue.enqueue_many(["b", "c", "d"], priority=[0, 1, 2], delay=[0, 0, 3600])
                batch = await queue.dequeue(10, lease=30)
            assert len(sent) == 3  # one statement per call
            assert [m.id for m in batch] == [first, more[0], more[1]] and batch[0].headers == {"k": 1}
            assert batch[0].title == "first" and batch[0].payload == b"a" and batch[1].text == "b"
            assert await queue.ack([batch[0]]) == 1
            assert await queue.nack([batch[1].id], ValueError("bad input")) == {batch[1].id: "ready"}
            assert await queue.extend_lease(batch[2:], lease=60) == [batch[2].id]
            assert await queue.release(batch[2:]) == 1
            assert (await queue.ack([]), await queue.nack([]), await queue.extend_lease([])) == (0, {}, [])
            taken = await queue.ack_and_dequeue([], 5)
            assert [m.id for m in taken] == [more[1]]
            async with queue.processing(1) as nothing:
                assert nothing == []  # the retried item waits for its backoff, the last for its delay
            counts = await queue.counts()
            assert counts == {"ready": 0, "scheduled": 2, "processing": 1, "done": 1, "dead": 0}
            await queue.enqueue(b"e")
            with pytest.raises(RuntimeError):
                async with queue.processing(1) as failing:
                    assert [m.payload for m in failing] == [b"e"]
                    raise RuntimeError("handler broke")
            assert (await queue.counts())["scheduled"] == 3  # nacked with its backoff
        finally:
            await queue.close()

    asyncio.run(run())
    with Queue(db_url, "orders") as sync:  # what the async client wrote, as the blocking one reads it
        with sync.engine.connect() as conn:
            errors = conn.execute(sa.text(f"SELECT last_error FROM {sync.names.qualified('meta')} "
                                          "WHERE last_error IS NOT NULL ORDER BY id")).scalars().all()
    assert errors == ["ValueError: bad input", "RuntimeError: handler broke"]


def test_the_async_clients_refuse_what_the_blocking_ones_refuse_in_the_same_words(orders, db_url, engine):
    install_queue(engine, "events", "heap")
    sync = Queue(engine, "orders")
    bad_calls = [
        ("enqueue", (b"x",), {"priority": 99999}),
        ("enqueue", (b"x",), {"delay": -1}),
        ("enqueue_many", ([b"x", b"y"],), {"priority": [1]}),
        ("dequeue", (0,), {}),
        ("ack", ("12",), {}),
        ("nack", ([0],), {}),
        ("extend_lease", ([1],), {"lease": 0}),
    ]

    async def run() -> None:
        queue = await open_async_queue(db_url, "orders")
        heap = await open_async_queue(db_url, "events")
        try:
            for name, args, kwargs in bad_calls:
                with pytest.raises(UsageError) as sync_err:
                    getattr(sync, name)(*args, **kwargs)
                with pytest.raises(UsageError) as async_err:
                    await getattr(queue, name)(*args, **kwargs)
                assert str(async_err.value) == str(sync_err.value) and "\n" not in str(async_err.value)
            with pytest.raises(UsageError, match="heap queues have no priorities"):
                await heap.enqueue(b"x", priority=1)
            with pytest.raises(PayloadTooLarge) as too_large:
                await queue.enqueue(b"x" * (queue.info.settings.max_payload_bytes + 1))
            assert "\n" not in str(too_large.value)
            async with queue.transaction():
                with pytest.raises(UsageError, match="do not nest"):
                    async with queue.transaction():
                        pass
        finally:
            await heap.close()
            await queue.close()
        with pytest.raises(NotInstalledError, match="queue 'nope' is not installed"):
            await open_async_queue(db_url, "nope")
        with pytest.raises(UsageError, match="AsyncQueue speaks 'reliable'.*open_async_queue"):
            await AsyncQueue.open(db_url, "events")
        with pytest.raises(UsageError) as mssql:
            await open_async_queue("mssql+pyodbc://sa:pw@localhost/db", "orders")
        assert str(mssql.value).startswith("the asyncio clients speak PostgreSQL only") and "\n" not in str(mssql.value)

    asyncio.run(run())
    sync.close()


@pytest.mark.parametrize("kind, client", [
    ("heap", AsyncHeapQueue), ("fifo", AsyncFifoQueue), ("stack", AsyncStackQueue), ("pending", AsyncPendingQueue),
    ("watermark", AsyncWatermarkQueue), ("ring", AsyncRingQueue),
])
def test_open_async_queue_gives_every_kind_its_client(kind, client, db_url, engine):
    install_queue(engine, "q1", kind, settings_for(kind, **({"size": 8} if kind == "ring" else {})))

    async def run() -> None:
        queue = await open_async_queue(db_url, "q1")
        assert type(queue) is client and queue.kind == kind
        try:
            ids = await queue.enqueue_many([b"a", b"b", b"c"])
            single = await queue.enqueue("d")
            assert len(ids) == 3 and single not in ids
            if kind != "ring":  # a ring pop rolled back waits for repair() (RingQueue's docstring)
                with pytest.raises(RuntimeError):
                    async with queue.processing(2) as batch:
                        assert len(batch) == 2
                        raise RuntimeError("roll back")
                assert (await queue.counts())["ready"] == 4  # the rolled-back batch is back
            taken = [item.payload for item in await queue.dequeue(10)]
            assert sorted(taken) == [b"a", b"b", b"c", b"d"]
            if kind in ("fifo", "watermark"):
                assert taken == [b"a", b"b", b"c", b"d"]
            if kind == "stack":
                assert taken == [b"d", b"c", b"b", b"a"]
            if kind == "watermark":
                assert (await queue.correct_watermark()).queue == "q1"
                assert "low" in await queue.stored_watermark()
            assert await queue.dequeue(5) == []
            if kind == "ring":
                assert (await queue.repair()).tombstoned == []
        finally:
            await queue.close()
        if kind == "ring":
            # the empty pop kept its claimed position; close() gave it up (a tombstone)
            assert [(c.side, c.outcome) for c in queue.released] == [("pop", "tombstoned")]

    asyncio.run(run())


def test_a_terminated_backend_is_handled_as_the_blocking_client_does(orders, db_url, admin_engine, engine):
    def meta_count() -> int:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT count(*) FROM queuectl.orders_meta")).scalar_one()

    async def run() -> None:
        queue = await AsyncQueue.open(db_url, "orders")
        try:
            ids = await queue.enqueue_many([b"a", b"b", b"c"])
            _terminate(admin_engine, queue.backend_pid)
            batch = await queue.dequeue(10)  # resent on a new connection
            assert sorted(m.id for m in batch) == sorted(ids) and queue.reconnects == 1
            _terminate(admin_engine, queue.backend_pid)
            assert await queue.ack(batch) == 3 and queue.reconnects == 2
            _terminate(admin_engine, queue.backend_pid)
            with pytest.raises(EnqueueOutcomeUnknown) as unknown:
                await queue.enqueue(b"maybe")  # sent on a dead connection: never resent
            assert "may or may not have committed" in str(unknown.value) and "\n" not in str(unknown.value)
            assert queue.reconnects == 2 and meta_count() == 3
            await queue.enqueue(b"sure")  # the next call reconnects before sending
            assert meta_count() == 4
            with pytest.raises(ConnectionFailed, match="lost inside transaction"):
                async with queue.transaction():
                    await queue.enqueue(b"in a dying transaction")
                    _terminate(admin_engine, queue.backend_pid)
                    await queue.enqueue(b"after")
            assert meta_count() == 4  # the transaction rolled back whole
            queue.retry_total = 0.5
            await queue.engine.dispose()
            with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(sa.text("ALTER DATABASE " + queue.engine.url.database + " ALLOW_CONNECTIONS false"))
            try:  # the dying transaction's connection was dropped: the next call must reconnect
                assert queue.backend_pid is None
                with pytest.raises(ConnectionFailed) as gave_up:
                    await queue.dequeue(1)
                assert str(gave_up.value).startswith("dequeue on queue 'orders': gave up reconnecting")
                assert "\n" not in str(gave_up.value)
            finally:
                with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    conn.execute(sa.text("ALTER DATABASE " + queue.engine.url.database + " ALLOW_CONNECTIONS true"))
        finally:
            await queue.close()

    asyncio.run(run())


@pytest.mark.slow
def test_the_async_worker_wakes_on_notify_keeps_slow_leases_and_nacks_failures(orders, db_url):
    async def run() -> None:
        producer = await AsyncQueue.open(db_url, "orders")
        consumer = await AsyncQueue.open(db_url, "orders")
        seen: dict[str, float] = {}

        async def handler(message) -> None:
            seen[message.text] = time.monotonic()
            if message.text == "slow":
                await asyncio.sleep(1.2)  # twice the lease: the heartbeat keeps it
            if message.text == "bad":
                raise ValueError("cannot handle bad")

        from queuectl.asyncworker import AsyncWorker

        # polls only every 30 s: an item is seen within a second only if a notification woke it
        worker = AsyncWorker(consumer, handler, concurrency=2, lease=0.6, poll_interval=30, handle_signals=False)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(0.5)  # idle, registered, asleep
        sent = time.monotonic()
        await producer.enqueue_many([b"fast", b"slow", b"bad"])
        for _ in range(100):
            if len(seen) == 3 and worker.stats.processed == 2:
                break
            await asyncio.sleep(0.05)
        worker.stop()
        stats = await task
        assert seen["fast"] - sent < 1.0 and stats.notifications >= 1
        assert (stats.processed, stats.failed, stats.lost) == (2, 1, 0) and stats.heartbeats >= 1
        counts = await producer.counts()
        assert counts["done"] == 2 and counts["processing"] == 0
        await producer.close()
        await consumer.close()

    asyncio.run(run())


@pytest.mark.slow
def test_an_async_looker_outrun_to_a_notification_gives_its_registration_up_and_takes_it_back_soon(
        orders, db_url, engine):
    """The blocking worker's rule ("Many consumers"): a look after a notification that finds
    nothing gives the registration up. The looker (here the lone worker, holding the queue's
    seat) looks again after the gather window's 50 ms, not after its back-off poll, and
    registers again: it is the one consumer producers announce items to."""
    from test_notify import waiting_sessions

    async def until(condition, what: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.01)

    async def run() -> None:
        from queuectl.asyncworker import AsyncWorker

        producer = await AsyncQueue.open(db_url, "orders")
        consumer = await AsyncQueue.open(db_url, "orders")
        seen: dict[str, float] = {}

        async def handler(message) -> None:
            seen[message.text] = time.monotonic()

        worker = AsyncWorker(consumer, handler, poll_interval=3, min_poll_interval=1.5, handle_signals=False)
        task = asyncio.create_task(worker.run())
        try:
            # registered, and asleep after its one more look (what comes with the registration's reply is drained)
            await until(lambda: waiting_sessions(engine) == 1 and worker.stats.empty_polls >= 2, "the idle worker's sleep")
            notified, looks = worker.stats.notifications, worker.stats.empty_polls
            with engine.connect() as conn:  # a notification with nothing behind it: another consumer was faster
                conn.execute(sa.text("SELECT pg_notify(:channel, '')"), {"channel": consumer.names.channel})
                conn.commit()
            outrun = time.monotonic()
            await until(lambda: worker.stats.empty_polls >= looks + 3,
                        "the outrun look, the look 50 ms later and the one after registering again")
            assert time.monotonic() - outrun < 1.0  # not the back-off poll's 1.35-1.65 s
            assert worker.stats.notifications == notified + 1
            await until(lambda: waiting_sessions(engine) == 1, "the registration taken back")
            sent = time.monotonic()
            await producer.enqueue(b"announced")
            await until(lambda: "announced" in seen, "the wake-up", timeout=10)
            assert seen["announced"] - sent < 1.0  # announced, not found by the 1.5 s poll
            assert worker.stats.notifications >= notified + 2
        finally:
            worker.stop()
            stats = await task
            await producer.close()
            await consumer.close()
        assert stats.processed == 1 and stats.failed == 0

    asyncio.run(run())


@pytest.mark.slow
def test_sigterm_of_an_async_worker_loses_nothing_and_runs_nothing_twice(orders, db_url, engine):
    with engine.connect() as conn:
        conn.execute(sa.text("CREATE TABLE runs (item bigint NOT NULL)"))
        conn.commit()
    with Queue(engine, "orders") as queue:
        ids = queue.enqueue_many([f"item {n}" for n in range(200)])
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "async_workers.py"), db_url, "orders", "8", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert worker.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if conn.execute(sa.text("SELECT count(*) FROM runs")).scalar_one() >= 40:
                    break
            time.sleep(0.05)
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
    finally:
        worker.kill()
    assert worker.returncode == 0, err.decode()
    assert b"stopped processed=" in out
    with engine.connect() as conn:
        statuses = dict(conn.execute(sa.text("SELECT status, count(*) FROM queuectl.orders_meta GROUP BY status")).all())
        runs = conn.execute(sa.text("SELECT item FROM runs")).scalars().all()
        done = set(conn.execute(sa.text("SELECT id FROM queuectl.orders_meta WHERE status = 2")).scalars())
    assert 1 not in statuses  # nothing left leased: finished or given back
    assert 40 <= len(runs) < 200 and len(runs) == len(set(runs)) == statuses[2]  # each run once, each acked
    assert set(runs) == done

    async def finish() -> None:  # what the stopped worker gave back is all there, and runs once
        queue = await AsyncQueue.open(db_url, "orders")
        rest: list[int] = []

        async def handler(message) -> None:
            rest.append(message.id)

        await queue.consume(handler, burst=True, handle_signals=False, batch=50)
        await queue.close()
        assert sorted(rest + runs) == sorted(ids)

    asyncio.run(finish())


@pytest.mark.slow
def test_the_async_service_example_commits_each_order_with_its_task(orders, db_url, engine):
    result = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / "async_service.py"), db_url, "20"],
                            capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout) == {"placed": 20, "confirmed": 20, "processed": 20, "failed": 0}
    assert b"refused as expected: UniqueViolation" in result.stderr
    with engine.connect() as conn:  # the refused order's task rolled back with its row
        assert conn.execute(sa.text("SELECT count(*) FROM queuectl.orders_meta")).scalar_one() == 20
