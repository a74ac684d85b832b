"""The engine wing's interface: what every database adapter answers, and the data its
index upkeep shares with the reorganize and inspect jobs.

One module per database implements it (queuectl.engine.postgresql, queuectl.engine.mssql);
queuectl.engine maps a dialect name to its adapter. Code above the wing asks the adapter
"how do I say this on this server" and is written once:

  question                  PostgreSQL                        SQL Server
  run a client's hot call   on psycopg's own connection       through SQLAlchemy
  a list as one parameter   an array (binary format)          JSON text, read by OPENJSON
  measure an index          pgstattuple's pgstatindex          sys.dm_db_index_physical_stats
  what to do with it        rebuild above 30 % bloat or        REORGANIZE from 5 % fragmentation
                            fragmentation, watch from 5 %      (or low page density), REBUILD
                                                               ONLINE (resumable) above 30 %
                                                               where the edition allows
  the online fix            REINDEX INDEX CONCURRENTLY         ALTER INDEX ... REORGANIZE /
                                                               REBUILD WITH (ONLINE = ON, ...)
  leftovers of a cut run    INVALID *_ccnew / *_ccold: drop    paused resumable rebuild: resume
  the table step after it   VACUUM (ANALYZE)                   UPDATE STATISTICS
  health's advice           VACUUM, pg_terminate_backend       ghost cleanup, KILL <session>

`decide` is a pure function of the measurements and the thresholds on both engines, and
`plan` renders the exact statements from sql/<engine>/jobs.sql without a connection, so
both are tested without a server (tests/test_jobs_upkeep.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError

from queuectl.errors import UsageError
from queuectl.sqlfiles import render

if TYPE_CHECKING:
    from queuectl.names import QueueNames

Fmt = Callable[[Any], str]


def through_sqlalchemy(clause: sa.TextClause) -> Callable[[sa.Connection, dict], sa.CursorResult]:
    """A client call run by SQLAlchemy's Connection.execute (the other form of a
    client_statement)."""
    return lambda conn, params: conn.execute(clause, params)



# What watches an engine's statements: SQLAlchemy's log (echo=True, or the
# sqlalchemy.engine logger set to INFO) and listeners of these events, such as an
# OpenTelemetry instrumentation or a custom disconnect check.
_WATCHING_EVENTS = ("before_execute", "after_execute", "before_cursor_execute", "after_cursor_execute")
_ENGINE_LOGGER = "sqlalchemy.engine.Engine"


def statements_watched(engine: Engine) -> bool:
    """Whether the engine logs its statements or has execution or error listeners (also
    ones set on the Engine class), when a client is created. Such a client keeps
    SQLAlchemy's execution path, which costs it client CPU (DriverStatement) but skips no
    one's log or instrumentation."""
    if engine.echo or logging.getLogger(_ENGINE_LOGGER).isEnabledFor(logging.INFO):
        return True
    if len(engine.dialect.dispatch.handle_error):
        return True
    return any(len(getattr(engine.dispatch, name)) for name in _WATCHING_EVENTS)


