"""Built-in scenarios of `queuectl bench --scenario NAME`.

kinds  (default) every --kind: enqueue-only, dequeue-only (drain a pre-filled queue) and
       full cycle through the Python client, each beside the same SQL driven by pgbench,
       with SELECT 1 and single-row commit ceilings at the same client counts.
peers  the full cycle on PgQueuer and Procrastinate beside queuectl and the pgbench
       ceiling of queuectl's own full-cycle SQL (bench/peers.py).
split  one wide table vs the meta/data split per payload size (bench/split.py).
ghosts one consumer drains --rows items, naive fifo vs watermark, with and without a held
       snapshot (bench/ghosts.py).
ring   the ring buffer vs a one-table insert/delete queue per batch size, with a ledger
       check and an optional --soak of sizes and HOT updates over time (bench/ring.py).
sustained  each --kind at a fixed offered rate for --minutes, clean and with the xmin
       horizon held (--hold), sampled over time, with PNG plots (bench/sustained.py).
consumers  each --kind's full cycle and dequeue-only at every --consumer-counts (default
       1,2,4,8,16,32) with 2 producers at batch 10, each point against 4 consumers in the
       same repeat, with a PNG of the curve.
cost   claim+ack cost per message at growing backlogs (--rows), and the full cycle per
       payload size (--sizes), with PNG curves (bench/cost.py).
fanout one fan-out ring with 1, 2, 4 subscriptions vs as many plain rings fed the same
       messages: messages/s per subscription, WAL bytes per message (bench/fanout.py).
"""

from __future__ import annotations

import os
from typing import Any

from queuectl.bench.core import BenchRun, load_average, ratio, scenario, stat, unavailable_once
from queuectl.bench.drivers import driver_for
from queuectl.bench.pgbench import PgbenchUnavailable
from queuectl.errors import UsageError

PHASES = ("enqueue", "dequeue", "cycle")
PHASE_LABEL = {"enqueue": "enqueue-only", "dequeue": "dequeue-only", "cycle": "full-cycle"}
PHASE_CLIENTS = {"enqueue": "producers", "dequeue": "consumers", "cycle": "producers+consumers"}


def bench_queue_name(kind: str) -> str:
    return f"bench_{kind}"


@scenario("kinds", "each --kind: enqueue-only, dequeue-only, full cycle, beside pgbench ceilings",
          ("kinds", "producers", "consumers", "batch", "payload_bytes", "seconds", "backlog"))
