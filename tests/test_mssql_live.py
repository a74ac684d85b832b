"""SQL Server, live: the reliable kind's behaviour tests of the PostgreSQL suite
(test_reliable.py, test_concurrency.py), against a real server, through queuectl.client.Queue.

They run only when QUEUECTL_TEST_MSSQL_URL names a SQL Server database the tests may create
schemas in (`make test-mssql`; docs/sqlserver.md). Without it every test here is reported as
SKIPPED with that reason. Each test installs its queue in a fresh schema and removes
everything afterwards (mssql_live_helpers). The other kinds: test_mssql_live_kinds.py; the
jobs and health: test_mssql_live_jobs.py.

PostgreSQL-only, so not tested here: the generations of reliable_0012 (SQL Server keeps the
single meta/data tables, sql/mssql/reliable.sql create_rotation), LISTEN/NOTIFY wake-ups of
workers (SQL Server consumers poll), the asyncio client (pyodbc has no asyncio connection)
and the one-statement-per-call trace (it reads PostgreSQL's wire protocol).
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

import mssql_live_helpers as live
from jobs_helpers import wait_until
from queuectl.catalog import QueueSettings
from queuectl.client import Queue
from queuectl.install import install_queue
from queuectl.names import QueueNames
from queuectl.registry import list_queues

pytestmark = live.requires_mssql
mssql_engine, schema = live.mssql_engine, live.schema  # the shared fixtures


@pytest.fixture
def orders(mssql_engine, schema):
    install_queue(mssql_engine, "orders", schema=schema)
    with Queue(mssql_engine, "orders", schema=schema) as queue:
        yield queue


def meta_row(queue: Queue, item_id: int) -> dict:
    [row] = live.rows(queue.engine, f"SELECT * FROM {queue.names.qualified('meta')} WHERE id = :id", id=item_id)
    return dict(row._mapping)


def test_install_registers_the_queue_and_round_trips_an_item(mssql_engine, schema):
    info = install_queue(mssql_engine, "orders", schema=schema)
    assert (info.name, info.kind) == ("orders", "reliable")
    with mssql_engine.connect() as conn:
        assert [q.name for q in list_queues(conn, schema)] == ["orders"]
    with Queue(mssql_engine, "orders", schema=schema) as queue:
        item = queue.enqueue(b"\x00\xffbinary", headers={"trace": "abc"}, title="first")
        [message] = queue.dequeue(5, lease=60)
        assert (message.id, message.payload, message.headers, message.attempts) == (item, b"\x00\xffbinary", {"trace": "abc"}, 1)
        assert message.title == "first"
        assert (message.leased_until - message.dequeued_at).total_seconds() == pytest.approx(60, abs=1)
        assert queue.counts() == {"ready": 0, "scheduled": 0, "processing": 1, "done": 0, "dead": 0}
        assert queue.ack([message]) == 1
        assert queue.counts() == {"ready": 0, "scheduled": 0, "processing": 0, "done": 1, "dead": 0}
        assert queue.dequeue(5) == []


def test_enqueue_many_pairs_each_payload_with_its_own_id(mssql_engine, schema):
    install_queue(mssql_engine, "orders", schema=schema)
    with Queue(mssql_engine, "orders", schema=schema) as queue:
        payloads = [f"item-{i}".encode() for i in range(300)] + [b""]
        ids = queue.enqueue_many(payloads, headers=[{"n": i} for i in range(301)])
        assert len(ids) == 301 and len(set(ids)) == 301
        got = {m.id: (m.payload, m.headers) for m in queue.dequeue(1000)}
    assert got == {i: (p, {"n": n}) for n, (i, p) in enumerate(zip(ids, payloads))}


def test_dequeue_order_is_priority_then_due_time_then_id(orders):
    low = orders.enqueue("low", priority=5)
    urgent_late = orders.enqueue("urgent-second", priority=0)
    urgent_early = orders.enqueue("urgent-first", priority=0)
    # same priority: the earlier due time wins even though its id is larger
    live.execute(orders.engine, f"UPDATE {orders.names.qualified('meta')} "
                                "SET due_at = DATEADD(minute, -1, SYSUTCDATETIME()) WHERE id = :id", id=urgent_early)
    mid = orders.enqueue("mid", priority=2)
    assert [m.id for m in orders.dequeue(10)] == [urgent_early, urgent_late, mid, low]


def test_dequeue_one_at_a_time_follows_the_same_order(orders):
    ids = orders.enqueue_many(["c", "a", "b"], priority=[3, 1, 2])
    assert [orders.dequeue(1)[0].id for _ in range(3)] == [ids[1], ids[2], ids[0]]


def test_delayed_item_is_scheduled_until_due(orders):
    item_id = orders.enqueue("later", delay=1.0)
    assert orders.counts()["scheduled"] == 1
    assert orders.dequeue(1) == []
    [message] = wait_until(lambda: orders.dequeue(1), timeout=5)
    assert message.id == item_id


def test_nack_retries_with_exponential_backoff_then_dead(mssql_engine, schema):
    install_queue(mssql_engine, "jobs", settings=QueueSettings(max_attempts=3, backoff_base_seconds=1,
                                                               backoff_max_seconds=60), schema=schema)
    with Queue(mssql_engine, "jobs", schema=schema) as queue:
        item_id = queue.enqueue("flaky")
        delays = []
        for attempt in (1, 2):
            [message] = wait_until(lambda: queue.dequeue(1), timeout=10)
            assert message.attempts == attempt
            assert queue.nack([message], f"failure {attempt}") == {item_id: "ready"}
            row = meta_row(queue, item_id)
            delays.append((row["due_at"] - message.dequeued_at).total_seconds())
            assert row["last_error"] == f"failure {attempt}"
        assert delays[0] == pytest.approx(1.0, abs=0.3)  # backoff doubles: 1 s, then 2 s
        assert delays[1] == pytest.approx(2.0, abs=0.3)
        [message] = wait_until(lambda: queue.dequeue(1), timeout=10)
        assert message.attempts == 3
        assert queue.nack([message], "final failure") == {item_id: "dead"}
        row = meta_row(queue, item_id)
        assert row["status"] == 3 and row["last_error"] == "final failure" and row["finished_at"] is not None
        assert queue.counts()["dead"] == 1
        time.sleep(0.2)
        assert queue.dequeue(1) == []


def test_nack_backoff_is_capped_by_max_delay(orders):
    orders.enqueue("x")
    [message] = orders.dequeue(1)
    orders.nack([message], "err", base_delay=100, max_delay=5)
    row = meta_row(orders, message.id)
    assert (row["due_at"] - message.dequeued_at).total_seconds() == pytest.approx(5, abs=0.5)


def test_an_expired_lease_is_taken_back_with_its_attempt_counted(mssql_engine, schema):
    install_queue(mssql_engine, "orders", schema=schema)
    with Queue(mssql_engine, "orders", schema=schema) as first, Queue(mssql_engine, "orders", schema=schema) as second:
        item = first.enqueue("slow")
        [held] = first.dequeue(1, lease=1)
        assert second.dequeue(1) == []  # leased: invisible to others
        [again] = wait_until(lambda: second.dequeue(1, lease=60), timeout=30, interval=0.1)
        assert (again.id, again.attempts) == (item, 2)
        assert first.ack([held]) == 0  # the first consumer lost its lease: it cannot finish the item
        assert second.ack([again]) == 1


def test_extend_lease_keeps_items_held(orders, mssql_engine, schema):
    orders.enqueue("long")
    [message] = orders.dequeue(1, lease=0.5)
    with Queue(mssql_engine, "orders", schema=schema) as other:
        for _ in range(4):
            assert orders.extend_lease([message], lease=0.5) == [message.id]
            time.sleep(0.3)
            assert other.dequeue(1) == []
        assert orders.ack([message]) == 1
        assert other.extend_lease([message.id]) == []  # not held by the other client


def test_release_gives_items_back_without_using_an_attempt(orders):
    orders.enqueue("x")
    [message] = orders.dequeue(1)
    assert orders.release([message]) == 1
    [again] = orders.dequeue(1)
    assert again.id == message.id and again.attempts == 1


def test_processing_acks_on_success_and_nacks_on_exception(orders):
    orders.enqueue_many(["ok-1", "ok-2"])
    with orders.processing(2) as batch:
        assert len(batch) == 2
    assert orders.counts()["done"] == 2
    item_id = orders.enqueue("bad")
    with pytest.raises(ValueError):
        with orders.processing(1):
            raise ValueError("cannot parse")
    row = meta_row(orders, item_id)
    assert row["status"] == 0 and row["last_error"] == "ValueError: cannot parse"


def test_ack_and_dequeue_acks_the_done_items_and_claims_the_next_batch(orders):
    ids = orders.enqueue_many([f"m{i}" for i in range(6)])
    first = orders.dequeue(3)
    second = orders.ack_and_dequeue(first, 3)
    assert [m.id for m in second] == ids[3:]
    assert orders.counts() == {"ready": 0, "scheduled": 0, "processing": 3, "done": 3, "dead": 0}


def test_every_item_is_dequeued_exactly_once_by_concurrent_consumers(mssql_engine, schema):
    install_queue(mssql_engine, "orders", schema=schema)
    with Queue(mssql_engine, "orders", schema=schema) as producer:
        ids = [i for _ in range(0, 4000, 500) for i in producer.enqueue_many([b"x"] * 500)]
    ctx = live.spawn()
    done, out = ctx.Event(), ctx.Queue()
    consumers = [ctx.Process(target=live.consume_reliable, args=(live.MSSQL_URL, schema, "orders", done, out))
                 for _ in range(4)]
    for p in consumers:
        p.start()
    done.set()
    taken = Counter(i for _ in consumers for i in out.get(timeout=300))
    for p in consumers:
        p.join(60)
    assert taken == Counter(ids)  # every item once: none lost, none twice


def test_single_runner_lock_is_exclusive_per_session(mssql_engine, schema):
    from queuectl import locks

    key = f"test:{schema}"
    with mssql_engine.connect() as a, mssql_engine.connect() as b:
        assert locks.try_take(a, key) is True
        assert locks.try_take(b, key) is False
        assert "held by" in locks.busy_message(b, locks.Lock(schema, "test", "the test lock"), key)
        assert locks.release(a, key) is True
        assert locks.try_take(b, key) is True
        locks.release(b, key)


def test_storage_health_reads_the_queue_tables(mssql_engine, schema):
    from queuectl.engine import adapter_for

    install_queue(mssql_engine, "orders", schema=schema)
    with mssql_engine.connect() as conn:
        found = adapter_for(mssql_engine).storage_health(conn, QueueNames("orders", schema))
    assert {r["table_name"] for r in found} == {"orders_meta", "orders_data", "orders_history"}
