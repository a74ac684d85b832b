"""The Python client on a lost connection: what it resends, what it refuses to, when it gives up."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from queuectl.client import EnqueueOutcomeUnknown, Queue
from queuectl.errors import ConnectionFailed
from queuectl.install import install_queue

SECRET = "sekret-pw-4711"


def _backend_pid(queue: Queue) -> int:
    return queue._conn.connection.dbapi_connection.info.backend_pid


def _terminate(admin_engine, pid: int) -> None:
    with admin_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid}).scalar_one()


def _count(engine, queue: Queue) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text(f"SELECT count(*) FROM {queue.names.qualified('meta')}")).scalar_one()


def test_dequeue_and_ack_are_resent_after_a_terminated_backend(orders, admin_engine):
    ids = orders.enqueue_many([b"a", b"b", b"c"])
    _terminate(admin_engine, _backend_pid(orders))
    batch = orders.dequeue(10)
    assert sorted(m.id for m in batch) == sorted(ids)
    assert orders.reconnects == 1
    _terminate(admin_engine, _backend_pid(orders))
    assert orders.ack(batch) == 3
    assert orders.reconnects == 2
    assert orders.counts()["done"] == 3


def test_enqueue_is_not_resent_once_sent(orders, admin_engine, engine):
    _terminate(admin_engine, _backend_pid(orders))
    with pytest.raises(EnqueueOutcomeUnknown) as err:
        orders.enqueue(b"maybe")
    message = str(err.value)
    assert "may or may not have committed" in message and "\n" not in message
    assert orders.reconnects == 0  # refused, not retried
    # the backend was gone before the statement arrived: nothing was added, nothing twice
    assert _count(engine, orders) == 0
    # the next call reconnects before sending, which is safe, and works
    item = orders.enqueue(b"sure")
    assert _count(engine, orders) == 1 and orders.dequeue(1)[0].id == item


def test_gives_up_after_the_retry_budget_with_one_masked_line(db_url, engine, admin_engine):
    install_queue(engine, "orders")
    url = make_url(db_url)
    secret = url.password or SECRET
    url = url.set(password=secret).render_as_string(hide_password=False)
    queue = Queue(url, "orders")
    queue.retry_total = 1.5
    queue.enqueue_many([b"x", b"y"])
    database = make_url(db_url).database
    started = None
    with pytest.raises(ConnectionFailed) as err:
        with queue.processing(2) as batch:
            assert len(batch) == 2
            with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(sa.text(f'DROP DATABASE "{database}" WITH (FORCE)'))
            started = time.monotonic()
    waited = time.monotonic() - started
    message = str(err.value)
    assert not isinstance(err.value, EnqueueOutcomeUnknown)
    assert message.startswith("ack on queue 'orders': gave up reconnecting")
    assert "the 2 items it held stay leased" in message  # the batch is reported, not dropped
    assert "\n" not in message and secret not in message and "***" in message
    assert queue.reconnects >= 2 and 1.5 <= waited < 30  # the whole budget, then it stops
    queue.close()
