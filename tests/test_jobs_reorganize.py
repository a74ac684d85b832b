"""reorganize: bloated indexes rebuilt online back to a fresh build's size, dry runs
change nothing, leftovers of an interrupted REINDEX CONCURRENTLY are cleaned up."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from queuectl.client import Queue
from queuectl.engine import make_engine
from queuectl.errors import QueuectlError
from queuectl.install import install_queue
from queuectl.jobs import reorganize
from queuectl.jobs.reorganize import ReorganizeConfig
from queuectl.jobs.runner import run_job

from jobs_helpers import rows, scalar, wait_until

READY = "orders_meta0_ready"  # reliable_0012: slot 0's (no rotation runs here, every row stays there)
SMALL = dict(min_pages=10)  # the test's indexes are far below the 1000-page default


def index_state(engine: Engine) -> dict[str, tuple]:
    """Every index of the queue with its file node (changes on rebuild), size and validity."""
    return {r.relname: (r.relfilenode, r.size, r.indisvalid) for r in rows(engine, """
        SELECT c.relname, c.relfilenode, pg_relation_size(c.oid) AS size, i.indisvalid
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        WHERE i.indrelid IN (SELECT p.relid FROM pg_partition_tree('queuectl.orders_meta') p
                             UNION ALL SELECT p.relid FROM pg_partition_tree('queuectl.orders_data') p)""")}


def churn(engine: Engine, queue: Queue, n: int = 60_000) -> None:
    """n items enqueued, then 9 in 10 finished in scattered order (as priorities and
    retries do): their entries leave the ready index, whose pages stay behind."""
    for start in range(0, n, 10_000):
        queue.enqueue_many([b"x"] * 10_000)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE queuectl.orders_meta SET status = 2, finished_at = now() WHERE id % 10 <> 0"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM queuectl.orders_meta"))


def measure(engine: Engine, index: str) -> sa.Row:
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pgstattuple"))
        return conn.execute(sa.text(f"SELECT * FROM pgstatindex('queuectl.{index}')")).one()


def fresh_build(engine: Engine, index: str) -> sa.Row:
    """pgstatindex of a fresh copy of the index built on the same rows (then dropped)."""
    with engine.begin() as conn:
        definition = conn.execute(sa.text("SELECT pg_get_indexdef(CAST(:i AS regclass))"), {"i": f"queuectl.{index}"}).scalar()
        conn.execute(sa.text(definition.replace(f"INDEX {index} ON", "INDEX fresh_copy ON")))
        stats = conn.execute(sa.text("SELECT * FROM pgstatindex('queuectl.fresh_copy')")).one()
        conn.execute(sa.text("DROP INDEX queuectl.fresh_copy"))
    return stats


@pytest.mark.slow
def test_reorganize_after_churn_brings_the_ready_index_back_to_a_fresh_build(engine, orders: Queue):
    churn(engine, orders)
    bloated = measure(engine, READY)
    fresh = fresh_build(engine, READY)
    assert bloated.index_size > 5 * fresh.index_size          # the churn did bloat it
    assert bloated.avg_leaf_density < 30
    result = run_job(engine, "reorganize", "orders", ReorganizeConfig(**SMALL)).result
    report = next(i for i in result.indexes if i.index == READY)
    assert report.decision == "rebuild" and report.action == "rebuilt"
    assert report.before.bytes == bloated.index_size and report.before.bloat_pct > 70
    after = measure(engine, READY)
    assert report.after.bytes == after.index_size
    assert after.index_size <= fresh.index_size + 8192                 # within a page of a fresh build
    assert abs(after.avg_leaf_density - fresh.avg_leaf_density) < 3
    assert result.vacuumed == ["orders_meta", "orders_data"]
    # a second run finds nothing above the thresholds
    again = reorganize.run_once(engine, "orders", ReorganizeConfig(**SMALL))
    assert [i.index for i in again.indexes if i.action] == []
    assert next(i for i in again.indexes if i.index == READY).decision in ("ok", "small")


def test_dry_run_measures_and_changes_nothing(engine, orders: Queue):
    churn(engine, orders, 30_000)
    leftover_from_interrupted_reindex(engine, orders)
    before = index_state(engine)
    vacuums = scalar(engine, "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'orders_meta0'")
    # without pgstattuple a dry run reports sizes only and does not create the extension
    sizes_only = reorganize.run_once(engine, "orders", ReorganizeConfig(dry_run=True, **SMALL))
    assert {i.decision for i in sizes_only.indexes} == {"not measured"} and "pgstattuple" in sizes_only.notes[0]
    assert scalar(engine, "SELECT count(*) FROM pg_extension WHERE extname = 'pgstattuple'") == 0
    measure(engine, READY)  # the DBA installs it
    result = reorganize.run_once(engine, "orders", ReorganizeConfig(dry_run=True, **SMALL))
    assert result.dry_run and result.vacuumed == []
    assert next(i for i in result.indexes if i.index == READY).action == "would rebuild"
    assert [(e["index"], e["action"]) for e in result.leftovers] == [(f"{READY}_ccnew", "would drop")]
    assert index_state(engine) == before                               # same files, sizes, leftovers
    assert scalar(engine, "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'orders_meta0'") == vacuums


def leftover_from_interrupted_reindex(engine: Engine, orders: Queue) -> None:
    """A REINDEX CONCURRENTLY cancelled while it waits for an open writer leaves an
    INVALID <index>_ccnew behind, as after a crash or a timeout in production."""
    with engine.connect() as writer:
        writer.execute(sa.text("UPDATE queuectl.orders_meta SET title = 'held' WHERE id = (SELECT min(id) FROM queuectl.orders_meta)"))
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("SET statement_timeout = '500ms'"))
            with pytest.raises(sa.exc.OperationalError, match="statement timeout"):
                conn.execute(sa.text(f"REINDEX INDEX CONCURRENTLY queuectl.{READY}"))
        writer.rollback()
    assert index_state(engine)[f"{READY}_ccnew"][2] is False


def test_leftover_of_an_interrupted_reindex_is_dropped_by_the_next_run(engine, orders: Queue):
    orders.enqueue_many([b"x"] * 100)
    leftover_from_interrupted_reindex(engine, orders)
    result = reorganize.run_once(engine, "orders")
    assert [(e["index"], e["action"]) for e in result.leftovers] == [(f"{READY}_ccnew", "dropped")]
    state = index_state(engine)
    assert f"{READY}_ccnew" not in state and all(valid for _node, _size, valid in state.values())
    assert not result.errors


@pytest.mark.slow
def test_a_rebuild_cut_by_its_time_limit_is_recorded_and_cleans_up_after_itself(engine, orders: Queue):
    churn(engine, orders, 20_000)
    with engine.connect() as writer:                   # an open writer: the rebuild cannot finish
        writer.execute(sa.text("UPDATE queuectl.orders_meta SET title = 't' WHERE id = (SELECT min(id) FROM queuectl.orders_meta)"))
        record = run_job(engine, "reorganize", "orders",
                         ReorganizeConfig(statement_timeout=0.5, lock_timeout=0.5, vacuum=False, **SMALL))
        writer.rollback()
    assert record.outcome == "failed" and f"reindex {READY}" in record.error
    assert "timeout" in record.error
    [run] = rows(engine, "SELECT outcome, error, details FROM queuectl.job_runs")
    assert run.outcome == "failed" and run.error == record.error
    assert any(i["index"] == READY and i["action"] == "failed" for i in run.details["indexes"])
    # its *_ccnew could not be dropped while the writer was open either; the next run does it
    result = reorganize.run_once(engine, "orders", ReorganizeConfig(**SMALL))
    assert all(valid for _n, _s, valid in index_state(engine).values())
    assert not [n for n in index_state(engine) if "_ccnew" in n]
    assert next(i for i in result.indexes if i.index == READY).action == "rebuilt"


def test_missing_pgstattuple_without_permission_is_a_clear_error(engine, db_url):
    """A role that is neither superuser nor database owner cannot create the extension."""
    database = make_url(db_url).database
    with engine.begin() as conn:
        conn.execute(sa.text("DROP ROLE IF EXISTS qt_plain"))
        conn.execute(sa.text("CREATE ROLE qt_plain LOGIN"))
        conn.execute(sa.text(f'GRANT CREATE ON DATABASE "{database}" TO qt_plain'))
    plain = make_engine(make_url(db_url).set(username="qt_plain").render_as_string(hide_password=False))
    try:
        install_queue(plain, "orders", schema="plain")
        with pytest.raises(QueuectlError, match="ask a superuser to run CREATE EXTENSION pgstattuple"):
            reorganize.run_once(plain, "orders", schema="plain")
    finally:
        plain.dispose()
        with engine.begin() as conn:
            conn.execute(sa.text("DROP SCHEMA plain CASCADE"))
            conn.execute(sa.text(f'REVOKE ALL ON DATABASE "{database}" FROM qt_plain'))
            conn.execute(sa.text("DROP ROLE qt_plain"))


@pytest.mark.slow
def test_a_reorganize_whose_backend_is_terminated_mid_reindex_fails_in_one_line_and_cleans_up(engine, orders, db_url):
    """pg_terminate_backend on the session running REINDEX INDEX CONCURRENTLY, found by its
    query text while it waits for an open writer (so the moment is certain): one line on
    stderr, exit 3, the run recorded with the server's own reason, and the INVALID *_ccnew
    it left dropped on a new connection within the same run."""
    orders.enqueue_many([b"x"] * 100)
    writer = engine.connect()  # an open writer: the rebuild waits for it after making its *_ccnew
    writer.execute(sa.text("UPDATE queuectl.orders_meta SET title = 'held' WHERE id = (SELECT min(id) FROM queuectl.orders_meta)"))
    env = {k: v for k, v in os.environ.items() if k != "QUEUECTL_URL"} | {"COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "queuectl.cli", "reorganize", "orders", "--min-pages", "0", "--bloat", "0",
         "--lock-timeout", "60s", "--url", db_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        pid = wait_until(lambda: scalar(engine, """
            SELECT pid FROM pg_stat_activity
            WHERE query LIKE '%REINDEX INDEX CONCURRENTLY%' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"""),
            timeout=60, interval=0.1)
        assert any(name.endswith("_ccnew") and not valid for name, (_n, _s, valid) in index_state(engine).items())
        assert scalar(engine, "SELECT pg_terminate_backend(:pid)", pid=pid)
    finally:
        writer.rollback()
        writer.close()
    out, err = proc.communicate(timeout=120)
    lines = err.decode().splitlines()
    assert proc.returncode == 3, err.decode()
    assert len(lines) == 1 and lines[0].startswith("reorganize failed: reindex orders_meta0_"), lines
    assert "terminating connection due to administrator command" in lines[0]
    [run] = rows(engine, "SELECT outcome, error, details FROM queuectl.job_runs")
    assert run.outcome == "failed" and run.error == lines[0].removeprefix("reorganize failed: ")
    assert run.details["connection_lost"] is True
    assert [e["action"] for e in run.details["leftovers"]] == ["dropped"]
    state = index_state(engine)
    assert not [name for name in state if "_cc" in name] and all(valid for _n, _s, valid in state.values())
