"""archive: move finished rows, with their payloads, from the live tables to history.

Each batch is ONE short transaction (`WITH moved AS (DELETE ... RETURNING ...) INSERT
INTO history ...`, sql/postgresql/jobs.sql:archive_batch) under a `lock_timeout`, so a
killed archiver loses nothing (the batch in flight rolls back whole) and never stalls
producers or consumers (rows they hold are skipped, not waited for). Batches are
separated by a short jittered pause.

run_once: batches until one comes back smaller than the batch size (or max_seconds).
run_continuous: until stopped; the pause shrinks while batches come back full (backlog),
returns to `delay` when they come back partial, and grows towards `idle_delay` while there
is nothing to move. A lock or statement timeout in continuous mode is logged and retried
after a pause; MAX_CONSECUTIVE_ERRORS in a row end the run.
History retention (`history_retention`) purges history archived longer ago than that, in
the same small-batch way.

Rotation (a reliable queue at reliable_0012 or later, on either engine): before its batches the
job also rotates the queue's generations (Archiver.rotate): it seals the previous epoch (moves
the READY rows left there forward: once LAZY_SEAL_ROWS or fewer are left, since the claims
take a backlog where it is, oldest first, or once the current epoch is full; on PostgreSQL
the seal and its mark are one transaction, with the switch when one came just before), copies the
oldest sealed one's finished rows to history and empties it with TRUNCATE (under
a short lock_timeout, retried, so producers and consumers never queue behind it for long),
and switches new rows to the next epoch every `rotate_items` ids. Finished rows of an emptied
generation reach history whatever their age: `min_age` and `dead_min_age` apply to the row
batches, which serve a queue whose generations turn over slowly.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from queuectl.engine import adapter_for
from queuectl.engine.urls import error_text, sqlstate
from queuectl.jobs.base import JobTarget, check_number, format_duration, lock_holders, sleep_unless_stopped
from queuectl.names import DEFAULT_SCHEMA, QueueNames

log = logging.getLogger("queuectl.jobs.archive")

KINDS = ("reliable",)
DEFAULT_BATCH = 1000                # rows per transaction: short, well under a second
MAX_BATCH = 10_000
DEFAULT_MIN_AGE = 60.0              # DONE rows stay this long before they move (recent work stays visible)
DEFAULT_DEAD_MIN_AGE = 7 * 86400.0  # DEAD rows stay a week: someone should look at them first
DEFAULT_DELAY = 0.2                 # pause between batches
MIN_DELAY = 0.01                    # continuous: shortest pause while there is backlog
DEFAULT_IDLE_DELAY = 5.0            # continuous: longest pause while there is nothing to move
DEFAULT_LOCK_TIMEOUT = 2.0          # a batch waits at most this long for any lock
DEFAULT_STATEMENT_TIMEOUT = 30.0    # and runs at most this long
DEFAULT_PURGE_EVERY = 60.0          # continuous: how often history retention runs
JITTER = 0.1                        # +-10 % on every pause, so several archivers drift apart
MAX_CONSECUTIVE_ERRORS = 10
DEFAULT_ROTATE_ITEMS = 2000         # ids per generation: what one truncate frees
MAX_ROTATE_ITEMS = 10_000_000
SEAL_LIMIT = 50_000                 # READY rows a seal moves; more: the epoch stays open (a backlog)
LAZY_SEAL_ROWS = 500                # a seal waits while more READY rows than this are left behind (moving
                                    # them takes milliseconds; while it waits every claim walks both open
                                    # slots on the parents, two to three times the cost of one slot),
                                    # until the current epoch has had rotate_items ids
EMPTY_LOCK_TIMEOUT_MS = 50          # a truncate waits this long for its slot's lock...
EMPTY_TRIES = 5                     # ...this many times per pass, then waits for the next pass
LOCK_NOT_AVAILABLE = "55P03"
DEADLOCK_DETECTED = "40P01"
UNIQUE_VIOLATION = "23505"
UNDEFINED_FUNCTION = "42883"
ROWS_BESIDE_ROTATION_EVERY = 1.0    # continuous, rotated queue: the row-by-row batch at most this often (s)
COPY_TRIES = 3                      # sends of a generation's copy batch that lost a race to another rotator


@dataclass(frozen=True)
class ArchiveConfig:
    batch: int = DEFAULT_BATCH
    min_age: float = DEFAULT_MIN_AGE
    dead_min_age: float = DEFAULT_DEAD_MIN_AGE
    delay: float = DEFAULT_DELAY
    max_seconds: float | None = None
    history_retention: float | None = None
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT
    idle_delay: float = DEFAULT_IDLE_DELAY
    purge_every: float = DEFAULT_PURGE_EVERY
    rotate_items: int = DEFAULT_ROTATE_ITEMS
    rotate_for: float = 0.0          # run_once: keep rotating this long while ids are drawn

    DURATIONS = ("min_age", "dead_min_age", "delay", "max_seconds", "history_retention", "lock_timeout",
                 "statement_timeout", "idle_delay", "purge_every", "rotate_for")

    def __post_init__(self) -> None:
        check_number("batch", self.batch, 1, MAX_BATCH, integer=True)
        check_number("rotate_items", self.rotate_items, 1, MAX_ROTATE_ITEMS, integer=True)
        for name in ("min_age", "dead_min_age", "delay", "idle_delay", "purge_every", "rotate_for"):
            check_number(name, getattr(self, name), 0, 10 * 366 * 86400)
        check_number("max_seconds", self.max_seconds, 0, 10 * 366 * 86400, optional=True)
        check_number("history_retention", self.history_retention, 0, 10 * 366 * 86400, optional=True)
        check_number("lock_timeout", self.lock_timeout, 0.001, 3600)
        check_number("statement_timeout", self.statement_timeout, 0.001, 24 * 3600)


@dataclass
class ArchiveResult:
    rows: int = 0                    # rows moved to history
    purged: int = 0                  # history rows removed by retention
    batches: int = 0
    seconds: float = 0.0
    errors: int = 0                  # batches that failed and were retried (continuous)
    rotations: int = 0               # generations emptied (rows copied count in `rows`)
    rotation_blocked: str | None = None  # who kept the last truncate waiting, if one gave up
    stopped: str = "done"            # done | max_seconds | stop requested | errors
    last_error: str | None = None

    @property
    def error(self) -> str | None:
        return self.last_error if self.stopped == "errors" else None

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def add_rotation(self, done: "RotationPass") -> None:
        """Count a rotation pass: its copies as rows moved to history, its emptied generations."""
        self.rows += done.copied
        self.rotations += done.emptied
        self.rotation_blocked = done.blocked

    def summary(self) -> str:
        text = f"moved {self.rows:,} rows in {self.batches:,} batches ({self.rate:,.0f} rows/s)"
        if self.rotations:
            text += f", emptied {self.rotations:,} generations"
        if self.rotation_blocked:
            text += f" (a truncate waited in vain: {self.rotation_blocked})"
        if self.purged:
            text += f", purged {self.purged:,} history rows"
        if self.errors:
            text += f", {self.errors} failed batches retried"
        return f"{text}; {self.stopped}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ArchiveProgress:
    """What a progress display shows; updated after every batch."""

    queue: str
    rows: int = 0
    purged: int = 0
    batches: int = 0
    errors: int = 0
    last_batch: int = 0
    last_batch_ms: float = 0.0
    pause: float = 0.0
    started: float = field(default_factory=time.monotonic)
    recent: list[tuple[float, int]] = field(default_factory=list)

    def note(self, moved: int) -> None:
        now = time.monotonic()
        self.recent.append((now, self.rows))
        while self.recent and now - self.recent[0][0] > 10:
            self.recent.pop(0)

    @property
    def rate(self) -> float:
        """Rows/s over the last 10 s."""
        if len(self.recent) < 2:
            elapsed = time.monotonic() - self.started
            return self.rows / elapsed if elapsed > 0 else 0.0
        (t0, r0), (t1, r1) = self.recent[0], self.recent[-1]
        return (r1 - r0) / (t1 - t0) if t1 > t0 else 0.0

    def line(self) -> str:
        return (f"archive {self.queue}: {self.rows:,} rows moved ({self.rate:,.0f}/s over 10 s), "
                f"{self.batches:,} batches, last {self.last_batch:,} rows in {self.last_batch_ms:.0f} ms, "
                f"pause {self.pause * 1000:.0f} ms"
                + (f", {self.purged:,} purged" if self.purged else "")
                + (f", {self.errors} errors" if self.errors else ""))


class Archiver:
    """The batch statements of one queue."""

    def __init__(self, engine: Engine, queue: str | JobTarget, config: ArchiveConfig, schema: str) -> None:
        self.engine = engine
        self.config = config
        self.target = JobTarget.resolve(engine, queue, schema, KINDS)
        self._archive = self.target.row_sql("archive_batch")
        self._purge = self.target.sql("purge_history_batch", exports=self.target.names.catalog_table("pipeline_exports"))

    def move_batch(self) -> int:
        """One transaction: move up to `batch` finished rows; returns how many moved (one
        transaction per generation slot on SQL Server: JobTarget.row_sql)."""
        c = self.config
        moved = 0
        for statement in self._archive:
            with self.engine.begin() as conn:
                self.target.set_local_timeouts(conn, c.lock_timeout, c.statement_timeout)
                result = conn.execute(
                    statement,
                    {"batch": c.batch, "min_age_seconds": c.min_age, "dead_min_age_seconds": c.dead_min_age},
                )
                moved += rows_changed(result)
        return moved

    def purge_batch(self) -> int:
        """One transaction: delete up to `batch` history rows older than the retention."""
        c = self.config
        assert c.history_retention is not None
        with self.engine.begin() as conn:
            self.target.set_local_timeouts(conn, c.lock_timeout, c.statement_timeout)
            result = conn.execute(
                self._purge, {"batch": c.batch, "retention_seconds": c.history_retention, "queue": self.target.names.queue}
            )
            return rows_changed(result)


def rows_changed(result: sa.CursorResult[Any]) -> int:
    """How many rows a batch statement moved or deleted. PostgreSQL's statement is one DML, whose
    row count the driver reports; SQL Server's is a batch under SET NOCOUNT ON (the driver
    then reports -1) that ends by selecting its count (`SELECT @rows AS moved`): read that."""
    if result.returns_rows:
        row = result.first()
        return int(row[0]) if row is not None and row[0] is not None else 0
    return max(result.rowcount, 0)


def rotation_blockers(conn: Connection, names: QueueNames, sql_dir: str, epoch: int, min_age_s: float) -> list[str]:
    """The sessions holding a lock on the slot tables of generation `epoch`, in transactions
    older than `min_age_s`, oldest first, each in one phrase (the job's log and health's advice
    name them alike)."""
    tables = [names.qualified(f"{part}{epoch % 3}") for part in ("meta", "data")]
    return lock_holders(conn, sql_dir, names, tables, min_age_s)


@dataclass
class RotationPass:
    """What one rotation pass did."""

    active: bool = False             # ids were drawn since the previous pass
    switched: bool = False
    sealed: int | None = None        # READY rows the seal moved forward (None: no seal)
    emptied: int = 0                 # generations emptied
    copied: int = 0                  # finished rows copied to history
    blocked: str | None = None       # the sessions that kept a truncate waiting

    @property
    def progressed(self) -> bool:
        """A step was due and done (a switch, a seal or an emptied generation)."""
        return self.switched or self.sealed is not None or self.emptied > 0

    @property
    def busy(self) -> bool:
        return self.active or self.progressed


class Rotator:
    """The generation rotation of one reliable queue (reliable_0012), one step per
    transaction (sql/postgresql/jobs.sql: rot_*)."""

    def __init__(self, engine: Engine, target: JobTarget, config: ArchiveConfig) -> None:
        self.engine = engine
        self.target = target
        self.config = config
        self._last_id: int | None = None
        self._conn: Connection | None = None  # the pass's own connection (rotate)
        # reliable_0017 on PostgreSQL: the truncate is told its precopy's horizon (_empty_sealed)
        self._horizon = target.sql_dir == "postgresql" and target.info.schema_version >= "reliable_0017"
        self._sql = {name: target.sql(name) for name in (
            "rot_state", "rot_seal", "rot_mark", "rot_next_empty", "rot_copy", "rot_empty", "rot_switch",
            *(("rot_horizon", "rot_empty_since") if self._horizon else ()))}

    @staticmethod
    def applies(target: JobTarget) -> bool:
        """A reliable queue at reliable_0012 or later, on either engine (the rot_* sections of
        sql/<engine>/jobs.sql take the same parameters and return the same columns)."""
        return target.info.kind == "reliable" and target.info.schema_version >= "reliable_0012"

    @contextmanager
    def _transaction(self) -> Iterator[Callable[..., Any]]:
        """A transaction on the pass's connection (under the job's timeouts: rotate() sets
        them for the pass); yields a call that runs one step (a rot_* statement) in it and
        returns its row."""
        conn = self._conn
        assert conn is not None, "a step runs within rotate()"
        with conn.begin():
            yield lambda name, **params: conn.execute(self._sql[name], params).one()

    def _one(self, name: str, **params: Any) -> Any:
        """One step in a transaction of its own."""
        with self._transaction() as step:
            return step(name, **params)

    def _copy(self, slot: int, after: int) -> Any:
        """One batch of a generation's finished rows to history. Two rotators copying the same
        rows insert the same history keys, in id order since reliable_0014: the second waits
        on the first's, and since reliable_0018 (no ON CONFLICT) fails with unique_violation
        once the first commits; a queue at reliable_0012 or 0013 inserts in its join's order,
        and one may lose a deadlock. Either way its batch rolled back whole and is sent again
        (a copied row is skipped)."""
        for attempt in range(COPY_TRIES):
            try:
                return self._one("rot_copy", slot=slot, after=after, batch=self.config.batch)
            except DBAPIError as exc:
                if attempt == COPY_TRIES - 1 or not self._lost_race(exc):
                    raise
                time.sleep(_jittered(0.01 * (attempt + 1)))

    def _lost_race(self, exc: DBAPIError) -> bool:
        """Another rotator copied the same rows first (or the two deadlocked)."""
        if sqlstate(exc) in (DEADLOCK_DETECTED, UNIQUE_VIOLATION):
            return True
        return self.target.sql_dir == "mssql" and adapter_for(self.engine).canceled(exc)

    def _lock_timed_out(self, exc: DBAPIError) -> bool:
        """The truncate gave up waiting for its slot's lock: lock_not_available on PostgreSQL,
        lock request time out (1222) or a lost deadlock on SQL Server (the adapter's canceled)."""
        if sqlstate(exc) == LOCK_NOT_AVAILABLE:
            return True
        return self.target.sql_dir == "mssql" and adapter_for(self.engine).canceled(exc)

    def _blockers(self, epoch: int) -> str:
        with self.engine.connect() as conn:
            found = rotation_blockers(conn, self.target.names, self.target.sql_dir, epoch, min_age_s=0)
        return "; ".join(found[:3]) or "no session holds its lock now"

    def rotate(self, stopping: Callable[[], bool] = lambda: False) -> RotationPass:
        """One pass: seal, empty what is sealed, switch when the epoch is full, then seal and
        empty the epoch it closed if it can. `stopping` is asked between copy batches: a pass
        told to stop leaves its generation sealed, copied in part (the next pass copies the
        rest: a copied row is skipped).

        A generation is emptied in the pass that seals it: between the seal and the truncate
        its expired leases wait (the claims look in the current slot only), and a truncate
        that comes at once moves the few items still leased rather than leave the window open
        for a pause of the job. The seal waits while a backlog is left in the previous epoch:
        moving it at every switch cost the consumers more than the claims that take it where
        it is, on both open slots (bench/lab/RESULTS.md: "the archive job beside a full-speed
        cycle").

        The pass's steps share one connection: a switch opens a window in which the claims
        walk both open slots on the parents' tables until the seal's mark, and steps that each
        took a connection from the pool (and pinged it) held that window open longer. The
        job's timeouts are set on it once for the pass, not in each of its dozen transactions
        (a statement each; beside a full-speed cycle every statement of the job is CPU taken
        from the consumers), and reset before it goes back to the pool."""
        c = self.config
        with self.engine.connect() as conn:
            if self.target.sql_dir == "postgresql":
                # a step of one statement runs as its own transaction: no BEGIN and COMMIT
                # round trips around it (_several_steps opens a real transaction)
                conn.execution_options(isolation_level="AUTOCOMMIT")
            self.target.set_session_timeouts(conn, c.lock_timeout, c.statement_timeout)
            conn.commit()
            self._conn = conn
            try:
                return self._rotate(stopping)
            finally:
                self._conn = None
                _reset_timeouts(self.target, conn)

    def _rotate(self, stopping: Callable[[], bool]) -> RotationPass:
        p = RotationPass()
        state = self._one("rot_state")
        p.active = self._last_id is not None and state.last_id != self._last_id
        self._last_id = state.last_id
        if state.sealed < state.epoch - 1:
            # the claims drain the previous epoch's backlog; moved only once the current one is full
            with self._seal_steps() as step:
                self._seal(p, state.epoch - 1, lazy=state.last_id - state.start_id < self.config.rotate_items,
                           step=step)
        if not self._empty_sealed(p, stopping):
            return p
        p.switched = self._switch(p)
        if p.switched:
            self._empty_sealed(p, stopping)
        return p

    def _switch(self, p: RotationPass) -> bool:
        """Switch to the next epoch once the current one is full, and seal the one it closed
        at once unless a backlog is left there: until the seal's mark the claims walk both
        open slots on the parents' tables (two to three times a claim's cost on one slot's).

        On PostgreSQL the switch, the seal and its mark are one transaction, the mark last:
        the window lasts the seal's own statement, not three transactions. The mark (a
        sequence: seen by every session at once) comes before the seal's commit, so for that
        one round trip the rows it moved are in neither open slot for the claims; were the
        commit to fail they stay READY in the sealed slot, and the truncate moves them forward
        (rot_empty): late by one rotation, never lost. SQL Server's calls keep a transaction
        each, the mark after the seal's commit."""
        with self._seal_steps() as step:
            switched = step("rot_switch", items=self.config.rotate_items).epoch
            if switched is not None:
                self._seal(p, switched - 1, lazy=True, step=step)
        return switched is not None

    def _seal_steps(self) -> AbstractContextManager[Callable[..., Any]]:
        """How a seal and its mark run (with the switch before them, if any): on PostgreSQL
        one transaction, the mark last (_switch says why), so the claims walk both open slots
        on the parents' tables for the seal's own statement only; on SQL Server a transaction
        per step, the mark after the seal's commit."""
        return self._several_steps() if self.target.sql_dir == "postgresql" else nullcontext(self._one)

    @contextmanager
    def _several_steps(self) -> Iterator[Callable[..., Any]]:
        """Steps in one transaction on PostgreSQL, where the pass's connection otherwise runs
        each statement as a transaction of its own (rotate)."""
        conn = self._conn
        assert conn is not None, "a step runs within rotate()"
        conn.execution_options(isolation_level=conn.default_isolation_level)
        try:
            with self._transaction() as step:
                yield step
        finally:
            if not conn.invalidated:
                conn.execution_options(isolation_level="AUTOCOMMIT")

    def _empty_sealed(self, p: RotationPass, stopping: Callable[[], bool]) -> bool:
        """Copy and empty every sealed epoch not emptied yet, oldest first; False when told to stop.

        On PostgreSQL (reliable_0017 or later) the truncate is told the epoch precopied and a
        transaction horizon taken before the precopy began: what a transaction below it
        finished, the precopy's batches (each committed before the next, read to the end of
        the slot) copied, so the copy under the truncate's lock looks up in history only the
        rows finished since (reliable.sql: create_rot_copy). A pass told to stop truncates
        nothing, and the next pass precopies again from a horizon of its own."""
        while (epoch := self._one("rot_next_empty").epoch) is not None:
            horizon = self._one("rot_horizon").horizon if self._horizon else None
            after = 0
            while True:  # the finished rows in batches, before the truncate's short lock
                batch = self._copy(epoch % 3, after)
                p.copied += batch.copied
                if batch.last_id is None:
                    break
                after = batch.last_id
                if stopping():
                    return False
            for attempt in range(EMPTY_TRIES):
                try:
                    if horizon is None:
                        row = self._one("rot_empty", lock_timeout_ms=EMPTY_LOCK_TIMEOUT_MS)
                    else:
                        row = self._one("rot_empty_since", lock_timeout_ms=EMPTY_LOCK_TIMEOUT_MS, epoch=epoch,
                                        horizon=horizon)
                    break
                except DBAPIError as exc:
                    if horizon is not None and sqlstate(exc) == UNDEFINED_FUNCTION:
                        # the queue was taken back below reliable_0017 while this job ran: its
                        # rot_empty takes no horizon, and looks every finished row up
                        log.warning("archive %s: rot_empty takes no horizon (the queue was downgraded?): "
                                    "emptying without it", self.target.names.queue)
                        self._horizon, horizon = False, None
                        continue
                    if not self._lock_timed_out(exc):
                        raise
                    time.sleep(EMPTY_LOCK_TIMEOUT_MS / 1000 * (attempt + 1))
            else:
                p.blocked = self._blockers(epoch)
                log.warning("archive %s: epoch %s cannot be emptied: %s", self.target.names.queue, epoch, p.blocked)
                break
            if row.epoch is None:
                break
            self._one("rot_mark", what="emptied", epoch=row.epoch)
            p.emptied += 1
            p.copied += row.copied
        return True

    def _seal(self, p: RotationPass, epoch: int, lazy: bool, step: Callable[..., Any]) -> None:
        """Move epoch's READY rows forward and mark it sealed, unless more are left than the
        seal moves (LAZY_SEAL_ROWS when `lazy`, else SEAL_LIMIT): the epoch then stays open.
        Both steps through `step` (_seal_steps)."""
        moved = step("rot_seal", limit=LAZY_SEAL_ROWS if lazy else SEAL_LIMIT).moved
        if moved is not None and moved >= 0:
            step("rot_mark", what="sealed", epoch=epoch)
            p.sealed = (p.sealed or 0) + moved


def _reset_timeouts(target: JobTarget, conn: Connection) -> None:
    """Give a pass's connection back to the pool with the server's timeouts, or not at all:
    a connection whose reset failed is discarded rather than left with the job's."""
    try:
        if conn.in_transaction():
            conn.rollback()
        target.reset_session_timeouts(conn)
        conn.commit()
    except sa.exc.SQLAlchemyError:
        conn.invalidate()


def _jittered(seconds: float) -> float:
    return seconds * random.uniform(1 - JITTER, 1 + JITTER)


def run_once(
    engine: Engine,
    queue: str | JobTarget,
    config: ArchiveConfig | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    stop: threading.Event | None = None,
) -> ArchiveResult:
    """Move finished rows until a batch comes back short; then purge old history if asked.

    Errors propagate (the runner records them): a batch that failed rolled back whole.
    """
    config = config or ArchiveConfig()
    archiver = Archiver(engine, queue, config, schema)
    queue = archiver.target.names.queue
    result = ArchiveResult()
    started = time.monotonic()
    deadline = None if config.max_seconds is None else started + config.max_seconds

    def should_stop() -> str | None:
        if stop is not None and stop.is_set():
            return "stop requested"
        if deadline is not None and time.monotonic() >= deadline:
            return "max_seconds"
        return None

    def batches(step: Callable[[], int], counter: str) -> bool:
        """Run `step` batch after batch until one comes back short; False when told to stop."""
        while True:
            reason = should_stop()
            if reason:
                result.stopped = reason
                return False
            n = step()
            result.batches += 1
            setattr(result, counter, getattr(result, counter) + n)
            if n < config.batch:
                return True
            if sleep_unless_stopped(stop, _jittered(config.delay)):
                result.stopped = "stop requested"
                return False

    if Rotator.applies(archiver.target):
        # Pass after pass until nothing is due (a few are enough to seal, empty and switch
        # through every slot once); with rotate_for, on while the queue draws ids, one pass
        # every `delay`: the scheduler's run keeps a busy queue's generations small.
        rotator = Rotator(engine, archiver.target, config)
        rotate_until = started + config.rotate_for
        passes = 0
        while should_stop() is None:
            done = rotator.rotate(lambda: should_stop() is not None)
            passes += 1
            result.add_rotation(done)
            if done.progressed and passes < 8:
                continue  # catching up: seal, empty and switch through the slots at once
            if time.monotonic() >= rotate_until or (passes > 1 and not done.busy):
                break
            if sleep_unless_stopped(stop, _jittered(config.delay)):
                break
    if batches(archiver.move_batch, "rows") and config.history_retention is not None:
        batches(archiver.purge_batch, "purged")
    result.seconds = time.monotonic() - started
    return result


def run_continuous(
    engine: Engine,
    queue: str | JobTarget,
    config: ArchiveConfig | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    stop: threading.Event | None = None,
    on_progress: Callable[[ArchiveProgress], None] | None = None,
) -> ArchiveResult:
    """Archive until `stop` is set (or max_seconds): the batch in flight always finishes."""
    config = config or ArchiveConfig()
    stop = stop or threading.Event()
    archiver = Archiver(engine, queue, config, schema)
    queue = archiver.target.names.queue
    progress = ArchiveProgress(queue)
    result = ArchiveResult()
    started = time.monotonic()
    deadline = None if config.max_seconds is None else started + config.max_seconds
    next_purge = started if config.history_retention is not None else None
    pause = config.delay
    consecutive_errors = 0
    rotator = Rotator(engine, archiver.target, config) if Rotator.applies(archiver.target) else None
    row_backlog, next_rows = False, started
    while True:
        if stop.is_set():
            result.stopped = "stop requested"
            break
        if deadline is not None and time.monotonic() >= deadline:
            result.stopped = "max_seconds"
            break
        t0 = time.monotonic()
        try:
            busy = False
            moved = 0  # rows to history in this round (the pace follows it)
            if rotator is not None:
                done = rotator.rotate(stop.is_set)
                result.add_rotation(done)  # committed: counted even if the batch below fails
                moved, busy = done.copied, done.busy
            if rotator is None or row_backlog or t0 >= next_rows:
                # beside the rotation, rows finish in a slot and leave with its truncate: a
                # row old enough for this batch is one an epoch kept open (a backlog), so it
                # is looked for once a second, not every round
                batch_rows = archiver.move_batch()
                row_backlog = batch_rows >= config.batch
                next_rows = t0 + ROWS_BESIDE_ROTATION_EVERY
                result.rows += batch_rows
                moved += batch_rows
            if next_purge is not None and t0 >= next_purge:
                while not stop.is_set():
                    purged = archiver.purge_batch()
                    result.purged += purged
                    if purged < config.batch:
                        break
                    sleep_unless_stopped(stop, _jittered(config.delay))
                next_purge = time.monotonic() + config.purge_every
            consecutive_errors = 0
        except DBAPIError as exc:
            # lock_timeout / statement_timeout / a lost connection: the batch rolled back whole.
            consecutive_errors += 1
            result.errors += 1
            result.last_error = error_text(exc, engine)
            log.warning("archive %s: batch failed (%s); retrying", queue, result.last_error)
            if consecutive_errors >= MAX_CONSECUTIVE_ERRORS:
                result.stopped = "errors"
                break
            moved = 0
            pause = config.idle_delay
        else:
            if moved >= config.batch:          # backlog: speed up
                pause = max(min(pause, config.delay) / 2, min(MIN_DELAY, config.delay))
            elif moved > 0 or busy:            # caught up, or new rows: rotate again soon
                pause = config.delay
            else:                              # idle: back off
                pause = min(max(pause, config.delay, MIN_DELAY) * 2, max(config.idle_delay, config.delay))
        result.batches += 1
        progress.rows, progress.purged, progress.batches, progress.errors = (
            result.rows, result.purged, result.batches, result.errors)
        progress.last_batch, progress.last_batch_ms, progress.pause = moved, (time.monotonic() - t0) * 1000, pause
        progress.note(moved)
        if on_progress is not None:
            on_progress(progress)
        if deadline is not None:
            pause = min(pause, max(deadline - time.monotonic(), 0))
        if sleep_unless_stopped(stop, _jittered(pause)):
            result.stopped = "stop requested"
            break
    result.seconds = time.monotonic() - started
    log.info("archive %s: %s (min age %s)", queue, result.summary(), format_duration(config.min_age))
    return result
