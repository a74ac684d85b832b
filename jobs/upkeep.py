"""How each engine measures an index, judges it and keeps it compact online.

The reorganize and inspect jobs are written once; this module is their seam to the
engine (the adapter's `index_upkeep`, queuectl.engine). Each engine answers the same
questions with its own tools:

  question                  PostgreSQL                        SQL Server
  measure an index          pgstattuple's pgstatindex          sys.dm_db_index_physical_stats
  what to do with it        rebuild above 30 % bloat or        REORGANIZE from 5 % fragmentation
                            fragmentation, watch from 5 %      (or low page density), REBUILD
                                                               ONLINE (resumable) above 30 %
                                                               where the edition allows
  the online fix            REINDEX INDEX CONCURRENTLY         ALTER INDEX ... REORGANIZE /
                                                               REBUILD WITH (ONLINE = ON, ...)
  leftovers of a cut run    INVALID *_ccnew / *_ccold: drop    paused resumable rebuild: resume
  the table step after it   VACUUM (ANALYZE)                   UPDATE STATISTICS

`decide` is a pure function of the measurements and the thresholds on both engines, and
`plan` renders the exact statements from sql/<engine>/jobs.sql without a connection, so
both are tested without a server (tests/test_jobs_upkeep.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from queuectl.errors import QueuectlError, UsageError
from queuectl.names import quote_catalog_ident, quote_ident

FRESH_LEAF_DENSITY = 90.0           # a freshly built PostgreSQL B-tree's leaves (default fillfactor 90)
LEFTOVER = re.compile(r"_cc(new|old)[0-9]*$")
MSSQL_PAGE_BYTES = 8192


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


def estimated_bloat_pct(pages: int, internal_pages: int, leaf_pages: int, leaf_density: float | None) -> float:
    """Share of a PostgreSQL B-tree's pages a fresh build would not need (the metapage stays)."""
    if pages <= 1:
        return 0.0
    density = min(leaf_density or 0.0, FRESH_LEAF_DENSITY)
    needed = 1 + max(1.0, (internal_pages + leaf_pages) * density / FRESH_LEAF_DENSITY)
    return round(max(0.0, 100.0 * (1 - needed / pages)), 2)


def minutes(seconds: float) -> int:
    """A time limit in whole minutes for ALTER INDEX's MAX_DURATION: rounded up, at least 1."""
    return max(1, math.ceil(seconds / 60))


# -- the decisions, pure -------------------------------------------------------------------------


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


def decide_mssql(m: IndexMeasure, c: Thresholds, can: ServerAbilities) -> tuple[str, str]:
    """rebuild | reorganize | skipped | ok | small | not measured, and why.

    The Books Online rules (reference dba.md 1.8; Ola Hallengren's defaults): leaf
    fragmentation from watch_pct (5 %) to rebuild_fragmentation_pct (30 %): REORGANIZE;
    above: REBUILD WITH (ONLINE = ON) where the edition has online index operations, else
    REORGANIZE (and the reason says so). Microsoft's current guidance weighs page density
    more than fragmentation for a small hot table: a leaf level below min_page_density_pct
    full is reorganized too (REORGANIZE compacts toward the fill factor). Indexes under
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
    sparse = density is not None and density < c.min_page_density_pct
    if not (high or sparse or frag >= c.watch_pct):
        return "ok", shown
    if high:
        why = (f"at or above {c.rebuild_fragmentation_pct:g} %, but this edition has no online rebuild: "
               "reorganizing instead")
    elif frag >= c.watch_pct:
        why = f"from {c.watch_pct:g} % to {c.rebuild_fragmentation_pct:g} %"
    else:
        why = f"pages less than {c.min_page_density_pct:g} % full"
    if m.allow_page_locks is False:
        return "skipped", f"{shown}: {why}; but ALLOW_PAGE_LOCKS is OFF, so REORGANIZE would fail: left alone"
    return "reorganize", f"{shown}: {why}"


# -- the engines ----------------------------------------------------------------------------------


class PostgresIndexUpkeep:
    """pgstatindex, REINDEX INDEX CONCURRENTLY, VACUUM (ANALYZE)."""

    table_step = (("meta", "vacuum_meta"), ("data", "vacuum_data"))
    table_step_error = "vacuum"            # "vacuum meta: <error>"
    table_step_done = "vacuumed"
    clean_after_failure = True             # a failed REINDEX CONCURRENTLY leaves *_ccnew: drop it now
    leftover_words = ("drop", "dropped")
    sizes_only_note = "pgstattuple is not installed: sizes only (a real run creates the extension)"
    unmeasured_note = "pgstattuple not installed: no physical numbers"
    inspect_extras: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def inspect_summary(s: dict[str, Any]) -> str:
        text = (f"meta {s.get('meta_live_tuples')} live / {s.get('meta_dead_tuples')} dead tuples, "
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
                    from queuectl.jobs.base import error_text

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

    def indexes(self, conn: Connection, target: Target, table: str) -> list[sa.RowMapping]:
        return list(conn.execute(target.sql("table_indexes"), {"table_name": target.names.qualified(table)}).mappings())

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


class MssqlIndexUpkeep:
    """sys.dm_db_index_physical_stats, ALTER INDEX ... REORGANIZE / REBUILD, UPDATE STATISTICS."""

    table_step = (("meta", "update_statistics_meta"), ("data", "update_statistics_data"))
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
        text = (f"meta {s.get('meta_live_tuples')} live / {s.get('meta_dead_tuples')} ghost records, "
                f"oldest cleanup holder open {s.get('oldest_xact_seconds') or 0:g} s")
        if s.get("oldest_xmin_holder"):
            text += f" ({s['oldest_xmin_holder']})"
        return text

    def prepare(self, conn: Connection, target: Target, *, create: bool) -> ServerAbilities:
        row = conn.execute(target.sql("index_capabilities")).mappings().one()
        return ServerAbilities(online_rebuild=bool(row["online_rebuild"]),
                               resumable_rebuild=bool(row["resumable_rebuild"]))

    def indexes(self, conn: Connection, target: Target, table: str) -> list[sa.RowMapping]:
        return list(conn.execute(target.sql("table_indexes"), {"table_name": target.names.qualified(table)}).mappings())

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
