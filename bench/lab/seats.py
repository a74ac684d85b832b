"""Probe: "seats", a wake-one protocol for idle consumers, against the Worker's committed wait, in one full cycle.

    python bench/lab/seats.py [--url URL] [--pgdata DIR] [--counts 4,32] [--loops committed,seat1,seat1w50,seat1e,seat1t]
                              [--seconds 5] [--repeats 3] [--seat-wait-ms 1000] [--json FILE]

The full cycle of `queuectl bench --scenario consumers` (2 producers enqueue_many of 10, N
consumers take 10 and ack, the reliable kind, 300-byte payloads, the bench's backlog bound)
with the consumers' loop one of:
  committed  the bench's consumer, which waits as queuectl's Worker does (IdleWait: a LISTEN
             session of its own per consumer, wait_begin / wait_end, the outrun rule);
  seatK      sql/postgresql/bench.sql seats_create's procedure, K seats per queue: a seat is
             a session-level exclusive advisory lock; its holder alone is registered and
             LISTENs (one connection: the claims, the seat, the LISTEN and the acks), the
             others wait for it blocked in the server (lock_timeout --seat-wait-ms), and a
             release wakes the next waiter. A consumer whose take was a full batch looks
             again at once; an empty take queues for the seat in the same call; a partial
             take queues at its next call. Each consumer queues for seat pid % K. A
             consumer that waited --seat-wait-ms in line without getting the seat sleeps
             the Worker's poll back-off (50 ms, doubling to 2 s) before queuing again.
  seatKwM    the same with M ms in line at most (e.g. seat1w50): the line stays short, the
             consumers that just finished a batch take the seat, the others sleep.
  seatKe     an empty look-first returns ('empty'), and the consumer queues with a CALL of
             its own: one more round trip, the baseline of seatKt.
  seatKt     as seatKe, but the consumer queues with seats_line_call: a top-level LOCK TABLE
             on a line table, which waits without a snapshot (a wait inside a procedure
             holds one, and so the xmin horizon: the claims walk the index entries of every
             row claimed meanwhile); only the line's head waits for the seat itself.
  seat...k   (e.g. seat1k, seat1tk) a holder whose take left no READY row behind keeps the
             seat, its registration and its LISTEN while it finishes the batch, then sleeps
             on its socket: no hand-over per batch while one consumer keeps up.
  seat...d   (e.g. seat1d) at most one consumer waits for the seat (it holds a "deck" lock
             meanwhile); one that finds the deck taken sleeps the poll back-off: a line of
             one, of the consumer that went idle last.
Each repeat runs every count with every loop in turn (loops alternate within a count).
Per run: msgs/s, the server's CPU per 1,000 messages (every process of the local server,
as bench/lab/consumers_cpu.py reads it), the consumers' and producers' own CPU per 1,000,
the statements per batch taken (pg_stat_statements, top level: dequeue, ack, enqueue_many,
wait_begin, wait_end, the seat CALL), the shared buffers those statements hit per batch,
what the loops did (their counts), the load average, and samples (every 0.1 s) of how
many sessions hold a seat, wait for one, are registered in "waiting", and the oldest
snapshot (xids) a client backend holds: a consumer waiting for a seat holds one.
On a machine shared with other work read the CPU per message as well as the rate.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import statistics
import threading
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from consumers_cpu import server_cpu

from queuectl.bench.core import BenchOptions, BenchRun, load_average
from queuectl.bench.drivers import LEASE_SECONDS, bench_sql, driver_for
from queuectl.bench.workers import (
    LATENCY_SAMPLE, STAMP, STOP_CHECK_SECONDS, WorkerSpec, run_loop, run_worker, warm_up_consumer,
)
from queuectl.engine.embedded import default_home
from queuectl.worker import IN_FLIGHT_FIRST_WAIT, PollBackoff

KIND = "reliable"
QUEUE = "bench_seats"
STATEMENTS = ("dequeue", "ack", "enqueue_many", "wait_begin", "wait_end", "seat")
SAMPLE_EVERY = 0.1


@dataclass(frozen=True)
class SeatSpec(WorkerSpec):
    loop: str = "committed"  # "committed" or "seat"
    seats: int = 1
    seat_wait_ms: int = 1000
    line: str = "proc"  # how a consumer queues for the seat: "proc", "empty" or "table" (seat_loop)
    keep: bool = False  # a holder that took the last READY rows keeps the seat (seat_loop's "k")
    deck: bool = False  # at most one consumer waits for the seat (seat_loop's "d")


def seat_values(names: Any) -> dict[str, str | int]:
    return {**names.template_values(), "seat_proc": names.qualified("dequeue_seated"),
            "seat_line": names.qualified("seat_line")}


def seat_loop(loop: str, default_wait_ms: int) -> tuple[int, int, str, bool, bool]:
    """(seats, seat_wait_ms, line, keep, deck) of a --loops name: "seat2" (2 seats, the default
    wait), "seat1w50" (1 seat, 50 ms in line at most); then "e": an empty look-first returns
    and the consumer queues with a CALL of its own (mode 1), or "t": it queues with
    seats_line_call (no snapshot held in line); then "k": a holder that took the last READY
    rows keeps the seat; "d": at most one consumer waits for the seat (the deck), the others
    sleep; "committed": (1, default, "proc", False, False)."""
    if not loop.startswith("seat"):
        return 1, default_wait_ms, "proc", False, False
    body, deck = loop[4:].removesuffix("d"), loop.endswith("d")
    body, keep = body.removesuffix("k"), body.endswith("k")
    line = "proc"
    if body[-1] in "et":
        body, line = body[:-1], {"e": "empty", "t": "table"}[body[-1]]
    seats, _, wait = body.partition("w")
    return int(seats), int(wait) if wait else default_wait_ms, line, keep, deck


def run_target(spec: SeatSpec, ready: Any, go: Any, stop: Any, results: Any, backlog: Any) -> None:
    """Worker process entry: producers and the committed consumers are the bench's own."""
    if spec.role == "producer" or spec.loop == "committed":
        run_worker(spec, ready, go, stop, results, backlog)
    else:
        run_loop(spec, ready, go, stop, results, lambda session: _seat_consumer(session, spec, backlog))


