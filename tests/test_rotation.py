"""The reliable queue's generations (reliable_0012): rotation keeps every item exactly once,
frees space while the xmin horizon is pinned, says who blocks it, and the layout migrates
both ways with every row."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from queuectl import health
from queuectl.catalog import QueueSettings
from queuectl.client import Queue
from queuectl.engine import adapter_for
from queuectl.health import HealthOptions, health_report
from queuectl.install import downgrade_queue, head_of, install_queue, upgrade_queue
from queuectl.jobs.archive import LAZY_SEAL_ROWS, ArchiveConfig, Rotator
from queuectl.jobs.base import JobTarget
from queuectl.metrics import families
from queuectl.sqlfiles import render

SLOTS = ("meta0", "meta1", "meta2", "data0", "data1", "data2")


def rotator(engine: sa.Engine, name: str = "orders", items: int = 40) -> Rotator:
    target = JobTarget.resolve(engine, name, "queuectl", ("reliable",))
    return Rotator(engine, target, ArchiveConfig(rotate_items=items))


def state(engine: sa.Engine, queue: Queue) -> sa.Row:
    with engine.connect() as conn:
        return conn.execute(sa.text(f"SELECT * FROM {queue.names.qualified('rot_state')}()")).one()


def ledger(engine: sa.Engine, queue: Queue) -> dict[str, object]:
    """Every id in meta or history, with its status and payload: an id twice is a duplicate,
    a missing one is lost."""
    m, d, h = (queue.names.qualified(t) for t in ("meta", "data", "history"))
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            f"SELECT m.id, m.status, d.payload FROM {m} m LEFT JOIN {d} d ON d.id = m.id "
            f"UNION ALL SELECT id, status, payload FROM {h}")).all()
    return {"count": Counter(r.id for r in rows), "status": {r.id: r.status for r in rows},
            "payload": {r.id: bytes(r.payload) if r.payload is not None else None for r in rows}}


def slot_bytes(engine: sa.Engine, queue: Queue) -> int:
    with engine.connect() as conn:
        return sum(conn.execute(sa.text("SELECT pg_total_relation_size(CAST(:t AS regclass))"),
                                {"t": queue.names.qualified(t)}).scalar() for t in SLOTS)


class Pin:
    """A REPEATABLE READ snapshot held on an unrelated table: the xmin horizon stays put."""

    def __init__(self, engine: sa.Engine) -> None:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE IF NOT EXISTS bystander (id int)"))
        self.conn = engine.connect().execution_options(isolation_level="REPEATABLE READ")
        self.conn.execute(sa.text("SELECT count(*) FROM bystander"))
        self.pid = self.conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        self.xmin = self.held_xmin(engine)

    def held_xmin(self, engine: sa.Engine) -> str:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT backend_xmin::text FROM pg_stat_activity WHERE pid = :p"),
                                {"p": self.pid}).scalar()

    def close(self) -> None:
        self.conn.rollback()
        self.conn.close()


class RotationRun:
    """The concurrency harness of the rotation tests: producers and workers (the test's own
    bodies, each wrapped by `guarded`), two rotators at once (as a scheduler and a person
    running the archive job would), the horizon pinned throughout. `sent` maps every id a
    producer enqueued to its payload, `acked` counts each id's acks; `finish` checks the
    ledger: every item sent completed exactly once, none lost, payloads intact."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.sent: dict[int, bytes] = {}
        self.acked: Counter[int] = Counter()  # only ids whose ack counted (a Counter keeps a key added with 0)
        self.stop_producing, self.stop_all = threading.Event(), threading.Event()
        self.errors: list[BaseException] = []
        self.emptied = 0

    def guarded(self, fn):
        """fn's failure is the run's: recorded, and every thread told to stop."""
        def run(*args):
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)
                self.stop_all.set()
        return run

    def run(self, produce, work, *, producers: int, workers: int, rotate_items: int, rotate_every: float,
            seconds: float, drain_s: float) -> None:
        """Producers for `seconds`, then workers until every item sent is acked (at most
        `drain_s`); the rotators switch every `rotate_items` ids, `rotate_every` apart."""
        pin = Pin(self.engine)

        @self.guarded
        def rotate() -> None:
            rot = rotator(self.engine, items=rotate_items)
            while not self.stop_all.is_set():
                self.emptied += rot.rotate().emptied
                time.sleep(rotate_every)

        threads = ([threading.Thread(target=self.guarded(produce), args=(n,)) for n in range(producers)]
                   + [threading.Thread(target=self.guarded(work), args=(n,)) for n in range(workers)]
                   + [threading.Thread(target=rotate) for _ in range(2)])
        for t in threads:
            t.start()
        time.sleep(seconds)
        self.stop_producing.set()
        deadline = time.monotonic() + drain_s
        while not self.errors and time.monotonic() < deadline:
            if len(self.acked) >= len(self.sent):  # every item sent has been acked (dropped ones come back)
                break
            time.sleep(0.2)
        self.stop_all.set()
        for t in threads:
            t.join(30)
        assert not self.errors, self.errors
        assert pin.held_xmin(self.engine) == pin.xmin  # the horizon stayed pinned throughout
        pin.close()

    def finish(self, queue: Queue, explain=lambda left: left) -> None:
        """Every item sent is in meta or history exactly once, DONE, acked once, its payload
        intact, and the generations did turn over; `explain(left)` is shown for items not DONE."""
        book = ledger(self.engine, queue)
        sent = self.sent
        assert len(sent) > 1000
        assert [i for i in sent if book["count"][i] == 0] == []  # none lost
        assert [i for i, n in book["count"].items() if n > 1] == []  # none twice
        assert set(book["count"]) == set(sent)
        left = sorted(i for i in sent if book["status"][i] != 2)
        assert left == [], explain(left)  # DONE, each once
        assert all(n == 1 for n in self.acked.values()) and set(self.acked) == set(sent)
        assert {i: book["payload"][i] for i in sent} == sent
        assert self.emptied >= 5, self.emptied  # the generations did turn over


