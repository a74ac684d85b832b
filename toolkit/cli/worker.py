"""`queuectl worker`: run a handler on a queue's items as they arrive (queuectl.worker)."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict
from typing import Annotated, Optional

import typer

from queuectl.cli.options import DataFormatter, QueueArg, SchemaOption, UrlOption, json_flag, out
from queuectl.defaults import DEFAULT_LOG_INTERVAL, DEFAULT_POLL_INTERVAL, RETRY_TOTAL_S
from queuectl.engine import make_engine
from queuectl.errors import UsageError
from queuectl.names import DEFAULT_SCHEMA, validate_queue_name, validate_schema_name

app = typer.Typer()
CountsJsonOption = json_flag("Print the final counts as JSON.")


@app.command()
def worker(
    name: QueueArg,
    handler: Annotated[
        str, typer.Option("--handler", help="module:function called with each item (a queuectl.Message).", show_default=False)
    ],
    concurrency: Annotated[int, typer.Option(help="Items handled at once (threads, or processes with --processes).")] = 1,
    batch: Annotated[int, typer.Option(help="Most items claimed per dequeue.")] = 10,
    lease: Annotated[
        Optional[float], typer.Option(help="Lease in seconds (default: the queue's); renewed every third of it.")
    ] = None,
    poll_interval: Annotated[
        float, typer.Option(help="Longest wait between looks at an idle queue (fallback when a notification is lost).")
    ] = DEFAULT_POLL_INTERVAL,
    notify: Annotated[
        bool, typer.Option("--notify/--no-notify", help="Wake on the queue's notifications (LISTEN), or only poll.")
    ] = True,
    processes: Annotated[
        bool, typer.Option("--processes", help="Run the handler in worker processes (for CPU-bound handlers).")
    ] = False,
    burst: Annotated[bool, typer.Option("--burst", help="Exit once the queue has no due item and nothing is held.")] = False,
    log_interval: Annotated[float, typer.Option(help="Seconds between throughput log lines.")] = DEFAULT_LOG_INTERVAL,
    reconnect_for: Annotated[
        float, typer.Option("--reconnect-for", help="After a lost connection, keep reconnecting (jittered back-off) this many seconds, then exit with one error line.")
    ] = RETRY_TOTAL_S,
    as_json: CountsJsonOption = False,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Run HANDLER on every item of queue NAME as it arrives, until SIGTERM or Ctrl-C.

    Success acks the item; an exception (SystemExit too) nacks it with its error (retried after the queue's backoff, DEAD after max attempts). Slow handlers keep their items through lease heartbeats. With --processes a handler that kills its process fails only the item it was running.

    An ack or nack the database keeps refusing is logged with the item ids and the cause, sent again up to 3 times, then replaced by a nack with a fixed reason, then a release; failing those, the item is left to its lease ("unsettled" in the final counts).

    On SIGTERM/SIGINT the worker stops claiming, gives back items it has not started and finishes the running ones; a second signal stops waiting for them. Progress goes to stderr, the final counts to stdout.
    """  # noqa: E501  (one line per paragraph: the help renders lines as written)
    validate_queue_name(name)
    validate_schema_name(schema)
    from queuectl.client import Queue
    from queuectl.worker import resolve_handler

    function = resolve_handler(handler)
    _log_to_stderr()
    if not 0 <= reconnect_for <= 86400:
        raise UsageError(f"--reconnect-for must be from 0 to 86400 seconds, got {reconnect_for:g}")
    with Queue(make_engine(url), name, schema=schema) as queue:
        queue.retry_total = reconnect_for
        stats = queue.consume(
            function, concurrency=concurrency, batch=batch, lease=lease, poll_interval=poll_interval,
            notify=notify, processes=processes, burst=burst, log_interval=log_interval,
        )
    counts = {k: v for k, v in asdict(stats).items() if k != "started"} | {"seconds": round(stats.seconds, 3)}
    if as_json or not sys.stdout.isatty():
        sys.stdout.write(json.dumps(counts) + "\n")
    else:
        out.print(", ".join(f"{k} {v}" for k, v in counts.items()))


def _log_to_stderr() -> None:
    """The worker's progress lines go to stderr (stdout keeps the final counts)."""
    logger = logging.getLogger("queuectl")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(DataFormatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
