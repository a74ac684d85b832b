"""SQL Server, live: the same behaviour tests as on PostgreSQL, against a real server.

They run only when QUEUECTL_TEST_MSSQL_URL names a SQL Server database the tests may
create schemas in (e.g. mssql+pyodbc://sa:...@host:1433/queuectl_test?TrustServerCertificate=yes).
Without it every test here is reported as SKIPPED with that reason: no SQL Server can run
where this suite was written, so none of these has been run yet. Each test installs its
queue in a fresh schema and removes everything afterwards.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from jobs_helpers import wait_until
from queuectl.client import Queue
from queuectl.engine import make_engine
from queuectl.install import install_queue, remove_everything
from queuectl.registry import list_queues
from queuectl.names import QueueNames
from queuectl.sqlfiles import render

MSSQL_URL_ENV = "QUEUECTL_TEST_MSSQL_URL"
MSSQL_URL = os.environ.get(MSSQL_URL_ENV)

pytestmark = pytest.mark.skipif(not MSSQL_URL, reason="QUEUECTL_TEST_MSSQL_URL not set: SQL Server not run live")


@pytest.fixture
def mssql_engine() -> Iterator[Engine]:
    engine = make_engine(MSSQL_URL)
    yield engine
    engine.dispose()


@pytest.fixture
def schema(mssql_engine: Engine) -> Iterator[str]:
    name = f"qt_{uuid.uuid4().hex[:12]}"
    yield name
    remove_everything(mssql_engine, name)


def _consume(url: str, schema: str, done: mp.Event, out: mp.Queue) -> None:
    taken: list[int] = []
    with Queue(url, "orders", schema=schema) as queue:
        idle_since = None
        while True:
            batch = queue.dequeue(25, lease=60)
            if batch:
                idle_since = None
                queue.ack(batch)
                taken.extend(m.id for m in batch)
                continue
            if done.is_set():
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 1.0:
                    break
            time.sleep(0.02)
    out.put(taken)


def test_install_registers_the_queue_and_round_trips_an_item(mssql_engine, schema):
    info = install_queue(mssql_engine, "orders", schema=schema)
    assert (info.name, info.kind) == ("orders", "reliable")
    with mssql_engine.connect() as conn:
        assert [q.name for q in list_queues(conn, schema)] == ["orders"]
    with Queue(mssql_engine, "orders", schema=schema) as queue:
        item = queue.enqueue(b"\x00\xffbinary", headers={"trace": "abc"}, title="first")
        [message] = queue.dequeue(5, lease=60)
        assert (message.id, message.payload, message.headers, message.attempts) == (item, b"\x00\xffbinary", {"trace": "abc"}, 1)
        assert queue.ack([message]) == 1
        assert queue.counts() == {"ready": 0, "scheduled": 0, "processing": 0, "done": 1, "dead": 0}


def test_enqueue_many_pairs_each_payload_with_its_own_id(mssql_engine, schema):
    install_queue(mssql_engine, "orders", schema=schema)
    with Queue(mssql_engine, "orders", schema=schema) as queue:
        payloads = [f"item-{i}".encode() for i in range(300)] + [b""]
        ids = queue.enqueue_many(payloads, headers=[{"n": i} for i in range(301)])
        got = {m.id: (m.payload, m.headers) for m in queue.dequeue(1000)}
    assert got == {i: (p, {"n": n}) for n, (i, p) in enumerate(zip(ids, payloads))}


def test_every_item_is_dequeued_exactly_once_by_concurrent_consumers(mssql_engine, schema):
    install_queue(mssql_engine, "orders", schema=schema)
    with Queue(mssql_engine, "orders", schema=schema) as producer:
        ids = [i for start in range(0, 4000, 500) for i in producer.enqueue_many([b"x"] * 500)]
    ctx = mp.get_context("spawn")
    done, out = ctx.Event(), ctx.Queue()
    consumers = [ctx.Process(target=_consume, args=(MSSQL_URL, schema, done, out)) for _ in range(4)]
    for p in consumers:
        p.start()
    done.set()
    taken = Counter(i for _ in consumers for i in out.get(timeout=300))
    for p in consumers:
        p.join(60)
    assert taken == Counter(ids)  # every item once: none lost, none twice


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


def test_archive_moves_finished_rows_with_payloads_and_nothing_else(mssql_engine, schema):
    install_queue(mssql_engine, "orders", schema=schema)
    names = QueueNames("orders", schema)
    with Queue(mssql_engine, "orders", schema=schema) as queue:
        ids = queue.enqueue_many([f"p{i}".encode() for i in range(60)])
        batch = queue.dequeue(40, lease=60)
        queue.ack(batch[:30])
        queue.nack(batch[30:], "boom", base_delay=0)
    archive = sa.text(render("mssql", "jobs", "archive_batch", names.template_values()))
    with mssql_engine.connect() as conn:
        moved = conn.execute(archive, {"batch": 7, "min_age_seconds": 0, "dead_min_age_seconds": 0}).scalar_one()
        conn.commit()
        assert moved == 7
        while conn.execute(archive, {"batch": 7, "min_age_seconds": 0, "dead_min_age_seconds": 0}).scalar_one():
            conn.commit()
        conn.commit()
        history = dict(conn.execute(sa.text(f"SELECT id, payload FROM {names.qualified('history')}")).all())
        left = set(conn.execute(sa.text(f"SELECT id FROM {names.qualified('meta')}")).scalars())
        data_left = set(conn.execute(sa.text(f"SELECT id FROM {names.qualified('data')}")).scalars())
    done_ids = {m.id for m in batch[:30]}
    assert set(history) == done_ids and all(history[i] == f"p{ids.index(i)}".encode() for i in done_ids)
    assert left == data_left == set(ids) - done_ids  # ready and retried items stay, with their payloads


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
        rows = adapter_for(mssql_engine).storage_health(conn, QueueNames("orders", schema))
    assert {r["table_name"] for r in rows} == {"orders_meta", "orders_data", "orders_history"}