@pytest.mark.slow
def test_producers_consumers_and_the_rotator_at_once_lose_nothing_and_complete_nothing_twice(engine, orders):
    """3 producers (priorities, delays), 3 consumers that ack, nack, release or drop (lease
    expiry), two rotators at once (as a scheduler and a person running the archive job
    would) every 20 ms with 40 ids per generation, the horizon pinned."""
    run = RotationRun(engine)
    sent, acked = run.sent, run.acked

    def produce(n: int) -> None:
        rnd = random.Random(n)
        with Queue(engine, "orders") as q:
            i = 0
            while not run.stop_producing.is_set():
                if rnd.random() < 0.3:
                    payloads = [f"p{n}-{i}-{k}".encode() for k in range(rnd.randint(2, 8))]
                    ids = q.enqueue_many(payloads, max_attempts=100)
                    sent.update(zip(ids, payloads))
                else:
                    payload = f"p{n}-{i}".encode()
                    sent[q.enqueue(payload, priority=rnd.randint(0, 2), delay=rnd.choice((0, 0, 0.2)),
                                   max_attempts=100)] = payload
                i += 1
                time.sleep(0.002)

    def consume(n: int) -> None:
        rnd = random.Random(100 + n)
        with Queue(engine, "orders") as q:
            while not run.stop_all.is_set():
                batch = q.dequeue(5, lease=1)
                if not batch:
                    time.sleep(0.01)
                    continue
                for m in batch:
                    assert m.payload == sent.get(m.id, m.payload)
                    roll = rnd.random()
                    if roll < 0.7:
                        if got := q.ack([m]):  # 0: the lease expired and another claim has the item
                            acked[m.id] += got
                    elif roll < 0.8:
                        q.nack([m], error="again", base_delay=0.05)
                    elif roll < 0.9:
                        q.release([m])
                    # else dropped: its lease expires and a claim takes it again

    run.run(produce, consume, producers=3, workers=3, rotate_items=40, rotate_every=0.02, seconds=4, drain_s=60)
    run.finish(orders)


def test_the_ledger_sees_items_a_truncate_without_the_move_would_lose(engine, orders):
    """The control: emptying a generation that still holds leased and ready items without
    moving them forward (what rot_empty does under its lock) loses exactly those items."""
    ids = orders.enqueue_many([b"x"] * 20)
    leased = orders.dequeue(10)
    with engine.begin() as conn:
        conn.execute(sa.text(f"SELECT {orders.names.qualified('rot_switch')}(1)"))
        conn.execute(sa.text(f"TRUNCATE {orders.names.qualified('meta0')}, {orders.names.qualified('data0')}"))
    book = ledger(engine, orders)
    assert sorted(i for i in ids if book["count"][i] == 0) == sorted(ids)
    assert orders.ack(leased) == 0


def test_the_seal_never_waits_on_a_consumer_and_a_row_it_skips_comes_back_one_rotation_later(engine, orders):
    """A consumer holds 3 of the sealed epoch's READY rows in an open claim. The seal moves
    the other 17 without waiting for it: a seal that waited on consumers' rows kept locks on
    rows they then acked, and an ack and the seal deadlocked. The 3 rows, READY again when
    the claim rolls back, stay in the sealed slot until the truncate moves them forward."""
    rot = rotator(engine, items=10)
    ids = orders.enqueue_many([f"m{i}".encode() for i in range(20)])
    with engine.begin() as conn:  # epoch 1 opens; epoch 0 holds 20 READY rows, not sealed yet
        conn.execute(sa.text(f"SELECT {orders.names.qualified('rot_switch')}(10)"))
    st = state(engine, orders)
    assert (st.epoch, st.sealed) == (1, -1)
    holder = engine.connect()
    holder.begin()
    held = holder.execute(sa.text(f"SELECT id FROM {orders.names.qualified('dequeue')}(3)")).scalars().all()
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("SET LOCAL lock_timeout = '2s'"))
            moved = conn.execute(sa.text(f"SELECT {orders.names.qualified('rot_seal')}(50000)")).scalar()
        assert moved == 17
    finally:
        holder.rollback()
        holder.close()
    with engine.begin() as conn:
        conn.execute(sa.text(f"SELECT {orders.names.qualified('rot_mark')}('sealed', 0)"))
    # the claims walk the open epoch only: the 3 rows wait in slot 0 ...
    first = orders.dequeue(20)
    assert sorted(m.id for m in first) == sorted(set(ids) - set(held))
    assert orders.ack(first) == 17
    # ... until the truncate moves them forward
    done = rot.rotate()
    assert done.emptied == 1
    again = orders.dequeue(20)
    assert sorted(m.id for m in again) == sorted(held)
    assert [m.payload for m in again] == [f"m{ids.index(m.id)}".encode() for m in again]
    assert orders.ack(again) == 3


