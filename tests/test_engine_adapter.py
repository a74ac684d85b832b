"""The engine adapter on PostgreSQL: single-runner locks and the storage-health reader."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from queuectl import locks
from queuectl.engine import adapter_for
from queuectl.names import QueueNames


def test_try_lock_is_exclusive_per_session_until_unlocked(engine):
    key = "queuectl.test.lock"
    with engine.connect() as a, engine.connect() as b:
        assert locks.try_take(a, key) is True
        assert locks.try_take(b, key) is False
        assert locks.release(a, key) is True
        assert locks.try_take(b, key) is True
        locks.release(b, key)


def test_storage_health_lists_the_queue_tables_and_indexes_with_dead_rows(engine, orders):
    ids = orders.enqueue_many([b"x"] * 50)
    orders.ack(orders.dequeue(50))
    with engine.connect() as conn:
        conn.execute(sa.text("ANALYZE queuectl.orders_meta"))
        conn.commit()
        rows = adapter_for(engine).storage_health(conn, QueueNames("orders"))
    tables = {r["table_name"] for r in rows if r["index_name"] is None}
    indexes = {r["index_name"] for r in rows if r["index_name"] is not None}
    # reliable_0012: meta and data are three generation slots each; the parents hold no rows
    assert tables == {f"orders_{role}{slot}" for role in ("meta", "data") for slot in "012"} | {"orders_history"}
    assert {"orders_meta0_pkey", "orders_meta0_ready", "orders_meta0_leased", "orders_meta2_leased"} <= indexes
    assert not {"orders_meta_ready", "orders_meta_leased"} & indexes  # the parents' partitioned indexes
    assert set(rows[0]) == {"table_name", "index_name", "pages", "live_rows", "dead_rows", "version_dead_rows",
                            "fragmentation_pct", "page_density_pct"}
    assert len(ids) == 50


def _application_name(engine) -> str:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()")).scalar_one()


def test_sessions_are_named_queuectl_unless_the_url_or_pgappname_names_them(engine, db_url, monkeypatch):
    from queuectl.engine import make_engine

    assert _application_name(engine) == "queuectl"  # what pg_stat_activity and health's blocker lines show
    named = make_engine(db_url + ("&" if "?" in db_url else "?") + "application_name=billing-worker")
    try:
        assert _application_name(named) == "billing-worker"
    finally:
        named.dispose()
    monkeypatch.setenv("PGAPPNAME", "nightly-report")
    by_env = make_engine(db_url)
    try:
        assert _application_name(by_env) == "nightly-report"
    finally:
        by_env.dispose()


def test_sqlstate_reads_the_server_code_of_a_wrapped_or_bare_driver_error(engine):
    """The SQLSTATE the jobs and the adapter test an error by: on SQLAlchemy's wrapper and on
    the driver's own error alike; None for an error that carries none."""
    from queuectl.engine.urls import sqlstate

    with engine.connect() as conn, pytest.raises(sa.exc.DBAPIError) as caught:
        conn.exec_driver_sql("SELECT 1 / 0")
    assert sqlstate(caught.value) == "22012" and sqlstate(caught.value.orig) == "22012"
    assert sqlstate(ValueError("no server here")) is None
