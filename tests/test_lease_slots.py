"""The reliable queue's extend_lease, nack and release on the generation slots (reliable_0013):
each runs on the current slot's own tables first, with as few relation locks as the claim and
the ack (all on the fast path), and falls back on the parents for the ids not found there:
an item in an older slot, or one a truncate moved, is found, nack and release give it back in
the current epoch, and with the rotator turning generations over every few milliseconds and
the horizon pinned, every item is completed exactly once."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest
import sqlalchemy as sa

from queuectl.catalog import QueueSettings
from queuectl.client import Queue
from queuectl.install import downgrade_queue, head_of, install_queue, upgrade_queue
from queuectl.registry import list_queues

from lab_probes import lab_module
from test_rotation import RotationRun, ledger, relation_locks, rotator, state

# A backend takes up to 16 weak relation locks without the shared lock manager (PostgreSQL's
# FP_LOCK_SLOTS_PER_BACKEND); past them every lock goes through its partition locks.
FAST_PATH_SLOTS = 16
CALLS = ("extend_lease", "nack", "nack_last", "release")


def call_sql(queue: Queue, call: str) -> str:
    fn = queue.names.qualified
    return {"extend_lease": f"SELECT * FROM {fn('extend_lease')}(CAST(:ids AS bigint[]), 600, :worker)",
            "nack": f"SELECT * FROM {fn('nack')}(CAST(:ids AS bigint[]), 'boom', :worker, 30, 60)",
            "nack_last": f"SELECT * FROM {fn('nack')}(CAST(:ids AS bigint[]), 'boom', :worker, 30, 60)",
            "release": f"SELECT {fn('release')}(CAST(:ids AS bigint[]), :worker) AS released"}[call]


def rows(engine: sa.Engine, queue: Queue, ids: list[int]) -> dict[int, sa.Row]:
    m, d = queue.names.qualified("meta"), queue.names.qualified("data")
    with engine.connect() as conn:
        found = conn.execute(sa.text(
            f"SELECT m.id, m.slot, m.status, m.attempts, m.lease_owner, m.leased_until, m.due_at, m.last_error, "
            f"m.finished_at, d.slot AS data_slot, d.payload FROM {m} m LEFT JOIN {d} d ON d.id = m.id "
            f"WHERE m.id = ANY (CAST(:ids AS bigint[]))"), {"ids": ids}).all()
    return {r.id: r for r in found}


def current_slot(engine: sa.Engine, queue: Queue) -> int:
    return state(engine, queue).epoch % 3


def lease(queue: Queue, n: int, *, max_attempts: int = 5, tag: str = "m") -> list[int]:
    """n items enqueued and leased for 10 minutes by the queue's worker; their ids."""
    ids = queue.enqueue_many([f"{tag}{i}".encode() for i in range(n)], max_attempts=max_attempts)
    leased = [m.id for m in queue.dequeue(n, lease=600)]
    assert sorted(leased) == sorted(ids)
    return ids


def run_call(engine: sa.Engine, queue: Queue, call: str, ids: list[int]) -> tuple[list[sa.Row], list[sa.Row]]:
    """The call's result rows and the relation locks its transaction holds after it (committed).
    The same call is run and rolled back first: a session's first call plans the statements
    (once per session), and planning a statement on a partition reads its partition bound
    through the parent (a lock on the parent that later calls do not take)."""
    with engine.connect() as conn:
        conn.execute(sa.text(call_sql(queue, call)), {"ids": ids, "worker": queue.worker}).all()
        conn.rollback()
        result = conn.execute(sa.text(call_sql(queue, call)), {"ids": ids, "worker": queue.worker}).all()
        locks = relation_locks(conn)
        conn.commit()
    return result, locks


