"""The scheduler: runs the registry's jobs on every installed queue, on interval or cron
triggers (APScheduler 3, BlockingScheduler), from a TOML config or sane defaults.

Several schedulers may run against one database for high availability: every run goes
through queuectl.jobs.runner.run_job, whose single-runner advisory lock per (job, queue)
makes the others skip that run, and every run (succeeded or failed) leaves a row in the
job-run history. A job that fails is logged and recorded; the scheduler keeps going.

Config (every key optional; durations as "30s", "5m", "1h", "7d" or seconds):

    [scheduler]
    schema = "queuectl"
    refresh = "60s"          # how often newly installed / removed queues are picked up
    workers = 8              # jobs running at once in this process

    [jobs.archive]           # one table per job: archive, reset_stale, inspect, reorganize, correct_watermark
    interval = "1m"          # or: cron = "*/5 * * * *"
    enabled = true
    queues = ["orders"]      # default: every installed queue of a kind the job serves
    batch = 1000             # any other key is the job's own option (see `queuectl jobs list`)
    min_age = "60s"
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy.engine import Engine

from queuectl.catalog import QueueInfo
from queuectl.errors import UsageError
from queuectl.registry import list_queues
from queuectl.engine.urls import error_text
from queuectl.jobs.base import JobBusy, config_from_options, format_duration, parse_duration
from queuectl.jobs.registry import JOBS, JobSpec, job_spec
from queuectl.jobs.runner import abandon_orphaned_runs, last_runs, run_job
from queuectl.names import DEFAULT_SCHEMA, validate_queue_name, validate_schema_name

log = logging.getLogger("queuectl.scheduler")

DEFAULT_REFRESH = 60.0
DEFAULT_WORKERS = 8
MISFIRE_GRACE = 30          # seconds a run may start late (busy process) before it is skipped
_SCHEDULE_KEYS = {"interval", "cron", "enabled", "queues"}


@dataclass(frozen=True)
class JobSettings:
    interval: float | None = None
    cron: str | None = None
    enabled: bool = True
    queues: tuple[str, ...] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    config: Any = None

    def trigger_text(self, spec: JobSpec) -> str:
        if self.cron:
            return f"cron {self.cron}"
        return f"every {format_duration(self.interval if self.interval is not None else spec.interval or 60.0)}"

    def trigger(self, spec: JobSpec) -> IntervalTrigger | CronTrigger:
        if self.cron:
            return CronTrigger.from_crontab(self.cron, timezone=timezone.utc)
        seconds = self.interval if self.interval is not None else spec.interval
        return IntervalTrigger(seconds=seconds, timezone=timezone.utc)


@dataclass(frozen=True)
class SchedulerConfig:
    schema: str = DEFAULT_SCHEMA
    refresh: float = DEFAULT_REFRESH
    workers: int = DEFAULT_WORKERS
    jobs: dict[str, JobSettings] = field(default_factory=dict)
    source: str = "defaults"

    def settings(self, spec: JobSpec) -> JobSettings:
        return self.jobs.get(spec.name) or _job_settings(spec, {})


@dataclass(frozen=True)
class PlannedJob:
    job: str
    queue: str
    trigger_text: str
    settings: JobSettings

    @property
    def id(self) -> str:
        return f"{self.job}:{self.queue}"


def _job_settings(spec: JobSpec, table: dict[str, Any]) -> JobSettings:
    where = f"[jobs.{spec.name}]"
    interval = cron = None
    if "interval" in table and "cron" in table:
        raise UsageError(f"{where}: give interval or cron, not both")
    if "interval" in table:
        interval = parse_duration(table["interval"], f"{where} interval")
        if interval < 0.1:
            raise UsageError(f"{where} interval must be at least 100ms")
    elif "cron" in table:
        cron = table["cron"]
        if not isinstance(cron, str):
            raise UsageError(f"{where} cron must be a crontab string like \"*/5 * * * *\", got {cron!r}")
        try:
            CronTrigger.from_crontab(cron)
        except ValueError as exc:
            raise UsageError(f"{where} cron {cron!r}: {exc}") from None
    elif spec.interval is None:
        cron = spec.cron
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise UsageError(f"{where} enabled must be true or false")
    queues = table.get("queues")
    if queues is not None:
        if not isinstance(queues, list):
            raise UsageError(f"{where} queues must be a list of queue names")
        queues = tuple(validate_queue_name(q) for q in queues)
    options = {**dict(spec.scheduled), **{k: v for k, v in table.items() if k not in _SCHEDULE_KEYS}}
    try:
        config = config_from_options(spec.config_cls, options, where)
    except UsageError as exc:
        message = str(exc)
        raise UsageError(message if message.startswith(where) else f"{where} {message}") from None
    return JobSettings(interval, cron, enabled, queues, options, config)


def load_config(path: str | Path | None) -> SchedulerConfig:
    """The scheduler config from a TOML file; defaults for everything it leaves out."""
    if path is None:
        return SchedulerConfig(jobs={name: _job_settings(spec, {}) for name, spec in JOBS.items()})
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise UsageError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise UsageError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"config file {path} is not UTF-8 text (TOML files are)") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config file {path} is not valid TOML: {exc}") from None
    # [health] is `queuectl health --config`'s: one queuectl.toml may serve both
    unknown = sorted(set(data) - {"scheduler", "jobs", "health"})
    if unknown:
        raise UsageError(f"{path}: unknown section(s) {', '.join(unknown)}; expected [scheduler] and [jobs.<name>]")
    for key in ("scheduler", "jobs"):
        if not isinstance(data.get(key, {}), dict):
            raise UsageError(f"{path}: {key} must be a table ([{key}]{'' if key == 'scheduler' else ' with [jobs.<name>] tables'})")
    section = data.get("scheduler", {})
    unknown = sorted(set(section) - {"schema", "refresh", "workers"})
    if unknown:
        raise UsageError(f"{path}: unknown [scheduler] key(s) {', '.join(unknown)}")
    schema = validate_schema_name(section.get("schema", DEFAULT_SCHEMA))
    refresh = parse_duration(section.get("refresh", DEFAULT_REFRESH), "[scheduler] refresh")
    workers = section.get("workers", DEFAULT_WORKERS)
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 64:
        raise UsageError("[scheduler] workers must be a whole number from 1 to 64")
    tables = data.get("jobs", {})
    jobs = {}
    for name, table in tables.items():
        spec = job_spec(name)
        if not isinstance(table, dict):
            raise UsageError(f"{path}: [jobs.{name}] must be a table")
        jobs[spec.name] = _job_settings(spec, table)
    for name, spec in JOBS.items():
        jobs.setdefault(name, _job_settings(spec, {}))
    return SchedulerConfig(schema, max(refresh, 1.0), workers, jobs, str(path))


def plan(engine: Engine, config: SchedulerConfig) -> list[PlannedJob]:
    """Which job runs on which queue, on which trigger: every enabled job on every
    installed queue of a kind it serves (or only the queues the config names)."""
    with engine.connect() as conn:
        queues = list_queues(conn, config.schema)
    planned = []
    for spec in JOBS.values():
        settings = config.settings(spec)
        if not settings.enabled or (spec.engines is not None and engine.dialect.name not in spec.engines):
            continue
        for queue in queues:
            if queue.kind in spec.kinds and (settings.queues is None or queue.name in settings.queues):
                planned.append(PlannedJob(spec.name, queue.name, settings.trigger_text(spec), settings))
    return planned


@dataclass(frozen=True)
class Unplanned:
    """A queue the config names for a job that the job never runs on, and why."""

    job: str
    queue: str
    trigger_text: str
    reason: str

    def line(self) -> str:
        return f"[jobs.{self.job}] names queue {self.queue!r}, but {self.reason}: {self.job} never runs on it"


def unplanned(config: SchedulerConfig, installed: list[QueueInfo]) -> list[Unplanned]:
    """The (job, queue) pairs of the config's `queues` lists that plan() leaves out: the queue
    is not installed in the config's schema, or is of a kind the job does not serve."""
    kinds = {queue.name: queue.kind for queue in installed}
    found = []
    for spec in JOBS.values():
        settings = config.settings(spec)
        if not settings.enabled:
            continue
        for queue in settings.queues or ():
            if queue not in kinds:
                reason = f"it is not installed in schema {config.schema}"
            elif kinds[queue] not in spec.kinds:
                reason = f"it is a {kinds[queue]} queue and {spec.name} serves {', '.join(spec.kinds)} queues"
            else:
                continue
            found.append(Unplanned(spec.name, queue, settings.trigger_text(spec), reason))
    return found


