"""Compaction (queuectl.jobs.compact): a ring's and the DELETE-drained kinds' tables keep a
bounded size while the xmin horizon is pinned, and nothing is lost, repeated or reordered
while it runs beside pushers and poppers; a session holding a lock on the tables is named and
nobody waits behind it; the backlog limit; what a REPEATABLE READ transaction older than a
compaction sees."""

from __future__ import annotations

import threading
import time
from collections import Counter
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from jobs_helpers import scalar, wait_until
from queuectl.client import FifoQueue, QueueFullError, RingQueue
from queuectl.install import install_queue
from queuectl.jobs import compact
from queuectl.jobs.registry import JOBS
from queuectl.jobs.runner import run_job
from queuectl.kindspec import FifoSettings, RingSettings, NoSettings

FORCE = compact.CompactConfig(force=True)
SMALL = compact.CompactConfig(min_bytes=64 * 1024)  # due at 64 kB and dead > live: tests' small tables
PATIENT = compact.CompactConfig(force=True, lock_timeout=0.2, tries=10)


@contextmanager
def pinned(engine):
    """A REPEATABLE READ snapshot held open on an unrelated table: no dead version made while
    it lasts may be pruned or vacuumed."""
    with engine.connect() as setup:
        setup.execute(sa.text("CREATE TABLE IF NOT EXISTS public.unrelated (x int)"))
        setup.commit()
    conn = engine.connect()
    try:
        conn.execute(sa.text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        conn.execute(sa.text("SELECT count(*) FROM public.unrelated")).scalar()
        yield conn
    finally:
        conn.rollback()
        conn.close()


def table_bytes(engine, *tables: str) -> int:
    return sum(scalar(engine, f"SELECT pg_table_size('queuectl.\"{t}\"')") for t in tables)


class Compactor(threading.Thread):
    """run_once, forced, every `pause` seconds until stopped; counts its compactions. It tries
    for its lock longer and more often than the job (the workers' calls hold the tables' locks
    back to back, and a fan-out claim may hold one table while it waits for the next): each pass
    compacts, which is what these tests need."""

    def __init__(self, engine, queue: str, pause: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.engine, self.queue, self.pause = engine, queue, pause
        self.stop = threading.Event()
        self.compactions = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.compactions += compact.run_once(self.engine, self.queue, PATIENT, schema="queuectl").compactions
                time.sleep(self.pause)
        except BaseException as exc:
            self.error = exc


def await_compaction(compactor: "Compactor", timeout: float = 10.0) -> None:
    """Wait for the compactor's next compaction, so that compactions fall between a worker's
    calls whatever the machine's pace (beside fan-out consumers this holds because the job
    locks the tables in their calls' order: test_a_fanout_consumer_mid_call_waits_for_no_compaction_that_waits_for_it)."""
    seen = compactor.compactions
    deadline = time.monotonic() + timeout
    while compactor.compactions == seen and time.monotonic() < deadline:
        time.sleep(0.01)


def run_threads(*targets) -> None:
    errors: list[BaseException] = []

    def wrap(fn):
        def go():
            try:
                fn()
            except BaseException as exc:  # reported below
                errors.append(exc)
        return go

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


# -- a ring ----------------------------------------------------------------------------------


def test_ring_pushers_and_poppers_beside_repeated_compactions_get_every_message_once_in_order(engine):
    install_queue(engine, "r", "ring", RingSettings(size=64))
    per_producer, producers, consumers = 600, 2, 2
    got: list[list[tuple[int, str]]] = [[] for _ in range(consumers)]
    done = threading.Event()

    def push(p: int):
        with RingQueue(engine, "r") as q:
            for start in range(0, per_producer, 10):
                if p == 0 and start % 100 == 0:
                    await_compaction(compactor)
                batch = [f"p{p}-{i}" for i in range(start, start + 10)]
                while batch:
                    try:
                        q.enqueue_many(batch, timeout=5)
                        batch = []
                    except QueueFullError as exc:
                        batch = batch[len(exc.enqueued):]

    def pop(c: int):
        with RingQueue(engine, "r") as q:
            while True:
                items = q.dequeue(7, timeout=0.05)
                got[c] += [(m.id, m.text) for m in items]
                if not items and done.is_set():
                    return

    compactor = Compactor(engine, "r")
    with pinned(engine):
        compactor.start()
        pushers = [threading.Thread(target=push, args=(p,)) for p in range(producers)]
        poppers = [threading.Thread(target=pop, args=(c,)) for c in range(consumers)]
        for t in pushers + poppers:
            t.start()
        for t in pushers:
            t.join(120)
        time.sleep(0.5)
        done.set()
        for t in poppers:
            t.join(120)
        compactor.stop.set()
        compactor.join()
    assert compactor.error is None
    assert compactor.compactions >= 5
    texts = Counter(text for c in got for _, text in c)
    assert texts == Counter(f"p{p}-{i}" for p in range(producers) for i in range(per_producer))  # each once
    by_position = [text for _, text in sorted(x for c in got for x in c)]
    for p in range(producers):  # each producer's messages in the order it pushed them
        mine = [int(t.split("-")[1]) for t in by_position if t.startswith(f"p{p}-")]
        assert mine == sorted(mine)


def test_ring_size_stays_bounded_over_many_laps_with_the_horizon_pinned_and_grows_without(engine):
    install_queue(engine, "r", "ring", RingSettings(size=128))
    install_queue(engine, "c", "ring", RingSettings(size=128))  # the control: never compacted
    payload = b"x" * 300
    sizes, control = [], []
    with RingQueue(engine, "r") as q, RingQueue(engine, "c") as qc, pinned(engine):
        for lap in range(120):
            for ring in (q, qc):
                ring.enqueue_many([payload] * 100)
                assert len(ring.dequeue(100)) == 100
            if lap % 10 == 9:
                time.sleep(1.1)  # the statistics reach the collector at most once a second
                compact.run_once(engine, "r", SMALL, schema="queuectl")
                sizes.append(table_bytes(engine, "r_ring"))
                control.append(table_bytes(engine, "c_ring"))
    assert max(sizes[3:]) < 600 * 1024, sizes
    assert control[-1] > 4 * 1024 * 1024 and control == sorted(control), control  # linear growth
    assert control[-1] > 6 * max(sizes), (sizes, control)


def test_ring_compaction_keeps_positions_states_large_messages_sequences_and_kept_claims(engine):
    install_queue(engine, "r", "ring", RingSettings(size=8, slot_bytes=100))
    with RingQueue(engine, "r") as q, RingQueue(engine, "r") as waiting:
        q.enqueue_many([b"a", b"b" * 500, b"c"])  # the second goes to the side table
        assert [m.payload for m in q.dequeue(1)] == [b"a"]
        before = scalar(engine, 'SELECT array_agg(row(slot, msg_id, state, payload, large_id) ORDER BY slot) '
                                'FROM queuectl."r_ring"')
        options = scalar(engine, "SELECT reloptions FROM pg_class WHERE oid = 'queuectl.\"r_ring\"'::regclass")
        assert compact.run_once(engine, "r", FORCE, schema="queuectl").compactions == 1
        after = scalar(engine, 'SELECT array_agg(row(slot, msg_id, state, payload, large_id) ORDER BY slot) '
                               'FROM queuectl."r_ring"')
        assert after == before
        assert scalar(engine, "SELECT reloptions FROM pg_class WHERE oid = 'queuectl.\"r_ring\"'::regclass") == options
        assert [m.payload for m in q.dequeue(10)] == [b"b" * 500, b"c"]  # the large one from the side table
        assert waiting.dequeue(1) == []  # a pop claim (position 3) kept by a session that found nothing
        assert compact.run_once(engine, "r", FORCE, schema="queuectl").compactions == 1
        assert q.enqueue(b"d") == 3
        assert [m.payload for m in waiting.dequeue(1)] == [b"d"] and q.dequeue(10) == []
        assert scalar(engine, 'SELECT count(*) FROM queuectl."r_ring_large"') == 0
        q.enqueue(b"e" * 500)  # the side table's identity goes on from where it was
        assert scalar(engine, 'SELECT min(id) FROM queuectl."r_ring_large"') >= 2


def test_fanout_subscriptions_beside_repeated_compactions_get_every_message_once_each_in_order(engine):
    install_queue(engine, "f", "ring", RingSettings(size=64, fanout=True))
    total = 600
    with RingQueue(engine, "f") as admin:
        admin.subscribe("a")
        admin.subscribe("b")
    got = {"a": [], "b": []}
    finished = threading.Event()

    def produce():
        with RingQueue(engine, "f") as q:
            for start in range(0, total, 5):
                if start % 100 == 0:
                    await_compaction(compactor)
                batch = [f"m{i}" for i in range(start, start + 5)]
                while batch:
                    try:
                        q.enqueue_many(batch, timeout=0.1)  # a publish waiting for room holds its locks
                        batch = []
                    except QueueFullError as exc:
                        batch = batch[len(exc.enqueued):]
        finished.set()

    def consume(name: str):
        with RingQueue(engine, "f") as q:
            sub = q.subscription(name)
            while True:
                items = sub.dequeue(6, timeout=0.05)
                got[name] += [m.text for m in items]
                sub.ack(items)
                if not items and finished.is_set() and len(got[name]) >= total:
                    return

    compactor = Compactor(engine, "f")
    with pinned(engine):
        compactor.start()
        run_threads(produce, lambda: consume("a"), lambda: consume("b"))
        compactor.stop.set()
        compactor.join()
    assert compactor.error is None and compactor.compactions >= 5
    assert got["a"] == got["b"] == [f"m{i}" for i in range(total)]
    guard = scalar(engine, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'queuectl.\"f_ring\"'::regclass "
                           "AND tgname = 'fanout_guard'")
    assert guard == 1


# -- the one-table kinds ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "watermark"])
def test_one_table_producers_and_consumers_beside_repeated_compactions_get_every_item_once(engine, kind):
    install_queue(engine, "q", kind, FifoSettings() if kind == "fifo" else NoSettings())
    per_producer, producers, consumers = 800, 2, 2
    got: list[list[tuple[int, str]]] = [[] for _ in range(consumers)]
    finished = threading.Event()

    def produce(p: int):
        client = FifoQueue if kind == "fifo" else __import__("queuectl.client", fromlist=["CLIENTS"]).CLIENTS[kind]
        with client(engine, "q") as q:
            for start in range(0, per_producer, 10):
                if p == 0 and start % 100 == 0:
                    await_compaction(compactor)
                q.enqueue_many([f"p{p}-{i}" for i in range(start, start + 10)])

    def consume(c: int):
        client = __import__("queuectl.client", fromlist=["CLIENTS"]).CLIENTS[kind]
        with client(engine, "q") as q:
            while True:
                items = q.dequeue(7)
                got[c] += [(m.id, m.text) for m in items]
                if not items:
                    if finished.is_set():
                        return
                    time.sleep(0.005)

    compactor = Compactor(engine, "q")
    with pinned(engine):
        compactor.start()
        producers_done = threading.Thread(target=lambda: (run_threads(*[lambda p=p: produce(p) for p in range(producers)]),
                                                          time.sleep(0.3), finished.set()))
        producers_done.start()
        run_threads(*[lambda c=c: consume(c) for c in range(consumers)])
        producers_done.join()
        compactor.stop.set()
        compactor.join()
    assert compactor.error is None and compactor.compactions >= 5
    texts = Counter(text for c in got for _, text in c)
    assert texts == Counter(f"p{p}-{i}" for p in range(producers) for i in range(per_producer))
    # Each producer enqueues in turn, so its ids rise in commit order and a consumer takes them
    # oldest first, through any compaction. Across producers ids are drawn before their commits,
    # which may come in another order: a consumer may take a later id of one producer before an
    # earlier, not yet committed id of the other, with or without compaction.
    for c in got:
        for p in range(producers):
            mine = [(i, int(text.split("-")[1])) for i, text in c if text.startswith(f"p{p}-")]
            assert [i for i, _ in mine] == sorted(i for i, _ in mine)
            assert [n for _, n in mine] == sorted(n for _, n in mine)


def test_fifo_size_stays_bounded_with_the_horizon_pinned_and_grows_without(engine):
    install_queue(engine, "q", "fifo")
    install_queue(engine, "c", "fifo")
    payload = b"y" * 300
    sizes, control = [], []
    with FifoQueue(engine, "q") as q, FifoQueue(engine, "c") as qc, pinned(engine):
        for lap in range(100):
            for fifo in (q, qc):
                fifo.enqueue_many([payload] * 100)
                assert len(fifo.dequeue(100)) == 100
            if lap % 10 == 9:
                time.sleep(1.1)
                compact.run_once(engine, "q", SMALL, schema="queuectl")
                sizes.append(table_bytes(engine, "q_items"))
                control.append(table_bytes(engine, "c_items"))
    assert max(sizes) < 600 * 1024, sizes
    assert control[-1] > 3 * 1024 * 1024 and control[-1] > 6 * max(sizes), (sizes, control)


def test_a_backlog_over_max_rows_is_left_alone_and_compacted_once_allowed(engine):
    install_queue(engine, "q", "fifo")
    with FifoQueue(engine, "q") as q:
        q.enqueue_many([b"z" * 100] * 300)
        small = compact.run_once(engine, "q", compact.CompactConfig(force=True, max_rows=100), schema="queuectl")
        assert small.compactions == 0 and "100" in (small.skipped or "")
        assert scalar(engine, 'SELECT count(*) FROM queuectl."q_items"') == 300
        done = compact.run_once(engine, "q", compact.CompactConfig(force=True, max_rows=300), schema="queuectl")
        assert done.compactions == 1 and done.rows == 300
        assert [m.payload for m in q.dequeue(300)] == [b"z" * 100] * 300


def test_the_statistics_estimate_over_max_rows_skips_before_any_lock(engine):
    install_queue(engine, "q", "fifo")
    with FifoQueue(engine, "q") as q:
        q.enqueue_many([b"z"] * 300)
    with engine.connect() as conn:
        conn.execute(sa.text('ANALYZE queuectl."q_items"'))
        conn.commit()
    result = compact.run_once(engine, "q", compact.CompactConfig(force=True, max_rows=100), schema="queuectl")
    assert result.compactions == 0 and result.waits == 0 and "max-rows" in result.skipped


# -- a holder, and nobody waits ---------------------------------------------------------------


def test_a_reader_holding_access_share_is_named_and_pushes_do_not_wait(engine):
    install_queue(engine, "r", "ring", RingSettings(size=16))
    reader = engine.connect()
    try:
        reader.execute(sa.text('SELECT count(*) FROM queuectl."r_ring"')).scalar()  # ACCESS SHARE, kept
        pid = reader.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        timings: list[float] = []
        stop = threading.Event()

        def push_pop():
            with RingQueue(engine, "r") as q:
                while not stop.is_set():
                    t0 = time.monotonic()
                    q.enqueue(b"m")
                    q.dequeue(1)
                    timings.append(time.monotonic() - t0)

        worker = threading.Thread(target=push_pop, daemon=True)
        worker.start()
        result = compact.run_once(engine, "r", FORCE, schema="queuectl")
        stop.set()
        worker.join(30)
        assert result.compactions == 0 and result.waits == compact.DEFAULT_TRIES
        assert f"pid {pid} " in result.blocked and "AccessShareLock" in result.blocked
        assert "in its transaction for" in result.blocked
        # each attempt stalls them for its lock_timeout at most (50 ms), never until the reader ends
        assert timings and max(timings) < 0.5, max(timings)
    finally:
        reader.rollback()
        reader.close()
    assert compact.run_once(engine, "r", FORCE, schema="queuectl").compactions == 1  # once it is gone


def test_a_fanout_consumer_mid_call_waits_for_no_compaction_that_waits_for_it(engine):
    """A fan-out consumer's call reads the subscriptions first and the ring after (sub_take).
    The compaction locks the tables in that order: while a consumer holds the subscriptions,
    the compaction waits for them without holding the ring, so the consumer's next read goes
    through, its call ends, and the compaction follows. (Locking the ring first, it held the
    ring while waiting for the subscriptions and the consumer waited for the ring: each
    stalled the other until the compaction's lock_timeout, and beside back-to-back calls a
    compaction could miss its locks for seconds on end.)"""
    install_queue(engine, "f", "ring", RingSettings(size=16, fanout=True))
    with RingQueue(engine, "f") as q:
        q.subscribe("a")
        q.enqueue_many(["m0", "m1"])
    consumer = engine.connect()
    outcome: dict[str, object] = {}
    try:
        consumer.execute(sa.text('SELECT count(*) FROM queuectl."f_subs"')).scalar()  # a call's first read
        pid = consumer.execute(sa.text("SELECT pg_backend_pid()")).scalar()

        def run():
            try:
                outcome["result"] = compact.run_once(engine, "f", compact.CompactConfig(force=True, lock_timeout=5.0,
                                                                                         tries=1), schema="queuectl")
            except Exception as exc:  # locking the ring first: a deadlock, one side aborted after deadlock_timeout
                outcome["error"] = exc

        compactor = threading.Thread(target=run, daemon=True)
        compactor.start()
        # the compaction is queued on a lock the consumer holds
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM pg_locks l JOIN pg_locks h ON h.relation = l.relation "
                                          "AND h.granted AND h.pid = :pid WHERE NOT l.granted AND l.pid <> :pid",
                                  pid=pid) > 0, timeout=10, interval=0.02)
        consumer.execute(sa.text("SET LOCAL lock_timeout = '2s'"))
        t0 = time.monotonic()
        consumer.execute(sa.text('SELECT count(*) FROM queuectl."f_ring"')).scalar()  # the call's next read
        waited = time.monotonic() - t0
        consumer.commit()
        compactor.join(30)
        assert "error" not in outcome, outcome["error"]
        assert waited < 1.0, waited
        result = outcome["result"]
        assert result.compactions == 1 and result.waits == 0, result
    finally:
        consumer.close()
    with RingQueue(engine, "f") as q:
        assert [m.text for m in q.subscription("a").dequeue(5)] == ["m0", "m1"]