def check_outcome(engine: sa.Engine, queue: Queue, call: str, ids: list[int], result: list[sa.Row],
                  before: dict[int, sa.Row]) -> None:
    """What each call leaves: the lease extended in place; nack READY with a backoff (DEAD in
    place on the last attempt); release READY with its attempt given back; payloads intact,
    every READY row and its payload in the current slot."""
    after = rows(engine, queue, ids)
    slot = current_slot(engine, queue)
    assert sorted(after) == sorted(ids)
    if call == "release":
        assert result[0].released == len(ids)
    else:
        assert sorted(r.id for r in result) == sorted(ids)
    for i in ids:
        old, new = before[i], after[i]
        assert new.payload == old.payload and new.data_slot == new.slot, (call, new)
        if call == "extend_lease":
            assert new.status == 1 and new.slot == old.slot and new.leased_until > old.leased_until, (old, new)
        elif call == "nack_last":
            assert (new.status, new.slot, new.last_error, new.lease_owner) == (3, old.slot, "boom", queue.worker)
            assert new.finished_at is not None and new.leased_until is None
        else:
            assert new.status == 0 and new.slot == slot and new.lease_owner is None and new.leased_until is None
            if call == "nack":
                assert new.attempts == old.attempts and new.last_error == "boom" and new.due_at > old.due_at
            else:
                assert new.attempts == old.attempts - 1 and new.due_at == old.due_at


def assert_fast_path(locks: list[sa.Row], slot: int) -> None:
    """Fewer relation locks than the fast path's slots, all taken there, and only on the
    current slot's meta table and its indexes (and the epoch the call reads): none on the
    parents, another slot or a data table (reliable_0012's nack and release took 15, its
    extend_lease 7, on the parents and every slot)."""
    relations = {r.relation for r in locks}
    assert len(relations) < FAST_PATH_SLOTS and all(r.fastpath for r in locks), locks
    own = tuple(f"_meta{slot}{end}" for end in ("", "_pkey", "_ready", "_leased", "_finished")) + ("_rot_epoch",)
    assert all(r.endswith(own) for r in relations), locks


@pytest.mark.parametrize("call", CALLS)
def test_a_call_on_items_in_the_current_slot_stays_on_its_tables_and_the_fast_path(engine, orders, call):
    ids = lease(orders, 3, max_attempts=1 if call == "nack_last" else 5)
    before = rows(engine, orders, ids)
    assert {r.slot for r in before.values()} == {0}
    result, locks = run_call(engine, orders, call, ids)
    check_outcome(engine, orders, call, ids, result, before)
    assert_fast_path(locks, 0)


@pytest.mark.parametrize("call", CALLS)
def test_a_call_on_items_in_an_older_slot_finds_them_and_gives_them_back_in_the_current_epoch(engine, orders, call):
    """After a switch the items are leased in slot 0 while new rows go to slot 1; one of
    them is leased in slot 1 already: one call on both."""
    old = lease(orders, 3, max_attempts=1 if call == "nack_last" else 5)
    with engine.begin() as conn:
        conn.execute(sa.text(f"SELECT {orders.names.qualified('rot_switch')}(1)"))
    assert current_slot(engine, orders) == 1
    new = lease(orders, 1, max_attempts=1 if call == "nack_last" else 5, tag="n")
    ids = old + new
    before = rows(engine, orders, ids)
    assert [before[i].slot for i in ids] == [0, 0, 0, 1]
    result, _locks = run_call(engine, orders, call, ids)
    check_outcome(engine, orders, call, ids, result, before)
    # a second call finds nothing left to change, in any slot
    again, _ = run_call(engine, orders, call, ids)
    if call == "extend_lease":
        assert sorted(r.id for r in again) == sorted(ids)
    else:
        assert again in ([], [(0,)]), again


