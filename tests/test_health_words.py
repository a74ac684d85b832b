"""health's advice speaks the engine's language: graded on pure data (no server), the same
facts give PostgreSQL advice (VACUUM, pg_terminate_backend, replication slots) on one engine
and SQL Server advice (ghost records, the version store, the oldest active snapshot
transaction, KILL <session>, ALTER INDEX ... REORGANIZE) on the other.

The facts are shaped like the rows of both engines' health sections (the SQL Server ones
return PostgreSQL's columns: tests/test_mssql_offline.py checks that)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from queuectl.engine import adapter_for
from queuectl.health import Facts, HealthOptions, evaluate
from queuectl.thresholds import CRITICAL

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
POSTGRESQL_ONLY = ("VACUUM", "pg_terminate_backend", "pg_drop_replication_slot", "xmin horizon", "COMMIT PREPARED",
                   "pg_repack", "idle_in_transaction_session_timeout", "dead tuples", "pg_locks", "REINDEX")
MSSQL_ONLY = ("ghost", "KILL", "REORGANIZE", "version", "sys.dm_tran_active_snapshot_database_transactions",
              "availability replica", "MS DTC")


def facts(engine: str) -> Facts:
    """A database in trouble: a session idle in transaction for two hours pins 250k ghosts /
    dead rows, an index is half empty, another is invalid (disabled), a replica / slot is
    gone, a prepared transaction waits, the table has free space, a queue could not be read."""
    from queuectl.health import QueueFacts

    table = {"table_name": "orders_meta", "queue": "orders", "suffix": "meta", "measured": True,
             "n_live_tup": 1000, "n_dead_tup": 250_000, "last_vacuum": None, "last_autovacuum": None,
             "pages": 4000, "fillfactor": 100, "table_bytes": 4000 * 8192,
             "physical": {"approx_free_percent": 80.0}}
    bloated = {"index_name": "orders_meta_ready", "queue": "orders", "suffix": "meta", "valid": True,
               "reindex_leftover": False, "fillfactor": 100, "index_bytes": 3000 * 8192,
               "physical": {"leaf_pages": 3000, "avg_leaf_density": 22.0, "empty_pages": 0, "deleted_pages": 0}}
    invalid = {"index_name": "orders_meta_finished", "queue": "orders", "suffix": "meta", "valid": False,
               "reindex_leftover": engine == "postgresql", "fillfactor": 100, "index_bytes": 8192}
    session = {"pid": 57, "usename": "app", "backend_type": "user session", "application_name": "worker",
               "state": "idle in transaction", "backend_xmin": "4242", "backend_xid": "9001",
               "xact_age_s": 7200.0, "state_age_s": 7100.0}
    slot = {"slot_name": "replica2", "slot_type": "physical", "active": False, "xmin_age_xids": None,
            "retained_wal_bytes": 5 * 2**30}
    prepared = {"gid": "7f1c0d5e-1111-2222-3333-444455556666", "database": "app", "owner": "app",
                "age_s": 7200.0, "this_database": True}
    unread = QueueFacts("stuck", "reliable", probed=False, notes=["could not be read: lock request time out"])
    return Facts(
        generated_at=NOW, server={"database": "app", "server_version": "x", "in_recovery": False,
                                  "autovacuum_on": True, "autovacuum_vacuum_threshold": 50,
                                  "autovacuum_vacuum_scale_factor": 0.2, "autovacuum_naptime_s": 60},
        schema="queuectl", queues=[unread], tables=[table], indexes=[bloated, invalid], sessions=[session],
        replication_slots=[slot], standby_feedback=[], prepared_xacts=[prepared],
        jobs={"available": False, "note": "no job history"}, pgstattuple="installed", notes=[],
        words=adapter_for(engine).advice_words,
    )


def advice(engine: str) -> dict[str, str]:
    return {f"{c.id} {c.object}": c.advice for c in evaluate(facts(engine), HealthOptions()) if c.advice}


def test_both_engines_raise_the_same_checks_on_the_same_facts():
    pg = {(c.id, c.status) for c in evaluate(facts("postgresql"), HealthOptions())}
    ms = {(c.id, c.status) for c in evaluate(facts("mssql"), HealthOptions())}
    assert pg == ms
    assert ("blockers.session", CRITICAL) in pg


def test_postgresql_advice_names_postgresqls_tools():
    lines = advice("postgresql")
    text = "\n".join(lines.values())
    assert "SELECT pg_terminate_backend(57)" in lines["blockers.session pid 57"]
    assert "dead tuples" in lines["storage.dead_tuples orders_meta"]
    assert "VACUUM cannot remove" in lines["storage.dead_tuples orders_meta"]
    assert "SELECT pg_drop_replication_slot('replica2')" in lines["blockers.replication_slot replica2"]
    assert "DROP INDEX CONCURRENTLY queuectl.orders_meta_finished" in lines["storage.invalid_index orders_meta_finished"]
    assert "COMMIT PREPARED / ROLLBACK PREPARED" in text
    assert "(pg_locks)" in lines["queue.probe stuck"]
    for word in MSSQL_ONLY:
        assert word not in text, word


def test_mssql_advice_names_sql_servers_tools():
    lines = advice("mssql")
    text = "\n".join(lines.values())
    session = lines["blockers.session session 57"]
    assert session.startswith("transaction of session 57 (app, idle in transaction, app 'worker') open for 2h "
                              "holds 250k ghost records in queue tables") and session.endswith("(KILL 57)")
    assert "version store" in session
    ghosts = lines["storage.dead_tuples orders_meta"]
    assert ghosts.startswith("orders_meta: 250k ghost records (100%)")
    assert "ghost cleanup cannot remove while session 57" in ghosts
    assert "oldest active snapshot transaction, sys.dm_tran_active_snapshot_database_transactions" in ghosts
    assert "KILL 57" in ghosts
    index = lines["storage.index_bloat orders_meta_ready"]
    assert "ALTER INDEX ... REORGANIZE" in index and "version ghosts stay until the oldest active snapshot" in index
    assert "ALTER INDEX orders_meta_finished ON queuectl.orders_meta REBUILD" in lines[
        "storage.invalid_index orders_meta_finished"]
    assert "availability replica replica2" in lines["blockers.replication_slot replica2"]
    assert "KILL '7f1c0d5e-1111-2222-3333-444455556666' WITH COMMIT" in text
    assert "(sys.dm_tran_locks)" in lines["queue.probe stuck"]
    assert "REORGANIZE of its clustered index" in lines["storage.table_bloat orders_meta"]
    for word in POSTGRESQL_ONLY:
        assert word not in text, word


def test_mssql_ghosts_without_a_holder_point_to_ghost_cleanup_and_reorganize():
    f = facts("mssql")
    f.sessions = []
    [line] = [c.advice for c in evaluate(f, HealthOptions()) if c.id == "storage.dead_tuples"]
    assert "wait for the ghost cleanup task" in line and "queuectl reorganize orders" in line
    assert "VACUUM" not in line
    f.words = adapter_for("postgresql").advice_words
    [line] = [c.advice for c in evaluate(f, HealthOptions()) if c.id == "storage.dead_tuples"]
    assert "run VACUUM (ANALYZE) queuectl.orders_meta" in line and "never vacuumed" in line


@pytest.mark.parametrize("engine", ["postgresql", "mssql"])
def test_summaries_use_the_engines_words(engine):
    checks = {c.id: c for c in evaluate(facts(engine), HealthOptions())}
    dead = checks["storage.dead_tuples"].summary
    session = checks["blockers.session"].summary
    if engine == "mssql":
        assert dead == "250k ghost / 1,000 live"
        assert "holds ghost cleanup back" in session
        assert checks["blockers.replication_slot"].summary.startswith("availability replica, NOT SYNCHRONIZING")
    else:
        assert dead == "250k dead / 1,000 live" and "holds the xmin horizon" in session
        assert checks["blockers.replication_slot"].summary.startswith("physical slot, INACTIVE")


def _waiting_advice(live: int, dead: int, options: list[str] | None = None, autovacuum_on: bool = True) -> str:
    """PostgreSQL's advice on dead tuples that no transaction holds back."""
    f = facts("postgresql")
    f.sessions, f.prepared_xacts = [], []
    f.server["autovacuum_on"] = autovacuum_on
    f.tables[0].update(n_live_tup=live, n_dead_tup=dead, autovacuum_options=options)
    [line] = [c.advice for c in evaluate(f, HealthOptions()) if c.id == "storage.dead_tuples"]
    return line


