"""The ring buffer: full and empty rings, pops that never read an uncommitted push, the
recovery path for poppers and pushers that die holding a claimed position, consumers that
close leaving no orphan (ring_0002's release, and the upgrade to it and back), HOT updates,
ring_0003's set-based batches and ring_0005's one-statement push and pop."""

from __future__ import annotations

import multiprocessing as mp
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

import ring_workers
from jobs_helpers import scalar, wait_until
from queuectl.install import downgrade_queue, head_of, install_queue, uninstall_queue, upgrade_queue
from queuectl.client import QueueFullError, ReleasedClaim, RingQueue, repair_ring
from queuectl.kindspec import RingSettings

from test_install import schema_objects


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


@pytest.mark.slow
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


# -- release: a consumer that closes leaves no orphan ----------------------------------------


def test_message_pushed_after_a_closing_consumers_last_pop_is_rescued_by_its_release(engine):
    """The race ring_0001 left to ring_repair: consumer A pops on an empty ring and keeps its
    claim (position 0), producer B's push of 0 commits, then A closes. No pop will ever ask
    for 0 again, so A's release re-pushes the message at once, under a new id."""
    consumer_a = ring(engine, 4)
    with RingQueue(engine, "r") as producer_b, RingQueue(engine, "r") as consumer_c:
        assert consumer_a.dequeue(1) == []  # claims position 0 and keeps it
        assert producer_b.enqueue("late", headers={"trace": "t-1"}) == 0  # committed (autocommit)
        consumer_a.close()
        assert consumer_a.released == [ReleasedClaim("pop", 0, False, 1, "rescued")]
        assert slots(engine)[:2] == [(0, 0, 3), (1, 1, 1)]  # old slot RESCUED, the message at 1
        [m] = consumer_c.dequeue(5)
        assert (m.id, m.text, m.headers) == (1, "late", {"trace": "t-1"})  # same payload and headers
        assert consumer_c.dequeue(5, timeout=0.2) == []  # exactly once
        repair = repair_ring(engine, "r", grace=0)
        assert (repair.tombstoned, repair.rescued, repair.deferred) == ([], [], [])  # nothing left to repair
        assert producer_b.counts()["ready"] == 0


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_release_waits_for_a_push_in_flight_at_its_claim_and_acts_on_its_outcome(engine, db_url, end):
    """The push of the claimed position is under way (row locked, not committed) when the
    consumer releases: the release waits for it, then rescues the message if the push
    committed, or tombstones the position if it rolled back."""
    other = sa.create_engine(db_url)
    consumer = ring(engine, 4)
    try:
        with other.connect() as pusher, ThreadPoolExecutor(1) as pool:
            assert consumer.dequeue(1) == []  # claims position 0
            pusher.begin()
            assert pusher.execute(sa.text("SELECT queuectl.\"r_enqueue\"('in flight')")).scalar() == 0
            released = pool.submit(consumer.release)
            wait_until(lambda: scalar(engine, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :pid",
                                      pid=consumer.backend_pid), timeout=30, interval=0.01)
            getattr(pusher, end)()
            result = released.result(timeout=30)
        if end == "commit":
            assert result == [ReleasedClaim("pop", 0, False, 1, "rescued")]
            assert slots(engine)[:2] == [(0, 0, 3), (1, 1, 1)]
        else:
            assert result == [ReleasedClaim("pop", 0, True, None, "tombstoned")]
            assert slots(engine)[0] == (0, 0, 2)
    finally:
        consumer.close()
        other.dispose()


def test_release_rescues_through_a_chain_of_closing_consumers(engine):
    """The rescued message lands at a position another consumer already claimed; that one
    closes before popping it: its release rescues it in turn, and it is still delivered once."""
    consumer_a = ring(engine, 8)
    consumer_b = RingQueue(engine, "r")
    with RingQueue(engine, "r") as producer, RingQueue(engine, "r") as consumer_c:
        assert consumer_a.dequeue(1) == [] and consumer_b.dequeue(1) == []  # claims 0 and 1
        assert producer.enqueue("m") == 0
        consumer_a.close()
        assert consumer_a.released == [ReleasedClaim("pop", 0, False, 1, "rescued")]  # at B's claim
        consumer_b.close()
        assert consumer_b.released == [ReleasedClaim("pop", 1, False, 2, "rescued")]
        assert [(m.id, m.text) for m in consumer_c.dequeue(5)] == [(2, "m")]
        assert repair_ring(engine, "r", grace=0).rescued == []


