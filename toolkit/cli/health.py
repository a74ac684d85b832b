"""`queuectl health`: one command that says whether the queues are healthy, and if not, why.

Renders queuectl.health.HealthReport: rich tables with colour on a terminal, the same
tables as plain aligned text when piped, or the JSON object of health_schema.json.
Exit codes follow the Nagios plugin convention so cron and monitors can use them:

    0 OK   1 WARNING   2 CRITICAL   3 UNKNOWN (no verdict: bad option, database unreachable,
                                               or a fault of queuectl's own)

(Elsewhere queuectl exits 2 for a user error; health keeps 2 for CRITICAL and uses 3 for
errors so a monitor never mistakes a typo, an outage or a bug for a graded verdict; each is
one line on stderr, never a traceback. A mistyped option name is rejected by the parser
itself, with its usage message and exit code 2.)
"""

from __future__ import annotations

import json
import os
import sys
import time
import tomllib
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from queuectl.cli.options import (
    Fitted, SchemaOption, UrlOption, database_errors, json_flag, make_console, make_table, print_error,
)
from queuectl.engine import backoff_pause, make_engine
from queuectl.engine.urls import URL_ENV, error_text, first_line, hide_secrets, mask_url
from queuectl.errors import ConnectionFailed, QueuectlError
from queuectl.names import DEFAULT_SCHEMA, validate_queue_name, validate_schema_name
from queuectl.thresholds import (
    CRITICAL, DEFAULT_THRESHOLDS, INFO, OK, WARNING, fmt_bytes, fmt_count, fmt_duration, fmt_threshold, worst,
)

if TYPE_CHECKING:
    from queuectl.health import HealthReport

UNKNOWN_EXIT = 3
STYLE = {OK: "green", INFO: "cyan", WARNING: "bold yellow", CRITICAL: "bold red"}
PLAIN_WIDTH = 220  # piped output is for grep and logs: never fold a line

app = typer.Typer()
ReportJsonOption = json_flag("Print the report as one JSON object (see health_schema.json); the same as --format json.")


class ReportFormat(str, Enum):
    text = "text"
    json = "json"
    openmetrics = "openmetrics"
    prometheus = "prometheus"


METRIC_FORMATS = (ReportFormat.openmetrics, ReportFormat.prometheus)
FormatOption = Annotated[Optional[ReportFormat], typer.Option(
    "--format", help="text (tables and advice), json, or the facts as metrics: openmetrics (OpenMetrics text) or "
    "prometheus (the Prometheus text format, e.g. for node_exporter's textfile collector); docs/operations.md "
    "lists the metrics. Default: text.", show_default=False)]


def _threshold_help() -> str:
    return "; ".join(
        f"{t.name} ({fmt_threshold(t.unit, t.warn)}/{fmt_threshold(t.unit, t.crit)})" for t in DEFAULT_THRESHOLDS.values()
    )


