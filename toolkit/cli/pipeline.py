"""`queuectl pipeline export|report`: thin commands over queuectl.pipeline."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from queuectl.cli.options import SchemaOption, UrlOption, json_flag, out, print_fact
from queuectl.engine import make_engine
from queuectl.names import DEFAULT_SCHEMA, validate_queue_name, validate_schema_name

app = typer.Typer(
    name="pipeline",
    help="Export queue history to a Parquet lake with Spark, and report on it (needs the spark extra).",
    no_args_is_help=True,
)

LakeOption = Annotated[str, typer.Option("--lake", help="Lake folder (local or shared path seen by all Spark executors).")]
MasterOption = Annotated[
    Optional[str],
    typer.Option("--master", help="Spark master URL, e.g. spark://host:7077. Default: $QUEUECTL_SPARK_MASTER, else local[*].", show_default=False),
]
JsonOption = json_flag("Print JSON (the default when stdout is not a terminal).")


def _as_json(flag: bool) -> bool:
    return flag or not out.is_terminal


@app.command("export")
def export(
    queues: Annotated[Optional[list[str]], typer.Argument(help="Queues to export; default: every queue that keeps history.", show_default=False)] = None,
    lake: LakeOption = ...,
    partitions: Annotated[Optional[int], typer.Option(help="Parallel JDBC id-range reads per queue (default: Spark cores, or one per 250k rows).", show_default=False)] = None,
    purge: Annotated[bool, typer.Option("--purge", help="Then delete the exported rows from history, in small batches.")] = False,
    purge_batch: Annotated[int, typer.Option(help="Rows per purge transaction.")] = 5000,
    master: MasterOption = None,
    jdbc_jar: Annotated[Optional[str], typer.Option("--jdbc-jar", help="JDBC driver jar. Default: $QUEUECTL_JDBC_JAR, /usr/share/java, ~/.m2.", show_default=False)] = None,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
    as_json: JsonOption = False,
) -> None:
    """Export new queue history into Parquet (partitioned by queue and day); reruns export only what is new.

    A run reads each queue's history table with Spark's JDBC source in parallel id ranges, writes into a staging folder of the lake and commits by renames, then records in the catalog what the lake holds. A killed run is finished or discarded by the next one.
    """
    from queuectl.pipeline import export_history

    for name in queues or []:
        validate_queue_name(name)
    validate_schema_name(schema)
    engine = make_engine(url)
    json_out = _as_json(as_json)
    with _progress(enabled=not json_out) as report_progress:
        result = export_history(
            engine, lake, queues or None, schema=schema, partitions=partitions, purge=purge,
            master=master, jdbc_jar=jdbc_jar, purge_batch=purge_batch, progress=report_progress,
        )  # fmt: skip
    if json_out:
        sys.stdout.write(json.dumps(result.as_dict(), indent=2) + "\n")
        return
    table = Table("queue", "run", "rows", "new", "late", "partitions", "files", "exported up to id", "archived before", "purged", "seconds")
    for q in result.queues:
        if q.skipped:
            table.add_row(q.queue, "-", "-", "-", "-", "-", "-", "-", f"skipped: {q.skipped}", "-", "-")
            continue
        d = q.as_dict()
        table.add_row(
            q.queue, str(q.run_seq or "-"), f"{q.rows:,}", f"{q.new_rows:,}", f"{q.late_rows:,}", str(q.partitions),
            str(q.files), f"{q.bounds.upto_id:,}", str(d["archived_before"] or "-"), f"{q.purged:,}", f"{q.seconds:.1f}",
        )  # fmt: skip
    out.print(table)
    for q in result.queues:
        for seq, action in q.recovered:
            print_fact(f"{q.queue}: run {seq} left by a stopped export was {action}")
        for warning in q.warnings:
            out.print(Text.assemble(("warning:", "yellow"), f" {q.queue}: {warning}"))
    rate = f", {result.rows / result.seconds:,.0f} rows/s" if result.seconds and result.rows else ""
    out.print(
        f"exported {result.rows:,} rows to {result.lake} on {result.master} in {result.seconds:.1f} s"
        f" (Spark start {result.spark_start_seconds:.1f} s){rate}"
    )


class _progress:
    """A rich progress bar per queue while it exports (only on a terminal)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=out, transient=True,
        )  # fmt: skip
        self.bar.start()
        return self.update

    def update(self, p) -> None:
        if p.queue not in self.tasks:
            self.tasks[p.queue] = self.bar.add_task(p.queue, total=p.rows_total or None, detail="")
        task = self.tasks[p.queue]
        if p.phase == "purging":
            self.bar.update(task, description=f"{p.queue} purging", completed=p.rows_done, total=None, detail="rows deleted")
            return
        detail = f"rows (≈ from {p.tasks_done}/{p.tasks_total} partitions done)" if p.phase == "reading" else p.phase
        self.bar.update(task, description=f"{p.queue} {p.phase}", completed=p.rows_done, total=p.rows_total or None, detail=detail)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


