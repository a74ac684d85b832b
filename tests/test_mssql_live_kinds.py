"""SQL Server, live: the queue kinds beside reliable (heap, fifo lax and strict, stack,
pending, watermark, ring), with the behaviour tests of the PostgreSQL suite (test_kinds.py,
test_ring.py, test_watermark.py, test_kinds_concurrency.py) against a real server, through
the public clients (open_queue and the kinds' classes).

They run only when QUEUECTL_TEST_MSSQL_URL names a SQL Server database the tests may create
schemas in (`make test-mssql`; docs/sqlserver.md); without it they are reported as SKIPPED.
Each test installs in a fresh schema and removes everything afterwards.

PostgreSQL-only, so not tested here: HOT updates of the ring's slots (fillfactor and
pg_stat_user_tables), the watermark's bounded work under an open snapshot (EXPLAIN BUFFERS
and PostgreSQL's MVCC dead versions), the ring's and the kinds' upgrades and downgrades
across their PostgreSQL revisions (ring_0001..0005), `install --sql` through psql and the
CLI's enqueue/dequeue (the same client calls as here, behind a subprocess).
"""

from __future__ import annotations

import queue as queue_module
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

import mssql_live_helpers as live
from queuectl.client import (
    FifoQueue, HeapQueue, PendingQueue, Queue, QueueFullError, ReleasedClaim, RingQueue, StackQueue,
    WatermarkQueue, correct_watermark, open_queue, repair_ring,
)
from queuectl.errors import UsageError
from queuectl.install import head_of, install_queue, uninstall_queue
from queuectl.kindspec import KINDS, FifoSettings, RingSettings, settings_for
from queuectl.registry import list_queues
from queuectl.stats import queue_overview

pytestmark = live.requires_mssql
mssql_engine, schema = live.mssql_engine, live.schema  # the shared fixtures

ALL = [("reliable", {}), ("heap", {}), ("fifo", {}), ("fifo", {"strict": True}), ("stack", {}), ("pending", {}),
       ("watermark", {}), ("ring", {"size": 16})]
IDS = [k + ("-strict" if o.get("strict") else "") for k, o in ALL]


def test_the_cases_cover_every_kind():
    assert {kind for kind, _ in ALL} == set(KINDS)


def install(engine, name: str, kind: str, schema: str, **options):
    return install_queue(engine, name, kind, settings_for(kind, **options), schema=schema)


def ring(engine, schema: str, size: int, name: str = "r") -> RingQueue:
    install_queue(engine, name, "ring", RingSettings(size=size), schema=schema)
    return RingQueue(engine, name, schema=schema)


def slots(engine, schema: str, name: str = "r") -> list[tuple[int, int, int]]:
    return [tuple(r) for r in live.rows(engine, f'SELECT slot, msg_id, state FROM "{schema}"."{name}_ring" ORDER BY slot')]


def set_stored_low(engine, schema: str, name: str, low: int) -> None:
    live.execute(engine, f'UPDATE "{schema}"."{name}_watermark" SET low = :low', low=low)


# -- every kind ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "options"), ALL, ids=IDS)
def test_every_kind_installs_at_its_head_round_trips_and_uninstalls_leaving_nothing(mssql_engine, schema, kind, options):
    info = install(mssql_engine, "q1", kind, schema, **options)
    assert (info.name, info.kind, info.schema_version) == ("q1", kind, head_of(kind))
    if kind != "reliable":
        assert info.settings == settings_for(kind, **options)
    with open_queue(mssql_engine, "q1", schema=schema) as queue:
        item = queue.enqueue(b"\x00\xffbinary", headers={"k": 1})
        [got] = queue.dequeue(5)
        assert (got.id, got.payload, got.headers) == (item, b"\x00\xffbinary", {"k": 1})
        if kind == "reliable":
            queue.ack([got])
    uninstall_queue(mssql_engine, "q1", schema=schema)
    with mssql_engine.connect() as conn:
        assert list_queues(conn, schema) == []
        left = conn.execute(sa.text("SELECT name FROM sys.objects WHERE schema_id = SCHEMA_ID(:s) AND name LIKE 'q1[_]%'"),
                            {"s": schema}).scalars().all()
    assert left == []