def _drain(conn: Any) -> int:
    return sum(1 for _ in conn.notifies(timeout=0.0))


def _seat_consumer(session: Any, spec: SeatSpec, backlog: Any):
    from queuectl.names import QueueNames

    queue = session.queue
    warm = 0
    if spec.warmup:
        warm = warm_up_consumer(session, spec.batch)
        backlog.add(warm)
    conn = queue._conn.connection.driver_connection  # the client's own autocommit session
    assert conn.autocommit
    values = seat_values(QueueNames(spec.queue, spec.schema))
    sql, line_sql = bench_sql("seats_call", values), bench_sql("seats_line_call", values)
    look_first = 0 if spec.line == "proc" else 6
    params = {"batch": spec.batch, "lease": LEASE_SECONDS, "worker": queue.worker, "mode": 0,
              "seat": os.getpid() % spec.seats, "wait_ms": spec.seat_wait_ms, "keep": spec.keep,
              "deck": spec.deck}
    counts = {"work_takes": 0, "full_takes": 0, "partial_takes": 0, "line": 0, "listen": 0, "soon": 0, "unreg": 0,
              "empty": 0, "full": 0, "kept": 0, "kept_soon": 0, "notifications": 0, "notified_takes": 0}
    params["mode"] = look_first

    def step() -> tuple[str, Any, Any]:
        if params["mode"] != 1 or spec.line != "table":
            return conn.execute(sql, params).fetchone()
        cur = psycopg.ClientCursor(conn)  # values merged here: a simple-query message of several statements
        try:
            cur.execute(line_sql, params)
        except psycopg.errors.LockNotAvailable:
            conn.execute("ROLLBACK")
            return "line", None, None
        row = None
        while True:
            if cur.description is not None:
                row = cur.fetchone()
            if not cur.nextset():
                return row

    backoff, in_flight, line = PollBackoff(), PollBackoff(IN_FLIGHT_FIRST_WAIT), PollBackoff()
    stop = yield warm
    latencies = array("d")
    count = 0
    t_start = time.time()
    t_end = t_start
    unpack = STAMP.unpack_from
    notified = False
    while not stop.is_set():
        state, ids, payloads = step()
        counts["notified_takes"] += notified
        notified = False
        if state in ("work", "kept", "kept_soon"):
            queue.ack(ids)
            n = len(ids)
            backlog.add(n)
            now = time.time()
            t_end = now
            count += n
            latencies.extend(now - unpack(p)[0] for p in payloads)
            counts["work_takes"] += 1
            counts["full_takes" if n >= spec.batch else "partial_takes"] += 1
            backoff.reset()
            in_flight.reset()
            line.reset()
            if state == "work":
                params["mode"] = look_first if n >= spec.batch else 1
                continue
        counts[state] += 1
        if state == "empty":
            params["mode"] = 1
            continue
        if state in ("line", "full"):  # waited seat_wait_ms in line, or the deck is taken: sleep the line's back-off
            params["mode"] = 1
            stop.wait(line.next_wait())
            continue
        if state in ("listen", "kept"):  # kept: still seated and armed after its batch
            params["mode"], seconds = 2, backoff.next_wait()
        else:  # "soon", "kept_soon": registered, an enqueue that may have missed it is open; "unreg": not registered
            params["mode"], seconds = (4 if state == "unreg" else 3), in_flight.next_wait()
        got = _drain(conn)  # what came in with the reply: its rows may be newer than the look
        if not got:
            deadline = time.monotonic() + seconds
            while not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if select.select([conn.fileno()], [], [], min(left, STOP_CHECK_SECONDS))[0]:
                    got = _drain(conn)
                    if got:
                        break
        if got:
            counts["notifications"] += got
            backoff.reset()
            notified = True
    sample = list(latencies)
    if len(sample) > LATENCY_SAMPLE:
        sample = random.Random(spec.seed).sample(sample, LATENCY_SAMPLE)
    yield {"count": count, "t_start": t_start, "t_end": t_end, "latencies": sample, "observed": len(latencies),
           "idle": counts}