def kinds(run: BenchRun) -> dict[str, Any]:
    o = run.options
    P, C, B = o.producers, o.consumers, o.batch
    client_counts = sorted({P, C, P + C})
    notes: list[str] = [
        "dequeue-only: consumers dequeue+ack a queue pre-filled by the enqueue-only phase, with no "
        "producers; its rate is messages / time until the queue was empty or --seconds passed",
        f"full-cycle: producers and consumers at once; producers pause while more than {o.backlog:,} "
        "messages wait (--backlog), so the cycle runs at a steady state like its pgbench twin; latency is "
        "from the producer's clock before enqueue to the consumer's clock after ack",
        "sql (pgbench): the same SQL API calls the Python client makes, from pgbench -M prepared; "
        "its dequeue-only figure is acked rows / server span from first claim to last ack; its full "
        "cycle runs producers+consumers clients that each enqueue a batch, then dequeue and ack one",
    ]
    unavailable: list[dict[str, str]] = []
    rows: list[dict[str, Any]] = []
    ceilings_out: list[dict[str, Any]] = []
    steps = o.repeat * (len(client_counts) * 2 + len(o.kinds) * 2)
    ceilings: dict[tuple[str, int], list[float | None]] = {
        (w, n): [] for w in ("select1", "commit") for n in client_counts
    }
    per_kind: dict[str, dict[str, list[Any]]] = {}
    stats_tables: dict[str, Any] = {}
    for kind in o.kinds:
        driver_for(kind).install(run.engine, run.names(bench_queue_name(kind)))
        per_kind[kind] = {f"{src}_{ph}": [] for src in ("py", "sql") for ph in PHASES}
        per_kind[kind].update(p50=[], p99=[], sql_drained=[])
    with run.reporter.scenario("kinds", steps) as rep:
        for r in range(o.repeat):
            for which in ("select1", "commit"):
                for n in client_counts:
                    rep.step(f"repeat {r + 1}: {which} ceiling, {n} clients")
                    try:
                        ceilings[(which, n)].append(run.ceiling(which, n))
                    except PgbenchUnavailable as exc:
                        ceilings[(which, n)].append(None)
                        unavailable_once(unavailable, f"ceiling {which}", str(exc))
                    rep.done()
            for kind in o.kinds:
                names = run.names(bench_queue_name(kind))
                m = per_kind[kind]
                rep.step(f"repeat {r + 1}: {kind} SQL via pgbench")
                try:
                    sql = run.sql_phases(kind, names, batch=B, payload_bytes=o.payload_bytes, producers=P, consumers=C)
                except PgbenchUnavailable as exc:
                    sql = {}
                    unavailable_once(unavailable, f"sql {kind}", str(exc))
                for ph in PHASES:
                    m[f"sql_{ph}"].append(sql.get(ph))
                m["sql_drained"].append(sql.get("dequeue_drained"))
                rep.done()
                rep.step(f"repeat {r + 1}: {kind} through Python")
                py = python_phases(run, kind, names)
                for ph in PHASES:
                    m[f"py_{ph}"].append(py[ph]["rate"])
                m["p50"].append(py["cycle"]["p50_ms"])
                m["p99"].append(py["cycle"]["p99_ms"])
                rep.done()
    for kind in o.kinds:
        names = run.names(bench_queue_name(kind))
        driver = driver_for(kind)
        stats_tables[kind] = run.table_stats(names, driver.tables(names))
        m = per_kind[kind]
        for ph in PHASES:
            clients = {"enqueue": P, "dequeue": C, "cycle": P + C}[ph]
            fraction = [ratio(a, b) for a, b in zip(m[f"py_{ph}"], m[f"sql_{ph}"])]
            row: dict[str, Any] = {
                "subject": f"queuectl {kind}",
                "phase": PHASE_LABEL[ph],
                "params": {"kind": kind, "batch": B, "producers": P if ph != "dequeue" else 0,
                           "consumers": C if ph != "enqueue" else 0, "payload_bytes": o.payload_bytes,
                           "clients": clients},
                "rate": stat(m[f"py_{ph}"]),
                "ceiling": {"name": f"same SQL via pgbench ({PHASE_CLIENTS[ph]} clients)", "rate": stat(m[f"sql_{ph}"])},
                "fraction_of_ceiling": stat(fraction),
                "latency_ms": {"p50": stat(m["p50"]), "p99": stat(m["p99"])} if ph == "cycle" else None,
                "metrics": {},
            }
            commit = ceilings.get(("commit", clients), [])
            select1 = ceilings.get(("select1", clients), [])
            row["metrics"]["fraction_of_commit_ceiling"] = stat([ratio(a, b) for a, b in zip(m[f"py_{ph}"], commit)])
            row["metrics"]["fraction_of_select1_ceiling"] = stat([ratio(a, b) for a, b in zip(m[f"py_{ph}"], select1)])
            if ph == "dequeue":
                row["metrics"]["sql_queue_drained"] = stat(m["sql_drained"])
            if kind != "reliable" and "reliable" in per_kind:
                # e.g. reliable_adq against the plain reliable consumer loop, repeat by repeat
                row["metrics"]["vs_reliable"] = stat([ratio(a, b) for a, b in zip(m[f"py_{ph}"], per_kind["reliable"][f"py_{ph}"])])
            rows.append(row)
    for (which, n), values in sorted(ceilings.items()):
        ceilings_out.append({
            "name": {"select1": "SELECT 1 round trips", "commit": "single-row commits"}[which],
            "clients": n, "unit": "statements/s", "rate": stat(values),
        })
    return {
        "name": "kinds",
        "description": SCENARIO_TEXT,
        "notes": notes,
        "display_metrics": [["of commits", "fraction_of_commit_ceiling"]]
        + ([["x reliable", "vs_reliable"]] if "reliable" in o.kinds and len(o.kinds) > 1 else []),
        "ceilings": ceilings_out,
        "rows": rows,
        "targets": kinds_targets(run, rows),
        "unavailable": unavailable,
        "table_stats": stats_tables,
    }


SCENARIO_TEXT = "enqueue-only, dequeue-only and full cycle per kind, each beside the same SQL under pgbench"