@dataclass(frozen=True)
class Adapter:
    """What differs per engine, in one place.

    Statements come from sql/<sql_dir>/*.sql like all other SQL; this class only knows
    which file holds them, how a section splits into batches, and what the driver needs.
    """

    dialect: str
    sql_dir: str
    # On SQL Server a review script (`install --sql`) never connects: it is the complete
    # script, written for a DBA who may review it on a machine without the ODBC driver.
    # On PostgreSQL it starts from the database's current catalog version when a URL is given.
    review_script_connects: bool = True

    @property
    def can_listen(self) -> bool:
        """Consumers can sleep until notified (LISTEN/NOTIFY); elsewhere they poll (queuectl.worker)."""
        return False

    def _sql(self, file: str, section: str, values: dict[str, str | int] | None = None) -> str:
        return render(self.sql_dir, file, section, values or {})

    def split_batches(self, sql: str) -> list[str]:
        """One section's text as the units a driver executes one by one."""
        raise NotImplementedError

    def check_driver(self, url: URL) -> None:
        """Fail with one line saying what to install when the DBAPI driver cannot load."""

    def connect_args(self, url: URL) -> dict[str, object]:
        """The driver's connect arguments for `url`: a login timeout, so an unreachable server
        fails fast, and where the driver takes one a session name a DBA can find."""
        raise NotImplementedError

    def client_statement(self, engine: Engine, clause: sa.TextClause) -> Callable[[sa.Connection, dict], object]:
        """How a client runs one of its hot calls (enqueue, dequeue, ack, ...). The result
        answers keys(), all(), scalar_one() and scalars()."""
        return through_sqlalchemy(clause)

    def check_asyncio(self) -> None:
        """Fail with one line where the driver has no asyncio connection (the asyncio
        clients, queuectl.client.aio, run on PostgreSQL's psycopg only)."""
        raise UsageError(f"the asyncio clients speak PostgreSQL only, not {self.dialect}: use the blocking clients")

    def async_client_statement(self, engine: Engine, clause: sa.TextClause) -> Any:
        """How the asyncio client runs a call (after check_asyncio)."""
        raise NotImplementedError

    # -- what a failed statement means -------------------------------------------------

    def payload_refusal(self, exc: DBAPIError) -> str | None:
        """The server's message when an enqueue refused an oversized payload, else None."""
        raise NotImplementedError

    def canceled(self, exc: DBAPIError) -> bool:
        """The server canceled the statement (a timeout): it rolled back whole."""
        raise NotImplementedError

    def schema_changed(self, exc: DBAPIError) -> bool:
        """The call failed because the queue's objects changed under it (a migration ran)."""
        return False

    def isolation_refusal(self, exc: DBAPIError) -> str | None:
        """The server's message when a call refused the caller's isolation level, else None."""
        return None

    # -- how the client's values travel ------------------------------------------------

    def list_param(self, values: list) -> object:
        """A list as one bind value."""
        raise NotImplementedError

    def id_array(self, ids: list[int]) -> object:
        """The client's item ids as one bind value."""
        raise NotImplementedError

    def json_value(self, value: object) -> object:
        """A JSON column's value as Python."""
        raise NotImplementedError

    def enqueue_many_params(self, items: list[dict[str, object]], max_attempts: int | None) -> dict[str, object]:
        """enqueue_many's bind values from per-item dicts (payload bytes, headers JSON text,
        priority, delay seconds, title)."""
        raise NotImplementedError

    def kind_enqueue_many_params(
        self,
        payloads: list[bytes],
        headers: list[str | None] | None,
        due_ats: list[datetime | None] | None = None,
        delays: list[float] | None = None,
    ) -> dict[str, object]:
        """enqueue_many's bind values for the other kinds (queuectl.client.kinds): payloads, headers
        JSON texts, and for pending queues due times (aware, UTC) and delays in seconds."""
        raise NotImplementedError

    # -- what install reports ----------------------------------------------------------

    def install_report(self, conn: sa.Connection) -> str | None:
        """One line on a database setting that changes how queuectl's statements, or the
        user's own reads of queue tables, behave here; read when a queue is installed. None
        where no setting does (PostgreSQL)."""
        return None

    def review_script_notes(self) -> list[str]:
        """Comment lines that open a review script made without a connection (`install
        --sql`): what install would have reported, and the query that shows it."""
        return []

    # -- maintenance and health --------------------------------------------------------

    @property
    def advice_words(self) -> "AdviceWords":
        """The words of health's advice on this engine."""
        raise NotImplementedError

    @property
    def index_upkeep(self) -> "IndexUpkeep":
        """How this engine measures, judges and maintains an index (the reorganize and
        inspect jobs' seam)."""
        raise NotImplementedError

    def storage_health(self, conn: sa.Connection, names: "QueueNames") -> list[dict[str, object]]:
        """Physical health of a queue's tables and indexes, one dict per index (or heap).

        Same keys on both engines: table_name, index_name, pages, live_rows, dead_rows (dead
        tuples / ghost records), version_dead_rows (version ghosts; None on PostgreSQL),
        fragmentation_pct, page_density_pct (None where the engine does not say cheaply).
        """
        sql = self._sql("storage", "storage_health", names.template_values())
        rows = conn.execute(sa.text(sql), {"schema": names.schema, "queue": names.queue}).mappings()
        return [dict(row) for row in rows]