def unplanned_in(engine: Engine, config: SchedulerConfig) -> list[Unplanned]:
    """unplanned() against the queues installed now."""
    with engine.connect() as conn:
        return unplanned(config, list_queues(conn, config.schema))


def overview(engine: Engine, config: SchedulerConfig) -> list[dict[str, Any]]:
    """Planned jobs with their last run and the next run time that follows from it, then the
    queues the config names that a job never runs on (`problem` says why)."""
    last = last_runs(engine, schema=config.schema)
    now = datetime.now(timezone.utc)
    rows = []
    for item in plan(engine, config):
        spec = JOBS[item.job]
        previous = last.get((item.job, item.queue))
        trigger = item.settings.trigger(spec)
        next_run = trigger.get_next_fire_time(previous["started_at"] if previous else None, now)
        rows.append({
            "job": item.job, "queue": item.queue, "trigger": item.trigger_text,
            "last_started": previous["started_at"] if previous else None,
            "last_outcome": previous["outcome"] if previous else None,
            "last_rows": previous["rows"] if previous else None,
            "last_error": previous["error"] if previous else None,
            "next_run": max(next_run, now) if next_run else None,
            "options": item.settings.options,
            "problem": None,
        })
    for item in unplanned_in(engine, config):
        rows.append({
            "job": item.job, "queue": item.queue, "trigger": item.trigger_text, "last_started": None,
            "last_outcome": None, "last_rows": None, "last_error": None, "next_run": None,
            "options": config.settings(JOBS[item.job]).options, "problem": item.line(),
        })
    return rows


