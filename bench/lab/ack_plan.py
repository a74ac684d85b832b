"""Probe: what the reliable queue's ack costs with many items in flight and in the full cycle, reliable_0009 against reliable_0008; what extend_lease, nack and release cost, the head against reliable_0012.

    python bench/lab/ack_plan.py [--parts in-flight,cycle,lease] [--in-flight 100,1000,10000] [--acks 100]
        [--batches 1,10,100] [--rounds 4] [--seconds 8] [--clients 8] [--autovacuum on|off]
        [--url URL] [--json out.json]

reliable_0008's ack, nack, extend_lease and release checked `status = 1`, which implies the
leased index's predicate: the generic plan plpgsql keeps after five calls could read that
whole index on every call (sql/postgresql/reliable.sql, create_functions).
Two parts, each with a queue at reliable_0008 ("0008") and one at the head ("head"):

  * in-flight: a queue with N items leased, its tables vacuumed and analysed while 20 were (as a
    queue running small batches is; then the rest leased in claims of 20, so the leases
    have many expiry times) or never analysed; then --acks acks of one item each, in one
    session with the server's default plan caching, every ack in its own transaction that
    is rolled back (so each finds the same queue), after 8 warm-up acks (past plpgsql's
    switch to a generic plan). Reported: the median time of an ack as the client sees it,
    and the blocks each ack fetched from the meta table and from each index (the
    transaction's own counters: pg_stat_get_xact_blocks_fetched). Autovacuum is off on
    these queues, so nothing analyses them during the part.
  * cycle: pgbench full cycles on both queues, side by side (bench/hot_bound.py's
    side_by_side: every round runs both, in reversed order every other round), at each
    batch: messages/s, per-round ratios to 0008 and their median. With --autovacuum off,
    autovacuum is kept off both queues (truncated before each run, so never analysed).

A third part, not run by default, compares the head with reliable_0012 ("0012"), whose
extend_lease, nack and release run on the generation slots' partitioned parents:

  * lease: per call (ack, extend_lease, nack, release) on one leased item, in the current
    slot and in an older one (after a switch): the relation locks the call's transaction
    holds and how many were taken on the fast path, and the median client-side time of
    --acks calls (each rolled back, after 8 warm-up calls); then pgbench cycles side by
    side as in the cycle part, with a consumer that extends the leases it claimed and acks
    them ("extend"), one that nacks them with no backoff ("nack"), one that releases them
    ("release").

Without --url the embedded server is used (as `queuectl` itself does).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import sqlalchemy as sa

from hot_bound import add_cycle_arguments, side_by_side
from lab_helpers import autovacuum_off, probe_sql
from queuectl.bench.drivers import ENGINE_DIR, analyze_filled, enqueue_in_chunks, reinstall_queue
from queuectl.bench.pgbench import Pgbench, find_pgbench
from queuectl.bench.report import write_json
from queuectl.client import Queue
from queuectl.engine import make_engine
from queuectl.install import uninstall_queue
from queuectl.names import QueueNames
from queuectl.sqlfiles import render

REVISIONS: dict[str, str | None] = {"0008": "reliable_0008", "0011": "reliable_0011", "head": None}  # None: the head
LEASE_REVISIONS: dict[str, str | None] = {"0012": "reliable_0012", "head": None}
LEASE_CALLS = ("ack", "extend_lease", "nack", "release")
LEASE_CYCLES = {"extend": "ack_plan_consume_extend", "nack": "ack_plan_consume_nack",
                "release": "ack_plan_consume_release"}
WORKER = "ack_plan"
CLAIM = 20  # items per claim while the queue is filled with leased items
WARM_UP = 8  # acks before the measured ones: plpgsql decides on a generic plan after five
PAYLOAD_BYTES = 300


def _names(design: str) -> QueueNames:
    return QueueNames(f"ack_plan_{design}")


def _install(engine: sa.Engine, design: str, *, autovacuum: bool) -> QueueNames:
    names = _names(design)
    reinstall_queue(engine, names.queue, revision={**REVISIONS, **LEASE_REVISIONS}[design])  # a leftover of an aborted run replaced
    if not autovacuum:
        autovacuum_off(engine, [names.qualified("meta"), names.qualified("data")])
    return names


def lease_items(engine: sa.Engine, names: QueueNames, in_flight: int, *, analysed: bool) -> list[int]:
    """Fill the queue: `in_flight` items leased by WORKER (and as many waiting), the tables
    vacuumed and analysed while CLAIM were leased (or never); returns the leased ids."""
    queue = Queue(engine, names.queue, schema=names.schema, worker=WORKER)
    try:
        enqueue_in_chunks(queue, bytes(PAYLOAD_BYTES), 2 * in_flight)
        ids = [m.id for m in queue.dequeue(CLAIM, lease=3_600)]
        if analysed:
            analyze_filled(engine, "reliable", names)  # VACUUM (ANALYZE), as autovacuum would
        while len(ids) < in_flight:
            ids += [m.id for m in queue.dequeue(min(CLAIM, in_flight - len(ids)), lease=3_600)]
    finally:
        queue.close()
    return ids


def _blocks(conn: sa.Connection, names: QueueNames) -> dict[str, int]:
    rows = conn.execute(sa.text(probe_sql("ack_plan_blocks", {})), {"meta": names.qualified("meta")}).all()
    # since reliable_0012 each generation slot's relations are listed ("meta0_pkey"): the
    # items leased here are all in slot 0, the other slots are empty
    return {str(r.relation).removeprefix(names.queue + "_"): int(r.blocks) for r in rows}


def ack_costs(engine: sa.Engine, names: QueueNames, ids: list[int], acks: int) -> dict[str, Any]:
    """The median client-side time of one ack(1), and blocks per ack by relation."""
    ack = sa.text(render(ENGINE_DIR, "reliable", "ack", names.template_values()))
    times: list[float] = []
    blocks: dict[str, list[int]] = {}
    with engine.connect() as conn:
        for n, item in enumerate(ids[:WARM_UP + acks]):
            before = _blocks(conn, names)
            started = time.perf_counter()
            acked = conn.execute(ack, {"ids": [item], "worker": WORKER}).scalar_one()
            elapsed = time.perf_counter() - started
            after = _blocks(conn, names)
            conn.rollback()
            if acked != 1:
                raise RuntimeError(f"ack of leased item {item} changed {acked} rows")
            if n >= WARM_UP:
                times.append(elapsed)
                for relation, count in after.items():
                    blocks.setdefault(relation, []).append(count - before.get(relation, 0))
    return {"acks": len(times), "ack_us_median": statistics.median(times) * 1e6,
            "blocks_per_ack": {r: statistics.mean(b) for r, b in blocks.items()},
            "total_blocks_per_ack": statistics.mean(sum(b) for b in zip(*blocks.values()))}


def in_flight_part(engine: sa.Engine, counts: list[int], acks: int) -> list[dict[str, Any]]:
    cells = []
    for analysed in (True, False):
        for count in counts:
            for design in REVISIONS:
                names = _install(engine, design, autovacuum=False)
                try:
                    ids = lease_items(engine, names, max(count, WARM_UP + acks), analysed=analysed)
                    cell = {"design": design, "in_flight": len(ids), "analysed_at_20_leased": analysed,
                            **ack_costs(engine, names, ids, acks)}
                finally:
                    uninstall_queue(engine, names.queue, names.schema)
                cells.append(cell)
                parts = ", ".join(f"{r} {b:.1f}" for r, b in cell["blocks_per_ack"].items() if b)
                print(f"in flight {cell['in_flight']:6,} {'analysed' if analysed else 'never analysed':14} "
                      f"{design:5} ack {cell['ack_us_median']:8.1f} us, {cell['total_blocks_per_ack']:7.1f} blocks "
                      f"per ack ({parts})", flush=True)
    return cells


def lease_call_costs(engine: sa.Engine, names: QueueNames, ids: list[int], calls: int) -> dict[str, Any]:
    """Per call of LEASE_CALLS on one of `ids` each: the relation locks held after it (the
    last call's), and the median client-side time; every call rolled back."""
    statements = {call: sa.text(render(ENGINE_DIR, "reliable", call, names.template_values())) for call in LEASE_CALLS}
    params = {"worker": WORKER, "lease_seconds": 600, "error": "probe", "base_seconds": 30, "max_seconds": 60}
    locks = sa.text(probe_sql("ack_plan_relation_locks", {}))
    out: dict[str, Any] = {}
    with engine.connect() as conn:
        for call, statement in statements.items():
            times: list[float] = []
            for n, item in enumerate(ids[:WARM_UP + calls]):
                started = time.perf_counter()
                changed = conn.execute(statement, {**params, "ids": [item]}).all()
                elapsed = time.perf_counter() - started
                held = conn.execute(locks).one()
                conn.rollback()
                if not changed or changed[0][0] in (0, None):
                    raise RuntimeError(f"{call} of leased item {item} changed nothing")
                if n >= WARM_UP:
                    times.append(elapsed)
            out[call] = {"us_median": statistics.median(times) * 1e6, "relations": int(held.relations),
                         "fastpath": int(held.fastpath), "locks": int(held.locks)}
    return out


def lease_part(engine: sa.Engine, pgbench: Pgbench | None, calls: int, batches: list[int], rounds: int, seconds: int,
               clients: int, autovacuum: bool) -> dict[str, Any]:
    cells = []
    for where in ("current slot", "older slot"):
        for design in LEASE_REVISIONS:
            names = _install(engine, design, autovacuum=False)
            try:
                ids = lease_items(engine, names, WARM_UP + calls, analysed=True)
                if where == "older slot":
                    with engine.begin() as conn:  # new rows go to slot 1; the leased ones stay in slot 0
                        conn.execute(sa.text(probe_sql("ack_plan_switch", names.template_values())))
                cell = {"design": design, "where": where, "calls": calls,
                        **lease_call_costs(engine, names, ids, calls)}
            finally:
                uninstall_queue(engine, names.queue, names.schema)
            cells.append(cell)
            print(f"{where:12} {design:5} " + ", ".join(
                f"{c} {cell[c]['us_median']:6.1f} us {cell[c]['relations']} locks ({cell[c]['fastpath']} fast path)"
                for c in LEASE_CALLS), flush=True)
    result: dict[str, Any] = {"calls": cells}
    if pgbench is not None:
        cycles = {}
        for cycle, consume in LEASE_CYCLES.items():
            print(f"cycle {cycle}", flush=True)
            try:
                queues = {d: (_install(engine, d, autovacuum=autovacuum), consume) for d in LEASE_REVISIONS}
                cycles[cycle] = side_by_side(engine, pgbench, queues, batches, rounds=rounds, seconds=seconds,
                                             clients=clients)
            finally:
                for design in LEASE_REVISIONS:
                    uninstall_queue(engine, _names(design).queue)
        result["cycles"] = {"batches": batches, "rounds": rounds, "seconds": seconds, "clients": clients,
                            "autovacuum": autovacuum, "cells": cycles}
    return result


def run(url: str | None, parts: list[str], *, in_flight: list[int], acks: int, batches: list[int], rounds: int,
        seconds: int, clients: int, autovacuum: bool = True) -> dict[str, Any]:
    engine = make_engine(url)
    result: dict[str, Any] = {"parts": parts, "revisions": {d: r or "head" for d, r in REVISIONS.items()},
                              "payload_bytes": PAYLOAD_BYTES}
    try:
        if "in-flight" in parts:
            result["in_flight"] = {"acks": acks, "cells": in_flight_part(engine, in_flight, acks)}
        if "lease" in parts:
            path = find_pgbench()
            pgbench = Pgbench(path, engine.url.render_as_string(hide_password=False)) if path else None
            try:
                result["lease"] = lease_part(engine, pgbench, acks, batches, rounds, seconds, clients, autovacuum)
            finally:
                if pgbench is not None:
                    pgbench.close()
        if "cycle" in parts:
            path = find_pgbench()
            if path is None:
                raise RuntimeError("the cycle part needs pgbench ($QUEUECTL_PGBENCH or PostgreSQL's bin folder)")
            pgbench = Pgbench(path, engine.url.render_as_string(hide_password=False))
            try:
                queues = {d: (_install(engine, d, autovacuum=autovacuum), None) for d in REVISIONS}
                result["cycle"] = {"batches": batches, "rounds": rounds, "seconds": seconds, "clients": clients,
                                   "autovacuum": autovacuum,
                                   "cells": side_by_side(engine, pgbench, queues, batches, rounds=rounds,
                                                         seconds=seconds, clients=clients)}
            finally:
                pgbench.close()
                for design in REVISIONS:
                    uninstall_queue(engine, _names(design).queue)
    finally:
        engine.dispose()
    return result


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="database URL (default: the embedded server)")
    parser.add_argument("--parts", default="in-flight,cycle", help="comma-separated: in-flight, cycle, lease")
    parser.add_argument("--in-flight", default="100,1000,10000", help="leased items per in-flight cell")
    parser.add_argument("--acks", type=int, default=100, help="measured acks per in-flight cell (lease: calls)")
    add_cycle_arguments(parser, note="cycle: ")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - {"in-flight", "cycle", "lease"}
    if unknown:
        parser.error(f"unknown part(s): {', '.join(sorted(unknown))} (choose from in-flight, cycle, lease)")
    result = run(args.url, parts, in_flight=_ints(args.in_flight), acks=args.acks, batches=_ints(args.batches),
                 rounds=args.rounds, seconds=args.seconds, clients=args.clients,
                 autovacuum=args.autovacuum == "on")
    write_json(args.json_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