# -- the words of health's advice -----------------------------------------------------------------


class AdviceWords:
    """What `queuectl health` tells a DBA to do, in the engine's own words (queuectl.health
    grades the same facts on both engines; only the words differ). Each method returns one
    line; the check decides when it is shown."""

    dead: str                    # what dead rows are called: dead tuples, ghost records
    session: str                 # what a server session's id is called
    locks_view: str
    exclusive_lock: str
    invalid_index_summary: str
    no_holder: str
    keep_off_live_tables: str    # how to keep long readers from holding a generation's tables

    def holder(self, h: dict[str, Any], duration: Fmt) -> str: raise NotImplementedError
    def end_session(self, pid: Any) -> str: raise NotImplementedError
    def dead_rows_held(self, name: str, count: str, pct: float, holder: dict[str, Any], duration: Fmt) -> str:
        raise NotImplementedError
    def dead_rows_waiting(self, t: dict[str, Any], count: str, pct: float, schema: str, since: str,
                          server: dict[str, Any]) -> str:
        raise NotImplementedError
    def table_bloat(self, t: dict[str, Any], bloat: float, size: str) -> str: raise NotImplementedError
    def invalid_index(self, ix: dict[str, Any], schema: str) -> str: raise NotImplementedError
    def index_bloat(self, ix: dict[str, Any], bloat: float, detail: str, command: str, holder: dict[str, Any] | None,
                    duration: Fmt) -> str:
        raise NotImplementedError
    def open_transaction_summary(self, age: str, label: str) -> str: raise NotImplementedError
    def open_transaction(self, pid: Any, label: str, age: str, dead: str) -> str: raise NotImplementedError
    def idle_in_transaction(self, pid: Any, label: str, age: str, holds: bool) -> str: raise NotImplementedError
    def oldest_transaction(self, age: str, pid: Any) -> str: raise NotImplementedError
    def slot_summary(self, slot: dict[str, Any], wal: str, count: Fmt) -> str: raise NotImplementedError
    def slot(self, slot: dict[str, Any], wal: str) -> str: raise NotImplementedError
    def standby_summary(self, r: dict[str, Any], count: Fmt) -> str: raise NotImplementedError
    def standby(self, r: dict[str, Any], count: Fmt) -> str: raise NotImplementedError
    def prepared_here(self, p: dict[str, Any], age: str, dead: str) -> str: raise NotImplementedError
    def prepared_elsewhere(self, p: dict[str, Any], age: str) -> str: raise NotImplementedError
    def sessions_hidden(self) -> str: raise NotImplementedError


# -- index upkeep ---------------------------------------------------------------------------------


class Thresholds(Protocol):
    """What decide() reads from the reorganize job's config."""

    min_pages: int
    rebuild_bloat_pct: float
    rebuild_fragmentation_pct: float
    watch_pct: float
    min_page_density_pct: float
    resumable: bool
    lock_timeout: float
    statement_timeout: float


class Target(Protocol):
    """queuectl.jobs.base.JobTarget: the queue's names and its rendered jobs.sql sections."""

    names: Any
    tables: tuple[str, ...]   # the suffixes of the queue's upkeep tables (kindspec.UPKEEP_TABLES)

    def sql(self, section: str, **extra: str | int) -> sa.TextClause: ...


