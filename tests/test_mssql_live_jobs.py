"""SQL Server, live: the maintenance jobs, their run history, the scheduler's plan and the
health report, with the behaviour tests of the PostgreSQL suite (test_jobs_archive.py,
test_jobs_stale_inspect.py, test_jobs_reorganize.py, test_watermark.py's job,
test_jobs_scheduler.py's plan, test_health.py) against a real server, through the jobs'
functions (run_once, run_job) and health_report.

They run only when QUEUECTL_TEST_MSSQL_URL names a SQL Server database the tests may create
schemas in (`make test-mssql`; docs/sqlserver.md); without it they are reported as SKIPPED.
Each test installs in a fresh schema and removes everything afterwards. Raw T-SQL appears
only to set up a state no call makes (an item finished a week ago, a lock held open).

PostgreSQL-only, so not tested here: pgstattuple and pgstatindex (SQL Server measures with
sys.dm_db_index_physical_stats, tested below), REINDEX CONCURRENTLY's leftover indexes and
VACUUM, the generation rotation of reliable_0012, replication slots and the xmin horizon's
age (SQL Server reports sessions and availability replicas instead), the buffer counts of
the archive batch's plan (EXPLAIN BUFFERS), and the Parquet pipeline (its SQL Server
export is not built: docs/pipeline.md).
"""

from __future__ import annotations

from dataclasses import replace

import jsonschema
import pytest

import mssql_live_helpers as live
from jobs_helpers import wait_until
from queuectl.catalog import QueueSettings
from queuectl.client import Queue, open_queue
from queuectl.health import HealthOptions, health_report, report_schema
from queuectl.install import install_queue
from queuectl.jobs import archive, inspect, reorganize, stale
from queuectl.jobs.archive import ArchiveConfig
from queuectl.jobs.reorganize import ReorganizeConfig
from queuectl.jobs.runner import recent_runs, run_job
from queuectl.jobs.scheduler import load_config, plan
from queuectl.kindspec import RingSettings
from queuectl.thresholds import CRITICAL, OK, WARNING

pytestmark = live.requires_mssql
mssql_engine, schema = live.mssql_engine, live.schema  # the shared fixtures


@pytest.fixture
def orders(mssql_engine, schema):
    install_queue(mssql_engine, "orders", schema=schema)
    with Queue(mssql_engine, "orders", schema=schema) as queue:
        yield queue


def table(queue: Queue, suffix: str) -> str:
    return queue.names.qualified(suffix)


def finish(queue: Queue, n: int) -> list[int]:
    """Dequeue n items and ack them."""
    batch = queue.dequeue(n)
    queue.ack(batch)
    return [m.id for m in batch]


def report(engine, schema: str, *settings: str, queues: list[str] | None = None):
    return health_report(engine, queues, schema, HealthOptions().with_settings(settings))


def the(rep, check_id: str, obj: str | None = None):
    found = [c for c in rep.checks if c.id == check_id and (obj is None or c.object == obj)]
    assert len(found) == 1, f"expected one {check_id} {obj or ''} check, got {found}"
    return found[0]


# -- archive ------------------------------------------------------------------------------------


def test_archive_moves_done_rows_with_payload_and_headers_and_leaves_the_rest(mssql_engine, orders):
    ids = orders.enqueue_many([f"p{i}".encode() for i in range(30)], headers=[{"i": i} for i in range(30)])
    done = finish(orders, 10)
    processing = [m.id for m in orders.dequeue(5)]
    result = archive.run_once(mssql_engine, "orders", ArchiveConfig(min_age=0, batch=4, delay=0), schema=orders.names.schema)
    assert result.rows == 10 and result.batches == 3  # 4 + 4 + 2: stops on the short batch
    history = {r.id: r for r in live.rows(mssql_engine, f"SELECT id, status, payload, headers, attempts, finished_at, "
                                                        f"archived_at FROM {table(orders, 'history')}")}
    assert sorted(history) == sorted(done)
    for n, item_id in enumerate(ids[:10]):
        row = history[item_id]
        assert bytes(row.payload) == f"p{n}".encode() and row.headers is not None and '"i"' in row.headers
        assert (row.status, row.attempts) == (2, 1) and row.finished_at <= row.archived_at
    live_ids = {r.id for r in live.rows(mssql_engine, f"SELECT id FROM {table(orders, 'meta')}")}
    assert live_ids == set(ids) - set(done) and set(processing) <= live_ids
    assert live.scalar(mssql_engine, f"SELECT COUNT(*) FROM {table(orders, 'data')}") == 20