class Sampler(threading.Thread):
    """Samples seats_sample every SAMPLE_EVERY seconds on a connection of its own."""

    def __init__(self, run: BenchRun, values: dict[str, str | int]) -> None:
        super().__init__(daemon=True)
        self.sql = bench_sql("seats_sample", values)
        self.raw = run.engine.raw_connection()
        self.conn = self.raw.driver_connection
        self.conn.autocommit = True
        self.rows: list[tuple[int, int, int, int]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(SAMPLE_EVERY):
            seated, in_line, registered, xmin_age = self.conn.execute(self.sql).fetchone()
            self.rows.append((seated, in_line, registered, xmin_age or 0))

    def summary(self) -> dict[str, Any]:
        self.halt.set()
        self.join()
        self.raw.close()
        if not self.rows:
            return {}
        cols = list(zip(*self.rows))
        return {key: {"median": statistics.median(col), "max": max(col)}
                for key, col in zip(("seated", "in_line", "registered", "xmin_age_xids"), cols)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=None)
    parser.add_argument("--pgdata", type=Path, default=None, help="the local server's data directory")
    parser.add_argument("--counts", default="4,32")
    parser.add_argument("--loops", default="committed,seat1,seat2")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seat-wait-ms", type=int, default=1000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    pgdata = args.pgdata or default_home() / "pgdata"
    postmaster = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    counts = [int(n) for n in args.counts.split(",")]
    loops = args.loops.split(",")
    run = BenchRun(BenchOptions(kinds=[KIND], producers=2, consumers=max(counts), batch=10, pgbench=False,
                                seconds=args.seconds, url=args.url))
    names = run.names(QUEUE)
    driver = driver_for(KIND)
    driver.install(run.engine, names)
    values = seat_values(names)
    raw = run.engine.raw_connection()
    raw.driver_connection.execute(bench_sql("seats_create", values))
    raw.driver_connection.commit()
    raw.close()
    functions = {key: names.template_values()[f"fn_{key}"] for key in STATEMENTS if key != "seat"}
    functions["seat"] = str(values["seat_proc"])
    if not run.pgss_available():
        raise SystemExit("pg_stat_statements is needed (shared_preload_libraries)")
    out: list[dict[str, Any]] = []
    try:
        for repeat in range(args.repeats):
            for n in counts:
                for loop in loops:
                    seats, wait_ms, line, keep, deck = seat_loop(loop, args.seat_wait_ms)
                    common = dict(driver=KIND, url=run.url, queue=names.queue, schema=names.schema, batch=10,
                                  payload_bytes=300, loop="seat" if loop.startswith("seat") else "committed",
                                  seats=seats, seat_wait_ms=wait_ms, line=line, keep=keep, deck=deck)
                    specs = [SeatSpec(role="producer", seed=1000 + i, **common) for i in range(2)]
                    specs += [SeatSpec(role="consumer", seed=2000 + i, **common) for i in range(n)]
                    with run.engine.connect() as conn:
                        driver.reset(conn, names)
                    before = {key: run.pgss_calls(fn) for key, fn in functions.items()}
                    load = load_average()[:1]
                    cpu = server_cpu(postmaster)
                    sampler = Sampler(run, values)
                    sampler.start()
                    res = run.run_processes(run_target, specs, "cycle", args.seconds)
                    sampled = sampler.summary()
                    time.sleep(0.5)  # the workers' sessions end and are reaped
                    server = server_cpu(postmaster) - cpu
                    after = {key: run.pgss_calls(fn) for key, fn in functions.items()}
                    batches = res["idle"].get("work_takes") or 1
                    per_1k = 1000 / max(res["messages"], 1)
                    calls = {key: round((after[key]["calls"] - before[key]["calls"]) / batches, 2) for key in functions}
                    hits = sum(after[key]["shared_blks_hit"] - before[key]["shared_blks_hit"] for key in functions)
                    row = {"repeat": repeat + 1, "consumers": n, "loop": loop, "rate": round(res["rate"]),
                           "p50_ms": res["p50_ms"], "p99_ms": res["p99_ms"], "load_1min": load,
                           "server_cpu_per_1k": round(server * per_1k, 4),
                           "consumer_cpu_per_1k": round(res["cpu_seconds"]["consumer"] * per_1k, 4),
                           "producer_cpu_per_1k": round(res["cpu_seconds"]["producer"] * per_1k, 4),
                           "statements_per_batch": round(sum(calls.values()), 2), "calls_per_batch": calls,
                           "buffer_hits_per_batch": round(hits / batches, 1),
                           "loop_per_batch": {k: round(v / batches, 3) for k, v in res["idle"].items()},
                           "sampled": sampled, "sent_total": res["sent_total"], "taken_total": res["taken_total"]}
                    out.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        raw = run.engine.raw_connection()
        raw.driver_connection.execute(bench_sql("seats_drop", values))
        raw.driver_connection.commit()
        raw.close()
        driver.uninstall(run.engine, names)
        run.close()
    summary = {}
    for n in counts:
        for loop in loops:
            rows = [r for r in out if r["consumers"] == n and r["loop"] == loop]
            if rows:
                summary[f"{loop}@{n}"] = {key: statistics.median(r[key] for r in rows)
                                          for key in ("rate", "server_cpu_per_1k", "consumer_cpu_per_1k",
                                                      "statements_per_batch")}
    print(json.dumps({"medians": summary}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args) | {"pgdata": str(pgdata)}, "runs": out,
                                               "medians": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
