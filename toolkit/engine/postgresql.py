"""PostgreSQL through psycopg 3: its adapter, its index upkeep and the words of its advice.

Skip locked rows with FOR UPDATE SKIP LOCKED, read destructively with UPDATE/DELETE ...
RETURNING, wake consumers with LISTEN/NOTIFY; measure indexes with pgstattuple, rebuild
them with REINDEX INDEX CONCURRENTLY, then VACUUM (ANALYZE); advise on dead tuples and
the xmin horizon.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError

from queuectl.engine.base import (
    Adapter, AdviceWords, Fmt, IndexMeasure, IndexUpkeep, Leftover, ServerAbilities, Target, Thresholds, num,
    statements_watched, through_sqlalchemy,
)
from queuectl.engine.urls import error_text, first_line, sqlstate
from queuectl.errors import QueuectlError
from queuectl.names import quote_ident
from queuectl.sqlfiles import split_statements

APPLICATION_NAME = "queuectl"        # the sessions' application_name unless the URL or PGAPPNAME sets one
FRESH_LEAF_DENSITY = 90.0           # a freshly built PostgreSQL B-tree's leaves (default fillfactor 90)
LEFTOVER = re.compile(r"_cc(new|old)[0-9]*$")


class BinaryArray(list):
    """A list that psycopg sends as one array parameter in binary format (Adapter.payload_array)."""


def _register_binary_array() -> None:
    # On psycopg's global map, before any connection copies it; `%s` (AUTO) placeholders,
    # as SQLAlchemy renders them, then pick the binary dumper for this class only.
    try:
        import psycopg
        from psycopg.types.array import ListBinaryDumper
    except ImportError:  # a SQL Server-only installation
        return
    psycopg.adapters.register_dumper(BinaryArray, ListBinaryDumper)


_register_binary_array()


class DriverResult:
    """A driver cursor's rows behind the CursorResult calls the clients make (keys, all,
    scalar_one, scalars), for statements run by Adapter.client_statement."""

    __slots__ = ("_cursor",)

    def __init__(self, cursor: object) -> None:
        self._cursor = cursor

    def keys(self) -> list[str]:
        # From the PGresult: cursor.description builds a Column object per column on
        # every call (30 us of an 11-column dequeue's client CPU, cProfile).
        result = self._cursor.pgresult
        return [result.fname(i).decode() for i in range(result.nfields)]

    def all(self) -> list[tuple]:
        return self._cursor.fetchall()

    def scalars(self) -> list[object]:
        return [row[0] for row in self._cursor.fetchall()]

    def scalar_one(self) -> object:
        return _one(self._cursor.fetchall())


def _one(rows: list[tuple]) -> object:
    if len(rows) != 1:
        raise sa.exc.NoResultFound("no row") if not rows else sa.exc.MultipleResultsFound("more than one row")
    return rows[0][0]


class FetchedResult:
    """An async cursor's rows, fetched, behind the same calls as DriverResult."""

    __slots__ = ("_keys", "_rows")

    def __init__(self, keys: list[str], rows: list[tuple]) -> None:
        self._keys, self._rows = keys, rows

    def keys(self) -> list[str]:
        return self._keys

    def all(self) -> list[tuple]:
        return self._rows

    def scalars(self) -> list[object]:
        return [row[0] for row in self._rows]

    def scalar_one(self) -> object:
        return _one(self._rows)


