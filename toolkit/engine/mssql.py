"""SQL Server through pyodbc and Microsoft's ODBC Driver 18: its adapter, its index upkeep
and the words of its advice.

Skip locked rows with WITH (UPDLOCK, READPAST, ROWLOCK), read destructively with
UPDATE/DELETE ... OUTPUT, pass lists as JSON read by OPENJSON; measure indexes with
sys.dm_db_index_physical_stats, keep them compact with ALTER INDEX ... REORGANIZE or
REBUILD WITH (ONLINE = ON) where the edition allows, then UPDATE STATISTICS; advise on
ghost records and the version store. Checked offline only (sqlfluff's tsql dialect).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError

from queuectl.engine.base import (
    Adapter, AdviceWords, Fmt, IndexMeasure, IndexUpkeep, Leftover, ServerAbilities, Target, Thresholds, num,
    through_sqlalchemy,
)
from queuectl.engine.urls import MSSQL_DRIVER, first_line
from queuectl.errors import ConnectionFailed, UsageError
from queuectl.names import quote_catalog_ident
from queuectl.sqlfiles import split_go_batches

MSODBC_HOWTO = (
    "install Microsoft's msodbcsql18 (Debian/Ubuntu: add packages.microsoft.com's apt repository, "
    "then `ACCEPT_EULA=Y apt-get install msodbcsql18 unixodbc`; see "
    "https://learn.microsoft.com/sql/connect/odbc/linux-mac/installing-the-microsoft-odbc-driver-for-sql-server)"
)


def _odbc_message(exc: DBAPIError) -> str:
    """pyodbc errors carry (sqlstate, message): the message's first line."""
    args = getattr(exc.orig, "args", ())
    text = args[1] if len(args) > 1 and isinstance(args[1], str) else str(exc.orig or "")
    return first_line(text) if text.strip() else ""