def test_open_queue_returns_the_client_of_each_kind(mssql_engine, schema):
    expected = {"reliable": Queue, "heap": HeapQueue, "fifo": FifoQueue, "stack": StackQueue,
                "pending": PendingQueue, "watermark": WatermarkQueue, "ring": RingQueue}
    assert set(expected) == set(KINDS)
    for kind, cls in expected.items():
        install(mssql_engine, f"k_{kind}", kind, schema, **({"size": 4} if kind == "ring" else {}))
        with open_queue(mssql_engine, f"k_{kind}", schema=schema) as queue:
            assert type(queue) is cls
    with pytest.raises(UsageError, match="kind 'heap', not 'fifo'"):
        FifoQueue(mssql_engine, "k_heap", schema=schema)


def test_queue_overview_shows_each_kinds_depth(mssql_engine, schema):
    depths = {"reliable": 3, "heap": 2, "fifo": 5, "stack": 1, "pending": 4, "watermark": 6, "ring": 7}
    for kind, n in depths.items():
        install(mssql_engine, f"d_{kind}", kind, schema, **({"size": 16} if kind == "ring" else {}))
        with open_queue(mssql_engine, f"d_{kind}", schema=schema) as q:
            q.enqueue_many([f"{kind}-{i}" for i in range(n + 2)])
            taken = q.dequeue(2)
            if kind == "reliable":
                q.ack(taken)
    with open_queue(mssql_engine, "d_pending", schema=schema) as q:
        q.enqueue("not yet", delay=600)
    listed = {row["name"]: row for row in queue_overview(mssql_engine, schema)}
    for kind, n in depths.items():
        row = listed[f"d_{kind}"]
        assert row["kind"] == kind and row["counts"]["ready"] == n, (kind, row)
    assert listed["d_pending"]["counts"]["scheduled"] == 1
    assert listed["d_reliable"]["counts"]["done"] == 2


# -- order promises -----------------------------------------------------------------------------


def test_fifo_is_oldest_first_and_enqueue_many_keeps_array_order(mssql_engine, schema):
    install(mssql_engine, "f", "fifo", schema)
    with open_queue(mssql_engine, "f", schema=schema) as q:
        ids = q.enqueue_many([f"m{i}" for i in range(50)], headers=[{"i": i} for i in range(50)])
        assert ids == sorted(ids)
        q.enqueue("last")
        taken = [m for _ in range(6) for m in q.dequeue(10)]
        assert [m.text for m in taken] == [f"m{i}" for i in range(50)] + ["last"]
        assert [m.headers for m in taken[:3]] == [{"i": 0}, {"i": 1}, {"i": 2}]
        assert q.dequeue(5) == []


def test_stack_single_consumer_sees_exact_lifo_order(mssql_engine, schema):
    install(mssql_engine, "s", "stack", schema)
    with open_queue(mssql_engine, "s", schema=schema) as q:
        q.enqueue_many(["a", "b", "c"])
        assert [m.text for m in q.dequeue(1)] == ["c"]
        q.enqueue("d")
        q.enqueue_many(["e", "f"])
        assert [m.text for m in q.dequeue(2)] == ["f", "e"]
        ids = q.enqueue_many([f"n{i}" for i in range(200)])
        taken = [q.dequeue(1)[0] for _ in range(200)]
        assert [m.id for m in taken] == ids[::-1]
        assert [m.text for m in q.dequeue(10)] == ["d", "b", "a"]


def test_heap_returns_every_item_once_in_no_promised_order(mssql_engine, schema):
    install(mssql_engine, "h", "heap", schema)
    with open_queue(mssql_engine, "h", schema=schema) as q:
        ids = q.enqueue_many([f"x{i}" for i in range(300)])
        got = [m.id for _ in range(10) for m in q.dequeue(40)]
        assert sorted(got) == sorted(ids) and len(got) == 300


