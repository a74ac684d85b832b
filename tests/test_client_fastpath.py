"""The client's batch enqueue sends arrays of defaults as NULL: the items must come out
exactly as if every default had been spelled out, and per-item values must still apply.
Payload and id arrays travel in psycopg's binary format, and every byte value survives.
The client's calls run on the driver connection, one statement each, with SQLAlchemy's
errors and reconnect signals kept."""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack

import psycopg
import pytest
import sqlalchemy as sa
from psycopg.adapt import PyFormat, Transformer

from conftest import statements_executed, statements_sent
from queuectl.client import Queue
from queuectl.engine import adapter_for
from queuectl.engine.base import statements_watched
from queuectl.install import install_queue
from queuectl.client import open_queue
from queuectl.kindspec import settings_for


def _rows(queue: Queue, ids: list[int]) -> dict[int, sa.RowMapping]:
    rows = queue._conn.execute(
        sa.text('SELECT id, priority, title, due_at - enqueued_at AS delay FROM queuectl."orders_meta" WHERE id = ANY(:ids)'),
        {"ids": ids},
    ).mappings()
    return {r["id"]: r for r in rows}


def test_enqueue_many_with_only_defaults_gives_default_items(orders: Queue) -> None:
    ids = orders.enqueue_many([b"a", b"b", b"c"])
    rows = _rows(orders, ids)
    assert [(rows[i]["priority"], rows[i]["title"], rows[i]["delay"].total_seconds()) for i in ids] == [(0, None, 0.0)] * 3
    assert [m.payload for m in orders.dequeue(3)] == [b"a", b"b", b"c"]


def test_enqueue_many_applies_per_item_values_beside_defaults(orders: Queue) -> None:
    ids = orders.enqueue_many(["x", "y", "z"], priority=[0, 2, 0], delay=[0, 0, 60], title=[None, "t", None])
    rows = _rows(orders, ids)
    assert [(rows[i]["priority"], rows[i]["title"]) for i in ids] == [(0, None), (2, "t"), (0, None)]
    assert [round(rows[i]["delay"].total_seconds()) for i in ids] == [0, 0, 60]
    assert [m.payload for m in orders.dequeue(3)] == [b"x", b"y"]  # z is not due for a minute


def test_enqueue_many_takes_tiny_delays_which_python_prints_in_e_notation(orders):
    """f"{7e-05} seconds" is no interval: delays are sent with fixed decimals."""
    ids = orders.enqueue_many([b"a", b"b"], delay=[0.00007, 0.0])
    assert len(ids) == 2
    got = []
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        got += orders.dequeue(2)
    assert sorted(m.id for m in got) == sorted(ids)


def _dumped_format(queue: Queue, value: object) -> psycopg.pq.Format:
    """The format psycopg picks for `value` behind a `%s` placeholder, as SQLAlchemy renders them."""
    driver = queue._conn.connection.driver_connection
    return Transformer(driver).get_dumper(value, PyFormat.AUTO).format


def test_payload_and_id_arrays_are_sent_in_binary_format(orders: Queue) -> None:
    """Text format escapes each array element in Python (~14 us per 300 B payload on
    these cores) and makes the server parse hex: the hot path's arrays go binary."""
    adapter = adapter_for(orders.engine)
    assert _dumped_format(orders, adapter.payload_array([b"a" * 300, b"b"])) == psycopg.pq.Format.BINARY
    assert _dumped_format(orders, adapter.id_array([1, 2**40])) == psycopg.pq.Format.BINARY
    params = adapter.enqueue_many_params(
        [{"payload": b"x", "headers": None, "priority": 0, "delay": 0.0, "title": None}], None
    )
    assert _dumped_format(orders, params["payloads"]) == psycopg.pq.Format.BINARY
    assert _dumped_format(orders, adapter.kind_enqueue_many_params([b"x"], None)["payloads"]) == psycopg.pq.Format.BINARY
    # a plain list (every other array parameter) keeps psycopg's default text format
    assert _dumped_format(orders, [b"x"]) == psycopg.pq.Format.TEXT


ALL_BYTES = bytes(range(256))
AWKWARD = [ALL_BYTES, b"", b"{}", b'"', b"\\", b"NULL", b"\x00", ALL_BYTES * 40]


def test_binary_payload_arrays_round_trip_every_byte_value(orders: Queue) -> None:
    ids = orders.enqueue_many(AWKWARD)
    got = orders.dequeue(len(AWKWARD))
    assert [m.id for m in got] == ids
    assert [m.payload for m in got] == AWKWARD
    # small ids (an int2[] in binary) and large ones both reach CAST(:ids AS bigint[])
    assert orders.ack([m.id for m in got]) == len(AWKWARD)
    assert orders.ack([1, 2**40]) == 0