@dataclass(frozen=True)
class MssqlAdapter(Adapter):
    """SQL Server through pyodbc and Microsoft's ODBC Driver 18."""

    def client_statement(self, engine: Engine, clause: sa.TextClause) -> Callable[[sa.Connection, dict], object]:
        """Through SQLAlchemy's Connection.execute: its text() turns the named binds into
        pyodbc's `?` markers, and nobody has measured pyodbc's own cost here."""
        return through_sqlalchemy(clause)

    def split_batches(self, sql: str) -> list[str]:
        """Batches separated by `GO` lines, as sqlcmd and SSMS split them (a CREATE
        PROCEDURE must be alone in its batch)."""
        return split_go_batches(sql)

    def check_driver(self, url: URL) -> None:
        try:
            import pyodbc
        except ModuleNotFoundError:
            raise ConnectionFailed(
                "SQL Server needs the pyodbc package: pip install 'queuectl[mssql]', and " + MSODBC_HOWTO
            ) from None
        except ImportError as exc:  # pyodbc is there but the unixODBC library is not
            raise ConnectionFailed(
                f"pyodbc cannot load ({first_line(exc)}): no ODBC driver manager: " + MSODBC_HOWTO
            ) from None
        wanted = url.query.get("driver", MSSQL_DRIVER)
        if wanted not in pyodbc.drivers():
            found = ", ".join(pyodbc.drivers()) or "none"
            raise ConnectionFailed(
                f"ODBC driver {wanted!r} is not installed (installed: {found}): " + MSODBC_HOWTO
            )

    def connect_args(self, url: URL) -> dict[str, object]:
        """pyodbc's login timeout. The session's program_name is the URL's to set (`&APP=queuectl`:
        SQLAlchemy passes query keys it does not know into the ODBC connection string)."""
        return {"timeout": 10}

    def payload_refusal(self, exc: DBAPIError) -> str | None:
        """THROW 50413 in the enqueue procedures; the message without ODBC's [..] prefixes."""
        text = _odbc_message(exc)
        if "(50413)" not in text:
            return None
        return re.sub(r"^(\[[^\]]*\]\s*)+", "", text).split(" (50413)")[0]

    def canceled(self, exc: DBAPIError) -> bool:
        """Lock request time out (1222), chosen as a deadlock victim (1205) or the client's
        query timeout (HYT00)."""
        args = getattr(exc.orig, "args", ())
        text = _odbc_message(exc)
        return (bool(args) and args[0] == "HYT00") or "(1222)" in text or "(1205)" in text

    def list_param(self, values: list) -> object:
        """ODBC has no arrays: a JSON array, read by OPENJSON in the procedures."""
        return json.dumps(values)

    def id_array(self, ids: list[int]) -> object:
        """Item ids as a JSON array, like any list here."""
        return self.list_param(ids)

    def json_value(self, value: object) -> object:
        """JSON columns are nvarchar on SQL Server."""
        return json.loads(value) if isinstance(value, str) else value

    def enqueue_many_params(self, items: list[dict[str, object]], max_attempts: int | None) -> dict[str, object]:
        """One JSON array of item objects; payloads as hex (CONVERT style 2 decodes them)."""
        doc = [
            {
                "payload": bytes(item["payload"]).hex(),
                "headers": None if item["headers"] is None else json.loads(item["headers"]),
                "priority": item["priority"],
                "delay": item["delay"],
                "title": item["title"],
            }
            for item in items
        ]
        return {"items": json.dumps(doc), "max_attempts": max_attempts}

    def kind_enqueue_many_params(
        self,
        payloads: list[bytes],
        headers: list[str | None] | None,
        due_ats: list[datetime | None] | None = None,
        delays: list[float] | None = None,
    ) -> dict[str, object]:
        """One JSON array of item objects, read by OPENJSON in the kinds' enqueue_many
        procedures: payload as hex, headers as JSON, due_at as naive UTC (datetime2), delay."""
        doc: list[dict[str, object]] = []
        for i, payload in enumerate(payloads):
            item: dict[str, object] = {
                "payload": bytes(payload).hex(),
                "headers": None if headers is None or headers[i] is None else json.loads(headers[i]),
            }
            if delays is not None:
                due = None if due_ats is None else due_ats[i]
                item["due_at"] = None if due is None else due.astimezone(timezone.utc).replace(tzinfo=None).isoformat()
                item["delay"] = delays[i]
            doc.append(item)
        return {"items": json.dumps(doc)}

    def install_report(self, conn: sa.Connection) -> str | None:
        """READ_COMMITTED_SNAPSHOT and ALLOW_SNAPSHOT_ISOLATION of the connected database
        (catalog.sql: row_versioning), as row_versioning_report words them."""
        row = conn.execute(sa.text(self._sql("catalog", "row_versioning"))).one()
        return row_versioning_report(row.database_name, bool(row.is_read_committed_snapshot_on),
                                     row.snapshot_isolation_state_desc)

    def review_script_notes(self) -> list[str]:
        """What the installed queue's calls do under either setting, and the query that shows
        the database's (run it where the script will run)."""
        query = " ".join(line for line in self._sql("catalog", "row_versioning").splitlines()
                         if not line.lstrip().startswith("--"))
        return [
            "Row versioning: " + ROW_VERSIONING_BOTH,
            "See the database's settings with: " + " ".join(query.split()) + ";",
        ]

    @property
    def advice_words(self) -> "MssqlWords":
        """Ghost records, the version store, KILL <session>, ALTER INDEX ... REORGANIZE."""
        return MssqlWords()

    @property
    def index_upkeep(self) -> "MssqlIndexUpkeep":
        """sys.dm_db_index_physical_stats, ALTER INDEX ... REORGANIZE / REBUILD (ONLINE,
        RESUMABLE where the edition allows) and UPDATE STATISTICS."""
        return MssqlIndexUpkeep()


# What the claims do under either read committed setting: they are locking reads (UPDLOCK, or
# READCOMMITTEDLOCK where a read only looks), so READPAST skips rows in flight whether the
# database reads row versions or not (sql/mssql/reliable.sql: create_dequeue).
ROW_VERSIONING_BOTH = (
    "queuectl's claims and locking reads carry lock hints (UPDLOCK with READPAST, or READCOMMITTEDLOCK) that "
    "behave the same whether READ_COMMITTED_SNAPSHOT is on or off; with it ON, your own READ COMMITTED reads "
    "of queue tables see the last committed rows (an item a consumer has taken but not committed still shows), "
    "with it OFF they wait for consumers' open transactions; under SNAPSHOT isolation queuectl's calls fail "
    "(READPAST: error 650): call them at READ COMMITTED"
)