def test_pending_returns_nothing_before_its_due_time_then_earliest_first(mssql_engine, schema):
    install(mssql_engine, "p", "pending", schema)
    with open_queue(mssql_engine, "p", schema=schema) as q:
        now = datetime.now(timezone.utc)
        late = q.enqueue("late", delay=1.2)
        early = q.enqueue("early", due_at=now + timedelta(seconds=0.6))
        q.enqueue_many(["later-1", "later-2"], delay=[1.5, 1.4])
        assert q.counts()["scheduled"] == 4 and q.counts()["ready"] == 0
        seen = []
        deadline = time.monotonic() + 10
        while len(seen) < 4 and time.monotonic() < deadline:
            for item in q.dequeue(10):
                assert datetime.now(timezone.utc) >= live.utc(item.due_at)  # never before it is due
                seen.append(item)
            time.sleep(0.02)
        assert [m.text for m in seen] == ["early", "late", "later-2", "later-1"]
        assert [m.id for m in seen[:2]] == [early, late]


def test_destructive_kinds_refuse_the_reliable_queues_options(mssql_engine, schema):
    install(mssql_engine, "f", "fifo", schema)
    with open_queue(mssql_engine, "f", schema=schema) as q:
        for kwargs in ({"priority": 1}, {"delay": 5}, {"title": "t"}):
            with pytest.raises(UsageError):
                q.enqueue("x", **kwargs)
        assert q.counts()["ready"] == 0


@pytest.mark.parametrize("kind", ["heap", "fifo", "stack", "pending", "watermark"])
def test_processing_rolls_back_into_the_queue_on_error(mssql_engine, schema, kind):
    install(mssql_engine, "f", kind, schema)
    with open_queue(mssql_engine, "f", schema=schema) as q:
        ids = q.enqueue_many(["a", "b", "c"])
        with pytest.raises(RuntimeError):
            with q.processing(2) as items:
                assert len(items) == 2
                raise RuntimeError("handler failed")
        assert q.counts()["ready"] == 3
        with q.processing(2) as items:
            pass
        [rest] = q.dequeue(5)
        assert sorted([m.id for m in items] + [rest.id]) == sorted(ids)


def test_strict_fifo_consumer_waits_for_the_head_while_lax_skips_it(mssql_engine, schema):
    """The mechanism under the order promise: a transaction holds items 1-2 of each queue
    (processing()); a lax consumer takes 3 at once, a strict one waits until the holder
    rolls back and then takes 1."""
    install(mssql_engine, "lax", "fifo", schema)
    install_queue(mssql_engine, "strict", "fifo", FifoSettings(strict=True), schema=schema)
    for name in ("lax", "strict"):
        with open_queue(mssql_engine, name, schema=schema) as q:
            q.enqueue_many(["1", "2", "3", "4"])
    with open_queue(mssql_engine, "lax", schema=schema) as lax_holder, \
            open_queue(mssql_engine, "strict", schema=schema) as strict_holder, \
            open_queue(mssql_engine, "lax", schema=schema) as lax, \
            open_queue(mssql_engine, "strict", schema=schema) as strict, \
            ThreadPoolExecutor(1) as pool:
        with pytest.raises(RuntimeError):
            with lax_holder.processing(2) as held_lax, strict_holder.processing(2) as held_strict:
                assert [m.id for m in held_lax] == [1, 2] and [m.id for m in held_strict] == [1, 2]
                assert [m.id for m in lax.dequeue(1)] == [3]  # lax: skips past the held head
                waiting = pool.submit(strict.dequeue, 1)
                time.sleep(1.0)
                assert not waiting.done()  # strict: waits for the head
                raise RuntimeError("the holder fails: its items go back to the head")
        assert [m.id for m in waiting.result(timeout=30)] == [1]
        assert [m.id for m in strict.dequeue(4)] == [2, 3, 4]
        assert [m.id for m in lax.dequeue(4)] == [1, 2, 4]  # lax handed 3 out before 1 and 2


# -- the ring -----------------------------------------------------------------------------------


