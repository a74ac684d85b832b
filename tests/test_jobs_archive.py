"""The archive job: finished rows move to history with their payloads, in small batches."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from queuectl.bench.drivers import plan_shared_hits
from queuectl.client import Queue
from queuectl.errors import UsageError
from queuectl.install import install_queue
from queuectl.jobs import archive
from queuectl.jobs.archive import ArchiveConfig
from queuectl.jobs.base import JobTarget, parse_duration

from jobs_helpers import placement, rows, scalar


def finish(queue: Queue, n: int) -> list[int]:
    """Dequeue n items and ack them."""
    batch = queue.dequeue(n)
    queue.ack(batch)
    return [m.id for m in batch]


def test_archive_moves_done_rows_with_payload_and_headers_and_leaves_the_rest(engine, orders: Queue):
    ids = orders.enqueue_many([f"p{i}".encode() for i in range(30)], headers=[{"i": i} for i in range(30)])
    done = finish(orders, 10)
    processing = [m.id for m in orders.dequeue(5)]
    result = archive.run_once(engine, "orders", ArchiveConfig(min_age=0, batch=4, delay=0))
    assert result.rows == 10 and result.batches == 3  # 4 + 4 + 2: stops on the short batch
    history = rows(engine, "SELECT id, status, payload, headers, attempts, finished_at, archived_at FROM queuectl.orders_history")
    assert sorted(r.id for r in history) == sorted(done)
    by_id = {r.id: r for r in history}
    for n, item_id in enumerate(ids[:10]):
        assert bytes(by_id[item_id].payload) == f"p{n}".encode() and by_id[item_id].headers == {"i": n}
        assert by_id[item_id].status == 2 and by_id[item_id].attempts == 1
        assert by_id[item_id].finished_at <= by_id[item_id].archived_at
    live_ids = {r.id for r in rows(engine, "SELECT id FROM queuectl.orders_meta")}
    assert live_ids == set(ids) - set(done)
    assert scalar(engine, "SELECT count(*) FROM queuectl.orders_data") == 20
    assert set(processing) <= live_ids


def test_archive_waits_for_min_age_and_keeps_dead_rows_for_their_own_retention(engine, orders: Queue):
    orders.enqueue_many([b"a", b"b", b"c", b"d"])
    finish(orders, 2)
    with engine.begin() as conn:  # the other two DEAD (nack would retry them 4 more times first)
        conn.execute(sa.text("UPDATE queuectl.orders_meta SET status = 3, finished_at = now() WHERE status = 0"))
    assert archive.run_once(engine, "orders", ArchiveConfig(min_age=3600)).rows == 0
    assert archive.run_once(engine, "orders", ArchiveConfig(min_age=0)).rows == 2  # DONE only
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE queuectl.orders_meta SET finished_at = now() - interval '8 days' WHERE status = 3"))
    assert archive.run_once(engine, "orders", ArchiveConfig(min_age=0)).rows == 2  # DEAD after a week
    assert scalar(engine, "SELECT count(*) FROM queuectl.orders_meta") == 0
    assert sorted(r.status for r in rows(engine, "SELECT status FROM queuectl.orders_history")) == [2, 2, 3, 3]


def dead_backlog(engine, name: str, rows: int) -> None:
    """A queue of `rows` items finished an hour ago, analyzed: the first 100 DONE, the rest DEAD
    (kept a week by default, then all due at once)."""
    install_queue(engine, name)
    with Queue(engine, name) as q:
        for _ in range(rows // 1000):
            q.enqueue_many([bytes(300)] * 1000)
    with engine.begin() as conn:
        conn.execute(sa.text(
            f'UPDATE queuectl."{name}_meta" SET status = CASE WHEN id <= 100 THEN 2 ELSE 3 END, '
            "attempts = 1, finished_at = now() - interval '1 hour'"))
    with engine.connect() as conn:
        for table in ("meta", "data"):
            conn.execute(sa.text(f'ANALYZE queuectl."{name}_{table}"'))
        conn.commit()


def archive_statement(engine, name: str, joined: bool = False) -> str:
    """The job's archive_batch for the queue; `joined`: with the join to the picks it had before."""
    text = JobTarget.resolve(engine, name, "queuectl", ("reliable",)).sql("archive_batch").text
    if joined:
        for alias in ("d", "m"):
            pk_lookup = f"WHERE {alias}.id = ANY (ARRAY(SELECT p.id FROM picked p))"
            assert pk_lookup in text
            text = text.replace(pk_lookup, f"USING picked p WHERE {alias}.id = p.id")
    return text


def buffers_per_batch(engine, statement: str, calls: int = 3) -> int:
    """Shared buffers of one batch of 100 (rolled back, so every call moves the same rows)."""
    params = {"batch": 100, "min_age_seconds": 0, "dead_min_age_seconds": 0}
    with engine.connect() as conn:
        for _ in range(calls):
            plan = conn.execute(sa.text("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) " + statement), params)
            plan = [row[0] for row in plan]
            conn.rollback()
    hit = plan_shared_hits(plan)
    assert hit is not None, plan
    return hit


