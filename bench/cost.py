"""Scenario `cost`: what a message costs as the work grows, in backlog and in payload size.

Backlog curve (--rows; default 10,000, 1,000,000 and 10,000,000 ready messages of
--payload-bytes): each size gets its own queue, filled through the queue's own
enqueue_many with arrays the server builds from a small pool of payloads (bench.sql
cost_fill: no payload crosses the network per row), in chunks, each its own transaction.
Then, in every repeat, each queue is topped up to its size + --items (+ what the consumer's
warm-up claims), its tables are vacuumed and analyzed, and one consumer process claims and
acks exactly --items messages at dequeue(--batch): the backlog runs from size + items down
to size. One consumer, so the figure is the cost of the claim and the ack themselves, not
of contention between consumers.

Payload curve (--sizes; default 300 B to 64 KB): per size and repeat, a fresh queue runs
a full cycle (--producers and --consumers processes for --seconds, producers pausing above
--backlog): messages/s, payload MB/s and the WAL each statement wrote per message; then a
fresh queue filled with --items messages of that size is drained by the same one-consumer
claim+ack.

Per claim+ack: the consumer's wall time per message, messages/s, and from
pg_stat_statements (when loaded) the shared buffers, WAL bytes and server time of the claim
and ack calls per message. Repeats interleave the points (all backlogs, then all sizes), so
a busy machine moves every point of a repeat alike; ratios are taken per repeat.

What it assumes of a kind, nothing of its layout: an SQL API with enqueue_many(bytea[], ...)
whose other arguments have defaults, and dequeue / ack / ack_dequeue functions named by
QueueNames; counts through queuectl.stats.queue_counts; its tables among the names
QUEUE_OBJECT_SUFFIXES lists for the kind (every one that exists is vacuumed and measured).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import sqlalchemy as sa

from queuectl.bench.core import BenchRun, ratio, scenario, stat
from queuectl.bench.drivers import BinaryArray, bench_sql, driver_for
from queuectl.bench.sustained import installed_kind, left_in_queue, plots_available
from queuectl.bench.workers import WARMUP_CALLS, WorkerSpec, payload_pool, run_loop, warm_up_consumer
from queuectl.errors import QueuectlError, UsageError
from queuectl.names import QUEUE_OBJECT_SUFFIXES, QueueNames

FILL_CHUNK_ROWS = 100_000  # messages per cost_fill call (one transaction each)
FILL_CHUNK_BYTES = 64 * 1024 * 1024  # at most this much payload per call (64 KB payloads: 1,024 rows)
FILL_POOL = 64  # distinct payloads a fill cycles through
CLAIM_TIMEOUT = 3600.0  # a claim+ack phase that has not finished by then fails the run
MB = 1_000_000
# The target: the claim+ack cost per message at the largest backlog within this factor of the smallest's.
BACKLOG_COST_RATIO = 1.3
# the functions whose calls claim messages (ack_dequeue: a consumer that acks with its next claim), and with the ack
CLAIMING_FUNCTIONS = ("fn_dequeue", "fn_ack_dequeue")
CLAIM_FUNCTIONS = (*CLAIMING_FUNCTIONS, "fn_ack")
ENQUEUE_FUNCTIONS = ("fn_enqueue", "fn_enqueue_many")


def backlog_queue(kind: str, rows: int) -> str:
    return f"cost_{kind}_b{rows}"


def payload_queue(kind: str) -> str:
    return f"cost_{kind}_p"


# -- the consumer process (module-level and stateless: started in fresh processes) ---------------------------------


@dataclass(frozen=True)
class CountedSpec(WorkerSpec):
    items: int = 0  # messages to claim and ack once the run goes


def counted_consumer(spec: CountedSpec, ready: Any, go: Any, stop: Any, results: Any, backlog: Any) -> None:
    """Process entry point (workers.run_loop): claims and acks spec.items messages, then reports."""
    run_loop(spec, ready, go, stop, results, lambda session: _claim_items(session, spec))


def _claim_items(session: Any, spec: CountedSpec) -> Iterator[Any]:
    stop = yield warm_up_consumer(session, spec.batch)
    count, dry = 0, False
    t_start = time.time()
    while count < spec.items and not stop.is_set():
        payloads, token = session.take(min(spec.batch, spec.items - count))
        if not payloads:
            dry = True
            break
        session.finish(token)
        count += len(payloads)
    if getattr(session, "defers_finish", False):
        session.flush()
    yield {"count": count, "t_start": t_start, "t_end": time.time(), "ran_dry": dry}


# -- filling, vacuuming, measuring ------------------------------------------------------------------------------------


def queue_tables(run: BenchRun, names: QueueNames, kind: str) -> list[str]:
    """The queue's tables that exist, qualified and quoted, among every name its kind may own."""
    suffixes = {names.table(s): s for s in QUEUE_OBJECT_SUFFIXES[kind]}
    with run.engine.connect() as conn:
        rows = conn.execute(sa.text(bench_sql("queue_tables", {})), {"schema": names.schema, "tables": list(suffixes)})
        return [names.qualified(suffixes[r.relname]) for r in rows]