@pytest.mark.parametrize("when", ["with the switch", "at a pass's start"])
def test_a_seal_whose_transaction_fails_after_its_mark_loses_no_row(engine, orders, when):
    """A seal and its mark are one transaction (with the switch that closed the epoch, when
    the pass made one; alone when the pass finds an epoch left unsealed), the mark (a
    sequence: seen by every session at once) just before the commit. Should that transaction
    fail after the mark, the rows the seal moved are READY in the sealed slot again, where no
    claim looks: the truncate of the job's next pass moves them forward."""
    rot = rotator(engine, items=10)
    ids = orders.enqueue_many([f"m{i}".encode() for i in range(12)])
    if when == "at a pass's start":  # another client switched and left the seal to the job
        with engine.begin() as conn:
            conn.execute(sa.text(f"SELECT {orders.names.qualified('rot_switch')}(10)"))
    marks = rot._sql["rot_mark"]
    rot._sql["rot_mark"] = sa.text(  # the mark, then an error (a subquery: not folded when planned)
        f"WITH m AS MATERIALIZED (SELECT {orders.names.qualified('rot_mark')}(:what, :epoch)) "
        "SELECT 1 / (SELECT count(*) - 1 FROM m)")
    with pytest.raises(DBAPIError, match="division by zero"):
        rot.rotate()  # (switched to epoch 1,) sealed 12 rows, marked; then the transaction failed
    st = state(engine, orders)
    assert (st.epoch, st.sealed, st.emptied) == (1, 0, -1)
    assert slot_counts(engine, orders) == {(0, 0): 12}
    assert orders.dequeue(20) == []  # the claims walk the open epoch only
    rot._sql["rot_mark"] = marks
    assert rot.rotate().emptied == 1
    again = orders.dequeue(20)
    assert [m.id for m in again] == ids
    assert [m.payload for m in again] == [f"m{i}".encode() for i in range(12)]
    assert orders.ack(again) == 12


def relation_locks(conn: sa.Connection) -> list[sa.Row]:
    """The relation locks this session's transaction holds (pg_locks' own left out)."""
    return conn.execute(sa.text(
        "SELECT l.relation::regclass::text AS relation, l.mode, l.fastpath FROM pg_locks l "
        "WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND l.relation <> 'pg_locks'::regclass")).all()


def test_a_claim_and_its_ack_take_no_more_relation_locks_than_a_backend_takes_without_the_lock_manager(engine, orders):
    """While the previous generation is sealed, dequeue and ack run on the current slot's
    tables: each locks fewer relations than the 16 a backend takes on its own (the fast
    path, PostgreSQL's FP_LOCK_SLOTS_PER_BACKEND; past them every lock goes through the
    shared lock manager's partition locks). Between a switch and its seal the claim runs
    on the parents and locks every slot: the control."""
    fn = orders.names.qualified
    orders.enqueue_many([b"x"] * 30)
    with engine.begin() as conn:  # epoch 1 opens, epoch 0 not sealed yet
        conn.execute(sa.text(f"SELECT {fn('rot_switch')}(10)"))
    orders.enqueue_many([b"y"] * 30)

    def claim_and_ack() -> tuple[list[sa.Row], list[sa.Row]]:
        with engine.connect() as conn:
            for _ in range(7):  # the calls' plans are made once per session
                ids = conn.execute(sa.text(f"SELECT id FROM {fn('dequeue')}(5)")).scalars().all()
                claim = relation_locks(conn)
                conn.rollback()
            ids = conn.execute(sa.text(f"SELECT id FROM {fn('dequeue')}(5)")).scalars().all()
            conn.commit()
            assert conn.execute(sa.text(f"SELECT {fn('ack')}(CAST(:ids AS bigint[]))"), {"ids": ids}).scalar() == 5
            ack = relation_locks(conn)
            conn.rollback()
        return claim, ack

    claim, _ = claim_and_ack()
    assert len({r.relation for r in claim}) > 16 and not all(r.fastpath for r in claim), claim
    rotator(engine, items=10**7).rotate()  # seals epoch 0 and empties it
    assert (state(engine, orders).sealed, state(engine, orders).emptied) == (0, 0)
    claim, ack = claim_and_ack()
    for locks in (claim, ack):
        assert all(r.fastpath for r in locks) and len({r.relation for r in locks}) <= 16, locks
        assert not any(r.relation.endswith(('_meta', '_data', 'meta0', 'meta2', 'data0', 'data2')) for r in locks), locks


def test_with_the_horizon_pinned_rotation_keeps_the_tables_small_and_history_complete(engine, orders):
    pin = Pin(engine)
    rot = rotator(engine, items=500)
    sizes = []
    for _ in range(30):
        orders.enqueue_many([b"p" * 200] * 500)
        while batch := orders.dequeue(100):
            assert orders.ack(batch) == len(batch)
        rot.rotate()
        sizes.append(slot_bytes(engine, orders))
    assert pin.held_xmin(engine) == pin.xmin
    pin.close()
    st = state(engine, orders)
    assert st.emptied >= 25 and st.last_id == 15_000
    # 15,000 messages went through with nothing vacuumable: without rotation meta and data
    # would hold every version (measured: ~6 MB); the slots hold the last generations only
    assert max(sizes[10:]) == max(sizes[5:10]) or max(sizes[10:]) < 2_000_000, sizes
    assert max(sizes) < 2_000_000, sizes
    with engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT count(*) FROM {orders.names.qualified('history')}")).scalar() >= 14_000


def test_a_session_holding_the_queue_blocks_the_truncate_is_named_and_the_queue_keeps_working(engine, orders,
                                                                                              monkeypatch):
    rot = rotator(engine, items=10)
    orders.enqueue_many([b"a"] * 20)
    while batch := orders.dequeue(10):
        orders.ack(batch)
    holder = engine.connect()
    holder.begin()
    holder.execute(sa.text(f"SELECT count(*) FROM {orders.names.qualified('meta')}"))
    holder_pid = holder.execute(sa.text("SELECT pg_backend_pid()")).scalar()
    try:
        done = rot.rotate()  # switches to epoch 1, seals epoch 0; its truncate waits in vain for the holder
        assert done.switched and state(engine, orders).sealed == 0
        assert done.emptied == 0 and done.blocked and f"pid {holder_pid}" in done.blocked, done
        assert "AccessShareLock" in done.blocked
        # producers and consumers are not held up meanwhile
        new = orders.enqueue("still")
        assert [m.id for m in orders.dequeue(1)] == [new]
        # health names the holder once its transaction is older than ROTATION_BLOCKER_AGE_S
        rep = health_report(engine, None, options=HealthOptions())
        [check] = [c for c in rep.checks if c.id == "queue.rotation"]
        assert check.status == "OK"  # a young holder is not named yet
        monkeypatch.setattr(health, "ROTATION_BLOCKER_AGE_S", 0.0)
        rep = health_report(engine, None, options=HealthOptions())
        [check] = [c for c in rep.checks if c.id == "queue.rotation"]
        assert check.status == "WARNING" and f"pid {holder_pid}" in check.advice, check
        assert "cannot be emptied" in check.advice and "pg_dump --exclude-table-data" in check.advice
        [q] = rep.to_dict()["queues"]
        assert q["rotation"]["blocked_by"] and q["rotation"]["lag"] >= 1
    finally:
        holder.rollback()
        holder.close()
    done = rot.rotate()
    assert done.emptied == 1 and done.blocked is None
    assert state(engine, orders).emptied == 0