@dataclass
class IndexMeasure:
    """One index as measured. PostgreSQL fills the pgstatindex fields (page classes, leaf
    density, leaf fragmentation, estimated bloat); SQL Server fills leaf_pages, leaf_density
    (avg_page_space_used_in_percent), leaf_fragmentation (avg_fragmentation_in_percent),
    ghost and version-ghost records, and whether page locks are allowed."""

    bytes: int
    pages: int
    leaf_pages: int | None = None
    internal_pages: int | None = None
    empty_pages: int | None = None
    deleted_pages: int | None = None
    leaf_density: float | None = None
    leaf_fragmentation: float | None = None
    bloat_pct: float | None = None
    ghost_rows: int | None = None
    version_ghost_rows: int | None = None
    allow_page_locks: bool | None = None
    fill_factor: int | None = None


@dataclass(frozen=True)
class Leftover:
    """An index a cut run left behind, with the statement that deals with it."""

    table: str
    index: str
    bytes: int
    statement: sa.TextClause
    verb: str          # drop | resume
    done: str          # dropped | resumed


@dataclass(frozen=True)
class ServerAbilities:
    """What the server can do online (SQL Server: by edition and version; PostgreSQL: always
    REINDEX CONCURRENTLY, nothing resumable)."""

    online_rebuild: bool = True
    resumable_rebuild: bool = False
    measure_with: str | None = None   # PostgreSQL: the quoted schema of pgstattuple, None when missing
    measured: bool = True              # False: sizes only


def num(value: Any) -> float | None:
    """A measurement as a rounded float; NULL and NaN (an empty index) as None."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else round(value, 2)


class IndexUpkeep:
    """How an engine measures, judges and maintains a queue's indexes online; the reorganize
    and inspect jobs are written once over it."""

    table_step_section: str                   # jobs.sql section run on each upkeep table after the indexes
    table_step_error: str                     # "vacuum meta: <error>"
    table_step_done: str
    clean_after_failure: bool                 # a failed rebuild leaves something to clean now
    leftover_words: tuple[str, str]           # (verb, past tense) for a cut run's leftovers
    sizes_only_note: str
    unmeasured_note: str
    inspect_extras: tuple[tuple[str, str], ...] = ()   # (detail key, jobs.sql section)

    @staticmethod
    def inspect_summary(s: dict[str, Any]) -> str:
        """One line of an inspect snapshot."""
        raise NotImplementedError

    def prepare(self, conn: Connection, target: Target, *, create: bool) -> ServerAbilities:
        """What the server can do, found once per run."""
        raise NotImplementedError

    def table_step(self, target: Target) -> list[tuple[str, sa.TextClause]]:
        """(table, statement) of the step after the indexes, for each of the queue's upkeep tables."""
        return [(table, target.sql(self.table_step_section, table=target.names.qualified(table)))
                for table in target.tables]

    def measure_from_health(self, ix: dict[str, Any]) -> IndexMeasure:
        """The measure decide() reads, from one index of a health report (its `physical`
        numbers, read by sql/<engine>/health.sql: index_physical), so health judges an
        index with the reorganize job's own rules."""
        raise NotImplementedError

    def indexes(self, conn: Connection, target: Target, table: str) -> list[sa.RowMapping]:
        return list(conn.execute(target.sql("table_indexes"), {"table_name": target.names.qualified(table)}).mappings())

    def leftovers(self, conn: Connection, target: Target, table: str, notes: list[str],
                  c: Thresholds) -> list[Leftover]:
        """Indexes a cut run left behind, each with the statement that deals with it."""
        raise NotImplementedError

    def measure(self, conn: Connection, target: Target, can: ServerAbilities, table: str, row: Any) -> IndexMeasure:
        raise NotImplementedError

    def table_physical(self, conn: Connection, target: Target, can: ServerAbilities, table: str) -> dict[str, Any]:
        raise NotImplementedError

    def decide(self, m: IndexMeasure, c: Thresholds, can: ServerAbilities) -> tuple[str, str]:
        """The decision for one index and why (the measurements that drove it)."""
        raise NotImplementedError

    def plan(self, target: Target, table: str, index: str, decision: str, c: Thresholds,
             can: ServerAbilities) -> list[sa.TextClause]:
        """The statements that carry out a decision."""
        raise NotImplementedError

    def failure_prefix(self, decision: str) -> str:
        raise NotImplementedError
