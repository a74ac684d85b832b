"""Running a job: one runner at a time per (job, queue), and a history row for every run.

The single-runner lock is a session-level advisory lock (Adapter.lock_statement) held on
a dedicated connection for the whole run, so several schedulers (and people running jobs
by hand) can share a database without ever running the same job on the same queue twice
at once. The run's history row is opened after the lock is taken and closed before it is
released, so the runs of one (job, queue) in the history never overlap.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, ProgrammingError

from queuectl.engine import adapter_for
from queuectl.errors import QueuectlError
from queuectl.jobs.base import JobBusy, JobResult, JobTarget, error_text
from queuectl.jobs.registry import JobSpec, job_spec
from queuectl.names import DEFAULT_SCHEMA, quote_ident
from queuectl.sqlfiles import render

log = logging.getLogger("queuectl.jobs")

RUNNER_HOST = socket.gethostname()


@dataclass(frozen=True)
class RunRecord:
    """One finished run, as recorded in the job-run history."""

    run_id: int
    job: str
    queue: str
    outcome: str                 # succeeded | failed
    rows: int | None
    error: str | None
    started_at: datetime
    finished_at: datetime
    result: Any = None           # the job's result object (None when it raised)


def lock_key(schema: str, job: str, queue: str) -> str:
    return f"queuectl.job:{schema}:{job}:{queue}"


def catalog_sql(engine_or_conn: Engine | Connection, section: str, schema: str) -> sa.TextClause:
    values = {"schema": quote_ident(schema)}
    return sa.text(render(adapter_for(engine_or_conn).sql_dir, "catalog_jobs", section, values))


@contextmanager
def single_runner(engine: Engine, key: str, what: str) -> Iterator[Connection]:
    """Hold the advisory lock `key` on a dedicated autocommit connection, or raise JobBusy."""
    adapter = adapter_for(engine)
    conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        got = conn.execute(sa.text(adapter.lock_statement()), {"key": key}).scalar()
    except BaseException:
        conn.close()
        raise
    if not got:
        conn.close()
        raise JobBusy(f"{what} is already running elsewhere (another runner holds its lock)")
    try:
        yield conn
    finally:
        try:
            conn.execute(sa.text(adapter.unlock_statement()), {"key": key})
            conn.close()
        except BaseException:
            # Never hand a connection that may still hold the lock back to the pool.
            conn.invalidate()
            conn.close()


def _missing_catalog(exc: ProgrammingError) -> QueuectlError:
    return QueuectlError(
        f"the catalog has no job-run history table ({error_text(exc)}): run `queuectl upgrade`"
    )


def run_job(
    engine: Engine,
    job: str | JobSpec,
    queue: str,
    config: Any = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    trigger: str = "manual",
    stop: threading.Event | None = None,
    call: Callable[..., JobResult] | None = None,
) -> RunRecord:
    """Run one job on one queue under its single-runner lock, recording the run.

    `call` replaces the job's run_once (e.g. archive's continuous mode); it is called as
    call(engine, queue, config, schema=..., stop=...). Raises JobBusy when another runner
    holds the lock (nothing recorded); a job that fails is recorded as failed and returned
    with outcome 'failed' (its exception is not re-raised, except interrupts).
    """
    spec = job if isinstance(job, JobSpec) else job_spec(job)
    JobTarget.resolve(engine, queue, schema, spec.kinds)  # the queue exists and is of a kind this job serves
    config = config if config is not None else spec.config_cls()
    call = call or spec.run_once
    params = {"job": spec.name, "queue": queue}
    with single_runner(engine, lock_key(schema, spec.name, queue), f"{spec.name} on queue {queue}") as conn:
        try:
            abandoned = conn.execute(catalog_sql(conn, "run_abandon", schema), params).rowcount
            started = conn.execute(
                catalog_sql(conn, "run_start", schema),
                {**params, "trigger": trigger, "runner_host": RUNNER_HOST, "runner_pid": os.getpid()},
            ).one()
        except ProgrammingError as exc:
            raise _missing_catalog(exc) from None
        if abandoned:
            log.warning("%s %s: marked %d earlier run(s) abandoned (their runner stopped mid-run)", spec.name, queue, abandoned)
        result: Any = None
        try:
            result = call(engine, queue, config, schema=schema, stop=stop)
            outcome, error = ("failed", result.error) if result.error else ("succeeded", None)
        except (KeyboardInterrupt, SystemExit):
            _finish(conn, schema, started.id, "failed", None, "interrupted", None, None)
            raise
        except Exception as exc:  # recorded, then reported to the caller in the record
            outcome, error = "failed", error_text(exc, engine)
            if not isinstance(exc, (DBAPIError, QueuectlError)):
                log.exception("%s %s: unexpected error", spec.name, queue)
        rows = None if result is None else result.rows
        summary = None if result is None else result.summary()
        details = None if result is None else json.dumps(result.as_dict(), default=str)
        finished_at = _finish(conn, schema, started.id, outcome, rows, error, summary, details)
    return RunRecord(started.id, spec.name, queue, outcome, rows, error, started.started_at, finished_at, result)


def _finish(conn: Connection, schema: str, run_id: int, outcome: str, rows: int | None, error: str | None,
            summary: str | None, details: str | None) -> datetime:
    return conn.execute(
        catalog_sql(conn, "run_finish", schema),
        {"id": run_id, "outcome": outcome, "rows": rows, "error": error, "summary": summary, "details": details},
    ).scalar_one()


def recent_runs(engine: Engine, *, schema: str = DEFAULT_SCHEMA, last: int = 20, job: str | None = None,
                queue: str | None = None) -> list[dict[str, Any]]:
    """The newest job runs, newest first."""
    with engine.connect() as conn:
        try:
            rows = conn.execute(
                catalog_sql(conn, "runs_recent", schema), {"job": job, "queue": queue, "limit": last}
            ).mappings().all()
        except ProgrammingError as exc:
            raise _missing_catalog(exc) from None
    return [dict(r) for r in rows]


def last_runs(engine: Engine, *, schema: str = DEFAULT_SCHEMA) -> dict[tuple[str, str], dict[str, Any]]:
    """The last run of every (job, queue)."""
    with engine.connect() as conn:
        try:
            rows = conn.execute(catalog_sql(conn, "runs_last", schema)).mappings().all()
        except ProgrammingError as exc:
            raise _missing_catalog(exc) from None
    return {(r["job"], r["queue"]): dict(r) for r in rows}
