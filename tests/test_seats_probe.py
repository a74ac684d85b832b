"""The seat protocol of bench/lab/seats.py (sql/postgresql/bench.sql seats_create): one seat
holder registered and listening, the others in line, no wake-up missed with an enqueue in
flight, a killed holder's seat passed on, and no deadlock between an empty claim and the
line."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from queuectl.bench.drivers import bench_sql, reinstall_queue
from queuectl.client import Queue
from queuectl.names import QueueNames

from test_notify import psycopg_conninfo

NAMES = QueueNames("seats_probe", "queuectl")
VALUES = {**NAMES.template_values(), "seat_proc": NAMES.qualified("dequeue_seated"),
          "seat_line": NAMES.qualified("seat_line")}
CALL = bench_sql("seats_call", VALUES)
LISTEN, SOON, IN_FLIGHT_TRIES = "listen", "soon", 50


@pytest.fixture
def seats(engine: sa.Engine, db_url: str) -> Iterator[Any]:
    reinstall_queue(engine, NAMES.queue, schema=NAMES.schema)
    with engine.begin() as conn:
        conn.exec_driver_sql(bench_sql("seats_create", VALUES))
    opened: list[psycopg.Connection] = []

    def consumer() -> psycopg.Connection:
        conn = psycopg.connect(psycopg_conninfo(db_url), autocommit=True)
        opened.append(conn)
        return conn

    yield consumer
    for conn in opened:
        conn.close()


def call(conn: psycopg.Connection, mode: int, *, wait_ms: int = 200, batch: int = 10,
         keep: bool = False, deck: bool = False) -> tuple[str, list[int]]:
    state, ids, _payloads = conn.execute(CALL, {"batch": batch, "lease": 30.0, "worker": f"w{conn.info.backend_pid}",
                                                "mode": mode, "seat": 0, "wait_ms": wait_ms,
                                                "keep": keep, "deck": deck}).fetchone()
    return state, list(ids or [])


def seated(conn: psycopg.Connection) -> str:
    """Queue for the seat (mode 1) until seated: 'listen' or 'soon'."""
    state, ids = call(conn, 1, wait_ms=2000)
    assert not ids and state in (LISTEN, SOON), state
    return state


def listening(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT pg_listening_channels()").fetchall()]


def test_the_holder_alone_listens_is_woken_by_an_enqueue_and_hands_the_seat_on(seats: Any, engine: sa.Engine) -> None:
    a, b = seats(), seats()
    assert seated(a) == LISTEN
    assert listening(a) == [NAMES.channel]
    assert call(b, 1) == ("line", [])  # a holds the seat: b waited its 200 ms in line
    assert listening(b) == []
    with Queue(engine, NAMES.queue) as q:
        ids = q.enqueue_many([b"x", b"y", b"z"])
    assert [n.channel for n in a.notifies(timeout=2.0, stop_after=1)] == [NAMES.channel]
    state, got = call(a, 2)
    assert (state, sorted(got)) == ("work", sorted(ids))
    assert listening(a) == []  # gave up the seat, its registration and its LISTEN in that call
    assert seated(b) == LISTEN  # the next in line takes the seat at once


def test_an_enqueue_in_flight_at_the_registration_is_not_missed(seats: Any, db_url: str) -> None:
    a = seats()
    producer = psycopg.connect(psycopg_conninfo(db_url))
    try:
        producer.execute(f"SELECT {VALUES['fn_enqueue']}('\\x01'::bytea)")  # "in flight" held until commit
        assert seated(a) == SOON  # registered, but that enqueue may have missed it: not safe to sleep
        producer.commit()
    finally:
        producer.close()
    state, got = call(a, 3)
    assert state == "work" and len(got) == 1


def test_an_enqueue_after_the_registration_notifies_the_holder(seats: Any, engine: sa.Engine) -> None:
    a = seats()
    assert seated(a) == LISTEN
    for _ in range(IN_FLIGHT_TRIES):
        with Queue(engine, NAMES.queue) as q:
            q.enqueue(b"x")
        assert len(list(a.notifies(timeout=2.0, stop_after=1))) == 1  # none missed
        state, got = call(a, 2)
        assert state == "work" and len(got) == 1
        assert seated(a) == LISTEN


def test_a_killed_holder_passes_the_seat_to_the_next_in_line(seats: Any, engine: sa.Engine) -> None:
    a, b = seats(), seats()
    assert seated(a) == LISTEN
    result: list[tuple[str, list[int]]] = []
    waiter = threading.Thread(target=lambda: result.append(call(b, 1, wait_ms=10_000)))
    waiter.start()
    time.sleep(0.3)
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": a.info.backend_pid})
    started = time.monotonic()
    waiter.join(timeout=10)
    assert result == [(LISTEN, [])] and time.monotonic() - started < 5


def test_an_empty_look_first_queues_in_a_transaction_of_its_own(seats: Any) -> None:
    """Mode 0 commits its empty claim before it waits in line. An empty claim may hold row
    locks (READ COMMITTED locks the newest version of a row another claim took meanwhile,
    finds it no longer READY and skips it, locked until the transaction ends); the holder's
    claims wait for those, so waiting for the seat in the claim's transaction deadlocks."""
    a, b, watcher = seats(), seats(), seats()
    assert seated(a) == LISTEN
    result: list[tuple[str, list[int]]] = []
    waiter = threading.Thread(target=lambda: result.append(call(b, 0, wait_ms=3000)))
    waiter.start()
    time.sleep(0.3)
    waits, later = watcher.execute(
        "SELECT wait_event_type = 'Lock', xact_start > query_start FROM pg_stat_activity WHERE pid = %s",
        (b.info.backend_pid,)).fetchone()
    assert waits and later  # in line, in a transaction that began after the CALL's claim
    a.close()
    waiter.join(timeout=10)
    assert result == [(LISTEN, [])]