class DriverStatement:
    """One client call's statement, compiled once by SQLAlchemy, executed on the driver's
    own connection under the SQLAlchemy Connection that holds it.

    SQLAlchemy's execution layer (execution context, result metadata, row processing)
    costs more client CPU than the driver call itself: a dequeue(1) + ack took 184 us of
    client CPU through Connection.execute, 102 us this way, 77 us on psycopg alone, and
    the full cycle at batch 1 (4 producers, 4 consumers, 2 cores) ran 1.28x the same
    client through Connection.execute.
    Errors come back as SQLAlchemy's DBAPIError, and a lost connection invalidates the
    SQLAlchemy Connection, as Connection.execute would do, so callers handle both paths
    alike."""

    __slots__ = ("sql", "_dialect", "_hide_parameters")

    def __init__(self, engine: Engine, clause: sa.TextClause) -> None:
        self.sql = clause.compile(dialect=engine.dialect).string
        self._dialect = engine.dialect
        self._hide_parameters = engine.hide_parameters

    def __call__(self, conn: sa.Connection, params: dict[str, object]) -> DriverResult:
        driver = conn.connection.driver_connection
        try:
            return DriverResult(driver.execute(self.sql, params))
        except self._dialect.loaded_dbapi.Error as orig:
            error = self.error(orig, driver, params)
            if error.connection_invalidated:
                conn.invalidate(orig)
            raise error from orig

    def error(self, orig: Exception, driver: Any, params: dict[str, object]) -> DBAPIError:
        """The driver's error as SQLAlchemy's DBAPIError, connection_invalidated when the
        connection is lost."""
        dbapi_error = self._dialect.loaded_dbapi.Error
        return DBAPIError.instance(
            self.sql, params, orig, dbapi_error, hide_parameters=self._hide_parameters,
            connection_invalidated=self._dialect.is_disconnect(orig, driver, None), dialect=self._dialect,
        )


class AsyncDriverStatement(DriverStatement):
    """A client call's statement on psycopg's AsyncConnection (queuectl.client.aio): the
    same compiled text and the same errors as DriverStatement; the caller drops a
    connection whose error says connection_invalidated."""

    async def run(self, driver: Any, params: dict[str, object]) -> FetchedResult:
        try:
            cursor = await driver.execute(self.sql, params)
            result = cursor.pgresult
            keys = [] if result is None else [result.fname(i).decode() for i in range(result.nfields)]
            return FetchedResult(keys, await cursor.fetchall() if keys else [])
        except self._dialect.loaded_dbapi.Error as orig:
            raise self.error(orig, driver, params) from orig


