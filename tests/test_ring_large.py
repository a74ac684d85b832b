"""Large messages on the ring (ring_0007): a message over the ring's slot_bytes goes to the side
table <queue>_ring_large and its slot keeps a pointer; the pop returns it as if it had been in
the slot and deletes it; a rescue moves the pointer; a message over max_payload_bytes is
refused in one line and nothing is stored; the upgrade and its downgrade lose no message; the
T-SQL procedures do the same (parse- and reference-checked, not run live)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import time

import pytest
import sqlalchemy as sa

import ring_workers
from conftest import run_cli
from jobs_helpers import scalar, wait_until
from queuectl.client import QueueFullError, ReleasedClaim, RingQueue, repair_ring
from queuectl.defaults import DEFAULT_MAX_PAYLOAD_BYTES
from queuectl.errors import PayloadTooLarge, UsageError
from queuectl.install import downgrade_queue, head_of, install_queue, uninstall_queue, upgrade_queue
from queuectl.kindspec import RING_DEFAULT_SLOT_BYTES, RingSettings, settings_for
from test_mssql_offline import check_tsql, rendered

WIDTH = RING_DEFAULT_SLOT_BYTES


def ring(engine, size: int = 8, name: str = "r", **settings) -> RingQueue:
    install_queue(engine, name, "ring", RingSettings(size=size, **settings))
    return RingQueue(engine, name)


def side_rows(engine, name: str = "r") -> list[tuple[int, int]]:
    """(id, payload length) of the side table's rows."""
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(
            f'SELECT id, length(payload) FROM queuectl."{name}_ring_large" ORDER BY id'))]


def pointers(engine, name: str = "r") -> dict[int, int]:
    """position -> side-table id, for the FULL slots that hold a pointer."""
    with engine.connect() as conn:
        return dict(conn.execute(sa.text(
            f'SELECT msg_id, large_id FROM queuectl."{name}_ring" WHERE large_id IS NOT NULL')).all())


def test_the_default_width_keeps_a_slot_row_out_of_toast(engine):
    """The widest message kept in the row, with headers, stays in the slot's heap page: the
    slots' TOAST table gets nothing (slot_bytes' default is chosen for this)."""
    with ring(engine) as q:
        headers = {"trace": "t" * 40}
        payload = os.urandom(WIDTH - len(json.dumps(headers)))  # payload + headers as text == WIDTH
        q.enqueue(payload, headers=headers)
        with engine.connect() as conn:
            toast = conn.execute(sa.text(
                "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = 'queuectl.r_ring'::regclass")).scalar()
            inline = conn.execute(sa.text("SELECT pg_column_size(payload) FROM queuectl.r_ring WHERE msg_id = 0")).scalar()
        assert toast == 0 and inline >= len(payload)  # in the row, uncompressed, not TOASTed
        assert side_rows(engine) == []
        [m] = q.dequeue(1)
        assert (m.payload, m.headers) == (payload, headers)


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_payloads_at_under_and_over_the_width_up_to_the_maximum_round_trip(engine, many):
    # the last one is the maximum exactly: 8 bytes of headers ('{"n": 6}') and the rest payload
    sizes = [0, WIDTH - 1, WIDTH, WIDTH + 1, 4_000, 65_536, DEFAULT_MAX_PAYLOAD_BYTES - 8]
    payloads = [os.urandom(n) for n in sizes]
    headers = [{"n": i} for i in range(len(sizes))]
    with ring(engine, size=16) as q:
        if many:
            ids = q.enqueue_many(payloads, headers=headers)
        else:
            ids = [q.enqueue(p, headers=h) for p, h in zip(payloads, headers)]
        assert ids == list(range(len(sizes)))
        # payload + headers as text: WIDTH - 1 + 8 is over the width, as is every larger one
        over = [i for i, (p, h) in enumerate(zip(payloads, headers)) if len(p) + len(json.dumps(h)) > WIDTH]
        assert over == [1, 2, 3, 4, 5, 6]
        assert sorted(pointers(engine)) == over
        assert [n for _, n in side_rows(engine)] == [sizes[i] for i in over]
        with engine.connect() as conn:  # the slots of side-table messages hold no payload
            assert conn.execute(sa.text("SELECT count(*) FROM queuectl.r_ring "
                                        "WHERE large_id IS NOT NULL AND (payload IS NOT NULL OR headers IS NOT NULL)")).scalar() == 0
        got = q.dequeue(len(sizes))
        assert [(m.id, m.payload, m.headers) for m in got] == list(zip(ids, payloads, headers))
        assert side_rows(engine) == [] and pointers(engine) == {}


