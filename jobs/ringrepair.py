"""repair_ring: for ring queues, run the ring's recovery path on a schedule.

A pusher that dies holding a position leaves a hole its pop waits on, and one lap later a
slot no push finds freed; a popper that dies holding a claimed message leaves it where no pop
will ask again (docs/kinds.md, "When a pusher dies"). `<schema>.<queue>_ring_repair()`
tombstones the first and re-pushes the second under a new id, once a slot has sat unchanged
for `grace`; `queuectl.client.repair_ring` is its Python face. So does a compaction seen by a
REPEATABLE READ pop older than it (the pop gives its claims up: jobs/compact.py). This job
calls it under the runner's single-runner lock and records what it repaired. Default: every
minute, so a message is stuck for at most about grace + a minute.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy.engine import Engine

from queuectl.jobs.base import JobTarget, check_number
from queuectl.names import DEFAULT_SCHEMA

log = logging.getLogger("queuectl.jobs.repair_ring")

KINDS = ("ring",)
DEFAULT_GRACE = 30.0        # seconds a slot sits unchanged before it is repaired (the ring's own default)


@dataclass(frozen=True)
class RingRepairConfig:
    grace: float = DEFAULT_GRACE

    DURATIONS = ("grace",)

    def __post_init__(self) -> None:
        check_number("grace", self.grace, 0.0, 86_400.0)


@dataclass
class RingRepairResult:
    tombstoned: list[int] = field(default_factory=list)
    rescued: list[tuple[int, int]] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)

    error = None

    @property
    def rows(self) -> int:
        return len(self.tombstoned) + len(self.rescued)

    def summary(self) -> str:
        if not (self.rows or self.deferred):
            return "nothing to repair"
        return (f"{len(self.tombstoned):,} positions tombstoned, {len(self.rescued):,} messages re-pushed, "
                f"{len(self.deferred):,} deferred (the ring was full at their slot)")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_once(
    engine: Engine,
    queue: str | JobTarget,
    config: RingRepairConfig | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    stop: threading.Event | None = None,
) -> RingRepairResult:
    from queuectl.client import repair_ring

    config = config or RingRepairConfig()
    target = JobTarget.resolve(engine, queue, schema, KINDS)  # the queue exists and is a ring
    done = repair_ring(engine, target.names.queue, schema=schema, grace=config.grace)
    result = RingRepairResult(list(done.tombstoned), [tuple(p) for p in done.rescued], list(done.deferred))
    if result.rows or result.deferred:
        log.warning("repair_ring %s: %s", target.names.queue, result.summary())
    return result
