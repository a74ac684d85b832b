"""reset_stale and inspect, and the job-run history every run leaves."""

from __future__ import annotations

import sqlalchemy as sa

from queuectl.client import Queue
from queuectl.install import install_queue
from queuectl.jobs import inspect, stale
from queuectl.jobs.runner import run_job

from jobs_helpers import job_runs, rows, wait_until


def test_expired_leases_go_back_to_ready_or_dead_on_their_last_attempt(engine, orders: Queue):
    ids = orders.enqueue_many(["a", "b", "c", "d"])
    short = orders.dequeue(2, lease=0.2)                       # a, b: lease expires
    long = orders.dequeue(1, lease=600)                        # c: lease still valid
    with engine.begin() as conn:                               # b was on its last attempt
        conn.execute(sa.text("UPDATE queuectl.orders_meta SET attempts = max_attempts WHERE id = :id"),
                     {"id": short[1].id})
    wait_until(lambda: rows(engine, "SELECT 1 FROM queuectl.orders_meta WHERE status = 1 AND leased_until < now() "
                                    "HAVING count(*) = 2"), timeout=5)
    result = stale.run_once(engine, "orders")
    assert (result.ready, result.dead, result.rows) == (1, 1, 2)
    state = {r.id: r for r in rows(engine, "SELECT id, status, attempts, lease_owner, leased_until, last_error, "
                                           "finished_at FROM queuectl.orders_meta")}
    a, b, c, d = (state[i] for i in ids)
    assert (a.status, a.attempts, a.lease_owner, a.leased_until) == (0, 1, None, None)
    assert "expired" in a.last_error and a.finished_at is None
    assert (b.status, b.attempts) == (3, 5) and b.finished_at is not None and "attempt 5 of 5" in b.last_error
    assert (c.status, c.lease_owner, c.id) == (1, orders.worker, long[0].id)
    assert d.status == 0
    # the reset item is served again, in its own order, counting its second attempt
    again = orders.dequeue(5)
    assert sorted(m.id for m in again) == sorted([a.id, d.id])
    assert {m.id: m.attempts for m in again}[a.id] == 2
    assert stale.run_once(engine, "orders").rows == 0


def test_reset_stale_works_in_batches(engine, orders: Queue):
    orders.enqueue_many([str(i) for i in range(25)])
    orders.dequeue(25, lease=0.1)
    wait_until(lambda: rows(engine, "SELECT 1 FROM queuectl.orders_meta WHERE leased_until < now() HAVING count(*) = 25"))
    result = stale.run_once(engine, "orders", stale.StaleConfig(batch=10, delay=0))
    assert (result.rows, result.batches) == (25, 3)
    assert orders.counts()["ready"] == 25


def test_inspect_records_a_snapshot_with_dead_tuples_and_the_xmin_holder(engine, orders: Queue):
    orders.enqueue_many([str(i) for i in range(200)])
    orders.ack(orders.dequeue(150))
    with engine.connect() as holder:                    # an open transaction with a snapshot
        holder.execute(sa.text("SELECT txid_current()"))
        holder_pid = holder.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        orders.ack(orders.dequeue(50))                      # dead versions the holder pins
        record = run_job(engine, "inspect", "orders")
        holder.rollback()
    assert record.outcome == "succeeded" and record.rows == 1
    [snap] = rows(engine, "SELECT * FROM queuectl.health_snapshots")
    assert (snap.queue, snap.ready, snap.processing, snap.done, snap.dead) == ("orders", 0, 0, 200, 0)
    assert snap.meta_table_bytes > 0 and snap.meta_index_bytes > 0 and snap.invalid_indexes == 0
    assert snap.oldest_xmin_holder.startswith(f"pid {holder_pid} ")
    assert snap.oldest_xmin_age >= 1 and snap.oldest_xact_seconds >= 0
    assert snap.replication_slots_holding == 0 and snap.prepared_xacts == 0
    assert snap.details["xmin_holders"][0]["source"] == "backend"


def test_inspect_measures_indexes_when_pgstattuple_is_installed(engine, orders: Queue):
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pgstattuple"))
    orders.enqueue_many([str(i) for i in range(500)])
    result = inspect.run_once(engine, "orders")
    snap = result.snapshot
    names = {i["index"] for i in snap["details"]["indexes"]}
    assert {"orders_meta0_pkey", "orders_meta0_ready", "orders_meta0_finished"} <= names  # the slots' indexes
    assert snap["meta_free_pct"] is not None and 0 < snap["min_index_leaf_density"] <= 100
    [row] = rows(engine, "SELECT min_index_leaf_density, index_bloat_pct FROM queuectl.health_snapshots")
    assert row.min_index_leaf_density == snap["min_index_leaf_density"]


def test_every_run_leaves_a_history_row_success_and_failure(engine, orders: Queue):
    install_queue(engine, "other")
    assert run_job(engine, "reset_stale", "orders").outcome == "succeeded"
    with engine.connect() as blocker:                     # ACCESS EXCLUSIVE: the batch hits lock_timeout
        blocker.execute(sa.text("LOCK TABLE queuectl.other_meta IN ACCESS EXCLUSIVE MODE"))
        failed = run_job(engine, "reset_stale", "other", stale.StaleConfig(lock_timeout=0.2))
        blocker.rollback()
    assert failed.outcome == "failed" and "lock timeout" in failed.error
    runs = job_runs(engine)
    assert [(r.job, r.queue, r.outcome) for r in runs] == [("reset_stale", "orders", "succeeded"),
                                                          ("reset_stale", "other", "failed")]
    assert runs[1].error == failed.error and runs[1].finished_at >= runs[1].started_at
    assert all(r.runner_pid > 0 and r.runner_host for r in runs)
    assert runs[0].rows == 0 and runs[0].summary.startswith("0 expired leases")