def vacuum_queue(run: BenchRun, names: QueueNames, kind: str) -> float:
    """Vacuum and analyze every table of the queue and its indexes (bench.sql cost_vacuum says
    why the indexes too): every claim+ack starts from the same clean state. Seconds it took."""
    t = time.perf_counter()
    with run.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in queue_tables(run, names, kind):
            conn.exec_driver_sql(bench_sql("cost_vacuum", {"table": table}))
    return time.perf_counter() - t


def table_bytes(run: BenchRun, names: QueueNames, kind: str) -> int:
    """Total size (heap, indexes, TOAST) of the queue's tables."""
    tables = [names.table(s) for s in QUEUE_OBJECT_SUFFIXES[kind]]
    with run.engine.connect() as conn:
        row = conn.execute(sa.text(bench_sql("sustained_tables", {})), {"schema": names.schema, "tables": tables}).one()
    return int(row.total_bytes)


def server_work(run: BenchRun, names: QueueNames, functions: tuple[str, ...], have_pgss: bool) -> dict[str, float] | None:
    """pg_stat_statements' totals so far of the calls of the queue's `functions`."""
    if not have_pgss:
        return None
    values = names.template_values()
    totals: dict[str, float] = {}
    for fn in functions:
        for key, value in run.pgss_calls(values[fn]).items():
            totals[key] = totals.get(key, 0.0) + value
    return totals


def delta(after: dict[str, float] | None, before: dict[str, float] | None) -> dict[str, float] | None:
    if after is None or before is None:
        return None
    return {k: after[k] - before.get(k, 0.0) for k in after}


