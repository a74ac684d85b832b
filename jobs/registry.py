"""The jobs queuectl knows: name -> what it does, which queue kinds it serves, its config,
its run_once, and its default schedule. The scheduler and the CLI read only this table,
so adding a job is one entry here and one module beside it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from queuectl.errors import UsageError
from queuectl.jobs import archive, compact, inspect, reorganize, ringrepair, stale, watermark
from queuectl.kindspec import DESTRUCTIVE_KINDS
from queuectl.thresholds import UPKEEP_MIN_DEAD_ROWS


@dataclass(frozen=True)
class JobSpec:
    name: str
    description: str
    kinds: tuple[str, ...]           # queue kinds the job applies to
    config_cls: type
    run_once: Callable[..., Any]     # run_once(engine, queue, config, *, schema, stop) -> result
    interval: float | None = None    # default trigger: every `interval` seconds ...
    cron: str | None = None          # ... or this crontab expression
    scheduled: tuple[tuple[str, Any], ...] = ()  # options the scheduler gives a run unless its config does
    # Jobs that must not run at once on one queue share a single-runner lock (the measured
    # upkeep and reorganize would both rebuild the same indexes): the lock is named by this.
    lock_with: str | None = None
    engines: tuple[str, ...] | None = None  # the engines (dialect names) the scheduler plans it on; None: every

    @property
    def lock_name(self) -> str:
        return self.lock_with or self.name


JOBS: dict[str, JobSpec] = {
    spec.name: spec
    for spec in (
        # a scheduled run also keeps a busy reliable queue's generations rotating until the
        # next run (reliable_0012): a generation switched once a minute would hold a minute of
        # dead entries for the claims to walk while the xmin horizon is pinned
        JobSpec("archive", "move finished rows with their payloads to history, in small batches "
                "(a reliable queue: rotate its generations)",
                archive.KINDS, archive.ArchiveConfig, archive.run_once, interval=60.0,
                scheduled=(("rotate_for", "50s"),)),
        JobSpec("reset_stale", "expired leases back to ready (or dead after max attempts)",
                stale.KINDS, stale.StaleConfig, stale.run_once, interval=30.0),
        JobSpec("inspect", "record dead tuples, bloat, fragmentation and cleanup blockers",
                inspect.KINDS, inspect.InspectConfig, inspect.run_once, interval=300.0),
        JobSpec("reorganize", "keep indexes compact online (REINDEX CONCURRENTLY / ALTER INDEX), then VACUUM or UPDATE STATISTICS",
                reorganize.KINDS, reorganize.ReorganizeConfig, reorganize.run_once, cron="17 3 * * *"),
        # The kinds drained by DELETE pile up dead rows and index ghosts at the rate they are
        # used (a FIFO's dequeue walks them), so a nightly pass is too late for a busy one:
        # every 5 minutes their tables and indexes are measured and acted on only over the
        # thresholds (reorganize's, and the dead rows of health's dead_tuples warning), with
        # a short lock timeout: a REINDEX CONCURRENTLY's lock waits give up rather than hold
        # producers back, and VACUUM takes no lock they wait for.
        JobSpec("upkeep", "measured upkeep of the DELETE-drained kinds: reorganize's rebuild over its thresholds, "
                f"VACUUM / UPDATE STATISTICS of a table over {UPKEEP_MIN_DEAD_ROWS:,} dead rows",
                DESTRUCTIVE_KINDS, reorganize.ReorganizeConfig, reorganize.run_once, interval=300.0,
                scheduled=(("vacuum_min_dead", UPKEEP_MIN_DEAD_ROWS), ("lock_timeout", "2s")),
                lock_with="reorganize"),
        JobSpec("correct_watermark", "recompute a watermark queue's low bound and fix it",
                watermark.KINDS, watermark.WatermarkConfig, watermark.run_once, interval=300.0),
        # Under a pinned xmin horizon a ring grows by every push and pop and the DELETE-drained
        # kinds by every dequeue (28 MB a minute for a ring at 1,000 msgs/s): a run every 15 s
        # keeps them within a few times their live rows' size, and costs a probe when nothing
        # is due. Its own single-runner lock: under the reorganize lock a REINDEX CONCURRENTLY
        # would hold it back for minutes, and the two cannot harm each other (compaction's
        # ACCESS EXCLUSIVE gives up within 50 ms behind a rebuild's lock and tries again).
        JobSpec("compact", "give a ring's or a DELETE-drained queue's tables new files holding only their live rows "
                "once dead versions outnumber them (frees space while the xmin horizon is pinned)",
                compact.KINDS, compact.CompactConfig, compact.run_once, interval=15.0, engines=("postgresql",)),
        # A ring's crashed pushers and poppers leave holes and stranded messages that only its
        # recovery path clears (docs/kinds.md): once a minute bounds how long one waits.
        JobSpec("repair_ring", "a ring's recovery path: tombstone dead pushers' positions, re-push dead poppers' "
                "messages (slots unchanged for the grace)",
                ringrepair.KINDS, ringrepair.RingRepairConfig, ringrepair.run_once, interval=60.0),
    )
}


def job_spec(name: str) -> JobSpec:
    key = name.replace("-", "_")
    if key not in JOBS:
        raise UsageError(f"unknown job {name!r}: choose one of {', '.join(JOBS)}")
    return JOBS[key]


def jobs_for_kind(kind: str) -> list[JobSpec]:
    return [spec for spec in JOBS.values() if kind in spec.kinds]