def test_binary_payload_arrays_round_trip_on_every_kind(engine) -> None:
    for kind in ("heap", "fifo", "stack", "watermark", "ring", "pending"):
        install_queue(engine, f"b_{kind}", kind, settings_for(kind, size=16) if kind == "ring" else None)
        with open_queue(engine, f"b_{kind}") as queue:
            queue.enqueue_many(AWKWARD)
            got = []
            deadline = time.monotonic() + 5
            while len(got) < len(AWKWARD) and time.monotonic() < deadline:
                got += queue.dequeue(len(AWKWARD))
            assert sorted(m.payload for m in got) == sorted(AWKWARD), kind


def test_client_calls_run_on_the_driver_connection_one_statement_each(orders: Queue) -> None:
    """SQLAlchemy's execution layer cost more client CPU than psycopg itself (measured by
    the bench's reliable_sqla kind):
    the hot calls skip it, and each still sends exactly one statement."""
    with statements_executed(orders.engine) as through_sqlalchemy, statements_sent(orders._conn) as sent:
        one = orders.enqueue(b"one")
        ids = orders.enqueue_many([b"a", b"b", b"c"])
        first = orders.dequeue(2)
        assert sorted(orders.extend_lease(first, 60)) == sorted(m.id for m in first)
        assert orders.ack(first[:1]) == 1
        assert orders.nack(first[1:], "boom") == {first[1].id: "ready"}
        taken = orders.ack_and_dequeue([], 1)
        assert orders.release(taken) == 1
    assert len(sent) == 8, sent
    assert through_sqlalchemy == []
    # the acked and the nacked (waiting for its retry) item are gone; the released one is back
    assert sorted(m.id for m in orders.dequeue(10)) == sorted({one, *ids} - {m.id for m in first})


def test_a_server_error_comes_back_as_sqlalchemys_and_the_session_goes_on(orders: Queue, engine) -> None:
    """An error the server raises on a live connection is SQLAlchemy's DBAPIError (with the
    driver's error as .orig), does not count as a lost connection, and the next call runs."""
    orders.enqueue(b"x")
    with engine.begin() as conn:
        conn.exec_driver_sql('ALTER FUNCTION queuectl."orders_dequeue"(integer, double precision, text) RENAME TO "orders_dq"')
    with pytest.raises(sa.exc.ProgrammingError) as raised:
        orders.dequeue(1)
    assert isinstance(raised.value.orig, psycopg.errors.UndefinedFunction)
    assert not raised.value.connection_invalidated and orders.reconnects == 0
    with engine.begin() as conn:
        conn.exec_driver_sql('ALTER FUNCTION queuectl."orders_dq"(integer, double precision, text) RENAME TO "orders_dequeue"')
    assert [m.payload for m in orders.dequeue(1)] == [b"x"]
    assert orders.reconnects == 0



def test_kind_clients_per_message_calls_run_on_the_driver_connection(engine) -> None:
    """The other kinds' enqueue, enqueue_many and dequeue go the same way, one statement each,
    inside a processing() transaction too (it commits what the driver-level call did)."""
    for kind in ("heap", "fifo", "stack", "watermark", "ring", "pending"):
        install_queue(engine, f"d_{kind}", kind, settings_for(kind, size=16) if kind == "ring" else None)
        with open_queue(engine, f"d_{kind}") as queue:
            with statements_executed(queue.engine) as through_sqlalchemy, statements_sent(queue._conn) as sent:
                queue.enqueue(b"one")
                queue.enqueue_many([b"two", b"three"])
                got = queue.dequeue(3)
            assert sorted(m.payload for m in got) == [b"one", b"three", b"two"], kind
            assert len(sent) == 3 and through_sqlalchemy == [], (kind, sent, through_sqlalchemy)
            queue.enqueue(b"four")
            with queue.processing(1) as taken:
                assert [m.payload for m in taken] == [b"four"], kind
            assert queue.dequeue(1) == [] and queue.counts()["ready"] == 0, kind


@pytest.mark.parametrize("watch", ["listener", "echo", "logger"])
def test_a_watched_engine_keeps_sqlalchemys_path(orders: Queue, db_url: str, watch: str, caplog) -> None:
    """Someone who logs or instruments the engine's statements (echo, the sqlalchemy.engine
    logger at INFO, an execution listener) still sees every call of a client created then."""
    seen: list[str] = []
    watched = sa.create_engine(sa.engine.make_url(db_url).set(drivername="postgresql+psycopg"), echo=watch == "echo")
    with ExitStack() as stack:
        stack.callback(watched.dispose)
        if watch == "listener":
            seen = stack.enter_context(statements_executed(watched))
        else:
            caplog.set_level(logging.INFO, logger="sqlalchemy.engine.Engine")
        assert statements_watched(watched)
        with Queue(watched, "orders") as queue:
            queue.enqueue(b"x")
            assert [m.payload for m in queue.dequeue(1)] == [b"x"]
    seen += [record.getMessage() for record in caplog.records]
    assert any('"orders_enqueue"(' in s for s in seen) and any('"orders_dequeue"(' in s for s in seen), seen[-5:]


def test_an_unwatched_engine_is_not_taken_for_a_watched_one(engine) -> None:
    assert not statements_watched(engine)
