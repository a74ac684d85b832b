"""Running a job: one runner at a time per (job, queue), and a history row for every run.

The single-runner lock is a session-level lock (queuectl.locks) held on
a dedicated connection for the whole run, so several schedulers (and people running jobs
by hand) can share a database without ever running the same job on the same queue twice
at once. The run's history row is opened after the lock is taken and closed before it is
released, so the runs of one (job, queue) in the history never overlap.

A lock is a session's: when its connection is lost (server restart, pg_terminate_backend)
the lock goes with it. A watchdog (RunnerLock.watch) checks the connection every
LOCK_CHECK_S; after a loss it reconnects with jittered back-off for up to
RECONNECT_TOTAL_S and takes the lock again. If another runner took it meanwhile, or the
server stays away, the run is told to stop after its current batch and is recorded as
failed. Between the loss and the re-take another runner may start the same job: jobs
work in short SKIP LOCKED batches, so that costs throughput, never rows.
A run whose runner died stays 'running' until a runner takes its lock again: the next
run of that (job, queue), or abandon_orphaned_runs (the scheduler calls it at start and
at every refresh), which marks it 'abandoned'.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, ProgrammingError

from queuectl import locks
from queuectl.engine import adapter_for, backoff_pause, discard_connection
from queuectl.engine.urls import mask_url
from queuectl.errors import ConnectionFailed, QueuectlError
from queuectl.engine.urls import error_text
from queuectl.jobs.base import JobBusy, JobResult, JobTarget
from queuectl.jobs.registry import JOBS, JobSpec, job_spec
from queuectl.locks import Lock
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


def lock_key(schema: str, job: str, queue: str) -> Lock:
    return Lock(schema, f"queuectl.job:{schema}:{job}:{queue}", "its single-runner lock")


def catalog_sql(engine_or_conn: Engine | Connection, section: str, schema: str) -> sa.TextClause:
    values = {"schema": quote_ident(schema)}
    return sa.text(render(adapter_for(engine_or_conn).sql_dir, "catalog_jobs", section, values))


LOCK_CHECK_S = 5.0          # how often a run's watchdog checks its lock connection
RECONNECT_TOTAL_S = 30.0    # how long it tries to get the connection (and the lock) back
RECONNECT_FIRST_S = 0.05    # first pause, doubling ...
RECONNECT_MAX_PAUSE_S = 2.0  # ... up to this, each jittered


class RunnerLock:
    """A single-runner lock held on a dedicated autocommit connection (see the module docstring)."""

    def __init__(self, engine: Engine, lock: Lock, what: str) -> None:
        self.engine = engine
        self.lock = lock
        self.what = what
        self.key: str | None = None     # the key the server holds the lock by (queuectl.locks.key_of)
        self.busy: str | None = None    # who held the lock when acquire() found it taken
        self.lost: str | None = None    # why the run no longer holds its lock
        self.retaken = 0
        self._conn: Connection | None = None

    def acquire(self) -> bool:
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            key = locks.key_of(conn, self.lock)
            if not locks.try_take(conn, key):
                self.busy = locks.busy_message(conn, self.lock, key)
                conn.close()
                return False
        except BaseException:
            conn.close()
            raise
        self.key, self._conn = key, conn
        return True

    def execute(self, statement: sa.Executable, params: dict[str, Any]) -> sa.CursorResult:
        """Run a statement on the lock's connection; after a lost connection get it (and the
        lock) back first. Only for statements that are safe to send twice."""
        if self._conn is None or self._conn.invalidated or self._conn.closed:
            self._regain()
        try:
            return self._conn.execute(statement, params)
        except DBAPIError as exc:
            if not (exc.connection_invalidated or self._conn.invalidated or self._conn.closed):
                raise
        self._regain()
        return self._conn.execute(statement, params)

    def check(self) -> None:
        """The watchdog's probe: a round trip; after a lost connection, regain the lock."""
        try:
            self.execute(sa.select(sa.literal(1)), {})
        except ConnectionFailed as exc:
            self.lost = str(exc)

    def _regain(self) -> None:
        """Reconnect with jittered back-off and take the lock again (when another runner has
        it, set `lost` and keep a plain connection); ConnectionFailed when the server stays away."""
        self._drop()
        deadline = time.monotonic() + RECONNECT_TOTAL_S
        attempt = 0
        while True:
            try:
                if self.acquire():
                    self.retaken += 1
                    log.warning("%s: connection of its single-runner lock was lost; reconnected and took the lock again",
                                self.what)
                    return
                self.lost = (f"{self.what}: lost its single-runner lock with its connection, and another runner "
                             "took it meanwhile: stopped after the current batch")
                # a connection without the lock, to record the run's end
                self._conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                return
            except DBAPIError as exc:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ConnectionFailed(
                        f"{self.what}: gave up reconnecting to {mask_url(self.engine.url)} after "
                        f"{RECONNECT_TOTAL_S:g} s ({error_text(exc, self.engine)})"
                    ) from None
                pause = backoff_pause(attempt, RECONNECT_FIRST_S, RECONNECT_MAX_PAUSE_S)
                attempt += 1
                time.sleep(min(pause, remaining))

    @contextmanager
    def watch(self, outer_stop: threading.Event | None) -> Iterator[threading.Event]:
        """A stop event for the run: set when `outer_stop` is, or when the lock is lost."""
        run_stop = threading.Event()
        finished = threading.Event()

        def watchdog() -> None:
            next_check = time.monotonic() + LOCK_CHECK_S
            while not finished.wait(0.2):
                if outer_stop is not None and outer_stop.is_set():
                    run_stop.set()
                if time.monotonic() >= next_check:
                    self.check()
                    next_check = time.monotonic() + LOCK_CHECK_S
                if self.lost:
                    run_stop.set()
                    return

        thread = threading.Thread(target=watchdog, name=f"queuectl-lock:{self.lock.name}", daemon=True)
        thread.start()
        try:
            yield run_stop
        finally:
            finished.set()
            thread.join()

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if not self.lost and self.key is not None:
                locks.release(conn, self.key)
            conn.close()
        except BaseException:
            # Never hand a connection that may still hold the lock back to the pool.
            conn.invalidate()
            conn.close()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        discard_connection(conn)