def test_a_message_over_the_maximum_is_refused_in_one_line_and_nothing_is_stored(engine, db_url):
    with ring(engine, max_payload_bytes=10_000) as q:
        q.enqueue(b"x")
        with pytest.raises(PayloadTooLarge) as refused:
            q.enqueue(b"y" * 9_990, headers={"k": "vv"})  # 9,990 + 11 bytes of headers
        assert str(refused.value) == ("queue 'r': message 1 of 1 is 10001 bytes (payload 9990 + headers 11), "
                                      "over max_payload_bytes 10000: nothing was enqueued")
        with pytest.raises(PayloadTooLarge) as refused:
            q.enqueue_many([b"a" * 5_000, b"b" * 10_001, b"c"])
        assert "\n" not in str(refused.value)
        assert str(refused.value).startswith("queue 'r': message 2 of 3 is 10001 bytes (payload 10001 + headers 0)")
        assert q.enqueue(b"z" * 10_000) == 1  # exactly the maximum is allowed (and goes to the side table)
        assert q.counts()["ready"] == 2 and len(side_rows(engine)) == 1
        # nothing of the refused calls was stored, and they took no position
        assert [(m.id, len(m.payload)) for m in q.dequeue(10)] == [(0, 1), (1, 10_000)]
    # the server refuses any caller, not only the Python client
    with sa.create_engine(db_url).connect() as conn:
        with pytest.raises(sa.exc.DBAPIError, match="over max_payload_bytes 10000"):
            conn.execute(sa.text('SELECT queuectl."r_enqueue"(CAST(:p AS bytea))'), {"p": b"q" * 10_001})
        conn.rollback()
        with pytest.raises(sa.exc.DBAPIError, match="over max_payload_bytes 10000"):
            conn.execute(sa.text('SELECT * FROM queuectl."r_enqueue_many"(CAST(:p AS bytea[]))'), {"p": [b"q", b"q" * 10_001]})
        conn.rollback()
    assert side_rows(engine) == []


def test_a_full_ring_leaves_no_side_rows_for_the_messages_it_did_not_take(engine):
    big = [os.urandom(5_000) for _ in range(4)]
    with ring(engine, size=2) as q:
        assert q.enqueue_many(big[:2]) == [0, 1]
        with pytest.raises(QueueFullError) as full:
            q.enqueue_many(big[2:], timeout=0.1)
        assert full.value.enqueued == []
        with pytest.raises(QueueFullError):
            q.enqueue(big[2], timeout=0.1)
        assert [n for _, n in side_rows(engine)] == [5_000, 5_000]  # the two pushed, nothing else
        [first] = q.dequeue(1)
        with pytest.raises(QueueFullError) as full:
            q.enqueue_many(big[2:], timeout=0.1)
        assert full.value.enqueued == [2]  # one slot free: the first went in, not the second
        assert [n for _, n in side_rows(engine)] == [5_000, 5_000]
        assert [m.payload for m in [first, *q.dequeue(5)]] == [big[0], big[1], big[2]]
        assert side_rows(engine) == []