@dataclass(frozen=True)
class PostgresAdapter(Adapter):
    """PostgreSQL through psycopg 3."""

    @property
    def can_listen(self) -> bool:
        """Consumers can sleep until notified (LISTEN/NOTIFY)."""
        return True

    def split_batches(self, sql: str) -> list[str]:
        """One section's text as the units a driver executes one by one: on PostgreSQL the
        statements at top-level semicolons."""
        return split_statements(sql)

    def connect_args(self, url: URL) -> dict[str, object]:
        """Login timeout in seconds, so an unreachable server fails fast; and the sessions'
        application_name `queuectl` (what pg_stat_activity, the logs' %a and health's blocker
        lines show), unless the URL's `?application_name=` or libpq's PGAPPNAME names them."""
        args: dict[str, object] = {"connect_timeout": 10}
        if "application_name" not in url.query and not os.environ.get("PGAPPNAME"):
            args["application_name"] = APPLICATION_NAME
        return args

    def client_statement(self, engine: Engine, clause: sa.TextClause) -> Callable[[sa.Connection, dict], object]:
        """How a client runs one of its hot calls (enqueue, dequeue, ack, ...): on psycopg,
        straight on the driver connection (DriverStatement), unless someone watches the
        engine's statements (statements_watched): then through Connection.execute, so its
        log and its event listeners see every call. The result answers keys(), all(),
        scalar_one() and scalars()."""
        if statements_watched(engine):
            return through_sqlalchemy(clause)
        return DriverStatement(engine, clause)

    def check_asyncio(self) -> None:
        """psycopg has an asyncio connection: the asyncio clients run here."""

    def async_client_statement(self, engine: Engine, clause: sa.TextClause) -> AsyncDriverStatement:
        """How the asyncio client runs a call: on psycopg's AsyncConnection, one statement."""
        return AsyncDriverStatement(engine, clause)

    # -- what a failed statement means -------------------------------------------------

    # SQLSTATEs of a statement the server canceled and rolled back: query_canceled
    # (statement_timeout, pg_cancel_backend), lock_not_available (lock_timeout) and
    # deadlock_detected (the transaction the server chose to break a lock cycle, e.g. a
    # call against a migration that locks the queue's objects in another order).
    _CANCELED = ("57014", "55P03", "40P01")

    def payload_refusal(self, exc: DBAPIError) -> str | None:
        """The server's message when an enqueue refused an oversized payload (reliable_0003:
        SQLSTATE QC413), else None."""
        orig = exc.orig
        if sqlstate(exc) != "QC413":
            return None
        diag = getattr(orig, "diag", None)
        return getattr(diag, "message_primary", None) or first_line(orig)

    def canceled(self, exc: DBAPIError) -> bool:
        """The server canceled the statement (a timeout, a deadlock): it rolled back whole."""
        return sqlstate(exc) in self._CANCELED

    # undefined table or column: a call that started on the queue's old objects while
    # an upgrade or downgrade replaced them (reliable_0012 drops and renames what the earlier
    # revisions' bodies read); the statement failed whole
    _SCHEMA_CHANGED = ("42P01", "42703")

    def schema_changed(self, exc: DBAPIError) -> bool:
        state = sqlstate(exc)
        if state == "23514":  # an earlier body's insert into the partitioned meta table, without its slot
            diag = getattr(exc.orig, "diag", None)
            return (getattr(diag, "message_primary", None) or "").startswith("no partition of relation")
        return state in self._SCHEMA_CHANGED

    def isolation_refusal(self, exc: DBAPIError) -> str | None:
        """The server's message when a queue's call refused a REPEATABLE READ or SERIALIZABLE
        transaction (SQLSTATE QC400: reliable_0012, ring_0008, watermark_0005), else None."""
        orig = exc.orig
        if sqlstate(exc) != "QC400":
            return None
        diag = getattr(orig, "diag", None)
        return getattr(diag, "message_primary", None) or first_line(orig)

    # -- how the client's values travel ------------------------------------------------

    def list_param(self, values: list) -> object:
        """A list as one bind value: a PostgreSQL array."""
        return values

    def id_array(self, ids: list[int]) -> object:
        """The client's item ids (always CAST to bigint[] in its SQL) as one bind value, in
        binary format: psycopg's text format formats and checks every element in Python."""
        return BinaryArray(ids)

    def payload_array(self, payloads: list[bytes]) -> object:
        """Payloads (bytea[]) as one bind value in binary format. In text format psycopg
        escapes every element in Python (a regex substitution per element) and the server
        parses the hex back: 1.6 ms of client CPU per 100 x 300 B against 0.18 ms in binary."""
        return BinaryArray(payloads)

    def json_value(self, value: object) -> object:
        """A JSON column as Python: psycopg already decodes jsonb."""
        return value

    def enqueue_many_params(self, items: list[dict[str, object]], max_attempts: int | None) -> dict[str, object]:
        """enqueue_many's bind values from per-item dicts (payload bytes, headers JSON text,
        priority, delay seconds, title): parallel arrays on PostgreSQL.

        An array holding only defaults goes as NULL (the function pads it with defaults):
        adapting and sending three arrays per batch was a fifth of a producer's time (py-spy).
        Delays are formatted with fixed decimals: `f"{7e-05} seconds"` is not an interval.
        """
        priorities = [item["priority"] for item in items]
        delays = [item["delay"] for item in items]
        titles = [item["title"] for item in items]
        with_headers = any(item["headers"] is not None for item in items)
        return {
            "payloads": self.payload_array([item["payload"] for item in items]),
            "headers": [item["headers"] for item in items] if with_headers else None,
            "priorities": priorities if any(priorities) else None,
            "delays": [f"{d:.6f} seconds" for d in delays] if any(delays) else None,
            "titles": titles if any(t is not None for t in titles) else None,
            "max_attempts": max_attempts,
        }

    def kind_enqueue_many_params(
        self,
        payloads: list[bytes],
        headers: list[str | None] | None,
        due_ats: list[datetime | None] | None = None,
        delays: list[float] | None = None,
    ) -> dict[str, object]:
        """enqueue_many's bind values for the other kinds (queuectl.client.kinds): payloads, headers
        JSON texts, and for pending queues due times (aware, UTC) and delays in seconds;
        parallel arrays on PostgreSQL."""
        params: dict[str, object] = {"payloads": self.payload_array(payloads), "headers": headers}
        if delays is not None:
            params.update(due_ats=due_ats, delays=[timedelta(seconds=d) for d in delays])
        return params

    @property
    def advice_words(self) -> "PostgresWords":
        """VACUUM, pg_terminate_backend, replication slots, ..."""
        return PostgresWords()

    @property
    def index_upkeep(self) -> "PostgresIndexUpkeep":
        """pgstatindex, REINDEX CONCURRENTLY and VACUUM."""
        return PostgresIndexUpkeep()