def test_the_calls_on_leased_items_refuse_repeatable_read_and_enqueue_does_not(engine, orders):
    orders.enqueue("a")
    fn = orders.names.qualified
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        assert conn.execute(sa.text(f"SELECT {fn('enqueue')}('b'::bytea)")).scalar() > 0
        conn.rollback()
        for call in (f"SELECT * FROM {fn('dequeue')}(1)", f"SELECT {fn('ack')}(ARRAY[1]::bigint[])",
                     f"SELECT * FROM {fn('nack')}(ARRAY[1]::bigint[])", f"SELECT {fn('release')}(ARRAY[1]::bigint[])",
                     f"SELECT * FROM {fn('extend_lease')}(ARRAY[1]::bigint[])"):
            with pytest.raises(DBAPIError) as refused:
                conn.execute(sa.text(call))
            conn.rollback()
            assert refused.value.orig.sqlstate == "QC400"
            message = adapter_for(engine).isolation_refusal(refused.value)
            assert "READ COMMITTED transactions only (this one is repeatable read)" in message


@pytest.mark.slow
def test_an_0011_queue_becomes_generations_with_every_row_and_goes_back(engine):
    install_queue(engine, "old", settings=QueueSettings(), revision="reliable_0011")
    with Queue(engine, "old") as q:
        ids = q.enqueue_many([f"m{i}".encode() for i in range(8)], headers=[{"i": i} for i in range(8)])
        assert ids == list(range(1, 9))
        q.enqueue("later", delay=3600)
        first, second, third = q.dequeue(3, lease=600)
        assert q.ack([first]) == 1
        q.nack([second], error="boom", base_delay=600)
        before = ledger(engine, q)
        counts = q.counts()

        assert upgrade_queue(engine, "old") == ("reliable_0011", head_of("reliable"))
        assert ledger(engine, q) == before and q.counts() == counts
        assert q.ack([third]) == 1  # a lease taken before the upgrade is still held
        newer = q.enqueue("after the upgrade")
        assert newer > max(before["status"])
        # rows in two slots before the downgrade
        rot = rotator(engine, "old", items=1)
        for _ in range(4):
            q.enqueue("more")
            rot.rotate()
        taken = q.dequeue(3)
        assert [m.payload for m in taken] == [b"m3", b"m4", b"m5"]
        rotator(engine, "old", items=10**7).rotate()  # empties the epoch the last pass sealed
        q.enqueue("in the old epoch")
        with engine.begin() as conn:
            conn.execute(sa.text(f"SELECT {q.names.qualified('rot_switch')}(1)"))
        q.enqueue("in the new epoch")
        moved = ledger(engine, q)
        with engine.connect() as conn:
            assert conn.execute(sa.text(f"SELECT count(DISTINCT slot) FROM {q.names.qualified('meta')}")).scalar() >= 2

        assert downgrade_queue(engine, "old", "reliable_0011") == (head_of("reliable"), "reliable_0011")
        assert ledger(engine, q) == moved
        assert q.ack(taken) == 3
        after = q.enqueue("after the downgrade")
        assert after > max(moved["status"])
        with engine.connect() as conn:
            kinds = conn.execute(sa.text(
                "SELECT relkind FROM pg_class WHERE oid = CAST(:t AS regclass)"), {"t": q.names.qualified("meta")}).scalar()
            fkeys = conn.execute(sa.text("SELECT count(*) FROM pg_constraint WHERE conrelid = CAST(:t AS regclass) "
                                         "AND contype = 'f'"), {"t": q.names.qualified("data")}).scalar()
        assert kinds == "r" and fkeys == 1
        assert [m.payload for m in q.dequeue(10)][:3] == [b"m6", b"m7", b"after the upgrade"]


def history_insert_order(engine: sa.Engine, queue: Queue, slot: int) -> list[int]:
    """The ids rot_copy inserts into history, in the order it inserts them, with the join
    planned as a hash join (so its order may follow the data table's physical order). A row
    trigger logs each insert; everything, trigger included, is rolled back."""
    history = queue.names.qualified("history")
    with engine.connect() as conn:
        conn.execute(sa.text("CREATE TEMP TABLE copy_log (n serial, id bigint) ON COMMIT DROP"))
        conn.execute(sa.text(
            "CREATE FUNCTION pg_temp.log_copy() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN INSERT INTO copy_log (id) VALUES (NEW.id); RETURN NULL; END$$"))
        conn.execute(sa.text(f"CREATE TRIGGER log_copy AFTER INSERT ON {history} "
                             "FOR EACH ROW EXECUTE FUNCTION pg_temp.log_copy()"))
        conn.execute(sa.text("SET LOCAL enable_nestloop = off"))
        conn.execute(sa.text("SET LOCAL enable_mergejoin = off"))
        copied = conn.execute(sa.text(f"SELECT copied FROM {queue.names.qualified('rot_copy')}("
                                      "CAST(:slot AS smallint), 0, NULL)"), {"slot": slot}).scalar()
        order = conn.execute(sa.text("SELECT id FROM copy_log ORDER BY n")).scalars().all()
        conn.rollback()
    assert copied == len(order)
    return order