def test_release_still_tombstones_claims_nobody_pushed(engine):
    """Unchanged from ring_0001: a pop claim and a push claim whose slots are free for them
    are tombstoned at once; the pushes and pops after them skip those positions."""
    with ring(engine, 2) as q:
        assert q.dequeue(1) == []  # keeps pop claim 0
        assert q.release() == [ReleasedClaim("pop", 0, True, None, "tombstoned")]
        assert q.release() == []  # nothing kept any more
        assert q.enqueue_many(["a", "b"]) == [1, 2]  # push 0 found the tombstone and moved on
        with pytest.raises(QueueFullError):
            q.enqueue("c", timeout=0.05)  # keeps push claim 3
        assert [(m.id, m.text) for m in q.dequeue(2)] == [(1, "a"), (2, "b")]
        assert q.release() == [ReleasedClaim("push", 3, True, None, "tombstoned")]
        assert q.enqueue("d") == 4
        assert [(m.id, m.text) for m in q.dequeue(2)] == [(4, "d")]  # pop 3 skips the tombstone
        assert slots(engine) == [(0, 4, 0), (1, 3, 2)]


def test_release_on_a_full_ring_leaves_the_message_for_ring_repair(engine):
    """The rescue needs a free slot. Ring of 3 holding 0, 1, 2; producer B waits with push
    claim 3 (slot 0). Consumer A's claim 0 got its message late; its rescue draws position
    4 (slot 1, full) and gives up after its short timeout: the message stays FULL at 0,
    reported as deferred, for ring_repair, which rescues it once the ring has room."""
    consumer_a = ring(engine, 3)
    with RingQueue(engine, "r") as producer_b, RingQueue(engine, "r") as consumer_c:
        assert consumer_a.dequeue(1) == []  # claims 0
        assert producer_b.enqueue_many(["m0", "m1", "m2"], headers=[{"n": 0}, None, None]) == [0, 1, 2]
        with pytest.raises(QueueFullError):
            producer_b.enqueue("m3", timeout=0.05)  # keeps push claim 3
        started = time.monotonic()
        assert consumer_a.release() == [ReleasedClaim("pop", 0, False, None, "deferred")]
        assert time.monotonic() - started >= 0.1  # the rescue's push waited its timeout
        assert consumer_a.release() == []  # the failed push's claim did not stay in the session
        consumer_a.close()
        assert consumer_a.released == []
        assert slots(engine) == [(0, 0, 1), (1, 1, 1), (2, 2, 1)]  # nothing moved, nothing lost
        assert [m.text for m in consumer_c.dequeue(2)] == ["m1", "m2"]
        repair = repair_ring(engine, "r", grace=0)
        # position 4 (drawn by the failed rescue, never written) is tombstoned; 0 is rescued at 5
        assert (repair.tombstoned, repair.rescued, repair.deferred) == ([4], [(0, 5)], [])
        assert producer_b.enqueue("m3") == 3  # its kept claim, in the slot the rescue freed
        assert [(m.id, m.text, m.headers) for m in consumer_c.dequeue(5)] == [(3, "m3", None), (5, "m0", {"n": 0})]
        assert consumer_c.dequeue(1, timeout=0.1) == [] and producer_b.counts()["ready"] == 0


# -- upgrades: queues move to the rescuing release (0002) and the set-based push/pop (0003)
# -- one at a time, and back ---------------------------------------------------------------


def release_function(engine, name: str) -> tuple[str, str, str]:
    """(arguments, result columns, whole definition with the queue's name taken out)."""
    with engine.connect() as conn:
        args, result, definition = conn.execute(sa.text(
            "SELECT pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid), pg_get_functiondef(p.oid) "
            "FROM pg_proc p WHERE p.pronamespace = 'queuectl'::regnamespace AND p.proname = :fn"),
            {"fn": f"{name}_ring_release"}).one()
    return args, result, definition.replace(f"{name}_", "NAME_")


