"""The reliable queue's behaviour through the Python client, against a real server."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from conftest import statements_sent
from jobs_helpers import wait_until
from queuectl.catalog import QueueSettings
from queuectl.client import Queue
from queuectl.errors import UsageError
from queuectl.install import install_queue
from queuectl.sqlfiles import render, sections, split_statements


def meta_row(queue: Queue, item_id: int) -> sa.RowMapping:
    with queue.engine.connect() as conn:
        return conn.execute(
            sa.text(f"SELECT * FROM {queue.names.qualified('meta')} WHERE id = :id"), {"id": item_id}
        ).mappings().one()


def test_enqueue_then_dequeue_returns_payload_headers_and_lease(orders: Queue):
    item_id = orders.enqueue(b"\x00\xffbinary", headers={"trace": "abc"}, title="first")
    [message] = orders.dequeue(5, lease=60)
    assert message.id == item_id
    assert message.payload == b"\x00\xffbinary"
    assert message.headers == {"trace": "abc"}
    assert message.title == "first"
    assert message.attempts == 1
    assert (message.leased_until - message.dequeued_at).total_seconds() == pytest.approx(60, abs=1)
    assert orders.counts() == {"ready": 0, "scheduled": 0, "processing": 1, "done": 0, "dead": 0}
    assert orders.ack([message]) == 1
    assert orders.counts()["done"] == 1
    assert orders.dequeue(5) == []


def test_enqueue_many_pairs_each_payload_with_its_own_id(orders: Queue):
    payloads = [f"item-{i}".encode() for i in range(500)] + [b""]
    ids = orders.enqueue_many(payloads, headers=[{"n": i} for i in range(501)])
    assert len(ids) == 501 and len(set(ids)) == 501
    got = {m.id: (m.payload, m.headers) for m in orders.dequeue(1000)}
    assert got == {i: (p, {"n": n}) for n, (i, p) in enumerate(zip(ids, payloads))}


def test_dequeue_order_is_priority_then_due_time_then_id(orders: Queue):
    low = orders.enqueue("low", priority=5)
    urgent_late = orders.enqueue("urgent-second", priority=0)
    urgent_early = orders.enqueue("urgent-first", priority=0, delay=0)
    # same priority: the earlier due time wins even though its id is larger
    with orders.engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE {orders.names.qualified('meta')} SET due_at = now() - interval '1 minute' WHERE id = :id"),
            {"id": urgent_early},
        )
    mid = orders.enqueue("mid", priority=2)
    order = [m.id for m in orders.dequeue(10)]
    assert order == [urgent_early, urgent_late, mid, low]


def test_dequeue_one_at_a_time_follows_the_same_order(orders: Queue):
    ids = orders.enqueue_many(["c", "a", "b"], priority=[3, 1, 2])
    taken = [orders.dequeue(1)[0].id for _ in range(3)]
    assert taken == [ids[1], ids[2], ids[0]]


def test_delayed_item_is_scheduled_until_due(orders: Queue):
    item_id = orders.enqueue("later", delay=1.0)
    assert orders.counts()["scheduled"] == 1
    assert orders.dequeue(1) == []
    [message] = wait_until(lambda: orders.dequeue(1), timeout=5)
    assert message.id == item_id


def test_nack_retries_with_exponential_backoff_then_dead(engine):
    install_queue(engine, "jobs", settings=QueueSettings(max_attempts=3, backoff_base_seconds=1, backoff_max_seconds=60))
    queue = Queue(engine, "jobs")
    item_id = queue.enqueue("flaky")
    delays = []
    for attempt in (1, 2):
        [message] = wait_until(lambda: queue.dequeue(1), timeout=10)
        assert message.attempts == attempt
        assert queue.nack([message], f"failure {attempt}") == {item_id: "ready"}
        row = meta_row(queue, item_id)
        delays.append((row["due_at"] - message.dequeued_at).total_seconds())
        assert row["last_error"] == f"failure {attempt}"
    # backoff doubles: 1 s after the first failure, 2 s after the second
    assert delays[0] == pytest.approx(1.0, abs=0.3)
    assert delays[1] == pytest.approx(2.0, abs=0.3)
    [message] = wait_until(lambda: queue.dequeue(1), timeout=10)
    assert message.attempts == 3
    assert queue.nack([message], "final failure") == {item_id: "dead"}
    row = meta_row(queue, item_id)
    assert row["status"] == 3 and row["last_error"] == "final failure" and row["finished_at"] is not None
    assert queue.counts()["dead"] == 1
    time.sleep(0.2)
    assert queue.dequeue(1) == []
    queue.close()


def test_nack_backoff_is_capped_by_max_delay(orders: Queue):
    orders.enqueue("x")
    [message] = orders.dequeue(1)
    orders.nack([message], "err", base_delay=100, max_delay=5)
    row = meta_row(orders, message.id)
    assert (row["due_at"] - message.dequeued_at).total_seconds() == pytest.approx(5, abs=0.5)


def test_expired_lease_is_reclaimed_by_the_next_dequeue(orders: Queue, db_url):
    item_id = orders.enqueue("slow")
    [first] = orders.dequeue(1, lease=0.5)
    other = Queue(db_url, "orders")
    assert other.dequeue(1) == []  # still leased
    [again] = wait_until(lambda: other.dequeue(1), timeout=5)
    assert again.id == item_id and again.attempts == 2
    # the first holder lost its lease: its ack is refused, the new holder's succeeds
    assert orders.ack([first]) == 0
    assert other.ack([again]) == 1
    other.close()


def test_extend_lease_keeps_items_held(orders: Queue, db_url):
    orders.enqueue("long")
    [message] = orders.dequeue(1, lease=0.5)
    other = Queue(db_url, "orders")
    for _ in range(4):
        assert orders.extend_lease([message], lease=0.5) == [message.id]
        time.sleep(0.3)
        assert other.dequeue(1) == []
    assert orders.ack([message]) == 1
    assert other.extend_lease([message.id]) == []  # not held by the other client
    other.close()


def test_release_gives_items_back_without_using_an_attempt(orders: Queue):
    orders.enqueue("x")
    [message] = orders.dequeue(1)
    assert orders.release([message]) == 1
    [again] = orders.dequeue(1)
    assert again.id == message.id and again.attempts == 1


def test_processing_acks_on_success_and_nacks_on_exception(orders: Queue):
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


def test_bad_arguments_are_refused_before_reaching_the_database(orders: Queue):
    for bad in (0, -1, 10_001, True, 2.5):
        with pytest.raises(UsageError):
            orders.dequeue(bad)
    with pytest.raises(UsageError):
        orders.enqueue(12345)  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        orders.enqueue("x", priority=40_000)
    with pytest.raises(UsageError):
        orders.enqueue("x", delay=-1)
    with pytest.raises(UsageError):
        orders.enqueue_many(["a", "b"], headers=[{}])
    assert orders.counts()["ready"] == 0


def test_dequeue_is_one_statement_per_batch(orders: Queue):
    """The client sends one statement per dequeue, and the function runs one statement."""
    orders.enqueue_many([f"m{i}" for i in range(30)])
    with statements_sent(orders._conn) as statements:
        batch = orders.dequeue(25)
    assert len(batch) == 25
    assert len(statements) == 1 and "dequeue" in statements[0]
    # the function body (the head's, reliable_0005): RETURN QUERY followed by exactly one SQL statement
    body = render("postgresql", "reliable", "create_dequeue_0005", {**orders.names.template_values(), **QueueSettings().as_dict()})
    dequeue_fn = next(s for s in split_statements(body) if '"orders_dequeue"' in s.split("(")[0])
    inner = dequeue_fn.split("$fn$")[1]
    assert inner.count("RETURN QUERY") == 1
    query = inner.split("RETURN QUERY", 1)[1].rsplit("END", 1)[0]
    assert len(split_statements(query)) == 1
    assert "FOR UPDATE SKIP LOCKED" in query and "UPDATE" in query and "JOIN" in query


def test_sql_files_have_the_sections_the_client_uses():
    names = set(sections("postgresql", "reliable"))
    assert {"create_tables", "create_rotation", "create_rotator", "create_functions", "drop_functions", "drop_tables",
            "enqueue", "enqueue_many",
            "dequeue", "ack", "nack", "extend_lease", "release", "counts"} <= names
