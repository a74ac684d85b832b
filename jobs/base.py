"""What every maintenance job shares: durations, the queue a job works on, its SQL.

A job is a module with a config dataclass (named defaults, validated at construction),
a `run_once(engine, queue, config, *, schema, stop)` that works in short batches and
returns a small result, and nothing else. The runner (queuectl.jobs.runner) adds the
single-runner lock and the job-run history; the scheduler only calls the runner.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, fields
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from queuectl.catalog import QueueInfo
from queuectl.durations import duration_seconds
from queuectl.engine import adapter_for
from queuectl.errors import QueuectlError, UsageError
from queuectl.kindspec import kind_template_values, upkeep_tables
from queuectl.registry import require_queue
from queuectl.names import QueueNames
from queuectl.sqlfiles import render


def parse_duration(value: str | int | float, what: str = "duration") -> float:
    """Seconds from '250ms', '30s', '5m', '2h', '30d' or a plain number of seconds."""
    if isinstance(value, bool):
        raise UsageError(f"{what} must be a duration like 30s, 5m, 2h or 30d, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        parsed = duration_seconds(str(value))
        if parsed is None:
            raise UsageError(f"{what} must be a duration like 30s, 5m, 2h or 30d, got {value!r}")
        seconds = parsed
    if not 0 <= seconds <= 10 * 366 * 86400:
        raise UsageError(f"{what} must be between 0 and 10 years, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def pg_interval(seconds: float) -> str:
    """A timeout setting value: whole milliseconds ('0' switches the timeout off)."""
    return f"{max(int(round(seconds * 1000)), 0)}ms"


def _lock_timeout_ms(seconds: float) -> int:
    """SET LOCK_TIMEOUT's value on SQL Server, rendered into the SQL (a SET inside
    sp_executesql is undone when it returns); at least 1 ms, as 0 means "do not wait"."""
    return max(1, round(seconds * 1000))


def config_from_options(config_cls: type, options: dict[str, Any], what: str) -> Any:
    """Build a job's config dataclass from TOML/CLI options; durations may be strings."""
    known = {f.name: f for f in fields(config_cls)}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise UsageError(f"{what}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    values: dict[str, Any] = {}
    for key, value in options.items():
        if key in getattr(config_cls, "DURATIONS", ()):
            values[key] = None if value is None else parse_duration(value, f"{what} {key}")
        else:
            values[key] = value
    return config_cls(**values)


def check_number(name: str, value: Any, low: float, high: float, *, integer: bool = False, optional: bool = False) -> None:
    if value is None and optional:
        return
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not low <= value <= high:
        kind = "a whole number" if integer else "a number"
        raise UsageError(f"{name.replace('_', '-')} must be {kind} from {low:g} to {high:g}, got {value!r}")


class JobResult(Protocol):
    """What a job's run_once returns: rows it worked on, a one-line summary, details."""

    rows: int

    @property
    def error(self) -> str | None: ...

    def summary(self) -> str: ...

    def as_dict(self) -> dict[str, Any]: ...


class JobFailed(QueuectlError):
    """A job run failed; the job-run history has the error."""


class JobBusy(QueuectlError):
    """Another runner holds the single-runner lock of this job and queue."""


@functools.lru_cache(maxsize=1024)
def _job_sql(names: QueueNames, kind: str, sql_dir: str, section: str,
             extra: tuple[tuple[str, str | int], ...]) -> sa.TextClause:
    values: dict[str, str | int] = {**names.template_values(), **kind_template_values(names, kind), **dict(extra)}
    return sa.text(render(sql_dir, "jobs", section, values))


@dataclass(frozen=True)
class JobTarget:
    """The queue a job works on, with its statements rendered from sql/<engine>/jobs.sql."""

    names: QueueNames
    info: QueueInfo
    sql_dir: str

    @classmethod
    def resolve(cls, engine: Engine, queue: "str | JobTarget", schema: str, kinds: tuple[str, ...]) -> "JobTarget":
        """The queue a job works on, read from the registry; a JobTarget given as `queue`
        (the runner read it already) is used as it is, so a run reads the registry once."""
        if isinstance(queue, JobTarget):
            target = queue
        else:
            with engine.connect() as conn:
                info = require_queue(conn, queue, schema)
            target = cls(QueueNames(queue, schema), info, adapter_for(engine).sql_dir)
        if target.info.kind not in kinds:
            raise UsageError(f"queue {target.names.queue!r} is of kind {target.info.kind!r}; "
                             f"this job works on {', '.join(kinds)} queues")
        return target

    @property
    def kind(self) -> str:
        return self.info.kind if self.info is not None else "reliable"

    @property
    def tables(self) -> tuple[str, ...]:
        """The suffixes of the queue's tables the upkeep jobs look after (kindspec.UPKEEP_TABLES),
        those its revision has. A reliable queue's meta and data on SQL Server at reliable_0012
        or later are views over the generation slots: its tables are the slots (meta0..2,
        data0..2); PostgreSQL's partitioned parents stand for their slots (jobs.sql's sections
        list a parent's partitions)."""
        version = getattr(self.info, "schema_version", None)
        tables = upkeep_tables(self.kind, version)
        if self.sql_dir == "mssql" and self.kind == "reliable" and (version is None or version >= "reliable_0012"):
            return tuple(f"{table}{slot}" for table in tables for slot in range(3))
        return tables

    def sql(self, section: str, **extra: str | int) -> sa.TextClause:
        """A section of sql/<engine>/jobs.sql rendered for this queue (and `extra`), once: the
        archive job runs a few statements per transaction, several transactions a generation."""
        return _job_sql(self.names, self.kind, self.sql_dir, section, tuple(sorted(extra.items())))

    def row_sql(self, section: str) -> list[sa.TextClause]:
        """A statement that writes a reliable queue's meta and data rows (archive_batch,
        reset_stale_batch): once, on <queue>_meta and <queue>_data, or, on SQL Server at
        reliable_0012 or later, once per generation slot on that slot's own tables and indexes
        (<queue>_meta is a view over the slots there, which no statement writes through;
        PostgreSQL's is the partitioned parent, written as one table)."""
        version = getattr(self.info, "schema_version", None) or ""
        if self.sql_dir != "mssql" or self.kind != "reliable" or version < "reliable_0012":
            return [self.sql(section)]
        v = self.names.template_values()
        return [self.sql(section, meta=v[f"meta{s}"], data=v[f"data{s}"], ready_idx=v[f"meta{s}_ready"],
                         leased_idx=v[f"meta{s}_leased"], finished_idx=v[f"meta{s}_finished"]) for s in range(3)]

    def set_local_timeouts(self, conn: Connection, lock_timeout: float, statement_timeout: float) -> None:
        conn.execute(
            self.sql("set_local_timeouts", lock_timeout_ms=_lock_timeout_ms(lock_timeout)),
            {"lock_timeout": pg_interval(lock_timeout), "statement_timeout": pg_interval(statement_timeout)},
        )

    def set_session_timeouts(self, conn: Connection, lock_timeout: float, statement_timeout: float) -> None:
        conn.execute(
            self.sql("set_session_timeouts", lock_timeout_ms=_lock_timeout_ms(lock_timeout)),
            {"lock_timeout": pg_interval(lock_timeout), "statement_timeout": pg_interval(statement_timeout)},
        )

    def reset_session_timeouts(self, conn: Connection) -> None:
        """Undo set_session_timeouts on a connection about to go back to the pool."""
        conn.execute(self.sql("reset_session_timeouts"))


def sleep_unless_stopped(stop: threading.Event | None, seconds: float) -> bool:
    """Pause; True when asked to stop meanwhile."""
    if seconds <= 0:
        return bool(stop and stop.is_set())
    if stop is None:
        threading.Event().wait(seconds)
        return False
    return stop.wait(seconds)


def lock_holders(conn: Any, sql_dir: str, names: Any, tables: list[str], min_age_s: float) -> list[str]:
    """The sessions holding a lock on `tables` (qualified names) in transactions older than
    `min_age_s`, oldest first, each in one phrase: what keeps a truncate or a compaction
    waiting (health.sql rotation_blockers; the jobs' logs and health's advice name them alike).
    Its :tables is a text[] on PostgreSQL, the names joined by commas on SQL Server (no array
    parameters there; queue and schema names hold no comma)."""
    sql = sa.text(render(sql_dir, "health", "rotation_blockers", names.template_values()))
    who = "session" if sql_dir == "mssql" else "pid"
    param = ",".join(tables) if sql_dir == "mssql" else tables
    return [f"{who} {r.pid} ({r.usename}, {r.state}, {r.mode}, in its transaction for "
            f"{format_duration(round(r.xact_age_s or 0, 1))})"
            for r in conn.execute(sql, {"tables": param, "min_age_s": min_age_s}) if r.pid is not None]
