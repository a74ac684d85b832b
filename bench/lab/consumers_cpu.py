"""Probe: where a full cycle's CPU goes as consumers grow: server and worker CPU per 1,000 messages, and statements per batch.

    python bench/lab/consumers_cpu.py [--url URL] [--pgdata DIR] [--counts 4,32] [--seconds 8] [--repeats 2] [--upkeep [--rotate-items N]] [--json FILE]

Runs the full cycle of `queuectl bench --scenario consumers` (BenchRun.python_phase: 2
producers, batch 10, the reliable kind, consumers waiting as the Worker does) at each
count in turn (rising, then falling in the next repeat), --repeats times. For each run it prints the messages/s, the CPU seconds per
1,000 messages of the server (every process of the local server whose data directory is
--pgdata, default the embedded server's: the postmaster's own and reaped children's CPU
from /proc, plus its live children's) and of the worker processes by role (the bench's
own count), and the statements per batch taken (pg_stat_statements: claims, acks,
enqueues, registrations wait_begin and wait_end), with each statement's server time and
shared blocks per call (so a claim that walks past other consumers' locked rows shows),
and at the run's end the ready indexes' size and the blocks a look at the head of the
READY rows reads (with a standing backlog both grow through a run until VACUUM). With
--upkeep the archive job (which rotates the generations) runs beside each cycle, as the
scheduler runs it (its own CPU, a thread of this process, is reported per 1,000 messages
too). On a machine shared with other work,
CPU per message is the figure to read: the rate follows the share of the 2 cores the run
gets, the CPU per message what each message costs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from lab_helpers import probe_sql
from queuectl.bench.core import BenchOptions, BenchRun, load_average
from queuectl.bench.drivers import driver_for
from queuectl.bench.sustained import Upkeep
from queuectl.engine.embedded import default_home
from queuectl.jobs.archive import ArchiveConfig

KIND = "reliable"
QUEUE = "bench_reliable"
TICK = os.sysconf("SC_CLK_TCK")
STATEMENTS = ("dequeue", "ack", "enqueue_many", "wait_begin", "wait_end")


def _stat(pid: int) -> tuple[int, int, int]:
    """(parent pid, own CPU ticks, reaped children's CPU ticks) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def server_cpu(postmaster: int) -> float:
    """CPU seconds so far of the server: the postmaster, its reaped children and its live ones."""
    _, own, reaped = _stat(postmaster)
    total = own + reaped
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent, own, reaped = _stat(int(entry))
            except (OSError, IndexError, ValueError):
                continue  # ended meanwhile
            if parent == postmaster:
                total += own + reaped
    return total / TICK


def head_state(run: BenchRun, values: dict[str, str]) -> dict[str, Any]:
    """At a run's end: the ready indexes' size, and the blocks a look at the head of the READY
    rows reads (the claim's walk, locking nothing): entries of rows claimed since the last
    VACUUM stay in the index until an insert needs their page, so with a standing backlog the
    walk grows through a run."""
    with run.engine.connect() as conn:
        size = conn.execute(sa.text(probe_sql("consumers_ready_index_bytes", values))).scalar_one()
        plan = conn.execute(sa.text(probe_sql("consumers_head_look", values))).scalar_one()
    root = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return {"ready_index_kb": size // 1024,
            "head_look_blocks": root.get("Shared Hit Blocks", 0) + root.get("Shared Read Blocks", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=None)
    parser.add_argument("--pgdata", type=Path, default=None, help="the local server's data directory")
    parser.add_argument("--counts", default="4,32")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--upkeep", action="store_true",
                        help="run the archive job (which rotates the generations) beside each cycle, as the scheduler does")
    parser.add_argument("--rotate-items", type=int, default=None,
                        help="with --upkeep: the archive job's ids per generation (default: the job's, 2,000)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    pgdata = args.pgdata or default_home() / "pgdata"
    postmaster = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    counts = [int(n) for n in args.counts.split(",")]
    run = BenchRun(BenchOptions(kinds=[KIND], producers=2, consumers=max(counts), batch=10, pgbench=False,
                                seconds=args.seconds, url=args.url))
    names = run.names(QUEUE)
    driver = driver_for(KIND)
    driver.install(run.engine, names)
    values = names.template_values()
    values["ready_idx_literal"] = f"'{values['schema']}.{values['ready_idx']}'"
    functions = {key: values[f"fn_{key}"] for key in STATEMENTS}
    if not run.pgss_available():
        raise SystemExit("pg_stat_statements is needed (shared_preload_libraries)")
    out: list[dict[str, Any]] = []
    try:
        for repeat in range(args.repeats):
            for n in counts if repeat % 2 == 0 else counts[::-1]:  # alternate, as --scenario consumers does
                with run.engine.connect() as conn:
                    driver.reset(conn, names)
                before = {key: run.pgss_calls(fn) for key, fn in functions.items()}
                cpu = server_cpu(postmaster)
                config = None if args.rotate_items is None else ArchiveConfig(rotate_items=args.rotate_items)
                job = Upkeep(run, names, KIND, config) if args.upkeep else None
                with job.beside() if job is not None else nullcontext():
                    res = run.python_phase(KIND, names, "cycle", batch=10, payload_bytes=300, producers=2,
                                           consumers=n, seconds=args.seconds)
                time.sleep(0.5)  # the workers' sessions end and are reaped
                server = server_cpu(postmaster) - cpu
                head = head_state(run, values)
                totals = {key: {k: v - before[key][k] for k, v in run.pgss_calls(fn).items()}
                          for key, fn in functions.items()}
                calls = {key: t["calls"] for key, t in totals.items()}
                batches = res["idle"].get("work_takes") or 1
                per_1k = 1000 / max(res["messages"], 1)
                row = {"repeat": repeat + 1, "consumers": n, "rate": res["rate"], "load_1min": load_average()[:1],
                       "upkeep": job.result if job is not None else None, **head,
                       "server_cpu_per_1k": server * per_1k,
                       "producer_cpu_per_1k": res["cpu_seconds"]["producer"] * per_1k,
                       "consumer_cpu_per_1k": res["cpu_seconds"]["consumer"] * per_1k,
                       "job_cpu_per_1k": job.result["cpu_seconds"] * per_1k if job is not None and job.result else None,
                       "calls_per_batch": {key: round(v / batches, 2) for key, v in calls.items()},
                       "idle_per_batch": {key: round(v / batches, 2) for key, v in res["idle"].items()},
                       "server_us_per_call": {key: round(t["total_exec_time"] * 1000 / t["calls"], 1)
                                              for key, t in totals.items() if t["calls"]},
                       "blocks_per_call": {key: round(t["shared_blks_hit"] / t["calls"], 1)
                                           for key, t in totals.items() if t["calls"]}}
                out.append(row)
                print(json.dumps(row), flush=True)
    finally:
        driver.uninstall(run.engine, names)
        run.close()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