def test_full_ring_push_waits_reports_full_and_keeps_its_position(mssql_engine, schema):
    with ring(mssql_engine, schema, 4) as q:
        assert q.enqueue_many(["a", "b", "c", "d"]) == [0, 1, 2, 3]
        started = time.monotonic()
        with pytest.raises(QueueFullError, match="stayed full"):
            q.enqueue("e", timeout=0.3)
        assert time.monotonic() - started >= 0.3  # it waited before giving up
        assert q.counts()["ready"] == 4
        assert [m.text for m in q.dequeue(1)] == ["a"]
        assert q.enqueue("e") == 4  # the position claimed while full is reused: no hole
        with pytest.raises(QueueFullError) as full:
            q.enqueue_many(["f", "g"], timeout=0.1)
        assert full.value.enqueued == []
        assert [(m.id, m.text) for m in q.dequeue(10)] == [(1, "b"), (2, "c"), (3, "d"), (4, "e")]
        assert q.enqueue_many(["f", "g"]) == [5, 6]


def test_empty_ring_pop_waits_up_to_its_timeout_and_keeps_its_claim(mssql_engine, schema):
    with ring(mssql_engine, schema, 4) as q:
        started = time.monotonic()
        assert q.dequeue(3, timeout=0.3) == []
        assert time.monotonic() - started >= 0.3
        q.enqueue("late")
        [m] = q.dequeue(1)
        assert (m.id, m.text) == (0, "late")  # the position it claimed while empty
        q.enqueue_many(["x", "y"])
        assert [m.text for m in q.dequeue(5, timeout=0.2)] == ["x", "y"]


def test_pop_never_reads_a_push_that_has_not_committed(mssql_engine, schema):
    """The push is the client's own statement (sql/mssql/ring.sql: enqueue), sent inside an
    open transaction."""
    push = live.client_sql("ring", "enqueue", "r", schema)
    with ring(mssql_engine, schema, 8) as q, mssql_engine.connect() as pusher:
        pusher.begin()
        assert pusher.execute(push, {"payload": b"uncommitted", "headers": None, "timeout": 1.0}).scalar() == 0
        assert q.dequeue(1, timeout=0.3) == []  # the slot is locked / still shows the old lap
        pusher.commit()
        assert [(m.id, m.text) for m in q.dequeue(1)] == [(0, "uncommitted")]


def _die_holding_a_claim(target, schema: str) -> None:
    ctx = live.spawn()
    ready = ctx.Event()
    process = ctx.Process(target=target, args=(live.MSSQL_URL, schema, "r", ready))
    process.start()
    process.join(timeout=60)
    assert ready.is_set() and process.exitcode == -9


def test_crashed_poppers_message_is_recovered_by_ring_repair(mssql_engine, schema):
    install_queue(mssql_engine, "r", "ring", RingSettings(size=8), schema=schema)
    _die_holding_a_claim(live.pop_then_die, schema)
    with RingQueue(mssql_engine, "r", schema=schema) as producer, RingQueue(mssql_engine, "r", schema=schema) as consumer:
        assert producer.enqueue("orphan") == 0
        assert consumer.dequeue(1, timeout=0.3) == []  # it claimed position 1: 0 is nobody's
        assert slots(mssql_engine, schema)[0] == (0, 0, 1)  # still FULL at position 0
        assert repair_ring(mssql_engine, "r", schema=schema, grace=3600).rescued == []  # within the grace
        result = repair_ring(mssql_engine, "r", schema=schema, grace=0)
        assert (result.rescued, result.tombstoned, result.deferred) == ([(0, 1)], [], [])
        [m] = consumer.dequeue(1, timeout=1)
        assert (m.id, m.text) == (1, "orphan")  # delivered once, under its new position
        assert slots(mssql_engine, schema)[0] == (0, 0, 3)  # RESCUED, free for the next lap
        assert consumer.dequeue(1, timeout=0.1) == [] and producer.counts()["ready"] == 0


