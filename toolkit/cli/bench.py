"""`queuectl bench`: the command line over queuectl.bench.run_bench."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from queuectl.cli.options import UrlOption, make_console
from queuectl.engine.urls import hide_secrets
from queuectl.names import DEFAULT_SCHEMA

app = typer.Typer()


@app.command()
def bench(
    ctx: typer.Context,
    kind: Annotated[
        Optional[list[str]],
        typer.Option("--kind", "--kinds", help="Queue kind to measure (repeatable, or comma-separated). Default: reliable. "
                     "The sustained scenario also takes the peers pgq (PgQ with pgqd, from Debian), pgqueuer and pgboss (make peer-pgboss)."),
    ] = None,
    producers: Annotated[Optional[int], typer.Option(help="Producer processes. Default: 4 (sustained, consumers, cost: 2).")] = None,
    consumers: Annotated[
        Optional[int], typer.Option(help="Consumer processes. Default: 4 (sustained, cost: 2; cost's claim+ack: always 1).")
    ] = None,
    batch: Annotated[
        Optional[int],
        typer.Option(help="Messages per enqueue and per dequeue call. Default: 100 (split, ring, sustained, "
                     "consumers, cost: 10)."),
    ] = None,
    payload_bytes: Annotated[int, typer.Option(help="Payload size in bytes (random, incompressible).")] = 300,
    payload_content: Annotated[
        str,
        typer.Option(help="split: what the payloads hold. random: incompressible bytes; json: JSON-like order "
                     "records, which PostgreSQL compresses (pglz, about 3x) before it moves a payload out of line."),
    ] = "random",
    seconds: Annotated[
        Optional[float],
        typer.Option(help="Length of each measured phase. Default: 10; consumers and archive: 20, which their full "
                     "cycles need to reach a steady state."),
    ] = None,
    repeat: Annotated[int, typer.Option(help="Repeats; medians are reported.")] = 3,
    scenario: Annotated[
        str,
        typer.Option(help="kinds (default), peers, split, ghosts, ring, sustained, consumers, archive, cost, fanout; "
                     "see the README's bench section."),
    ] = "kinds",
    rows: Annotated[
        Optional[str],
        typer.Option(help="ghosts: queue sizes to drain, comma-separated. Default: 30000,60000. cost: ready "
                     "backlogs to claim from. Default: 10000,1000000,10000000."),
    ] = None,
    batches: Annotated[
        Optional[str], typer.Option(help="ring: batch sizes to compare, comma-separated. Default: 1,10,100.")
    ] = None,
    sizes: Annotated[
        Optional[str],
        typer.Option(help="split, cost: payload sizes in bytes to compare, comma-separated. Default: "
                     "300,1024,4096,16384 (cost: and 65536)."),
    ] = None,
    soak: Annotated[
        float, typer.Option(help="ring: also run a soak of this many seconds per design, sampling sizes and HOT updates.")
    ] = 0.0,
    backlog: Annotated[
        Optional[int],
        typer.Option(help="Full cycle: producers pause above this many waiting messages (0: never). "
                     "Default: max(2000, 10 x consumers x batch)."),
    ] = None,
    minutes: Annotated[
        float,
        typer.Option(help="sustained: the measured window of each run, in minutes (the same for clean and held)."),
    ] = 1.5,
    hold: Annotated[
        str,
        typer.Option(help="sustained: what another session holds open during a run. none; snapshot: a REPEATABLE "
                     "READ snapshot (taken by reading an unrelated table); idle-in-transaction: a transaction "
                     "id, then idle; both: a clean run, then a snapshot run, kind by kind; all: a clean run, then one "
                     "with each hold."),
    ] = "both",
    rate: Annotated[
        Optional[float],
        typer.Option(help="sustained: messages/s the producers offer together, at a fixed pace. Default: half "
                     "the slowest kind's maximum, found by a short full-speed run of each kind first."),
    ] = None,
    interval: Annotated[float, typer.Option(help="sustained: seconds between two samples.")] = 5.0,
    bystander_rows: Annotated[
        int,
        typer.Option(help="sustained: rows of the unrelated table (made once, in schema queuectl_bystander) whose "
                     "range query is timed beside the queues."),
    ] = 1_000_000,
    upkeep: Annotated[
        bool,
        typer.Option("--upkeep/--no-upkeep",
                     help="sustained, and consumers' full cycles: run each kind's upkeep job beside its load, as "
                     "the scheduler does (the reliable queue's archive job, which rotates its generations; the "
                     "compact job of a ring and the one-table kinds). --no-upkeep measures the tables without it."),
    ] = True,
    consumer_counts: Annotated[
        Optional[str],
        typer.Option(help="consumers: consumer process counts of the curve, comma-separated; each count runs a "
                     "dequeue-only phase and a full cycle with --producers, read against 4 consumers in the same "
                     "repeat. archive: the counts at which the full cycle runs with the archive job beside and "
                     "without. Default: 1,2,4,8,16,32."),
    ] = None,
    plots: Annotated[
        Optional[Path],
        typer.Option(help="sustained, consumers, archive, cost: folder for the PNG plots (<scenario>-<kind>.png; cost: "
                     "cost-backlog.png and cost-payload.png). Default: beside the --json file (<its name>-<kind or "
                     "curve>.png); none without either. Needs matplotlib (pip install 'queuectl[bench]')."),
    ] = None,
    items: Annotated[
        int,
        typer.Option(help="cost: messages one consumer claims and acks at each backlog and payload size; fanout: "
                     "messages pushed per run, which every subscription (or copy) receives."),
    ] = 10_000,
    json_file: Annotated[
        Optional[Path], typer.Option("--json", help="Also write the result as JSON to this file ('-': stdout).")
    ] = None,
    no_pgbench: Annotated[
        bool, typer.Option("--no-pgbench", help="Skip the pgbench ceilings (they are then reported as not measured).")
    ] = False,
    url: UrlOption = None,
    schema: Annotated[str, typer.Option("--schema", help="Schema for the bench queues.")] = DEFAULT_SCHEMA,
) -> None:
    """Measure queues with real producer/consumer processes, beside the server's own ceilings.

    Each phase's messages/s is shown as a share of the same SQL driven by pgbench, with SELECT 1 and single-row commit ceilings measured in the same run. Bench queues are named bench_<kind> and are emptied between phases; do not point this at a busy server. An option the chosen scenario does not read (e.g. --sizes with --scenario ring) is a usage error, not silently ignored.

    --scenario sustained asks whether a queue keeps up over time when something holds the database's cleanup back (a long report, a forgotten open transaction): producers offer a steady rate, consumers take and acknowledge, and every few seconds it records how many messages were done, how many wait, how long each took from enqueue to ack, how many dead row versions the queue's tables carry and how big they are, how often autovacuum ran, whether producers were turned away, and how long an unrelated query on another table takes meanwhile, first with nothing held, then with the hold.

    --scenario consumers asks what more consumer processes cost: at each --consumer-counts it runs a dequeue-only phase (draining a filled queue) and a full cycle (--producers and that many consumers at once), and reads each point against 4 consumers in the same repeat. Idle consumers wait as `queuectl worker` does (asleep on the queue's channel, or polling with back-off), so the curve shows what many mostly idle workers cost. With --json or --plots it also draws the curve as a PNG.

    --scenario archive asks what archiving costs a queue at full speed: at each --consumer-counts the reliable queue's full cycle runs twice from an emptied queue, alone and with the archive job beside it (copying finished rows to history and rotating the generations, as the scheduler runs it), and reads the rate with the job against the rate without it in the same repeat. With --json or --plots it also draws the curve as a PNG.

    --scenario cost asks what a message costs as the work grows: one consumer's claim and ack at backlogs of ten thousand to ten million waiting messages, and the full cycle, the claim and the WAL written per message at payloads from 300 bytes to 64 KB.
    """  # noqa: E501 (one line per paragraph: --help wraps them itself)
    from queuectl.bench import BenchOptions, render, run_bench

    out = make_console() if sys.stdout.isatty() else make_console(width=200)  # tables stay readable in files
    kinds = [k.strip() for value in kind or ["reliable"] for k in value.split(",") if k.strip()]
    options = BenchOptions(
        kinds=kinds, producers=producers, consumers=consumers, batch=batch,
        payload_bytes=payload_bytes, seconds=seconds, repeat=repeat, scenario=scenario, url=url,
        schema=schema, pgbench=not no_pgbench, backlog=backlog, rows=_sizes(rows, "--rows"),
        batches=_sizes(batches, "--batches"), sizes=_sizes(sizes, "--sizes"), soak=soak,
        payload_content=payload_content, minutes=minutes, hold=hold, rate=rate, interval=interval,
        bystander_rows=bystander_rows, upkeep=upkeep, plots=_plots_prefix(plots, json_file, scenario), items=items,
        consumer_counts=_sizes(consumer_counts, "--consumer-counts"), given=_given(ctx),
    )
    result = run_bench(options, console=out, argv=["queuectl", *_masked(sys.argv[1:])])
    text = json.dumps(result, indent=2, default=str) + "\n"
    if json_file is not None and str(json_file) != "-":
        json_file.write_text(text)
    if (json_file is not None and str(json_file) == "-") or (json_file is None and not out.is_terminal):
        sys.stdout.write(text)
    else:
        render(result, out)


def _given(ctx: typer.Context) -> frozenset[str]:
    """The BenchOptions fields the user set on the command line (not left at their default).
    Sources are compared by name: typer carries its own copy of click's ParameterSource."""
    field = {"kind": "kinds", "no_pgbench": "pgbench"}
    return frozenset(field.get(name, name) for name in ctx.params
                     if getattr(ctx.get_parameter_source(name), "name", None) in ("COMMANDLINE", "ENVIRONMENT"))


def _plots_prefix(folder: Path | None, json_file: Path | None, scenario: str) -> str | None:
    """Where the sustained, consumers, archive and cost scenarios' PNGs go, as a prefix of <prefix>-<kind or
    curve>.png: in --plots, else beside the --json file and named after it; None when neither is given."""
    if folder is not None:
        return str(folder / scenario)
    if scenario in ("sustained", "consumers", "archive", "cost") and json_file is not None and str(json_file) != "-":
        return str(json_file.with_suffix(""))
    return None


def _sizes(text: str | None, option: str) -> list[int] | None:
    """'30000,60000' -> [30000, 60000]; a malformed list is a one-line usage error."""
    from queuectl.errors import UsageError

    if text is None:
        return None
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{option} takes whole numbers separated by commas, got {text!r}") from None
    if not sizes:
        raise UsageError(f"{option} needs at least one size")
    return sizes


def _masked(argv: list[str]) -> list[str]:
    """argv as recorded in the result: no password of any URL or connection string in it."""
    return [hide_secrets(arg) for arg in argv]