class PostgresWords(AdviceWords):
    """Dead tuples, VACUUM, the xmin horizon, pg_terminate_backend, replication slots,
    COMMIT PREPARED."""

    dead = "dead tuples"
    session = "pid"
    locks_view = "pg_locks"
    exclusive_lock = "ACCESS EXCLUSIVE mode (DDL, VACUUM FULL, REINDEX?)"
    invalid_index_summary = "invalid index (leftover of an interrupted build or REINDEX CONCURRENTLY)"
    no_holder = "no open transaction holds cleanup back"
    keep_off_live_tables = ("keep dumps and reports off the live tables (pg_dump --exclude-table-data, read history "
                            "instead)")

    def holder(self, h: dict[str, Any], duration: Fmt) -> str:
        return f"pid {h['pid']} (open {duration(h['xact_age_s'])})"

    def end_session(self, pid: Any) -> str:
        return f"run SELECT pg_terminate_backend({pid})"

    def dead_rows_held(self, name: str, count: str, pct: float, holder: dict[str, Any], duration: Fmt) -> str:
        return (f"{name}: {count} dead tuples ({pct:.0f}%) that VACUUM cannot remove while "
                f"{self.holder(holder, duration)} holds the xmin horizon: end that transaction first")

    def dead_rows_waiting(self, t: dict[str, Any], count: str, pct: float, schema: str, since: str,
                          server: dict[str, Any]) -> str:
        """What keeps autovacuum from these dead tuples: it is off; they are below the point
        where it starts (lowering the settings helps); or they are past it and it has not come
        round yet (lowering them would change nothing)."""
        name = t["table_name"]
        head = f"{name}: {count} dead tuples ({pct:.0f}%), {since}"
        run_vacuum = f"run VACUUM (ANALYZE) {schema}.{name}"  # advice to read, not a statement queuectl sends
        own = dict(o.split("=", 1) for o in t.get("autovacuum_options") or [] if not o.startswith("toast."))
        if not server["autovacuum_on"] or own.get("autovacuum_enabled", "on").lower() in ("off", "false", "no", "0"):
            where = ("on this server" if not server["autovacuum_on"]
                     else f"for this table (autovacuum_enabled={own['autovacuum_enabled']})")
            return f"{head}, and autovacuum is off {where}: {run_vacuum}, and turn autovacuum on"
        threshold = float(own.get("autovacuum_vacuum_threshold", server["autovacuum_vacuum_threshold"]))
        scale = float(own.get("autovacuum_vacuum_scale_factor", server["autovacuum_vacuum_scale_factor"]))
        live = t["n_live_tup"] or 0
        starts_at = threshold + scale * live
        settings = (f"threshold {threshold:g} + scale_factor {scale:g} x {live:,} live tuples, "
                    f"{'this table' if 'autovacuum_vacuum_threshold' in own or 'autovacuum_vacuum_scale_factor' in own else 'the server'}'s settings")
        if (t["n_dead_tup"] or 0) > starts_at:
            return (f"{head}: autovacuum has not run on this table since they passed the {starts_at:,.0f} at which it "
                    f"starts here ({settings}); it looks every {server['autovacuum_naptime_s']} s when a worker is free "
                    f"(autovacuum_max_workers): {run_vacuum} if this cannot wait")
        return (f"{head}: autovacuum starts only at {starts_at:,.0f} dead tuples here ({settings}): {run_vacuum}; "
                f"if it recurs, lower autovacuum_vacuum_threshold / scale_factor for this table")

    def table_bloat(self, t: dict[str, Any], bloat: float, size: str) -> str:
        return (f"table {t['table_name']} ~{bloat:.0f}% bloated ({size} with {bloat:.0f}% free beyond "
                f"fillfactor {t['fillfactor']}): new rows reuse it; to shrink the file rewrite the table online "
                "with pg_repack (or VACUUM FULL in a quiet window)")

    def invalid_index(self, ix: dict[str, Any], schema: str) -> str:
        name = ix["index_name"]
        return (f"index {name} is invalid: writes still maintain it but no query uses it: "
                f"DROP INDEX CONCURRENTLY {schema}.{name} (queuectl reorganize {ix['queue']} cleans leftovers)")

    def index_bloat(self, ix: dict[str, Any], bloat: float, detail: str, command: str, holder: dict[str, Any] | None,
                    duration: Fmt) -> str:
        """`command` is the reorganize command that rebuilds this index (REINDEX CONCURRENTLY)."""
        wait = (f", after ending {self.holder(holder, duration)}: the rebuild waits for older snapshots"
                if holder else "")
        return f"index {ix['index_name']} {bloat:.0f}% bloated ({detail}): run {command}{wait}"

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


