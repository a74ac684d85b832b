"""A statement timeout on the dequeue path: the meta table is locked (ACCESS EXCLUSIVE) by
another session for a few seconds while consumers run with a short statement_timeout.

The client raises StatementCanceled (one line; the statement rolled back, so nothing was
claimed and calling again is safe); the Worker logs one line per cancel and goes on; no
item is lost or stuck."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from queuectl.client import Queue
from queuectl.engine import make_engine
from queuectl.errors import QueuectlError, StatementCanceled
from queuectl.install import install_queue
from queuectl.worker import Worker

TIMEOUT_MS = 300


def with_statement_timeout(db_url: str, ms: int = TIMEOUT_MS) -> str:
    """The URL with a session statement_timeout for every connection made from it."""
    url = make_url(db_url).update_query_dict({"options": f"-c statement_timeout={ms}"})
    return url.render_as_string(hide_password=False)


@contextmanager
def meta_locked(engine, queue: Queue, seconds: float):
    """Hold ACCESS EXCLUSIVE on the queue's meta table for `seconds`, in a thread."""
    taken = threading.Event()

    def hold() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text(f"LOCK TABLE {queue.names.qualified('meta')} IN ACCESS EXCLUSIVE MODE"))
            taken.set()
            time.sleep(seconds)
            conn.commit()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert taken.wait(30), "could not take the lock"
    try:
        yield
    finally:
        thread.join(seconds + 30)


def test_a_dequeue_canceled_by_statement_timeout_raises_one_line_and_claims_nothing(db_url, engine):
    install_queue(engine, "orders")
    producer = Queue(engine, "orders")
    ids = producer.enqueue_many([b"a", b"b", b"c"])
    slow = make_engine(with_statement_timeout(db_url), pool_size=1)
    consumer = Queue(slow, "orders", worker="timed")
    with meta_locked(engine, producer, 2.0):
        started = time.monotonic()
        with pytest.raises(StatementCanceled) as err:
            consumer.dequeue(10)
        assert time.monotonic() - started < 1.9  # canceled by the timeout, not by the lock's end
    message = str(err.value)
    assert isinstance(err.value, QueuectlError) and "\n" not in message
    assert message.startswith("dequeue on queue 'orders' was canceled by the server and rolled back")
    assert "statement timeout" in message and "nothing was claimed" in message
    assert consumer.reconnects == 0  # a canceled statement is not a lost connection
    # nothing was claimed: every item is still ready, and the same client goes on
    assert producer.counts()["ready"] == 3
    batch = consumer.dequeue(10)
    assert sorted(m.id for m in batch) == ids
    assert consumer.ack(batch) == 3
    consumer.close()
    slow.dispose()
    producer.close()


def test_an_ack_canceled_by_statement_timeout_leaves_the_items_held(db_url, engine):
    install_queue(engine, "orders")
    producer = Queue(engine, "orders")
    producer.enqueue_many([b"a", b"b"])
    slow = make_engine(with_statement_timeout(db_url), pool_size=1)
    consumer = Queue(slow, "orders", worker="timed")
    batch = consumer.dequeue(10, lease=60)
    with meta_locked(engine, producer, 1.5):
        with pytest.raises(StatementCanceled, match="ack on queue 'orders'.*the items stay as they were"):
            consumer.ack(batch)
    assert producer.counts()["processing"] == 2
    assert consumer.ack(batch) == 2  # sent again: safe
    consumer.close()
    slow.dispose()
    producer.close()


def test_an_ack_the_server_breaks_a_deadlock_with_raises_one_line_and_can_be_sent_again(engine, orders):
    """Another session holds item 2 and then waits for item 1, which the ack has updated
    while it waits for item 2: the server breaks the cycle by failing the ack (its
    deadlock_timeout runs out first). The ack rolled back whole: StatementCanceled, like a
    timeout, and sending it again once the other session is gone acks both."""
    orders.enqueue_many([b"a", b"b"])
    batch = orders.dequeue(2, lease=60)
    meta = orders.names.qualified("meta")
    other = engine.connect()
    other.execute(sa.text("SET LOCAL deadlock_timeout = '10s'"))  # the ack's check runs first
    other.execute(sa.text(f"UPDATE {meta} SET title = 'other' WHERE id = :id"), {"id": batch[1].id})

    def close_the_cycle() -> None:
        time.sleep(0.3)  # the ack has updated item 1 and waits for item 2
        other.execute(sa.text(f"UPDATE {meta} SET title = 'other' WHERE id = :id"), {"id": batch[0].id})

    closer = threading.Thread(target=close_the_cycle)
    closer.start()
    try:
        with pytest.raises(StatementCanceled, match="ack on queue 'orders' was canceled by the server.*deadlock"):
            orders.ack(batch)
    finally:
        closer.join(30)
        other.rollback()
        other.close()
    assert orders.counts()["processing"] == 2
    assert orders.ack(batch) == 2  # sent again: safe


def test_worker_survives_canceled_dequeues_and_processes_every_item(db_url, engine, caplog):
    install_queue(engine, "orders")
    producer = Queue(engine, "orders")
    slow = make_engine(with_statement_timeout(db_url), pool_size=1)
    consumer = Queue(slow, "orders", worker="timed-worker")
    done: list[bytes] = []
    worker = Worker(consumer, lambda m: done.append(m.payload), batch=5, poll_interval=0.2,
                    notify=False, handle_signals=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    caplog.set_level(logging.WARNING, logger="queuectl.worker")
    thread.start()
    try:
        sent = [f"before {i}".encode() for i in range(10)]
        producer.enqueue_many(sent)
        deadline = time.monotonic() + 30
        while len(done) < 10:
            assert time.monotonic() < deadline, "worker did not process the first items"
            time.sleep(0.05)
        with meta_locked(engine, producer, 2.0):
            deadline = time.monotonic() + 30
            while worker.stats.canceled == 0:  # the worker keeps polling into the lock
                assert time.monotonic() < deadline, "no dequeue was canceled"
                time.sleep(0.05)
        later = [f"after {i}".encode() for i in range(20)]
        producer.enqueue_many(later)
        sent += later
        deadline = time.monotonic() + 30
        while len(done) < len(sent):
            assert time.monotonic() < deadline, f"only {len(done)} of {len(sent)} items processed"
            time.sleep(0.05)
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert sorted(done) == sorted(sent)  # each exactly once
    assert producer.counts() == {"ready": 0, "scheduled": 0, "processing": 0, "done": len(sent), "dead": 0}
    canceled_lines = [r.getMessage() for r in caplog.records if "canceled by the server" in r.getMessage()]
    assert len(canceled_lines) == worker.stats.canceled >= 1
    assert all("\n" not in line for line in canceled_lines)
    consumer.close()
    slow.dispose()
    producer.close()