def row_versioning_report(database: str, rcsi_on: bool, snapshot_state: str) -> str:
    """The line `queuectl install` prints about the database's row versioning: which
    READ_COMMITTED_SNAPSHOT setting it has, that queuectl's claims behave the same under
    either, what the user's own reads see, and, where SNAPSHOT isolation is allowed, that
    queuectl's calls must not run under it (READPAST raises error 650 there)."""
    if rcsi_on:
        line = (f"database {database!r} has READ_COMMITTED_SNAPSHOT ON (Azure SQL's default): queuectl's claims "
                "and locking reads carry lock hints (UPDLOCK with READPAST, or READCOMMITTEDLOCK) and skip or wait "
                "for rows in flight as with it off; your own READ COMMITTED reads of queue tables see the last "
                "committed rows, so an item a consumer has taken but not committed still shows as waiting")
    else:
        line = (f"database {database!r} has READ_COMMITTED_SNAPSHOT OFF: queuectl's claims and locking reads carry "
                "lock hints that behave the same with it on or off; your own READ COMMITTED reads of queue tables "
                "take shared locks and wait for rows consumers hold until they commit")
    if snapshot_state in ("ON", "IN_TRANSITION_TO_ON"):
        line += ("; ALLOW_SNAPSHOT_ISOLATION is ON: call queuectl at READ COMMITTED, never under SNAPSHOT "
                 "isolation (its READPAST hints raise error 650 there)")
    return line


class MssqlWords(AdviceWords):
    """Ghost records and the ghost cleanup task, version ghosts kept for the oldest active
    snapshot transaction (sys.dm_tran_active_snapshot_database_transactions) and the version
    store, KILL <session id>, ALTER INDEX ... REORGANIZE, availability replicas, in-doubt DTC
    transactions."""

    dead = "ghost records"
    session = "session"
    locks_view = "sys.dm_tran_locks"
    exclusive_lock = "Sch-M or X mode (DDL, an offline rebuild, a table lock)"
    invalid_index_summary = "disabled index (no query uses it, writes do not maintain it)"
    no_holder = "no open transaction holds ghost cleanup back"
    keep_off_live_tables = "keep reports off the live tables (read history instead) and their transactions short"

    def holder(self, h: dict[str, Any], duration: Fmt) -> str:
        return f"session {h['pid']} (open {duration(h['xact_age_s'])})"

    def end_session(self, pid: Any) -> str:
        return f"run KILL {pid}"

    def dead_rows_held(self, name: str, count: str, pct: float, holder: dict[str, Any], duration: Fmt) -> str:
        return (f"{name}: {count} ghost records ({pct:.0f}%) that ghost cleanup cannot remove while "
                f"{self.holder(holder, duration)} holds them (its own deletes, or as the oldest active snapshot "
                "transaction, sys.dm_tran_active_snapshot_database_transactions, the version ghosts): "
                f"commit or end it first (KILL {holder['pid']})")

    def dead_rows_waiting(self, t: dict[str, Any], count: str, pct: float, schema: str, since: str,
                          server: dict[str, Any]) -> str:
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

    def index_bloat(self, ix: dict[str, Any], bloat: float, detail: str, command: str, holder: dict[str, Any] | None,
                    duration: Fmt) -> str:
        """`command` is the reorganize command that acts on this index."""
        wait = (f", after ending {self.holder(holder, duration)}: version ghosts stay until the oldest active "
                "snapshot transaction ends" if holder else "")
        return (f"index {ix['index_name']} {bloat:.0f}% bloated ({detail}): run {command} "
                f"(ALTER INDEX ... REORGANIZE, or REBUILD WITH (ONLINE = ON) past its fragmentation limit){wait}")

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


def minutes(seconds: float) -> int:
    """A time limit in whole minutes for ALTER INDEX's MAX_DURATION: rounded up, at least 1."""
    return max(1, math.ceil(seconds / 60))