def test_lap_churn_keeps_the_slots_heap_constant_and_the_side_table_emptied(engine):
    """The slots are updated in place (HOT) and their row never holds the large payload, so the
    heap does not grow lap after lap, and the slots' TOAST table stays empty; every side row is
    deleted by its pop."""
    payloads = [os.urandom(4_000) for _ in range(16)]
    with ring(engine, size=16) as q:

        def lap() -> None:
            assert len(q.enqueue_many(payloads)) == 16
            assert [m.payload for m in q.dequeue(16)] == payloads

        lap()
        with engine.connect() as conn:
            heap = conn.execute(sa.text("SELECT pg_relation_size('queuectl.r_ring')")).scalar()
        for _ in range(50):
            lap()
        with engine.connect() as conn:
            heap_after, toast = conn.execute(sa.text(
                "SELECT pg_relation_size(oid), pg_relation_size(reltoastrelid) FROM pg_class "
                "WHERE oid = 'queuectl.r_ring'::regclass")).one()
            conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
        assert heap_after == heap and toast == 0
        assert side_rows(engine) == [] and pointers(engine) == {}
        # the pops' statements deleted what the pushes inserted: 51 laps of 16
        wait_until(lambda: scalar(engine, "SELECT n_tup_del FROM pg_stat_user_tables "
                                          "WHERE relid = 'queuectl.r_ring_large'::regclass") == 51 * 16, timeout=30)
        assert scalar(engine, "SELECT n_tup_ins FROM pg_stat_user_tables "
                              "WHERE relid = 'queuectl.r_ring_large'::regclass") == 51 * 16


def test_a_popper_killed_mid_pop_loses_no_large_message(engine, db_url):
    """A popper takes a large message inside its transaction and its session is killed before
    it commits: the take rolls back (slot FULL, side row back), nobody holds the position
    any more, and ring_repair re-pushes it by moving the pointer."""
    payload = os.urandom(70_000)
    other = sa.create_engine(db_url)
    try:
        with ring(engine, size=4) as producer:
            assert producer.enqueue(payload, headers={"h": 1}) == 0
            [(side_id, _)] = side_rows(engine)
            with other.connect() as popper:
                popper.begin()
                [row] = popper.execute(sa.text('SELECT id, length(payload) FROM queuectl."r_dequeue"(1, 0)')).all()
                assert tuple(row) == (0, 70_000)
                assert side_rows(engine) == [(side_id, 70_000)]  # not committed: still there for the others
                pid = popper.execute(sa.text("SELECT pg_backend_pid()")).scalar()
                assert scalar(engine, "SELECT pg_terminate_backend(:pid)", pid=pid)
                wait_until(lambda: not scalar(engine, "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid", pid=pid),
                           timeout=30, interval=0.01)
                popper.invalidate()  # its session is gone: nothing to roll back from here
        assert side_rows(engine) == [(side_id, 70_000)] and pointers(engine) == {0: side_id}
        result = repair_ring(engine, "r", grace=0)
        assert result.rescued == [(0, 1)]
        assert pointers(engine) == {1: side_id} and side_rows(engine) == [(side_id, 70_000)]  # moved, not copied
        with RingQueue(engine, "r") as consumer:
            [m] = consumer.dequeue(1, timeout=1)  # position 0 went to the killed popper: it claims 1
            assert (m.id, m.payload, m.headers) == (1, payload, {"h": 1})
        assert side_rows(engine) == [] and pointers(engine) == {}
    finally:
        other.dispose()


def test_a_killed_poppers_claim_on_a_large_message_is_rescued_by_ring_repair(engine, db_url):
    """ring_workers.pop_then_die: the popper claims position 0 on an empty ring and dies; the
    large message pushed at 0 is nobody's until ring_repair moves its pointer."""
    install_queue(engine, "r", "ring", RingSettings(size=8))
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    popper = ctx.Process(target=ring_workers.pop_then_die, args=(db_url, "r", ready))
    popper.start()
    popper.join(timeout=60)
    assert ready.is_set() and popper.exitcode == -9
    payload = os.urandom(3_000)
    with RingQueue(engine, "r") as producer, RingQueue(engine, "r") as consumer:
        assert producer.enqueue(payload) == 0
        [(side_id, _)] = side_rows(engine)
        assert consumer.dequeue(1, timeout=0.2) == []
        assert repair_ring(engine, "r", grace=0).rescued == [(0, 1)]
        assert pointers(engine) == {1: side_id}
        [m] = consumer.dequeue(1, timeout=1)
        assert (m.id, m.payload) == (1, payload)
    assert side_rows(engine) == []


