"""Scenario `ring`: the ring buffer against one-table insert/delete queues.

Two one-table queues, the designs a ring is usually weighed against:
- `lean` (bench-only, sql/postgresql/bench.sql lean_*): the common hand-written "one
  table" queue, the design the ring's 2x goal at batch 10 is set against: a row per message with status and
  lease, the pick FOR UPDATE SKIP LOCKED and the claim UPDATE in one statement, a DELETE at
  ack; three transactions per batch (enqueue, dequeue, ack), plain statements.
- `fifo`: queuectl's lax fifo kind: INSERT at enqueue and one `DELETE ... RETURNING`
  (FOR UPDATE SKIP LOCKED pick) at dequeue, the "destructive" design, faster than the
  lean one table (two transactions per batch, as the ring's), so beating it is the harder
  test; the result's ring_vs_one_table metric is against it.
The ring is the `ring` kind: preallocated slots, UPDATE only.

Per batch size (--batches, default 1, 10, 100) each design gets a fresh queue and runs
the full cycle (--producers and --consumers processes at once, producers pausing above
--backlog waiting messages) for --seconds. Afterwards the parent drains what is left and
balances the ledger: every message any producer sent (warm-up included) against every
message any consumer took plus the drain. Lost = sent - taken; orphaned = messages still
in the queue after the drain (for the ring: FULL slots no pop will ask for; ring_repair then
brings them back, and lost counts what it did not). Both must be 0.

--soak SECONDS then runs the same full cycle (batch --batch, default 10) for SECONDS for the
fifo kind and the ring, sampling the table's total size, each index's size and the HOT share of its
updates (n_tup_hot_upd / n_tup_upd from pg_stat_user_tables) at regular intervals. The
ring's first lap fills slots that were created empty (no payload), so its size is judged
from the first sample after the ring has gone round once; the one-table queue from its
first sample.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import sqlalchemy as sa

from queuectl.bench.core import BenchRun, ratio, scenario, stat
from queuectl.bench.drivers import bench_sql, driver_for
from queuectl.bench.pgbench import PgbenchUnavailable
from queuectl.kindspec import kind_template_values
from queuectl.names import QueueNames

DESIGNS = (("lean", "bring_lean", "one table (claim, DELETE at ack)"),
           ("fifo", "bring_fifo", "one table (fifo kind)"), ("ring", "bring_ring", "ring buffer"))
SOAK_DESIGNS = tuple(d for d in DESIGNS if d[0] in ("fifo", "ring"))  # the soak: ring vs the fifo kind
DRAIN_BATCH = 1000
SOAK_SAMPLES = 10  # samples per soak (at least one every second, at most one every 60 s)
RING_SPEEDUP_SAME_BATCH = 2.0  # ring vs one table, both at batch 10
RING_SPEEDUP_HEADLINE = 10.0  # ring at batch 100 vs one table at batch 1
HOT_RATIO = 0.99


def ring_size_for(run: BenchRun) -> int:
    """Slots for the bench ring: room for twice the backlog plus every worker's batch in
    flight, so a push never waits on a full ring (which would measure the backlog, not the
    ring), rounded up to a power of two."""
    o = run.options
    need = 2 * (int(o.backlog or 0) + (o.producers + o.consumers) * max([o.batch, *o.batches]))
    size = 64
    while size < need:
        size *= 2
    return size


def _install(run: BenchRun, design: str, names: QueueNames, size: int) -> None:
    if design == "ring":
        driver_for(design).install(run.engine, names, size)
    else:
        driver_for(design).install(run.engine, names)


def _drain(run: BenchRun, design: str, names: QueueNames) -> int:
    session = driver_for(design).open(run.url, names)
    drained = 0
    try:
        while True:
            payloads, _ = session.take(DRAIN_BATCH)
            if not payloads:
                return drained
            drained += len(payloads)
    finally:
        session.close()


def _drain_and_balance(run: BenchRun, design: str, names: QueueNames, phase: dict[str, Any]) -> dict[str, int]:
    """Take everything left, then compare the ledger: sent vs taken, and what stayed behind.

    A ring message left FULL at a position no pop will ask for again is orphaned. Since
    ring_0002 a consumer's close (ring_release) re-pushes the one a closing consumer used to
    leave behind (its push committed between the consumer's last empty pop and the release),
    so a normal run orphans none; a consumer that dies without closing, or a rescue on a
    ring that stays full, still would. Those are counted as orphaned, then ring_repair
    (grace 0: every worker has stopped) re-pushes them and a second drain takes them; lost
    counts what even that did not bring back."""
    driver = driver_for(design)
    drained = _drain(run, design, names)
    with run.engine.connect() as conn:
        orphaned = driver.ready(conn, names)
    repaired = 0
    if orphaned and design == "ring":
        from queuectl.client import repair_ring

        repair_ring(run.engine, names.queue, schema=names.schema, grace=0.0)
        repaired = _drain(run, design, names)
    with run.engine.connect() as conn:
        left = driver.ready(conn, names)
    sent, taken = phase["sent_total"], phase["taken_total"] + drained + repaired
    return {"sent": sent, "taken": taken, "drained": drained, "orphaned": orphaned, "repaired": repaired,
            "lost": sent - taken - left}


@scenario("ring", "ring buffer vs a one-table insert/delete queue per batch size; --soak: sizes and HOT over time",
          ("producers", "consumers", "batch", "batches", "payload_bytes", "seconds", "soak", "backlog"))
def ring(run: BenchRun) -> dict[str, Any]:
    o = run.options
    P, C = o.producers, o.consumers
    size = ring_size_for(run)
    unavailable: list[dict[str, str]] = []
    commit: list[float | None] = []
    cells: dict[tuple[str, int], dict[str, list[Any]]] = {
        (d, b): {"rate": [], "p50": [], "p99": [], "lost": [], "orphaned": [], "repaired": [], "messages": [],
                 **{k: [] for k in PROFILE_KEYS}}
        for d, _, _ in DESIGNS for b in o.batches
    }
    have_pgss = run.pgss_available()
    if not have_pgss:
        unavailable.append({"subject": "server time and buffers per message",
                            "reason": "pg_stat_statements is not available (needs shared_preload_libraries and CREATE EXTENSION)"})
    _install(run, "fifo", run.names("bring_fifo"), size)  # the schema, before the ceiling's table
    steps = o.repeat * (1 + len(DESIGNS) * len(o.batches)) + (len(SOAK_DESIGNS) if o.soak else 0)
    soak: dict[str, Any] = {}
    with run.reporter.scenario("ring", steps) as rep:
        for r in range(o.repeat):
            rep.step(f"repeat {r + 1}: single-row commit ceiling, {P + C} clients")
            try:
                commit.append(run.ceiling("commit", P + C))
            except PgbenchUnavailable as exc:
                commit.append(None)
                if not unavailable:
                    unavailable.append({"subject": "single-row commit ceiling", "reason": str(exc)})
            rep.done()
            for batch in o.batches:
                for design, queue, _ in DESIGNS:
                    rep.step(f"repeat {r + 1}: {design}, batch {batch}")
                    names = run.names(queue)
                    _install(run, design, names, size)
                    patterns = _profiled_statements(names, design)
                    before = _server_totals(run, patterns) if have_pgss else None
                    res = run.python_phase(design, names, "cycle", batch=batch, payload_bytes=o.payload_bytes,
                                           producers=P, consumers=C, seconds=o.seconds)
                    after = _server_totals(run, patterns) if have_pgss else None
                    ledger = _drain_and_balance(run, design, names, res)
                    cell = cells[(design, batch)]
                    for key, value in _profile(before, after, res, P + C).items():
                        cell[key].append(value)
                    cell["rate"].append(res["rate"])
                    cell["p50"].append(res["p50_ms"])
                    cell["p99"].append(res["p99_ms"])
                    cell["lost"].append(ledger["lost"])
                    cell["orphaned"].append(ledger["orphaned"])
                    cell["repaired"].append(ledger["repaired"])
                    cell["messages"].append(ledger["sent"])
                    driver_for(design).uninstall(run.engine, names)
                    rep.done()
        if o.soak:
            for design, queue, _ in SOAK_DESIGNS:
                rep.step(f"soak: {design}, batch {o.batch}, {o.soak:g} s")
                soak[design] = _soak(run, design, run.names(queue), size)
                rep.done()
    rows = []
    for batch in o.batches:
        for design, _, label in DESIGNS:
            cell = cells[(design, batch)]
            metrics = {
                "fraction_of_commit_ceiling": stat([ratio(a, b) for a, b in zip(cell["rate"], commit)]),
                "messages_sent": stat(cell["messages"]),
                "lost": stat(cell["lost"]),
                "orphaned": stat(cell["orphaned"]),
                "repaired": stat(cell["repaired"]),
                **{key: stat(cell[key]) for key in PROFILE_KEYS},
            }
            if design == "ring":
                # ring_vs_one_table: against the fifo kind, the stricter comparison
                metrics["ring_vs_one_table"] = stat(
                    [ratio(a, b) for a, b in zip(cell["rate"], cells[("fifo", batch)]["rate"])]
                )
                metrics["ring_vs_claim_delete"] = stat(
                    [ratio(a, b) for a, b in zip(cell["rate"], cells[("lean", batch)]["rate"])]
                )
            rows.append({
                "subject": label, "phase": "full-cycle",
                "params": {"kind": design, "batch": batch, "producers": P, "consumers": C,
                           "payload_bytes": o.payload_bytes, "ring_size": size if design == "ring" else None},
                "rate": stat(cell["rate"]),
                "ceiling": {"name": f"single-row commits via pgbench ({P + C} clients)", "rate": stat(commit)},
                "fraction_of_ceiling": stat([ratio(a, b) for a, b in zip(cell["rate"], commit)]),
                "latency_ms": {"p50": stat(cell["p50"]), "p99": stat(cell["p99"])},
                "metrics": metrics,
            })
    return {
        "name": "ring",
        "description": "ring buffer vs one-table insert/delete queues: full cycle per batch size",
        "notes": [
            "one table (claim, DELETE at ack) = the lean one-table queue (bench.sql lean_*): INSERT at "
            "enqueue; a dequeue call picks FOR UPDATE SKIP LOCKED and claims by UPDATE (status, lease) in one "
            "statement; an ack call DELETEs the batch: three transactions per batch, plain statements",
            "one table (fifo kind) = the lax fifo kind: INSERT at enqueue, one DELETE ... RETURNING (SKIP LOCKED "
            "pick) per dequeue call: two transactions per batch, as the ring's; ring x fifo is the stricter "
            "comparison (ring_vs_one_table); ring = the ring kind, UPDATE only, "
            f"{size:,} slots (twice the backlog plus every worker's batch in flight, so pushes never wait)",
            f"full cycle: {P} producers and {C} consumers at once; producers pause while more than "
            f"{o.backlog:,} messages wait (--backlog); latency is from the producer's clock before enqueue to "
            "the consumer's clock after its dequeue returned",
            "ledger after each phase: the parent drains what is left; orphaned = still in the queue after that "
            "drain (ring: FULL slots at positions a closing consumer had claimed, which no pop asks for again); "
            "ring_repair (grace 0) then re-pushes them and a second drain takes them (repaired); lost = sent - "
            "taken - left at the end",
            "SQL ceiling: single-row commits (INSERT, autocommit) at producers+consumers clients via pgbench",
            "profile per phase (pg_stat_statements deltas of the top-level enqueue and dequeue calls, messages = "
            "all sent incl. warm-up): server us/msg = execution time inside the server (the functions' statements "
            "and any wait inside them, e.g. a ring pop backing off for an unpushed position; not the commit's WAL "
            "flush); buf/msg = shared buffers hit + read; in server = that execution time over the workers' wall "
            "time (workers x phase seconds): the rest is commit, round trips and the Python client",
        ] + ([_soak_note(o.soak, o.batch)] if o.soak else []),
        "display_metrics": [["lost", "lost"], ["orphaned", "orphaned"], ["repaired", "repaired"],
                            ["push us/msg", "server_us_per_push"], ["pop us/msg", "server_us_per_pop"],
                            ["buf/msg", "buffers_per_message"], ["in server", "fraction_worker_time_in_server"],
                            ["ring x claim+delete", "ring_vs_claim_delete"], ["ring x fifo", "ring_vs_one_table"]],
        "ceilings": [{"name": "single-row commits", "clients": P + C, "unit": "statements/s", "rate": stat(commit)}],
        "rows": rows,
        "targets": _targets(cells, o.batches, soak),
        "unavailable": unavailable,
        "soak": soak,
    }


PROFILE_KEYS = ("server_us_per_push", "server_us_per_pop", "buffers_per_message", "fraction_worker_time_in_server")


def _profiled_statements(names: QueueNames, design: str) -> dict[str, list[str]]:
    """LIKE patterns of the top-level statements the design's client runs for a push (one or
    many) and for a pop (with its ack, for the one table that has one)."""
    if design == "lean":  # plain statements, found by their own text
        return {"push": [_statement_pattern("lean_enqueue_many", names)],
                "pop": [_statement_pattern("lean_dequeue", names), _statement_pattern("lean_ack", names)]}
    values = kind_template_values(names, design)
    return {"push": [f"%{values['fn_enqueue']}(%", f"%{values['fn_enqueue_many']}(%"],
            "pop": [f"%{values['fn_dequeue']}(%"]}


def _statement_pattern(section: str, names: QueueNames) -> str:
    """A LIKE pattern for a bench.sql statement as pg_stat_statements keeps it: the text the
    session sends, up to its first parameter or constant (pg_stat_statements writes those
    as $n), with LIKE's wildcards escaped."""
    text = bench_sql(section, names.template_values())
    prefix = re.split(r":\w|\b\d+\b", text, maxsplit=1)[0]
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _server_totals(run: BenchRun, patterns: dict[str, list[str]]) -> dict[str, list[dict[str, float]]]:
    """pg_stat_statements totals so far of each side's statements (push, pop)."""
    return {side: [run.pgss_like(p) for p in side_patterns] for side, side_patterns in patterns.items()}


