"""The ring buffer: full and empty rings, pops that never read an uncommitted push, the
recovery path for poppers and pushers that die holding a claimed position, HOT updates."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest
import sqlalchemy as sa

import ring_workers
from queuectl.install import install_queue
from queuectl.kinds import QueueFullError, RingQueue, repair_ring
from queuectl.kindspec import RingSettings


def ring(engine, size: int, name: str = "r") -> RingQueue:
    install_queue(engine, name, "ring", RingSettings(size=size))
    return RingQueue(engine, name)


def slots(engine, name: str = "r") -> list[tuple[int, int, int]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(f'SELECT slot, msg_id, state FROM queuectl."{name}_ring" ORDER BY slot'))]


def test_full_ring_push_waits_reports_full_and_keeps_its_position(engine):
    with ring(engine, 4) as q:
        assert q.enqueue_many(["a", "b", "c", "d"]) == [0, 1, 2, 3]
        started = time.monotonic()
        with pytest.raises(QueueFullError, match="stayed full"):
            q.enqueue("e", timeout=0.3)
        assert time.monotonic() - started >= 0.3  # it waited (backing off) before giving up
        assert q.counts()["ready"] == 4
        assert [m.text for m in q.dequeue(1)] == ["a"]
        assert q.enqueue("e") == 4  # the position claimed while full is reused: no hole
        with pytest.raises(QueueFullError) as full:
            q.enqueue_many(["f", "g"], timeout=0.1)
        assert full.value.enqueued == []
        assert [(m.id, m.text) for m in q.dequeue(10)] == [(1, "b"), (2, "c"), (3, "d"), (4, "e")]
        assert q.enqueue_many(["f", "g"]) == [5, 6]


def test_empty_ring_pop_waits_up_to_its_timeout_and_keeps_its_claim(engine):
    with ring(engine, 4) as q:
        started = time.monotonic()
        assert q.dequeue(3, timeout=0.3) == []
        assert time.monotonic() - started >= 0.3
        q.enqueue("late")
        [m] = q.dequeue(1)
        assert (m.id, m.text) == (0, "late")  # the position it claimed while empty
        q.enqueue_many(["x", "y"])
        assert [m.text for m in q.dequeue(5, timeout=0.2)] == ["x", "y"]  # returns as soon as it has some


def test_pop_never_reads_a_push_that_has_not_committed(engine, db_url):
    other = sa.create_engine(db_url)
    try:
        with ring(engine, 8) as q, other.connect() as pusher:
            pusher.begin()
            assert pusher.execute(sa.text("SELECT queuectl.\"r_enqueue\"('uncommitted')")).scalar() == 0
            assert q.dequeue(1, timeout=0.3) == []  # the slot is locked / still shows the old lap
            pusher.commit()
            assert [(m.id, m.text) for m in q.dequeue(1)] == [(0, "uncommitted")]
    finally:
        other.dispose()


def test_crashed_poppers_message_is_recovered_by_ring_repair(engine, db_url):
    """A popper claims position 0 on an empty ring and is SIGKILLed holding it. The message
    pushed at 0 then has no popper: live poppers never see it, until ring_repair re-pushes
    it at a new position."""
    install_queue(engine, "r", "ring", RingSettings(size=8))
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    popper = ctx.Process(target=ring_workers.pop_then_die, args=(db_url, "r", ready))
    popper.start()
    popper.join(timeout=60)
    assert ready.is_set() and popper.exitcode == -9
    with RingQueue(engine, "r") as producer, RingQueue(engine, "r") as consumer:
        assert producer.enqueue("orphan") == 0
        assert consumer.dequeue(1, timeout=0.3) == []  # it claimed position 1: 0 is nobody's
        assert slots(engine)[0] == (0, 0, 1)  # still FULL at position 0
        assert repair_ring(engine, "r", grace=3600) == repair_ring(engine, "r", grace=3600)  # within the grace: nothing
        assert repair_ring(engine, "r", grace=3600).rescued == []
        result = repair_ring(engine, "r", grace=0)
        assert (result.rescued, result.tombstoned, result.deferred) == ([(0, 1)], [], [])
        [m] = consumer.dequeue(1, timeout=1)
        assert (m.id, m.text) == (1, "orphan")  # delivered once, under its new position
        assert slots(engine)[0] == (0, 0, 3)  # the old slot is marked RESCUED, free for the next lap
        assert consumer.dequeue(1, timeout=0.1) == [] and producer.counts()["ready"] == 0


def test_crashed_pushers_hole_is_tombstoned_by_ring_repair(engine, db_url):
    """A pusher claims position 2 on a full ring of 2 and is SIGKILLed holding it. Pop 2
    waits for ever and, one lap later, push 4 finds slot 0 never freed for it."""
    install_queue(engine, "r", "ring", RingSettings(size=2))
    with RingQueue(engine, "r") as producer:
        producer.enqueue_many(["a", "b"])
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    pusher = ctx.Process(target=ring_workers.push_then_die, args=(db_url, "r", ready))
    pusher.start()
    pusher.join(timeout=60)
    assert ready.is_set() and pusher.exitcode == -9
    with RingQueue(engine, "r") as producer, RingQueue(engine, "r") as consumer:
        assert [m.text for m in consumer.dequeue(2)] == ["a", "b"]
        assert producer.enqueue("c") == 3  # position 2 belongs to the dead pusher
        assert consumer.dequeue(1, timeout=0.3) == []  # pop 2 waits for a push that never comes
        with pytest.raises(QueueFullError):
            producer.enqueue("d", timeout=0.3)  # position 4 -> slot 0, which never saw position 2
        result = repair_ring(engine, "r", grace=0)
        # slot 0's claimed but never written positions, 2 (dead pusher) and 4 (the producer's
        # claim kept from its failed push), are skipped by one tombstone at the highest
        assert result.tombstoned == [4] and result.rescued == []
        assert slots(engine) == [(0, 4, 2), (1, 3, 1)]
        assert [(m.id, m.text) for m in consumer.dequeue(5)] == [(3, "c")]  # pops skip 2 and 4
        assert producer.enqueue("d", timeout=0.3) == 5  # its claim was tombstoned: a new position
        assert [(m.id, m.text) for m in consumer.dequeue(5)] == [(5, "d")]
        assert slots(engine) == [(0, 4, 2), (1, 5, 0)]


def test_ring_updates_stay_hot_over_100000_push_pop_cycles(engine):
    """Only updates, never an indexed column, fillfactor 50: n_tup_hot_upd / n_tup_upd >= 0.9."""
    with ring(engine, 65_536) as q:
        for _ in range(100):
            ids = q.enqueue_many([b"payload-%d" % i for i in range(1000)])
            assert len(q.dequeue(1000)) == len(ids) == 1000
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
    # the client's backend flushes its counters when idle; read them with a deadline
    deadline = time.monotonic() + 30
    while True:
        with engine.connect() as conn:
            upd, hot, size = conn.execute(sa.text(
                "SELECT n_tup_upd, n_tup_hot_upd, pg_relation_size(relid) FROM pg_stat_user_tables "
                "WHERE relid = 'queuectl.r_ring'::regclass")).one()
        if upd >= 200_000 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert upd == 200_000  # 100,000 pushes and 100,000 pops, nothing else
    assert hot / upd >= 0.9, (hot, upd)
    with engine.connect() as conn:
        index_size = conn.execute(sa.text("SELECT pg_relation_size('queuectl.r_ring_pkey')")).scalar()
    assert index_size < 4 * 1024 * 1024  # HOT updates add no index entries: the pkey stays small
