"""Probe: ghost rows under an open snapshot, naive fifo vs watermark, one consumer draining one item per call.

    python bench/lab/ghosts.py [--url URL] [--sizes 30000,60000] [--repeats 3] [--kinds fifo,watermark] [--json out.json]

The table shows medians and the ratios snapshot/none per kind and size, and the largest
size over the smallest. Queues live in their own schema (`ghostbench`) and are removed after.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import Engine

from queuectl.bench.ghosts import KINDS, SCHEMA, drain, ghosts_engine
from queuectl.bench.report import write_json
from queuectl.engine import check_connection, resolve_url
from queuectl.engine.urls import mask_url
from queuectl.install import uninstall_queue


@dataclass(frozen=True)
class Run:
    kind: str
    rows: int
    snapshot: bool
    seconds: float
    blocks_per_dequeue: float
    cpu_seconds: float | None  # client process + its server backend; None when /proc is not readable


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    engine = ghosts_engine(resolve_url(args.url), args.synchronous_commit)
    check_connection(engine)
    console.print(
        f"ghost bench on {mask_url(engine.url)}: sizes {sizes}, {args.repeats} repeats, kinds {kinds}, "
        f"synchronous_commit={args.synchronous_commit}"
    )
    summary = summarize(run(engine, sizes, args.repeats, kinds, console))
    render_table(summary, console)
    write_json(args.json_path, summary)
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
