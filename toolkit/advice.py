"""The words of `queuectl health`'s advice, per engine (the adapter's `advice_words`).

queuectl.health grades the same facts on both engines (the SQL Server health sections
return PostgreSQL's columns); only what a DBA is told to do differs. PostgreSQL: dead
tuples, VACUUM, the xmin horizon, pg_terminate_backend, replication slots, COMMIT
PREPARED. SQL Server: ghost records and the ghost cleanup task, version ghosts kept for
the oldest active snapshot transaction (sys.dm_tran_active_snapshot_database_transactions)
and the version store, KILL <session id>, ALTER INDEX ... REORGANIZE, availability
replicas, in-doubt DTC transactions. Each method returns one line; the check decides
when it is shown.
"""

from __future__ import annotations

from typing import Any, Callable

Fmt = Callable[[Any], str]


class PostgresWords:
    dead = "dead tuples"
    session = "pid"
    locks_view = "pg_locks"
    exclusive_lock = "ACCESS EXCLUSIVE mode (DDL, VACUUM FULL, REINDEX?)"
    invalid_index_summary = "invalid index (leftover of an interrupted build or REINDEX CONCURRENTLY)"
    no_holder = "no open transaction holds cleanup back"

    def holder(self, h: dict[str, Any], duration: Fmt) -> str:
        return f"pid {h['pid']} (open {duration(h['xact_age_s'])})"

    def end_session(self, pid: Any) -> str:
        return f"run SELECT pg_terminate_backend({pid})"

    def dead_rows_held(self, name: str, count: str, pct: float, holder: dict[str, Any], duration: Fmt) -> str:
        return (f"{name}: {count} dead tuples ({pct:.0f}%) that VACUUM cannot remove while "
                f"{self.holder(holder, duration)} holds the xmin horizon: end that transaction first")

    def dead_rows_waiting(self, t: dict[str, Any], count: str, pct: float, schema: str, since: str) -> str:
        own = ", ".join(t.get("autovacuum_options") or []) or "the server's"
        return (f"{t['table_name']}: {count} dead tuples ({pct:.0f}%), {since}: run VACUUM (ANALYZE) "
                f"{schema}.{t['table_name']}; if it recurs, lower autovacuum_vacuum_threshold / scale_factor "
                f"for this table (its autovacuum settings now: {own})")

    def table_bloat(self, t: dict[str, Any], bloat: float, size: str) -> str:
        return (f"table {t['table_name']} ~{bloat:.0f}% bloated ({size} with {bloat:.0f}% free beyond "
                f"fillfactor {t['fillfactor']}): new rows reuse it; to shrink the file rewrite the table online "
                "with pg_repack (or VACUUM FULL in a quiet window)")

    def invalid_index(self, ix: dict[str, Any], schema: str) -> str:
        name = ix["index_name"]
        return (f"index {name} is invalid: writes still maintain it but no query uses it: "
                f"DROP INDEX CONCURRENTLY {schema}.{name} (queuectl reorganize {ix['queue']} cleans leftovers)")

    def index_bloat(self, ix: dict[str, Any], bloat: float, detail: str, holder: dict[str, Any] | None,
                    duration: Fmt) -> str:
        wait = (f", after ending {self.holder(holder, duration)}: the rebuild waits for older snapshots"
                if holder else "")
        return f"index {ix['index_name']} {bloat:.0f}% bloated ({detail}): run queuectl reorganize {ix['queue']}{wait}"

    def open_transaction_summary(self, age: str, label: str) -> str:
        return f"transaction open {age} holds the xmin horizon ({label})"

    def open_transaction(self, pid: Any, label: str, age: str, dead: str) -> str:
        return (f"transaction pid {pid} ({label}) open for {age} holds "
                f"{dead} dead tuples in queue tables: commit it or end it "
                f"(SELECT pg_terminate_backend({pid})); set idle_in_transaction_session_timeout for its role")

    def idle_in_transaction(self, pid: Any, label: str, age: str, holds: bool) -> str:
        return (f"session pid {pid} ({label}) idle in transaction for "
                f"{age}: it holds its locks{' and the xmin horizon' if holds else ''}; "
                f"fix the client or end it (SELECT pg_terminate_backend({pid}))")

    def oldest_transaction(self, age: str, pid: Any) -> str:
        return f"oldest transaction {age} (pid {pid})"

    def slot_summary(self, slot: dict[str, Any], wal: str, count: Fmt) -> str:
        return (f"{slot['slot_type']} slot, {'active' if slot['active'] else 'INACTIVE'}, retains {wal} of WAL"
                + (f", xmin {count(slot['xmin_age_xids'])} xids old" if slot["xmin_age_xids"] is not None else ""))

    def slot(self, slot: dict[str, Any], wal: str) -> str:
        name = slot["slot_name"]
        holds = " and the xmin horizon of every database" if slot["xmin_age_xids"] is not None else ""
        return (f"replication slot {name} ({'inactive' if not slot['active'] else 'active'}) keeps {wal} of WAL"
                f"{holds}: if its consumer is gone, SELECT pg_drop_replication_slot('{name}')")

    def standby_summary(self, r: dict[str, Any], count: Fmt) -> str:
        return f"standby xmin {count(r['xmin_age_xids'])} xids old"

    def standby(self, r: dict[str, Any], count: Fmt) -> str:
        return (f"standby {r['application_name'] or r['client_addr']} (hot_standby_feedback) holds the horizon "
                f"{count(r['xmin_age_xids'])} xids back: cancel its long queries or lower max_standby_streaming_delay")

    def prepared_here(self, p: dict[str, Any], age: str, dead: str) -> str:
        gid = p["gid"]
        return (f"prepared transaction {gid!r} (owner {p['owner']}) waits for COMMIT PREPARED for "
                f"{age} and holds {dead} dead tuples: let its transaction "
                f"manager finish it, or COMMIT PREPARED / ROLLBACK PREPARED '{gid}'")

    def prepared_elsewhere(self, p: dict[str, Any], age: str) -> str:
        return (f"prepared transaction {p['gid']!r} in database {p['database']} ({age}) "
                "does not hold this database's queue tables, but holds shared catalogs: resolve it there")

    def sessions_hidden(self) -> str:
        return ("this role is not a member of pg_read_all_stats: other users' sessions show no "
                "transaction details, so cleanup blockers may be missed (GRANT pg_monitor TO ...)")