def python_phases(run: BenchRun, kind: str, names: Any, consumers: int | None = None,
                  upkeep: bool = False) -> dict[str, dict[str, Any]]:
    """The three phases through the kind's client, each on an emptied queue but dequeue-only,
    which drains what enqueue-only left; `consumers` processes (None: --consumers). With
    `upkeep`, the kind's upkeep job (the reliable queue's archive job, which rotates its
    generations) runs beside the full cycle, as the scheduler keeps it running; its result
    is the cycle's "upkeep"."""
    o = run.options
    driver = driver_for(kind)
    common = dict(batch=o.batch, payload_bytes=o.payload_bytes, producers=o.producers,
                  consumers=consumers or o.consumers, seconds=o.seconds)
    out: dict[str, dict[str, Any]] = {}
    with run.engine.connect() as conn:
        driver.reset(conn, names)
    out["enqueue"] = run.python_phase(kind, names, "enqueue", **common)
    out["dequeue"] = run.python_phase(kind, names, "dequeue", **common)
    with run.engine.connect() as conn:
        driver.reset(conn, names)
    from queuectl.bench.sustained import Upkeep, installed_kind

    installed = installed_kind(run, names) if upkeep else kind  # reliable_adq is a reliable queue
    if upkeep and Upkeep.serves(installed):
        with Upkeep(run, names, installed).beside() as job:
            out["cycle"] = run.python_phase(kind, names, "cycle", **common)
        out["cycle"]["upkeep"] = job.result
    else:
        out["cycle"] = run.python_phase(kind, names, "cycle", **common)
    with run.engine.connect() as conn:
        driver.reset(conn, names)
    return out