class Scheduler:
    """A BlockingScheduler over the plan, refreshed as queues come and go."""

    def __init__(self, engine: Engine, config: SchedulerConfig) -> None:
        self.engine = engine
        self.config = config
        self.stop = threading.Event()
        self.counts = {"succeeded": 0, "failed": 0, "skipped": 0, "errors": 0}
        self._executor = ThreadPoolExecutor(config.workers)
        self._scheduler = BlockingScheduler(
            executors={"default": self._executor},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": MISFIRE_GRACE},
            timezone=timezone.utc,
        )

    def run_one(self, job: str, queue: str) -> None:
        """One scheduled run; never raises (the scheduler keeps going whatever happens)."""
        settings = self.config.settings(JOBS[job])
        started = time.monotonic()
        try:
            record = run_job(self.engine, job, queue, settings.config, schema=self.config.schema,
                             trigger="scheduler", stop=self.stop)
        except JobBusy:
            self.counts["skipped"] += 1
            log.info("%s %s: skipped, another runner has it", job, queue)
            return
        except Exception as exc:  # e.g. the database is unreachable: nothing could be recorded
            self.counts["errors"] += 1
            log.error("%s %s: could not run: %s", job, queue, error_text(exc, self.engine))
            return
        self.counts[record.outcome] += 1
        took = time.monotonic() - started
        if record.outcome == "succeeded":
            log.info("%s %s: succeeded in %.2f s: %s", job, queue, took, record.result.summary())
        else:
            log.warning("%s %s: failed after %.2f s: %s", job, queue, took, record.error)

    def refresh(self) -> None:
        """Add jobs for new queues, drop those of removed queues; mark runs whose runner died
        (a killed scheduler) abandoned, so none stays 'running' for ever."""
        try:
            wanted = {item.id: item for item in plan(self.engine, self.config)}
            abandon_orphaned_runs(self.engine, schema=self.config.schema)
        except Exception as exc:
            log.error("could not read the installed queues and runs: %s", error_text(exc, self.engine))
            return
        current = {job.id for job in self._scheduler.get_jobs() if job.id != "refresh"}
        for job_id in current - set(wanted):
            self._scheduler.remove_job(job_id)
            log.info("%s: queue gone, unscheduled", job_id)
        for job_id in set(wanted) - current:
            item = wanted[job_id]
            self._scheduler.add_job(self.run_one, item.settings.trigger(JOBS[item.job]), args=(item.job, item.queue),
                                    id=job_id, name=job_id)
            log.info("%s: scheduled %s", job_id, item.trigger_text)

    def shutdown(self) -> None:
        """Stop scheduling; running jobs finish their current batch and record their run."""
        if not self.stop.is_set():
            self.stop.set()
            log.info("stopping: running jobs finish their current batch")
            self._scheduler.shutdown(wait=False)

    def run(self, max_seconds: float | None = None, handle_signals: bool = True) -> dict[str, int]:
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: self.shutdown())
        self._scheduler.add_job(self.refresh, IntervalTrigger(seconds=self.config.refresh, timezone=timezone.utc),
                                id="refresh", name="refresh")
        self.refresh()
        try:
            for item in unplanned_in(self.engine, self.config):
                log.warning("%s", item.line())
        except Exception as exc:  # refresh() has logged why the queues could not be read
            log.debug("could not check the configured queues: %s", error_text(exc, self.engine))
        if len(self._scheduler.get_jobs()) <= 1:  # only the refresh job
            log.warning("no queues to work on yet: checking again every %s", format_duration(self.config.refresh))
        timer = None
        if max_seconds is not None:
            timer = threading.Timer(max_seconds, self.shutdown)
            timer.daemon = True
            timer.start()
        log.info("scheduler started (config: %s, schema %s)", self.config.source, self.config.schema)
        try:
            self._scheduler.start()
        finally:
            if timer is not None:
                timer.cancel()
            self.stop.set()
            self._executor.shutdown(wait=True)  # let running jobs finish and record their runs
        log.info("scheduler stopped: %s", ", ".join(f"{k} {v}" for k, v in self.counts.items()))
        return dict(self.counts)
