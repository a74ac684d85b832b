"""`queuectl grant`: least-privilege roles for a queue's producers and consumers."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer

from queuectl.cli.options import JsonOption, QueueArg, SchemaOption, UrlOption, print_fact
from queuectl.names import DEFAULT_SCHEMA, validate_queue_name, validate_schema_name

app = typer.Typer()


@app.command()
def grant(
    name: QueueArg,
    producer: Annotated[
        Optional[str], typer.Option("--producer", help="Role that may enqueue (EXECUTE on the enqueue functions only).")
    ] = None,
    consumer: Annotated[
        Optional[str],
        typer.Option("--consumer", help="Role that may dequeue (and ack/nack/extend/release on a reliable queue)."),
    ] = None,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
    as_json: JsonOption = False,
) -> None:
    """Let existing roles call the queue's SQL API, with no access to its tables.

    The roles may execute the queue's functions (PostgreSQL) or procedures (SQL Server: parse- and reference-checked, not run live) and read the catalog's registry; they cannot select from, change or delete the queue's tables.

    On PostgreSQL the queue's functions become SECURITY DEFINER (they run as the role that installed the queue) with a fixed search_path, and EXECUTE is revoked from PUBLIC. Run it again after `queuectl upgrade`.
    """  # noqa: E501 (one line per paragraph: --help wraps them itself)
    validate_queue_name(name)
    validate_schema_name(schema)
    from queuectl.engine import make_engine
    from queuectl.grants import grant_queue

    granted = grant_queue(make_engine(url), name, producer, consumer, schema)
    if as_json or not sys.stdout.isatty():
        sys.stdout.write(json.dumps(granted) + "\n")
        return
    for role, functions in granted.items():
        print_fact(f"{role}: may execute {', '.join(functions)} (no table access)")