def ring_functions(engine, name: str) -> dict[str, str]:
    """The push, pop and release functions' definitions, with the queue's name taken out."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p "
            "WHERE p.pronamespace = 'queuectl'::regnamespace AND p.proname = ANY(:fns)"),
            {"fns": [f"{name}_{f}" for f in ("enqueue", "enqueue_many", "dequeue", "ring_release")]}).all()
    return {fn.removeprefix(f"{name}_"): definition.replace(f"{name}_", "NAME_") for fn, definition in rows}


def test_fresh_ring_install_is_at_the_head_with_the_rescuing_release(engine):
    info = install_queue(engine, "r", "ring", RingSettings(size=4))
    assert head_of("ring") >= "ring_0003" and info.schema_version == head_of("ring")
    args, result, _ = release_function(engine, "r")
    assert args == "p_timeout double precision"
    assert result == "TABLE(side text, item_id bigint, tombstoned boolean, new_item_id bigint, outcome text)"


def test_ring_queue_at_0001_upgrades_alone_and_downgrades_cleanly_with_its_messages(engine):
    install_queue(engine, "alpha", "ring", RingSettings(size=8), revision="ring_0001")
    install_queue(engine, "beta", "ring", RingSettings(size=8), revision="ring_0001")
    old = release_function(engine, "beta")
    old_functions = ring_functions(engine, "beta")
    assert old[:2] == ("", "TABLE(side text, item_id bigint, tombstoned boolean)")
    assert release_function(engine, "alpha") == old
    # at ring_0001 the race orphans the message: the client reads the old rows as 'left'
    with RingQueue(engine, "alpha") as producer:
        consumer = RingQueue(engine, "alpha")
        assert consumer.dequeue(1) == []  # claims 0
        assert producer.enqueue_many(["a0", "a1", "a2"]) == [0, 1, 2]
        consumer.close()
        assert consumer.released == [ReleasedClaim("pop", 0, False, None, "left")]
    assert slots(engine, "alpha")[:3] == [(0, 0, 1), (1, 1, 1), (2, 2, 1)]

    assert upgrade_queue(engine, "alpha") == ("ring_0001", head_of("ring"))
    assert release_function(engine, "alpha")[1].endswith("new_item_id bigint, outcome text)")
    assert release_function(engine, "beta") == old  # upgraded one at a time
    assert ring_functions(engine, "beta") == old_functions
    assert slots(engine, "alpha")[:3] == [(0, 0, 1), (1, 1, 1), (2, 2, 1)]  # the messages stay
    with RingQueue(engine, "alpha") as producer, RingQueue(engine, "alpha") as consumer:
        # ring_0003's pop claims no position past the pushes once it has taken some
        assert [m.text for m in consumer.dequeue(5)] == ["a1", "a2"]
        assert consumer.dequeue(1) == []  # the ring is empty now: it claims 3 and keeps it
        assert producer.enqueue("a3") == 3
        consumer.close()
        assert consumer.released == [ReleasedClaim("pop", 3, False, 4, "rescued")]  # at once, now
        assert repair_ring(engine, "alpha", grace=0).rescued == [(0, 5)]  # 0001's orphan needs the repair
        assert [(m.id, m.text) for m in producer.dequeue(5)] == [(4, "a3"), (5, "a0")]
        assert producer.dequeue(1) == []  # claims 6
        assert producer.enqueue("a6") == 6  # pushed after its own last pop: close() rescues it
    assert producer.released == [ReleasedClaim("pop", 6, False, 7, "rescued")]

    assert downgrade_queue(engine, "alpha", "ring_0001") == (head_of("ring"), "ring_0001")
    assert release_function(engine, "alpha") == old  # exactly ring_0001's functions again
    assert ring_functions(engine, "alpha") == old_functions
    with RingQueue(engine, "alpha") as consumer:
        assert [(m.id, m.text) for m in consumer.dequeue(5)] == [(7, "a6")]  # the message stays
        consumer.close()
        assert consumer.released == [ReleasedClaim("pop", 8, True, None, "tombstoned")]
    uninstall_queue(engine, "alpha")
    assert not [f for f in schema_objects(engine)["functions"] if f.startswith("alpha_")]


# -- ring_0003: a batch is claimed with one sequence series and written/taken in one UPDATE --


def test_batch_pop_takes_the_committed_positions_and_keeps_the_uncommitted_ones(engine, db_url):
    """Positions 0 and 1 are pushed in a transaction still open; 2 and 3 are committed. A pop
    of 4 takes 2 and 3 in one go, keeps its claims on 0 and 1 (never reading the open push),
    and the next pop takes them once that push commits."""
    other = sa.create_engine(db_url)
    try:
        with ring(engine, 8) as consumer, RingQueue(engine, "r") as producer, other.connect() as pusher:
            pusher.begin()
            assert list(pusher.execute(sa.text(
                "SELECT * FROM queuectl.\"r_enqueue_many\"(ARRAY['a0', 'a1']::bytea[])")).scalars()) == [0, 1]
            assert producer.enqueue_many(["b2", "b3"]) == [2, 3]
            assert [(m.id, m.text) for m in consumer.dequeue(4)] == [(2, "b2"), (3, "b3")]
            assert consumer.dequeue(4, timeout=0.2) == []  # 0 and 1 still uncommitted: kept, not read
            pusher.commit()
            assert [(m.id, m.text) for m in consumer.dequeue(4)] == [(0, "a0"), (1, "a1")]
            assert consumer.release() == []  # nothing was claimed past the pushes
            assert producer.counts()["ready"] == 0
    finally:
        other.dispose()


def test_closing_consumer_rescues_every_message_that_arrived_at_its_kept_claims(engine, db_url):
    """A consumer keeps two claims (0 and 1) whose pushes are in flight, then closes after
    they commit: its release re-pushes both at once, so nothing waits for ring_repair."""
    other = sa.create_engine(db_url)
    consumer = ring(engine, 8)
    try:
        with RingQueue(engine, "r") as producer, other.connect() as pusher:
            pusher.begin()
            pusher.execute(sa.text("SELECT * FROM queuectl.\"r_enqueue_many\"(ARRAY['a0', 'a1']::bytea[])")).all()
            assert producer.enqueue("b2") == 2
            assert [m.id for m in consumer.dequeue(3)] == [2]  # keeps 0 and 1
            pusher.commit()
            consumer.close()
            assert consumer.released == [ReleasedClaim("pop", 0, False, 3, "rescued"),
                                         ReleasedClaim("pop", 1, False, 4, "rescued")]
            assert [(m.id, m.text) for m in producer.dequeue(5)] == [(3, "a0"), (4, "a1")]
            assert repair_ring(engine, "r", grace=0) == repair_ring(engine, "r", grace=0)
            assert repair_ring(engine, "r", grace=0).rescued == []
    finally:
        other.dispose()


def test_batch_push_into_a_filling_ring_writes_in_order_and_keeps_the_rest_of_its_claims(engine):
    """Ring of 4 holding 0-2: a push of three writes d at 3, cannot write e and f (their slots
    still hold 0 and 1) and keeps those two claims; after a pop frees the slots, the next
    push uses them in order: no hole, no reordering."""
    with ring(engine, 4) as q:
        assert q.enqueue_many(["a", "b", "c"]) == [0, 1, 2]
        with pytest.raises(QueueFullError) as full:
            q.enqueue_many(["d", "e", "f"], timeout=0.1)
        assert full.value.enqueued == [3]  # always the first payloads: array order is kept
        assert [m.text for m in q.dequeue(2)] == ["a", "b"]
        assert q.enqueue_many(["e", "f"]) == [4, 5]  # the kept claims, oldest first
        assert [(m.id, m.text) for m in q.dequeue(10)] == [(2, "c"), (3, "d"), (4, "e"), (5, "f")]
        repair = repair_ring(engine, "r", grace=0)
        assert (repair.tombstoned, repair.rescued, repair.deferred) == ([], [], [])  # no hole to fill
        assert q.release() == []


def test_session_claim_kept_at_ring_0002_is_served_after_the_upgrade_to_0003(engine):
    """A consumer connected across the upgrade keeps ring_0002's single-value claim; the set-
    based pop reads it as a list of one, so the message pushed at it is delivered to it."""
    install_queue(engine, "r", "ring", RingSettings(size=4), revision="ring_0002")
    with RingQueue(engine, "r") as consumer:
        assert consumer.dequeue(1) == []  # keeps claim 0 (ring_0002)
        assert upgrade_queue(engine, "r") == ("ring_0002", head_of("ring"))
        with RingQueue(engine, "r") as producer:
            assert producer.enqueue_many(["x", "y"]) == [0, 1]
        assert [(m.id, m.text) for m in consumer.dequeue(5)] == [(0, "x"), (1, "y")]
    assert downgrade_queue(engine, "r", "ring_0002") == (head_of("ring"), "ring_0002")
    with RingQueue(engine, "r") as producer, RingQueue(engine, "r") as consumer:
        assert producer.enqueue("z") == 2
        assert [(m.id, m.text) for m in consumer.dequeue(5)] == [(2, "z")]


# -- ring_0005: push and pop in one statement each; the pop takes by UPDATE alone ----------


def test_pop_of_a_claim_being_rescued_waits_for_the_rescue_then_takes_the_message_once(engine, db_url):
    """ring_0005's pop takes its slots by UPDATE with no lock pass first, so a FULL slot that
    ring_repair is rescuing right now is waited for (ring_0003 skipped it as locked). Consumer
    A keeps claim 0; the message pushed there is rescued to position 1 by a repair whose
    transaction is still open. A's pop waits for it, finds 0 RESCUED once it commits, and
    the message comes to A at 1 with its next pop: once, and no claim is left behind."""
    other = sa.create_engine(db_url)
    consumer = ring(engine, 8)
    try:
        with RingQueue(engine, "r") as producer, other.connect() as repairer, ThreadPoolExecutor(1) as pool:
            assert consumer.dequeue(1) == []  # claims 0 and keeps it
            assert producer.enqueue("m") == 0
            repairer.begin()
            assert repairer.execute(sa.text(
                "SELECT action, item_id, new_item_id FROM queuectl.\"r_ring_repair\"(interval '0 seconds', 1.0)")).all() \
                == [("rescue", 0, 1)]
            popped = pool.submit(consumer.dequeue, 5)
            wait_until(lambda: scalar(engine, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :pid",
                                      pid=consumer.backend_pid), timeout=30, interval=0.01)
            repairer.commit()
            assert popped.result(timeout=30) == []  # 0 was rescued; 1 was not committed when the pop began
            assert [(m.id, m.text) for m in consumer.dequeue(5)] == [(1, "m")]
            assert consumer.release() == []  # claim 0 dropped (RESCUED), claim 1 taken
            assert slots(engine)[:2] == [(0, 0, 3), (1, 1, 0)]
            assert producer.counts()["ready"] == 0
    finally:
        consumer.close()
        other.dispose()


def test_ring_0005_serves_claims_kept_across_its_upgrade_and_downgrades_to_ring_0003s_functions(engine):
    """Only the push and the pop change at ring_0005, and the session's kept claims have the
    same form on both sides: a consumer connected across the upgrade and the downgrade keeps
    its claims, and the downgrade restores exactly the functions ring_0004 had."""
    install_queue(engine, "alpha", "ring", RingSettings(size=4), revision="ring_0004")
    install_queue(engine, "beta", "ring", RingSettings(size=4), revision="ring_0004")
    old = ring_functions(engine, "beta")
    with RingQueue(engine, "alpha") as consumer, RingQueue(engine, "alpha") as producer:
        assert consumer.dequeue(1) == []  # keeps claim 0 (ring_0004)
        assert upgrade_queue(engine, "alpha") == ("ring_0004", head_of("ring"))
        if head_of("ring") != "ring_0005":  # back to the revision under test, through the later downgrades
            assert downgrade_queue(engine, "alpha", "ring_0005") == (head_of("ring"), "ring_0005")
        new = ring_functions(engine, "alpha")
        assert {fn for fn in old if new[fn] != old[fn]} == {"enqueue_many", "dequeue"}
        assert "FOR UPDATE OF s SKIP LOCKED" not in new["dequeue"].split("RETURN QUERY")[1]  # no lock pass
        assert producer.enqueue_many(["x", "y"]) == [0, 1]
        assert [(m.id, m.text) for m in consumer.dequeue(1)] == [(0, "x")]  # the claim kept at ring_0004
        assert [(m.id, m.text) for m in consumer.dequeue(1)] == [(1, "y")]
        assert consumer.dequeue(1) == []  # the ring is empty: claims 2 and keeps it (ring_0005)
        assert downgrade_queue(engine, "alpha", "ring_0004") == ("ring_0005", "ring_0004")
        assert ring_functions(engine, "alpha") == old  # exactly ring_0004's (ring_0003's) functions
        assert producer.enqueue("z") == 2
        assert [(m.id, m.text) for m in consumer.dequeue(5)] == [(2, "z")]  # the claim kept at ring_0005
        assert consumer.release() == []
        assert producer.counts()["ready"] == 0
