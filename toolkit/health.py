"""Health of the queues in one database: gather facts, grade them, say what to do.

Three steps, each usable on its own:

1. ``gather_facts`` reads the server in a fixed number of statements (sql/<engine>/health.sql)
   plus one pass per queue (each queue kind contributes its own probe, see KIND_HEALTH);
2. ``evaluate`` grades the facts against named thresholds (DEFAULT_THRESHOLDS, overridable
   with ``--set name.warn=VALUE`` or a TOML file) into checks OK / INFO / WARNING / CRITICAL,
   each non-OK one with one line of concrete advice;
3. ``HealthReport`` holds both, gives the verdict, the exit code (0 OK, 1 WARNING,
   2 CRITICAL) and the JSON object described by health_schema.json.

On PostgreSQL the early warning for a queue is not its depth but dead tuples and the age of
whatever holds the xmin horizon back (see shared reference dba.md section 2.3/2.9): the
blocker checks name the pid, its age and how many dead tuples wait behind it.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from queuectl.catalog import QueueInfo
from queuectl.engine import adapter_for
from queuectl.engine.base import AdviceWords, IndexUpkeep, ServerAbilities
from queuectl.engine.urls import first_line, mask_url
from queuectl.errors import UsageError
from queuectl.kindspec import DESTRUCTIVE_KINDS, UPKEEP_TABLES
from queuectl.names import DEFAULT_SCHEMA, QueueNames, quote_ident, validate_queue_name, validate_schema_name
from queuectl.registry import did_you_mean, list_queues
from queuectl.sqlfiles import render
from queuectl.stats import STATUS_CODES
from queuectl.thresholds import (
    CRITICAL, DEFAULT_THRESHOLDS, EXIT_CODES, INFO, MIN_INDEX_PAGES, OK, OVERDUE_AFTER_S, RANK, REBUILD_BLOAT_PCT,
    STATUSES, WARNING, Threshold, apply_settings, check_order, fmt_bytes, fmt_count, fmt_duration, parse_value,
    with_threshold, worst,
)

REPORT_FORMAT = 1  # bumped when the JSON object changes incompatibly (see health_schema.json)

# Advice order within a severity: what holds cleanup back explains much of the rest.
_ROOT_CAUSE_FIRST = {"blockers": 0, "queues": 1, "storage": 2, "jobs": 3}

# The job-run history the scheduler writes (jobs issue): read only when the table exists.
JOB_RUNS_TABLE = "job_runs"
JOB_RUNS_COLUMNS = ("job", "queue", "started_at", "finished_at", "rows", "outcome", "error")
JOB_SUCCESS_OUTCOMES = ("ok", "success", "succeeded")
JOB_NOT_FAILURE_OUTCOMES = JOB_SUCCESS_OUTCOMES + ("skipped", "running")


# -- options ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HealthOptions:
    """How a report is gathered and graded. Every default is named here."""

    thresholds: dict[str, Threshold] = field(default_factory=lambda: dict(DEFAULT_THRESHOLDS))
    rate_window_s: float = 300.0  # enqueue/completion rates over the last 5 minutes
    history_scan: int = 10_000  # newest archived rows looked at for the rates (bounded cost)
    physical_max_bytes: int = 128 * 2**20  # pgstatindex / pgstattuple_approx read the whole relation
    # Smaller indexes are left alone: reorganize's own minimum (its --min-pages), so an index
    # health calls bloated is one `queuectl reorganize` acts on.
    index_min_pages: int = MIN_INDEX_PAGES
    table_min_pages: int = 128  # 1 MB: small tables show high bloat ratios naturally
    create_extension: bool = True  # try CREATE EXTENSION pgstattuple when it is available
    job_lookback_s: float = 7 * 86400.0
    job_failure_window_s: float = 86400.0
    statement_timeout_ms: int = 10_000
    lock_timeout_ms: int = 2_000
    # The scheduler's config (queuectl.jobs.scheduler.SchedulerConfig), when the report is to
    # check it: a queue its [jobs.*] tables name that a job never runs on is a WARNING.
    scheduler: Any = None

    _OPTION_KEYS = {
        "rate_window": "seconds", "history_scan": "count", "physical_max_mb": "count",
        "index_min_pages": "count", "table_min_pages": "count", "create_extension": "bool",
        "job_failure_window": "seconds", "statement_timeout": "seconds",
    }

    def with_settings(self, settings: Iterable[str]) -> "HealthOptions":
        return replace(self, thresholds=apply_settings(self.thresholds, settings))


def load_config(path: str | Path, options: HealthOptions | None = None) -> HealthOptions:
    """Read the ``[health]`` table of a TOML file (the scheduler's queuectl.toml may hold it).

    [health]
    rate_window = "5m"
    [health.thresholds]
    oldest_ready_age = { warn = "1m", crit = "15m" }
    dead_letters = { warn = 10, crit = "off" }
    """
    options = options or HealthOptions()
    try:
        data = tomllib.loads(Path(path).read_text("utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"config {path} is not UTF-8 text (TOML files are)") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config {path} is not valid TOML: {exc}") from None
    section = data.get("health", {})
    if not isinstance(section, dict):
        raise UsageError(f"config {path}: [health] must be a table")
    thresholds = dict(options.thresholds)
    table = section.get("thresholds") or {}
    if not isinstance(table, dict):
        raise UsageError(f"config {path}: health.thresholds must be a table like [health.thresholds]")
    for name, levels in table.items():
        if not isinstance(levels, dict):
            raise UsageError(f"config {path}: health.thresholds.{name} must be a table like {{ warn = ..., crit = ... }}")
        for level, value in levels.items():
            try:
                thresholds = with_threshold(thresholds, name, level, value)
            except UsageError as exc:
                raise UsageError(f"config {path}: health.thresholds.{name}.{level}: {exc}") from None
    try:
        check_order(thresholds)
    except UsageError as exc:
        raise UsageError(f"config {path}: {exc}") from None
    changes: dict[str, Any] = {"thresholds": thresholds}
    for key, value in section.items():
        if key == "thresholds":
            continue
        kind = HealthOptions._OPTION_KEYS.get(key)
        if kind is None:
            raise UsageError(f"config {path}: unknown health option {key!r}")
        if kind == "bool":
            if not isinstance(value, bool):
                raise UsageError(f"config {path}: health.{key} must be true or false")
            changes[key] = value
            continue
        try:
            number = parse_value(kind, value)
        except UsageError as exc:
            raise UsageError(f"config {path}: health.{key}: {exc}") from None
        if number is None or number <= 0:
            raise UsageError(f"config {path}: health.{key} must be positive")
        if key == "rate_window":
            changes["rate_window_s"] = number
        elif key == "job_failure_window":
            changes["job_failure_window_s"] = number
        elif key == "physical_max_mb":
            changes["physical_max_bytes"] = int(number * 2**20)
        elif key == "statement_timeout":
            changes["statement_timeout_ms"] = int(number * 1000)
        else:
            changes[key] = int(number)
    return replace(options, **changes)


# -- per-kind queue probes -----------------------------------------------------------------------


@dataclass
class QueueFacts:
    """What one queue's probe found. Counts a kind does not have stay None."""

    name: str
    kind: str
    ready: int | None = None
    scheduled: int | None = None
    processing: int | None = None
    done: int | None = None
    dead: int | None = None
    stuck: int | None = None
    oldest_expired_lease_s: float | None = None
    oldest_ready_age_s: float | None = None
    window_s: float | None = None
    enqueued_in_window: int | None = None
    dequeued_in_window: int | None = None  # reliable kind: items whose latest dequeue is in the window
    completed_in_window: int | None = None
    died_in_window: int | None = None
    watermark_lag: int | None = None  # watermark kind: rows between stored watermark and head
    ring_fill_pct: float | None = None  # ring kind: slots in use / slots
    subscriptions: list[dict[str, Any]] = field(default_factory=list)  # fan-out ring: its subscriptions' lag
    rotation_lag: int | None = None  # reliable_0012: ids drawn since the rotator's last switch
    rotation_blocked_by: list[str] = field(default_factory=list)  # sessions keeping a generation's truncate waiting
    rotation_stranded: int | None = None  # items due in a sealed generation not emptied yet (no claim looks there)
    rotation_stranded_age_s: float | None = None  # how long the oldest of them has been due
    compaction_blocked_by: list[str] = field(default_factory=list)  # sessions keeping a due compaction waiting
    # The kind's own numbers (queuectl.jobs.inspect.KIND_FIELDS, the statements inspect
    # records): a ring's free slots and push/pop sequence gap, a pending queue's overdue items,
    # a watermark queue's low mark. None: the kind has none.
    kind_fields: dict[str, Any] | None = None
    probed: bool = True
    notes: list[str] = field(default_factory=list)

    def per_minute(self, count: int | None) -> float | None:
        if count is None or not self.window_s:
            return None
        return round(count * 60.0 / self.window_s, 2)


Probe = Callable[[Connection, QueueNames, QueueInfo, HealthOptions], QueueFacts]


RELIABLE_SLOTS = {role: tuple(f"{role}{s}" for s in range(3)) for role in ("meta", "data")}


@dataclass(frozen=True)
class KindHealth:
    """What a queue kind contributes to a health report.

    tables:   suffixes of the queue's tables (for the storage section), e.g. ("meta", ...)
    measured: the subset whose indexes/tables get pgstatindex / pgstattuple_approx (the
              churned ones; append-only history is left out: big, and it does not bloat)
    probe:    one statement (or very few) over the queue's tables returning QueueFacts
    """

    tables: tuple[str, ...]
    measured: tuple[str, ...]
    probe: Probe


def _probe_reliable(conn: Connection, names: QueueNames, info: QueueInfo, options: HealthOptions) -> QueueFacts:
    sql = render(adapter_for(conn).sql_dir, "health", "queue_reliable", names.template_values())
    row = conn.execute(
        sa.text(sql), {"window_s": options.rate_window_s, "history_scan": options.history_scan}
    ).mappings().one()
    return QueueFacts(
        name=info.name,
        kind=info.kind,
        ready=row["ready"],
        scheduled=row["scheduled"],
        processing=row["processing"],
        done=row["done"],
        dead=row["dead"],
        stuck=row["stuck"],
        oldest_expired_lease_s=row["oldest_expired_lease_s"],
        oldest_ready_age_s=row["oldest_ready_age_s"],
        window_s=options.rate_window_s,
        enqueued_in_window=row["enqueued_in_window"],
        dequeued_in_window=row["dequeued_in_window"],
        completed_in_window=row["completed_in_window"],
        died_in_window=row["died_in_window"],
        **_rotation(conn, names, info),
    )


# A session that holds a lock on a generation waiting to be emptied, in a transaction this
# old, is named as its blocker (claims and acks hold such locks for milliseconds).
ROTATION_BLOCKER_AGE_S = 10.0
# Items due this long in a sealed generation not emptied yet (no claim looks there; the
# archive job's truncate moves them forward) make queue.rotation a WARNING: a scheduled
# archive job passes at least once a minute, --continuous every few seconds.
ROTATION_STRANDED_AGE_S = 120.0


def _rotation(conn: Connection, names: QueueNames, info: QueueInfo) -> dict[str, Any]:
    """A reliable queue's rotation (reliable_0012): how far it lags, and who keeps a sealed
    generation from being emptied."""
    sql_dir = adapter_for(conn).sql_dir
    if info.schema_version < "reliable_0012":
        return {}
    values = names.template_values()
    try:
        with conn.begin_nested():  # a role that may read the tables but not the sequences
            row = conn.execute(sa.text(render(sql_dir, "health", "queue_rotation", values))).mappings().one()
    except DBAPIError as exc:
        return {"notes": [f"rotation not read: {first_line(exc.orig)} (it needs SELECT on the queue's "
                          "rot_* sequences)"]}
    found: dict[str, Any] = {"rotation_lag": row["lag"], "rotation_blocked_by": [], "rotation_stranded": 0}
    if row["waiting_epoch"] is not None:
        from queuectl.jobs.archive import rotation_blockers

        found["rotation_blocked_by"] = rotation_blockers(conn, names, sql_dir, row["waiting_epoch"],
                                                         ROTATION_BLOCKER_AGE_S)
        try:
            with conn.begin_nested():  # a role that may read the queue's views but not its slot tables
                stranded = conn.execute(sa.text(render(sql_dir, "health", "rotation_stranded", values)),
                                        {"slot": row["waiting_epoch"] % 3}).mappings().one()
        except DBAPIError as exc:
            found["rotation_stranded"] = None
            found["notes"] = [f"items in the sealed generation not read: {first_line(exc.orig)} (it needs SELECT "
                              "on the queue's slot tables)"]
        else:
            found["rotation_stranded"] = stranded["stranded"]
            found["rotation_stranded_age_s"] = stranded["stranded_age_s"]
    return found


def _compaction(conn: Connection, names: QueueNames, info: QueueInfo) -> list[str]:
    """Who keeps a ring's or a DELETE-drained queue's due compaction waiting (PostgreSQL): the
    sessions holding a lock on its tables in transactions older than ROTATION_BLOCKER_AGE_S,
    once its tables are due (queuectl.jobs.compact, whose defaults decide). A due compaction
    that nobody blocks is the job's to run, not health's to report."""
    from queuectl.jobs.base import JobTarget, lock_holders
    from queuectl.jobs.compact import CompactConfig, Compactor

    sql_dir = adapter_for(conn).sql_dir
    if sql_dir != "postgresql":
        return []
    target = JobTarget(names, info, sql_dir)
    compactor = Compactor(conn.engine, target, CompactConfig())
    with conn.begin_nested():
        rows = conn.execute(target.sql("compact_probe"), {"tables": compactor.tables}).all()
    if not any(compactor.is_due(int(r.bytes), int(r.live), int(r.dead)) for r in rows):
        return []
    return lock_holders(conn, sql_dir, names, compactor.tables, ROTATION_BLOCKER_AGE_S)


def _kind_row(conn: Connection, names: QueueNames, info: QueueInfo, section: str, params: dict) -> sa.RowMapping:
    from queuectl.kindspec import kind_template_values

    values = {**names.template_values(), **kind_template_values(names, info.kind)}
    sql = render(adapter_for(conn).sql_dir, "health", section, values)
    return conn.execute(sa.text(sql), params).mappings().one()


def _probe_destructive(section: str) -> Probe:
    """heap, fifo, stack, pending, watermark: one table of waiting items, deleted at dequeue."""

    def probe(conn: Connection, names: QueueNames, info: QueueInfo, options: HealthOptions) -> QueueFacts:
        row = _kind_row(conn, names, info, section, {"window_s": options.rate_window_s})
        facts = QueueFacts(
            name=info.name, kind=info.kind, ready=row["ready"], scheduled=row["scheduled"],
            oldest_ready_age_s=row["oldest_ready_age_s"], window_s=options.rate_window_s,
            enqueued_in_window=row["enqueued_in_window"],
        )  # fmt: skip
        if info.kind == "watermark":
            # signed: below zero the stored hint is above a waiting item (graded CRITICAL)
            facts.watermark_lag = _kind_row(conn, names, info, "watermark_lag", {})["lag"] or 0
        facts.kind_fields = _kind_fields(conn, names, info)
        facts.compaction_blocked_by = _compaction(conn, names, info)
        return facts

    return probe


def _probe_ring(conn: Connection, names: QueueNames, info: QueueInfo, options: HealthOptions) -> QueueFacts:
    row = _kind_row(conn, names, info, "queue_ring", {"window_s": options.rate_window_s})
    facts = QueueFacts(
        name=info.name, kind=info.kind, ready=row["ready"], scheduled=0,
        oldest_ready_age_s=row["oldest_ready_age_s"], window_s=options.rate_window_s,
        enqueued_in_window=row["enqueued_in_window"],
        ring_fill_pct=round(100.0 * row["ready"] / row["slots"], 2) if row["slots"] else 0.0,
        kind_fields=_kind_fields(conn, names, info),
        compaction_blocked_by=_compaction(conn, names, info),
    )  # fmt: skip
    if getattr(info.settings, "fanout", False):
        # a fan-out ring's messages wait for its subscriptions, not in FULL slots: their lag is the fact
        from queuectl.kindspec import kind_template_values

        values = {**names.template_values(), **kind_template_values(names, info.kind)}
        sql = render(adapter_for(conn).sql_dir, "ring", "subscriptions", values)
        facts.subscriptions = [dict(r) for r in conn.execute(sa.text(sql)).mappings().all()]
        facts.ring_fill_pct = None
    return facts


def _kind_fields(conn: Connection, names: QueueNames, info: QueueInfo) -> dict[str, Any] | None:
    """The kind's own numbers, read by the statement the inspect job records (jobs.sql)."""
    from queuectl.jobs.base import JobTarget
    from queuectl.jobs.inspect import KIND_FIELDS, kind_fields

    if info.kind not in KIND_FIELDS:
        return None
    try:
        with conn.begin_nested():  # e.g. a role that may not read the ring's sequences
            return kind_fields(conn, JobTarget(names, info, adapter_for(conn).sql_dir))
    except DBAPIError as exc:
        return {"not_read": first_line(exc.orig)}


# Each kind: its tables (storage section), the churned ones measured with pgstattuple, and
# a probe filling the QueueFacts fields the kind has (None stays "not applicable").
KIND_HEALTH: dict[str, KindHealth] = {
    # reliable_0012 partitions meta and data into generation slots: the slots are the tables
    # (health.sql reads plain tables only, so a queue shows the layout its revision has)
    "reliable": KindHealth(tables=("meta", *RELIABLE_SLOTS["meta"], "data", *RELIABLE_SLOTS["data"], "history"),
                           measured=("meta", *RELIABLE_SLOTS["meta"], "data", *RELIABLE_SLOTS["data"]),
                           probe=_probe_reliable),
    # the other kinds: every upkeep table is measured (the one-row watermark hint is
    # rewritten in place at every correction, so it gathers dead rows of its own)
    **{kind: KindHealth(tables=UPKEEP_TABLES[kind], measured=UPKEEP_TABLES[kind],
                        probe=_probe_destructive("queue_pending" if kind == "pending" else "queue_items"))
       for kind in DESTRUCTIVE_KINDS},
    "ring": KindHealth(tables=UPKEEP_TABLES["ring"], measured=UPKEEP_TABLES["ring"], probe=_probe_ring),
}


# -- facts ---------------------------------------------------------------------------------------


@dataclass
class Facts:
    """Everything read from the server for one report (plain data, JSON-friendly)."""

    generated_at: datetime
    server: dict[str, Any]
    schema: str
    queues: list[QueueFacts]
    tables: list[dict[str, Any]]
    indexes: list[dict[str, Any]]
    sessions: list[dict[str, Any]]
    replication_slots: list[dict[str, Any]]
    standby_feedback: list[dict[str, Any]]
    prepared_xacts: list[dict[str, Any]]
    jobs: dict[str, Any]
    pgstattuple: str  # installed | created | unavailable: <why>
    notes: list[str]
    # The words the advice uses: the engine's (its adapter's advice_words).
    words: AdviceWords = field(default_factory=lambda: adapter_for("postgresql").advice_words)
    # How the engine judges an index (its adapter's index_upkeep): the reorganize job's rules.
    upkeep: IndexUpkeep = field(default_factory=lambda: adapter_for("postgresql").index_upkeep)
    unplanned_jobs: list[Any] = field(default_factory=list)  # queuectl.jobs.scheduler.Unplanned


def _sql(conn: Connection, section: str, values: dict[str, str | int] | None = None) -> sa.TextClause:
    return sa.text(render(adapter_for(conn).sql_dir, "health", section, values or {}))


def _rows(conn: Connection, section: str, params: dict[str, Any] | None = None, values: dict | None = None) -> list[dict]:
    return [dict(r) for r in conn.execute(_sql(conn, section, values), params or {}).mappings()]


def _ensure_pgstattuple(engine: Engine, server: dict[str, Any], options: HealthOptions) -> str:
    if server["pgstattuple_schema"]:
        return "installed"
    if not server["pgstattuple_available"]:
        return "unavailable: the pgstattuple extension is not on the server (install postgresql-contrib)"
    if server["in_recovery"]:
        return "unavailable: not installed, and a standby cannot install it (create it on the primary)"
    if not options.create_extension:
        return "unavailable: not installed (create_extension = false): run CREATE EXTENSION pgstattuple"
    key = engine.url.render_as_string(hide_password=True)
    if key in _EXTENSION_REFUSED:  # --watch: do not fill the server log with the same error
        return _EXTENSION_REFUSED[key]
    try:
        with engine.begin() as conn:
            conn.execute(_sql(conn, "create_pgstattuple"))
    except DBAPIError as exc:
        _EXTENSION_REFUSED[key] = (f"unavailable: CREATE EXTENSION pgstattuple failed ({first_line(exc.orig)}): "
                                   "ask a superuser to run it in this database")
        return _EXTENSION_REFUSED[key]
    return "created"


_EXTENSION_REFUSED: dict[str, str] = {}


def _optional(conn: Connection, notes: list[str], what: str, fn: Callable[[], list[dict]]) -> list[dict]:
    """Run an optional read in a savepoint; a failure becomes a note, not a failed report."""
    try:
        with conn.begin_nested():
            return fn()
    except DBAPIError as exc:
        notes.append(f"{what} not read: {first_line(exc.orig)}")
        return []


def _select_queues(conn: Connection, schema: str, names: Sequence[str] | None) -> list[QueueInfo]:
    installed = list_queues(conn, schema)
    if not names:
        return installed
    by_name = {q.name: q for q in installed}
    missing = [n for n in names if n not in by_name]
    if missing:
        named = [f"{n} ({meant})" if (meant := did_you_mean(n, by_name)) else n for n in missing]
        raise UsageError(f"queue(s) not installed in schema {schema!r}: {', '.join(named)}")
    return [by_name[n] for n in dict.fromkeys(names)]


def gather_facts(
    engine: Engine, queues: Sequence[str] | None = None, schema: str = DEFAULT_SCHEMA, options: HealthOptions | None = None
) -> Facts:
    """Read everything a report needs: a fixed number of statements plus one per queue."""
    options = options or HealthOptions()
    validate_schema_name(schema)
    for name in queues or ():
        validate_queue_name(name)
    notes: list[str] = []
    words = adapter_for(engine).advice_words
    with engine.connect() as conn:
        server = dict(conn.execute(_sql(conn, "server")).mappings().one())
        if queues:
            _select_queues(conn, schema, queues)  # a mistyped name fails before anything is created
    pgstattuple = _ensure_pgstattuple(engine, server, options)
    if pgstattuple == "created":
        with engine.connect() as conn:
            server = dict(conn.execute(_sql(conn, "server")).mappings().one())

    with engine.connect() as conn, conn.begin():
        conn.execute(_sql(conn, "session_limits", {"lock_timeout_ms": options.lock_timeout_ms}),
                     {"statement_timeout": f"{options.statement_timeout_ms}ms", "lock_timeout": f"{options.lock_timeout_ms}ms"})
        generated_at = conn.execute(_sql(conn, "now")).scalar_one()
        infos = _select_queues(conn, schema, queues)

        queue_facts: list[QueueFacts] = []
        table_owner: dict[str, tuple[str, str, bool]] = {}  # qualified -> (queue, suffix, measured)
        for info in infos:
            names = QueueNames(info.name, schema)
            kind = KIND_HEALTH.get(info.kind)
            if kind is None:
                queue_facts.append(QueueFacts(info.name, info.kind, probed=False,
                                              notes=[f"no health probe for kind {info.kind!r} yet"]))
                continue
            try:
                with conn.begin_nested():  # a lock timeout on one queue must not cost the whole report
                    queue_facts.append(kind.probe(conn, names, info, options))
            except DBAPIError as exc:
                queue_facts.append(QueueFacts(info.name, info.kind, probed=False,
                                              notes=[f"could not be read: {first_line(exc.orig)}"]))
            for suffix in kind.tables:
                table_owner[names.qualified(suffix)] = (info.name, suffix, suffix in kind.measured)

        as_list = adapter_for(conn).list_param  # an array on PostgreSQL, JSON text on SQL Server
        tables = _rows(conn, "tables", {"tables": as_list(list(table_owner))})
        indexes = _rows(conn, "indexes", {"tables": as_list(list(table_owner))})
        for row in tables + indexes:
            row["queue"], row["suffix"], row["measured"] = table_owner[row.pop("qualified")]

        locked = [t["table_name"] for t in tables if t["locked"]]
        if locked:
            notes.append(f"locked in {words.exclusive_lock}: sizes not read for {', '.join(locked)}")

        pgs_schema = server["pgstattuple_schema"]
        if pgs_schema and not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", pgs_schema):
            notes.append(f"pgstattuple is installed in schema {pgs_schema!r}, which queuectl does not quote: not measured")
            pgs_schema = None
        if pgs_schema:
            _measure(conn, tables, indexes, quote_ident(pgs_schema), options, notes)

        sessions = _rows(conn, "sessions")
        slots = _rows(conn, "replication_slots")
        feedback = _rows(conn, "standby_feedback")
        prepared = _rows(conn, "prepared_xacts")
        jobs = _job_history(conn, schema, options, notes)
        unplanned_jobs = []
        if options.scheduler is not None:
            from queuectl.jobs.scheduler import unplanned

            unplanned_jobs = unplanned(options.scheduler, list_queues(conn, options.scheduler.schema))

    if not server["sees_all_sessions"]:
        notes.append(words.sessions_hidden())
    return Facts(
        generated_at=generated_at, server=server, schema=schema, queues=queue_facts, tables=tables,
        indexes=indexes, sessions=sessions, replication_slots=slots, standby_feedback=feedback,
        prepared_xacts=prepared, jobs=jobs, pgstattuple=pgstattuple, notes=notes,
        words=adapter_for(engine).advice_words, upkeep=adapter_for(engine).index_upkeep, unplanned_jobs=unplanned_jobs,
    )


def _measure(conn: Connection, tables: list[dict], indexes: list[dict], pgs: str, options: HealthOptions, notes: list[str]) -> None:
    """pgstatindex on the measured B-tree indexes and pgstattuple_approx on the measured tables."""
    index_oids = [ix["index_oid"] for ix in indexes if ix["measured"] and ix["method"] == "btree" and ix["valid"]
                  and ix["index_bytes"] is not None and ix["index_bytes"] <= options.physical_max_bytes]
    skipped = [ix["index_name"] for ix in indexes
               if ix["measured"] and ix["index_bytes"] is not None and ix["index_bytes"] > options.physical_max_bytes]
    if skipped:
        notes.append(f"indexes over {options.physical_max_bytes // 2**20} MB not measured (pgstatindex reads them "
                     f"whole): {', '.join(skipped)}")
    physical = {r["index_oid"]: r for r in _optional(
        conn, notes, "pgstatindex", lambda: _rows(conn, "index_physical", {"oids": adapter_for(conn).list_param(index_oids)},
                                                {"pgstattuple_schema": pgs})
    )} if index_oids else {}
    for ix in indexes:
        p = physical.get(ix["index_oid"])
        ix["physical"] = None if p is None else {k: _finite(v) for k, v in p.items() if k != "index_oid"}

    table_oids = [t["table_oid"] for t in tables if t["measured"] and t["table_bytes"] is not None
                  and t["table_bytes"] <= options.physical_max_bytes]
    rows = _optional(
        conn, notes, "pgstattuple_approx",
        lambda: _rows(conn, "table_physical", {"oids": adapter_for(conn).list_param(table_oids)},
                      {"pgstattuple_schema": pgs}),
    ) if table_oids else []
    by_oid = {r["table_oid"]: r for r in rows}
    for t in tables:
        p = by_oid.get(t["table_oid"])
        t["physical"] = None if p is None else {k: _finite(v) for k, v in p.items() if k != "table_oid"}


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _job_history(conn: Connection, schema: str, options: HealthOptions, notes: list[str]) -> dict[str, Any]:
    """The scheduler's job-run history when its table exists; otherwise say so."""
    inspector = sa.inspect(conn)
    if not inspector.has_table(JOB_RUNS_TABLE, schema=schema):
        return {"available": False, "note": "no job history (scheduler not installed)", "runs": []}
    columns = {c["name"] for c in inspector.get_columns(JOB_RUNS_TABLE, schema=schema)}
    missing = [c for c in JOB_RUNS_COLUMNS if c not in columns]
    if missing:
        return {"available": False, "runs": [],
                "note": f"job history table {schema}.{JOB_RUNS_TABLE} lacks column(s) {', '.join(missing)}: not read"}
    values = {"job_runs": f"{quote_ident(schema)}.{quote_ident(JOB_RUNS_TABLE)}"}
    params = {
        "lookback_s": options.job_lookback_s, "failure_window_s": options.job_failure_window_s,
        "success": adapter_for(conn).list_param(list(JOB_SUCCESS_OUTCOMES)),
        "not_failure": adapter_for(conn).list_param(list(JOB_NOT_FAILURE_OUTCOMES)),
    }
    runs = _optional(conn, notes, "job history", lambda: _rows(conn, "job_runs", params, values))
    for run in runs:
        run["next_run"] = None  # the scheduler's next fire times live in its process, not the catalog
    return {"available": True, "note": None, "runs": runs}


# -- checks --------------------------------------------------------------------------------------


@dataclass
class Check:
    """One graded finding. ``advice`` is one line, present exactly when status is not OK."""

    id: str  # stable, e.g. "queue.oldest_ready_age"
    section: str  # queues | storage | blockers | jobs
    object: str  # the queue, table, index, pid or slot it is about
    status: str
    summary: str
    value: float | None = None
    unit: str | None = None
    advice: str | None = None


def grade(value: float | None, threshold: Threshold) -> str:
    if value is None:
        return OK
    if threshold.crit is not None and value >= threshold.crit:
        return CRITICAL
    if threshold.warn is not None and value >= threshold.warn:
        return WARNING
    return OK


def index_bloat_pct(ix: dict[str, Any]) -> float | None:
    """Wasted share of the leaf level: free space beyond the index's fillfactor, plus empty
    and deleted pages. A fresh B-tree (density = fillfactor) scores 0."""
    p = ix.get("physical")
    if not p or not p.get("leaf_pages") or p.get("avg_leaf_density") is None:
        return None
    leaf, empty, deleted = p["leaf_pages"], p["empty_pages"] or 0, p["deleted_pages"] or 0
    fill = max(1.0, float(ix["fillfactor"]))
    used = leaf * min(1.0, p["avg_leaf_density"] / fill)
    return round(max(0.0, 100.0 * (1 - used / (leaf + empty + deleted))), 1)


def table_bloat_pct(t: dict[str, Any]) -> float | None:
    """Free space beyond the table's fillfactor reserve (pgstattuple_approx): room VACUUM has
    already reclaimed but the file still holds. Dead tuples are graded on their own."""
    p = t.get("physical")
    if not p or p.get("approx_free_percent") is None:
        return None
    return round(max(0.0, min(100.0, p["approx_free_percent"] - (100 - t["fillfactor"]))), 1)


def evaluate(facts: Facts, options: HealthOptions | None = None) -> list[Check]:
    """Grade the facts: every check carries its status, and advice when it is not OK."""
    options = options or HealthOptions()
    th = options.thresholds
    holders = horizon_holders(facts)
    dead_total = sum(t["n_dead_tup"] or 0 for t in facts.tables)
    checks: list[Check] = []
    checks += _queue_checks(facts, th, options)
    checks += _storage_checks(facts, th, options, holders)
    checks += _blocker_checks(facts, th, dead_total)
    checks += _job_checks(facts, th, options)
    return checks


def horizon_holders(facts: Facts) -> list[dict[str, Any]]:
    """Sessions holding a snapshot or an xid in this database, oldest first."""
    held = [s for s in facts.sessions if (s["backend_xmin"] or s["backend_xid"]) and s["xact_age_s"] is not None]
    return sorted(held, key=lambda s: -s["xact_age_s"])


def _queue_checks(facts: Facts, th: dict[str, Threshold], options: HealthOptions) -> list[Check]:
    checks: list[Check] = []
    for q in facts.queues:
        if not q.probed:
            if q.kind in KIND_HEALTH:
                advice = (f"queue {q.name} {q.notes[0] if q.notes else 'could not be read'}: "
                          f"look for a long lock on its tables ({facts.words.locks_view}) and run health again")
            else:
                advice = f"queue {q.name} is of kind {q.kind!r}, which this queuectl cannot inspect yet: upgrade queuectl"
            checks.append(Check("queue.probe", "queues", q.name, WARNING,
                                f"kind {q.kind}: depth and ages not checked", advice=advice))
            continue
        window = fmt_duration(q.window_s)
        done_rate = q.per_minute(q.completed_in_window)

        status = grade(q.oldest_ready_age_s, th["oldest_ready_age"])
        if q.oldest_ready_age_s is None:
            summary = "no due item waiting"
        else:
            summary = f"oldest due item waiting {fmt_duration(q.oldest_ready_age_s)} ({fmt_count(q.ready)} ready)"
        advice = None
        if status != OK:
            if q.completed_in_window is None:  # the kind deletes what it hands out: no completions to count
                why = "are consumers running? (this kind keeps no record of what it handed out)"
            elif q.completed_in_window == 0:
                why = f"nothing completed in the last {window}: are consumers running?"
            else:
                why = f"{done_rate:g}/min completed over {window}: add consumers or find what slows them"
            advice = (f"queue {q.name}: oldest due item has waited {fmt_duration(q.oldest_ready_age_s)} "
                      f"with {fmt_count(q.ready)} ready; {why}")
        checks.append(Check("queue.oldest_ready_age", "queues", q.name, status, summary,
                            q.oldest_ready_age_s, "seconds", advice))

        if q.stuck is not None:
            status = grade(q.stuck, th["stuck_items"])
            advice = None
            if status != OK:
                advice = (f"queue {q.name}: {fmt_count(q.stuck)} item(s) hold leases that expired up to "
                          f"{fmt_duration(q.oldest_expired_lease_s)} ago: their consumers died or stalled; the next "
                          "dequeue (or the stale-reset job) takes them back: check the consumers' logs")
                if q.rotation_stranded:
                    advice += ("; those in a sealed generation come back when the archive job empties it "
                               "(queue.rotation)")
            checks.append(Check("queue.stuck_items", "queues", q.name, status,
                                f"{fmt_count(q.stuck)} expired lease(s)", q.stuck, "count", advice))

        if q.dead is not None:
            status = grade(q.dead, th["dead_letters"])
            advice = None
            if status != OK:
                names = QueueNames(q.name, facts.schema)
                dead = STATUS_CODES["dead"]
                advice = (f"queue {q.name}: {fmt_count(q.dead)} dead letter(s) used up their attempts: read "
                          f"last_error (SELECT id, last_error FROM {names.qualified('meta')} WHERE status = {dead}), "
                          "fix the cause, then re-enqueue or archive them")
            checks.append(Check("queue.dead_letters", "queues", q.name, status,
                                f"{fmt_count(q.dead)} dead", q.dead, "count", advice))

        if q.ready is not None and (th["backlog"].warn is not None or th["backlog"].crit is not None):
            status = grade(q.ready, th["backlog"])
            advice = None if status == OK else (
                f"queue {q.name}: {fmt_count(q.ready)} due items waiting, {done_rate or 0:g}/min completed: "
                "add consumers or slow producers")
            checks.append(Check("queue.backlog", "queues", q.name, status, f"{fmt_count(q.ready)} due",
                                q.ready, "count", advice))

        if q.watermark_lag is not None and q.watermark_lag < 0:
            checks.append(Check(
                "queue.watermark_lag", "queues", q.name, CRITICAL,
                f"stored watermark {-q.watermark_lag} rows above the oldest waiting item", q.watermark_lag, "count",
                f"queue {q.name}: sessions starting from the stored watermark skip waiting items: "
                f"run queuectl correct-watermark {q.name} (and check the correct_watermark job runs)"))
        elif q.watermark_lag is not None:
            status = grade(q.watermark_lag, th["watermark_lag"])
            advice = None if status == OK else (
                f"queue {q.name}: stored watermark lags the head by {fmt_count(q.watermark_lag)} rows: "
                f"dequeues re-scan them: run queuectl correct-watermark {q.name} (the scheduler's watermark correction "
                "job, correct_watermark, does so every 5 minutes)")
            checks.append(Check("queue.watermark_lag", "queues", q.name, status,
                                f"watermark lag {fmt_count(q.watermark_lag)}", q.watermark_lag, "count", advice))

        if q.rotation_lag is not None:
            status = grade(q.rotation_lag, th["rotation_lag"])
            advice = None
            stranded = (q.rotation_stranded or 0) > 0 and (q.rotation_stranded_age_s or 0) >= ROTATION_STRANDED_AGE_S
            if q.rotation_blocked_by:
                status = worst(status, WARNING)
                advice = (f"queue {q.name}: a generation cannot be emptied: {q.rotation_blocked_by[0]} holds a lock "
                          f"on its tables: end that transaction; {facts.words.keep_off_live_tables}")
            elif stranded:
                status = worst(status, WARNING)
                advice = (f"queue {q.name}: {fmt_count(q.rotation_stranded)} item(s) due for up to "
                          f"{fmt_duration(q.rotation_stranded_age_s)} wait in a sealed generation (expired leases, "
                          "or ready items the seal passed over): no dequeue looks there until the archive job "
                          f"empties it and moves them forward: run queuectl schedule (or queuectl archive {q.name})")
            elif status != OK:
                advice = (f"queue {q.name}: {fmt_count(q.rotation_lag)} items since its generations last rotated: "
                          f"the archive job rotates them: run queuectl schedule (or queuectl archive {q.name} "
                          "--continuous)")
            summary = f"{fmt_count(q.rotation_lag)} items in the current generation"
            if q.rotation_blocked_by:
                summary += f"; emptying blocked by {len(q.rotation_blocked_by)} session(s)"
            if q.rotation_stranded:
                summary += f"; {fmt_count(q.rotation_stranded)} waiting in a sealed generation"
            checks.append(Check("queue.rotation", "queues", q.name, status, summary, q.rotation_lag, "count", advice))

        if q.compaction_blocked_by:
            # a ring or a DELETE-drained queue over its size bound whose compaction cannot get its lock
            checks.append(Check(
                "queue.compaction", "queues", q.name, WARNING,
                f"compaction due, blocked by {len(q.compaction_blocked_by)} session(s)", len(q.compaction_blocked_by),
                "count", f"queue {q.name}: its tables cannot be compacted: {q.compaction_blocked_by[0]} holds a lock on "
                "them: end that transaction; keep dumps and reports off the live tables (pg_dump --exclude-table-data)"))

        if q.ring_fill_pct is not None:
            status = grade(q.ring_fill_pct, th["ring_fill"])
            advice = None if status == OK else (
                f"ring {q.name} is {q.ring_fill_pct:.0f}% full: producers will wait when it fills; "
                "add consumers or reinstall with more slots")
            checks.append(Check("queue.ring_fill", "queues", q.name, status, f"{q.ring_fill_pct:.0f}% full",
                                q.ring_fill_pct, "percent", advice))
        checks += _kind_checks(q, th)
    return checks


def _kind_checks(q: QueueFacts, th: dict[str, Threshold]) -> list[Check]:
    """The checks of a kind's own numbers (QueueFacts.kind_fields) and of a fan-out ring's
    subscriptions."""
    f = q.kind_fields or {}
    checks: list[Check] = []
    for sub in q.subscriptions:
        # a subscription past its lag limit holds the producer back once the ring is full for it
        # (or was dropped and misses messages): CRITICAL either way
        where = f"{q.name}.{sub['name']}"
        lag = f"{fmt_count(sub['lag'])} messages behind (limit {fmt_count(sub['lag_limit'])})"
        if sub["dropped_at"] is not None:
            checks.append(Check("queue.subscription", "queues", where, CRITICAL, f"dropped; {lag}", sub["lag"],
                                "count", f"subscription {sub['name']} of ring {q.name} was dropped for lagging: it "
                                f"misses every message since; remove it (queuectl unsubscribe {q.name} "
                                f"{sub['name']}) and subscribe again once its consumers run"))
        elif sub["behind"]:
            checks.append(Check("queue.subscription", "queues", where, CRITICAL, lag, sub["lag"], "count",
                                f"subscription {sub['name']} of ring {q.name} is behind: its consumers stopped or "
                                "are too slow, and once the ring is full for it the producer waits: start or add "
                                f"consumers, or remove it (queuectl unsubscribe {q.name} {sub['name']}); "
                                "subscribe with --drop-when-behind to let the ring drop it instead"))
        else:
            checks.append(Check("queue.subscription", "queues", where, OK, lag, sub["lag"], "count"))
    if f.get("overdue") is not None:
        overdue = int(f["overdue"])
        status = grade(overdue, th["pending_overdue"])
        advice = None if status == OK else (
            f"queue {q.name}: {fmt_count(overdue)} item(s) due over {fmt_duration(OVERDUE_AFTER_S)} ago still wait "
            f"(the oldest for {fmt_duration(f.get('oldest_due_s'))}): consumers do not keep up with what falls due: "
            "add consumers or find what slows them")
        checks.append(Check("queue.pending_overdue", "queues", q.name, status,
                            f"{fmt_count(overdue)} overdue of {fmt_count(f.get('due'))} due", overdue, "count", advice))
    if f.get("sequence_gap") is not None and f.get("slots"):
        gap, slots = int(f["sequence_gap"]), int(f["slots"])
        # Pushes claimed minus pops claimed: the messages in the ring plus the positions
        # sessions keep. Past the slots, pushers hold positions no slot is free for: they wait.
        status = WARNING if gap > slots else OK
        advice = None if status == OK else (
            f"ring {q.name}: producers have claimed {fmt_count(gap - slots)} position(s) beyond its {fmt_count(slots)} "
            "slots and wait for consumers: add consumers, or reinstall with more slots; positions of pushers that "
            f"died are freed by queuectl repair-ring {q.name}")
        summary = (f"push/pop sequences {fmt_count(f.get('push_position'))} / {fmt_count(f.get('pop_position'))}, "
                   f"gap {fmt_count(gap)} of {fmt_count(slots)} slots, {fmt_count(f.get('free_slots'))} free")
        checks.append(Check("queue.ring_sequence_gap", "queues", q.name, status, summary, gap, "count", advice))
    return checks


def _storage_checks(facts: Facts, th: dict[str, Threshold], options: HealthOptions, holders: list[dict]) -> list[Check]:
    checks: list[Check] = []
    words = facts.words
    if facts.pgstattuple.startswith("unavailable"):
        checks.append(Check("storage.pgstattuple", "storage", "pgstattuple", INFO,
                            f"index density and table bloat not measured: {facts.pgstattuple.split(': ', 1)[1]}"))
    for t in facts.tables:
        name = t["table_name"]
        dead = t["n_dead_tup"] or 0
        status = grade(dead, th["dead_tuples"])
        live = t["n_live_tup"] or 0
        pct = 100.0 * dead / (live + dead) if live + dead else 0.0
        advice = None
        if status != OK:
            if holders:
                advice = words.dead_rows_held(name, fmt_count(dead), pct, holders[0], fmt_duration)
            else:
                last = max((d for d in (t["last_vacuum"], t["last_autovacuum"]) if d), default=None)
                since = "never vacuumed" if last is None else f"last vacuum {fmt_duration((facts.generated_at - last).total_seconds())} ago"
                advice = words.dead_rows_waiting(t, fmt_count(dead), pct, facts.schema, since, facts.server)
        checks.append(Check("storage.dead_tuples", "storage", name, status,
                            f"{fmt_count(dead)} {words.dead.split()[0]} / {fmt_count(live)} live", dead, "count", advice))

        bloat = table_bloat_pct(t)
        if bloat is not None and (t["pages"] or 0) >= options.table_min_pages:
            status = grade(bloat, th["table_bloat"])
            advice = None if status == OK else words.table_bloat(t, bloat, fmt_bytes(t["table_bytes"]))
            checks.append(Check("storage.table_bloat", "storage", name, status,
                                f"~{bloat:.0f}% bloat of {fmt_bytes(t['table_bytes'])}", bloat, "percent", advice))

    for ix in facts.indexes:
        name = ix["index_name"]
        if not ix["valid"] or ix["reindex_leftover"]:
            checks.append(Check("storage.invalid_index", "storage", name, WARNING, words.invalid_index_summary,
                                advice=words.invalid_index(ix, facts.schema)))
            continue
        judged = reorganize_judgement(facts, ix, th, options)
        if judged is None:
            continue
        bloat, decision, command = judged["bloat_pct"], judged["decision"], judged["command"]
        p = ix["physical"]
        if decision in ("rebuild", "reorganize"):
            # reorganize acts on it: at least a WARNING, CRITICAL from index_bloat.crit
            status = worst(WARNING, grade(bloat, th["index_bloat"]))
        elif decision == "not measured":
            status = grade(bloat, th["index_bloat"]) if judged["pages"] >= options.index_min_pages else OK
        else:  # small, ok, watch, skipped: reorganize would leave it alone, so health does
            status = OK
        advice = None
        if status != OK:
            detail = (f"leaf density {p['avg_leaf_density']:.0f}%, {fmt_count(p['leaf_pages'])} leaf pages, "
                      f"{fmt_bytes(ix['index_bytes'])}")
            advice = words.index_bloat(ix, bloat, detail, command, holders[0] if holders else None, fmt_duration)
        checks.append(Check("storage.index_bloat", "storage", name, status,
                            f"{bloat:.0f}% bloat, leaf density {p['avg_leaf_density']:.0f}%; reorganize: {decision}",
                            bloat, "percent", advice))
    return checks


def reorganize_command(queue: str, min_pages: int, bloat_pct: float) -> str:
    """The `queuectl reorganize` command that judges an index as health did: the queue, and
    the options whose values health's settings changed."""
    command = f"queuectl reorganize {queue}"
    if min_pages != MIN_INDEX_PAGES:
        command += f" --min-pages {min_pages}"
    if bloat_pct != REBUILD_BLOAT_PCT:
        command += f" --bloat {bloat_pct:g}"
    return command


def reorganize_judgement(facts: Facts, ix: dict[str, Any], th: dict[str, Threshold],
                         options: HealthOptions) -> dict[str, Any] | None:
    """What `queuectl reorganize` would decide for a measured index (None: not measured),
    with reorganize's own rules (the engine's decide()) and thresholds: its minimum size is
    options.index_min_pages and its rebuild bloat index_bloat's warn level, so the command
    named in the advice acts on exactly the indexes health calls bloated."""
    from queuectl.jobs.reorganize import ReorganizeConfig

    p = ix.get("physical")
    if not p or not p.get("leaf_pages") or p.get("avg_leaf_density") is None:  # empty, or not a B-tree
        return None
    bloat_pct = th["index_bloat"].warn if th["index_bloat"].warn is not None else REBUILD_BLOAT_PCT
    config = ReorganizeConfig(dry_run=True, min_pages=options.index_min_pages, rebuild_bloat_pct=bloat_pct)
    measure = facts.upkeep.measure_from_health(ix)
    decision, reason = facts.upkeep.decide(measure, config, ServerAbilities())
    bloat = measure.bloat_pct
    if bloat is None:  # SQL Server: no pgstatindex estimate; the leaf level's free space beyond the fill factor
        bloat = index_bloat_pct(ix)
    if bloat is None:
        return None
    return {"decision": decision, "reason": reason, "bloat_pct": bloat, "pages": measure.pages,
            "command": reorganize_command(ix["queue"], options.index_min_pages, bloat_pct)}


def _session_label(s: dict[str, Any]) -> str:
    who = s["usename"] or s["backend_type"]
    app = f", app {s['application_name']!r}" if s["application_name"] else ""
    return f"{who}, {s['state'] or s['backend_type']}{app}"


def _blocker_checks(facts: Facts, th: dict[str, Threshold], dead_total: int) -> list[Check]:
    checks: list[Check] = []
    words = facts.words
    worst_session = OK
    for s in facts.sessions:
        holds = bool(s["backend_xmin"] or s["backend_xid"])
        idle = (s["state"] or "").startswith("idle in transaction")
        age_status = grade(s["xact_age_s"], th["xact_age"]) if holds else OK
        idle_status = grade(s["state_age_s"], th["idle_in_transaction"]) if idle else OK
        status = worst(age_status, idle_status)
        worst_session = worst(worst_session, status)
        if status == OK:
            continue
        pid = s["pid"]
        if RANK[age_status] >= RANK[idle_status]:
            summary = words.open_transaction_summary(fmt_duration(s["xact_age_s"]), _session_label(s))
            advice = words.open_transaction(pid, _session_label(s), fmt_duration(s["xact_age_s"]), fmt_count(dead_total))
        else:
            summary = f"idle in transaction for {fmt_duration(s['state_age_s'])} ({_session_label(s)})"
            advice = words.idle_in_transaction(pid, _session_label(s), fmt_duration(s["state_age_s"]), holds)
        checks.append(Check("blockers.session", "blockers", f"{words.session} {pid}", status, summary,
                            s["xact_age_s"] if holds else s["state_age_s"], "seconds", advice))
    if worst_session == OK:
        holders = horizon_holders(facts)
        summary = (words.oldest_transaction(fmt_duration(holders[0]["xact_age_s"]), holders[0]["pid"])
                   if holders else words.no_holder)
        checks.append(Check("blockers.session", "blockers", facts.server["database"], OK, summary,
                            holders[0]["xact_age_s"] if holders else 0.0, "seconds"))

    for slot in facts.replication_slots:
        name = slot["slot_name"]
        age_status = grade(slot["xmin_age_xids"], th["slot_xmin_age"])
        status = worst(age_status, WARNING if not slot["active"] else OK)
        wal = fmt_bytes(slot["retained_wal_bytes"]) if slot["retained_wal_bytes"] is not None else "unknown"
        summary = words.slot_summary(slot, wal, fmt_count)
        advice = None if status == OK else words.slot(slot, wal)
        checks.append(Check("blockers.replication_slot", "blockers", name, status, summary,
                            slot["xmin_age_xids"], "xids", advice))

    for r in facts.standby_feedback:
        status = grade(r["xmin_age_xids"], th["slot_xmin_age"])
        advice = None if status == OK else words.standby(r, fmt_count)
        checks.append(Check("blockers.standby_feedback", "blockers", r["application_name"] or str(r["pid"]), status,
                            words.standby_summary(r, fmt_count), r["xmin_age_xids"], "xids", advice))

    for p in facts.prepared_xacts:
        gid = p["gid"]
        if p["this_database"]:
            status = grade(p["age_s"], th["prepared_xact_age"])
            advice = None if status == OK else words.prepared_here(p, fmt_duration(p["age_s"]), fmt_count(dead_total))
        else:
            status = INFO
            advice = words.prepared_elsewhere(p, fmt_duration(p["age_s"]))
        checks.append(Check("blockers.prepared_xact", "blockers", gid, status,
                            f"prepared {fmt_duration(p['age_s'])} ago in {p['database']}", p["age_s"], "seconds", advice))
    return checks


def _job_checks(facts: Facts, th: dict[str, Threshold], options: HealthOptions) -> list[Check]:
    checks = [
        Check("jobs.unplanned_queue", "jobs", f"{u.job} on {u.queue}", WARNING,
              f"named in [jobs.{u.job}] queues, never run: {u.reason}",
              advice=f"{u.line()}: correct the name or take it out of [jobs.{u.job}] queues in the scheduler's config")
        for u in facts.unplanned_jobs
    ]
    jobs = facts.jobs
    if not jobs["available"]:
        return [*checks, Check("jobs.history", "jobs", "scheduler", INFO, jobs["note"])]
    if not jobs["runs"]:
        return [*checks, Check("jobs.history", "jobs", "scheduler", INFO,
                               f"no job ran in the last {fmt_duration(options.job_lookback_s)}")]
    window = fmt_duration(options.job_failure_window_s)
    for run in jobs["runs"]:
        target = f"{run['job']}" + (f" on {run['queue']}" if run["queue"] else "")
        failed_last = run["finished_at"] is not None and run["outcome"] not in JOB_NOT_FAILURE_OUTCOMES
        status = worst(grade(run["failures"], th["job_failures"]), WARNING if failed_last else OK)
        summary = (f"last run {run['outcome'] or 'running'}"
                   + (f" in {fmt_duration(run['duration_s'])}" if run["duration_s"] is not None else "")
                   + f", {run['failures']} failure(s) in {window}")
        advice = None
        if status != OK:
            error = f": {run['error']}" if run["error"] else ""
            advice = (f"job {target} failed {run['failures']} time(s) in {window}, last outcome "
                      f"{run['outcome']}{error}: see queuectl jobs history")
        checks.append(Check("jobs.last_run", "jobs", target, status, summary, run["failures"], "count", advice))
    return checks


# -- the report ----------------------------------------------------------------------------------


@dataclass
class HealthReport:
    facts: Facts
    checks: list[Check]
    options: HealthOptions
    url: str | None = None

    @property
    def verdict(self) -> str:
        return worst(OK, *(c.status for c in self.checks if c.status != INFO))

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def advice(self) -> list[Check]:
        """Non-OK checks, worst first: the lines a DBA acts on."""
        return sorted((c for c in self.checks if c.advice), key=lambda c: (-RANK[c.status], _ROOT_CAUSE_FIRST[c.section]))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object documented by health_schema.json."""
        f = self.facts
        counts = dict.fromkeys(STATUSES, 0)
        for c in self.checks:
            counts[c.status] += 1
        return _jsonable({
            "format": REPORT_FORMAT,
            "generated_at": f.generated_at,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "counts": counts,
            "database": {
                "name": f.server["database"], "url": self.url, "server_version": f.server["server_version"],
                "in_recovery": f.server["in_recovery"], "schema": f.schema,
                "autovacuum": f.server["autovacuum_on"], "pgstattuple": f.pgstattuple,
            },
            "thresholds": {t.name: {"unit": t.unit, "warn": t.warn, "crit": t.crit}
                           for t in self.options.thresholds.values()},
            "queues": [_queue_dict(q) for q in f.queues],
            "storage": {
                "tables": [_table_dict(t) for t in f.tables],
                "indexes": [_index_dict(ix, reorganize_judgement(f, ix, self.options.thresholds, self.options))
                            for ix in f.indexes],
            },
            "blockers": {
                "sessions": f.sessions, "replication_slots": f.replication_slots,
                "standby_feedback": f.standby_feedback, "prepared_xacts": f.prepared_xacts,
                "dead_tuples_in_queue_tables": sum(t["n_dead_tup"] or 0 for t in f.tables),
            },
            "jobs": f.jobs,
            "checks": [asdict(c) for c in self.checks],
            "notes": f.notes,
        })


def _queue_dict(q: QueueFacts) -> dict[str, Any]:
    return {
        "name": q.name, "kind": q.kind, "probed": q.probed,
        "depth": {k: getattr(q, k) for k in ("ready", "scheduled", "processing", "done", "dead")},
        "oldest_ready_age_s": q.oldest_ready_age_s, "stuck": q.stuck,
        "oldest_expired_lease_s": q.oldest_expired_lease_s,
        "rates": {"window_s": q.window_s, "enqueued": q.enqueued_in_window, "dequeued": q.dequeued_in_window,
                  "completed": q.completed_in_window, "died": q.died_in_window,
                  "enqueued_per_min": q.per_minute(q.enqueued_in_window),
                  "dequeued_per_min": q.per_minute(q.dequeued_in_window),
                  "completed_per_min": q.per_minute(q.completed_in_window)},
        "watermark_lag": q.watermark_lag, "ring_fill_pct": q.ring_fill_pct,
        "rotation": None if q.rotation_lag is None else {
            "lag": q.rotation_lag, "blocked_by": q.rotation_blocked_by,
            "stranded": q.rotation_stranded, "stranded_age_s": q.rotation_stranded_age_s},
        "kind_fields": q.kind_fields,
        "notes": q.notes,
    }


def _table_dict(t: dict[str, Any]) -> dict[str, Any]:
    live, dead = t["n_live_tup"] or 0, t["n_dead_tup"] or 0
    upd = t["n_tup_upd"] or 0
    return {
        "queue": t["queue"], "table": t["table_name"], "live_tuples": live, "dead_tuples": dead,
        "dead_pct": round(100.0 * dead / (live + dead), 1) if live + dead else 0.0,
        "hot_update_pct": round(100.0 * (t["n_tup_hot_upd"] or 0) / upd, 1) if upd else None,
        "table_bytes": t["table_bytes"], "index_bytes": t["index_bytes"], "pages": t["pages"],
        "fillfactor": t["fillfactor"], "bloat_pct": table_bloat_pct(t),
        "last_vacuum": t["last_vacuum"], "last_autovacuum": t["last_autovacuum"],
        "last_analyze": t["last_analyze"], "last_autoanalyze": t["last_autoanalyze"],
        "vacuum_count": t["vacuum_count"], "autovacuum_count": t["autovacuum_count"],
        "autovacuum": autovacuum_options(t.get("autovacuum_options")),
        "physical": t.get("physical"),
    }


def autovacuum_options(options: list[str] | None) -> dict[str, str] | None:
    """The table's own autovacuum storage parameters by name, its TOAST table's as
    toast.<name> ({}: the server's settings apply); None where the engine has no per-table
    autovacuum (SQL Server)."""
    if options is None:
        return None
    return dict(option.split("=", 1) for option in options)


def _index_dict(ix: dict[str, Any], judged: dict[str, Any] | None) -> dict[str, Any]:
    p = ix.get("physical")
    return {
        "queue": ix["queue"], "index": ix["index_name"], "method": ix["method"], "index_bytes": ix["index_bytes"],
        "valid": ix["valid"] and not ix["reindex_leftover"], "scans": ix["idx_scan"], "fillfactor": ix["fillfactor"],
        "leaf_pages": p["leaf_pages"] if p else None,
        "avg_leaf_density": p["avg_leaf_density"] if p else None,
        "leaf_fragmentation": p["leaf_fragmentation"] if p else None,
        "bloat_pct": index_bloat_pct(ix), "physical": p,
        "reorganize": None if judged is None else {k: judged[k] for k in ("decision", "reason", "command")},
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).isoformat()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "is_finite"):  # Decimal from numeric columns
        return float(value) if value.is_finite() else None
    return value


def health_report(
    engine: Engine,
    queues: Sequence[str] | None = None,
    schema: str = DEFAULT_SCHEMA,
    options: HealthOptions | None = None,
) -> HealthReport:
    """Gather and grade: the one call behind `queuectl health`."""
    options = options or HealthOptions()
    facts = gather_facts(engine, queues, schema, options)
    return HealthReport(facts, evaluate(facts, options), options, url=mask_url(engine.url))


def report_schema() -> dict[str, Any]:
    """The JSON Schema of HealthReport.to_dict() (packaged as queuectl/health_schema.json)."""
    import json
    from importlib import resources

    return json.loads(resources.files("queuectl").joinpath("health_schema.json").read_text("utf-8"))