def _profile(before: dict[str, list[dict[str, float]]] | None, after: dict[str, list[dict[str, float]]] | None,
             phase: dict[str, Any], workers: int) -> dict[str, float | None]:
    """Server time and buffers per message over one phase, from pg_stat_statements deltas."""
    if before is None or after is None:
        return dict.fromkeys(PROFILE_KEYS)

    def delta(side: str, key: str) -> float:
        return sum(a[key] - b[key] for a, b in zip(after[side], before[side]))

    sent, taken = phase["sent_total"], phase["taken_total"]
    push_ms, pop_ms = delta("push", "total_exec_time"), delta("pop", "total_exec_time")
    buffers = sum(delta(side, k) for side in ("push", "pop") for k in ("shared_blks_hit", "shared_blks_read"))
    wall_ms = phase["seconds"] * workers * 1000.0
    return {
        "server_us_per_push": push_ms * 1000.0 / sent if sent else None,
        "server_us_per_pop": pop_ms * 1000.0 / taken if taken else None,
        "buffers_per_message": buffers / sent if sent else None,
        "fraction_worker_time_in_server": (push_ms + pop_ms) / wall_ms if wall_ms else None,
    }


def _targets(cells: dict[tuple[str, int], dict[str, list[Any]]], batches: list[int], soak: dict[str, Any]) -> list[dict[str, Any]]:
    targets: list[dict[str, Any]] = []
    if 10 in batches:
        for base, label in (("lean", "the lean one-table queue (claim, DELETE at ack)"),
                            ("fifo", "the fifo kind (one DELETE ... RETURNING per dequeue: the stricter comparison)")):
            value = stat([ratio(a, b) for a, b in zip(cells[("ring", 10)]["rate"], cells[(base, 10)]["rate"])])["median"]
            targets.append({"name": f"ring vs {label}, both at batch 10", "value": value,
                            "threshold": RING_SPEEDUP_SAME_BATCH,
                            "met": None if value is None else value >= RING_SPEEDUP_SAME_BATCH})
    if 100 in batches and 1 in batches:
        value = stat([ratio(a, b) for a, b in zip(cells[("ring", 100)]["rate"], cells[("fifo", 1)]["rate"])])["median"]
        targets.append({"name": "ring at batch 100 vs the fifo kind at one message per transaction (batch 1)",
                        "value": value, "threshold": RING_SPEEDUP_HEADLINE,
                        "met": None if value is None else value >= RING_SPEEDUP_HEADLINE})
    soaks = list(soak.values())
    lost = sum(abs(v) for c in cells.values() for v in c["lost"]) + sum(abs(s["ledger"]["lost"]) for s in soaks)
    orphaned = sum(v for c in cells.values() for v in c["orphaned"]) + sum(s["ledger"]["orphaned"] for s in soaks)
    targets.append({"name": "messages lost, all phases and designs (after ring_repair)", "value": float(lost),
                    "threshold": 0.0, "comparison": "<=", "met": lost == 0})
    targets.append({"name": "messages orphaned when consumers closed (left for ring_repair), all phases and designs",
                    "value": float(orphaned), "threshold": 0.0, "comparison": "<=", "met": orphaned == 0})
    ring_soak = soak.get("ring")
    if ring_soak:
        targets.append({"name": f"ring table and index sizes constant over the {ring_soak['seconds']:g} s soak "
                                "(after its first lap)",
                        "value": float(ring_soak["steady_growth_bytes"]) if ring_soak["steady_growth_bytes"] is not None else None,
                        "threshold": 0.0, "comparison": "<=", "met": ring_soak["constant"]})
        for key, label in (("hot_ratio", "over the whole soak"), ("steady_hot_ratio", "after its first lap")):
            hot = ring_soak[key]
            targets.append({"name": f"ring HOT ratio {label} (n_tup_hot_upd / n_tup_upd)", "value": hot,
                            "threshold": HOT_RATIO, "met": None if hot is None else hot >= HOT_RATIO})
    return targets


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _soak_note(seconds: float, batch: int) -> str:
    return (f"soak: the same full cycle at batch {batch} for {seconds:g} s per design; {SOAK_SAMPLES}+ samples of "
            "pg_total_relation_size, pg_relation_size per index and pg_stat_user_tables (HOT = n_tup_hot_upd / "
            "n_tup_upd, counters flushed by backends about once a second); the ring's sizes are judged after its "
            "first lap (its slots are created without payloads)")


