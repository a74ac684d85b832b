"""Queue commands: install, uninstall, list, upgrade, enqueue, dequeue, and the demo."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer
from rich.text import Text

from queuectl.cli.options import Fitted, QueueArg, SchemaOption, UrlOption, fail, json_flag, make_table, out, print_error, print_fact
from queuectl.defaults import DEFAULT_MAX_PAYLOAD_BYTES, INSTALL_LOCK_WAIT_S
from queuectl.engine import make_engine
from queuectl.names import DEFAULT_SCHEMA, validate_queue_name, validate_schema_name

app = typer.Typer()

LockWaitOption = Annotated[float, typer.Option(
    "--lock-wait", min=0, help="Seconds to wait for another install, upgrade or uninstall of the schema to "
    "finish; then one line names the session holding the install lock.")]
TableJsonOption = json_flag("Print JSON instead of a table.")


@app.command()
def install(
    name: QueueArg,
    kind: Annotated[str, typer.Option(help="Queue kind: reliable, heap, fifo, stack, pending, watermark or ring.")] = "reliable",
    strict: Annotated[bool, typer.Option("--strict", help="fifo only: consumers wait for each other, so order holds across rollbacks.")] = False,
    size: Annotated[Optional[int], typer.Option(help="ring only: number of preallocated slots \\[default: 65536].", show_default=False)] = None,
    fanout: Annotated[bool, typer.Option("--fanout", help="ring only: every message goes to each of the ring's named subscriptions (queuectl subscribe), whose consumers compete, instead of to one consumer.")] = False,
    lag_limit: Annotated[Optional[int], typer.Option("--lag-limit", min=1, help="fan-out ring only: the subscriptions' default lag limit, messages a subscription may fall behind before it is marked behind \\[default: half the ring].", show_default=False)] = None,
    drop_when_behind: Annotated[bool, typer.Option("--drop-when-behind", help="fan-out ring only: by default, let a push drop a subscription past its lag limit instead of waiting for it.")] = False,
    slot_bytes: Annotated[Optional[int], typer.Option(
        help="ring only: largest message (payload + headers) kept in its slot's row; a larger one goes to the "
        "ring's side table <name>_ring_large and the slot keeps a pointer (0: every message does). Above about "
        "1,800 bytes PostgreSQL TOASTs the slot rows \\[default: 1800].", show_default=False)] = None,
    sql: Annotated[bool, typer.Option("--sql", help="Print the exact SQL script for review; change nothing.")] = False,
    max_attempts: Annotated[int, typer.Option(help="Attempts before an item goes DEAD.")] = 5,
    lease: Annotated[int, typer.Option(help="Default lease in seconds.")] = 30,
    backoff_base: Annotated[int, typer.Option(help="First retry delay in seconds (doubles per attempt).")] = 1,
    backoff_max: Annotated[int, typer.Option(help="Longest retry delay in seconds.")] = 3600,
    max_payload_bytes: Annotated[int, typer.Option(help="Largest payload enqueue accepts, in bytes (larger ones are refused, nothing is stored); reliable and ring.")] = DEFAULT_MAX_PAYLOAD_BYTES,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
    lock_wait: LockWaitOption = INSTALL_LOCK_WAIT_S,
) -> None:
    """Install a queue (tables, indexes and its SQL API) through Alembic migrations."""
    validate_queue_name(name)  # names first: a refused name loads no library
    validate_schema_name(schema)
    from queuectl.catalog import QueueSettings
    from queuectl.install import database_report, install_queue, review_script
    from queuectl.kindspec import settings_for

    settings = settings_for(kind, strict=strict, size=size, fanout=fanout, lag_limit=lag_limit,
                            drop_when_behind=drop_when_behind, slot_bytes=slot_bytes, reliable=QueueSettings(
        max_attempts=max_attempts, lease_seconds=lease, backoff_base_seconds=backoff_base, backoff_max_seconds=backoff_max,
        max_payload_bytes=max_payload_bytes,
    ))
    if sql:
        script, note = review_script(url, name, kind, settings, schema)
        sys.stdout.write(script)
        if note:
            print_error(note, prefix="note")
        return
    engine = make_engine(url)
    info = install_queue(engine, name, kind, settings, schema, lock_wait=lock_wait)
    out.print(Text.assemble("installed queue ", (info.name, "bold"),
                            f" (kind {info.kind}, version {info.schema_version}) in schema {schema}"))
    report = database_report(engine)
    if report:
        print_fact(f"note: {report}")


@app.command()
def uninstall(
    name: Annotated[Optional[str], typer.Argument(help="Queue to remove (omit with --all).")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: the queue's items and history are deleted.")] = False,
    all_: Annotated[bool, typer.Option("--all", help="Remove every queue, the catalog and the schema.")] = False,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
    lock_wait: LockWaitOption = INSTALL_LOCK_WAIT_S,
) -> None:
    """Remove a queue and all its items (downgrade its migrations to base)."""
    if all_ == (name is not None):
        fail("give a queue name, or --all (not both)")
    if name is not None:
        validate_queue_name(name)
    validate_schema_name(schema)
    if not yes:
        fail("uninstall deletes the queue's items and history: add --yes to confirm")
    from queuectl.install import remove_everything, uninstall_queue

    engine = make_engine(url)
    if all_:
        removed = remove_everything(engine, schema, lock_wait)
        print_fact(f"removed {len(removed)} queue(s) {', '.join(removed)}; catalog and schema {schema} dropped")
        return
    info = uninstall_queue(engine, name, schema, lock_wait)
    out.print(Text.assemble("uninstalled queue ", (info.name, "bold"), f" (kind {info.kind})"))


@app.command("list")
def list_(
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
    as_json: TableJsonOption = False,
) -> None:
    """List installed queues with their kind, version and item counts."""
    validate_schema_name(schema)
    from queuectl.stats import queue_overview

    rows = queue_overview(make_engine(url), schema)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2, default=str) + "\n")
        return
    if not rows:
        out.print(f"no queues installed in schema {schema} (try `queuectl install orders`)")
        return
    table = make_table(("queue", "kind", "version", "ready", "scheduled", "processing", "done", "dead"), right=range(3, 8))
    for row in rows:
        c = row["counts"]
        table.add_row(
            row["name"], row["kind"], row["schema_version"],
            *(f"{c[k]:,}" for k in ("ready", "scheduled", "processing", "done", "dead")),
        )
    out.print(Fitted(table))


@app.command()
def upgrade(
    name: Annotated[Optional[str], typer.Argument(help="Queue to upgrade; all queues when omitted.")] = None,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
    lock_wait: LockWaitOption = INSTALL_LOCK_WAIT_S,
) -> None:
    """Upgrade the catalog and one queue (or all, one at a time) to the newest schema version."""
    if name is not None:
        validate_queue_name(name)
    validate_schema_name(schema)
    from queuectl.install import upgrade_all, upgrade_queue

    engine = make_engine(url)
    if name is None:
        results = upgrade_all(engine, schema, lock_wait)
    else:
        results = [(name, *upgrade_queue(engine, name, schema, lock_wait))]
    for queue, before, after in results:
        state = "already current" if before == after else f"{before} -> {after}"
        out.print(f"{queue}: {state}")
    if not results:
        out.print("catalog upgraded; no queues installed")


@app.command()
def enqueue(
    name: QueueArg,
    payload: Annotated[str, typer.Argument(help="Payload text (stored as UTF-8 bytes). Use - to read stdin.")],
    priority: Annotated[int, typer.Option(help="Lower numbers are dequeued first.")] = 0,
    delay: Annotated[float, typer.Option(help="Seconds before the item becomes due.")] = 0.0,
    title: Annotated[Optional[str], typer.Option(help="Short label shown in listings.")] = None,
    headers: Annotated[Optional[str], typer.Option(help='JSON object of headers, e.g. \'{"k": "v"}\'.')] = None,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Add one item to a queue and print its id."""
    validate_queue_name(name)
    validate_schema_name(schema)
    from queuectl.client import open_queue

    parsed_headers = None
    if headers is not None:
        try:
            parsed_headers = json.loads(headers)
        except json.JSONDecodeError as exc:
            fail(f"--headers is not valid JSON: {exc.msg} at position {exc.pos}")
        if not isinstance(parsed_headers, dict):
            fail("--headers must be a JSON object")
    body: bytes | str = sys.stdin.buffer.read() if payload == "-" else payload
    with open_queue(make_engine(url), name, schema=schema) as queue:
        item_id = queue.enqueue(body, headers=parsed_headers, priority=priority, delay=delay, title=title)
    out.print(item_id)


