"""Maintenance commands of two queue kinds: `queuectl correct-watermark` and `queuectl repair-ring`."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Annotated

import typer

from queuectl.cli.options import JobQueueArg as QueueArg, SchemaOption, UrlOption
from queuectl.engine import make_engine
from queuectl.names import DEFAULT_SCHEMA, validate_queue_name

app = typer.Typer()


@app.command("correct-watermark")
def correct_watermark_command(name: QueueArg, url: UrlOption = None, schema: SchemaOption = DEFAULT_SCHEMA) -> None:
    """Recompute a watermark queue's true low bound and fix its stored watermark (the 5-minute job)."""
    validate_queue_name(name)
    from queuectl.client import correct_watermark

    result = correct_watermark(make_engine(url), name, schema=schema)
    sys.stdout.write(json.dumps(asdict(result)) + "\n")


@app.command("repair-ring")
def repair_ring_command(
    name: QueueArg,
    grace: Annotated[float, typer.Option(help="Seconds a slot must sit unchanged before it is repaired.")] = 30.0,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Run a ring queue's recovery path: tombstone dead pushers' positions, re-push dead poppers' messages."""
    validate_queue_name(name)
    from queuectl.client import repair_ring

    result = repair_ring(make_engine(url), name, schema=schema, grace=grace)
    sys.stdout.write(json.dumps(asdict(result)) + "\n")