def decide_mssql(m: IndexMeasure, c: Thresholds, can: ServerAbilities) -> tuple[str, str]:
    """rebuild | reorganize | skipped | ok | small | not measured, and why.

    The Books Online rules (reference dba.md 1.8; Ola Hallengren's defaults): leaf
    fragmentation from watch_pct (5 %) to rebuild_fragmentation_pct (30 %): REORGANIZE;
    above: REBUILD WITH (ONLINE = ON) where the edition has online index operations, else
    REORGANIZE (and the reason says so). Microsoft's current guidance weighs page density
    more than fragmentation for a small hot table: a leaf level below min_page_density_pct
    full (of the index's fill factor: min_page_density_pct x fill_factor / 100) is
    reorganized too (REORGANIZE compacts toward the fill factor). Indexes under
    min_pages are left alone; REORGANIZE fails when page locks are disallowed, so such an
    index is skipped unless it can be rebuilt online."""
    if m.leaf_fragmentation is None:
        return "not measured", "no sys.dm_db_index_physical_stats measurement (not a rowstore B-tree)"
    frag = m.leaf_fragmentation
    density = m.leaf_density
    shown = f"fragmentation {frag:.0f} %"
    if density is not None:
        shown += f", page density {density:.0f} %"
    if m.ghost_rows is not None:
        shown += f", {m.ghost_rows} ghost / {m.version_ghost_rows or 0} version ghost records"
    if m.pages < c.min_pages:
        return "small", f"{m.pages} pages < {c.min_pages} ({shown})"
    high = frag >= c.rebuild_fragmentation_pct
    if high and can.online_rebuild:
        how = "online, resumable" if can.resumable_rebuild and c.resumable else "online"
        return "rebuild", f"{shown}: at or above {c.rebuild_fragmentation_pct:g} % ({how})"
    # "Full" is relative to the index's own fill factor: a ring's slots are built at
    # FILLFACTOR 20 on purpose (sql/mssql/ring.sql), and REORGANIZE compacts only toward it.
    fill = m.fill_factor or 100
    floor = c.min_page_density_pct * fill / 100
    sparse = density is not None and density < floor
    if not (high or sparse or frag >= c.watch_pct):
        return "ok", shown
    if high:
        why = (f"at or above {c.rebuild_fragmentation_pct:g} %, but this edition has no online rebuild: "
               "reorganizing instead")
    elif frag >= c.watch_pct:
        why = f"from {c.watch_pct:g} % to {c.rebuild_fragmentation_pct:g} %"
    else:
        why = (f"pages less than {c.min_page_density_pct:g} % full" if fill == 100 else
               f"pages less than {floor:g} % full ({c.min_page_density_pct:g} % of fill factor {fill})")
    if m.allow_page_locks is False:
        return "skipped", f"{shown}: {why}; but ALLOW_PAGE_LOCKS is OFF, so REORGANIZE would fail: left alone"
    return "reorganize", f"{shown}: {why}"


# -- the index upkeep ---------------------------------------------------------------------------