class MssqlWords(PostgresWords):
    dead = "ghost records"
    session = "session"
    locks_view = "sys.dm_tran_locks"
    exclusive_lock = "Sch-M or X mode (DDL, an offline rebuild, a table lock)"
    invalid_index_summary = "disabled index (no query uses it, writes do not maintain it)"
    no_holder = "no open transaction holds ghost cleanup back"

    def holder(self, h: dict[str, Any], duration: Fmt) -> str:
        return f"session {h['pid']} (open {duration(h['xact_age_s'])})"

    def end_session(self, pid: Any) -> str:
        return f"run KILL {pid}"

    def dead_rows_held(self, name: str, count: str, pct: float, holder: dict[str, Any], duration: Fmt) -> str:
        return (f"{name}: {count} ghost records ({pct:.0f}%) that ghost cleanup cannot remove while "
                f"{self.holder(holder, duration)} holds them (its own deletes, or as the oldest active snapshot "
                "transaction, sys.dm_tran_active_snapshot_database_transactions, the version ghosts): "
                f"commit or end it first (KILL {holder['pid']})")

    def dead_rows_waiting(self, t: dict[str, Any], count: str, pct: float, schema: str, since: str) -> str:
        return (f"{t['table_name']}: {count} ghost records ({pct:.0f}%) wait for the ghost cleanup task (a few "
                "pages every 5 s, none while trace flag 661 is on): if they keep growing, run queuectl reorganize "
                f"{t['queue']} (ALTER INDEX ... REORGANIZE removes ghosts as it compacts the pages)")

    def table_bloat(self, t: dict[str, Any], bloat: float, size: str) -> str:
        return (f"table {t['table_name']} ~{bloat:.0f}% free space ({size}, pages emptier than fill factor "
                f"{t['fillfactor']}): new rows reuse it; to compact it online run queuectl reorganize {t['queue']} "
                "(ALTER INDEX ... REORGANIZE of its clustered index)")

    def invalid_index(self, ix: dict[str, Any], schema: str) -> str:
        name = ix["index_name"]
        table = f"{ix['queue']}_{ix['suffix']}"
        return (f"index {name} is disabled: no query uses it and writes do not maintain it: enable it with "
                f"ALTER INDEX {name} ON {schema}.{table} REBUILD WITH (ONLINE = ON), or drop it")

    def index_bloat(self, ix: dict[str, Any], bloat: float, detail: str, holder: dict[str, Any] | None,
                    duration: Fmt) -> str:
        wait = (f", after ending {self.holder(holder, duration)}: version ghosts stay until the oldest active "
                "snapshot transaction ends" if holder else "")
        return (f"index {ix['index_name']} {bloat:.0f}% bloated ({detail}): run queuectl reorganize {ix['queue']} "
                f"(ALTER INDEX ... REORGANIZE, online){wait}")

    def open_transaction_summary(self, age: str, label: str) -> str:
        return f"transaction open {age} holds ghost cleanup back ({label})"

    def open_transaction(self, pid: Any, label: str, age: str, dead: str) -> str:
        return (f"transaction of session {pid} ({label}) open for {age} holds {dead} ghost records in queue "
                "tables (a snapshot transaction also keeps the version store from shrinking): commit it or end "
                f"it (KILL {pid})")

    def idle_in_transaction(self, pid: Any, label: str, age: str, holds: bool) -> str:
        return (f"session {pid} ({label}) idle in transaction for {age}: it holds its locks"
                f"{' and ghost cleanup' if holds else ''}; fix the client (commit, or SET XACT_ABORT ON so an "
                f"error rolls back) or end it (KILL {pid})")

    def oldest_transaction(self, age: str, pid: Any) -> str:
        return f"oldest transaction {age} (session {pid})"

    def slot_summary(self, slot: dict[str, Any], wal: str, count: Fmt) -> str:
        state = "synchronizing" if slot["active"] else "NOT SYNCHRONIZING"
        return f"availability replica, {state}, {wal} of log not sent"

    def slot(self, slot: dict[str, Any], wal: str) -> str:
        state = "synchronizing" if slot["active"] else "not synchronizing"
        return (f"availability replica {slot['slot_name']} ({state}) keeps {wal} of log in this database and, "
                "when readable, ghost cleanup behind its low-water mark: resume data movement (ALTER DATABASE "
                "... SET HADR RESUME) or remove the replica from the availability group")

    def standby_summary(self, r: dict[str, Any], count: Fmt) -> str:
        return f"readable secondary, ghost low-water mark {r['backend_xmin']}"

    def standby(self, r: dict[str, Any], count: Fmt) -> str:
        return (f"readable secondary {r['application_name'] or r['client_addr']} holds ghost cleanup on this "
                "primary through its ghost low-water mark: end its long queries there")

    def prepared_here(self, p: dict[str, Any], age: str, dead: str) -> str:
        gid = p["gid"]
        return (f"distributed transaction {gid} (owner {p['owner']}) prepared and in doubt for {age} holds its "
                f"locks and {dead} ghost records: let MS DTC resolve it, or KILL '{gid}' WITH COMMIT "
                "(or WITH ROLLBACK)")

    def prepared_elsewhere(self, p: dict[str, Any], age: str) -> str:
        return (f"distributed transaction {p['gid']} in database {p['database']} ({age}) does not hold this "
                f"database's queue tables: resolve it there (KILL '{p['gid']}' WITH COMMIT or WITH ROLLBACK)")

    def sessions_hidden(self) -> str:
        return ("this login lacks VIEW SERVER STATE: other sessions' transactions are not visible, so cleanup "
                "blockers may be missed (GRANT VIEW SERVER STATE TO ...)")
