"""Probe: how much a HOT-able layout of the reliable queue could buy, a bound measured in SQL.

    python bench/lab/hot_bound.py [--batches 1,10,100] [--rounds 4] [--seconds 8] [--clients 8] [--url URL] [--json out.json]

No update of the reliable queue's meta table is HOT: every claim and every ack changes
`status`, and `status` is in the predicate of its partial indexes (PostgreSQL counts a
predicate column as indexed), so each one writes a new row version and an entry in every
index whose predicate the new version satisfies. A layout whose updates are HOT was the
lever named for the peers and batch-1 targets (RESULTS.md, "Reading the misses").
This probe measures how far that lever can reach before anyone builds it, on three
queues side by side:

  * rel:   the reliable queue as installed at reliable_0011 (single meta and data tables: the
           claim variants below rebuild its indexes; reliable_0012's generations are
           measured by rotation.py and the sustained scenario);
  * nofin: the same without the finished index (what the ack's index entry costs);
  * hot:   the same reduced until its claim is HOT, bench.sql hot_bound_hot_layout: no
           index on status or the lease columns, half of each meta page free, no pick of
           expired leases, and a DELETE instead of the ack, so no history either.

`nofin` and `hot` drop lookups and guarantees the queue needs, so they are bounds, not
designs: any real HOT-able layout keeps more work than `hot` does. Each round runs
pgbench on each queue in turn (the order reversed every other round) for `--seconds`
with `--clients` clients, each of which enqueues a batch, then dequeues and acks (or
deletes) one: the full-cycle SQL twin of `queuectl bench` at that batch. Reported: the
medians of messages/s over the rounds, the median of each queue's per-round ratio to
`rel`, the meta table's updates and HOT updates in each run, and the checkpoints that
ran during each run (a run that spans one writes full page images and is slower), and the
autovacuum and autoanalyze runs that finished on the queue's tables during each run
(`--autovacuum off` disables autovacuum on those tables; they are truncated before every run).
Without --url the embedded server is used (as `queuectl` itself does).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

import sqlalchemy as sa

from lab_helpers import autovacuum_off, probe_sql
from queuectl.bench.drivers import ReliableDriver, bench_sql, reinstall_queue, run_bench_sections
from queuectl.bench.pgbench import Pgbench, find_pgbench
from queuectl.bench.report import write_json
from queuectl.engine import make_engine
from queuectl.install import uninstall_queue
from queuectl.names import QueueNames

DESIGNS = ("rel", "nofin", "hot")
SETUP = {"rel": (), "nofin": ("hot_bound_drop_finished",), "hot": ("hot_bound_hot_layout",)}
PAYLOAD_BYTES = 300


LAYOUT_REVISION = "reliable_0011"


def _queue(design: str) -> QueueNames:
    return QueueNames(f"hot_bound_{design}")


def _tables(names: QueueNames) -> list[str]:
    return [names.qualified("meta"), names.qualified("data")]


def _install(engine: sa.Engine, design: str, *, autovacuum: bool) -> None:
    names = _queue(design)
    # reliable_0011, the single-table layout its claim variants are built on (a leftover of an
    # aborted run replaced)
    reinstall_queue(engine, names.queue, revision=LAYOUT_REVISION, schema=names.schema)
    if SETUP[design]:
        run_bench_sections(engine, names, *SETUP[design], sql=probe_sql)
    if not autovacuum:
        autovacuum_off(engine, _tables(names))


def _meta_stats(engine: sa.Engine, names: QueueNames) -> tuple[int, int, int]:
    """The meta table's updates and HOT updates, and the autovacuum and autoanalyze runs
    finished so far on the queue's meta and data tables."""
    with engine.connect() as conn:  # a new transaction: statistics are cached per transaction
        meta, *rest = conn.execute(sa.text(probe_sql("autovacuum_sample", {})), {"tables": _tables(names)}).all()
    autos = sum(int(t.autovacuum_count) + int(t.autoanalyze_count) for t in (meta, *rest))
    return int(meta.n_tup_upd), int(meta.n_tup_hot_upd), autos


def _left(engine: sa.Engine, names: QueueNames) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(probe_sql("hot_bound_left", names.template_values()))).all()
    return {str(r.status): int(r.n) for r in rows}


def _checkpoints(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(probe_sql("checkpoints", {}))).scalar_one())


def one_run(engine: sa.Engine, pgbench: Pgbench, names: QueueNames, batch: int, clients: int, seconds: int,
            consume: str | None = None) -> dict[str, Any]:
    """One pgbench run of the reliable full cycle on the queue `names` (`consume`: a probes.sql
    section instead of bench.sql's dequeue-and-ack one), from an empty queue."""
    values = names.template_values()
    scripts = ReliableDriver().pgbench(names, batch, [os.urandom(PAYLOAD_BYTES) for _ in range(batch)])
    assert scripts is not None
    script = pgbench.script(f"{names.queue}_{batch}",
                            bench_sql(scripts.enqueue_section, values)
                            + (probe_sql(consume, values) if consume else bench_sql(scripts.consume_section, values)))
    run_bench_sections(engine, names, "reliable_reset")
    upd0, hot0, auto0 = _meta_stats(engine, names)
    checkpoints = _checkpoints(engine)
    result = pgbench.run([script], clients=clients, seconds=seconds, variables=scripts.variables)
    upd1, hot1, auto1 = _meta_stats(engine, names)
    return {"msgs_per_s": result.tps * batch, "transactions": result.transactions, "failed": result.failed,
            "updates": upd1 - upd0, "hot_updates": hot1 - hot0, "checkpoints": _checkpoints(engine) - checkpoints,
            "autovacuums": auto1 - auto0, "left": _left(engine, names)}