@pytest.mark.parametrize("call", CALLS)
def test_a_call_on_items_a_truncate_moved_finds_them_in_the_current_slot_on_the_fast_path(engine, orders, call):
    ids = lease(orders, 3, max_attempts=1 if call == "nack_last" else 5)
    with engine.begin() as conn:
        conn.execute(sa.text(f"SELECT {orders.names.qualified('rot_switch')}(1)"))
    rotator(engine, items=10**7).rotate()  # seals epoch 0 and empties it: its leased rows move to slot 1
    assert state(engine, orders).emptied == 0
    before = rows(engine, orders, ids)
    assert {r.slot for r in before.values()} == {1} and {r.status for r in before.values()} == {1}
    result, locks = run_call(engine, orders, call, ids)
    check_outcome(engine, orders, call, ids, result, before)
    assert_fast_path(locks, 1)


@pytest.mark.parametrize("call", CALLS)
def test_a_call_on_the_current_slot_does_not_wait_for_a_truncate_of_another(engine, orders, call):
    """A session holds ACCESS EXCLUSIVE on slot 0's tables (as rot_empty does while it
    copies and truncates); a call on items of the current slot, slot 1, completes."""
    with engine.begin() as conn:
        conn.execute(sa.text(f"SELECT {orders.names.qualified('rot_switch')}(0)"))
    ids = lease(orders, 2, max_attempts=1 if call == "nack_last" else 5)
    before = rows(engine, orders, ids)
    assert {r.slot for r in before.values()} == {1}
    holder = engine.connect()
    holder.begin()
    holder.execute(sa.text(f"LOCK TABLE {orders.names.qualified('meta0')}, {orders.names.qualified('data0')} "
                           "IN ACCESS EXCLUSIVE MODE"))
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SET lock_timeout = '2s'"))
            result = conn.execute(sa.text(call_sql(orders, call)), {"ids": ids, "worker": orders.worker}).all()
            conn.commit()
    finally:
        holder.rollback()
        holder.close()
    check_outcome(engine, orders, call, ids, result, before)


@pytest.mark.slow
def test_workers_extending_nacking_and_releasing_while_the_rotator_turns_lose_nothing_and_complete_nothing_twice(
        engine, orders):
    """3 producers, 4 workers that extend their leases (every item, some twice) and then ack,
    nack, release or drop it (lease expiry), two rotators switching every 40 ids, every 5 ms,
    the horizon pinned: every item is acked exactly once, none is lost, payloads intact."""
    run = RotationRun(engine)
    sent, acked = run.sent, run.acked
    calls: Counter[str] = Counter()

    def produce(n: int) -> None:
        rnd = random.Random(n)
        with Queue(engine, "orders") as q:
            i = 0
            while not run.stop_producing.is_set():
                payloads = [f"p{n}-{i}-{k}".encode() for k in range(rnd.randint(1, 6))]
                sent.update(zip(q.enqueue_many(payloads, max_attempts=1000), payloads))
                i += 1
                time.sleep(0.003)

    def work(n: int) -> None:
        rnd = random.Random(100 + n)
        with Queue(engine, "orders") as q:
            while not run.stop_all.is_set():
                batch = q.dequeue(5, lease=1)
                if not batch:
                    time.sleep(0.01)
                    continue
                for m in batch:
                    assert m.payload == sent.get(m.id, m.payload)
                held = q.extend_lease(batch, lease=2)
                calls["extend_lease"] += len(held)
                if rnd.random() < 0.3:
                    time.sleep(0.005)  # a rotation may come in between: extend again
                    held = q.extend_lease([m for m in batch if m.id in held], lease=2)
                    calls["extend_lease"] += len(held)
                for m in (m for m in batch if m.id in held):
                    roll = rnd.random()
                    if roll < 0.6:
                        if got := q.ack([m]):  # 0: its lease expired meanwhile and a claim took it
                            acked[m.id] += got
                    elif roll < 0.75:
                        calls["nack"] += len(q.nack([m], error="again", base_delay=0.02))
                    elif roll < 0.9:
                        calls["release"] += q.release([m])
                    # else dropped: its lease expires and a claim takes it again

    run.run(produce, work, producers=3, workers=4, rotate_items=40, rotate_every=0.005, seconds=5, drain_s=90)
    run.finish(orders, lambda left: (len(left), len(sent), calls, state(engine, orders), rows(engine, orders, left[:5])))
    assert min(calls[c] for c in ("extend_lease", "nack", "release")) > 50, calls