@app.command()
def health(
    names: Annotated[Optional[list[str]], typer.Argument(help="Queues to check (default: every installed queue).", show_default=False)] = None,
    as_json: ReportJsonOption = False,
    report_format: FormatOption = None,
    watch: Annotated[Optional[float], typer.Option("--watch", metavar="SECONDS", help="Refresh every SECONDS until Ctrl-C (in place on a terminal; JSON lines with --json).", show_default=False)] = None,
    settings: Annotated[Optional[list[str]], typer.Option("--set", metavar="NAME.warn|crit=VALUE", help="Override a threshold, e.g. --set oldest_ready_age.warn=60s --set dead_letters.crit=off. Repeatable. Defaults (warn/crit): " + _threshold_help(), show_default=False)] = None,
    config: Annotated[Optional[str], typer.Option("--config", help="TOML file with a \\[health] table (thresholds and options); --set wins over it. The scheduler's \\[jobs.*] tables in it are checked too: a queue they name that is not installed (or of another kind) is a WARNING.", show_default=False)] = None,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
    reconnect_for: Annotated[float, typer.Option("--reconnect-for", metavar="SECONDS", help="With --watch: after a lost connection keep retrying (jittered back-off) this long, one line on stderr, then exit 3. A single check never retries.")] = 30.0,
) -> None:
    """Check queues, storage, cleanup blockers and jobs; give a verdict and advice.

    Exit code: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (could not check).
    """
    err = make_console(stderr=True)
    try:
        for name in names or []:  # names first: a refused name loads no library
            validate_queue_name(name)
        validate_schema_name(schema)
        from queuectl.health import HealthOptions, health_report, load_config

        options = HealthOptions()
        if config:
            options = load_config(config, options)
            if {"scheduler", "jobs"} & set(tomllib.loads(Path(config).read_text("utf-8"))):  # read by load_config
                from queuectl.jobs.scheduler import load_config as scheduler_config

                options = replace(options, scheduler=scheduler_config(config))
        options = options.with_settings(settings or [])
        if watch is not None and not 0.5 <= watch <= 86400:
            raise QueuectlError("--watch must be from 0.5 to 86400 seconds")
        if as_json and report_format not in (None, ReportFormat.json):
            raise QueuectlError(f"--json and --format {report_format.value} ask for two formats: give one")
        if watch is not None and report_format in METRIC_FORMATS:
            raise QueuectlError("--watch does not repeat metrics: let Prometheus scrape `queuectl metrics serve`")
        as_json = as_json or report_format == ReportFormat.json
        if not 0 <= reconnect_for <= 86400:
            raise QueuectlError(f"--reconnect-for must be from 0 to 86400 seconds, got {reconnect_for:g}")
        engine = make_engine(url)
        run = lambda: health_report(engine, names or None, schema, options)  # noqa: E731
        if watch is None:
            report = run()
            if report_format in METRIC_FORMATS:
                from queuectl.metrics import exposition

                sys.stdout.write(exposition(report, report_format.value).decode("utf-8"))
                sys.stdout.flush()
            else:
                _emit(report, as_json)
            raise typer.Exit(report.exit_code)
        raise typer.Exit(_watch(_surviving(run, engine, reconnect_for, err), watch, as_json))
    except typer.Exit:
        raise
    except QueuectlError as exc:
        print_error(str(exc), console=err)
        raise typer.Exit(UNKNOWN_EXIT) from None
    except Exception as exc:
        if isinstance(exc, database_errors()):
            print_error(error_text(exc, url or os.environ.get(URL_ENV)), "database error", err)
            raise typer.Exit(UNKNOWN_EXIT) from None
        # a fault of queuectl's own: still UNKNOWN, never a verdict, never a traceback
        message = f"{type(exc).__name__}: {first_line(exc)} (a queuectl bug: please report it)"
        print_error(hide_secrets(message, url or os.environ.get(URL_ENV)), "internal error", err)
        raise typer.Exit(UNKNOWN_EXIT) from None


def _console() -> Console:
    terminal = sys.stdout.isatty()
    if terminal:
        return make_console()
    return make_console(width=max(PLAIN_WIDTH, int(os.environ.get("COLUMNS", 0) or 0)), no_color=True, highlight=False)


def _emit(report: HealthReport, as_json: bool, *, compact: bool = False) -> None:
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=None if compact else 2) + "\n")
        sys.stdout.flush()
        return
    console = _console()
    plain = not console.is_terminal
    for part in render_parts(report, plain=plain):
        # Piped: advice and notes stay one line each, whatever their length (grep, logs).
        console.print(part, soft_wrap=plain and isinstance(part, Text))


def _surviving(run, engine, reconnect_for: float, err: Console):
    """`run` that outlives a lost or refused connection (server restart, terminated backend).

    Retries with jittered back-off for up to `reconnect_for` seconds from the first failure,
    saying so once on stderr and again when the server is back; then gives up with
    ConnectionFailed (one masked line, exit 3). Other database errors stay fatal.
    """

    from sqlalchemy.exc import OperationalError

    def attempt():
        deadline, tries = None, 0
        while True:
            try:
                report = run()
            except OperationalError as exc:
                reason = error_text(exc, engine)
                now = time.monotonic()
                if deadline is None:
                    deadline = now + reconnect_for
                    err.print(f"lost the database ({reason}): reconnecting for up to {reconnect_for:g} s",
                              style="yellow", highlight=False, soft_wrap=True)
                if now >= deadline:
                    raise ConnectionFailed(
                        f"health --watch: gave up reconnecting to {mask_url(engine.url)} after {reconnect_for:g} s ({reason})"
                    ) from None
                time.sleep(min(backoff_pause(tries, 0.1, 2.0), max(0.0, deadline - now)))
                tries += 1
                continue
            if deadline is not None:
                err.print("database reachable again", style="green", highlight=False)
            return report

    return attempt