def test_crashed_pushers_hole_is_tombstoned_by_ring_repair(mssql_engine, schema):
    install_queue(mssql_engine, "r", "ring", RingSettings(size=2), schema=schema)
    with RingQueue(mssql_engine, "r", schema=schema) as producer:
        producer.enqueue_many(["a", "b"])
    _die_holding_a_claim(live.push_then_die, schema)
    with RingQueue(mssql_engine, "r", schema=schema) as producer, RingQueue(mssql_engine, "r", schema=schema) as consumer:
        assert [m.text for m in consumer.dequeue(2)] == ["a", "b"]
        assert producer.enqueue("c") == 3  # position 2 belongs to the dead pusher
        assert consumer.dequeue(1, timeout=0.3) == []  # pop 2 waits for a push that never comes
        with pytest.raises(QueueFullError):
            producer.enqueue("d", timeout=0.3)  # position 4 -> slot 0, which never saw position 2
        result = repair_ring(mssql_engine, "r", schema=schema, grace=0)
        assert result.tombstoned == [4] and result.rescued == []
        assert slots(mssql_engine, schema) == [(0, 4, 2), (1, 3, 1)]
        assert [(m.id, m.text) for m in consumer.dequeue(5)] == [(3, "c")]  # pops skip 2 and 4
        assert producer.enqueue("d", timeout=0.3) == 5
        assert [(m.id, m.text) for m in consumer.dequeue(5)] == [(5, "d")]


def test_message_pushed_after_a_closing_consumers_last_pop_is_rescued_by_its_release(mssql_engine, schema):
    """Consumer A pops on an empty ring and keeps its claim (position 0), producer B's push of
    0 commits, then A closes: A's release re-pushes the message at once, under a new id."""
    consumer_a = ring(mssql_engine, schema, 4)
    with RingQueue(mssql_engine, "r", schema=schema) as producer_b, \
            RingQueue(mssql_engine, "r", schema=schema) as consumer_c:
        assert consumer_a.dequeue(1) == []  # claims position 0 and keeps it
        assert producer_b.enqueue("late", headers={"trace": "t-1"}) == 0  # committed (autocommit)
        consumer_a.close()
        assert consumer_a.released == [ReleasedClaim("pop", 0, False, 1, "rescued")]
        assert slots(mssql_engine, schema)[:2] == [(0, 0, 3), (1, 1, 1)]  # old slot RESCUED, the message at 1
        [m] = consumer_c.dequeue(5)
        assert (m.id, m.text, m.headers) == (1, "late", {"trace": "t-1"})  # same payload and headers
        assert consumer_c.dequeue(5, timeout=0.2) == []  # exactly once
        repair = repair_ring(mssql_engine, "r", schema=schema, grace=0)
        assert (repair.tombstoned, repair.rescued, repair.deferred) == ([], [], [])  # nothing left to repair
        assert producer_b.counts()["ready"] == 0


# -- the watermark ------------------------------------------------------------------------------


def test_correct_watermark_fixes_a_watermark_set_too_high_and_too_low(mssql_engine, schema):
    install(mssql_engine, "wm", "watermark", schema)
    fresh = live.fresh_engine()  # the working watermark lives in the session: new sessions per client
    try:
        with open_queue(mssql_engine, "wm", schema=schema) as q:
            ids = q.enqueue_many([f"m{i}" for i in range(10)])
            assert [m.id for m in q.dequeue(3)] == ids[:3]

        set_stored_low(mssql_engine, schema, "wm", ids[7])  # too high: items 4..7 are unreachable
        with open_queue(fresh, "wm", schema=schema) as q:
            assert [m.id for m in q.dequeue(1)] == [ids[7]]  # starts at the stored hint
        fixed = correct_watermark(mssql_engine, "wm", schema=schema)
        assert (fixed.old_low, fixed.new_low, fixed.true_low, fixed.changed) == (ids[7], ids[3], ids[3], True)
        assert fixed.reason.startswith("lowered")
        with open_queue(fresh, "wm", schema=schema) as q:
            assert [m.id for m in q.dequeue(10)] == ids[3:7] + ids[8:]

        with open_queue(mssql_engine, "wm", schema=schema) as q:
            more = q.enqueue_many([f"n{i}" for i in range(5)])
            assert [m.id for m in q.dequeue(2)] == more[:2]
        set_stored_low(mssql_engine, schema, "wm", 1)  # too low: dequeues would walk old ghosts again
        fixed = correct_watermark(mssql_engine, "wm", schema=schema)
        assert (fixed.old_low, fixed.new_low, fixed.changed) == (1, more[2], True)
        assert fixed.reason.startswith("raised")
        again = correct_watermark(mssql_engine, "wm", schema=schema)
        assert (again.old_low, again.new_low, again.changed) == (more[2], more[2], False)
        with open_queue(mssql_engine, "wm", schema=schema) as q:
            assert q.stored_watermark()["low"] == more[2]
    finally:
        fresh.dispose()