def test_the_copy_to_history_inserts_in_id_order_whatever_order_its_join_yields(engine):
    """Two rotators copying the same generation insert the same history keys; the unique key
    makes one wait on the other's uncommitted key, so both must insert in one order or they
    can deadlock (40P01 in rot_copy). Here half the slot's
    payload rows have newer versions, so a scan of the data table meets ids 21-40 before
    1-20: reliable_0013's copy, whose INSERT takes its hash join's order, inserts in that
    order (the control); reliable_0014's inserts in id order, and its downgrade goes back."""
    install_queue(engine, "old", settings=QueueSettings(), revision="reliable_0013")
    with Queue(engine, "old") as q:
        ids = q.enqueue_many([f"m{i}".encode() for i in range(40)])
        with engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {q.names.qualified('data0')} SET headers = headers WHERE id <= 20"))
            conn.execute(sa.text(f"ANALYZE {q.names.qualified('data0')}, {q.names.qualified('meta0')}"))
        assert q.ack(q.dequeue(40)) == 40

        before = history_insert_order(engine, q, 0)
        assert sorted(before) == sorted(ids) and before != sorted(ids)
        assert upgrade_queue(engine, "old") == ("reliable_0013", head_of("reliable"))
        assert head_of("reliable") >= "reliable_0014"
        assert history_insert_order(engine, q, 0) == sorted(ids)
        assert downgrade_queue(engine, "old", "reliable_0013") == (head_of("reliable"), "reliable_0013")
        assert history_insert_order(engine, q, 0) == before


def test_health_counts_a_generation_copied_to_history_but_not_yet_emptied_once(engine, orders):
    """Between a generation's copy to history and its truncate (which a session holding the
    slot can delay for as long as it stays), its finished rows are in meta and in history:
    the window's rates count them once."""
    orders.enqueue_many([f"m{i}".encode() for i in range(30)])
    assert orders.ack(orders.dequeue(20)) == 20
    with engine.begin() as conn:
        copied = conn.execute(sa.text(f"SELECT copied FROM {orders.names.qualified('rot_copy')}(0::smallint, 0, NULL)")).scalar()
    assert copied == 20
    history = orders.names.qualified("history")
    with engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT count(*) FROM {history}")).scalar() == 20
    [q] = health_report(engine, None, options=HealthOptions()).to_dict()["queues"]
    assert q["depth"]["done"] == 20
    assert (q["rates"]["enqueued"], q["rates"]["dequeued"], q["rates"]["completed"]) == (30, 20, 20)


def sealed_not_emptied(engine: sa.Engine, queue: Queue) -> None:
    """Epoch 1 opens and epoch 0 is sealed, its truncate still to come: the window between the
    seal and the truncate that every generation passes through."""
    fn = queue.names.qualified
    with engine.begin() as conn:
        conn.execute(sa.text(f"SELECT {fn('rot_switch')}(1)"))
    with engine.begin() as conn:
        conn.execute(sa.text(f"SELECT {fn('rot_seal')}(50000)"))
    with engine.begin() as conn:
        conn.execute(sa.text(f"SELECT {fn('rot_mark')}('sealed', 0)"))
    st = state(engine, queue)
    assert (st.epoch, st.sealed, st.emptied) == (1, 0, -1)


def claim_beside_a_truncate(engine: sa.Engine, queue: Queue, n: int) -> list[int] | str:
    """dequeue(n) while another session holds slot 0's tables ACCESS EXCLUSIVE, as rot_empty
    does while it copies and truncates: the ids claimed (the claim then rolled back), or the
    error of a claim that waited for that lock past a 2-s lock_timeout."""
    fn = queue.names.qualified
    holder = engine.connect()
    holder.begin()
    holder.execute(sa.text(f"LOCK TABLE {fn('meta0')}, {fn('data0')} IN ACCESS EXCLUSIVE MODE"))
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SET lock_timeout = '2s'"))
            try:
                return conn.execute(sa.text(f"SELECT id FROM {fn('dequeue')}(:n)"), {"n": n}).scalars().all()
            except DBAPIError as exc:
                return str(exc.orig).splitlines()[0]
            finally:
                conn.rollback()
    finally:
        holder.rollback()
        holder.close()


def test_a_claim_short_of_a_batch_does_not_wait_for_the_truncate_of_a_sealed_generation(engine):
    """A claim for more than the current slot holds, while the sealed epoch 0 waits for its
    truncate: at reliable_0012-0014 it looked in every slot for expired leases and queued
    behind the truncate's lock (the control); since reliable_0015 it returns what the current
    slot holds, and the downgrade brings the old claim back."""
    install_queue(engine, "old", settings=QueueSettings(), revision="reliable_0014")
    with Queue(engine, "old") as q:
        q.enqueue_many([b"old"] * 5)
        sealed_not_emptied(engine, q)  # the seal moved the 5 READY rows to slot 1
        q.enqueue_many([b"new"] * 3)
        assert "lock timeout" in claim_beside_a_truncate(engine, q, 20)

        assert upgrade_queue(engine, "old") == ("reliable_0014", head_of("reliable"))
        assert head_of("reliable") >= "reliable_0015"
        got = claim_beside_a_truncate(engine, q, 20)
        assert isinstance(got, list) and len(got) == 8, got

        assert downgrade_queue(engine, "old", "reliable_0014") == (head_of("reliable"), "reliable_0014")
        assert "lock timeout" in claim_beside_a_truncate(engine, q, 20)
        assert len(q.dequeue(20)) == 8