@contextmanager
def single_runner(engine: Engine, key: Lock, what: str) -> Iterator[RunnerLock]:
    """Hold the lock `key` on a dedicated autocommit connection, or raise JobBusy (naming the
    session that holds it)."""
    lock = RunnerLock(engine, key, what)
    if not lock.acquire():
        raise JobBusy(f"{what} is already running elsewhere: {lock.busy}")
    try:
        yield lock
    finally:
        lock.release()


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
    call(engine, target, config, schema=..., stop=...), with the queue's JobTarget as read
    here (every job's run_once takes a queue name or its JobTarget). Raises JobBusy when another runner
    holds the lock (nothing recorded); a job that fails is recorded as failed and returned
    with outcome 'failed' (its exception is not re-raised, except interrupts).
    """
    spec = job if isinstance(job, JobSpec) else job_spec(job)
    # The queue exists and is of a kind this job serves; the job gets it as read here.
    target = JobTarget.resolve(engine, queue, schema, spec.kinds)
    config = config if config is not None else spec.config_cls()
    call = call or spec.run_once
    params = {"job": spec.name, "queue": queue}
    with single_runner(engine, lock_key(schema, spec.lock_name, queue), f"{spec.lock_name} on queue {queue}") as lock:
        try:
            abandoned = lock.execute(catalog_sql(engine, "run_abandon", schema), params).rowcount
            started = lock.execute(
                catalog_sql(engine, "run_start", schema),
                {**params, "trigger": trigger, "runner_host": RUNNER_HOST, "runner_pid": os.getpid()},
            ).one()
        except ProgrammingError as exc:
            raise _missing_catalog(exc) from None
        if abandoned:
            log.warning("%s %s: marked %d earlier run(s) abandoned (their runner stopped mid-run)", spec.name, queue, abandoned)
        result: Any = None
        try:
            with lock.watch(stop) as run_stop:
                result = call(engine, target, config, schema=schema, stop=run_stop)
            outcome, error = ("failed", result.error) if result.error else ("succeeded", None)
        except (KeyboardInterrupt, SystemExit):
            _finish(lock, engine, schema, started.id, "failed", None, "interrupted", None, None)
            raise
        except Exception as exc:  # recorded, then reported to the caller in the record
            outcome, error = "failed", error_text(exc, engine)
            if not isinstance(exc, (DBAPIError, QueuectlError)):
                log.exception("%s %s: unexpected error", spec.name, queue)
        if lock.lost:
            outcome, error = "failed", lock.lost
        rows = None if result is None else result.rows
        summary = None if result is None else result.summary()
        details = None if result is None else json.dumps(result.as_dict(), default=str)
        finished_at = _finish(lock, engine, schema, started.id, outcome, rows, error, summary, details)
    return RunRecord(started.id, spec.name, queue, outcome, rows, error, started.started_at, finished_at, result)


def _finish(lock: RunnerLock, engine: Engine, schema: str, run_id: int, outcome: str, rows: int | None,
            error: str | None, summary: str | None, details: str | None) -> datetime:
    """Close the run's history row (an UPDATE by id: safe to send again after a lost connection)."""
    return lock.execute(
        catalog_sql(engine, "run_finish", schema),
        {"id": run_id, "outcome": outcome, "rows": rows, "error": error, "summary": summary, "details": details},
    ).scalar_one()


def abandon_orphaned_runs(engine: Engine, *, schema: str = DEFAULT_SCHEMA) -> int:
    """Mark 'abandoned' every 'running' run whose single-runner lock nobody holds (its runner
    died); returns how many. A (job, queue) whose lock is held is running: left alone."""
    with engine.connect() as conn:
        try:
            pairs = conn.execute(catalog_sql(conn, "runs_running", schema)).all()
        except ProgrammingError as exc:
            raise _missing_catalog(exc) from None
    marked = 0
    for job, queue in pairs:
        held_as = JOBS[job].lock_name if job in JOBS else job
        try:
            with single_runner(engine, lock_key(schema, held_as, queue), f"{held_as} on queue {queue}") as lock:
                marked += lock.execute(catalog_sql(engine, "run_abandon", schema), {"job": job, "queue": queue}).rowcount
        except JobBusy:
            continue
    if marked:
        log.warning("marked %d run(s) abandoned: their runner stopped mid-run", marked)
    return marked


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