def line_call(conn: psycopg.Connection, wait_ms: int) -> tuple[str, list[int]]:
    """seats_line_call as bench/lab/seats.py sends it: its last result is the CALL's row."""
    cur = psycopg.ClientCursor(conn)
    cur.execute(bench_sql("seats_line_call", VALUES), {"batch": 10, "lease": 30.0, "worker": "w", "seat": 0,
                                                       "wait_ms": wait_ms, "keep": False, "deck": False})
    row = None
    while True:
        if cur.description is not None:
            row = cur.fetchone()
        if not cur.nextset():
            break
    assert row is not None
    return row[0], list(row[1] or [])


def test_the_table_line_waits_without_a_snapshot_and_only_its_head_holds_one(seats: Any) -> None:
    a, b, c, watcher = seats(), seats(), seats(), seats()
    assert seated(a) == LISTEN
    for conn in (b, c):  # a session's first lookup of the line table reads the catalog under a snapshot
        with conn.transaction():
            conn.execute(f"LOCK TABLE {VALUES['seat_line']} IN EXCLUSIVE MODE")
    results: dict[str, tuple[str, list[int]]] = {}
    threads = []
    for name, conn in (("b", b), ("c", c)):
        threads.append(threading.Thread(target=lambda n=name, k=conn: results.__setitem__(n, line_call(k, 10_000))))
        threads[-1].start()
        time.sleep(0.3)
    rows = {pid: (event, xmin) for pid, event, xmin in watcher.execute(
        "SELECT pid, wait_event, backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = ANY (%s)",
        ([b.info.backend_pid, c.info.backend_pid],)).fetchall()}
    assert rows[b.info.backend_pid] == ("advisory", True)  # the head waits for the seat, its snapshot held
    assert rows[c.info.backend_pid] == ("relation", False)  # the rest of the line holds none
    a.close()
    threads[0].join(timeout=10)
    assert results["b"] == (LISTEN, []) and listening(b) == [NAMES.channel]
    b.close()
    threads[1].join(timeout=10)
    assert results["c"] == (LISTEN, [])


def test_a_holder_that_took_the_last_rows_keeps_the_seat_only_when_asked(seats: Any, engine: sa.Engine) -> None:
    a, b = seats(), seats()
    assert seated(a) == LISTEN
    with Queue(engine, NAMES.queue) as q:
        q.enqueue_many([b"x", b"y"])
        assert len(list(a.notifies(timeout=2.0, stop_after=1))) == 1
        state, got = call(a, 2, keep=True)
        assert state == "kept" and len(got) == 2  # nothing left: still seated, registered, listening
        assert listening(a) == [NAMES.channel] and call(b, 1) == ("line", [])
        q.enqueue_many([b"z"] * 3)
        assert len(list(a.notifies(timeout=2.0, stop_after=1))) == 1
        state, got = call(a, 2, batch=2, keep=True)
        assert state == "work" and len(got) == 2  # one row left for another consumer: the seat goes
    assert listening(a) == []
    state, got = call(b, 1, wait_ms=2000)  # the next in line takes the seat and the row left
    assert state == "work" and len(got) == 1


def test_with_a_deck_one_consumer_waits_for_the_seat_and_the_next_is_told_to_sleep(seats: Any) -> None:
    a, b, c = seats(), seats(), seats()
    assert seated(a) == LISTEN
    result: list[tuple[str, list[int]]] = []
    waiter = threading.Thread(target=lambda: result.append(call(b, 1, wait_ms=10_000, deck=True)))
    waiter.start()
    time.sleep(0.3)
    started = time.monotonic()
    assert call(c, 1, wait_ms=10_000, deck=True) == ("full", [])  # at once, not after its wait
    assert time.monotonic() - started < 2
    a.close()
    waiter.join(timeout=10)
    assert result == [(LISTEN, [])]  # b seated, the deck free again
    assert call(c, 1, wait_ms=200, deck=True) == ("line", [])