def test_a_lease_that_expired_in_a_sealed_generation_comes_back_once_the_truncate_moves_it(engine, orders):
    """Two items leased for 0.2 s in epoch 0, which is then sealed; their leases expire before
    its truncate. The claims do not look in the sealed slot; the archive job's next pass moves
    the rows forward, where the next claim takes them again (second attempt)."""
    ids = orders.enqueue_many([b"a", b"b"])
    assert sorted(m.id for m in orders.dequeue(2, lease=0.2)) == sorted(ids)
    sealed_not_emptied(engine, orders)
    time.sleep(0.3)
    assert orders.dequeue(10) == []
    assert rotator(engine, items=10**7).rotate().emptied == 1
    again = orders.dequeue(10)
    assert sorted(m.id for m in again) == sorted(ids) and {m.attempts for m in again} == {2}
    assert orders.ack(again) == 2


def test_health_warns_of_items_stranded_in_a_generation_no_archive_job_empties(engine, orders, monkeypatch):
    """Leases that expired in a sealed generation come back only with its truncate: while no
    archive job runs they wait there, and health says so (queue.rotation, once the oldest has
    waited ROTATION_STRANDED_AGE_S; stuck_items points there), with the count in --json and
    the metrics. A generation with nothing stranded is not flagged."""
    def report() -> tuple[dict, health.Check, health.Check]:
        rep = health_report(engine, None, options=HealthOptions())
        [q] = rep.to_dict()["queues"]
        gauge = [s.value for f in families(rep) for s in f.samples if s.name == "queuectl_queue_rotation_stranded"]
        assert gauge == [q["rotation"]["stranded"]]
        checks = {c.id: c for c in rep.checks if c.object == "orders"}
        return q, checks["queue.rotation"], checks.get("queue.stuck_items")

    ids = orders.enqueue_many([b"a", b"b", b"c"])
    leased = orders.dequeue(2, lease=0.2)
    sealed_not_emptied(engine, orders)
    q, rotation, _ = report()
    assert q["rotation"]["stranded"] == 0 and rotation.status == "OK"  # leases not expired yet; "c" moved forward
    time.sleep(0.3)
    q, rotation, stuck = report()
    assert (q["rotation"]["stranded"], rotation.status) == (2, "OK")  # not for long yet
    assert 0.1 < q["rotation"]["stranded_age_s"] < 60
    assert "2 waiting in a sealed generation" in rotation.summary
    assert "come back when the archive job empties it" in stuck.advice
    monkeypatch.setattr(health, "ROTATION_STRANDED_AGE_S", 0.1)
    q, rotation, _ = report()
    assert rotation.status == "WARNING", rotation
    assert "2 item(s) due for up to" in rotation.advice and "queuectl archive orders" in rotation.advice
    assert [m.payload for m in orders.dequeue(10)] == [b"c"]  # the others wait in the sealed slot ...
    assert rotator(engine, items=10**7).rotate().emptied == 1
    again = orders.dequeue(10)  # ... until the truncate moves them forward
    assert sorted(m.id for m in again) == sorted(m.id for m in leased) and set(ids) > {m.id for m in again}
    q, rotation, _ = report()
    assert q["rotation"]["stranded"] == 0 and rotation.status == "OK"