def test_archive_waits_for_min_age_and_keeps_dead_rows_for_their_own_retention(mssql_engine, orders):
    s = orders.names.schema
    orders.enqueue_many([b"a", b"b", b"c", b"d"])
    finish(orders, 2)
    live.execute(mssql_engine, f"UPDATE {table(orders, 'meta')} SET status = 3, finished_at = SYSUTCDATETIME() "
                               "WHERE status = 0")  # the other two DEAD
    assert archive.run_once(mssql_engine, "orders", ArchiveConfig(min_age=3600), schema=s).rows == 0
    assert archive.run_once(mssql_engine, "orders", ArchiveConfig(min_age=0), schema=s).rows == 2  # DONE only
    live.execute(mssql_engine, f"UPDATE {table(orders, 'meta')} SET finished_at = DATEADD(day, -8, SYSUTCDATETIME()) "
                               "WHERE status = 3")
    assert archive.run_once(mssql_engine, "orders", ArchiveConfig(min_age=0), schema=s).rows == 2  # DEAD after a week
    assert live.scalar(mssql_engine, f"SELECT COUNT(*) FROM {table(orders, 'meta')}") == 0
    assert sorted(r.status for r in live.rows(mssql_engine, f"SELECT status FROM {table(orders, 'history')}")) == [2, 2, 3, 3]


def test_history_retention_purges_old_history_in_batches(mssql_engine, orders):
    s = orders.names.schema
    orders.enqueue_many([str(i) for i in range(25)])
    finish(orders, 25)
    archive.run_once(mssql_engine, "orders", ArchiveConfig(min_age=0), schema=s)
    live.execute(mssql_engine, f"UPDATE {table(orders, 'history')} SET archived_at = DATEADD(day, -31, SYSUTCDATETIME()) "
                               "WHERE id % 5 <> 0")
    result = archive.run_once(mssql_engine, "orders", ArchiveConfig(min_age=0, batch=7, delay=0,
                                                                    history_retention=30 * 86400), schema=s)
    assert result.purged == 20 and result.rows == 0
    assert result.batches == 1 + 3  # one empty archive batch, then 7 + 7 + 6
    assert all(r.id % 5 == 0 for r in live.rows(mssql_engine, f"SELECT id FROM {table(orders, 'history')}"))


def test_max_seconds_stops_between_batches_without_losing_rows(mssql_engine, orders):
    s = orders.names.schema
    orders.enqueue_many([str(i) for i in range(50)])
    finish(orders, 50)
    result = archive.run_once(mssql_engine, "orders", ArchiveConfig(min_age=0, batch=5, delay=0.2, max_seconds=0.3),
                              schema=s)
    assert result.stopped == "max_seconds" and 0 < result.rows < 50
    live_rows = live.scalar(mssql_engine, f"SELECT COUNT(*) FROM {table(orders, 'meta')}")
    history = live.scalar(mssql_engine, f"SELECT COUNT(*) FROM {table(orders, 'history')}")
    assert (live_rows + history, history) == (50, result.rows)


# -- reset_stale ----------------------------------------------------------------------------------