def test_a_closing_consumers_release_moves_the_pointer_of_a_large_message(engine):
    payload = os.urandom(20_000)
    consumer_a = ring(engine, size=4)
    with RingQueue(engine, "r") as producer, RingQueue(engine, "r") as consumer_c:
        assert consumer_a.dequeue(1) == []  # claims position 0
        assert producer.enqueue(payload, headers={"trace": "t"}) == 0
        [(side_id, _)] = side_rows(engine)
        consumer_a.close()
        assert consumer_a.released == [ReleasedClaim("pop", 0, False, 1, "rescued")]
        assert pointers(engine) == {1: side_id}
        [m] = consumer_c.dequeue(5)
        assert (m.id, m.payload, m.headers) == (1, payload, {"trace": "t"})
    assert side_rows(engine) == []


def functions(engine, name: str) -> dict[str, str]:
    """Every function of the ring, its definition with the queue's name taken out."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p "
            "WHERE p.pronamespace = 'queuectl'::regnamespace AND p.proname LIKE :prefix"), {"prefix": f"{name}\\_%"}).all()
    return {fn.removeprefix(f"{name}_"): definition.replace(f"{name}_", "NAME_") for fn, definition in rows}


def test_upgrade_from_ring_0006_and_downgrade_lose_no_message(engine):
    assert head_of("ring") >= "ring_0007"
    small, big, later = b"s" * 100, os.urandom(6_000), os.urandom(9_000)
    install_queue(engine, "r", "ring", RingSettings(size=8), revision="ring_0006")
    install_queue(engine, "witness", "ring", RingSettings(size=8), revision="ring_0006")
    at_0006 = functions(engine, "witness")
    assert {"enqueue", "enqueue_many", "dequeue", "ring_repair", "ring_release", "publish", "sub_take",
            "fanout_guard"} <= set(at_0006)
    with engine.connect() as conn:
        conn.execute(sa.text("UPDATE queuectl.queues SET settings = '{\"size\": 8}' WHERE name = 'r'"))
        conn.commit()
    with RingQueue(engine, "r") as q:
        assert q.enqueue_many([small, big]) == [0, 1]  # 0006: both in their slots (big TOASTed)
        assert upgrade_queue(engine, "r") == ("ring_0006", head_of("ring"))
        with engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT settings FROM queuectl.queues WHERE name = 'r'")).scalar_one()
        assert stored == {"size": 8, "slot_bytes": WIDTH, "max_payload_bytes": DEFAULT_MAX_PAYLOAD_BYTES}
        assert q.enqueue(later) == 2 and pointers(engine) == {2: side_rows(engine)[0][0]}
        assert [m.payload for m in q.dequeue(1)] == [small]
        # down with a side-table message waiting: it goes back into its slot
        assert downgrade_queue(engine, "r", "ring_0006") == (head_of("ring"), "ring_0006")
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT to_regclass('queuectl.r_ring_large')")).scalar() is None
            assert "large_id" not in [c["name"] for c in sa.inspect(conn).get_columns("r_ring", schema="queuectl")]
            stored = conn.execute(sa.text("SELECT settings FROM queuectl.queues WHERE name = 'r'")).scalar_one()
        assert stored == {"size": 8}
        assert functions(engine, "r") == at_0006  # exactly ring_0006's functions again
        assert [(m.id, m.payload) for m in q.dequeue(5)] == [(1, big), (2, later)]
        assert q.enqueue(later) == 3  # ring_0006's push works on the table as it was
        assert [m.payload for m in q.dequeue(5)] == [later]


def test_settings_and_the_install_option(db_url, engine):
    assert RingSettings().as_dict() == {"size": 65_536, "slot_bytes": WIDTH, "max_payload_bytes": DEFAULT_MAX_PAYLOAD_BYTES}
    assert RingSettings.from_dict({"size": 4}) == RingSettings(size=4)
    with pytest.raises(UsageError, match="slot-bytes must be a whole number from 0 to"):
        RingSettings(slot_bytes=-1)
    with pytest.raises(UsageError, match="--slot-bytes applies to --kind ring only"):
        settings_for("fifo", slot_bytes=100)
    helped = run_cli("install", "--help", columns=400).stdout.decode()
    assert "--slot-bytes" in helped and "side table" in helped
    result = run_cli("install", "big", "--kind", "ring", "--size", "4", "--slot-bytes", "0",
                     "--max-payload-bytes", "100", url=db_url)
    assert result.returncode == 0, result.stderr.decode()
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT settings FROM queuectl.queues WHERE name = 'big'")).scalar_one()
    assert stored == {"size": 4, "slot_bytes": 0, "max_payload_bytes": 100}
    with RingQueue(engine, "big") as q:
        q.enqueue(b"a")  # slot_bytes 0: every non-empty message goes to the side table
        assert len(side_rows(engine, "big")) == 1
        with pytest.raises(PayloadTooLarge):
            q.enqueue(b"b" * 101)
        assert q.dequeue(5)[0].payload == b"a"
    refused = run_cli("enqueue", "big", "-", input=b"b" * 101, url=db_url)
    assert refused.returncode == 2
    assert refused.stderr.decode().strip() == ("error: queue 'big': message 1 of 1 is 101 bytes (payload 101 + headers 0), "
                                               "over max_payload_bytes 100: nothing was enqueued")
    bad = run_cli("install", "other", "--kind", "fifo", "--slot-bytes", "10", url=db_url)
    assert bad.returncode == 2 and bad.stderr.decode().strip() == "error: --slot-bytes applies to --kind ring only"


# -- fan-out rings: every subscription reads the side row; the slot's reuse deletes it -----------


def fanout_ring(engine, size: int = 8, name: str = "f", **settings) -> RingQueue:
    install_queue(engine, name, "ring", RingSettings(size=size, fanout=True, **settings))
    return RingQueue(engine, name)


def side_ids(engine, name: str = "f") -> set[int]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text(f'SELECT id FROM queuectl."{name}_ring_large"')).scalars())


def slot_pointers(engine, name: str = "f") -> set[int]:
    """The side-table ids the slots point to, whatever their state."""
    with engine.connect() as conn:
        return set(conn.execute(sa.text(
            f'SELECT large_id FROM queuectl."{name}_ring" WHERE large_id IS NOT NULL')).scalars())


def test_a_fanout_ring_gives_every_subscription_every_large_message_over_several_laps(engine):
    """Two subscriptions, payloads under and over slot_bytes, five laps of an 8-slot ring: each
    subscription gets every payload and header byte-exact (a lease that expires and a nack
    read the side row again); the side table holds only the messages still in slots, at most
    `size` rows, and each row a slot points to."""
    size, laps = 8, 5
    with fanout_ring(engine, size=size) as q:
        q.subscribe("a")
        q.subscribe("b")
        a, b = q.subscription("a"), q.subscription("b")
        sent: list[tuple[bytes, dict]] = []
        got: dict[str, list[tuple[int, bytes, dict]]] = {"a": [], "b": []}
        for lap in range(laps):
            batch = [(os.urandom(n), {"lap": lap, "i": i})
                     for i, n in enumerate([10, WIDTH - 20, WIDTH + 1, 4_000, 70_000, 0, 2_500, 100_000])]
            ids = q.enqueue_many([p for p, _ in batch], headers=[h for _, h in batch])
            assert ids == list(range(lap * size, (lap + 1) * size))
            sent += batch
            # 5 of 8 over the width: 5 side rows for this lap, the last lap's gone with their slots
            assert len(side_ids(engine)) == 5 and side_ids(engine) == slot_pointers(engine)
            first = a.dequeue(3)
            assert a.nack(first[:1]) == [first[0].id]  # given back: taken again, through the pointer
            rest = a.dequeue(size)
            assert a.ack(first[1:] + rest) == sorted(m.id for m in first[1:] + rest)
            got["a"] += [(m.id, m.payload, m.headers) for m in first[1:] + rest]
            # "a" is done with the lap, "b" has not started it: the side rows stay for "b"
            assert len(side_ids(engine)) == 5
            taken = b.dequeue(size, lease=0.001)
            time.sleep(0.01)  # the leases expire: a take hands them out again once it looks (once a second)
            again = b.dequeue(size, timeout=5)
            assert [m.id for m in again] == [m.id for m in taken] and all(b.tries(m) == 2 for m in again)
            assert b.ack(again) == [m.id for m in again]
            got["b"] += [(m.id, m.payload, m.headers) for m in again]
            assert len(side_ids(engine)) <= size and side_ids(engine) == slot_pointers(engine)
        expected = [(i, p, h) for i, (p, h) in enumerate(sent)]
        assert sorted(got["a"]) == expected and got["b"] == expected


def test_a_fanout_ring_leaks_no_side_row_through_tombstones_unsubscribe_or_uninstall(engine):
    big = [os.urandom(3_000 + i) for i in range(12)]
    with fanout_ring(engine, size=4) as q, RingQueue(engine, "f") as stuck:
        q.subscribe("a")
        a = q.subscription("a")
        assert q.enqueue_many(big[:4]) == [0, 1, 2, 3]
        # the ring is full for "a": the push keeps its claim on position 4
        with pytest.raises(QueueFullError):
            stuck.enqueue(big[4], timeout=0.1)
        assert len(side_ids(engine)) == 4  # its side row was deleted with the failed call
        assert [m.payload for m in a.dequeue(4)] == big[:4]
        a.ack(range(4))
        # the release tombstones position 4 in slot 0: "a" is done with message 0, so the guard
        # writes the tombstone and deletes the side row of the message it replaces
        stuck.close()
        assert stuck.released == [ReleasedClaim("push", 4, True, None, "tombstoned")]
        assert len(side_ids(engine)) == 3 and side_ids(engine) == slot_pointers(engine)
        assert q.enqueue_many(big[5:8]) == [5, 6, 7]
        assert [m.payload for m in a.dequeue(10)] == big[5:8]  # past the tombstone
        a.ack([5, 6, 7])
        # ring_repair's tombstones go through the same guard: a claim it skips leaves nothing
        assert q.unsubscribe("a")
        for lap in range(3):  # no subscription: every slot is reused at once
            assert len(q.enqueue_many(big[8:12])) == 4
            assert len(side_ids(engine)) == 4 and side_ids(engine) == slot_pointers(engine)
    uninstall_queue(engine, "f")
    assert scalar(engine, "SELECT to_regclass('queuectl.f_ring_large')") is None


def test_a_fanout_ring_refuses_a_message_over_the_maximum_in_one_line(engine, db_url):
    with fanout_ring(engine, size=4, max_payload_bytes=5_000) as q:
        q.subscribe("a")
        with pytest.raises(PayloadTooLarge) as refused:
            q.enqueue_many([b"x" * 4_000, b"y" * 5_001])
        assert str(refused.value) == ("queue 'f': message 2 of 2 is 5001 bytes (payload 5001 + headers 0), "
                                      "over max_payload_bytes 5000: nothing was enqueued")
        assert side_ids(engine) == set() and q.subscription("a").dequeue(5) == []
        assert q.enqueue(b"z" * 5_000) == 0  # nothing drawn by the refused call
    with sa.create_engine(db_url).connect() as conn:
        with pytest.raises(sa.exc.DBAPIError, match="over max_payload_bytes 5000"):
            conn.execute(sa.text('SELECT * FROM queuectl."f_publish"(CAST(:p AS bytea[]))'), {"p": [b"q" * 5_001]})


def test_fanout_ring_with_large_messages_upgrades_from_ring_0006_and_back_losing_nothing(engine):
    """Messages in flight and subscriptions in place across the upgrade: a message published at
    ring_0006 (in its slot) and one at the head (in the side table) reach both subscriptions;
    the downgrade moves the side rows back into their slots, restores ring_0006's functions
    exactly, and the subscriptions read on."""
    m0, m1, m2, m3 = (os.urandom(n) for n in (5_000, 100, 9_000, 7_000))
    install_queue(engine, "witness", "ring", RingSettings(size=8, fanout=True), revision="ring_0006")
    at_0006 = functions(engine, "witness")
    install_queue(engine, "f", "ring", RingSettings(size=8, fanout=True), revision="ring_0006")
    with RingQueue(engine, "f") as q:
        q.subscribe("a")
        q.subscribe("b")
        a, b = q.subscription("a"), q.subscription("b")
        assert q.enqueue_many([m0, m1]) == [0, 1]
        [held] = a.dequeue(1)  # claimed at ring_0006, acknowledged at the head
        assert upgrade_queue(engine, "f") == ("ring_0006", head_of("ring"))
        assert [s.name for s in q.subscriptions()] == ["a", "b"]
        assert q.enqueue_many([m2, m3]) == [2, 3] and len(side_ids(engine)) == 2
        assert a.ack([held]) == [0]
        assert [(m.id, m.payload) for m in a.dequeue(10)] == [(1, m1), (2, m2), (3, m3)]
        a.ack([1, 2, 3])
        assert [(m.id, m.payload) for m in b.dequeue(2)] == [(0, m0), (1, m1)]  # b: 2 and 3 left
        b.ack([0, 1])
    assert downgrade_queue(engine, "f", "ring_0006") == (head_of("ring"), "ring_0006")
    assert functions(engine, "f") == at_0006
    assert scalar(engine, "SELECT to_regclass('queuectl.f_ring_large')") is None
    assert scalar(engine, "SELECT settings FROM queuectl.queues WHERE name = 'f'") == {
        "size": 8, "fanout": True, "lag_limit": 4, "drop_when_behind": False}
    with RingQueue(engine, "f") as q:
        b = q.subscription("b")
        assert [(m.id, m.payload) for m in b.dequeue(10)] == [(2, m2), (3, m3)]  # back in their slots
        b.ack([2, 3])
        assert q.enqueue(m1) == 4
        assert [m.payload for m in q.subscription("a").dequeue(5)] == [m1]


# -- SQL Server: the same design in T-SQL (parse- and reference-checked, not run live) -----------


def _section(name: str) -> str:
    return rendered("ring", name)


def test_tsql_side_table_sections_parse():
    for name in ("create_large_table", "drop_large_table", "create_enqueue_many", "create_enqueue",
                 "create_dequeue", "create_ring_repair", "create_ring_release"):
        assert check_tsql(_section(name)) > 0, name


def test_tsql_push_checks_sizes_and_routes_large_messages_to_the_side_table():
    push = _section("create_enqueue_many")
    assert "THROW 50413" in push  # the client's PayloadTooLarge (MssqlAdapter.payload_refusal)
    # MERGE, whose OUTPUT pairs each new side-table id with the message's ordinal
    assert re.search(r'MERGE INTO "queuectl"\."orders_ring_large" AS l', push)
    assert "WHEN NOT MATCHED THEN INSERT (payload, headers)" in push
    assert "large_id" in push
    # the refusal comes before any position is drawn
    assert push.index("THROW 50413") < push.index("EXEC sys.sp_sequence_get_range")


def test_tsql_pop_and_rescues_carry_the_pointer():
    pop = _section("create_dequeue")
    assert re.search(r"DELETE\b.*_ring_large", pop, re.S) and "deleted.large_id" in pop
    for name in ("create_ring_repair", "create_ring_release"):
        body = _section(name)
        assert "large_id" in body, name
    down = _section("drop_large_table")
    assert "UPDATE" in down and down.index("UPDATE") < down.index("DROP TABLE")


def _trigger_text(guard: str) -> str:
    """The guard trigger's T-SQL, as the guard procedure's CONCAT makes it (names filled)."""
    body = guard[guard.index("SET @sql = CONCAT(N'CREATE OR ALTER TRIGGER "):]
    body = body[body.index("AFTER UPDATE AS\n") + len("AFTER UPDATE AS\n"): body.index("END');") + 3]
    for variable, table in (("@table", "orders_ring"), ("@subs", "orders_subs"), ("@slots", "orders_sub_slots"),
                            ("@large", "orders_ring_large")):
        body = body.replace(f"', {variable}, N'", f'"queuectl"."{table}"')
    return ('CREATE OR ALTER TRIGGER "queuectl"."orders_ring_fanout_guard" ON "queuectl"."orders_ring" AFTER UPDATE AS\n'
            + body.replace("''", "'"))


def test_tsql_fanout_sections_parse_and_the_guard_trigger_too():
    for name in ("create_fanout_guard", "create_publish", "create_sub_take", "refresh_fanout_guard"):
        assert check_tsql(_section(name)) > 0, name
    trigger = _trigger_text(_section("create_fanout_guard"))
    assert check_tsql(trigger) > 0
    # a tombstone that stays deletes the side row of the message it replaces; one undone keeps it
    assert 'OUTPUT d.large_id INTO @passed' in trigger
    assert 'DELETE FROM "queuectl"."orders_ring_large" WHERE id IN (SELECT p.large_id FROM @passed AS p)' in trigger
    assert "large_id = d.large_id" in trigger
    # ring_0006's trigger, remade by the downgrade, reads no side table
    assert "large" not in _trigger_text(_section("create_fanout_guard_0006"))


def test_tsql_publish_checks_sizes_writes_the_side_table_and_deletes_what_a_reused_slot_held():
    publish = _section("create_publish")
    assert publish.index("THROW 50413") < publish.index("EXEC sys.sp_sequence_get_range")
    merge, update = publish.index('MERGE INTO "queuectl"."orders_ring_large"'), publish.index("UPDATE r\n")
    assert publish.index("BEGIN TRANSACTION") < merge < update  # in the run's transaction, before its slot locks
    assert "OUTPUT p.ord, inserted.msg_id, deleted.large_id INTO @written (ord, id, replaced)" in publish
    # the replaced messages' side rows go only when the whole run was written, before its commit
    freed = publish.index('DELETE FROM "queuectl"."orders_ring_large" WITH (ROWLOCK)')
    assert update < publish.index("ROLLBACK TRANSACTION run") < freed < publish.index("COMMIT TRANSACTION", freed)
    assert "DELETE FROM @large WHERE ord >= @done" in publish  # a rolled-back run forgets its side ids


def test_tsql_sub_take_reads_large_messages_through_the_pointer_and_deletes_nothing():
    take = _section("create_sub_take")
    assert re.search(r'LEFT JOIN "queuectl"\."orders_ring_large" AS l WITH \(READCOMMITTEDLOCK, ROWLOCK\) '
                     r"ON l\.id = r\.large_id", take)
    assert not re.search(r"DELETE\b[^;]*_ring_large", take)


def test_upkeep_sees_the_side_table_and_the_subscriptions_of_the_revisions_that_have_them():
    from queuectl.kindspec import UPKEEP_TABLES, upkeep_tables

    assert UPKEEP_TABLES["ring"] == ("ring", "ring_large", "sub_slots", "subs")
    assert upkeep_tables("ring") == upkeep_tables("ring", "ring_0007") == UPKEEP_TABLES["ring"]
    assert upkeep_tables("ring", "ring_0006") == ("ring", "sub_slots", "subs")
    assert upkeep_tables("ring", "ring_0005") == ("ring",)
    assert upkeep_tables("heap", "heap_0001") == ("items",)