def slot_counts(engine: sa.Engine, queue: Queue) -> dict[tuple[int, int], int]:
    """(slot, status) -> rows in meta."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT slot, status, count(*) AS n FROM {queue.names.qualified('meta')} "
                                    "GROUP BY slot, status")).all()
    return {(r.slot, r.status): r.n for r in rows}


def test_a_backlog_in_the_previous_generation_is_claimed_where_it_is_until_the_current_one_is_full(engine, orders):
    """3n READY items in epoch 0 when the rotator switches (n = LAZY_SEAL_ROWS, generations
    of 3n ids): the seal leaves them where they are, more than n, and the claims take them
    there, in order. Once at most n are left the seal moves those few; and once the current
    epoch is full it moves whatever is left (here the next generation's 3.5n)."""
    n = LAZY_SEAL_ROWS
    rot = rotator(engine, items=3 * n)
    first = orders.enqueue_many([f"a{i}".encode() for i in range(3 * n)])
    done = rot.rotate()
    assert done.switched and done.sealed is None
    assert rot.rotate().sealed is None  # nothing drawn since: still open
    assert slot_counts(engine, orders) == {(0, 0): 3 * n}
    second = orders.enqueue_many([f"b{i}".encode() for i in range(n)])
    taken = orders.dequeue(5 * n // 2)
    assert [m.id for m in taken] == first[:5 * n // 2]
    assert orders.ack(taken) == 5 * n // 2
    assert slot_counts(engine, orders) == {(0, 0): n // 2, (0, 2): 5 * n // 2, (1, 0): n}
    done = rot.rotate()  # n/2 left (<= n): moved, and epoch 0 emptied
    assert (done.sealed, done.emptied, done.switched) == (n // 2, 1, False)
    assert slot_counts(engine, orders) == {(1, 0): 3 * n // 2}
    third = orders.enqueue_many([f"c{i}".encode() for i in range(2 * n)])  # epoch 1 full: switch
    done = rot.rotate()
    assert done.switched and state(engine, orders).sealed == 0  # epoch 1's 3.5n READY stay
    orders.enqueue_many([f"d{i}".encode() for i in range(3 * n)])  # epoch 2 full: the seal moves them
    done = rot.rotate()
    assert done.sealed == 7 * n // 2 and done.emptied == 1
    rest = orders.dequeue(10 * n)
    assert [m.id for m in rest][:7 * n // 2] == first[5 * n // 2:] + second + third
    assert orders.ack(rest) == 13 * n // 2
    assert sum(slot_counts(engine, orders).get((s, 0), 0) for s in range(3)) == 0


def test_the_truncate_copies_only_what_finished_since_the_precopy(engine, orders):
    """rot_copy passes over the rows already in history before it reads their payloads: the
    truncate's copy under its lock reads what finished since the precopy, not the generation.
    A batch names its last id for the next one only when it found a whole batch of finished
    rows; a shorter batch, or a call without one, read the slot to its end."""
    fn = orders.names.qualified
    ids = orders.enqueue_many([f"m{i}".encode() for i in range(10)])
    taken = orders.dequeue(10)
    assert orders.ack(taken[:6]) == 6
    sealed_not_emptied(engine, orders)

    def copy(after: int = 0, batch: int | None = None) -> tuple[int, int | None]:
        with engine.begin() as conn:
            return tuple(conn.execute(sa.text(f"SELECT * FROM {fn('rot_copy')}(CAST(0 AS smallint), :after, :batch)"),
                                      {"after": after, "batch": batch}).one())

    assert copy() == (6, None)
    assert orders.ack(taken[6:]) == 4
    assert copy() == (4, None)  # only what finished since
    assert copy() == (0, None)
    assert copy(0, 5) == (0, ids[4])  # a whole batch: the next starts after its last id
    assert copy(ids[4], 5) == (0, ids[9])
    assert copy(ids[9], 5) == (0, None)  # nothing above
    assert copy(ids[6], 5) == (0, None)  # three finished rows above: the end of the slot
    assert ledger(engine, orders)["count"] == Counter({i: 2 for i in ids})  # in meta and in history


def test_a_batch_finds_its_end_and_copies_what_finished_above_a_row_still_leased(engine, orders):
    """A precopy batch stops after p_batch finished rows and copies them, passing over the
    leased rows between them (the truncate moves those); its last id is the last finished row
    it counted, and the batch after it starts there."""
    fn = orders.names.qualified
    ids = orders.enqueue_many([f"m{i}".encode() for i in range(9)])
    taken = orders.dequeue(9)
    assert orders.ack(taken[0:2] + taken[3:5] + taken[6:9]) == 7  # ids[2] and ids[5] stay leased
    sealed_not_emptied(engine, orders)
    batch = sa.text(f"SELECT * FROM {fn('rot_copy')}(CAST(0 AS smallint), :after, 3)")
    with engine.begin() as conn:
        assert tuple(conn.execute(batch, {"after": 0}).one()) == (3, ids[3])
        assert tuple(conn.execute(batch, {"after": ids[3]}).one()) == (3, ids[7])
        assert tuple(conn.execute(batch, {"after": ids[7]}).one()) == (1, None)
    assert history_ids(engine, orders) == [i for i in ids if i not in (ids[2], ids[5])]


def test_a_precopy_batch_another_rotator_copied_first_is_sent_again_and_copies_nothing_twice(engine, orders):
    """Two rotators precopying the same generation at once both find its rows missing from
    history: the second's insert waits on the first's uncommitted keys and fails with
    unique_violation once the first commits. The archive job sends that batch again, finds the
    rows in history and goes on to empty the generation: every row in history once."""
    ids = orders.enqueue_many([f"m{i}".encode() for i in range(10)])
    assert orders.ack(orders.dequeue(10)) == 10
    sealed_not_emptied(engine, orders)
    rot = rotator(engine, items=1000)
    done: list = []
    with engine.connect() as first:
        copy = sa.text(f"SELECT copied FROM {orders.names.qualified('rot_copy')}(CAST(0 AS smallint), 0, 1000)")
        assert first.execute(copy).scalar_one() == 10
        second = threading.Thread(target=lambda: done.append(rot.rotate()))
        second.start()
        deadline = time.monotonic() + 20
        while not waiting_on_a_transaction(engine) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert waiting_on_a_transaction(engine)
        first.commit()
        second.join(20)
    assert len(done) == 1 and done[0].emptied == 1 and done[0].copied == 0
    assert history_ids(engine, orders) == ids


def waiting_on_a_transaction(engine: sa.Engine) -> bool:
    """A session of this database waits on another's transaction (a row or key it wrote)."""
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                    "AND wait_event_type = 'Lock' AND wait_event = 'transactionid'")).scalar_one() > 0


def test_a_pass_runs_under_the_jobs_timeouts_and_gives_its_connection_back_with_the_servers(engine, orders):
    """A pass sets the job's timeouts once on its connection (not in each transaction) and
    resets them before the connection goes back to the pool, also when the pass fails."""
    own = sa.create_engine(engine.url, pool_size=1, max_overflow=0)
    show = sa.text("SELECT current_setting('lock_timeout'), current_setting('statement_timeout')")
    try:
        with own.connect() as conn:
            before = tuple(conn.execute(show).one())
        target = JobTarget.resolve(own, "orders", "queuectl", ("reliable",))
        rot = Rotator(own, target, ArchiveConfig(rotate_items=10, lock_timeout=1.5, statement_timeout=7))
        rot._sql["rot_state"] = sa.text(f"SELECT s.*, current_setting('lock_timeout') AS lock_timeout, "
                                         f"current_setting('statement_timeout') AS statement_timeout "
                                         f"FROM {orders.names.qualified('rot_state')}() s")
        seen = []
        one = rot._one
        rot._one = lambda name, **params: seen.append(row := one(name, **params)) or row
        orders.enqueue_many([b"x"] * 11)
        rot.rotate()
        assert (seen[0].lock_timeout, seen[0].statement_timeout) == ("1500ms", "7s")
        with own.connect() as conn:
            assert tuple(conn.execute(show).one()) == before
        rot._sql["rot_next_empty"] = sa.text("SELECT no_such_column")
        with pytest.raises(DBAPIError):
            rot.rotate()
        with own.connect() as conn:
            assert tuple(conn.execute(show).one()) == before
    finally:
        own.dispose()


def test_beside_the_rotation_the_continuous_job_looks_for_rows_old_enough_to_move_once_a_second(
        engine, orders, monkeypatch):
    """On a rotated queue finished rows leave with their slot's truncate, so the row-by-row
    archive batch (rows older than min_age, which only an epoch kept open holds) runs once a
    second, not at every round of the job; it still moves what it finds."""
    from queuectl.jobs import archive

    calls = []
    move_batch = archive.Archiver.move_batch
    monkeypatch.setattr(archive.Archiver, "move_batch", lambda self: calls.append(1) or move_batch(self))
    ids = orders.enqueue_many([f"m{i}".encode() for i in range(5)])
    assert orders.ack(orders.dequeue(5)) == 5
    config = ArchiveConfig(min_age=0, delay=0.01, idle_delay=0.01, max_seconds=1.5, rotate_items=1000)
    result = archive.run_continuous(engine, "orders", config)
    assert result.batches >= 20  # rounds of the job
    assert 1 <= len(calls) <= 3
    assert result.rows == 5 and history_ids(engine, orders) == ids


def horizon(engine: sa.Engine) -> str:
    """A transaction horizon, taken as the archive job takes it before a precopy."""
    with engine.begin() as conn:
        return conn.execute(sa.text(render("postgresql", "jobs", "rot_horizon", {}))).scalar_one()


def history_ids(engine: sa.Engine, queue: Queue) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(f"SELECT id FROM {queue.names.qualified('history')} ORDER BY id")).scalars())


def test_a_copy_told_its_precopys_horizon_looks_up_only_the_rows_finished_since(engine, orders):
    """rot_copy told the horizon its caller took before a precopy passes over the rows a
    transaction below it finished (the precopy copied those) without looking them up in
    history, and looks up every other: a row finished by a transaction open across the horizon
    and one in a subtransaction of it, a row whose transaction committed before the horizon but
    after that one began (above the horizon: it is looked up, though the precopy copied it), and
    a row finished after the precopy. History loses the precopied rows here before the copy,
    so a row looked up is copied again and a row passed over is not."""
    fn = orders.names.qualified
    ids = orders.enqueue_many([f"m{i}".encode() for i in range(8)])
    taken = orders.dequeue(8)
    assert [m.id for m in taken] == ids
    assert orders.ack(taken[:4]) == 4
    sealed_not_emptied(engine, orders)
    ack = sa.text(f"SELECT {fn('ack')}(CAST(:ids AS bigint[]), :worker)")
    with engine.connect() as across:  # acks before the horizon is taken, commits after
        assert across.execute(ack, {"ids": [ids[4]], "worker": orders.worker}).scalar_one() == 1
        with across.begin_nested():
            assert across.execute(ack, {"ids": [ids[5]], "worker": orders.worker}).scalar_one() == 1
        assert orders.ack(taken[6:7]) == 1  # committed, before the horizon
        cut = horizon(engine)
        across.commit()

    def copy(before: str | None) -> int:
        with engine.begin() as conn:
            return conn.execute(sa.text(f"SELECT copied FROM {fn('rot_copy')}(CAST(0 AS smallint), 0, NULL, "
                                        "CAST(:before AS xid8))"), {"before": before}).scalar_one()

    assert copy(None) == 7  # the precopy
    assert orders.ack(taken[7:]) == 1
    with engine.begin() as conn:
        conn.execute(sa.text(f"DELETE FROM {fn('history')}"))
    assert copy(cut) == 4
    assert history_ids(engine, orders) == ids[4:]
    assert copy(cut) == 0  # what it looked up it found this time
    assert copy(None) == 4  # without the horizon every finished row is looked up
    assert history_ids(engine, orders) == ids


def test_a_job_started_at_a_horizon_revision_keeps_emptying_after_a_downgrade_below_it(engine, orders, caplog):
    """A job that resolved its queue at reliable_0017 or later tells the truncate its precopy's
    horizon; taken back below that revision while the job runs, the queue's rot_empty takes no
    horizon: the job empties without it (and says so) instead of failing every pass."""
    rot = rotator(engine, items=10)
    assert rot.target.info.schema_version >= "reliable_0017"
    ids = orders.enqueue_many([f"m{i}".encode() for i in range(10)])
    assert orders.ack(orders.dequeue(10)) == 10
    orders.enqueue("next generation")  # the epoch is full: the pass switches
    assert downgrade_queue(engine, "orders", "reliable_0016")[1] == "reliable_0016"
    with caplog.at_level("WARNING", logger="queuectl.jobs.archive"):
        done = rot.rotate()
    assert done.switched and done.emptied == 1 and done.copied == 10
    assert "takes no horizon" in caplog.text
    assert history_ids(engine, orders) == ids
    assert rot.rotate().emptied == 0  # nothing more to empty, and no error


def test_a_truncate_uses_the_horizon_only_for_the_epoch_it_was_precopied_for(engine, orders):
    """rot_empty's horizon holds for the epoch its caller precopied: told it for that epoch the
    copy under the lock passes over what finished below it; told it for another (another
    rotator emptied the precopied one meanwhile) it looks every finished row up. A horizon
    above every ack, with history emptied after the precopy, shows which it did."""
    fn = orders.names.qualified
    ids = orders.enqueue_many([f"m{i}".encode() for i in range(4)])
    assert orders.ack(orders.dequeue(4)) == 4
    sealed_not_emptied(engine, orders)
    with engine.begin() as conn:
        precopy = sa.text(f"SELECT copied FROM {fn('rot_copy')}(CAST(0 AS smallint), 0, NULL)")
        assert conn.execute(precopy).scalar_one() == 4
        conn.execute(sa.text(f"DELETE FROM {fn('history')}"))
    cut = horizon(engine)
    empty = sa.text(f"SELECT * FROM {fn('rot_empty')}(50, :epoch, CAST(:before AS xid8))")
    with engine.connect() as conn:
        assert tuple(conn.execute(empty, {"epoch": 0, "before": cut}).one()) == (0, 0, 0)
        conn.rollback()
    with engine.begin() as conn:
        assert tuple(conn.execute(empty, {"epoch": 7, "before": cut}).one()) == (0, 4, 0)
    assert history_ids(engine, orders) == ids
    assert state(engine, orders).emptied == -1  # the caller marks it (rot_mark)