def estimated_bloat_pct(pages: int, internal_pages: int, leaf_pages: int, leaf_density: float | None) -> float:
    """Share of a PostgreSQL B-tree's pages a fresh build would not need (the metapage stays)."""
    if pages <= 1:
        return 0.0
    density = min(leaf_density or 0.0, FRESH_LEAF_DENSITY)
    needed = 1 + max(1.0, (internal_pages + leaf_pages) * density / FRESH_LEAF_DENSITY)
    return round(max(0.0, 100.0 * (1 - needed / pages)), 2)


def decide_postgresql(m: IndexMeasure, c: Thresholds) -> tuple[str, str]:
    """rebuild | watch | ok | small | not measured, and why (the measurements that drove it).

    Rebuild at or above the rebuild thresholds (estimated bloat or leaf fragmentation,
    the classic 30 %) when the index has at least min_pages pages; "watch" from watch_pct
    (PostgreSQL has no light REORGANIZE: the VACUUM step is the light fix)."""
    if m.bloat_pct is None:
        return "not measured", "no pgstatindex measurement (pgstattuple missing or not a B-tree)"
    frag = m.leaf_fragmentation or 0.0
    shown = f"bloat {m.bloat_pct:.0f} %, leaf density {m.leaf_density or 0:.0f} %, fragmentation {frag:.0f} %"
    if m.pages < c.min_pages:
        return "small", f"{m.pages} pages < {c.min_pages} ({shown})"
    if m.bloat_pct >= c.rebuild_bloat_pct or frag >= c.rebuild_fragmentation_pct:
        return "rebuild", f"{shown}: at or above {c.rebuild_bloat_pct:g} % / {c.rebuild_fragmentation_pct:g} %"
    if m.bloat_pct >= c.watch_pct or frag >= c.watch_pct:
        return "watch", f"{shown}: above {c.watch_pct:g} %, below the rebuild thresholds"
    return "ok", shown


# -- the index upkeep ---------------------------------------------------------------------------


