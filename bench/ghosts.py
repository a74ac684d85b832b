"""`queuectl bench --scenario ghosts`: ghost rows under an open snapshot, plain FIFO
against the watermark queue.

For each kind (fifo, watermark), size (--rows) and mode, one consumer drains a freshly
filled queue one item per dequeue call, through the Python client, and the wall time is
taken. Mode "snapshot" first opens a REPEATABLE READ transaction in another session and
reads the queue's table (so its snapshot is really taken); it stays open during the drain,
so no row deleted by the drain can be cleaned up or marked dead in the index. Mode "none"
holds nothing. Runs are interleaved (repeat, size, kind, mode) and each is repeated.

Expected shape: fifo's dequeue walks every ghost left since the snapshot, so under the
snapshot a drain is quadratic; the watermark dequeue starts at its low watermark and
walks at most the ghosts of the last ~100 dequeues, so it stays close to its own
no-snapshot time.
"""
from __future__ import annotations

import os
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from queuectl.bench.core import BenchRun, ratio, scenario, stat
from queuectl.bench.drivers import enqueue_in_chunks
from queuectl.bench.pgbench import PgbenchUnavailable
from queuectl.engine.urls import parse_url
from queuectl.install import install_queue, uninstall_queue
from queuectl.registry import get_queue
from queuectl.client import open_queue
from queuectl.kindspec import kind_template_values, settings_for
from queuectl.names import QueueNames
from queuectl.sqlfiles import render

SCHEMA = "ghostbench"
KINDS = ("fifo", "watermark")
PAYLOAD = b"x" * 64


def _sql(names: QueueNames, kind: str, section: str) -> sa.TextClause:
    values = {**names.template_values(), **kind_template_values(names, kind)}
    return sa.text(render("postgresql", "bench", section, values))


def fresh_queue(engine: Engine, kind: str, rows: int, schema: str = SCHEMA) -> QueueNames:
    """(Re)install the bench queue of this kind, fill it with `rows` items, vacuum it."""
    names = QueueNames(f"ghost_{kind}", schema)
    with engine.connect() as conn:
        installed = get_queue(conn, names.queue, schema) is not None
    if installed:
        uninstall_queue(engine, names.queue, schema)
    install_queue(engine, names.queue, kind, settings_for(kind), schema)
    with open_queue(engine, names.queue, schema=schema) as queue:
        enqueue_in_chunks(queue, PAYLOAD, rows)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(_sql(names, kind, "vacuum_items"))
    return names


def settled_blocks(engine: Engine, names: QueueNames, kind: str, deadline_s: float = 10.0) -> int:
    """The table's buffer-access counter once the backends that did the work have flushed it."""
    stmt = _sql(names, kind, "table_blocks")
    deadline = time.monotonic() + deadline_s
    last = None
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        while True:
            value = conn.execute(stmt).scalar_one()
            if value == last or time.monotonic() > deadline:
                return value
            last = value
            time.sleep(0.6)  # backends flush their counters at most once a second while busy


def backend_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a local server process (root or the server's user can read it)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drain(
    engine: Engine, kind: str, rows: int, snapshot: bool, schema: str = SCHEMA
) -> tuple[float, float, float | None]:
    """Seconds to drain `rows` items one dequeue call at a time, blocks touched per call,
    and the CPU seconds the consumer and its backend used (robust to other load on the host)."""
    names = fresh_queue(engine, kind, rows, schema)
    before = settled_blocks(engine, names, kind)
    holder = None
    if snapshot:
        holder = engine.connect().execution_options(isolation_level="REPEATABLE READ")
        holder.begin()
        holder.execute(_sql(names, kind, "touch_items")).scalar_one()
    try:
        with open_queue(engine, names.queue, schema=schema) as queue:
            server_before = backend_cpu_seconds(queue.backend_pid)
            taken = 0
            client_before = time.process_time()
            started = time.perf_counter()
            while taken < rows:
                got = queue.dequeue(1)
                if not got:
                    raise RuntimeError(f"{kind}: queue ran dry after {taken} of {rows} items")
                taken += len(got)
            seconds = time.perf_counter() - started
            server_after = backend_cpu_seconds(queue.backend_pid)
            cpu = None
            if server_before is not None and server_after is not None:
                cpu = time.process_time() - client_before + server_after - server_before
    finally:
        if holder is not None:
            holder.rollback()
            holder.close()
    return seconds, (settled_blocks(engine, names, kind) - before) / rows, cpu


def ghosts_engine(url: str, synchronous_commit: str = "off") -> Engine:
    """An engine whose sessions commit without waiting for the WAL flush (by default): one
    consumer's drain is otherwise a WAL-flush benchmark, and the ghosts are what is measured."""
    return sa.create_engine(parse_url(url), connect_args={"options": f"-c synchronous_commit={synchronous_commit}"})


# -- `queuectl bench --scenario ghosts` ----------------------------------------------------

NAIVE, WATERMARK = KINDS
WATERMARK_HELD_WITHIN = 1.3  # watermark under the snapshot vs its own no-snapshot time
NAIVE_OVER_WATERMARK = 5.0  # at the largest size, naive under the snapshot vs watermark under it
LABEL = {NAIVE: "naive fifo", WATERMARK: "watermark"}


@scenario("ghosts", "one consumer drains --rows items: naive fifo vs watermark, with and without a held snapshot",
          ("rows",))
