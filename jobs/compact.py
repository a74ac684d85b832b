"""compact: keep a ring's and the one-table kinds' tables at the size of their live rows while
the xmin horizon is pinned.

A ring updates its slots in place and the one-table kinds (heap, fifo, stack, pending,
watermark) drain their items by DELETE: every push, pop or dequeue leaves a dead row version,
and while a snapshot older than them stays open (a long report, pg_dump, a replica's
hot_standby_feedback) neither page pruning nor VACUUM may remove any, so the tables grow by
every message (bench/lab/no-decay.md). Only a new file frees that space: when a table has
outgrown its live rows (compact_probe: its size and the statistics collector's live and dead
versions, no scan) and holds few live rows (at most `max_rows`), the job takes the queue's
tables ACCESS EXCLUSIVE under a short lock_timeout, copies the live rows aside, truncates and
inserts them back, in one transaction (sql/postgresql/jobs.sql: compact_ring, compact_items,
which say what stays: ids, positions, states, sequences, reloptions, grants, triggers).

What it costs: the pushes and pops of the queue wait for that transaction (its lock time is
reported: milliseconds for a small backlog, tens for thousands of ring slots); a lock it cannot get within
`lock_timeout` (a session that read the tables in an open transaction holds ACCESS SHARE, as
pg_dump does) is given up and tried again later, never waited for in the lock queue, and the
job names that session. TRUNCATE is not MVCC-safe: a REPEATABLE READ or SERIALIZABLE
transaction whose snapshot is older than a compaction sees the tables empty, so the ring's
calls and the watermark's dequeue and correct_watermark refuse those levels (SQLSTATE QC400:
ring_0008, watermark_0005); the other one-table kinds' dequeues take nothing there and lose
nothing (docs/kinds.md, "Size while a snapshot is held open").

run_once: probe; compact the tables that are due (up to `tries` attempts at the lock).
run_continuous: the same every `interval` until stopped.
On SQL Server the job does nothing (sql/mssql/jobs.sql, compact_probe, says why: a ring's
table keeps no old version there; a DELETE-drained table keeps its ghosts while a snapshot may
read them, and a T-SQL compaction is not built).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from queuectl.engine.urls import error_text, sqlstate
from queuectl.jobs.base import JobTarget, check_number, lock_holders, sleep_unless_stopped
from queuectl.kindspec import DESTRUCTIVE_KINDS
from queuectl.names import DEFAULT_SCHEMA

log = logging.getLogger("queuectl.jobs.compact")

KINDS = ("ring", *DESTRUCTIVE_KINDS)
RING_REVISION = "ring_0007"         # the first ring with every table compact_ring copies: slots, side table, fan-out tables
DEFAULT_MAX_ROWS = 100_000          # live rows copied under the lock at most (a default ring's 65,536
                                    # slots fit: ~0.5 s; the stall stays under a second)
MAX_MAX_ROWS = 10_000_000
DEFAULT_DEAD_RATIO = 1.0            # due when dead versions outnumber live rows this many times (size over ~2x)
DEFAULT_MIN_BYTES = 1 << 20         # ... and the table is over this size ...
DEFAULT_MIN_DEAD = 2_000            # ... or holds this many dead versions: a hot row's chain (a fan-out
                                    # ring's subscription row, read by every claim) grows long well
                                    # before its table weighs a megabyte
DEFAULT_LOCK_TIMEOUT = 0.05         # the lock is waited for this long at most ...
DEFAULT_TRIES = 5                   # ... this many times per run, with a growing pause between
DEFAULT_INTERVAL = 1.0              # continuous: probe this often
DEFAULT_STATEMENT_TIMEOUT = 30.0
LOCK_NOT_AVAILABLE = "55P03"
TOO_MANY_ROWS = "54000"
MAX_CONSECUTIVE_ERRORS = 10


@dataclass(frozen=True)
class CompactConfig:
    dry_run: bool = False            # probe and report; change nothing
    force: bool = False              # compact whatever the probe says (still within max_rows)
    max_rows: int = DEFAULT_MAX_ROWS
    dead_ratio: float = DEFAULT_DEAD_RATIO
    min_bytes: int = DEFAULT_MIN_BYTES
    min_dead: int = DEFAULT_MIN_DEAD
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    tries: int = DEFAULT_TRIES
    interval: float = DEFAULT_INTERVAL
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT
    max_seconds: float | None = None  # continuous: stop after this long

    DURATIONS = ("lock_timeout", "interval", "statement_timeout", "max_seconds")

    def __post_init__(self) -> None:
        check_number("max_rows", self.max_rows, 1, MAX_MAX_ROWS, integer=True)
        check_number("dead_ratio", self.dead_ratio, 0, 1_000_000)
        check_number("min_bytes", self.min_bytes, 0, 1 << 50, integer=True)
        check_number("min_dead", self.min_dead, 0, 1 << 50, integer=True)
        check_number("lock_timeout", self.lock_timeout, 0.001, 3600)
        check_number("tries", self.tries, 1, 1000, integer=True)
        check_number("interval", self.interval, 0, 86400)
        check_number("statement_timeout", self.statement_timeout, 0.001, 24 * 3600)
        check_number("max_seconds", self.max_seconds, 0, 10 * 366 * 86400, optional=True)

    def is_due(self, size: int, live: int, dead: int) -> bool:
        """A table whose dead versions outnumber its live rows dead_ratio times, once it is over
        min_bytes or holds min_dead dead versions."""
        return self.force or ((size > self.min_bytes or dead >= self.min_dead)
                              and dead > self.dead_ratio * max(live, 1))


@dataclass
class TableSize:
    table: str
    bytes: int
    live: int
    dead: int

    def due(self, config: CompactConfig) -> bool:
        return config.is_due(self.bytes, self.live, self.dead)


@dataclass
class CompactResult:
    rows: int = 0                    # live rows copied back, over all compactions
    compactions: int = 0
    due: bool = False                # the last probe found a table over its bound
    dry_run: bool = False
    bytes_before: int | None = None  # the queue's tables at the last probe ...
    bytes_after: int | None = None   # ... and after the last compaction
    lock_seconds: list[float] = field(default_factory=list)  # time under the lock, per compaction
    waits: int = 0                   # lock attempts given up (lock_timeout)
    blocked: str | None = None       # who kept the last run's lock waiting, if it gave up
    skipped: str | None = None       # why a due table was left as it is (too many rows, old revision)
    errors: int = 0
    stopped: str = "done"
    last_error: str | None = None
    tables: list[dict[str, Any]] = field(default_factory=list)  # the last probe, per table

    @property
    def error(self) -> str | None:
        return self.last_error if self.stopped == "errors" else None

    def summary(self) -> str:
        size = "" if self.bytes_before is None else f"{self.bytes_before / 1048576:,.1f} MB"
        if self.dry_run:
            return f"{size}: {'due for compaction' if self.due else 'not due'}" + (f" ({self.skipped})" if self.skipped else "")
        text = f"compacted {self.compactions:,} times ({self.rows:,} live rows copied"
        if self.lock_seconds:
            text += f", lock held up to {max(self.lock_seconds) * 1000:,.1f} ms"
        text += ")"
        if size:
            text += f", tables {size}" + (f" -> {self.bytes_after / 1048576:,.1f} MB" if self.bytes_after is not None else "")
        if self.blocked:
            text += f"; the lock waited in vain: {self.blocked}"
        if self.skipped:
            text += f"; {self.skipped}"
        if self.errors:
            text += f", {self.errors} failed attempts"
        return f"{text}; {self.stopped}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Compactor:
    def __init__(self, engine: Engine, target: JobTarget, config: CompactConfig) -> None:
        self.engine, self.target, self.config = engine, target, config
        # a watermark queue's hint row is left alone (compact_items says why)
        tables = target.tables if target.kind == "ring" else ("items",)
        self.tables = [target.names.qualified(t) for t in tables]

    def is_due(self, size: int, live: int, dead: int) -> bool:
        return self.config.is_due(size, live, dead)

    def probe(self) -> list[TableSize]:
        with self.engine.connect() as conn:
            rows = conn.execute(self.target.sql("compact_probe"), {"tables": self.tables}).all()
            conn.rollback()
        return [TableSize(r.name, int(r.bytes), int(r.live), int(r.dead)) for r in rows]

    def skip_reason(self, sizes: list[TableSize]) -> str | None:
        """Why the queue is not compacted even when due (None: it may be); `sizes`: the due tables."""
        if self.target.kind == "ring" and (self.target.info.schema_version or "") < RING_REVISION:
            return f"compaction needs the ring at {RING_REVISION} (upgrade the queue)"
        live = sum(s.live for s in sizes)
        if live > self.config.max_rows:
            return f"about {live:,} live rows: over max-rows {self.config.max_rows:,}, compacted once drained below it"
        return None

    def compact(self, due: set[str]) -> tuple[int, float] | None:
        """One attempt on the `due` tables (qualified names; the ring's others keep their
        files): (rows copied, seconds under the lock), or None when the lock was not granted
        within lock_timeout. SQLSTATE 54000 (too many rows) is raised to the caller."""
        flags: dict[str, int] = {}
        if self.target.kind == "ring":
            section = "compact_ring"
            for suffix, flag in (("ring", "ring_due"), ("ring_large", "large_due"), ("subs", "subs_due"),
                                 ("sub_slots", "slots_due")):
                flags[flag] = int(self.target.names.qualified(suffix) in due)
        else:
            section = "compact_items"
        with self.engine.connect() as conn:
            try:
                self.target.set_local_timeouts(conn, self.config.lock_timeout, self.config.statement_timeout)
                conn.execute(self.target.sql(section, max_rows=self.config.max_rows, **flags))
                compacted = conn.execute(self.target.sql("compact_result")).scalar_one()
                conn.commit()
            except DBAPIError as exc:
                conn.rollback()
                if sqlstate(exc) == LOCK_NOT_AVAILABLE:
                    return None
                raise
        rows, seconds = compacted.split()
        return int(rows), float(seconds)

    def blockers(self) -> str:
        with self.engine.connect() as conn:
            found = lock_holders(conn, self.target.sql_dir, self.target.names, self.tables, min_age_s=0)
            conn.rollback()
        return "; ".join(found) or "a session that has ended since"

    def run(self, result: CompactResult) -> None:
        """Probe, and compact when due (up to `tries` attempts at the lock)."""
        sizes = self.probe()
        result.tables = [asdict(s) for s in sizes]
        result.bytes_before = sum(s.bytes for s in sizes)
        result.due = any(s.due(self.config) for s in sizes)
        # the limit counts the rows of the tables to be compacted: a fan-out ring's claim rows
        # (size x subscriptions) do not keep its slots from being compacted, nor the reverse
        result.skipped = self.skip_reason([s for s in sizes if s.due(self.config)]) if result.due else None
        if not result.due or result.skipped or self.config.dry_run:
            return
        # forced: every table but one that has never held a row (a new file frees nothing there)
        due = {s.table for s in sizes if s.due(self.config) and (s.bytes > 0 or not self.config.force)}
        for attempt in range(self.config.tries):
            try:
                done = self.compact(due)
            except DBAPIError as exc:
                if sqlstate(exc) != TOO_MANY_ROWS:
                    raise
                result.skipped = error_text(exc)
                return
            if done is not None:
                rows, seconds = done
                result.compactions += 1
                result.rows += rows
                result.lock_seconds.append(seconds)
                result.blocked = None
                result.bytes_after = sum(s.bytes for s in self.probe())
                log.info("compact %s: %s rows copied, lock held %.1f ms, %.1f -> %.1f MB", self.target.names.queue,
                         rows, seconds * 1000, result.bytes_before / 1048576, result.bytes_after / 1048576)
                return
            result.waits += 1
            if attempt + 1 < self.config.tries:
                time.sleep(self.config.lock_timeout * (attempt + 1))
        result.blocked = self.blockers()
        log.warning("compact %s: the tables stay locked by %s; tried again later", self.target.names.queue,
                    result.blocked)


def run_once(engine: Engine, queue: str | JobTarget, config: CompactConfig | None = None, *,
             schema: str = DEFAULT_SCHEMA, stop: threading.Event | None = None) -> CompactResult:
    """Probe the queue's tables and compact them when due."""
    config = config or CompactConfig()
    target = JobTarget.resolve(engine, queue, schema, KINDS)
    result = CompactResult(dry_run=config.dry_run)
    if engine.dialect.name != "postgresql":
        result.stopped = "not built for SQL Server"
        return result
    Compactor(engine, target, config).run(result)
    return result


def run_continuous(engine: Engine, queue: str | JobTarget, config: CompactConfig | None = None, *,
                   schema: str = DEFAULT_SCHEMA, stop: threading.Event | None = None) -> CompactResult:
    """Probe every `interval` and compact when due, until stopped (or max_seconds)."""
    config = config or CompactConfig()
    target = JobTarget.resolve(engine, queue, schema, KINDS)
    result = CompactResult(dry_run=config.dry_run)
    if engine.dialect.name != "postgresql":
        result.stopped = "not built for SQL Server"
        return result
    compactor = Compactor(engine, target, config)
    started = time.monotonic()
    failures = 0
    while True:
        try:
            compactor.run(result)
            failures = 0
        except DBAPIError as exc:
            failures += 1
            result.errors += 1
            result.last_error = error_text(exc)
            log.warning("compact %s: %s", target.names.queue, result.last_error)
            if failures >= MAX_CONSECUTIVE_ERRORS:
                result.stopped = "errors"
                return result
        if config.max_seconds is not None and time.monotonic() - started >= config.max_seconds:
            result.stopped = "max_seconds"
            return result
        if sleep_unless_stopped(stop, config.interval):
            result.stopped = "stop requested"
            return result
