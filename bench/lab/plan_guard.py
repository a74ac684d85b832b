"""Probe: plans cached while a queue was small, after it grew, and what the guard against them costs.

    python bench/lab/plan_guard.py [--kinds reliable,fifo,...] [--repeats 5] [--seconds 5] [--url URL] [--json out.json]

Two parts, each with both revisions of every kind side by side:
  * stale plans: a queue with 0, 1 or 20 rows, analysed (as autovacuum analyses a drained
    queue) and with autovacuum off on its tables (so nothing replans the sessions below);
    one session calls dequeue(10) eight times (plpgsql keeps a generic plan after five),
    then the queue grows by `--grow` rows (reliable: `--leased` of them then leased by
    another session); reported: the shared buffers of that early session's dequeue(10)
    (its second call: the first one also marks the leased rows' old index entries dead),
    against a new session's eighth call. Every call is rolled back, so all of them see the
    same rows (EXPLAIN ANALYZE counts the function's own statements);
  * cost: pgbench, one client, `BEGIN; SELECT count(*) FROM <queue>_dequeue(N); ROLLBACK`
    on `--rows` analysed rows, N = 1, 10, 100, the two revisions alternating; medians of
    `--repeats` runs of `--seconds`, and the head / before ratio of the medians.
Without --url the embedded server is used (as `queuectl` itself does).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import sqlalchemy as sa

from lab_helpers import autovacuum_off, probe_sql
from queuectl.bench.drivers import enqueue_in_chunks, plan_shared_hits, reinstall_queue
from queuectl.bench.pgbench import Pgbench, find_pgbench
from queuectl.bench.report import write_json
from queuectl.engine import make_engine
from queuectl.install import head_of, uninstall_queue
from queuectl.client import open_queue
from queuectl.kindspec import FifoSettings, kind_template_values
from queuectl.names import QueueNames

# The last revision of each kind before its plan guard; "fifo_strict" is a strict FIFO queue.
BEFORE = {"reliable": "reliable_0007", "fifo": "fifo_0003", "fifo_strict": "fifo_0003", "heap": "heap_0003",
          "stack": "stack_0003", "pending": "pending_0003", "watermark": "watermark_0003"}
PREFILLS = (0, 1, 20)
BATCHES = (1, 10, 100)
PAYLOAD = bytes(300)


def _kind(variant: str) -> str:
    return "fifo" if variant == "fifo_strict" else variant


def _values(name: str, variant: str) -> dict[str, str]:
    names = QueueNames(name)
    return {**names.template_values(), **kind_template_values(names, _kind(variant))}


def _tables(variant: str, name: str) -> list[str]:
    names = QueueNames(name)
    roles = ("meta", "data") if variant == "reliable" else ("items",)
    return [names.qualified(role) for role in roles]


def _install(engine: sa.Engine, name: str, variant: str, revision: str, rows: int, *, autovacuum: bool) -> None:
    """The queue at `revision` with `rows` items, its tables analysed (and vacuumed)."""
    settings = FifoSettings(strict=True) if variant == "fifo_strict" else None
    reinstall_queue(engine, name, _kind(variant), settings, revision=revision)
    if not autovacuum:
        autovacuum_off(engine, _tables(variant, name))
    with open_queue(engine, name) as queue:
        enqueue_in_chunks(queue, PAYLOAD, rows)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in _tables(variant, name):
            conn.exec_driver_sql(probe_sql("plan_guard_analyze", {"table": table}))


def _hits(conn: sa.Connection, name: str, variant: str) -> int:
    """Shared buffers of one dequeue(10), rolled back (0: it touched none, an empty table)."""
    plan = [row[0] for row in conn.exec_driver_sql(probe_sql("plan_guard_explain_dequeue", _values(name, variant)))]
    conn.rollback()
    return plan_shared_hits(plan) or 0


def stale(engine: sa.Engine, variant: str, revision: str, prefill: int, grow: int, leased: int) -> dict[str, Any]:
    name = "pg_stale"
    _install(engine, name, variant, revision, prefill, autovacuum=False)
    try:
        with engine.connect() as early:
            cached = [_hits(early, name, variant) for _ in range(8)][-1]
            with open_queue(engine, name) as queue:
                enqueue_in_chunks(queue, PAYLOAD, grow)
                if variant == "reliable" and leased:
                    queue.dequeue(leased)
            first = _hits(early, name, variant)
            second = _hits(early, name, variant)
        with engine.connect() as fresh:
            new = [_hits(fresh, name, variant) for _ in range(8)][-1]
    finally:
        uninstall_queue(engine, name)
    return {"kind": variant, "revision": revision, "prefill": prefill, "buffers_small": cached,
            "buffers_early_first": first, "buffers_early": second, "buffers_new_session": new}


def cost(engine: sa.Engine, pgbench: Pgbench, variant: str, rows: int, repeats: int, seconds: int) -> dict[str, Any]:
    sides = {"before": ("pg_before", BEFORE[variant]), "head": ("pg_head", head_of(_kind(variant)))}
    for name, revision in sides.values():
        _install(engine, name, variant, revision, rows, autovacuum=True)
    tps: dict[str, dict[int, list[float]]] = {which: {b: [] for b in BATCHES} for which in sides}
    try:
        for repeat in range(repeats):
            for batch in BATCHES:
                order = ("before", "head") if repeat % 2 == 0 else ("head", "before")
                for which in order:
                    name = sides[which][0]
                    script = pgbench.script(f"{name}_{batch}", probe_sql(
                        "plan_guard_pgbench_dequeue", {**_values(name, variant), "batch": batch}))
                    tps[which][batch].append(pgbench.run([script], clients=1, seconds=seconds).tps)
    finally:
        for name, _revision in sides.values():
            uninstall_queue(engine, name)
    out: dict[str, Any] = {"kind": variant, "rows": rows, "before": sides["before"][1], "head": sides["head"][1],
                           "batches": {}}
    for batch in BATCHES:
        before, head = statistics.median(tps["before"][batch]), statistics.median(tps["head"][batch])
        out["batches"][str(batch)] = {"before_tps": tps["before"][batch], "head_tps": tps["head"][batch],
                                      "before_median": before, "head_median": head, "ratio": head / before}
    return out


def run(url: str | None, kinds: list[str], *, grow: int, leased: int, rows: int, repeats: int, seconds: int,
        parts: tuple[str, ...] = ("stale", "cost")) -> dict[str, Any]:
    for variant in kinds:
        if variant not in BEFORE:
            raise ValueError(f"unknown kind {variant!r}: one of {', '.join(BEFORE)}")
    engine = make_engine(url)
    result: dict[str, Any] = {"kinds": kinds, "grow": grow, "leased": leased, "rows": rows, "repeats": repeats,
                              "seconds": seconds, "stale": [], "cost": []}
    pgbench = None
    try:
        if "stale" in parts:
            for variant in kinds:
                for revision in (BEFORE[variant], head_of(_kind(variant))):
                    for prefill in PREFILLS:
                        cell = stale(engine, variant, revision, prefill, grow, leased)
                        result["stale"].append(cell)
                        print(f"stale {variant:12} {revision:15} {prefill:3} rows: early session "
                              f"{cell['buffers_early']:6,} buffers per dequeue(10), new session "
                              f"{cell['buffers_new_session']:5,}", flush=True)
        if "cost" in parts:
            path = find_pgbench()
            if path is None:
                raise RuntimeError("the cost part needs pgbench ($QUEUECTL_PGBENCH or PostgreSQL's bin folder)")
            pgbench = Pgbench(path, engine.url.render_as_string(hide_password=False))
            for variant in kinds:
                cell = cost(engine, pgbench, variant, rows, repeats, seconds)
                result["cost"].append(cell)
                for batch, b in cell["batches"].items():
                    print(f"cost  {variant:12} dequeue({batch:>3}) + rollback: {cell['before']} {b['before_median']:,.0f}/s, "
                          f"{cell['head']} {b['head_median']:,.0f}/s, head/before {b['ratio']:.3f}", flush=True)
    finally:
        if pgbench is not None:
            pgbench.close()
        engine.dispose()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="database URL (default: the embedded server)")
    parser.add_argument("--kinds", default=",".join(BEFORE), help="comma-separated: " + ", ".join(BEFORE))
    parser.add_argument("--grow", type=int, default=20_000, help="rows enqueued after the plans were cached")
    parser.add_argument("--leased", type=int, default=500, help="reliable: rows then leased by another session")
    parser.add_argument("--rows", type=int, default=20_000, help="cost part: analysed rows in each queue")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5, help="cost part: pgbench seconds per run")
    parser.add_argument("--part", choices=("stale", "cost", "both"), default="both")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    parts = ("stale", "cost") if args.part == "both" else (args.part,)
    result = run(args.url, kinds, grow=args.grow, leased=args.leased, rows=args.rows, repeats=args.repeats,
                 seconds=args.seconds, parts=parts)
    write_json(args.json_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
