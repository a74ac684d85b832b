"""correct_watermark: for watermark queues, recompute the low bound, fix it, log any drift.

The watermark queue kind owns the logic: its SQL API has `<schema>.<queue>_correct_watermark()`,
which recomputes the true low bound (never past an undequeued or uncommitted row), stores
it, and says what it changed; `queuectl.client.correct_watermark` is its Python face. This
job calls it under the runner's single-runner lock and records old, new and the reason, so
the job-run history shows every discrepancy found. Default: every 5 minutes.
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
    old: int | None = None
    new: int | None = None
    true_low: int | None = None
    reason: str = ""
    corrected: bool = False

    error = None

    @property
    def rows(self) -> int:
        return 1 if self.corrected else 0

    def summary(self) -> str:
        if self.corrected:
            return f"watermark corrected from {self.old} to {self.new} ({self.reason})"
        return f"watermark {self.new} was right"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_once(
    engine: Engine,
    queue: str | JobTarget,
    config: WatermarkConfig | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    stop: threading.Event | None = None,
) -> WatermarkResult:
    from queuectl.client import correct_watermark

    target = JobTarget.resolve(engine, queue, schema, KINDS)  # the queue exists and is a watermark queue
    queue = target.names.queue
    fixed = correct_watermark(engine, queue, schema=schema, info=target.info)
    result = WatermarkResult(fixed.old_low, fixed.new_low, fixed.true_low, fixed.reason or "", bool(fixed.changed))
    if result.corrected:
        log.warning("correct_watermark %s: %s", queue, result.summary())
    return result
