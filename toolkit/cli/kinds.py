"""Commands of the queue kinds other than reliable: `queuectl correct-watermark` and
`queuectl repair-ring`, and the records `queuectl dequeue` prints for their items."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Annotated, Any

import typer

from queuectl.cli.options import JobQueueArg as QueueArg, SchemaOption, UrlOption
from queuectl.engine import make_engine
from queuectl.errors import UsageError
from queuectl.names import DEFAULT_SCHEMA, validate_queue_name

app = typer.Typer()


def dequeue_records(queue: Any, batch: int, lease: float | None, ack: bool) -> list[dict[str, Any]]:
    """Take up to `batch` items from a destructive queue (or ring) as JSON-ready records."""
    if lease is not None:
        raise UsageError(f"{queue.kind} queues have no leases: items are removed when dequeued")
    if ack:
        raise UsageError(f"{queue.kind} queues need no --ack: items are removed when dequeued")
    records = []
    for item in queue.dequeue(batch):
        try:
            text: str | None = item.payload.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        records.append(
            {
                "id": item.id,
                "payload": text if text is not None else item.payload.hex(),
                "encoding": "utf-8" if text is not None else "hex",
                "headers": item.headers,
                "enqueued_at": item.enqueued_at.isoformat() if item.enqueued_at else None,
                "dequeued_at": item.dequeued_at.isoformat(),
                "due_at": item.due_at.isoformat() if item.due_at else None,
                "status": "removed",
            }
        )
    return records


@app.command("correct-watermark")
def correct_watermark_command(name: QueueArg, url: UrlOption = None, schema: SchemaOption = DEFAULT_SCHEMA) -> None:
    """Recompute a watermark queue's true low bound and fix its stored watermark (the 5-minute job)."""
    from queuectl.kinds import correct_watermark

    validate_queue_name(name)
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
    from queuectl.kinds import repair_ring

    validate_queue_name(name)
    result = repair_ring(make_engine(url), name, schema=schema, grace=grace)
    sys.stdout.write(json.dumps(asdict(result)) + "\n")