def test_expired_leases_go_back_to_ready_or_dead_on_their_last_attempt(mssql_engine, orders):
    s = orders.names.schema
    ids = orders.enqueue_many(["a", "b", "c", "d"])
    short = orders.dequeue(2, lease=0.2)                        # a, b: lease expires
    long = orders.dequeue(1, lease=600)                         # c: lease still valid
    live.execute(mssql_engine, f"UPDATE {table(orders, 'meta')} SET attempts = max_attempts WHERE id = :id",
                 id=short[1].id)                                # b was on its last attempt
    wait_until(lambda: live.scalar(mssql_engine, f"SELECT COUNT(*) FROM {table(orders, 'meta')} "
                                                 "WHERE status = 1 AND leased_until < SYSUTCDATETIME()") == 2, timeout=5)
    result = stale.run_once(mssql_engine, "orders", schema=s)
    assert (result.ready, result.dead, result.rows) == (1, 1, 2)
    state = {r.id: r for r in live.rows(mssql_engine, f"SELECT id, status, attempts, lease_owner, leased_until, "
                                                      f"last_error, finished_at FROM {table(orders, 'meta')}")}
    a, b, c, d = (state[i] for i in ids)
    assert (a.status, a.attempts, a.lease_owner, a.leased_until) == (0, 1, None, None)
    assert "expired" in a.last_error and a.finished_at is None
    assert (b.status, b.attempts) == (3, 5) and b.finished_at is not None and "attempt 5 of 5" in b.last_error
    assert (c.status, c.lease_owner, c.id) == (1, orders.worker, long[0].id)
    assert d.status == 0
    again = orders.dequeue(5)  # the reset item is served again, counting its second attempt
    assert sorted(m.id for m in again) == sorted([a.id, d.id])
    assert {m.id: m.attempts for m in again}[a.id] == 2
    assert stale.run_once(mssql_engine, "orders", schema=s).rows == 0


def test_reset_stale_works_in_batches(mssql_engine, orders):
    orders.enqueue_many([str(i) for i in range(25)])
    orders.dequeue(25, lease=0.1)
    wait_until(lambda: live.scalar(mssql_engine, f"SELECT COUNT(*) FROM {table(orders, 'meta')} "
                                                 "WHERE leased_until < SYSUTCDATETIME()") == 25)
    result = stale.run_once(mssql_engine, "orders", stale.StaleConfig(batch=10, delay=0), schema=orders.names.schema)
    assert (result.rows, result.batches) == (25, 3)
    assert orders.counts()["ready"] == 25


# -- inspect, reorganize ----------------------------------------------------------------------------


def test_inspect_records_a_snapshot_naming_the_session_that_holds_ghost_cleanup(mssql_engine, orders):
    s = orders.names.schema
    orders.enqueue_many([str(i) for i in range(200)])
    orders.ack(orders.dequeue(150))
    # An open transaction that wrote in this database (into history, whose rows inspect does
    # not read, so its locks keep nothing waiting): ghosts behind it stay until it ends.
    with mssql_engine.connect() as holder:
        holder.begin()
        holder.exec_driver_sql(f"INSERT INTO {table(orders, 'history')} (id, priority, due_at, status, attempts, "
                               "max_attempts, enqueued_at) VALUES (-1, 0, SYSUTCDATETIME(), 2, 1, 1, SYSUTCDATETIME())")
        holder_session = holder.exec_driver_sql("SELECT @@SPID").scalar()
        orders.ack(orders.dequeue(50))
        record = run_job(mssql_engine, "inspect", "orders", schema=s)
        holder.rollback()
    assert record.outcome == "succeeded" and record.rows == 1, record.error
    snap = record.result.snapshot
    assert (snap["ready"], snap["processing"], snap["done"], snap["dead"]) == (0, 0, 200, 0)
    assert snap["meta_table_bytes"] > 0 and snap["meta_index_bytes"] > 0 and snap["invalid_indexes"] == 0
    assert snap["oldest_xmin_holder"].startswith(f"session {holder_session} ")
    assert snap["details"]["xmin_holders"][0]["source"] == "backend"
    assert snap["replication_slots_holding"] == 0 and snap["prepared_xacts"] == 0
    assert live.scalar(mssql_engine, f'SELECT COUNT(*) FROM "{s}".health_snapshots') == 1