def side_by_side(engine: sa.Engine, pgbench: Pgbench, queues: dict[str, tuple[QueueNames, str | None]],
                 batches: list[int], *, rounds: int, seconds: int, clients: int) -> list[dict[str, Any]]:
    """Each round runs every queue once (`queues`: design -> its queue and consume section;
    the first is the base of the ratios), in reversed order every other round; one cell per
    batch and design: rates, per-round ratios to the base and their median, HOT updates,
    checkpoints and autovacuum runs."""
    designs = list(queues)
    base = designs[0]
    cells: list[dict[str, Any]] = []
    for batch in batches:
        runs: dict[str, list[dict[str, Any]]] = {d: [] for d in designs}
        for round_no in range(rounds):
            for design in (designs if round_no % 2 == 0 else designs[::-1]):
                names, consume = queues[design]
                cell = one_run(engine, pgbench, names, batch, clients, seconds, consume)
                runs[design].append(cell)
                print(f"batch {batch:3} round {round_no} {design:5} {cell['msgs_per_s']:9,.0f} msg/s, "
                      f"meta updates {cell['updates']:,} of which HOT {cell['hot_updates']:,}, "
                      f"checkpoints {cell['checkpoints']}, autovacuum/autoanalyze runs {cell['autovacuums']}",
                      flush=True)
        for design in designs:
            rates = [c["msgs_per_s"] for c in runs[design]]
            ratios = [c["msgs_per_s"] / r["msgs_per_s"] for c, r in zip(runs[design], runs[base])]
            updates = sum(c["updates"] for c in runs[design])
            hot = sum(c["hot_updates"] for c in runs[design])
            cell = {"batch": batch, "design": design, "msgs_per_s": rates, "median": statistics.median(rates),
                    f"ratios_to_{base}": ratios, f"ratio_to_{base}": statistics.median(ratios), "updates": updates,
                    "hot_updates": hot, "hot_ratio": hot / updates if updates else None,
                    "failed": sum(c["failed"] for c in runs[design]), "left": [c["left"] for c in runs[design]],
                    "checkpoints": [c["checkpoints"] for c in runs[design]],
                    "autovacuums": [c["autovacuums"] for c in runs[design]]}
            cells.append(cell)
            print(f"batch {batch:3} {design:5} median {cell['median']:9,.0f} msg/s, x {base} "
                  f"{cell[f'ratio_to_{base}']:.2f} (per round {' / '.join(f'{r:.2f}' for r in ratios)}), "
                  f"HOT {hot:,} of {updates:,} updates", flush=True)
    return cells


def run(url: str | None, batches: list[int], *, rounds: int, seconds: int, clients: int,
        autovacuum: bool = True) -> dict[str, Any]:
    engine = make_engine(url)
    path = find_pgbench()
    if path is None:
        raise RuntimeError("the HOT bound probe needs pgbench ($QUEUECTL_PGBENCH or PostgreSQL's bin folder)")
    pgbench = Pgbench(path, engine.url.render_as_string(hide_password=False))
    result: dict[str, Any] = {"batches": batches, "rounds": rounds, "seconds": seconds, "clients": clients,
                              "payload_bytes": PAYLOAD_BYTES, "autovacuum": autovacuum, "cells": []}
    try:
        for design in DESIGNS:
            _install(engine, design, autovacuum=autovacuum)
        queues = {d: (_queue(d), "hot_bound_consume_delete" if d == "hot" else None) for d in DESIGNS}
        result["cells"] = side_by_side(engine, pgbench, queues, batches, rounds=rounds, seconds=seconds,
                                       clients=clients)
    finally:
        pgbench.close()
        for design in DESIGNS:
            uninstall_queue(engine, _queue(design).queue)
        engine.dispose()
    return result


def add_cycle_arguments(parser: argparse.ArgumentParser, note: str = "") -> None:
    """The options of a side_by_side() pgbench loop (this probe's, ack_plan's cycle part);
    `note` starts each help text."""
    parser.add_argument("--batches", default="1,10,100", help=f"{note}comma-separated batch sizes")
    parser.add_argument("--rounds", type=int, default=4, help=f"{note}rounds; each runs every queue once")
    parser.add_argument("--seconds", type=int, default=8, help=f"{note}pgbench seconds per run")
    parser.add_argument("--clients", type=int, default=8, help=f"{note}pgbench clients (producer+consumer each)")
    parser.add_argument("--autovacuum", choices=("on", "off"), default="on",
                        help=f"{note}off: autovacuum disabled on the probe queues' tables (they are truncated before each run)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="database URL (default: the embedded server)")
    add_cycle_arguments(parser)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    result = run(args.url, batches, rounds=args.rounds, seconds=args.seconds, clients=args.clients,
                 autovacuum=args.autovacuum == "on")
    write_json(args.json_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