def test_health_names_the_session_keeping_a_due_compaction_waiting(engine, monkeypatch):
    from queuectl import health
    from queuectl.health import HealthOptions, health_report

    install_queue(engine, "r", "ring", RingSettings(size=16))
    reader = engine.connect()
    try:
        reader.execute(sa.text('SELECT count(*) FROM queuectl."r_ring"')).scalar()
        pid = reader.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        monkeypatch.setattr(health, "ROTATION_BLOCKER_AGE_S", 0.0)
        monkeypatch.setattr(compact.CompactConfig, "is_due", lambda self, size, live, dead: True)
        rep = health_report(engine, None, schema="queuectl", options=HealthOptions())
        [check] = [c for c in rep.checks if c.id == "queue.compaction"]
        assert check.status == "WARNING" and f"pid {pid} " in check.advice, check
        assert "cannot be compacted" in check.advice and "pg_dump --exclude-table-data" in check.advice
    finally:
        reader.rollback()
        reader.close()
    rep = health_report(engine, None, schema="queuectl", options=HealthOptions())
    assert not [c for c in rep.checks if c.id == "queue.compaction"]  # nobody blocks it now


# -- isolation ----------------------------------------------------------------------------------


def repeatable_read(engine):
    conn = engine.connect()
    conn.execute(sa.text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
    conn.execute(sa.text("SELECT 1 FROM pg_class LIMIT 1")).scalar()  # the snapshot, before the compaction
    return conn


def test_fifo_dequeue_in_a_repeatable_read_transaction_older_than_a_compaction_loses_nothing(engine):
    install_queue(engine, "q", "fifo")
    with FifoQueue(engine, "q") as q:
        q.enqueue_many([f"m{i}" for i in range(5)])
    old = repeatable_read(engine)
    try:
        assert compact.run_once(engine, "q", FORCE, schema="queuectl").compactions == 1
        seen = old.execute(sa.text('SELECT count(*) FROM queuectl."q_items"')).scalar()
        taken = old.execute(sa.text('SELECT * FROM queuectl."q_dequeue"(10)')).all()
        old.commit()
        assert seen == 0 and taken == []  # the table looks empty to it, and it takes nothing
    finally:
        old.close()
    with FifoQueue(engine, "q") as q:
        assert [m.text for m in q.dequeue(10)] == [f"m{i}" for i in range(5)]


def test_ring_calls_in_a_repeatable_read_transaction_older_than_a_compaction_lose_no_message(engine):
    """At ring_0007 the ring's calls do not refuse REPEATABLE READ (ring_0008 refuses it:
    tests/test_isolation_refusal.py): a pop older than a compaction sees no slot and gives up its claims, whose messages then
    wait for ring_repair, which delivers each once under a new id; a push sees no free slot
    and keeps its claim. The client runs its calls at READ COMMITTED."""
    install_queue(engine, "r", "ring", RingSettings(size=4), revision="ring_0007")
    with RingQueue(engine, "r") as q:
        q.enqueue_many([b"a", b"b"])
    old = repeatable_read(engine)
    try:
        assert compact.run_once(engine, "r", FORCE, schema="queuectl").compactions == 1
        assert old.execute(sa.text('SELECT * FROM queuectl."r_dequeue"(2, 0)')).all() == []
        old.commit()
        assert old.execute(sa.text('SELECT * FROM queuectl."r_dequeue"(2, 0)')).all() == []  # claims given up
        old.commit()
        old.execute(sa.text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        old.execute(sa.text("SELECT 1 FROM pg_class LIMIT 1")).scalar()
        assert compact.run_once(engine, "r", FORCE, schema="queuectl").compactions == 1
        pushed = old.execute(sa.text("SELECT queuectl.\"r_enqueue\"('\\x63'::bytea, NULL, 0.1)")).scalar()
        old.commit()
        assert pushed is None  # no slot is visible to it: refused as full, its claim kept
        pushed = old.execute(sa.text("SELECT queuectl.\"r_enqueue\"('\\x63'::bytea, NULL, 0.1)")).scalar()
        old.commit()
        assert pushed == 2  # the kept claim, written now
    finally:
        old.close()
    with RingQueue(engine, "r") as q:
        assert q.dequeue(10) == []  # c's position is the old session's pop claim, which ended unreleased
        assert len(q.repair(grace=0).rescued) == 3
        assert sorted(m.payload for m in q.dequeue(10)) == [b"a", b"b", b"c"]
        assert q.dequeue(10) == []


# -- the job's surface ------------------------------------------------------------------------------


def test_the_job_is_planned_every_15_seconds_on_postgresql_and_dry_run_changes_nothing(engine):
    spec = JOBS["compact"]
    assert spec.interval == 15.0 and spec.lock_name == "compact" and spec.engines == ("postgresql",)
    install_queue(engine, "q", "fifo")
    with FifoQueue(engine, "q") as q:
        q.enqueue_many([b"a"] * 10)
        q.dequeue(10)
    file_before = scalar(engine, "SELECT pg_relation_filenode('queuectl.\"q_items\"')")
    record = run_job(engine, "compact", "q", compact.CompactConfig(dry_run=True, force=True), schema="queuectl")
    assert record.outcome == "succeeded" and record.result.due and record.result.compactions == 0
    assert scalar(engine, "SELECT pg_relation_filenode('queuectl.\"q_items\"')") == file_before
    record = run_job(engine, "compact", "q", FORCE, schema="queuectl")
    assert record.result.compactions == 1
    assert scalar(engine, "SELECT pg_relation_filenode('queuectl.\"q_items\"')") != file_before
