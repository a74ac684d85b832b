"""inspect: record one health snapshot of a queue into the catalog (health_snapshots).

What it records, so trends can be drawn later (`queuectl health` reads the table):
  * items by status (ready, scheduled, processing, done, dead);
  * per upkeep table of the queue's kind (kindspec.UPKEEP_TABLES: a reliable queue's meta
    and data, the items table of heap/fifo/stack/pending/watermark queues and a watermark
    queue's hint, the ring's slots) the statistics collector's live/dead tuples, HOT
    update share, last (auto)vacuum and sizes (pg_stat_user_tables: cheap, no scan); the
    columns meta_* hold the first of them, data_* and history_* a reliable queue's;
  * the kind's own numbers (KIND_FIELDS, details["kind_fields"]): a ring's free slots, the
    gap between its push and pop sequences and its HOT update share (SQL Server: page
    splits); a pending queue's overdue items; a watermark queue's low-mark lag;
  * physical numbers when pgstattuple is installed and `physical` is on: each upkeep
    table's free space (pgstattuple_approx) and its indexes' leaf density, fragmentation
    and estimated bloat (pgstatindex). Queue tables are small by design, so this is cheap;
  * what holds the cleanup horizon back: the oldest snapshot of this database's sessions
    (age in transactions and seconds, and who), replication slots with an xmin, prepared
    transactions. Dead tuples newer than that horizon cannot be removed by any VACUUM.

On SQL Server the same columns come from DMVs (sql/mssql/jobs.sql, measured through the
adapter's index_upkeep): live rows from sys.dm_db_partition_stats, "dead tuples" are ghost
+ version-ghost records and the physical numbers sys.dm_db_index_physical_stats' page
density and fragmentation; the holders are sessions with a transaction that wrote here
or a snapshot transaction (sys.dm_tran_active_snapshot_database_transactions), readable
replicas' ghost low-water marks and prepared DTC transactions; the details add the
version store's size.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sqlalchemy.exc import DBAPIError

from queuectl.engine import adapter_for
from queuectl.engine.base import Adapter, num
from queuectl.engine.urls import error_text
from queuectl.errors import UsageError
from queuectl.jobs.base import JobTarget, check_number
from queuectl.kindspec import KINDS as KIND_NAMES
from queuectl.names import DEFAULT_SCHEMA, quote_ident
from queuectl.sqlfiles import render
from queuectl.stats import queue_counts
from queuectl.thresholds import OVERDUE_AFTER_S

KINDS = KIND_NAMES  # every kind: its upkeep tables (kindspec.UPKEEP_TABLES) and KIND_FIELDS


DEFAULT_LOCK_TIMEOUT = 2.0          # reads take ACCESS SHARE locks: never queue behind DDL for long
DEFAULT_STATEMENT_TIMEOUT = 60.0


@dataclass(frozen=True)
class InspectConfig:
    physical: bool = True     # pgstattuple_approx / pgstatindex (SQL Server: the physical-stats DMV) on the meta table
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT

    DURATIONS = ("lock_timeout", "statement_timeout")

    def __post_init__(self) -> None:
        if not isinstance(self.physical, bool):
            raise UsageError("physical must be true or false")
        check_number("lock_timeout", self.lock_timeout, 0.001, 3600)
        check_number("statement_timeout", self.statement_timeout, 0.001, 24 * 3600)


@dataclass
class InspectResult:
    snapshot_id: int = 0
    taken_at: Any = None
    snapshot: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    # The engine's adapter: its index upkeep words the summary (shown as the dialect's name).
    adapter: Adapter = field(default_factory=lambda: adapter_for("postgresql"), repr=False)

    error = None

    @property
    def rows(self) -> int:
        return 1 if self.snapshot_id else 0

    def summary(self) -> str:
        return self.adapter.index_upkeep.inspect_summary(self.snapshot)

    def as_dict(self) -> dict[str, Any]:
        shown = asdict(replace(self, adapter=None))
        del shown["adapter"]
        return {**shown, "engine": self.adapter.dialect}


def _vitals(conn: Connection, target: JobTarget, table: str) -> dict[str, Any]:
    row = conn.execute(target.sql("table_vitals"), {"table_name": target.names.qualified(table)}).mappings().first()
    return dict(row) if row else {}


def _plain(row: Any) -> dict[str, Any]:
    """A row as JSON-friendly values (measurements rounded)."""
    return {k: num(v) if isinstance(v, float) or type(v).__name__ == "Decimal" else v for k, v in dict(row).items()}


# Each kind's own numbers beside its tables' (jobs.sql sections kind_<kind>, with their
# parameters): a ring's free slots, sequence gap and HOT share (SQL Server: page splits); a
# pending queue's overdue items; a watermark queue's low-mark lag. The other kinds have
# only their items table's numbers.
KIND_FIELDS: dict[str, tuple[str, dict[str, Any]]] = {
    "ring": ("kind_ring", {}),
    "pending": ("kind_pending", {"overdue_s": OVERDUE_AFTER_S}),
    "watermark": ("kind_watermark", {}),
}


def kind_fields(conn: Connection, target: JobTarget) -> dict[str, Any]:
    """The kind's own numbers (KIND_FIELDS), {} for a kind without any."""
    if target.kind not in KIND_FIELDS:
        return {}
    section, params = KIND_FIELDS[target.kind]
    row = conn.execute(target.sql(section), params).mappings().one()
    return _plain(row)


