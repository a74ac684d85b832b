"""Ghost rows under an open snapshot: plain FIFO against the watermark queue.

    python -m queuectl.bench.ghosts [--url URL] [--sizes 30000,60000] [--repeats 3]

For each kind (fifo, watermark), size and mode, one consumer drains a freshly filled
queue one item per dequeue call, through the Python client, and the wall time is taken.
Mode "snapshot" first opens a REPEATABLE READ transaction in another session and reads
the queue's table (so its snapshot is really taken); it stays open during the drain, so
no row deleted by the drain can be cleaned up or marked dead in the index. Mode "none"
holds nothing. Runs are interleaved (repeat, size, kind, mode) and each is repeated;
the table shows medians and the ratios snapshot/none per kind and size, and 60k/30k.

Expected shape: fifo's dequeue walks every ghost left since the snapshot, so under the
snapshot a drain is quadratic; the watermark dequeue starts at its low watermark and
walks at most the ghosts of the last ~100 dequeues, so it stays close to its own
no-snapshot time. Queues live in their own schema (`ghostbench`) and are removed after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import Engine

from queuectl.engine import check_connection, mask_url, parse_url, resolve_url
from queuectl.install import get_queue, install_queue, uninstall_queue
from queuectl.kinds import open_queue
from queuectl.kindspec import kind_template_values, settings_for
from queuectl.names import QueueNames
from queuectl.sqlfiles import render

SCHEMA = "ghostbench"
KINDS = ("fifo", "watermark")
FILL_BATCH = 1000
PAYLOAD = b"x" * 64


@dataclass(frozen=True)
class Run:
    kind: str
    rows: int
    snapshot: bool
    seconds: float
    blocks_per_dequeue: float
    cpu_seconds: float | None  # client process + its server backend; None when /proc is not readable


def _sql(names: QueueNames, kind: str, section: str) -> sa.TextClause:
    values = {**names.template_values(), **kind_template_values(names, kind)}
    return sa.text(render("postgresql", "bench", section, values))


def fresh_queue(engine: Engine, kind: str, rows: int) -> QueueNames:
    """(Re)install the bench queue of this kind, fill it with `rows` items, vacuum it."""
    names = QueueNames(f"ghost_{kind}", SCHEMA)
    with engine.connect() as conn:
        installed = get_queue(conn, names.queue, SCHEMA) is not None
    if installed:
        uninstall_queue(engine, names.queue, SCHEMA)
    install_queue(engine, names.queue, kind, settings_for(kind), SCHEMA)
    with open_queue(engine, names.queue, schema=SCHEMA) as queue:
        for start in range(0, rows, FILL_BATCH):
            queue.enqueue_many([PAYLOAD] * min(FILL_BATCH, rows - start))
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


def drain(engine: Engine, kind: str, rows: int, snapshot: bool) -> tuple[float, float, float | None]:
    """Seconds to drain `rows` items one dequeue call at a time, blocks touched per call,
    and the CPU seconds the consumer and its backend used (robust to other load on the host)."""
    names = fresh_queue(engine, kind, rows)
    before = settled_blocks(engine, names, kind)
    holder = None
    if snapshot:
        holder = engine.connect().execution_options(isolation_level="REPEATABLE READ")
        holder.begin()
        holder.execute(_sql(names, kind, "touch_items")).scalar_one()
    try:
        with open_queue(engine, names.queue, schema=SCHEMA) as queue:
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


def run(engine: Engine, sizes: list[int], repeats: int, kinds: tuple[str, ...], console: Console) -> list[Run]:
    runs: list[Run] = []
    for rep in range(1, repeats + 1):
        for rows in sizes:
            for kind in kinds:
                for snapshot in (False, True):
                    seconds, blocks, cpu = drain(engine, kind, rows, snapshot)
                    runs.append(Run(kind, rows, snapshot, seconds, blocks, cpu))
                    mode = "snapshot" if snapshot else "none"
                    console.print(
                        f"repeat {rep}: {kind:9} {rows:>7,} rows  snapshot={mode:8} {seconds:8.2f} s  "
                        f"cpu {cpu if cpu is None else round(cpu, 2)} s  {blocks:8.1f} blocks/dequeue"
                    )
    for kind in kinds:
        uninstall_queue(engine, f"ghost_{kind}", SCHEMA)
    return runs


def summarize(runs: list[Run]) -> dict:
    times: dict[tuple[str, int, bool], list[float]] = defaultdict(list)
    blocks: dict[tuple[str, int, bool], list[float]] = defaultdict(list)
    cpus: dict[tuple[str, int, bool], list[float]] = defaultdict(list)
    for r in runs:
        if r.cpu_seconds is not None:
            cpus[(r.kind, r.rows, r.snapshot)].append(r.cpu_seconds)
        times[(r.kind, r.rows, r.snapshot)].append(r.seconds)
        blocks[(r.kind, r.rows, r.snapshot)].append(r.blocks_per_dequeue)
    medians = {key: statistics.median(values) for key, values in times.items()}
    rows_out = []
    for kind, rows in sorted({(k, n) for k, n, _ in medians}):
        none, snap = medians[(kind, rows, False)], medians[(kind, rows, True)]
        rows_out.append(
            {"kind": kind, "rows": rows, "none_s": none, "snapshot_s": snap, "snapshot_over_none": snap / none,
             "runs_none": times[(kind, rows, False)], "runs_snapshot": times[(kind, rows, True)],
             "blocks_per_dequeue_none": statistics.median(blocks[(kind, rows, False)]),
             "blocks_per_dequeue_snapshot": statistics.median(blocks[(kind, rows, True)]),
             "cpu_none_s": statistics.median(cpus[(kind, rows, False)]) if cpus[(kind, rows, False)] else None,
             "cpu_snapshot_s": statistics.median(cpus[(kind, rows, True)]) if cpus[(kind, rows, True)] else None}
        )
    return {"results": rows_out}


def render_table(summary: dict, console: Console) -> None:
    table = Table(
        "kind", "rows", "median, no snapshot (s)", "median, snapshot held (s)", "snapshot / none",
        "blocks/dequeue, none", "blocks/dequeue, snapshot", "CPU s, none", "CPU s, snapshot", "CPU snapshot / none",
    )
    for r in summary["results"]:
        cpu_none, cpu_snap = r["cpu_none_s"], r["cpu_snapshot_s"]
        table.add_row(
            r["kind"], f"{r['rows']:,}", f"{r['none_s']:.2f}", f"{r['snapshot_s']:.2f}", f"{r['snapshot_over_none']:.2f}x",
            f"{r['blocks_per_dequeue_none']:.1f}", f"{r['blocks_per_dequeue_snapshot']:.1f}",
            "-" if cpu_none is None else f"{cpu_none:.2f}", "-" if cpu_snap is None else f"{cpu_snap:.2f}",
            "-" if not (cpu_none and cpu_snap) else f"{cpu_snap / cpu_none:.2f}x",
        )
    console.print(table)
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for r in summary["results"]:
        by_kind[r["kind"]].append(r)
    for kind, rs in by_kind.items():
        if len(rs) >= 2:
            small, large = rs[0], rs[-1]
            console.print(
                f"{kind}: {large['rows']:,} vs {small['rows']:,} rows: x{large['none_s'] / small['none_s']:.2f} without a "
                f"snapshot, x{large['snapshot_s'] / small['snapshot_s']:.2f} with one held"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m queuectl.bench.ghosts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="database URL (default: $QUEUECTL_URL, else the embedded server)")
    parser.add_argument("--sizes", default="30000,60000", help="rows to drain, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--json", dest="json_path", help="also write the runs and medians here")
    parser.add_argument(
        "--synchronous-commit", default="off", choices=("on", "off"),
        help="for the bench's sessions (default off: a WAL flush per dequeue would otherwise dominate the timings)",
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = tuple(k for k in args.kinds.split(",") if k)
    console = Console()
    engine = sa.create_engine(
        parse_url(resolve_url(args.url)), connect_args={"options": f"-c synchronous_commit={args.synchronous_commit}"}
    )
    check_connection(engine)
    console.print(
        f"ghost bench on {mask_url(engine.url)}: sizes {sizes}, {args.repeats} repeats, kinds {kinds}, "
        f"synchronous_commit={args.synchronous_commit}"
    )
    summary = summarize(run(engine, sizes, args.repeats, kinds, console))
    render_table(summary, console)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(summary, fh, indent=2)
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