@pytest.mark.slow
def test_archive_batch_touches_as_many_buffers_at_40000_rows_as_at_2000(engine):
    """Measured: ~1,540 buffers per batch of 100 at both sizes."""
    dead_backlog(engine, "small", 2_000)
    dead_backlog(engine, "large", 40_000)
    small = buffers_per_batch(engine, archive_statement(engine, "small"))
    large = buffers_per_batch(engine, archive_statement(engine, "large"))
    assert large <= small * 1.5, (small, large)


@pytest.mark.slow
def test_with_its_join_to_the_picks_the_archive_batch_scanned_both_tables_whole(engine):
    """The same measurement with the DELETEs joined to the picks, as they were (1,148 buffers at
    2,000 rows, 3,641 at 40,000: the planner took a tenth of the DEAD backlog for the picks),
    so the test above can tell the two apart."""
    dead_backlog(engine, "small", 2_000)
    dead_backlog(engine, "large", 40_000)
    small = buffers_per_batch(engine, archive_statement(engine, "small", joined=True))
    large = buffers_per_batch(engine, archive_statement(engine, "large", joined=True))
    assert large > small * 2, (small, large)


def test_history_retention_purges_old_history_in_batches(engine, orders: Queue):
    orders.enqueue_many([str(i) for i in range(25)])
    finish(orders, 25)
    archive.run_once(engine, "orders", ArchiveConfig(min_age=0))
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE queuectl.orders_history SET archived_at = now() - interval '31 days' WHERE id % 5 <> 0"))
    result = archive.run_once(engine, "orders", ArchiveConfig(min_age=0, batch=7, delay=0,
                                                              history_retention=parse_duration("30d")))
    assert result.purged == 20 and result.rows == 0
    assert result.batches == 1 + 3  # one empty archive batch, then 7 + 7 + 6
    assert all(r.id % 5 == 0 for r in rows(engine, "SELECT id FROM queuectl.orders_history"))


def test_history_retention_never_purges_rows_not_yet_exported_to_a_lake(engine, orders: Queue):
    """With a Parquet lake registered for the queue, retention deletes only what a lake holds."""
    ids = orders.enqueue_many([str(i) for i in range(20)])
    finish(orders, 20)
    archive.run_once(engine, "orders", ArchiveConfig(min_age=0))
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE queuectl.orders_history SET archived_at = now() - interval '40 days'"))
        # the lake holds ids up to the 12th, archived before 35 days ago (all of them, here)
        conn.execute(sa.text(
            "INSERT INTO queuectl.pipeline_exports (queue, lake, run_seq, exported_upto_id, archived_before, rows_exported) "
            "VALUES ('orders', '/lake', 1, :upto, now() - interval '35 days', 12)"), {"upto": ids[11]})
    result = archive.run_once(engine, "orders", ArchiveConfig(min_age=0, delay=0, history_retention=parse_duration("30d")))
    assert result.purged == 12
    assert sorted(r.id for r in rows(engine, "SELECT id FROM queuectl.orders_history")) == ids[12:]


def test_max_seconds_stops_between_batches_without_losing_rows(engine, orders: Queue):
    orders.enqueue_many([str(i) for i in range(50)])
    finish(orders, 50)
    before = placement(engine)
    result = archive.run_once(engine, "orders", ArchiveConfig(min_age=0, batch=5, delay=0.2, max_seconds=0.3))
    assert result.stopped == "max_seconds" and 0 < result.rows < 50
    after = placement(engine)
    assert after["live"] + after["history"] == before["live"]


@pytest.mark.parametrize("options", [{"batch": 0}, {"batch": 100_000}, {"min_age": -1}, {"lock_timeout": 0}])
def test_bad_archive_options_are_refused(options):
    with pytest.raises(UsageError):
        ArchiveConfig(**options)


def test_durations_parse_with_units():
    assert [parse_duration(v) for v in ("250ms", "30s", "5m", "2h", "30d", 7, "1.5")] == [0.25, 30, 300, 7200, 2592000, 7, 1.5]
    with pytest.raises(UsageError):
        parse_duration("soon")


def test_a_batchs_count_is_read_from_the_row_count_or_from_the_row_it_selects(engine):
    # PostgreSQL's batch is one DML statement (the driver's row count); SQL Server's ends with
    # `SELECT @rows AS moved` under SET NOCOUNT ON, where pyodbc's row count is -1.
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TEMP TABLE counted (n int)"))
        assert archive.rows_changed(conn.execute(sa.text("INSERT INTO counted SELECT generate_series(1, 3)"))) == 3
        assert archive.rows_changed(conn.execute(sa.text("SELECT 7 AS moved"))) == 7
        assert archive.rows_changed(conn.execute(sa.text("SELECT n FROM counted WHERE n > 5"))) == 0