def take_snapshot(conn: Connection, target: JobTarget, config: InspectConfig) -> dict[str, Any]:
    """One snapshot. The columns meta_* describe the queue's first upkeep table (a reliable
    queue's meta, the items table of the destructive kinds, the ring's slots) and data_*
    its data table (reliable only); details["tables"] has every upkeep table's numbers and
    details["kind_fields"] the kind's own (KIND_FIELDS)."""
    names = target.names
    snap: dict[str, Any] = dict(queue_counts(conn, names.queue, target.info.kind, names.schema))
    vitals = {table: _vitals(conn, target, table) for table in target.tables}
    main = vitals[target.tables[0]]
    data = vitals.get("data", {})
    history = _vitals(conn, target, "history") if "data" in vitals else {}
    snap.update(
        meta_live_tuples=main.get("n_live_tup"), meta_dead_tuples=main.get("n_dead_tup"),
        meta_dead_pct=num(main.get("dead_pct")), meta_hot_update_pct=num(main.get("hot_pct")),
        meta_table_bytes=main.get("table_bytes"), meta_index_bytes=main.get("index_bytes"),
        data_live_tuples=data.get("n_live_tup"), data_dead_tuples=data.get("n_dead_tup"),
        data_table_bytes=data.get("table_bytes"), data_index_bytes=data.get("index_bytes"),
        history_rows=history.get("n_live_tup"),
        history_bytes=(history.get("table_bytes") or 0) + (history.get("index_bytes") or 0) if history else None,
        last_autovacuum=main.get("last_autovacuum"), last_vacuum=main.get("last_vacuum"),
        meta_free_pct=None, min_index_leaf_density=None, max_index_fragmentation=None, index_bloat_pct=None,
    )
    details: dict[str, Any] = {
        "kind": target.kind, "main_table": names.table(target.tables[0]),
        "tables": {names.table(t): _plain(v) for t, v in vitals.items()},
        "indexes": [],
    }
    snap["kind_fields"] = details["kind_fields"] = kind_fields(conn, target)
    upkeep = adapter_for(conn).index_upkeep
    indexes = {table: upkeep.indexes(conn, target, table) for table in target.tables}
    snap["invalid_indexes"] = sum(1 for rows in indexes.values() for i in rows if not i["valid"])
    can = upkeep.prepare(conn, target, create=False)
    if not can.measured:
        details["note"] = upkeep.unmeasured_note
    elif config.physical:
        for table in target.tables:
            phys = {k: num(v) for k, v in upkeep.table_physical(conn, target, can, table).items()}
            details["tables"][names.table(table)]["physical"] = phys
            if table == target.tables[0]:
                snap["meta_free_pct"] = phys["approx_free_percent"]
                details["meta_physical"] = phys
        total_pages = needed_pages = 0.0
        for table, rows in indexes.items():
            for idx in rows:
                if not idx["valid"] or idx["method"] != "btree":
                    continue
                m = upkeep.measure(conn, target, can, table, idx)
                if m.leaf_pages is None:  # an empty index on SQL Server: nothing to measure
                    continue
                entry = {"table": names.table(table), "index": idx["index_name"], "bytes": m.bytes, "pages": m.pages,
                         "leaf_density": m.leaf_density, "leaf_fragmentation": m.leaf_fragmentation,
                         "bloat_pct": m.bloat_pct, "deleted_pages": m.deleted_pages, "empty_pages": m.empty_pages}
                entry.update({k: v for k, v in (("ghost_rows", m.ghost_rows),
                                                ("version_ghost_rows", m.version_ghost_rows),
                                                ("fill_factor", m.fill_factor)) if v is not None})
                details["indexes"].append(entry)
                if m.bloat_pct is not None:
                    total_pages += m.pages
                    needed_pages += m.pages * (1 - m.bloat_pct / 100)
        densities = [e["leaf_density"] for e in details["indexes"] if e["leaf_density"] is not None]
        fragmentations = [e["leaf_fragmentation"] for e in details["indexes"] if e["leaf_fragmentation"] is not None]
        snap["min_index_leaf_density"] = min(densities, default=None)
        snap["max_index_fragmentation"] = max(fragmentations, default=None)
        if total_pages:
            snap["index_bloat_pct"] = round(100 * (1 - needed_pages / total_pages), 2)
    for key, section in upkeep.inspect_extras:
        try:
            details[key] = [{k: num(v) if isinstance(v, float) else v for k, v in r.items()}
                            for r in conn.execute(target.sql(section)).mappings()]
        except DBAPIError as exc:  # e.g. no VIEW SERVER STATE: a note, not a failed snapshot
            details[key] = f"not read: {error_text(exc)}"
    holders = [dict(r) for r in conn.execute(target.sql("xmin_holders")).mappings()]
    details["xmin_holders"] = [{k: num(v) if k in ("xmin_age", "seconds") else v for k, v in h.items()} for h in holders[:10]]
    backends = [h for h in holders if h["source"] == "backend"]
    slots = [h for h in holders if h["source"] == "replication_slot"]
    prepared = [h for h in holders if h["source"] == "prepared_xact"]
    oldest = holders[0] if holders else None
    snap.update(
        oldest_xmin_age=oldest["xmin_age"] if oldest else None,
        oldest_xmin_holder=oldest["holder"] if oldest else None,
        oldest_xact_seconds=max((h["seconds"] or 0.0 for h in backends), default=None),
        replication_slots_holding=len(slots),
        oldest_slot_xmin_age=max((h["xmin_age"] or 0 for h in slots), default=None),
        prepared_xacts=len(prepared),
        oldest_prepared_seconds=max((h["seconds"] or 0.0 for h in prepared), default=None),
    )
    for key in ("oldest_xact_seconds", "oldest_prepared_seconds"):
        snap[key] = num(snap[key])
    snap["details"] = details
    return snap


def run_once(
    engine: Engine,
    queue: str | JobTarget,
    config: InspectConfig | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    stop: threading.Event | None = None,
) -> InspectResult:
    config = config or InspectConfig()
    target = JobTarget.resolve(engine, queue, schema, KINDS)
    started = time.monotonic()
    insert = sa.text(render(target.sql_dir, "catalog_jobs", "snapshot_insert", {"schema": quote_ident(schema)}))
    with engine.begin() as conn:
        target.set_local_timeouts(conn, config.lock_timeout, config.statement_timeout)
        snap = take_snapshot(conn, target, config)
        row = conn.execute(insert, {**snap, "queue": target.names.queue, "details": json.dumps(snap["details"], default=str)}).one()
    return InspectResult(snapshot_id=row.id, taken_at=row.taken_at, snapshot=snap, seconds=time.monotonic() - started,
                         adapter=adapter_for(engine))