class PostgresIndexUpkeep(IndexUpkeep):
    """pgstatindex, REINDEX INDEX CONCURRENTLY, VACUUM (ANALYZE)."""

    table_step_section = "vacuum_table"
    table_step_error = "vacuum"            # "vacuum meta: <error>"
    table_step_done = "vacuumed"
    clean_after_failure = True             # a failed REINDEX CONCURRENTLY leaves *_ccnew: drop it now
    leftover_words = ("drop", "dropped")
    sizes_only_note = "pgstattuple is not installed: sizes only (a real run creates the extension)"
    unmeasured_note = "pgstattuple not installed: no physical numbers"
    inspect_extras: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def inspect_summary(s: dict[str, Any]) -> str:
        table = (s.get("details") or {}).get("main_table", "meta")  # the kind's first upkeep table
        text = (f"{table} {s.get('meta_live_tuples')} live / {s.get('meta_dead_tuples')} dead tuples, "
                f"oldest xmin age {s.get('oldest_xmin_age') or 0} xids")
        if s.get("oldest_xmin_holder"):
            text += f" (held by {s['oldest_xmin_holder']})"
        return text

    def prepare(self, conn: Connection, target: Target, *, create: bool) -> ServerAbilities:
        """Find pgstattuple; create it when allowed (a real reorganize run)."""
        found = conn.execute(target.sql("pgstattuple_schema")).scalar()
        if found is None and create:
            try:
                conn.execute(target.sql("create_pgstattuple"))
            except DBAPIError as exc:
                # Another runner (another queue's reorganize) may have created it meanwhile.
                found = conn.execute(target.sql("pgstattuple_schema")).scalar()
                if found is None:
                    raise QueuectlError(
                        "reorganize measures indexes with the pgstattuple extension, which is not installed "
                        f"and this role cannot create it ({error_text(exc)}): ask a superuser to run "
                        "CREATE EXTENSION pgstattuple in this database"
                    ) from None
            else:
                found = conn.execute(target.sql("pgstattuple_schema")).scalar()
        if found is None:
            return ServerAbilities(measured=False)
        return ServerAbilities(measure_with=quote_ident(found))

    def leftovers(self, conn: Connection, target: Target, table: str, notes: list[str],
                  c: Thresholds) -> list[Leftover]:
        """INVALID indexes an interrupted REINDEX CONCURRENTLY left: *_ccnew (the new copy)
        and *_ccold (the old one), both dropped with DROP INDEX CONCURRENTLY."""
        found: list[Leftover] = []
        for row in self.indexes(conn, target, table):
            if row["valid"] or not LEFTOVER.search(row["index_name"]):
                if not row["valid"]:
                    notes.append(f"invalid index {row['index_name']} is not a REINDEX leftover: left alone")
                continue
            statement = target.sql("drop_index_concurrently", index=quote_ident(row["index_name"]))
            found.append(Leftover(table, row["index_name"], row["bytes"], statement, "drop", "dropped"))
        return found

    def measure(self, conn: Connection, target: Target, can: ServerAbilities, table: str, row: Any) -> IndexMeasure:
        size, pages = row["bytes"], row["pages"]
        measure = IndexMeasure(bytes=size, pages=pages)
        if can.measure_with is None or row["method"] != "btree":
            return measure
        index_name = f"{quote_ident(target.names.schema)}.{quote_ident(row['index_name'])}"
        m = conn.execute(target.sql("index_measure", pgstattuple_schema=can.measure_with),
                         {"index_name": index_name}).mappings().one()
        block = size // pages if pages else 8192
        measure.bytes = int(m["index_size"])
        measure.pages = int(m["index_size"]) // block
        measure.leaf_pages, measure.internal_pages = int(m["leaf_pages"]), int(m["internal_pages"])
        measure.empty_pages, measure.deleted_pages = int(m["empty_pages"]), int(m["deleted_pages"])
        measure.leaf_density = num(m["avg_leaf_density"])
        measure.leaf_fragmentation = num(m["leaf_fragmentation"])
        measure.bloat_pct = estimated_bloat_pct(measure.pages, measure.internal_pages, measure.leaf_pages,
                                                measure.leaf_density)
        return measure

    def measure_from_health(self, ix: dict[str, Any]) -> IndexMeasure:
        """pgstatindex's numbers as health read them (index_physical), judged as measure() does."""
        p = ix.get("physical") or {}
        size = int(p.get("index_size") or ix.get("index_bytes") or 0)
        measure = IndexMeasure(bytes=size, pages=size // 8192)
        if p.get("leaf_pages") is None or ix.get("method", "btree") != "btree":
            return measure
        measure.leaf_pages, measure.internal_pages = int(p["leaf_pages"]), int(p.get("internal_pages") or 0)
        measure.empty_pages, measure.deleted_pages = int(p.get("empty_pages") or 0), int(p.get("deleted_pages") or 0)
        measure.leaf_density = num(p.get("avg_leaf_density"))
        measure.leaf_fragmentation = num(p.get("leaf_fragmentation"))
        measure.bloat_pct = estimated_bloat_pct(measure.pages, measure.internal_pages, measure.leaf_pages,
                                                measure.leaf_density)
        return measure

    def table_physical(self, conn: Connection, target: Target, can: ServerAbilities, table: str) -> dict[str, Any]:
        """pgstattuple_approx of a table: its approx_free_percent and dead tuples."""
        row = conn.execute(target.sql("table_physical", pgstattuple_schema=can.measure_with),
                           {"table_name": target.names.qualified(table)}).mappings().one()
        return dict(row)

    def decide(self, m: IndexMeasure, c: Thresholds, can: ServerAbilities) -> tuple[str, str]:
        return decide_postgresql(m, c)

    def plan(self, target: Target, table: str, index: str, decision: str, c: Thresholds,
             can: ServerAbilities) -> list[sa.TextClause]:
        """The statements that carry out a decision: REINDEX CONCURRENTLY for a rebuild."""
        if decision != "rebuild":
            return []
        return [target.sql("reindex_concurrently", index=quote_ident(index))]

    def failure_prefix(self, decision: str) -> str:
        return "reindex"