def test_inspect_measures_the_meta_indexes_with_physical_stats(mssql_engine, orders):
    orders.enqueue_many([str(i) for i in range(2000)])
    result = inspect.run_once(mssql_engine, "orders", schema=orders.names.schema)
    snap = result.snapshot
    measured = {i["index"] for i in snap["details"]["indexes"]}
    assert measured and all("ghost_rows" in i for i in snap["details"]["indexes"])
    assert 0 < snap["min_index_leaf_density"] <= 100 and snap["max_index_fragmentation"] is not None
    assert "version_store" in snap["details"]


def churn(queue: Queue, n: int, batch: int = 1000) -> None:
    """n items through their whole life: enqueue, dequeue, ack."""
    for start in range(0, n, batch):
        queue.enqueue_many([b"x" * 200] * min(batch, n - start))
        queue.ack(queue.dequeue(batch))


# Every measured index is acted on: the decision comes from the measurements, not the size.
EVERY_INDEX = {"min_pages": 0, "watch_pct": 0.0, "min_page_density_pct": 100.0}


def test_reorganize_dry_run_measures_and_changes_nothing(mssql_engine, orders):
    churn(orders, 5_000)
    result = reorganize.run_once(mssql_engine, "orders", ReorganizeConfig(dry_run=True, **EVERY_INDEX),
                                 schema=orders.names.schema)
    assert result.dry_run and result.errors == [] and result.vacuumed == []
    acted = [i for i in result.indexes if i.decision in ("reorganize", "rebuild")]
    assert acted and all(i.action == f"would {i.decision}" and i.statements for i in acted)
    assert all(i.after is None for i in result.indexes)


def test_reorganize_acts_online_then_updates_statistics_and_records_the_run(mssql_engine, orders):
    churn(orders, 5_000)
    record = run_job(mssql_engine, "reorganize", "orders", ReorganizeConfig(**EVERY_INDEX), schema=orders.names.schema)
    assert record.outcome == "succeeded", record.error
    result = record.result
    acted = [i for i in result.indexes if i.decision in ("reorganize", "rebuild")]
    assert acted and all(i.action in ("reorganized", "rebuilt") and i.error is None for i in acted)
    assert record.rows == len(acted)
    assert result.vacuumed == ["orders_meta", "orders_data"]  # UPDATE STATISTICS of both tables
    assert all(i.after is not None for i in acted)
    with orders.processing(1):  # the queue works on after the upkeep
        pass


# -- the watermark job ------------------------------------------------------------------------------


def test_watermark_job_fixes_a_wrong_watermark_and_records_the_run(mssql_engine, schema):
    install_queue(mssql_engine, "wm", "watermark", schema=schema)
    with open_queue(mssql_engine, "wm", schema=schema) as q:
        ids = q.enqueue_many([f"m{i}" for i in range(6)])
        assert [m.id for m in q.dequeue(2)] == ids[:2]
    low = f'UPDATE "{schema}"."wm_watermark" SET low = :low'
    live.execute(mssql_engine, low, low=ids[5])  # too high: items 2..4 would be skipped
    record = run_job(mssql_engine, "correct_watermark", "wm", schema=schema)
    assert record.outcome == "succeeded" and record.rows == 1, record.error
    assert (record.result.old, record.result.new) == (ids[5], ids[2])
    live.execute(mssql_engine, low, low=1)  # too low: ghosts scanned again
    record = run_job(mssql_engine, "correct_watermark", "wm", schema=schema)
    assert (record.result.old, record.result.new, record.rows) == (1, ids[2], 1)
    record = run_job(mssql_engine, "correct_watermark", "wm", schema=schema)  # nothing to fix now
    assert (record.rows, record.result.corrected) == (0, False)
    runs = recent_runs(mssql_engine, schema=schema, job="correct_watermark", queue="wm")
    assert [(r["outcome"], r["rows"]) for r in runs] == [("succeeded", 0), ("succeeded", 1), ("succeeded", 1)]


# -- the run history and the scheduler's plan ------------------------------------------------------