def test_dead_tuples_past_the_tables_own_trigger_say_autovacuum_has_not_run_yet():
    """A queue table vacuums at 1000 dead tuples (scale factor 0): lowering that is no advice."""
    line = _waiting_advice(1000, 250_000, ["autovacuum_vacuum_threshold=1000", "autovacuum_vacuum_scale_factor=0"])
    assert line.startswith("orders_meta: 250k dead tuples (100%), never vacuumed: autovacuum has not run on this table "
                           "since they passed the 1,000 at which it starts here (threshold 1000 + scale_factor 0 x "
                           "1,000 live tuples, this table's settings); it looks every 60 s")
    assert "run VACUUM (ANALYZE) queuectl.orders_meta if this cannot wait" in line and "lower" not in line


def test_dead_tuples_below_the_servers_trigger_say_to_lower_it():
    """With the server's 50 + 0.2 x live, 10M live tuples let 2M dead ones pile up before autovacuum."""
    line = _waiting_advice(10_000_000, 250_000)
    assert ("autovacuum starts only at 2,000,050 dead tuples here (threshold 50 + scale_factor 0.2 x 10,000,000 "
            "live tuples, the server's settings): run VACUUM (ANALYZE) queuectl.orders_meta") in line
    assert line.endswith("if it recurs, lower autovacuum_vacuum_threshold / scale_factor for this table")


def test_dead_tuples_with_autovacuum_off_say_so():
    assert "autovacuum is off on this server: run VACUUM (ANALYZE) queuectl.orders_meta, and turn autovacuum on" in (
        _waiting_advice(1000, 250_000, autovacuum_on=False))
    assert "autovacuum is off for this table (autovacuum_enabled=false)" in _waiting_advice(
        1000, 250_000, ["autovacuum_enabled=false"])
