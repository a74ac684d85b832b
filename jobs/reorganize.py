"""reorganize: keep the queue's indexes compact online, acting only above thresholds.

Every index of the queue's upkeep tables (queuectl.kindspec.UPKEEP_TABLES: a reliable
queue's meta and data, the destructive kinds' items table, a watermark queue's one-row
hint, the ring's slots) is measured and judged against the classic
5 % / 30 % rules (Paul Randal's numbers for SQL Server Books Online, "a starting point,
not a law"), with a minimum size below which an index is left alone. The engine decides
how (the adapter's `index_upkeep`, in queuectl.engine.postgresql and queuectl.engine.mssql):

  * PostgreSQL: pgstattuple's `pgstatindex` (leaf density, leaf fragmentation, page
    classes, size). Estimated bloat = share of the index's pages a fresh build would not
    need (leaf density against a fresh B-tree's, fillfactor 90, and the empty/deleted
    pages). Rebuild when bloat or leaf fragmentation >= 30 % and the index has >= 1000
    pages (8 MB): `REINDEX INDEX CONCURRENTLY` under `lock_timeout` and a
    `statement_timeout`; between 5 % and 30 %: "watch" (no light REORGANIZE: the VACUUM
    (ANALYZE) step is the light fix); under 5 %: "ok". An interrupted REINDEX
    CONCURRENTLY leaves an INVALID *_ccnew (the new copy) or *_ccold (the old one): both
    are dropped with DROP INDEX CONCURRENTLY, right after a failed rebuild, and first
    thing in every run.
  * SQL Server: sys.dm_db_index_physical_stats (fragmentation, page density, ghost and
    version-ghost records). `ALTER INDEX ... REORGANIZE` (+ UPDATE STATISTICS of the
    index) from 5 % fragmentation or a leaf level less than 70 % of its fill factor full
    (a ring's slots, built at FILLFACTOR 20, are judged against 14 %); above 30 %
    `REBUILD WITH (ONLINE = ON (WAIT_AT_LOW_PRIORITY ...), RESUMABLE = ON, MAX_DURATION =
    ...)` where the edition allows (else REORGANIZE, and the reason says so); then UPDATE
    STATISTICS of both tables. A rebuild paused by its time limit is resumed first.

The table step (VACUUM (ANALYZE) / UPDATE STATISTICS) runs on each upkeep table, or, with
`vacuum_min_dead`, only on those with that many dead rows (the scheduler's measured
`upkeep` job for the DELETE-drained kinds: a quiet queue is measured, not vacuumed).

`dry_run` measures and reports what it would do and changes nothing (on PostgreSQL it
does not even create the pgstattuple extension).

A lost connection (a terminated backend, a server restart) ends the pass: the run is
failed with that first error (`connection_lost`). On PostgreSQL a new connection, tried for
up to RECONNECT_S, drops the leftovers the interrupted rebuild left (when the server stays
away longer, the next run drops them first); on SQL Server the cut resumable rebuild pauses
and the next run resumes it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from queuectl.engine import adapter_for, connect_within
from queuectl.engine.base import Adapter, IndexMeasure, ServerAbilities
from queuectl.engine.urls import error_text
from queuectl.errors import UsageError
from queuectl.jobs.base import JobTarget, check_number
from queuectl.kindspec import KINDS as KIND_NAMES
from queuectl.names import DEFAULT_SCHEMA
from queuectl.thresholds import (
    MIN_INDEX_PAGES, MIN_PAGE_DENSITY_PCT, REBUILD_BLOAT_PCT, REBUILD_FRAGMENTATION_PCT, WATCH_PCT,
)

log = logging.getLogger("queuectl.jobs.reorganize")

KINDS = KIND_NAMES                  # every kind: its tables are kindspec.UPKEEP_TABLES[kind]
DEFAULT_LOCK_TIMEOUT = 5.0          # above deadlock_timeout (1 s), so a blocking autovacuum yields first
DEFAULT_STATEMENT_TIMEOUT = 600.0   # time limit for one REINDEX / VACUUM; a resumable rebuild's MAX_DURATION
RECONNECT_S = 30.0                  # after a lost connection, how long to try for one to clean up on
ACTION_DONE = {"rebuild": "rebuilt", "reorganize": "reorganized"}


@dataclass(frozen=True)
class ReorganizeConfig:
    dry_run: bool = False
    min_pages: int = MIN_INDEX_PAGES
    rebuild_bloat_pct: float = REBUILD_BLOAT_PCT
    rebuild_fragmentation_pct: float = REBUILD_FRAGMENTATION_PCT
    watch_pct: float = WATCH_PCT
    min_page_density_pct: float = MIN_PAGE_DENSITY_PCT
    resumable: bool = True            # SQL Server: rebuild RESUMABLE where the server can
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT
    vacuum: bool = True
    # The table step runs on a table only from this many dead rows (its statistics'
    # n_dead_tup; SQL Server: ghost + version-ghost records); 0: on every table, every run.
    vacuum_min_dead: int = 0

    DURATIONS = ("lock_timeout", "statement_timeout")

    def __post_init__(self) -> None:
        if not all(isinstance(v, bool) for v in (self.dry_run, self.vacuum, self.resumable)):
            raise UsageError("dry-run, vacuum and resumable must be true or false")
        check_number("min_pages", self.min_pages, 0, 2**31, integer=True)
        check_number("vacuum_min_dead", self.vacuum_min_dead, 0, 2**62, integer=True)
        for name in ("rebuild_bloat_pct", "rebuild_fragmentation_pct", "watch_pct", "min_page_density_pct"):
            check_number(name, getattr(self, name), 0, 100)
        check_number("lock_timeout", self.lock_timeout, 0.001, 3600)
        check_number("statement_timeout", self.statement_timeout, 0.001, 24 * 3600)


@dataclass
class IndexReport:
    table: str
    index: str
    decision: str                     # rebuild | reorganize | watch | skipped | ok | small | not measured
    reason: str
    before: IndexMeasure
    after: IndexMeasure | None = None
    action: str | None = None         # rebuilt | reorganized | would rebuild | would reorganize | failed
    statements: list[str] = field(default_factory=list)  # what it ran (or would run)
    error: str | None = None


@dataclass
class ReorganizeResult:
    dry_run: bool
    indexes: list[IndexReport] = field(default_factory=list)
    leftovers: list[dict[str, Any]] = field(default_factory=list)
    vacuumed: list[str] = field(default_factory=list)  # tables of the table step (VACUUM / UPDATE STATISTICS)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    connection_lost: bool = False     # the pass ended early: its connection was lost (see errors)
    # The engine's adapter: its index upkeep words the summary (shown as the dialect's name).
    adapter: Adapter = field(default_factory=lambda: adapter_for("postgresql"), repr=False)

    @property
    def rows(self) -> int:
        """Indexes rebuilt or reorganized."""
        return sum(1 for i in self.indexes if i.action in ("rebuilt", "reorganized"))

    @property
    def error(self) -> str | None:
        return "; ".join(self.errors) if self.errors else None

    def summary(self) -> str:
        upkeep = self.adapter.index_upkeep
        verbs = ("would rebuild", "would reorganize") if self.dry_run else ("rebuilt", "reorganized")
        parts = []
        for verb in verbs:
            acted = [i for i in self.indexes if i.action == verb]
            if verb != verbs[0] and not acted:
                continue
            part = f"{verb} {len(acted)} of {len(self.indexes)} indexes"
            if acted:
                part += " (" + ", ".join(
                    f"{i.index} {_mb(i.before.bytes)}" + (f" -> {_mb(i.after.bytes)}" if i.after else "") for i in acted
                ) + ")"
            parts.append(part)
        text = "; ".join(parts)
        handled = [entry for entry in self.leftovers if entry["action"] != "failed"]
        if handled:
            verb, done = upkeep.leftover_words
            text += f"; {'would ' + verb if self.dry_run else done} {len(handled)} leftover index(es)"
        if self.vacuumed:
            text += f"; {upkeep.table_step_done} " + ", ".join(self.vacuumed)
        if self.errors:
            text += f"; {len(self.errors)} error(s)"
        return text

    def as_dict(self) -> dict[str, Any]:
        shown = asdict(replace(self, adapter=None))
        del shown["adapter"]
        return {**shown, "engine": self.adapter.dialect}


def _mb(n: int) -> str:
    return f"{n / 1048576:.1f} MB" if n >= 1048576 else f"{n / 1024:.0f} kB"


def plan_index(upkeep: Any, target: Any, table: str, index: str, before: IndexMeasure, config: ReorganizeConfig,
               can: ServerAbilities) -> tuple[IndexReport, list]:
    """Judge one measured index and render the statements that carry the decision out, without
    a connection: the report (statements as text, action "would ..." on a dry run) and the
    statements to execute. A catalog name queuectl will not quote fails this index only."""
    decision, reason = upkeep.decide(before, config, can)
    report = IndexReport(table, index, decision, reason, before)
    if decision not in ACTION_DONE:
        return report, []
    try:
        statements = upkeep.plan(target, table, index, decision, config, can)
    except UsageError as exc:
        report.action, report.error = "failed", str(exc)
        return report, []
    report.statements = [str(statement) for statement in statements]
    if config.dry_run:
        report.action = f"would {decision}"
    return report, statements


class _Reorganizer:
    """One pass: prepare, deal with leftovers, measure, decide, act, the table step,
    measure again. Everything engine-specific is asked of the adapter's index_upkeep."""

    def __init__(self, engine: Engine, queue: str | JobTarget, config: ReorganizeConfig, schema: str) -> None:
        self.engine = engine
        self.config = config
        self.upkeep = adapter_for(engine).index_upkeep
        self.target = JobTarget.resolve(engine, queue, schema, KINDS)
        self.result = ReorganizeResult(dry_run=config.dry_run, adapter=adapter_for(engine))
        self.can = ServerAbilities()

    def drop_leftovers(self, conn: Connection, table: str) -> None:
        for leftover in self.upkeep.leftovers(conn, self.target, table, self.result.notes, self.config):
            entry: dict[str, Any] = {"table": table, "index": leftover.index, "bytes": leftover.bytes}
            if self.config.dry_run:
                entry["action"] = f"would {leftover.verb}"
            else:
                try:
                    conn.execute(leftover.statement)
                    entry["action"] = leftover.done
                except DBAPIError as exc:
                    entry["action"], entry["error"] = "failed", error_text(exc, self.engine)
                    self.result.errors.append(f"{leftover.verb} {leftover.index}: {entry['error']}")
                    if exc.connection_invalidated:
                        self.result.leftovers.append(entry)  # recorded before the lost connection ends the pass
                        raise
            log.info("reorganize %s: %s leftover index %s", self.target.names.queue, entry["action"], leftover.index)
            self.result.leftovers.append(entry)

    def run(self, stop: threading.Event | None) -> ReorganizeResult:
        started = time.monotonic()
        try:
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                self.run_pass(conn, stop)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            self.after_lost_connection(exc)
        self.result.seconds = time.monotonic() - started
        return self.result

    def after_lost_connection(self, exc: DBAPIError) -> None:
        """The pass ends failed with the first error; a new connection drops the leftovers."""
        self.result.connection_lost = True
        reason = error_text(exc, self.engine)
        if not any(reason in error for error in self.result.errors):
            self.result.errors.append(f"connection lost: {reason}")
        if self.config.dry_run or not self.upkeep.clean_after_failure:  # SQL Server: the next run resumes
            return
        log.warning("reorganize %s: connection lost (%s): reconnecting to drop what an interrupted rebuild left",
                    self.target.names.queue, reason)
        try:
            with connect_within(self.engine, RECONNECT_S) as conn:
                self.target.set_session_timeouts(conn, self.config.lock_timeout, self.config.statement_timeout)
                for table in self.target.tables:
                    self.drop_leftovers(conn, table)
        except DBAPIError as again:
            self.result.notes.append(f"no connection to clean up on within {RECONNECT_S:g} s "
                                     f"({error_text(again, self.engine)}): the next run drops the leftovers first")

    def run_pass(self, conn: Connection, stop: threading.Event | None) -> None:
        c = self.config
        self.target.set_session_timeouts(conn, c.lock_timeout, c.statement_timeout)
        self.can = self.upkeep.prepare(conn, self.target, create=not c.dry_run)
        if not self.can.measured:
            self.result.notes.append(self.upkeep.sizes_only_note)
        for table in self.target.tables:
            self.drop_leftovers(conn, table)
        for table in self.target.tables:
            for row in self.upkeep.indexes(conn, self.target, table):
                if not row["valid"]:
                    continue
                before = self.upkeep.measure(conn, self.target, self.can, table, row)
                report, statements = plan_index(self.upkeep, self.target, table, row["index_name"], before, c,
                                                self.can)
                self.result.indexes.append(report)
                if report.error:
                    self.result.errors.append(f"{report.decision} {report.index}: {report.error}")
                if not statements or c.dry_run:
                    continue
                if stop is not None and stop.is_set():
                    report.action, report.error = "failed", f"stop requested before the {report.decision}"
                else:
                    self.act(conn, table, report, statements)
        if not c.dry_run and c.vacuum:
            for table, statement in self.upkeep.table_step(self.target):
                try:
                    if c.vacuum_min_dead and not self.enough_dead_rows(conn, table):
                        continue
                    conn.execute(statement)
                    self.result.vacuumed.append(self.target.names.table(table))
                except DBAPIError as exc:
                    self.result.errors.append(f"{self.upkeep.table_step_error} {table}: {error_text(exc, self.engine)}")
                    if exc.connection_invalidated:
                        raise
        if not c.dry_run:
            for report in self.result.indexes:
                size_row = next((r for r in self.upkeep.indexes(conn, self.target, report.table)
                                 if r["index_name"] == report.index), None)
                if size_row is not None:
                    report.after = self.upkeep.measure(conn, self.target, self.can, report.table, size_row)

    def enough_dead_rows(self, conn: Connection, table: str) -> bool:
        """Whether the table has vacuum_min_dead dead rows (table_vitals); a table it skips
        gets a note with its count."""
        row = conn.execute(self.target.sql("table_vitals"),
                           {"table_name": self.target.names.qualified(table)}).mappings().first()
        dead = int((row or {}).get("n_dead_tup") or 0)
        if dead >= self.config.vacuum_min_dead:
            return True
        self.result.notes.append(f"{self.upkeep.table_step_error} {table} skipped: {dead:,} dead rows "
                                 f"< {self.config.vacuum_min_dead:,}")
        return False

    def act(self, conn: Connection, table: str, report: IndexReport, statements: list) -> None:
        t0 = time.monotonic()
        try:
            for statement in statements:
                conn.execute(statement)
            report.action = ACTION_DONE[report.decision]
            log.info("reorganize %s: %s %s in %.1f s", self.target.names.queue, report.action, report.index,
                     time.monotonic() - t0)
        except DBAPIError as exc:
            report.action, report.error = "failed", error_text(exc, self.engine)
            self.result.errors.append(f"{self.upkeep.failure_prefix(report.decision)} {report.index}: {report.error}")
            log.warning("reorganize %s: %s of %s failed: %s", self.target.names.queue, report.decision, report.index,
                        report.error)
            if exc.connection_invalidated:
                raise
            if self.upkeep.clean_after_failure:
                # The interrupted rebuild left its *_ccnew copy behind: remove it now, not next time.
                self.drop_leftovers(conn, table)


def run_once(
    engine: Engine,
    queue: str | JobTarget,
    config: ReorganizeConfig | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    stop: threading.Event | None = None,
) -> ReorganizeResult:
    return _Reorganizer(engine, queue, config or ReorganizeConfig(), schema).run(stop)