@app.command("report")
def report(
    lake: LakeOption = ...,
    since: Annotated[Optional[str], typer.Option("--since", help="Only items finished (and enqueued) on or after this UTC date, e.g. 2025-01-31.", show_default=False)] = None,
    out_dir: Annotated[Optional[str], typer.Option("--out", help="Write report.json and PNG charts (throughput, latency, attempts) here.", show_default=False)] = None,
    hours: Annotated[int, typer.Option(help="Hourly rows shown per queue on the console (the JSON has all).")] = 24,
    master: MasterOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per queue and hour: enqueued, completed, dead, throughput, wait and processing p50/p90/p99, attempts, dead-letter rate."""
    from queuectl.pipeline import build_report

    result = build_report(lake, since=since, out_dir=out_dir, master=master)
    if _as_json(as_json):
        sys.stdout.write(json.dumps(result.as_dict(), indent=2) + "\n")
        return
    summary = Table("queue", "enqueued", "completed", "dead", "dead rate", "completed/s", "wait p50/p90/p99 s", "processing p50/p90/p99 s", "attempts", title="Summary",
                    caption="completed/s: from the first finish to the last; the hourly tables divide by the whole hour (3600 s), so a run shorter than an hour shows less there",
                    caption_justify="left")
    for name, q in result.queues.items():
        s = q["summary"]
        summary.add_row(
            name, f"{s['enqueued']:,}", f"{s['completed']:,}", f"{s['dead']:,}", _pct(s["dead_rate"]),
            _num(s["throughput_per_s"]), _ptriple(s["wait_s"]), _ptriple(s["processing_s"]),
            " ".join(f"{k}:{v:,}" for k, v in s["attempts"].items()),
        )  # fmt: skip
    out.print(summary)
    for name, q in result.queues.items():
        table = Table("hour (UTC)", "enqueued", "completed", "dead", "dead rate", "completed/s of the hour", "wait p50/p90/p99 s", "processing p50/p90/p99 s", title=f"{name}: last {hours} hours")
        for h in q["hours"][-hours:] if hours > 0 else []:
            table.add_row(
                h["hour"][:16].replace("T", " "), f"{h['enqueued']:,}", f"{h['completed']:,}", f"{h['dead']:,}",
                _pct(h["dead_rate"]), _num(h["throughput_per_s"]), _ptriple(h["wait_s"]), _ptriple(h["processing_s"]),
            )  # fmt: skip
        out.print(table)
    if result.out_dir:
        print_fact(f"wrote {result.out_dir}/report.json and {', '.join(c.rsplit('/', 1)[-1] for c in result.charts or [])}")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.3f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def _ptriple(p: dict) -> str:
    return " / ".join(_num(p[k]) for k in ("p50", "p90", "p99"))
