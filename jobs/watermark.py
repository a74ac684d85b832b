"""correct_watermark: for watermark queues, recompute the low bound, fix it, log any drift.

The watermark queue kind owns the logic: its SQL API has `<schema>.<queue>_correct_watermark()`,
which recomputes the bound, stores it, and returns the old and the new value. This job
calls it (sql/postgresql/jobs.sql:correct_watermark) under the runner's single-runner lock
and records both values, so the job-run history shows every discrepancy found.

Connect point for the merge: `correct_watermark()` below is the only place that talks to
the kind; if the kind's Python wrapper is preferred, call it there instead.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy.engine import Engine

from queuectl.jobs.base import JobTarget
from queuectl.names import DEFAULT_SCHEMA

log = logging.getLogger("queuectl.jobs.correct_watermark")

KINDS = ("watermark",)
DEFAULT_INTERVAL = 300.0    # every 5 minutes (registry default)


@dataclass(frozen=True)
class WatermarkConfig:
    DURATIONS = ()


@dataclass
class WatermarkResult:
    old: Any = None
    new: Any = None

    error = None

    @property
    def corrected(self) -> bool:
        return self.old != self.new

    @property
    def rows(self) -> int:
        return 1 if self.corrected else 0

    def summary(self) -> str:
        if self.corrected:
            return f"watermark corrected from {self.old} to {self.new}"
        return f"watermark {self.new} was right"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "corrected": self.corrected}


def correct_watermark(engine: Engine, target: JobTarget) -> tuple[Any, Any]:
    """(old, new) from the kind's correction function, in one transaction."""
    with engine.begin() as conn:
        row = conn.execute(target.sql("correct_watermark", fn_correct_watermark=target.names.qualified("correct_watermark"))).one()
    return row[0], row[1]


def run_once(
    engine: Engine,
    queue: str,
    config: WatermarkConfig | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    stop: threading.Event | None = None,
) -> WatermarkResult:
    target = JobTarget.resolve(engine, queue, schema, KINDS)
    old, new = correct_watermark(engine, target)
    result = WatermarkResult(old, new)
    if result.corrected:
        log.warning("correct_watermark %s: %s", queue, result.summary())
    return result