def test_every_run_leaves_a_history_row_success_and_failure(mssql_engine, orders, schema):
    install_queue(mssql_engine, "other", schema=schema)
    assert run_job(mssql_engine, "reset_stale", "orders", schema=schema).outcome == "succeeded"
    with mssql_engine.connect() as blocker:  # a table lock held open: the batch hits its lock timeout
        blocker.begin()
        blocker.exec_driver_sql(f'SELECT COUNT(*) FROM "{schema}"."other_meta" WITH (TABLOCKX, HOLDLOCK)').all()
        failed = run_job(mssql_engine, "reset_stale", "other", stale.StaleConfig(lock_timeout=0.2), schema=schema)
        blocker.rollback()
    assert failed.outcome == "failed" and "1222" in failed.error  # Lock request time out period exceeded
    runs = recent_runs(mssql_engine, schema=schema)[::-1]
    assert [(r["job"], r["queue"], r["outcome"]) for r in runs] == [("reset_stale", "orders", "succeeded"),
                                                                    ("reset_stale", "other", "failed")]
    assert runs[1]["error"] == failed.error and runs[1]["finished_at"] >= runs[1]["started_at"]
    assert runs[0]["rows"] == 0


def test_a_job_already_running_elsewhere_is_refused(mssql_engine, orders, schema):
    from queuectl.jobs.base import JobBusy
    from queuectl.jobs.runner import lock_key, single_runner

    with single_runner(mssql_engine, lock_key(schema, "archive", "orders"), "archive on queue orders"):
        with pytest.raises(JobBusy):
            run_job(mssql_engine, "archive", "orders", schema=schema)


def test_default_plan_covers_every_job_of_every_installed_queue(mssql_engine, orders, schema):
    install_queue(mssql_engine, "wm", "watermark", schema=schema)
    config = replace(load_config(None), schema=schema)
    assert sorted((i.job, i.queue, i.trigger_text) for i in plan(mssql_engine, config)) == sorted(
        [("archive", "orders", "every 1m"), ("reset_stale", "orders", "every 30s"), ("inspect", "orders", "every 5m"),
         ("reorganize", "orders", "cron 17 3 * * *"), ("correct_watermark", "wm", "every 5m"),
         ("inspect", "wm", "every 5m"), ("reorganize", "wm", "cron 17 3 * * *"), ("upkeep", "wm", "every 5m")])


# -- health --------------------------------------------------------------------------------------


def test_healthy_queue_reports_ok_with_its_depth_and_tables(mssql_engine, orders, schema):
    orders.enqueue_many([f"order {i}".encode() for i in range(50)])
    orders.ack(orders.dequeue(20))
    orders.enqueue(b"later", delay=3600)
    rep = report(mssql_engine, schema)
    data = rep.to_dict()
    jsonschema.validate(data, report_schema())
    assert data["verdict"] == "OK" and rep.exit_code == 0, [c for c in rep.checks if c.advice]
    [q] = data["queues"]
    assert q["depth"] == {"ready": 30, "scheduled": 1, "processing": 0, "done": 20, "dead": 0}
    assert q["rates"]["enqueued"] == 51 and q["rates"]["completed"] == 20
    assert {"orders_meta", "orders_data", "orders_history"} == {t["table"] for t in data["storage"]["tables"]}


def test_health_reports_the_rotation_lag_and_names_a_session_that_keeps_a_generation(mssql_engine, orders, schema):
    """The generations' state on SQL Server as on PostgreSQL (health.sql queue_rotation,
    rotation_blockers): the lag is the ids drawn since the last switch, and a session whose
    open transaction holds a lock on a slot table is named by the query that explains a
    truncate that waits."""
    import time

    import sqlalchemy as sa

    orders.enqueue_many([b"x"] * 13)
    rep = report(mssql_engine, schema)
    [q] = rep.to_dict()["queues"]
    assert q["rotation"] == {"lag": 13, "blocked_by": []}
    assert the(rep, "queue.rotation", "orders").value == 13
    with mssql_engine.connect() as holder:  # pyodbc: the first statement opens a transaction
        spid = holder.execute(sa.text("SELECT @@SPID")).scalar_one()
        holder.execute(sa.text(f"SELECT TOP 1 id FROM {orders.names.qualified('meta0')} WITH (TABLOCK, HOLDLOCK)"))
        time.sleep(0.2)
        with mssql_engine.connect() as conn:
            found = archive.rotation_blockers(conn, orders.names, "mssql", 0, min_age_s=0.1)
        holder.rollback()
    assert [f for f in found if f.startswith(f"session {spid} ")], found


