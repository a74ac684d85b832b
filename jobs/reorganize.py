"""reorganize: rebuild the queue's bloated indexes online, then VACUUM (ANALYZE).

Measures every index of the meta and data tables with pgstattuple's `pgstatindex` (leaf
density, leaf fragmentation, page classes, size) and acts only above thresholds, in the
spirit of the classic 5 % / 30 % rule (Paul Randal's numbers for SQL Server Books Online,
"a starting point, not a law"), with a minimum size below which an index is left alone:

  * estimated bloat = share of the index's pages a fresh build would not need, from the
    leaf density against a fresh B-tree's (fillfactor 90) and the empty/deleted pages;
  * rebuild when bloat or leaf fragmentation >= 30 % and the index has >= 1000 pages
    (8 MB): `REINDEX INDEX CONCURRENTLY` under `lock_timeout` and a `statement_timeout`;
  * between 5 % and 30 %: reported as "watch" (PostgreSQL has no light REORGANIZE; the
    VACUUM below is the light fix); under 5 %: "ok".

An interrupted REINDEX CONCURRENTLY leaves an INVALID index named *_ccnew (the new copy:
dropped, the rebuild is then retried) or *_ccold (the old one: dropped); both are removed
first with DROP INDEX CONCURRENTLY. `dry_run` measures and reports what it would do and
changes nothing (it does not even create the pgstattuple extension).
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from queuectl.errors import QueuectlError, UsageError
from queuectl.jobs.base import JobTarget, check_number, error_text
from queuectl.names import DEFAULT_SCHEMA, quote_ident

log = logging.getLogger("queuectl.jobs.reorganize")

KINDS = ("reliable",)
MIN_INDEX_PAGES = 1000              # smaller indexes are left alone (Randal / Ola Hallengren: 1000)
REBUILD_BLOAT_PCT = 30.0            # rebuild above this estimated bloat ...
REBUILD_FRAGMENTATION_PCT = 30.0    # ... or this leaf fragmentation (the classic 30 %)
WATCH_PCT = 5.0                     # report as "watch" above this (the classic 5 %)
FRESH_LEAF_DENSITY = 90.0           # a freshly built B-tree's leaves (default fillfactor 90)
DEFAULT_LOCK_TIMEOUT = 5.0          # above deadlock_timeout (1 s), so a blocking autovacuum yields first
DEFAULT_STATEMENT_TIMEOUT = 600.0   # time limit for one REINDEX / VACUUM
LEFTOVER = re.compile(r"_cc(new|old)[0-9]*$")
TABLES = ("meta", "data")


@dataclass(frozen=True)
class ReorganizeConfig:
    dry_run: bool = False
    min_pages: int = MIN_INDEX_PAGES
    rebuild_bloat_pct: float = REBUILD_BLOAT_PCT
    rebuild_fragmentation_pct: float = REBUILD_FRAGMENTATION_PCT
    watch_pct: float = WATCH_PCT
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT
    vacuum: bool = True

    DURATIONS = ("lock_timeout", "statement_timeout")

    def __post_init__(self) -> None:
        if not isinstance(self.dry_run, bool) or not isinstance(self.vacuum, bool):
            raise UsageError("dry-run and vacuum must be true or false")
        check_number("min_pages", self.min_pages, 0, 2**31, integer=True)
        for name in ("rebuild_bloat_pct", "rebuild_fragmentation_pct", "watch_pct"):
            check_number(name, getattr(self, name), 0, 100)
        check_number("lock_timeout", self.lock_timeout, 0.001, 3600)
        check_number("statement_timeout", self.statement_timeout, 0.001, 24 * 3600)


@dataclass
class IndexMeasure:
    bytes: int
    pages: int
    leaf_pages: int | None = None
    internal_pages: int | None = None
    empty_pages: int | None = None
    deleted_pages: int | None = None
    leaf_density: float | None = None
    leaf_fragmentation: float | None = None
    bloat_pct: float | None = None


@dataclass
class IndexReport:
    table: str
    index: str
    decision: str                     # rebuild | watch | ok | small | not measured
    reason: str
    before: IndexMeasure
    after: IndexMeasure | None = None
    action: str | None = None         # rebuilt | would rebuild | failed
    error: str | None = None


@dataclass
class ReorganizeResult:
    dry_run: bool
    indexes: list[IndexReport] = field(default_factory=list)
    leftovers: list[dict[str, Any]] = field(default_factory=list)
    vacuumed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        """Indexes rebuilt."""
        return sum(1 for i in self.indexes if i.action == "rebuilt")

    @property
    def error(self) -> str | None:
        return "; ".join(self.errors) if self.errors else None

    def summary(self) -> str:
        verb = "would rebuild" if self.dry_run else "rebuilt"
        acted = [i for i in self.indexes if i.action in ("rebuilt", "would rebuild")]
        text = f"{verb} {len(acted)} of {len(self.indexes)} indexes"
        if acted:
            text += " (" + ", ".join(
                f"{i.index} {_mb(i.before.bytes)}" + (f" -> {_mb(i.after.bytes)}" if i.after else "") for i in acted
            ) + ")"
        if self.leftovers:
            text += f"; {'would drop' if self.dry_run else 'dropped'} {len(self.leftovers)} leftover index(es)"
        if self.vacuumed:
            text += "; vacuumed " + ", ".join(self.vacuumed)
        if self.errors:
            text += f"; {len(self.errors)} error(s)"
        return text

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mb(n: int) -> str:
    return f"{n / 1048576:.1f} MB" if n >= 1048576 else f"{n / 1024:.0f} kB"


def _num(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else round(value, 2)


def estimated_bloat_pct(pages: int, internal_pages: int, leaf_pages: int, leaf_density: float | None) -> float:
    """Share of the pages a fresh build would not need (the metapage always stays)."""
    if pages <= 1:
        return 0.0
    density = min(leaf_density or 0.0, FRESH_LEAF_DENSITY)
    needed = 1 + max(1.0, (internal_pages + leaf_pages) * density / FRESH_LEAF_DENSITY)
    return round(max(0.0, 100.0 * (1 - needed / pages)), 2)


class _Reorganizer:
    def __init__(self, engine: Engine, queue: str, config: ReorganizeConfig, schema: str) -> None:
        self.engine = engine
        self.config = config
        self.schema = schema
        self.target = JobTarget.resolve(engine, queue, schema, KINDS)
        self.result = ReorganizeResult(dry_run=config.dry_run)
        self.stattuple_schema: str | None = None

    def qualified(self, relation: str) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(relation)}"

    def ensure_pgstattuple(self, conn: Connection) -> None:
        found = conn.execute(self.target.sql("pgstattuple_schema")).scalar()
        if found is None and not self.config.dry_run:
            try:
                conn.execute(self.target.sql("create_pgstattuple"))
            except DBAPIError as exc:
                # Another runner (another queue's reorganize) may have created it meanwhile.
                found = conn.execute(self.target.sql("pgstattuple_schema")).scalar()
                if found is not None:
                    self.stattuple_schema = quote_ident(found)
                    return
                raise QueuectlError(
                    "reorganize measures indexes with the pgstattuple extension, which is not installed "
                    f"and this role cannot create it ({error_text(exc)}): ask a superuser to run "
                    "CREATE EXTENSION pgstattuple in this database"
                ) from None
            found = conn.execute(self.target.sql("pgstattuple_schema")).scalar()
        if found is None:
            self.result.notes.append("pgstattuple is not installed: sizes only (a real run creates the extension)")
            return
        self.stattuple_schema = quote_ident(found)

    def indexes(self, conn: Connection, table: str) -> list[sa.RowMapping]:
        table_name = self.target.names.qualified(table)
        return list(conn.execute(self.target.sql("table_indexes"), {"table_name": table_name}).mappings())

    def measure(self, conn: Connection, index: str, method: str, size: int, pages: int) -> IndexMeasure:
        measure = IndexMeasure(bytes=size, pages=pages)
        if self.stattuple_schema is None or method != "btree":
            return measure
        row = conn.execute(
            self.target.sql("index_measure", pgstattuple_schema=self.stattuple_schema),
            {"index_name": self.qualified(index)},
        ).mappings().one()
        block = size // pages if pages else 8192
        measure.bytes = int(row["index_size"])
        measure.pages = int(row["index_size"]) // block
        measure.leaf_pages, measure.internal_pages = int(row["leaf_pages"]), int(row["internal_pages"])
        measure.empty_pages, measure.deleted_pages = int(row["empty_pages"]), int(row["deleted_pages"])
        measure.leaf_density = _num(row["avg_leaf_density"])
        measure.leaf_fragmentation = _num(row["leaf_fragmentation"])
        measure.bloat_pct = estimated_bloat_pct(
            measure.pages, measure.internal_pages, measure.leaf_pages, measure.leaf_density
        )
        return measure

    def decide(self, m: IndexMeasure) -> tuple[str, str]:
        c = self.config
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

    def drop_leftovers(self, conn: Connection, table: str) -> None:
        for row in self.indexes(conn, table):
            if row["valid"] or not LEFTOVER.search(row["index_name"]):
                if not row["valid"]:
                    self.result.notes.append(f"invalid index {row['index_name']} is not a REINDEX leftover: left alone")
                continue
            entry: dict[str, Any] = {"table": table, "index": row["index_name"], "bytes": row["bytes"]}
            if self.config.dry_run:
                entry["action"] = "would drop"
            else:
                try:
                    conn.execute(self.target.sql("drop_index_concurrently", index=quote_ident(row["index_name"])))
                    entry["action"] = "dropped"
                except DBAPIError as exc:
                    entry["action"], entry["error"] = "failed", error_text(exc, self.engine)
                    self.result.errors.append(f"drop {row['index_name']}: {entry['error']}")
            log.info("reorganize %s: %s leftover index %s", self.target.names.queue, entry["action"], row["index_name"])
            self.result.leftovers.append(entry)

    def run(self, stop: threading.Event | None) -> ReorganizeResult:
        started = time.monotonic()
        c = self.config
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            self.target.set_session_timeouts(conn, c.lock_timeout, c.statement_timeout)
            self.ensure_pgstattuple(conn)
            for table in TABLES:
                self.drop_leftovers(conn, table)
            for table in TABLES:
                for row in self.indexes(conn, table):
                    if not row["valid"]:
                        continue
                    name = row["index_name"]
                    before = self.measure(conn, name, row["method"], row["bytes"], row["pages"])
                    decision, reason = self.decide(before)
                    report = IndexReport(table, name, decision, reason, before)
                    self.result.indexes.append(report)
                    if decision == "rebuild":
                        if c.dry_run:
                            report.action = "would rebuild"
                        elif stop is not None and stop.is_set():
                            report.action, report.error = "failed", "stop requested before the rebuild"
                        else:
                            self.rebuild(conn, table, report)
            if not c.dry_run and c.vacuum:
                for table, section in (("meta", "vacuum_meta"), ("data", "vacuum_data")):
                    try:
                        conn.execute(self.target.sql(section))
                        self.result.vacuumed.append(self.target.names.table(table))
                    except DBAPIError as exc:
                        self.result.errors.append(f"vacuum {table}: {error_text(exc, self.engine)}")
            if not c.dry_run:
                for report in self.result.indexes:
                    method = "btree" if report.before.leaf_pages is not None else "other"
                    size_row = next((r for r in self.indexes(conn, report.table) if r["index_name"] == report.index), None)
                    if size_row is not None:
                        report.after = self.measure(conn, report.index, method, size_row["bytes"], size_row["pages"])
        self.result.seconds = time.monotonic() - started
        return self.result

    def rebuild(self, conn: Connection, table: str, report: IndexReport) -> None:
        t0 = time.monotonic()
        try:
            conn.execute(self.target.sql("reindex_concurrently", index=quote_ident(report.index)))
            report.action = "rebuilt"
            log.info("reorganize %s: rebuilt %s in %.1f s", self.target.names.queue, report.index, time.monotonic() - t0)
        except DBAPIError as exc:
            report.action, report.error = "failed", error_text(exc, self.engine)
            self.result.errors.append(f"reindex {report.index}: {report.error}")
            log.warning("reorganize %s: rebuild of %s failed: %s", self.target.names.queue, report.index, report.error)
            # The interrupted rebuild left its *_ccnew copy behind: remove it now, not next time.
            self.drop_leftovers(conn, table)


def run_once(
    engine: Engine,
    queue: str,
    config: ReorganizeConfig | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    stop: threading.Event | None = None,
) -> ReorganizeResult:
    return _Reorganizer(engine, queue, config or ReorganizeConfig(), schema).run(stop)
