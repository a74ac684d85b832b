"""SQL Server, live: the reliable queue's generations (reliable_0012; sql/mssql/reliable.sql's
header), the behaviour tests/test_rotation.py proves on PostgreSQL, against a real server:
items in flight across a rotation, nack and release across a switch, the move at truncate
(and its control, a truncate without it), and every item exactly once with concurrent
producers, consumers and two rotators.

They run only when QUEUECTL_TEST_MSSQL_URL names a SQL Server database the tests may create
schemas in (`make test-mssql`; docs/sqlserver.md); without it they are reported as SKIPPED.
Each test installs in a fresh schema and removes everything afterwards. Until a server runs
them, this T-SQL is parse- and reference-checked, not run live.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest
import sqlalchemy as sa

import mssql_live_helpers as live
from queuectl.catalog import QueueSettings
from queuectl.client import Queue
from queuectl.install import head_of, install_queue
from queuectl.jobs.archive import ArchiveConfig, Rotator
from queuectl.jobs.base import JobTarget

pytestmark = live.requires_mssql
mssql_engine, schema = live.mssql_engine, live.schema  # the shared fixtures


@pytest.fixture
def orders(mssql_engine, schema):
    install_queue(mssql_engine, "orders", "reliable", QueueSettings(), schema=schema)
    with Queue(mssql_engine, "orders", schema=schema) as queue:
        yield queue


def rotator(engine: sa.Engine, schema: str, items: int = 40) -> Rotator:
    target = JobTarget.resolve(engine, "orders", schema, ("reliable",))
    return Rotator(engine, target, ArchiveConfig(rotate_items=items))


def call(engine: sa.Engine, queue: Queue, section: str, **params) -> sa.Row:
    """One rotator step exactly as the archive job runs it (sql/mssql/jobs.sql)."""
    target = JobTarget.resolve(engine, "orders", queue.names.schema, ("reliable",))
    with engine.begin() as conn:
        return conn.execute(target.sql(section), params).one()


def in_slot(engine: sa.Engine, queue: Queue, slot: int) -> set[int]:
    return {r.id for r in live.rows(engine, f"SELECT id FROM {queue.names.qualified(f'meta{slot}')}")}


def ledger(engine: sa.Engine, queue: Queue) -> dict[str, object]:
    """Every id in the slots (through the view) or in history, with its status and payload:
    an id twice is a duplicate, a missing one is lost."""
    m, d, h = (queue.names.qualified(t) for t in ("meta", "data", "history"))
    rows = live.rows(engine, f"SELECT m.id, m.status, d.payload FROM {m} AS m LEFT JOIN {d} AS d ON d.id = m.id "
                             f"UNION ALL SELECT h.id, h.status, h.payload FROM {h} AS h")
    return {"count": Counter(r.id for r in rows), "status": {r.id: r.status for r in rows},
            "payload": {r.id: bytes(r.payload) if r.payload is not None else None for r in rows}}


def test_the_head_on_sql_server_is_the_generation_layout(mssql_engine, schema, orders):
    assert orders.info.schema_version == head_of("reliable") >= "reliable_0012"
    st = call(mssql_engine, orders, "rot_state")
    assert (st.epoch, st.sealed, st.emptied) == (0, -1, -1)
    views = live.scalar(mssql_engine, "SELECT COUNT(*) FROM sys.views WHERE schema_id = SCHEMA_ID(:s)", s=schema)
    assert views == 2  # <queue>_meta and <queue>_data read the three slots


def test_items_in_flight_across_a_rotation_are_acked_where_they_are_and_reach_history_once(mssql_engine, schema, orders):
    ids = orders.enqueue_many([f"m{i}".encode() for i in range(20)])
    leased = orders.dequeue(10, lease=60)
    rot = rotator(mssql_engine, schema, items=10)
    first = rot.rotate()  # switch to epoch 1 and seal epoch 0 (its 10 READY rows move to slot 1)
    assert first.switched and first.sealed == 10
    assert in_slot(mssql_engine, orders, 1) == set(ids) - {m.id for m in leased}
    second = rot.rotate()  # empty epoch 0: the 10 leased rows move forward, the slot is truncated
    assert second.emptied == 1
    assert in_slot(mssql_engine, orders, 0) == set()
    assert orders.ack(leased) == 10  # found by id in slot 1
    rest = orders.dequeue(20)
    assert sorted(m.id for m in rest) == sorted(set(ids) - {m.id for m in leased})
    assert orders.ack(rest) == 10
    book = ledger(mssql_engine, orders)
    assert all(book["count"][i] == 1 for i in ids) and all(book["status"][i] == 2 for i in ids)


def test_nack_and_release_across_a_switch_move_the_row_to_the_current_epoch(mssql_engine, orders):
    ids = orders.enqueue_many([b"a", b"b", b"c"])
    taken = orders.dequeue(3, lease=60)
    assert call(mssql_engine, orders, "rot_switch", items=1).epoch == 1
    nacked = [m for m in taken if m.id == ids[0]]
    released = [m for m in taken if m.id == ids[1]]
    assert orders.nack(nacked, error="again", base_delay=0) == {ids[0]: "ready"}
    assert orders.release(released) == 1
    assert in_slot(mssql_engine, orders, 1) == {ids[0], ids[1]}  # moved with their ids
    assert in_slot(mssql_engine, orders, 0) == {ids[2]}  # still leased where it was
    time.sleep(0.05)
    again = orders.dequeue(3)
    assert sorted(m.id for m in again) == sorted(ids[:2])
    assert sorted(bytes(m.payload) for m in again) == [b"a", b"b"]
    assert orders.ack(again) == 2 and orders.ack([m for m in taken if m.id == ids[2]]) == 1


def test_the_truncate_moves_what_a_truncate_without_the_move_would_lose(mssql_engine, orders):
    """The move at truncate: leased and late READY rows of a sealed epoch reach the current
    slot. Its control: a bare TRUNCATE of the slot loses exactly those items."""
    ids = orders.enqueue_many([b"x"] * 20)
    leased = orders.dequeue(10, lease=60)
    assert call(mssql_engine, orders, "rot_switch", items=1).epoch == 1
    call(mssql_engine, orders, "rot_mark", what="sealed", epoch=0)  # sealed without its seal: 10 late READY rows
    row = call(mssql_engine, orders, "rot_empty", lock_timeout_ms=50)
    assert (row.epoch, row.moved) == (0, 20)
    call(mssql_engine, orders, "rot_mark", what="emptied", epoch=0)
    assert in_slot(mssql_engine, orders, 1) == set(ids)
    assert orders.ack(leased) == 10
    # the control, on epoch 1: emptied by hand without the move or the copy loses every item
    # it held, the acked ones (DONE, not in history yet) and the others alike
    assert call(mssql_engine, orders, "rot_switch", items=0).epoch == 2
    live.execute(mssql_engine, f"TRUNCATE TABLE {orders.names.qualified('meta1')}")
    live.execute(mssql_engine, f"TRUNCATE TABLE {orders.names.qualified('data1')}")
    book = ledger(mssql_engine, orders)
    assert sorted(i for i in ids if book["count"][i] == 0) == sorted(ids)


def test_every_item_exactly_once_with_producers_consumers_and_two_rotators(mssql_engine, schema, orders):
    sent: dict[int, bytes] = {}
    acked: Counter = Counter()
    stop_producing, stop_all = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    emptied = [0]

    def guarded(fn):
        def run(*args):
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
                stop_all.set()
        return run

    @guarded
    def produce(n: int) -> None:
        rnd = random.Random(n)
        with Queue(mssql_engine, "orders", schema=schema) as q:
            i = 0
            while not stop_producing.is_set():
                if rnd.random() < 0.3:
                    payloads = [f"p{n}-{i}-{k}".encode() for k in range(rnd.randint(2, 8))]
                    sent.update(zip(q.enqueue_many(payloads, max_attempts=100), payloads))
                else:
                    payload = f"p{n}-{i}".encode()
                    sent[q.enqueue(payload, priority=rnd.randint(0, 2), delay=rnd.choice((0, 0, 0.2)),
                                   max_attempts=100)] = payload
                i += 1
                time.sleep(0.002)

    @guarded
    def consume(n: int) -> None:
        rnd = random.Random(100 + n)
        with Queue(mssql_engine, "orders", schema=schema) as q:
            while not stop_all.is_set():
                batch = q.dequeue(5, lease=1)
                if not batch:
                    time.sleep(0.01)
                    continue
                for m in batch:
                    assert bytes(m.payload) == sent.get(m.id, bytes(m.payload))
                    roll = rnd.random()
                    if roll < 0.7:
                        acked[m.id] += q.ack([m])
                    elif roll < 0.8:
                        q.nack([m], error="again", base_delay=0.05)
                    elif roll < 0.9:
                        q.release([m])
                    # else dropped: its lease expires and a claim takes it again

    @guarded
    def rotate() -> None:
        rot = rotator(mssql_engine, schema)
        while not stop_all.is_set():
            emptied[0] += rot.rotate().emptied
            time.sleep(0.02)

    threads = ([threading.Thread(target=produce, args=(n,)) for n in range(3)]
               + [threading.Thread(target=consume, args=(n,)) for n in range(3)]
               + [threading.Thread(target=rotate) for _ in range(2)])
    for t in threads:
        t.start()
    time.sleep(4)
    stop_producing.set()
    deadline = time.monotonic() + 90
    while not errors and time.monotonic() < deadline and len(acked) < len(sent):
        time.sleep(0.2)
    stop_all.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    book = ledger(mssql_engine, orders)
    assert len(sent) > 500
    assert [i for i in sent if book["count"][i] == 0] == [] and [i for i, n in book["count"].items() if n > 1] == []
    assert all(book["status"][i] == 2 for i in sent)
    assert all(n == 1 for n in acked.values()) and set(acked) == set(sent)
    assert {i: book["payload"][i] for i in sent} == sent
    assert emptied[0] >= 3, emptied  # the generations did turn over