def ghosts_scenario(run: BenchRun) -> dict[str, Any]:
    """Interleaved drains as a bench result: per kind, size and mode the drain
    rate (items/s, one item per dequeue call) beside the SELECT 1 round-trip ceiling at one
    client (what one consumer making one call per item is bounded by), buffers per dequeue
    (the load-independent evidence), CPU seconds, and the ratios taken within each repeat."""
    o = run.options
    sizes = list(o.rows)
    engine = ghosts_engine(run.url)
    unavailable: list[dict[str, str]] = []
    select1: list[float | None] = []
    m: dict[tuple[str, int, bool], dict[str, list[Any]]] = {
        (k, n, snap): {"seconds": [], "blocks": [], "cpu": []} for k in KINDS for n in sizes for snap in (False, True)
    }
    try:
        with run.reporter.scenario("ghosts", o.repeat * (1 + len(m))) as rep:
            for r in range(o.repeat):
                rep.step(f"repeat {r + 1}: SELECT 1 ceiling, 1 client")
                try:
                    select1.append(run.ceiling("select1", 1))
                except PgbenchUnavailable as exc:
                    select1.append(None)
                    if not unavailable:
                        unavailable.append({"subject": "SELECT 1 ceiling", "reason": str(exc)})
                rep.done()
                for rows in sizes:
                    for kind in KINDS:
                        for snapshot in (False, True):
                            rep.step(f"repeat {r + 1}: {kind}, {rows:,} rows, snapshot {'held' if snapshot else 'none'}")
                            seconds, blocks, cpu = drain(engine, kind, rows, snapshot, run.schema)
                            cell = m[(kind, rows, snapshot)]
                            cell["seconds"].append(seconds)
                            cell["blocks"].append(blocks)
                            cell["cpu"].append(cpu)
                            rep.done()
        for kind in KINDS:
            uninstall_queue(engine, f"ghost_{kind}", run.schema)
    finally:
        engine.dispose()
    rows_out = []
    for rows in sizes:
        for kind in KINDS:
            for snapshot in (False, True):
                cell = m[(kind, rows, snapshot)]
                rates = [rows / s for s in cell["seconds"]]
                metrics = {
                    "seconds": stat(cell["seconds"]),
                    "buffers_per_dequeue": stat(cell["blocks"]),
                    "cpu_seconds": stat(cell["cpu"]),
                }
                if snapshot:
                    metrics["snapshot_over_none"] = stat(
                        [ratio(a, b) for a, b in zip(cell["seconds"], m[(kind, rows, False)]["seconds"])]
                    )
                    if kind == NAIVE:
                        metrics["naive_over_watermark"] = stat(
                            [ratio(a, b) for a, b in zip(cell["seconds"], m[(WATERMARK, rows, True)]["seconds"])]
                        )
                rows_out.append({
                    "subject": f"{LABEL[kind]}, {rows:,} rows",
                    "phase": "drain, snapshot held" if snapshot else "drain, no snapshot",
                    "params": {"kind": kind, "batch": 1, "producers": 0, "consumers": 1,
                               "payload_bytes": len(PAYLOAD), "rows": rows, "snapshot": snapshot},
                    "rate": stat(rates),
                    "ceiling": {"name": "SELECT 1 round trips via pgbench (1 client)", "rate": stat(select1)},
                    "fraction_of_ceiling": stat([ratio(a, b) for a, b in zip(rates, select1)]),
                    "latency_ms": None,
                    "metrics": metrics,
                })
    targets = []
    for rows in sizes:
        value = stat([ratio(a, b) for a, b in zip(m[(WATERMARK, rows, True)]["seconds"],
                                                   m[(WATERMARK, rows, False)]["seconds"])])["median"]
        targets.append({"name": f"watermark at {rows:,} rows: time with the snapshot held / without",
                        "value": value, "threshold": WATERMARK_HELD_WITHIN, "comparison": "<=",
                        "met": None if value is None else value <= WATERMARK_HELD_WITHIN})
    largest = max(sizes)
    value = stat([ratio(a, b) for a, b in zip(m[(NAIVE, largest, True)]["seconds"],
                                               m[(WATERMARK, largest, True)]["seconds"])])["median"]
    targets.append({"name": f"at {largest:,} rows under the snapshot: naive time / watermark time",
                    "value": value, "threshold": NAIVE_OVER_WATERMARK,
                    "met": None if value is None else value >= NAIVE_OVER_WATERMARK})
    return {
        "name": "ghosts",
        "description": "one consumer drains a filled queue one item per dequeue call: naive fifo vs watermark, "
                       "without and with a REPEATABLE READ snapshot held open in another session",
        "notes": [
            "each drain: fresh queue of --rows 64-byte items, VACUUM (ANALYZE), then one consumer calls dequeue(1) "
            "until empty; runs are interleaved (repeat, size, kind, mode); ratios are taken within each repeat",
            "snapshot held: another session opens REPEATABLE READ and reads the queue's table before the drain and "
            "keeps the transaction open until it ends, so nothing the drain deletes can be cleaned up",
            "buffers per dequeue: heap + index buffer accesses on the queue's table (pg_statio_user_tables) per "
            "item; unlike seconds, the load of other programs on the host does not move it",
            "CPU s: the consumer process plus its server backend (from /proc; '-' when not readable)",
            "the bench's sessions run with synchronous_commit=off: one consumer's drain would otherwise measure "
            "WAL flushes, not ghosts",
        ],
        "display_metrics": [["s", "seconds"], ["buf/deq", "buffers_per_dequeue"], ["CPU s", "cpu_seconds"],
                            ["snap/none", "snapshot_over_none"], ["naive/wm", "naive_over_watermark"]],
        "ceilings": [{"name": "SELECT 1 round trips", "clients": 1, "unit": "statements/s", "rate": stat(select1)}],
        "rows": rows_out,
        "targets": targets,
        "unavailable": unavailable,
    }