def fill(run: BenchRun, names: QueueNames, rows: int, payload_bytes: int, have_pgss: bool) -> dict[str, Any]:
    """Enqueue `rows` messages of `payload_bytes` through the queue's enqueue_many (bench.sql
    cost_fill), in chunks of one transaction each: what it wrote and how long it took."""
    chunk = max(1, min(FILL_CHUNK_ROWS, FILL_CHUNK_BYTES // payload_bytes))
    pool = BinaryArray(payload_pool(payload_bytes, FILL_POOL, seed=payload_bytes))
    stmt = sa.text(bench_sql("cost_fill", names.template_values()))
    before = server_work(run, names, ("fn_enqueue_many",), have_pgss)
    t = time.perf_counter()
    done = 0
    with run.engine.connect() as conn:
        while done < rows:
            n = min(chunk, rows - done)
            done += int(conn.execute(stmt, {"pool": pool, "rows": n}).scalar_one())
            conn.commit()
    seconds = time.perf_counter() - t
    work = delta(server_work(run, names, ("fn_enqueue_many",), have_pgss), before)
    return {"rows": done, "payload_bytes": payload_bytes, "seconds": seconds, "rows_per_s": done / seconds if seconds else None,
            "chunk_rows": chunk, "wal_bytes": None if work is None else work["wal_bytes"]}


def claim_and_ack(run: BenchRun, driver: str, names: QueueNames, payload_bytes: int, have_pgss: bool) -> dict[str, Any]:
    """One consumer process claims and acks exactly --items messages: its wall time per message
    and, from pg_stat_statements, the server's work per message."""
    o = run.options
    spec = CountedSpec(driver=driver, url=run.url, queue=names.queue, schema=names.schema, role="consumer",
                       batch=o.batch, payload_bytes=payload_bytes, seed=3000, items=o.items)
    before: list[dict[str, float] | None] = []
    t_go, reports = run.run_workers(counted_consumer, [spec], CLAIM_TIMEOUT, mode=f"cost claim+ack {driver}",
                                    on_go=lambda _: before.append(server_work(run, names, CLAIM_FUNCTIONS, have_pgss)))
    work = delta(server_work(run, names, CLAIM_FUNCTIONS, have_pgss), before[0])
    (report,) = reports
    count = int(report["count"])
    if report["ran_dry"] or count < o.items:
        raise QueuectlError(f"cost: the queue {names.queue} ran dry after {count:,} of {o.items:,} messages")
    seconds = max(report["t_end"] - t_go, 1e-9)
    out = {"claimed": count + int(report["warmup_count"]), "seconds": seconds, "rate": count / seconds,
           "us_per_msg": seconds * 1e6 / count, "buffers_per_msg": None, "wal_bytes_per_msg": None,
           "server_us_per_msg": None}
    if work is not None:
        out.update(buffers_per_msg=(work["shared_blks_hit"] + work["shared_blks_read"]) / count,
                   wal_bytes_per_msg=work["wal_bytes"] / count, server_us_per_msg=work["total_exec_time"] * 1000.0 / count)
    return out


def full_cycle(run: BenchRun, driver: str, names: QueueNames, payload_bytes: int, have_pgss: bool) -> dict[str, Any]:
    """The full cycle at this payload size, and the WAL its statements wrote per message: the
    enqueue calls' over the messages they enqueued, the claim and ack calls' over the messages
    claimed (a claim returns a row per message, an ack one row per call)."""
    o = run.options
    parts = {"enqueue": ENQUEUE_FUNCTIONS, "claim": CLAIMING_FUNCTIONS, "ack": ("fn_ack",)}
    before = {part: server_work(run, names, fns, have_pgss) for part, fns in parts.items()}
    res = run.python_phase(driver, names, "cycle", batch=o.batch, payload_bytes=payload_bytes, producers=o.producers,
                           consumers=o.consumers, seconds=o.seconds)
    work = {part: delta(server_work(run, names, fns, have_pgss), before[part]) for part, fns in parts.items()}
    out: dict[str, Any] = {"rate": res["rate"], "mb_per_s": res["rate"] * payload_bytes / MB, "p50_ms": res["p50_ms"],
                           "p99_ms": res["p99_ms"], "enqueue_wal_per_msg": None, "claim_ack_wal_per_msg": None,
                           "wal_per_msg": None}
    enq, claim, ack = work["enqueue"], work["claim"], work["ack"]
    if enq is not None and claim is not None and ack is not None:
        enqueue_wal = ratio(enq["wal_bytes"], enq["rows"])
        claim_wal = ratio(claim["wal_bytes"] + ack["wal_bytes"], claim["rows"])
        out.update(enqueue_wal_per_msg=enqueue_wal, claim_ack_wal_per_msg=claim_wal,
                   wal_per_msg=None if enqueue_wal is None or claim_wal is None else enqueue_wal + claim_wal)
    return out


# -- the scenario -------------------------------------------------------------------------------------------------------


def medians(values: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Each key's per-repeat values and their median (core.stat)."""
    return {key: stat([v[key] for v in values]) for key in keys}


CLAIM_KEYS = ("rate", "us_per_msg", "buffers_per_msg", "wal_bytes_per_msg", "server_us_per_msg")
CYCLE_KEYS = ("rate", "mb_per_s", "p50_ms", "p99_ms", "enqueue_wal_per_msg", "claim_ack_wal_per_msg", "wal_per_msg")


@scenario("cost", "claim+ack cost per message as the backlog grows (--rows) and per payload size (--sizes)",
          ("kinds", "producers", "consumers", "batch", "payload_bytes", "seconds", "backlog", "rows", "sizes", "items",
           "plots"))
def cost(run: BenchRun) -> dict[str, Any]:
    o = run.options
    if o.plots and not plots_available():
        raise UsageError("the cost scenario's plots need matplotlib: pip install 'queuectl[bench]'")
    if "ring" in o.kinds:
        raise UsageError("--scenario cost fills backlogs of millions of messages: the ring holds at most its size")
    backlogs = sorted(set(o.rows))
    warm = WARMUP_CALLS * o.batch  # messages the consumer's warm-up claims before it is timed
    have_pgss = run.pgss_available()
    unavailable: list[dict[str, str]] = []
    if not have_pgss:
        unavailable.append({"subject": "buffers, WAL and server time per message",
                            "reason": "pg_stat_statements is not available (needs shared_preload_libraries and "
                                      "CREATE EXTENSION)"})
    fills: list[dict[str, Any]] = []
    queues: dict[tuple[str, int], dict[str, Any]] = {}
    claims: dict[tuple[str, int], list[dict[str, Any]]] = {(k, n): [] for k in o.kinds for n in backlogs}
    cycles: dict[tuple[str, int], list[dict[str, Any]]] = {(k, s): [] for k in o.kinds for s in o.sizes}
    drains: dict[tuple[str, int], list[dict[str, Any]]] = {(k, s): [] for k in o.kinds for s in o.sizes}
    ledger: list[dict[str, Any]] = []
    payload_queues: set[str] = set()
    steps = len(claims) + o.repeat * (len(claims) + len(cycles)) + 1
    try:
        with run.reporter.scenario("cost", steps) as rep:
            for kind, rows in claims:
                rep.step(f"{kind}: filling {rows:,} ready messages")
                names = run.names(backlog_queue(kind, rows))
                driver_for(kind).install(run.engine, names)
                installed = installed_kind(run, names)
                queues[(kind, rows)] = {"names": names, "kind": installed, "ready": 0}
                filled = fill(run, names, rows, o.payload_bytes, have_pgss)
                queues[(kind, rows)]["ready"] = filled["rows"]
                filled.update(kind=kind, vacuum_seconds=vacuum_queue(run, names, installed),
                              table_bytes=table_bytes(run, names, installed))
                fills.append(filled)
                rep.note(f"{kind}: {rows:,} messages filled in {filled['seconds']:,.1f} s, "
                         f"{filled['table_bytes'] / MB:,.0f} MB, vacuum+analyze {filled['vacuum_seconds']:,.1f} s")
                rep.done()
            for r in range(o.repeat):
                for (kind, rows), q in queues.items():
                    rep.step(f"repeat {r + 1}: {kind}, claim+ack at {rows:,} ready")
                    top_up = rows + o.items + warm - q["ready"]
                    if top_up > 0:
                        q["ready"] += fill(run, q["names"], top_up, o.payload_bytes, False)["rows"]
                    vacuum_queue(run, q["names"], q["kind"])
                    measured = claim_and_ack(run, kind, q["names"], o.payload_bytes, have_pgss)
                    timed_from = q["ready"] - (measured["claimed"] - o.items)  # after the warm-up's claims
                    q["ready"] -= measured["claimed"]
                    claims[(kind, rows)].append({**measured, "ready_start": timed_from, "ready_end": q["ready"]})
                    rep.done()
                for kind, size in cycles:
                    rep.step(f"repeat {r + 1}: {kind}, {size:,} B payloads")
                    names = run.names(payload_queue(kind))
                    driver = driver_for(kind)
                    driver.install(run.engine, names)  # a fresh queue for each phase
                    payload_queues.add(kind)
                    cycles[(kind, size)].append(full_cycle(run, kind, names, size, have_pgss))
                    driver.install(run.engine, names)
                    fill(run, names, o.items + warm, size, False)
                    vacuum_queue(run, names, installed_kind(run, names))
                    drains[(kind, size)].append(claim_and_ack(run, kind, names, size, have_pgss))
                    rep.done()
            rep.step("counting what the backlogs hold")
            ledger = [backlog_ledger(run, kind, rows, q) for (kind, rows), q in queues.items()]
            rep.done()
    finally:  # the backlogs take gigabytes: none is left behind, also when the run fails
        for (kind, _), q in queues.items():
            driver_for(kind).uninstall(run.engine, q["names"])
        for kind in payload_queues:
            driver_for(kind).uninstall(run.engine, run.names(payload_queue(kind)))
    backlog_points = [backlog_point(kind, rows, claims, backlogs) for kind, rows in claims]
    payload_points = [{"kind": kind, "payload_bytes": size, "items": o.items,
                       "cycle": medians(cycles[(kind, size)], CYCLE_KEYS),
                       "claim_ack": medians(drains[(kind, size)], CLAIM_KEYS)} for kind, size in cycles]
    plots: dict[str, str] = {}
    if o.plots:
        from queuectl.bench.cost_plots import plot_backlog, plot_payload

        if backlog_points:
            plots["backlog"] = plot_backlog(Path(f"{o.plots}-backlog.png"), backlog_points, o)
        if payload_points:
            plots["payload"] = plot_payload(Path(f"{o.plots}-payload.png"), payload_points, o)
    else:
        unavailable.append({"subject": "plots", "reason": "no --plots or --json file to put them beside"})
    notes = cost_notes(run, backlogs, fills)
    return {
        "name": "cost",
        "description": "claim+ack cost per message as the backlog grows, and the full cycle per payload size",
        "notes": notes,
        "ceilings": [],
        "rows": [*(backlog_row(p, o) for p in backlog_points), *(row for p in payload_points for row in payload_rows(p, o))],
        "targets": cost_targets(backlog_points, ledger),
        "unavailable": unavailable,
        "cost": {"backlogs": backlogs, "sizes": list(o.sizes), "items": o.items, "batch": o.batch,
                 "payload_bytes": o.payload_bytes, "fills": fills, "backlog": backlog_points,
                 "payload": payload_points, "ledger": ledger, "plots": plots},
    }


def backlog_ledger(run: BenchRun, driver: str, rows: int, q: dict[str, Any]) -> dict[str, Any]:
    """What a backlog queue holds against what the bench put in and took out: every message
    claimed was acked, and the ready count is what was filled less what was claimed."""
    from queuectl.stats import queue_counts

    names = q["names"]
    with run.engine.connect() as conn:
        counts = queue_counts(conn, names.queue, q["kind"], names.schema)
    return {"kind": driver, "rows": rows, "expected_ready": q["ready"], "ready": int(counts["ready"]),
            "processing": int(counts["processing"]), "scheduled": int(counts["scheduled"]),
            "left": left_in_queue(run, names, q["kind"])}


def backlog_point(kind: str, rows: int, claims: dict[tuple[str, int], list[dict[str, Any]]],
                  backlogs: list[int]) -> dict[str, Any]:
    """One backlog size's claim+ack figures, and its cost per message over the smallest
    backlog's, repeat by repeat: wall time, server time and buffers."""
    values = claims[(kind, rows)]
    smallest = claims[(kind, backlogs[0])]

    def over(key: str) -> dict[str, Any]:
        return stat([ratio(a[key], b[key]) for a, b in zip(values, smallest)])

    return {"kind": kind, "rows": rows, **medians(values, CLAIM_KEYS), "over_smallest": over("us_per_msg"),
            "server_over_smallest": over("server_us_per_msg"), "buffers_over_smallest": over("buffers_per_msg"),
            "ready_start": [v["ready_start"] for v in values], "ready_end": [v["ready_end"] for v in values]}


def backlog_row(p: dict[str, Any], o: Any) -> dict[str, Any]:
    return {
        "subject": f"queuectl {p['kind']}", "phase": f"claim+ack at {p['rows']:,} ready",
        "params": {"kind": p["kind"], "batch": o.batch, "producers": 0, "consumers": 1,
                   "payload_bytes": o.payload_bytes, "ready_rows": p["rows"], "items": o.items},
        "rate": p["rate"], "ceiling": None, "fraction_of_ceiling": None, "latency_ms": None,
        "metrics": {k: p[k] for k in ("us_per_msg", "over_smallest", "server_us_per_msg", "server_over_smallest",
                                      "buffers_per_msg", "buffers_over_smallest", "wal_bytes_per_msg")},
    }


def payload_rows(p: dict[str, Any], o: Any) -> list[dict[str, Any]]:
    cyc, drain = p["cycle"], p["claim_ack"]
    common = {"kind": p["kind"], "batch": o.batch, "payload_bytes": p["payload_bytes"]}
    return [
        {"subject": f"queuectl {p['kind']}", "phase": "full-cycle",
         "params": {**common, "producers": o.producers, "consumers": o.consumers},
         "rate": cyc["rate"], "ceiling": None, "fraction_of_ceiling": None,
         "latency_ms": {"p50": cyc["p50_ms"], "p99": cyc["p99_ms"]},
         "metrics": {k: cyc[k] for k in ("mb_per_s", "enqueue_wal_per_msg", "claim_ack_wal_per_msg", "wal_per_msg")}},
        {"subject": f"queuectl {p['kind']}", "phase": f"claim+ack, drain of {p['items']:,}",
         "params": {**common, "producers": 0, "consumers": 1, "items": p["items"]},
         "rate": drain["rate"], "ceiling": None, "fraction_of_ceiling": None, "latency_ms": None,
         "metrics": {k: drain[k] for k in ("us_per_msg", "buffers_per_msg", "wal_bytes_per_msg", "server_us_per_msg")}},
    ]


def cost_targets(points: list[dict[str, Any]], ledger: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for kind in dict.fromkeys(p["kind"] for p in points):
        mine = [p for p in points if p["kind"] == kind]
        if len(mine) < 2:
            continue
        last = mine[-1]
        value = last["over_smallest"]["median"]
        server, buffers = last["server_over_smallest"]["median"], last["buffers_over_smallest"]["median"]
        verdict = ("wall time of one consumer; the same ratio of the server's time in the claim and ack calls: "
                   + ("-" if server is None else f"{server:.2f}x") + ", of their shared buffers: "
                   + ("-" if buffers is None else f"{buffers:.2f}x"))
        out.append({"name": f"{kind}: claim+ack cost per message at {last['rows']:,} ready / at {mine[0]['rows']:,}",
                    "value": value, "threshold": BACKLOG_COST_RATIO, "comparison": "<=",
                    "met": None if value is None else value <= BACKLOG_COST_RATIO, "verdict": verdict})
    if ledger:
        off = float(sum(abs(e["ready"] - e["expected_ready"]) + e["processing"] for e in ledger))
        out.append({"name": "backlog messages unaccounted for (ready count vs filled - claimed, claimed not acked)",
                    "value": off, "threshold": 0.0, "comparison": "<=", "met": off == 0})
    return out


def cost_notes(run: BenchRun, backlogs: list[int], fills: list[dict[str, Any]]) -> list[str]:
    o = run.options
    notes = [
        f"claim+ack: one consumer process claims dequeue({o.batch}) and acks, {o.items:,} messages per point after a "
        f"warm-up of {WARMUP_CALLS} calls; us/msg is its wall time per message; buffers (shared hit + read), WAL "
        "and server time per message are those of its claim and ack calls (pg_stat_statements, deltas)",
        f"backlog: a queue per size of {o.payload_bytes:,} B messages, filled through its own enqueue_many with "
        "server-built arrays, topped up before each repeat to size + items, then VACUUM (ANALYZE, INDEX_CLEANUP ON), "
        "so each repeat's claims start from a clean queue and run the backlog from size + items down to size; "
        "x smallest: us/msg over the smallest backlog's in the same repeat (x srv, x buf: the same for the server "
        "time and the buffers); every backlog is kept for the run",
        f"payload: per size and repeat, a fresh queue: full cycle of {o.producers} producers + {o.consumers} "
        f"consumers at batch {o.batch} for {o.seconds:g} s (producers pause above {o.backlog:,} waiting); MB/s "
        "is payload bytes (10^6) completed per second; WAL/msg is the enqueue calls' WAL per message enqueued "
        "plus the claim and ack calls' per message claimed (excludes autovacuum and checkpoints' own writes); "
        f"then a fresh queue of {o.items:,} messages drained by the one-consumer claim+ack",
    ]
    for f in fills:
        notes.append(f"fill {f['kind']} {f['rows']:,} x {f['payload_bytes']:,} B: {f['seconds']:,.1f} s "
                     f"({f['rows_per_s']:,.0f} msgs/s, {f['chunk_rows']:,} per call), tables {f['table_bytes'] / MB:,.0f} MB"
                     + ("" if f["wal_bytes"] is None else f", WAL {f['wal_bytes'] / MB:,.0f} MB")
                     + f"; VACUUM (ANALYZE) {f['vacuum_seconds']:,.1f} s")
    return notes