def test_expired_lease_is_a_stuck_item_and_dead_letters_are_counted(mssql_engine, schema):
    install_queue(mssql_engine, "orders", schema=schema)
    install_queue(mssql_engine, "mail", settings=QueueSettings(max_attempts=1), schema=schema)
    with Queue(mssql_engine, "orders", schema=schema) as orders, Queue(mssql_engine, "mail", schema=schema) as mail:
        orders.enqueue_many([b"a", b"b", b"c"])
        orders.dequeue(2, lease=0.2)  # the consumer "dies": never acks
        mail.enqueue_many([b"m"] * 5)
        mail.nack(mail.dequeue(5), "smtp refused")
    rep = wait_until(lambda: (r := report(mssql_engine, schema)) and the(r, "queue.stuck_items", "orders").value == 2
                     and r, timeout=15, interval=0.2)
    stuck = the(rep, "queue.stuck_items", "orders")
    assert stuck.status == WARNING and "2 item(s) hold leases that expired" in stuck.advice
    dead = the(report(mssql_engine, schema, "dead_letters.crit=5"), "queue.dead_letters", "mail")
    assert dead.status == CRITICAL and dead.value == 5 and "5 dead letter(s)" in dead.advice


def test_every_queue_kind_reports_its_depth_and_kind_checks(mssql_engine, schema):
    for kind in ("heap", "fifo", "stack", "pending", "watermark"):
        install_queue(mssql_engine, f"q_{kind}", kind, schema=schema)
    install_queue(mssql_engine, "q_ring", "ring", RingSettings(size=16), schema=schema)
    for kind in ("heap", "fifo", "stack", "watermark", "ring"):
        with open_queue(mssql_engine, f"q_{kind}", schema=schema) as q:
            q.enqueue_many([f"{kind}-{i}" for i in range(13)])
    with open_queue(mssql_engine, "q_pending", schema=schema) as q:
        q.enqueue_many([f"now-{i}" for i in range(4)])
        q.enqueue_many([f"later-{i}" for i in range(3)], delay=3600)
    rep = report(mssql_engine, schema, "ring_fill.warn=50", "ring_fill.crit=90")
    jsonschema.validate(rep.to_dict(), report_schema())
    queues = {q["name"]: q for q in rep.to_dict()["queues"]}
    for kind in ("heap", "fifo", "stack", "watermark", "ring"):
        assert queues[f"q_{kind}"]["depth"]["ready"] == 13, queues[f"q_{kind}"]
    assert (queues["q_pending"]["depth"]["ready"], queues["q_pending"]["depth"]["scheduled"]) == (4, 3)
    assert not [c for c in rep.checks if c.id == "queue.probe"]  # every kind was probed
    ring = the(rep, "queue.ring_fill", "q_ring")
    assert (ring.status, ring.value) == (WARNING, 81.25)  # 13 of 16 slots
    assert the(rep, "queue.watermark_lag", "q_watermark").status == OK


def test_watermark_above_a_waiting_item_is_critical_with_the_fix(mssql_engine, schema):
    install_queue(mssql_engine, "wm", "watermark", schema=schema)
    with open_queue(mssql_engine, "wm", schema=schema) as q:
        ids = q.enqueue_many([f"m{i}" for i in range(5)])
    live.execute(mssql_engine, f'UPDATE "{schema}"."wm_watermark" SET low = :low', low=ids[3])
    lag = the(report(mssql_engine, schema, queues=["wm"]), "queue.watermark_lag", "wm")
    assert lag.status == CRITICAL and lag.value == -3
    assert "queuectl correct-watermark wm" in lag.advice