class MssqlIndexUpkeep(IndexUpkeep):
    """sys.dm_db_index_physical_stats, ALTER INDEX ... REORGANIZE / REBUILD, UPDATE STATISTICS."""

    table_step_section = "update_statistics_table"
    table_step_error = "update statistics"
    table_step_done = "updated statistics of"
    clean_after_failure = False            # a cut resumable rebuild pauses: the next run resumes it
    leftover_words = ("resume", "resumed")
    sizes_only_note = ""
    unmeasured_note = ""
    # What keeps version ghosts alive, beside the snapshot (details only: no columns).
    inspect_extras = (("version_store", "version_store"), ("snapshot_holders", "snapshot_holders"))

    @staticmethod
    def inspect_summary(s: dict[str, Any]) -> str:
        table = (s.get("details") or {}).get("main_table", "meta")  # the kind's first upkeep table
        text = (f"{table} {s.get('meta_live_tuples')} live / {s.get('meta_dead_tuples')} ghost records, "
                f"oldest cleanup holder open {s.get('oldest_xact_seconds') or 0:g} s")
        if s.get("oldest_xmin_holder"):
            text += f" ({s['oldest_xmin_holder']})"
        return text

    def prepare(self, conn: Connection, target: Target, *, create: bool) -> ServerAbilities:
        row = conn.execute(target.sql("index_capabilities")).mappings().one()
        return ServerAbilities(online_rebuild=bool(row["online_rebuild"]),
                               resumable_rebuild=bool(row["resumable_rebuild"]))

    def leftovers(self, conn: Connection, target: Target, table: str, notes: list[str],
                  c: Thresholds) -> list[Leftover]:
        """Paused resumable rebuilds: every write maintains both copies until it finishes."""
        found: list[Leftover] = []
        for row in self.indexes(conn, target, table):
            if not row["valid"]:
                notes.append(f"index {row['index_name']} is disabled: left alone (ALTER INDEX ... REBUILD enables it)")
        rows = conn.execute(target.sql("paused_rebuilds"), {"table_name": target.names.qualified(table)}).mappings()
        for row in rows:
            try:
                statement = self._statement(target, table, row["index_name"], "resume_rebuild", c)
            except UsageError as exc:
                notes.append(f"paused rebuild of {row['index_name']!r} left alone: {exc}")
                continue
            found.append(Leftover(table, row["index_name"], int(row["bytes"] or 0), statement, "resume", "resumed"))
        return found

    def measure(self, conn: Connection, target: Target, can: ServerAbilities, table: str, row: Any) -> IndexMeasure:
        measure = IndexMeasure(bytes=int(row["bytes"] or 0), pages=int(row["pages"] or 0))
        if row["method"] != "btree" or not row["valid"]:
            return measure
        m = conn.execute(target.sql("index_measure"),
                         {"table_name": target.names.qualified(table), "index_name": row["index_name"]}).mappings().one()
        return self.measure_row(measure, m)

    def measure_row(self, measure: IndexMeasure, m: Any) -> IndexMeasure:
        """Fill a measure from one index_measure row (sys.dm_db_index_physical_stats)."""
        if m["leaf_pages"] is None:
            return measure
        measure.leaf_pages = int(m["leaf_pages"])
        measure.pages = measure.leaf_pages
        measure.leaf_density = num(m["avg_page_space_used_in_percent"])
        measure.leaf_fragmentation = num(m["avg_fragmentation_in_percent"])
        measure.ghost_rows = None if m["ghost_record_count"] is None else int(m["ghost_record_count"])
        measure.version_ghost_rows = (None if m["version_ghost_record_count"] is None
                                      else int(m["version_ghost_record_count"]))
        measure.allow_page_locks = bool(m["allow_page_locks"])
        measure.fill_factor = int(m["fill_factor"])
        return measure

    def measure_from_health(self, ix: dict[str, Any]) -> IndexMeasure:
        """sys.dm_db_index_physical_stats' leaf numbers as health read them (index_physical)."""
        p = ix.get("physical") or {}
        measure = IndexMeasure(bytes=int(ix.get("index_bytes") or 0), pages=int(p.get("leaf_pages") or 0))
        if p.get("leaf_pages") is None:
            return measure
        fragmentation = p.get("avg_fragmentation_in_percent", p.get("leaf_fragmentation"))
        density = p.get("avg_page_space_used_in_percent", p.get("avg_leaf_density"))
        measure.leaf_pages = int(p["leaf_pages"])
        measure.leaf_density = num(density)
        measure.leaf_fragmentation = num(fragmentation)
        measure.ghost_rows = None if p.get("ghost_record_count") is None else int(p["ghost_record_count"])
        measure.version_ghost_rows = (None if p.get("version_ghost_record_count") is None
                                      else int(p["version_ghost_record_count"]))
        measure.fill_factor = int(ix.get("fillfactor") or 100)
        return measure

    def table_physical(self, conn: Connection, target: Target, can: ServerAbilities, table: str) -> dict[str, Any]:
        row = conn.execute(target.sql("table_physical"), {"table_name": target.names.qualified(table)}).mappings().one()
        return dict(row)

    def decide(self, m: IndexMeasure, c: Thresholds, can: ServerAbilities) -> tuple[str, str]:
        return decide_mssql(m, c, can)

    def plan(self, target: Target, table: str, index: str, decision: str, c: Thresholds,
             can: ServerAbilities) -> list[sa.TextClause]:
        """REORGANIZE then UPDATE STATISTICS of the index (REORGANIZE leaves them as they
        were); REBUILD ONLINE, resumable where the server can and the config allows.
        Raises UsageError for an index name queuectl will not quote."""
        if decision == "reorganize":
            return [self._statement(target, table, index, "reorganize_index", c),
                    self._statement(target, table, index, "update_index_statistics", c)]
        if decision == "rebuild":
            section = "rebuild_index_resumable" if can.resumable_rebuild and c.resumable else "rebuild_index_online"
            return [self._statement(target, table, index, section, c)]
        return []

    def failure_prefix(self, decision: str) -> str:
        return decision  # "rebuild <index>: ...", "reorganize <index>: ..."

    @staticmethod
    def _statement(target: Target, table: str, index: str, section: str, c: Thresholds) -> sa.TextClause:
        """One upkeep statement for an index: its name quoted from the catalog, the queue's
        table from validated names, the time limits in whole minutes (the lock wait from
        lock_timeout, a resumable rebuild's run from statement_timeout)."""
        return target.sql(section, index=quote_catalog_ident(index), table=target.names.qualified(table),
                          max_wait_minutes=minutes(c.lock_timeout), max_duration_minutes=minutes(c.statement_timeout))
