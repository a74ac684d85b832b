"""Commands of the maintenance jobs and the scheduler.

    queuectl archive NAME [--continuous] ...     queuectl jobs list [--config]
    queuectl reorganize NAME [--dry-run]         queuectl jobs history [--last N]
    queuectl inspect NAME                        queuectl jobs run JOB NAME [-o key=value]
    queuectl reset-stale NAME                    queuectl scheduler run [--config] [--max-seconds]
    queuectl compact NAME [--dry-run] [--continuous]

Thin: parse, call one library function (queuectl.jobs.runner.run_job or the scheduler),
render. Errors a user can fix raise QueuectlError (one line, exit 2, by queuectl.cli.main); a job
that ran and failed prints its error in one line and exits 1, or 3 when it failed because
its database connection was lost (as health's UNKNOWN: neither the user's fault nor the
job's verdict).
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Optional

import typer
from rich.live import Live
from rich.text import Text

from queuectl.cli.options import (
    DataFormatter, Fitted, JobQueueArg as QueueArg, SchemaOption, UrlOption, err, json_flag, make_table, out, print_error,
    print_fact,
)
from queuectl.engine import make_engine
from queuectl.names import DEFAULT_SCHEMA, validate_queue_name, validate_schema_name
from queuectl.thresholds import MIN_INDEX_PAGES, REBUILD_BLOAT_PCT, REBUILD_FRAGMENTATION_PCT

app = typer.Typer()
JsonOption = json_flag("Print the result as JSON.")
LOST_CONNECTION_EXIT = 3
LockTimeoutOption = Annotated[Optional[str], typer.Option("--lock-timeout", help="Longest wait for a lock per statement (e.g. 2s).", show_default=False)]


def _logging(verbose: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(DataFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """SIGINT/SIGTERM set the event: the job stops after its current batch."""
    stop = threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        if not stop.is_set():
            err.print(f"{signal.Signals(signum).name}: stopping after the current batch", highlight=False)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _options(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _run(job: str, name: str, options: dict[str, Any], url: str | None, schema: str, as_json: bool,
         render: Callable[[Any], None], call: Callable[..., Any] | None = None, stop: threading.Event | None = None) -> None:
    validate_queue_name(name)
    validate_schema_name(schema)
    from queuectl.jobs.base import config_from_options
    from queuectl.jobs.registry import job_spec
    from queuectl.jobs.runner import run_job

    spec = job_spec(job)
    config = config_from_options(spec.config_cls, options, job)
    engine = make_engine(url)
    # A run's log lines are for a scheduler's or --continuous log; here the result and the
    # one error line say it all (Python would print warnings bare on stderr otherwise).
    library_log = logging.getLogger("queuectl")
    if not any(isinstance(handler, logging.NullHandler) for handler in library_log.handlers):
        library_log.addHandler(logging.NullHandler())
    with _stop_on_signals() if stop is None else _nullcontext(stop) as stop_event:
        record = run_job(engine, spec, name, config, schema=schema, trigger="manual", stop=stop_event, call=call)
    if as_json:
        payload = {"run_id": record.run_id, "job": record.job, "queue": record.queue, "outcome": record.outcome,
                   "rows": record.rows, "error": record.error,
                   "result": record.result.as_dict() if record.result is not None else None}
        sys.stdout.write(json.dumps(payload, default=str, indent=2) + "\n")
    elif record.result is not None:
        render(record.result)
    if record.outcome != "succeeded":
        print_error(record.error or "unknown error", prefix=f"{job} failed")
        raise typer.Exit(LOST_CONNECTION_EXIT if getattr(record.result, "connection_lost", False) else 1)


@contextmanager
def _nullcontext(value: Any) -> Iterator[Any]:
    yield value


# -- archive -----------------------------------------------------------------------------


@app.command()
def archive(
    name: QueueArg,
    batch: Annotated[int, typer.Option(help="Rows moved per transaction.")] = 1000,
    min_age: Annotated[str, typer.Option("--min-age", help="Done rows stay at least this long (e.g. 60s, 5m).")] = "60s",
    dead_min_age: Annotated[str, typer.Option("--dead-min-age", help="Dead rows stay at least this long.")] = "7d",
    delay: Annotated[str, typer.Option(help="Pause between batches (e.g. 0.2s, 200ms).")] = "0.2s",
    max_seconds: Annotated[Optional[str], typer.Option("--max-seconds", help="Stop after this long (between batches).", show_default=False)] = None,
    continuous: Annotated[bool, typer.Option("--continuous", help="Run until stopped (Ctrl-C / SIGTERM), adapting to the backlog.")] = False,
    history_retention: Annotated[Optional[str], typer.Option("--history-retention", help="Also purge history archived longer ago than this (e.g. 30d).", show_default=False)] = None,
    rotate_items: Annotated[int, typer.Option("--rotate-items", help="Reliable queue: ids per generation before the next switch.")] = 2000,
    rotate_for: Annotated[str, typer.Option("--rotate-for", help="Reliable queue, without --continuous: keep rotating this long while ids are drawn (e.g. 50s; 0: the passes that are due).")] = "0s",
    lock_timeout: LockTimeoutOption = None,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
    as_json: JsonOption = False,
) -> None:
    """Move finished rows with their payloads to the history table, in small batches.

    Each batch is one short transaction; a killed archiver loses nothing. With --continuous it keeps going, faster while there is backlog, slower when idle, and stops cleanly after the current batch on Ctrl-C or SIGTERM. On a reliable queue it also rotates the generations: an old one's finished rows are copied to history and its tables emptied with TRUNCATE, which frees space even while a snapshot is held open.
    """  # noqa: E501 (one line per paragraph: --help wraps them itself)
    options = _options(batch=batch, min_age=min_age, dead_min_age=dead_min_age, delay=delay,
                       max_seconds=max_seconds, history_retention=history_retention, lock_timeout=lock_timeout,
                       rotate_items=rotate_items, rotate_for=rotate_for)
    if not continuous:
        _run("archive", name, options, url, schema, as_json, lambda r: print_fact(f"archive {name}: {r.summary()}"))
        return
    _logging()
    live = out.is_terminal and not as_json
    log = logging.getLogger("queuectl.jobs.archive")
    shown = {"at": 0.0}
    display = Live(Text(""), console=out, refresh_per_second=4, transient=False) if live else None

    def progress(p: Any) -> None:
        if display is not None:
            display.update(Text(p.line()))
        elif time.monotonic() - shown["at"] >= 10:  # plain logs: a line every 10 s
            shown["at"] = time.monotonic()
            log.info(p.line())

    def call(engine: Any, queue: str, config: Any, *, schema: str, stop: threading.Event) -> Any:
        from queuectl.jobs import archive as archive_job

        return archive_job.run_continuous(engine, queue, config, schema=schema, stop=stop, on_progress=progress)

    def render(result: Any) -> None:
        print_fact(f"archive {name}: {result.summary()}")

    if display is not None:
        with display:
            _run("archive", name, options, url, schema, as_json, render, call=call)
    else:
        _run("archive", name, options, url, schema, as_json, render, call=call)


# -- compact -------------------------------------------------------------------------------


@app.command()
def compact(
    name: QueueArg,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Measure the tables and say whether they are due; change nothing.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Compact even when not due (still within --max-rows).")] = False,
    continuous: Annotated[bool, typer.Option("--continuous", help="Measure every --interval and compact when due, until stopped (Ctrl-C / SIGTERM).")] = False,
    interval: Annotated[str, typer.Option(help="With --continuous: how often to measure (e.g. 1s).")] = "1s",
    max_rows: Annotated[int, typer.Option("--max-rows", help="Leave a queue with more live rows than this alone (the copy under the lock stays short).")] = 100_000,
    max_seconds: Annotated[Optional[str], typer.Option("--max-seconds", help="With --continuous: stop after this long.", show_default=False)] = None,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
    as_json: JsonOption = False,
) -> None:
    """Give a ring's or a DELETE-drained queue's tables (heap, fifo, stack, pending, watermark) new files holding only their live rows, once their dead row versions outnumber the live ones.

    This frees the space that a snapshot held open (a long report, pg_dump, a replica's feedback) keeps VACUUM from reclaiming. It copies the live rows aside, truncates and inserts them back in one short transaction that pushes and pops wait for (milliseconds for a small backlog, tens of milliseconds for thousands of ring slots); when another session holds a lock on the tables (one that read them in an open transaction) it gives up within 50 ms, names that session and tries again later. PostgreSQL only.
    """  # noqa: E501 (one line per paragraph: --help wraps them itself)
    options = _options(dry_run=dry_run, force=force, max_rows=max_rows, interval=interval, max_seconds=max_seconds)
    if continuous:
        _logging()
    _run("compact", name, options, url, schema, as_json, lambda r: print_fact(f"compact {name}: {r.summary()}"),
         call=_compact_continuous if continuous else None)


def _compact_continuous(engine: Any, queue: str, config: Any, *, schema: str, stop: threading.Event) -> Any:
    from queuectl.jobs import compact as compact_job

    return compact_job.run_continuous(engine, queue, config, schema=schema, stop=stop)


# -- reorganize ----------------------------------------------------------------------------


def _mb(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1048576:,.1f} MB" if n >= 1048576 else f"{n / 1024:,.0f} kB"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


def _render_reorganize(result: Any) -> None:
    title = "reorganize (dry run: nothing changed)" if result.dry_run else "reorganize"
    table = make_table(("table", "index", "size before", "size after", "leaf density", "fragmentation", "bloat",
                        "decision", "action"), title=title, right=range(2, 7), wrap={7: 16, 8: 16})
    for i in result.indexes:
        b, a = i.before, i.after
        table.add_row(
            i.table, i.index, _mb(b.bytes), _mb(a.bytes) if a else "-",
            _pct(b.leaf_density) + (f" -> {_pct(a.leaf_density)}" if a and a.leaf_density is not None else ""),
            _pct(b.leaf_fragmentation), _pct(b.bloat_pct) + (f" -> {_pct(a.bloat_pct)}" if a and a.bloat_pct is not None else ""),
            i.decision, (i.action or "") + (f" ({i.error})" if i.error else ""),
        )
    out.print(Fitted(table))
    for entry in result.leftovers:
        print_fact(f"leftover index {entry['index']} ({_mb(entry['bytes'])}): {entry['action']}"
              + (f" ({entry['error']})" if entry.get("error") else ""))
    for note in result.notes:
        out.print(f"note: {note}", highlight=False)
    print_fact(result.summary())


@app.command()
def reorganize(
    name: QueueArg,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Measure and report what would be done; change nothing.")] = False,
    min_pages: Annotated[int, typer.Option("--min-pages", help="Leave indexes smaller than this many 8 kB pages alone (health's index_min_pages).")] = MIN_INDEX_PAGES,
    bloat: Annotated[float, typer.Option("--bloat", help="Rebuild at or above this estimated bloat % (PostgreSQL; health's index_bloat.warn).")] = REBUILD_BLOAT_PCT,
    fragmentation: Annotated[float, typer.Option("--fragmentation", help="Rebuild at or above this leaf fragmentation %.")] = REBUILD_FRAGMENTATION_PCT,
    lock_timeout: LockTimeoutOption = None,
    time_limit: Annotated[Optional[str], typer.Option("--time-limit", help="Longest REINDEX / VACUUM (statement_timeout; SQL Server, parse- and reference-checked, not run live: a resumable rebuild's MAX_DURATION), e.g. 10m.", show_default=False)] = None,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
    as_json: JsonOption = False,
) -> None:
    """Keep the queue's indexes compact online, acting only above the thresholds.

    Any kind: the indexes of the tables its kind churns (a reliable queue's meta and data, the items table of heap, fifo, stack, pending and watermark queues and a watermark queue's hint, the ring's slots). PostgreSQL: indexes measured with pgstatindex (the pgstattuple extension is created when missing and permitted) are rebuilt with REINDEX CONCURRENTLY, then VACUUM (ANALYZE) of each table; leftovers of an interrupted earlier rebuild are dropped first. SQL Server (parse- and reference-checked, not run live): sys.dm_db_index_physical_stats; ALTER INDEX ... REORGANIZE from 5 % fragmentation (or pages under 70 % of the index's fill factor full), REBUILD WITH (ONLINE = ON, RESUMABLE = ON) above --fragmentation where the edition allows, then UPDATE STATISTICS; a paused resumable rebuild is resumed.
    """  # noqa: E501 (one line per paragraph: --help wraps them itself)
    options = _options(dry_run=dry_run, min_pages=min_pages, rebuild_bloat_pct=bloat,
                       rebuild_fragmentation_pct=fragmentation, lock_timeout=lock_timeout, statement_timeout=time_limit)
    _run("reorganize", name, options, url, schema, as_json, _render_reorganize)


# -- inspect / reset-stale -------------------------------------------------------------------


def _render_inspect(result: Any) -> None:
    """Sizes in health's human units (the JSON keeps the bytes)."""
    from queuectl.thresholds import fmt_bytes

    table = make_table(("measure", "value"), wrap={1: 20},
                       title=f"health snapshot #{result.snapshot_id} at {result.taken_at:%Y-%m-%d %H:%M:%S}")
    shown_items = [(k, v) for k, v in result.snapshot.items() if k not in ("details", "kind_fields")]
    kind_fields = result.snapshot.get("kind_fields") or {}  # the kind's own numbers, one row each
    shown_items += [(f"kind_fields.{k}", v) for k, v in kind_fields.items()] or [("kind_fields", None)]
    for key, value in shown_items:
        shown = fmt_bytes(value) if key.endswith("_bytes") else "-" if value is None else str(value)
        table.add_row(key, shown)
    out.print(Fitted(table))


@app.command()
def inspect(
    name: QueueArg,
    physical: Annotated[bool, typer.Option("--physical/--no-physical", help="Also measure the queue's tables and their indexes with pgstattuple (when installed; SQL Server: sys.dm_db_index_physical_stats, parse- and reference-checked, not run live).")] = True,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
    as_json: JsonOption = False,
) -> None:
    """Record a health snapshot of a queue of any kind: dead tuples, bloat, fragmentation, what holds cleanup back, and the kind's own numbers (a ring's free slots and push/pop sequence gap, a pending queue's overdue items, a watermark queue's lag).
    """  # noqa: E501 (one line per paragraph: --help wraps them itself)
    _run("inspect", name, {"physical": physical}, url, schema, as_json, _render_inspect)


@app.command("reset-stale")
def reset_stale(
    name: QueueArg,
    batch: Annotated[int, typer.Option(help="Rows per transaction.")] = 1000,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
    as_json: JsonOption = False,
) -> None:
    """Put items whose lease expired back to ready (or dead after their last attempt)."""
    _run("reset_stale", name, {"batch": batch}, url, schema, as_json, lambda r: print_fact(f"reset-stale {name}: {r.summary()}"))


# -- jobs and the scheduler ----------------------------------------------------------------

jobs_app = typer.Typer(name="jobs", help="Maintenance jobs: what is scheduled, what ran, run one by hand.", no_args_is_help=True)
scheduler_app = typer.Typer(name="scheduler", help="Run the maintenance jobs on a schedule.", no_args_is_help=True)
ConfigOption = Annotated[Optional[str], typer.Option("--config", help="TOML config (default: every job on every queue, default schedules).", show_default=False)]


def _when(value: Any) -> str:
    return "-" if value is None else f"{value:%Y-%m-%d %H:%M:%S}"


@jobs_app.command("list")
def jobs_list(config: ConfigOption = None, url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Jobs per queue with their trigger, last run and next run time."""
    from queuectl.jobs.scheduler import load_config, overview

    settings = load_config(config)
    rows = overview(make_engine(url), settings)
    if as_json:
        sys.stdout.write(json.dumps(rows, default=str, indent=2) + "\n")
        return
    if not rows:
        out.print(f"no jobs: no queues installed in schema {settings.schema}")
        return
    table = make_table(("job", "queue", "trigger", "last run", "outcome", "rows", "next run"), right=(5,),
                       wrap={2: 9, 3: 10, 6: 10})
    for r in rows:
        next_run = Text("never (see below)", style="yellow") if r["problem"] else _when(r["next_run"])
        table.add_row(r["job"], r["queue"], r["trigger"], _when(r["last_started"]), r["last_outcome"] or "-",
                      "-" if r["last_rows"] is None else f"{r['last_rows']:,}", next_run)
    out.print(Fitted(table))
    for r in rows:
        if r["problem"]:
            out.print(Text.assemble(("warning:", "yellow"), " ", r["problem"]), soft_wrap=True)


@jobs_app.command("history")
def jobs_history(
    last: Annotated[int, typer.Option("--last", help="How many runs, newest first.")] = 20,
    job: Annotated[Optional[str], typer.Option("--job", help="Only this job.", show_default=False)] = None,
    queue: Annotated[Optional[str], typer.Option("--queue", help="Only this queue.", show_default=False)] = None,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
    as_json: JsonOption = False,
) -> None:
    """The job-run history: start, duration, outcome, rows, error, runner."""
    from queuectl.errors import UsageError
    from queuectl.jobs.registry import job_spec
    from queuectl.jobs.runner import recent_runs

    if not 1 <= last <= 100_000:
        raise UsageError("--last must be from 1 to 100000")
    validate_schema_name(schema)
    job = job_spec(job).name if job else None
    if queue:
        validate_queue_name(queue)
    runs = recent_runs(make_engine(url), schema=schema, last=last, job=job, queue=queue)
    if as_json:
        sys.stdout.write(json.dumps(runs, default=str, indent=2) + "\n")
        return
    table = make_table(("id", "job", "queue", "started", "seconds", "outcome", "rows", "runner", "error / summary"),
                       right=(0, 4, 6), wrap={3: 10, 8: 30})
    for r in runs:
        style = {"failed": "red", "abandoned": "yellow", "running": "cyan"}.get(r["outcome"], "")
        table.add_row(str(r["id"]), r["job"], r["queue"], _when(r["started_at"]), f"{r['seconds']:.2f}",
                      Text(r["outcome"], style=style), "-" if r["rows"] is None else f"{r['rows']:,}",
                      f"{r['runner_host']}:{r['runner_pid']}", r["error"] or r["summary"] or "")
    out.print(Fitted(table))


@jobs_app.command("run")
def jobs_run(
    job: Annotated[str, typer.Argument(help="Job: archive, reset_stale, inspect, reorganize, upkeep, correct_watermark.")],
    name: QueueArg,
    option: Annotated[Optional[list[str]], typer.Option("--option", "-o", help="Job option key=value (repeatable), e.g. -o batch=500 -o min_age=5m.", show_default=False)] = None,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
    as_json: JsonOption = False,
) -> None:
    """Run one job once on one queue, as the scheduler would (recorded in the history)."""
    from queuectl.errors import UsageError

    options: dict[str, Any] = {}
    for item in option or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--option {item!r}: expected key=value")
        options[key.strip().replace("-", "_")] = _toml_value(value.strip())
    _run(job, name, options, url, schema, as_json, lambda r: print_fact(f"{job} {name}: {r.summary()}"))


def _toml_value(text: str) -> Any:
    """A TOML scalar (42, 1.5, true, "x"); anything else is a string (durations like 5m)."""
    import tomllib

    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


@scheduler_app.command("run")
def scheduler_run(
    config: ConfigOption = None,
    max_seconds: Annotated[Optional[float], typer.Option("--max-seconds", help="Stop after this many seconds (default: run until SIGINT/SIGTERM).", show_default=False)] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="Debug logging.")] = False,
    url: UrlOption = None,
) -> None:
    """Run the jobs on their schedules until stopped. Several schedulers may share a database: each run takes a per-(job, queue) lock, so no job runs twice at once.
    """  # noqa: E501 (one line per paragraph: --help wraps them itself)
    from queuectl.jobs.scheduler import Scheduler, load_config

    settings = load_config(config)
    _logging(verbose)
    Scheduler(make_engine(url, pool_size=settings.workers + 2), settings).run(max_seconds=max_seconds)

