"""Export queue history into the Parquet lake with Spark, then optionally purge it.

One run per queue, under a per-queue advisory lock:
  1. finish or discard what a dead run left in the lake's staging area (lake.recover);
  2. take new bounds in one statement (export_window): the highest history id, and an
     archived_at bound below every transaction still open;
  3. Spark reads the difference between the old and the new bounds over JDBC, the new ids
     in `partitions` parallel id ranges, late rows (old ids archived since) in one more;
  4. Spark writes Parquet into staging, partitioned by day of finished_at; the run checks
     the staged row count against the database's count, commits into the lake (see
     lake.py), then mirrors the commit into the catalog;
  5. with purge, deletes exactly the rows the lake holds from history, in small batches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from queuectl import locks
from queuectl.engine import adapter_for
from queuectl.errors import NotInstalledError, QueuectlError, UsageError
from queuectl.registry import list_queues, require_queue
from queuectl.locks import Lock
from queuectl.names import DEFAULT_SCHEMA, QueueNames, quote_ident, validate_schema_name
from queuectl.pipeline.jdbc import find_jdbc_jar, jdbc_target
from queuectl.pipeline.lake import Bounds, CommitRecord, Lake, to_micros
from queuectl.pipeline.spark import get_session
from queuectl.sqlfiles import render

HISTORY_KINDS = ("reliable",)  # kinds whose finished items are kept in <queue>_history
PURGE_BATCH = 5_000  # rows per purge transaction: short locks, small WAL bursts
PURGE_LOCK_TIMEOUT_MS = 2_000  # a batch gives up rather than queue behind other locks
PURGE_RETRIES = 5
JDBC_FETCH_SIZE = 10_000  # rows per round trip; without it pgjdbc buffers a partition whole
ROWS_PER_PARTITION = 250_000  # default split when --partitions is not given
LOCK_WAIT_S = 10.0  # how long a run waits for another export of the same queue

ProgressFn = Callable[["Progress"], None]


@dataclass
class Progress:
    """What a long export reports while it runs (rows are estimated from finished tasks)."""

    queue: str
    phase: str  # "reading", "committing", "purging", "done"
    rows_total: int = 0
    rows_done: int = 0
    tasks_total: int = 0
    tasks_done: int = 0


@dataclass
class QueueExport:
    queue: str
    kind: str = "reliable"
    skipped: str | None = None  # why nothing was done
    recovered: list[tuple[int, str]] = field(default_factory=list)
    run_seq: int | None = None
    new_rows: int = 0
    late_rows: int = 0
    partitions: int = 0
    files: int = 0
    bounds: Bounds = field(default_factory=Bounds)
    purged: int = 0
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.new_rows + self.late_rows

    def as_dict(self) -> dict:
        return {
            "queue": self.queue,
            "kind": self.kind,
            "skipped": self.skipped,
            "recovered": [{"run": seq, "action": what} for seq, what in self.recovered],
            "run": self.run_seq,
            "rows": self.rows,
            "new_rows": self.new_rows,
            "late_rows": self.late_rows,
            "partitions": self.partitions,
            "files": self.files,
            "exported_upto_id": self.bounds.upto_id,
            "archived_before": self.bounds.archived_before.isoformat() if self.bounds.before_us else None,
            "purged": self.purged,
            "seconds": round(self.seconds, 3),
            "warnings": self.warnings,
        }


@dataclass
class ExportResult:
    lake: str
    master: str
    queues: list[QueueExport]
    seconds: float
    spark_start_seconds: float = 0.0  # part of `seconds`: starting (or joining) the session

    @property
    def rows(self) -> int:
        return sum(q.rows for q in self.queues)

    def as_dict(self) -> dict:
        return {
            "lake": self.lake,
            "master": self.master,
            "rows": self.rows,
            "seconds": round(self.seconds, 3),
            "spark_start_seconds": round(self.spark_start_seconds, 3),
            "rows_per_second": round(self.rows / self.seconds, 1) if self.seconds > 0 else None,
            "queues": [q.as_dict() for q in self.queues],
        }


def _sql(engine_or_conn, section: str, values: dict[str, str | int]) -> str:
    return render(adapter_for(engine_or_conn).sql_dir, "pipeline", section, values)


def _exports_table(schema: str) -> str:
    return f"{quote_ident(schema)}.{quote_ident('pipeline_exports')}"


def export_history(
    engine: Engine,
    lake_path: str,
    queues: list[str] | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    partitions: int | None = None,
    purge: bool = False,
    master: str | None = None,
    jdbc_jar: str | None = None,
    purge_batch: int = PURGE_BATCH,
    progress: ProgressFn | None = None,
    lock_wait: float = LOCK_WAIT_S,
) -> ExportResult:
    """Export new history of `queues` (default: every queue that keeps history) into the lake."""
    validate_schema_name(schema)
    if partitions is not None and not 1 <= partitions <= 1024:
        raise UsageError(f"--partitions must be from 1 to 1024, got {partitions}")
    if purge and not 1 <= purge_batch <= 100_000:
        raise UsageError(f"--purge-batch must be from 1 to 100000, got {purge_batch}")
    if engine.dialect.name != "postgresql":
        raise UsageError(f"pipeline export reads PostgreSQL history only (this is {engine.dialect.name})")
    lake = Lake(lake_path)
    started = time.monotonic()
    targets = _targets(engine, queues, schema)
    todo = [t for t in targets if t.skipped is None]
    if not todo:
        return ExportResult(str(lake), master or "-", targets, time.monotonic() - started)
    jar = find_jdbc_jar("postgresql", jdbc_jar)
    jdbc = jdbc_target(engine.url)
    t_spark = time.monotonic()
    spark = get_session(master, [jar])
    spark_start = time.monotonic() - t_spark
    lake.ensure()
    for item in todo:
        t0 = time.monotonic()
        with _queue_lock(engine, schema, item.queue, lock_wait):
            _export_queue(engine, spark, jdbc, lake, schema, item, partitions, progress)
            if purge:
                item.purged = _purge(engine, lake, item.queue, schema, purge_batch, PURGE_LOCK_TIMEOUT_MS, progress)
        item.seconds = time.monotonic() - t0
        if progress:
            progress(Progress(item.queue, "done", item.rows, item.rows, item.partitions, item.partitions))
    return ExportResult(str(lake), spark.sparkContext.master, targets, time.monotonic() - started, spark_start)


def _targets(engine: Engine, queues: list[str] | None, schema: str) -> list[QueueExport]:
    with engine.connect() as conn:
        if queues:
            infos = [require_queue(conn, name, schema) for name in dict.fromkeys(queues)]
        else:
            infos = list_queues(conn, schema)
        has_catalog = sa.inspect(conn).has_table("pipeline_exports", schema=schema)
    if not infos:
        raise UsageError(f"no queues installed in schema {schema!r}: nothing to export")
    if not has_catalog:
        raise NotInstalledError(
            f"the catalog in schema {schema!r} predates the pipeline: run `queuectl upgrade` first"
        )
    result = []
    for info in infos:
        item = QueueExport(info.name, info.kind)
        if info.kind not in HISTORY_KINDS:
            item.skipped = f"kind {info.kind} reads destructively and keeps no history"
        result.append(item)
    return result


@contextmanager
def _queue_lock(engine: Engine, schema: str, queue: str, wait: float) -> Iterator[None]:
    """One export or purge of a queue at a time (a session lock on its own connection).

    Tries for `wait` seconds: the lock of an export killed a moment ago is released only
    when the server notices its connection is gone."""
    lock = Lock(schema, f"queuectl.pipeline:{schema}.{queue}", f"the export lock of queue {queue!r}")
    with engine.connect() as conn:
        try:
            key = locks.take(conn, lock, wait)
        except locks.LockBusy as exc:
            raise QueuectlError(f"another export or purge of queue {queue!r} is running: {exc}") from None
        try:
            yield
        finally:
            locks.release(conn, key)


def _sync_catalog(conn: Connection, schema: str, lake: Lake, record: CommitRecord | None, total: int) -> None:
    if record is None:
        return
    conn.execute(
        sa.text(_sql(conn, "record_export", {"exports": _exports_table(schema)})),
        {
            "queue": record.queue,
            "lake": str(lake),
            "run_seq": record.seq,
            "upto_id": record.bounds.upto_id,
            "archived_before": record.bounds.archived_before,
            "rows_exported": total,
        },
    )


def _export_queue(engine, spark, jdbc, lake: Lake, schema: str, item: QueueExport, partitions, progress) -> None:
    names = QueueNames(item.queue, schema)
    history = names.qualified("history")
    item.recovered = lake.recover(item.queue)
    commits = lake.commits(item.queue)
    previous = commits[-1].bounds if commits else Bounds()
    exported_before = sum(c.rows for c in commits)
    with engine.begin() as conn:
        # Mirror the lake into the catalog first: a run that died after its lake commit
        # (or a rolled-forward one) has not reached the catalog yet.
        _sync_catalog(conn, schema, lake, commits[-1] if commits else None, exported_before)
        window = conn.execute(sa.text(_sql(conn, "export_window", {"history": history}))).one()
        bounds = Bounds(
            upto_id=max(window.max_id or 0, previous.upto_id),
            before_us=max(to_micros(window.archived_before), previous.before_us),
        )
        if window.hidden_sessions:
            item.warnings.append(
                f"{window.hidden_sessions} session(s) of other roles are hidden from this role in "
                "pg_stat_activity: rows they archive in transactions open across this export could be "
                "missed; export as the archive job's role or grant pg_read_all_stats"
            )
        counts = conn.execute(
            sa.text(_sql(conn, "window_rows", _window_values(history, previous, bounds)))
        ).one()
    item.bounds = previous
    item.new_rows, item.late_rows = counts.new_rows, counts.late_rows
    if item.rows == 0:
        return
    seq = len(commits) + 1
    staging = lake.staging_dir(item.queue, seq)
    frame, item.partitions = _read_frame(spark, jdbc, history, previous, bounds, item, partitions)
    from pyspark.sql import functions as F

    frame = frame.withColumn("day", F.to_date(F.coalesce("finished_at", "archived_at")))
    watcher = _TaskWatcher(spark, item, progress) if progress else None
    try:
        if watcher:
            watcher.start()
        frame.write.partitionBy("day").parquet(str(staging))
    finally:
        if watcher:
            watcher.stop()
    if progress:
        progress(Progress(item.queue, "committing", item.rows, item.rows, item.partitions, item.partitions))
    staged = spark.read.parquet(str(staging)).count()
    if staged != item.rows:
        # History rows inside the bounds changed while we read (deleted by hand?): the run
        # is not what the bounds promise, so it must not be committed.
        lake.recover(item.queue)  # no manifest yet: discards the staging folder
        raise QueuectlError(
            f"queue {item.queue!r}: Spark wrote {staged} rows but the database counted {item.rows} "
            "in the same bounds; history changed during the export, nothing was committed"
        )
    record = lake.decide(item.queue, seq, previous, bounds, item.rows)
    lake.publish(record)
    with engine.begin() as conn:
        _sync_catalog(conn, schema, lake, record, exported_before + item.rows)
    item.run_seq, item.bounds, item.files = seq, bounds, len(record.files)


def _window_values(history: str, previous: Bounds, bounds: Bounds) -> dict[str, str | int]:
    return {
        "history": history,
        "after_id": previous.upto_id,
        "after_before_us": previous.before_us,
        "upto_id": bounds.upto_id,
        "before_us": bounds.before_us,
    }


def _read_frame(spark, jdbc, history: str, previous: Bounds, bounds: Bounds, item: QueueExport, partitions):
    """The run's rows as one DataFrame: new ids in parallel id ranges, late rows in one more."""
    values = _window_values(history, previous, bounds)
    options = {**jdbc.spark_options(), "fetchsize": str(JDBC_FETCH_SIZE)}
    frames = []
    used = 0
    if item.new_rows:
        wanted = partitions or max(spark.sparkContext.defaultParallelism, -(-item.new_rows // ROWS_PER_PARTITION))
        span = bounds.upto_id - previous.upto_id
        n = max(1, min(wanted, span))
        reader = spark.read.format("jdbc").options(**options).option("dbtable", render("postgresql", "pipeline", "read_new", values))
        if n > 1:
            reader = (
                reader.option("partitionColumn", "id")
                .option("lowerBound", str(previous.upto_id + 1))
                .option("upperBound", str(bounds.upto_id + 1))
                .option("numPartitions", str(n))
            )
        frames.append(reader.load())
        used += n
    if item.late_rows:
        reader = spark.read.format("jdbc").options(**options).option("dbtable", render("postgresql", "pipeline", "read_late", values))
        frames.append(reader.load())
        used += 1
    frame = frames[0]
    for other in frames[1:]:
        frame = frame.unionByName(other)
    return frame, used


class _TaskWatcher:
    """Polls Spark's status tracker and reports partitions (tasks) done while a write runs."""

    def __init__(self, spark, item: QueueExport, progress: ProgressFn, interval: float = 0.5):
        self.sc = spark.sparkContext
        self.item = item
        self.progress = progress
        self.interval = interval
        self.group = f"queuectl-export-{item.queue}-{time.monotonic_ns()}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.sc.setJobGroup(self.group, f"queuectl export {self.item.queue}")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sc.setLocalProperty("spark.jobGroup.id", None)

    def _run(self) -> None:
        tracker = self.sc.statusTracker()
        while not self._stop.wait(self.interval):
            total = done = 0
            try:
                for job_id in tracker.getJobIdsForGroup(self.group):
                    job = tracker.getJobInfo(job_id)
                    for stage_id in job.stageIds if job else []:
                        stage = tracker.getStageInfo(stage_id)
                        if stage:
                            total += stage.numTasks
                            done += stage.numCompletedTasks
            except Exception:  # the tracker is best effort; the export itself decides
                continue
            if total:
                rows_done = self.item.rows * done // total
                self.progress(Progress(self.item.queue, "reading", self.item.rows, rows_done, total, done))


def purge_exported(
    engine: Engine,
    lake_path: str,
    queue: str,
    *,
    schema: str = DEFAULT_SCHEMA,
    batch: int = PURGE_BATCH,
    lock_timeout_ms: int = PURGE_LOCK_TIMEOUT_MS,
    progress: ProgressFn | None = None,
) -> int:
    """Delete from history exactly the rows the lake holds (its last commit's bounds), in
    batches of `batch` rows, each its own transaction with a lock timeout. Returns rows deleted."""
    if not 1 <= batch <= 100_000:
        raise UsageError(f"purge batch must be from 1 to 100000, got {batch}")
    validate_schema_name(schema)
    lake = Lake(lake_path)
    with _queue_lock(engine, schema, QueueNames(queue, schema).queue, LOCK_WAIT_S):
        return _purge(engine, lake, queue, schema, batch, lock_timeout_ms, progress)


def _purge(engine: Engine, lake: Lake, queue: str, schema: str, batch: int, lock_timeout_ms: int, progress) -> int:
    if not 1 <= batch <= 100_000:
        raise UsageError(f"--purge-batch must be from 1 to 100000, got {batch}")
    record = lake.last_commit(queue)
    if record is None:
        return 0
    names = QueueNames(queue, schema)
    history = names.qualified("history")
    statement = sa.text(_sql(engine, "purge_batch", {"history": history}))
    count_purged = sa.text(_sql(engine, "add_purged", {"exports": _exports_table(schema)}))
    set_timeout = sa.text(_sql(engine, "batch_lock_timeout", {}))
    after, purged, failures = 0, 0, 0
    while True:
        try:
            with engine.begin() as conn:
                conn.execute(set_timeout, {"lock_timeout": f"{lock_timeout_ms}ms"})
                row = conn.execute(
                    statement,
                    {
                        "after_id": after,
                        "upto_id": record.bounds.upto_id,
                        "archived_before": record.bounds.archived_before,
                        "batch": batch,
                    },
                ).one()
                if row.n:
                    conn.execute(count_purged, {"purged": row.n, "queue": queue, "lake": str(lake)})
        except OperationalError as exc:
            # lock_timeout: someone holds these rows; back off and try the batch again.
            failures += 1
            if failures > PURGE_RETRIES or "lock timeout" not in str(exc.orig):
                raise
            time.sleep(0.2 * failures)
            continue
        failures = 0
        purged += row.n
        if progress:
            progress(Progress(queue, "purging", purged, purged))
        if row.n < batch:
            return purged
        after = row.last_id