@app.command()
def dequeue(
    name: QueueArg,
    batch: Annotated[int, typer.Option(help="How many items to claim at most.")] = 1,
    lease: Annotated[Optional[float], typer.Option(help="Lease in seconds (default: the queue's).")] = None,
    ack: Annotated[bool, typer.Option("--ack", help="Acknowledge the items at once (done).")] = False,
    subscription: Annotated[Optional[str], typer.Option(
        "--subscription", help="Take from this subscription of a fan-out ring (`queuectl subscriptions NAME`).",
        show_default=False)] = None,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Claim due items and print them as JSON lines; with --ack mark them done.

    Queues of the other kinds (heap, fifo, stack, pending, watermark, ring) hand items out destructively: they are printed and gone, and --lease / --ack do not apply.

    A fan-out ring (installed with --fanout) is read through one of its subscriptions: --subscription NAME claims its next messages for --lease seconds (then another consumer of the subscription may take them again), or acknowledges them at once with --ack.
    """  # noqa: E501 (one line per paragraph: --help wraps them itself)
    validate_queue_name(name)
    validate_schema_name(schema)
    from queuectl.client import open_queue
    from queuectl.records import dequeue_records

    with open_queue(make_engine(url), name, schema=schema) as queue:
        records = dequeue_records(queue, batch, lease=lease, ack=ack, subscription=subscription)
    sys.stdout.writelines(json.dumps(record) + "\n" for record in records)


@app.command()
def demo(
    seconds: Annotated[float, typer.Option(help="How long producers and consumers run.")] = 20.0,
    producers: Annotated[int, typer.Option(help="Producer processes.")] = 2,
    consumers: Annotated[int, typer.Option(help="Consumer processes.")] = 2,
    batch: Annotated[int, typer.Option(help="Consumer batch size.")] = 50,
    rate: Annotated[float, typer.Option(help="Target enqueue rate, items/s over all producers (0: unlimited).")] = 2000.0,
    queue: Annotated[str, typer.Option(help="Queue the demo installs for its run and uninstalls after (it must not exist).")] = "queuectl_demo",
    keep: Annotated[bool, typer.Option("--keep", help="Keep the queue and its items afterwards (e.g. for `queuectl archive` and the pipeline).")] = False,
    url: UrlOption = None,
) -> None:
    """Install a queue of the demo's own, run producers and consumers with a live view, print a summary, remove the queue."""
    from queuectl.demo import run_demo

    validate_queue_name(queue)
    summary = run_demo(
        url, queue=queue, seconds=seconds, producers=producers, consumers=consumers, batch=batch, rate=rate, keep=keep,
        console=out,
    )
    if summary.completed == 0:
        fail("the demo completed no items", code=1)