def _watch(run, seconds: float, as_json: bool) -> int:
    """Refresh until Ctrl-C; the exit code is the last verdict's."""
    code = UNKNOWN_EXIT
    console = _console()
    try:
        if as_json or not console.is_terminal:
            while True:
                report = run()
                code = report.exit_code
                _emit(report, as_json, compact=True)
                if not as_json:
                    sys.stdout.write("\n")
                    sys.stdout.flush()
                time.sleep(seconds)
        from rich.live import Live

        footer = f"refreshing every {seconds:g}s; Ctrl-C to stop"
        report = run()
        code = report.exit_code
        with Live(render(report, footer=footer), console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(seconds)
                report = run()
                code = report.exit_code
                live.update(render(report, footer=footer), refresh=True)
    except KeyboardInterrupt:
        return code


# -- rendering (shared by terminal and plain text) -------------------------------------------------


def _status(status: str, plain: bool) -> Text:
    return Text(status, style="" if plain else STYLE[status])


def _table(title: str, columns: list[str], plain: bool, right: set[int] = frozenset(),
           wrap: dict[int, int] | None = None) -> Table:
    return make_table(columns, title=title, right=right, wrap=wrap, plain=plain)


def _worst_for(report: HealthReport, section: str, obj: str) -> str:
    return worst(OK, *(c.status for c in report.checks if c.section == section and c.object == obj))


def render(report: HealthReport, plain: bool = False, footer: str | None = None) -> RenderableType:
    """The whole report as one rich renderable (tables, advice, notes)."""
    return Group(*render_parts(report, plain, footer))


def render_parts(report: HealthReport, plain: bool = False, footer: str | None = None) -> list[RenderableType]:
    """The report's pieces in order: headline, tables, advice lines, notes."""
    d = report.to_dict()
    db = d["database"]
    parts: list[RenderableType] = []
    head = Text()
    head.append("queuectl health ", style="" if plain else "bold")
    head.append(f"{db['name']} (PostgreSQL {db['server_version'].split()[0]}, schema {db['schema']}) "
                f"at {d['generated_at'][:19].replace('T', ' ')}: ")
    head.append(d["verdict"], style="" if plain else STYLE[d["verdict"]])
    c = d["counts"]
    head.append(f"  ({c[CRITICAL]} critical, {c[WARNING]} warning, {c[INFO]} info, {c[OK]} ok)")

    queues = _table("Queues", ["queue", "kind", "ready", "scheduled", "processing", "done", "dead",
                               "oldest ready", "stuck", "in/min", "done/min", "status"], plain, right=set(range(2, 11)))
    for q in d["queues"]:
        dep, rates = q["depth"], q["rates"]
        queues.add_row(q["name"], q["kind"], *(fmt_count(dep[k]) for k in ("ready", "scheduled", "processing", "done", "dead")),
                       fmt_duration(q["oldest_ready_age_s"]), fmt_count(q["stuck"]),
                       _rate(rates["enqueued_per_min"]), _rate(rates["completed_per_min"]),
                       _status(_worst_for(report, "queues", q["name"]), plain))
    parts.append(queues if d["queues"] else Text(f"no queues installed in schema {db['schema']}"))

    if d["storage"]["tables"]:
        tables = _table("Storage", ["table", "live", "dead", "dead %", "hot upd %", "size", "indexes", "bloat",
                                    "last vacuum", "last analyze", "status"], plain, right=set(range(1, 10)))
        now = report.facts.generated_at
        for t in d["storage"]["tables"]:
            status = worst(_worst_for(report, "storage", t["table"]))
            tables.add_row(t["table"], fmt_count(t["live_tuples"]), fmt_count(t["dead_tuples"]), f"{t['dead_pct']:g}",
                           "-" if t["hot_update_pct"] is None else f"{t['hot_update_pct']:g}",
                           fmt_bytes(t["table_bytes"]), fmt_bytes(t["index_bytes"]),
                           _graded_pct(report, "storage.table_bloat", t["table"], t["bloat_pct"]),
                           _ago(now, report.facts, t["table"], ("last_vacuum", "last_autovacuum")),
                           _ago(now, report.facts, t["table"], ("last_analyze", "last_autoanalyze")),
                           _status(status, plain))
        parts.append(tables)
        indexes = _table("Indexes", ["index", "size", "leaf pages", "leaf density", "fragmentation", "bloat", "scans",
                                     "status"], plain, right=set(range(1, 7)))
        for ix in d["storage"]["indexes"]:
            indexes.add_row(ix["index"], fmt_bytes(ix["index_bytes"]), fmt_count(ix["leaf_pages"]),
                            _pct(ix["avg_leaf_density"]), _pct(ix["leaf_fragmentation"]),
                            _graded_pct(report, "storage.index_bloat", ix["index"], ix["bloat_pct"]),
                            fmt_count(ix["scans"]), _status(_worst_for(report, "storage", ix["index"]), plain))
        parts.append(indexes)

    blockers = _table("Cleanup blockers", ["what", "status", "finding"], plain, wrap={2: 30})
    for check in report.checks:
        if check.section == "blockers":
            blockers.add_row(check.object, _status(check.status, plain), check.summary)
    parts.append(blockers)

    jobs = d["jobs"]
    if jobs["runs"]:
        table = _table("Jobs", ["job", "queue", "last run", "outcome", "duration", "rows", "failures", "next run"],
                       plain, right={4, 5, 6})
        for r in jobs["runs"]:
            table.add_row(r["job"], r["queue"] or "-", (r["started_at"] or "-")[:19].replace("T", " "),
                          r["outcome"] or "running", fmt_duration(r["duration_s"]), fmt_count(r["rows"]),
                          str(r["failures"]), r["next_run"] or "-")
        parts.append(table)
    else:
        parts.append(Text(f"Jobs: {jobs['note'] or 'no runs recorded'}"))

    advice: list[RenderableType] = []
    if report.advice:
        advice.append(Text(""))
        advice.append(Text("Advice", style="" if plain else "bold"))
        for check in report.advice:
            line = Text()
            line.append(f"{check.status:<8} ", style="" if plain else STYLE[check.status])
            line.append(check.advice)
            advice.append(line)
    advice += [Text(f"note: {note}", style="" if plain else "dim") for note in d["notes"]]
    if footer:
        # Watching: what to act on first, so a screen too short for the tables crops them, not the advice.
        return [head, Text(footer, style="" if plain else "dim"), *advice, *_spaced(parts)]
    return [head, *_spaced(parts), *advice]


def _spaced(parts: list[RenderableType]) -> list[RenderableType]:
    out: list[RenderableType] = []
    for part in parts:
        if out and isinstance(part, Table):
            out.append(Text(""))
        out.append(Fitted(part) if isinstance(part, Table) else part)  # no cell cut at any width
    return out


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _graded_pct(report: HealthReport, check_id: str, obj: str, value: float | None) -> str:
    """A bloat ratio only where it was graded: tiny relations show high ratios naturally."""
    graded = any(c.id == check_id and c.object == obj for c in report.checks)
    return _pct(value) if graded else "-"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _ago(now, facts, table: str, keys: tuple[str, ...]) -> str:
    row = next((t for t in facts.tables if t["table_name"] == table), None)
    stamps = [(row[k], k) for k in keys if row and row.get(k)]
    if not stamps:
        return "never"
    when, key = max(stamps)
    return f"{fmt_duration((now - when).total_seconds())} ago" + (" (auto)" if key.startswith("last_auto") else "")