def kinds_targets(run: BenchRun, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets (goals per figure) that this run's parameters speak to."""
    o = run.options
    targets = []
    for row in rows:
        kind = row["params"]["kind"]
        if kind not in ("reliable", "reliable_adq") or row["phase"] != "full-cycle":
            continue
        prefix = "reliable" if kind == "reliable" else "reliable with ack_and_dequeue"
        if o.batch == 100 and o.producers == 4 and o.consumers == 4:
            value = row["fraction_of_ceiling"]["median"]
            targets.append({
                "name": f"{prefix} full cycle, batch 100, 4P+4C: share of the same SQL under pgbench",
                "value": value, "threshold": 0.70, "met": None if value is None else value >= 0.70,
            })
        if o.batch == 1:
            value = row["metrics"]["fraction_of_commit_ceiling"]["median"]
            targets.append({
                "name": f"{prefix} full cycle, batch 1, {o.producers}P+{o.consumers}C: share of the single-row "
                        f"commit ceiling at {o.producers + o.consumers} clients",
                "value": value, "threshold": 0.50, "met": None if value is None else value >= 0.50,
            })
    return targets


@scenario("consumers", "each --kind's full cycle and dequeue-only at every --consumer-counts, with a PNG",
          ("kinds", "producers", "batch", "payload_bytes", "seconds", "backlog", "consumer_counts", "plots", "upkeep"))
def consumers(run: BenchRun) -> dict[str, Any]:
    """The curve of consumer counts: the kinds scenario's phases through the Python client
    at each count, counts in rising order in even repeats and falling in odd ones (so a
    machine that grows busier or quieter does not favour one end of the curve)."""
    from queuectl.bench.sustained import plots_available

    o = run.options
    if o.plots and not plots_available():
        raise UsageError("the consumers scenario's plot needs matplotlib: pip install 'queuectl[bench]'")
    counts = list(o.consumer_counts)
    base = 4 if 4 in counts else counts[0]  # every point is also read against this count
    per: dict[tuple[str, int], dict[str, list[Any]]] = {
        (kind, n): {k: [] for k in ("dequeue", "cycle", "p50", "p99", "load", "producer_cpu", "consumer_cpu",
                                    "emptied", *IDLE_COUNTS)}
        for kind in o.kinds for n in counts
    }
    for kind in o.kinds:
        driver_for(kind).install(run.engine, run.names(bench_queue_name(kind)))
    with run.reporter.scenario("consumers", o.repeat * len(counts) * len(o.kinds)) as rep:
        for r in range(o.repeat):
            for n in counts if r % 2 == 0 else counts[::-1]:
                for kind in o.kinds:
                    rep.step(f"repeat {r + 1}: {kind}, {n} consumers")
                    py = python_phases(run, kind, run.names(bench_queue_name(kind)), consumers=n, upkeep=o.upkeep)
                    m, cycle = per[(kind, n)], py["cycle"]
                    m["dequeue"].append(py["dequeue"]["rate"])
                    m["cycle"].append(cycle["rate"])
                    m["p50"].append(cycle["p50_ms"])
                    m["p99"].append(cycle["p99_ms"])
                    m["load"].append((load_average() or [None])[0])
                    m["emptied"].append((cycle.get("upkeep") or {}).get("generations_emptied"))
                    batches = cycle["idle"].get("work_takes") or 0
                    for key in IDLE_COUNTS:
                        m[key].append(cycle["idle"].get(key, 0) / batches if batches else None)
                    for role in ("producer", "consumer"):
                        seconds = cycle["cpu_seconds"][role]
                        m[f"{role}_cpu"].append(1000 * seconds / cycle["messages"] if cycle["messages"] else None)
                    rep.done()
    rows: list[dict[str, Any]] = []
    for kind in o.kinds:
        for phase in ("cycle", "dequeue"):
            for n in counts:
                m = per[(kind, n)]
                metrics = {f"vs_{base}": stat([ratio(a, b) for a, b in zip(m[phase], per[(kind, base)][phase])]),
                           "load_1min": stat(m["load"])}
                if phase == "cycle":
                    metrics.update({key: stat(m[key]) for key in (*IDLE_COUNTS, "producer_cpu", "consumer_cpu")})
                    if any(x is not None for x in m["emptied"]):
                        metrics["generations_emptied"] = stat(m["emptied"])
                rows.append({
                    "subject": f"queuectl {kind}",
                    "phase": PHASE_LABEL[phase],
                    "params": {"kind": kind, "batch": o.batch, "producers": o.producers if phase == "cycle" else 0,
                               "consumers": n, "payload_bytes": o.payload_bytes},
                    "rate": stat(m[phase]),
                    "ceiling": None,
                    "fraction_of_ceiling": None,
                    "latency_ms": {"p50": stat(m["p50"]), "p99": stat(m["p99"])} if phase == "cycle" else None,
                    "metrics": metrics,
                })
    targets = []
    if base == 4 and 32 in counts:
        for kind in o.kinds:
            value = next(row["metrics"][f"vs_{base}"]["median"] for row in rows
                         if row["params"]["kind"] == kind and row["phase"] == "full-cycle" and row["params"]["consumers"] == 32)
            targets.append({"name": f"{kind} full cycle, 32 consumers against 4 (same repeat)", "value": value,
                            "threshold": 1.0, "met": None if value is None else value >= 1.0})
    if o.plots:
        from pathlib import Path

        from queuectl.bench.consumer_plots import plot_curve

        for kind in o.kinds:
            plot_curve(Path(f"{o.plots}-{kind}.png"), kind, [row for row in rows if row["params"]["kind"] == kind],
                       producers=o.producers, batch=o.batch, repeat=o.repeat, seconds=o.seconds, upkeep=o.upkeep)
    return {
        "name": "consumers",
        "description": f"full cycle and dequeue-only by consumer count, {o.producers} producers, batch {o.batch}",
        "notes": [
            "each point runs the kinds scenario's phases through the Python client: dequeue-only drains a queue "
            "filled by an enqueue-only phase; full cycle runs the producers and that many consumers at once",
            "a consumer whose take comes back empty waits as queuectl's Worker does (LISTEN, registration, "
            "back-off poll; kinds that do not notify: the back-off poll alone): see docs/benchmarks.md",
            f"x{base}: the point's rate over the same phase at {base} consumers in the same repeat; per batch: "
            "the consumers' takes and waits per take that found work, summed over consumers; CPU: the "
            "worker processes' own seconds per 1,000 messages (their server sessions' are not in it)",
            f"load_1min: the machine's 1-minute load average after each point ({os.cpu_count()} cores)",
            "a window of a few seconds is not a steady state: a count whose consumers fall behind the producers "
            "runs on a standing backlog (--backlog), and without upkeep its claims grow dearer through the run "
            "(each walks the entries of rows claimed since the last VACUUM at the head of the ready index); "
            "many consumers' first seconds cost more per message than their later ones. The default --seconds "
            "here, 20, gives the steady state (docs/benchmarks.md)",
            "upkeep: beside each full cycle, the kind's upkeep job, continuous, with its defaults, as the scheduler "
            "runs it (reliable: the archive job, which rotates the generations; generations_emptied: its truncates "
            "per point)" if o.upkeep else
            "upkeep: none (--no-upkeep): no archive or compact job ran beside the full cycles",
        ],
        "display_metrics": [[f"x{base}", f"vs_{base}"], ["empty/batch", "empty_takes"], ["outrun/batch", "outrun"],
                            ["prod CPU s/1k", "producer_cpu"], ["cons CPU s/1k", "consumer_cpu"], ["load", "load_1min"]],
        "ceilings": [],
        "rows": rows,
        "targets": targets,
        "unavailable": [],
    }


# what a full cycle's consumers did, per take that found work (IdleWait.counts)
IDLE_COUNTS = ("empty_takes", "notified_takes", "outrun", "registrations")


# the other built-in scenarios register themselves on import
from queuectl.bench import peers as _peers  # noqa: E402,F401
from queuectl.bench import split as _split  # noqa: E402,F401
from queuectl.bench import ghosts as _ghosts  # noqa: E402,F401
from queuectl.bench import ring as _ring  # noqa: E402,F401
from queuectl.bench import sustained as _sustained  # noqa: E402,F401
from queuectl.bench import cost as _cost  # noqa: E402,F401
from queuectl.bench import archiving as _archiving  # noqa: E402,F401
from queuectl.bench import fanout as _fanout  # noqa: E402,F401