def test_a_running_watermark_session_adopts_a_correction_at_its_next_move(mssql_engine, schema):
    install(mssql_engine, "wm", "watermark", schema)
    with open_queue(mssql_engine, "wm", schema=schema) as q:
        ids = q.enqueue_many([f"m{i}" for i in range(5)])
    set_stored_low(mssql_engine, schema, "wm", ids[-1] + 100)  # a wrong hint, far above every item
    fresh = live.fresh_engine()
    try:
        with open_queue(fresh, "wm", schema=schema) as consumer:
            assert consumer.dequeue(5) == []  # the session started from the wrong hint
            correct_watermark(mssql_engine, "wm", schema=schema)
            got = []
            for _ in range(101):  # the session re-reads the stored row every 100th call
                got += consumer.dequeue(5)
            assert [m.id for m in got] == ids
    finally:
        fresh.dispose()


# -- many processes -----------------------------------------------------------------------------

PRODUCERS = 4
CONSUMERS = 4
PER_PRODUCER = 1_000
DEADLINE_S = 150.0
CONCURRENT = [("heap", {}), ("fifo", {}), ("fifo", {"strict": True}), ("stack", {}), ("pending", {}),
              ("watermark", {}), ("ring", {"size": 512})]  # the ring: eight laps, full and empty waits


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "options"), CONCURRENT,
                         ids=[k + ("-strict" if o.get("strict") else "") for k, o in CONCURRENT])
def test_four_producers_four_consumers_each_item_exactly_once(mssql_engine, schema, kind, options):
    install(mssql_engine, "c", kind, schema, **options)
    ctx = live.spawn()
    results, done = ctx.Queue(), ctx.Value("q", 0)
    expected = PRODUCERS * PER_PRODUCER
    consumers = [ctx.Process(target=live.consume, args=(live.MSSQL_URL, schema, "c", results, done, expected, 50,
                                                         DEADLINE_S)) for _ in range(CONSUMERS)]
    producers = [ctx.Process(target=live.produce, args=(live.MSSQL_URL, schema, "c", i, PER_PRODUCER, 100, 1.0))
                 for i in range(PRODUCERS)]
    for p in consumers + producers:
        p.start()
    got = []
    try:
        for _ in range(CONSUMERS):  # read before joining (see the multiprocessing docs)
            got.extend(results.get(timeout=DEADLINE_S + 30))
    except queue_module.Empty:
        pytest.fail("a consumer did not report within the deadline")
    finally:
        for p in consumers + producers:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in consumers + producers] == [0] * (CONSUMERS + PRODUCERS)
    want = Counter(f"p{i}-{n}".encode() for i in range(PRODUCERS) for n in range(PER_PRODUCER))
    assert Counter(payload for _id, payload, _due, _at in got) == want
    ids = [item_id for item_id, *_ in got]
    assert len(set(ids)) == len(ids) == expected
    with open_queue(mssql_engine, "c", schema=schema) as q:
        assert q.counts().get("ready", 0) == 0 and q.counts().get("scheduled", 0) == 0  # nothing left behind
    if kind == "pending":
        # nothing came out before its due time (server-computed due_at, client clock after receipt)
        assert [(due, at) for _i, _p, due, at in got if at < due - timedelta(milliseconds=5)] == []