def _soak(run: BenchRun, design: str, names: QueueNames, size: int) -> dict[str, Any]:
    """Run the full cycle for --soak seconds while a thread samples the table's sizes."""
    o = run.options
    _install(run, design, names, size)
    values = {**names.template_values(), **kind_template_values(names, design)}
    table = names.qualified("ring" if design == "ring" else "items")
    interval = min(60.0, max(1.0, o.soak / SOAK_SAMPLES))
    samples: list[dict[str, Any]] = []
    done = threading.Event()
    t0 = time.monotonic()

    def sample() -> None:
        with run.engine.connect() as conn:
            row = conn.execute(sa.text(bench_sql("soak_table", {})), {"table": table}).mappings().one()
            indexes = {r.index_name: int(r.bytes) for r in conn.execute(sa.text(bench_sql("soak_indexes", {})), {"table": table})}
            pops = (conn.execute(sa.text(bench_sql("ring_pops", values))).scalar_one() if design == "ring" else None)
            conn.commit()
        samples.append({"t": round(time.monotonic() - t0, 2), **{k: int(v or 0) for k, v in row.items()},
                        "indexes": indexes, "laps": None if pops is None else pops / size})

    def sampler() -> None:
        while not done.wait(interval):
            sample()

    sample()
    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        res = run.python_phase(design, names, "cycle", batch=o.batch, payload_bytes=o.payload_bytes,
                               producers=o.producers, consumers=o.consumers, seconds=o.soak)
    finally:
        done.set()
        thread.join()
    time.sleep(1.1)  # let the workers' last statistics reach pg_stat_user_tables
    sample()
    ledger = _drain_and_balance(run, design, names, res)
    driver_for(design).uninstall(run.engine, names)
    steady = [s for s in samples if design != "ring" or (s["laps"] or 0) >= 1.0]
    growth = (max(s["total_bytes"] for s in steady) - steady[0]["total_bytes"]) if steady else None
    first, last = samples[0], samples[-1]
    upd = last["n_tup_upd"] - first["n_tup_upd"]
    hot = last["n_tup_hot_upd"] - first["n_tup_hot_upd"]
    return {
        "design": design, "seconds": o.soak, "batch": o.batch, "rate": res["rate"], "samples": samples,
        "ring_size": size if design == "ring" else None,
        "start_total_bytes": first["total_bytes"], "end_total_bytes": last["total_bytes"],
        "steady_from_t": steady[0]["t"] if steady else None,
        "steady_growth_bytes": growth,
        # constant: every sample after the first lap has the size of the first such sample
        "constant": bool(steady) and len(steady) >= 2 and all(
            s["total_bytes"] == steady[0]["total_bytes"] and s["indexes"] == steady[0]["indexes"] for s in steady
        ),
        "updates": upd, "hot_updates": hot, "hot_ratio": (hot / upd) if upd else None,
        # the same share from the first steady sample on (the ring's first lap moves rows
        # that were created without payloads to pages with room: those updates cannot be HOT)
        "steady_hot_ratio": _share(last["n_tup_hot_upd"] - steady[0]["n_tup_hot_upd"],
                                   last["n_tup_upd"] - steady[0]["n_tup_upd"]) if steady else None,
        "ledger": ledger,
    }