@pytest.mark.slow
def test_an_0012_queue_upgrades_with_every_row_and_goes_back(engine):
    """reliable_0012 -> head -> reliable_0012 with leased items in two slots: every row stays
    as it was, the leases still held; the per-slot calls come and go with the revision."""
    install_queue(engine, "old", settings=QueueSettings(), revision="reliable_0012")
    fn_count = sa.text("SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                       "WHERE n.nspname = 'queuectl' AND p.proname ~ '^old_(extend|nack|release)_in[0-2]$'")
    with Queue(engine, "old") as q:
        first = lease(q, 4, tag="a")
        with engine.begin() as conn:
            conn.execute(sa.text(f"SELECT {q.names.qualified('rot_switch')}(1)"))
        second = lease(q, 4, tag="b")
        q.enqueue("waiting")
        before = ledger(engine, q)
        counts = q.counts()
        with engine.connect() as conn:
            assert conn.execute(fn_count).scalar() == 0

        assert upgrade_queue(engine, "old") == ("reliable_0012", head_of("reliable"))
        assert head_of("reliable") >= "reliable_0013"
        assert ledger(engine, q) == before and q.counts() == counts
        with engine.connect() as conn:
            assert conn.execute(fn_count).scalar() == 9
        assert sorted(q.extend_lease(first[:2] + second[:2], lease=600)) == sorted(first[:2] + second[:2])
        assert q.release([first[2], second[2]]) == 2
        assert set(q.nack([first[3], second[3]], error="x")) == {first[3], second[3]}
        moved = ledger(engine, q)
        assert rows(engine, q, [first[2], first[3]])[first[2]].slot == 1

        assert downgrade_queue(engine, "old", "reliable_0012") == (head_of("reliable"), "reliable_0012")
        assert ledger(engine, q) == moved
        with engine.connect() as conn:
            assert conn.execute(fn_count).scalar() == 0
        # reliable_0012's bodies are back and work on the same rows
        assert sorted(q.extend_lease(first[:2] + second[:2], lease=600)) == sorted(first[:2] + second[:2])
        assert q.ack(first[:2] + second[:2]) == 4


@pytest.mark.slow
def test_tiny_lease_probe(db_url, engine):
    """`python bench/lab/ack_plan.py --parts lease` on a tiny run: each call's locks in the
    current slot, head against reliable_0012, and the three cycles side by side; the probe
    removes its queues."""
    probe = lab_module("ack_plan")
    result = probe.run(db_url, ["lease"], in_flight=[], acks=3, batches=[2], rounds=1, seconds=1, clients=2)
    calls = {(c["design"], c["where"]): c for c in result["lease"]["calls"]}
    assert set(calls) == {(d, w) for d in ("0012", "head") for w in ("current slot", "older slot")}
    for call in probe.LEASE_CALLS:
        head, old = calls[("head", "current slot")][call], calls[("0012", "current slot")][call]
        assert head["relations"] == 3 and head["fastpath"] == head["locks"], (call, head)
        if call != "ack":  # reliable_0012's extend_lease, nack and release lock every slot
            assert old["relations"] > 3, (call, old)
    cycles = result["lease"]["cycles"]["cells"]
    assert set(cycles) == set(probe.LEASE_CYCLES)
    for cells in cycles.values():
        assert {c["design"] for c in cells} == {"0012", "head"}
        assert all(c["failed"] == 0 and min(c["msgs_per_s"]) > 0 for c in cells), cells
    with engine.connect() as conn:
        assert [q.name for q in list_queues(conn) if q.name.startswith("ack_plan_")] == []
