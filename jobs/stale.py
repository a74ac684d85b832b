"""reset_stale: PROCESSING rows whose lease expired go back to READY, or DEAD on their last
attempt (sql/postgresql/jobs.sql:reset_stale_batch).

Dequeue reclaims expired leases by itself; this job makes the state visible and honest
when no consumer is running: stuck items return to the ready index in their own order,
used-up ones go DEAD with the reason, and the count is logged. The expired attempt was
counted when the item was claimed, so `attempts` is not raised again here.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy.engine import Engine

from queuectl.jobs.base import JobTarget, check_number, sleep_unless_stopped
from queuectl.names import DEFAULT_SCHEMA

log = logging.getLogger("queuectl.jobs.reset_stale")

KINDS = ("reliable",)
DEFAULT_BATCH = 1000
DEFAULT_DELAY = 0.05
DEFAULT_LOCK_TIMEOUT = 2.0
DEFAULT_STATEMENT_TIMEOUT = 30.0


@dataclass(frozen=True)
class StaleConfig:
    batch: int = DEFAULT_BATCH
    delay: float = DEFAULT_DELAY
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT

    DURATIONS = ("delay", "lock_timeout", "statement_timeout")

    def __post_init__(self) -> None:
        check_number("batch", self.batch, 1, 10_000, integer=True)
        check_number("delay", self.delay, 0, 3600)
        check_number("lock_timeout", self.lock_timeout, 0.001, 3600)
        check_number("statement_timeout", self.statement_timeout, 0.001, 24 * 3600)


@dataclass
class StaleResult:
    ready: int = 0      # back to READY
    dead: int = 0       # DEAD: the expired attempt was the last
    batches: int = 0
    seconds: float = 0.0

    error = None

    @property
    def rows(self) -> int:
        return self.ready + self.dead

    def summary(self) -> str:
        return f"{self.rows:,} expired leases reset: {self.ready:,} ready again, {self.dead:,} dead"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_once(
    engine: Engine,
    queue: str | JobTarget,
    config: StaleConfig | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    stop: threading.Event | None = None,
) -> StaleResult:
    config = config or StaleConfig()
    target = JobTarget.resolve(engine, queue, schema, KINDS)
    statements = target.row_sql("reset_stale_batch")
    result = StaleResult()
    started = time.monotonic()
    while not (stop is not None and stop.is_set()):
        statuses = []
        for statement in statements:  # one per generation slot on SQL Server (JobTarget.row_sql)
            with engine.begin() as conn:
                target.set_local_timeouts(conn, config.lock_timeout, config.statement_timeout)
                statuses += [row.status for row in conn.execute(statement, {"batch": config.batch})]
        result.batches += 1
        result.dead += statuses.count(3)
        result.ready += statuses.count(0)
        if len(statuses) < config.batch or sleep_unless_stopped(stop, config.delay):
            break
    result.seconds = time.monotonic() - started
    if result.rows:
        log.info("reset_stale %s: %s", target.names.queue, result.summary())
    return result
