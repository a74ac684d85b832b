"""`queuectl bench --scenario archive`: what the reliable queue's archive job costs a
full-speed cycle, by consumer count.

At each --consumer-counts the full cycle (--producers and that many consumers, at full
speed, the consumers scenario's) runs twice from an emptied queue: once alone and once with
the archive job beside it, continuous and with its defaults, as the scheduler runs it (it
copies finished rows to history and rotates the generations). The two runs of a count are
back to back, their order turned at every count and repeat, so a machine that grows busier
or quieter favours neither. Each run is a steady state of its own: the job archives what the
cycle finishes while it finishes it, never a backlog left by a spell without it (which is
what a window switched on after one switched off measures, bench/lab/archive_load.py).

The figure is the rate with the job over the rate without it, the median of the repeats'
quotients. On a machine whose cores the cycle saturates, it is the share of the CPU the job
leaves the cycle: what it costs per message, against what a message costs.
"""

from __future__ import annotations

import os
from typing import Any

from queuectl.bench.core import BenchRun, load_average, ratio, scenario, stat
from queuectl.bench.drivers import driver_for
from queuectl.errors import UsageError

KIND = "reliable"
QUEUE = "bench_archive"
MODES = ("without", "with")
# the goal: beside the full cycle at 4 consumers the archive job leaves it at least 0.9x its rate
TARGET_CONSUMERS = 4
TARGET_SHARE = 0.9


@scenario("archive", "the reliable queue's full cycle with its archive job beside and without, at every "
          "--consumer-counts, with a PNG", ("producers", "batch", "payload_bytes", "seconds", "backlog",
                                            "consumer_counts", "plots"))
def archive(run: BenchRun) -> dict[str, Any]:
    from queuectl.bench.sustained import Upkeep, plots_available

    o = run.options
    if o.plots and not plots_available():
        raise UsageError("the archive scenario's plot needs matplotlib: pip install 'queuectl[bench]'")
    counts = list(o.consumer_counts)
    names = run.names(QUEUE)
    driver = driver_for(KIND)
    driver.install(run.engine, names)
    keys = ("rate", "p50", "p99", "producer_cpu", "consumer_cpu", "job_cpu", "emptied", "errors", "load")
    per: dict[tuple[int, str], dict[str, list[Any]]] = {(n, m): {k: [] for k in keys} for n in counts for m in MODES}
    with run.reporter.scenario("archive", o.repeat * len(counts) * len(MODES)) as rep:
        for r in range(o.repeat):
            for i, n in enumerate(counts if r % 2 == 0 else counts[::-1]):
                for mode in MODES if (r + i) % 2 == 0 else MODES[::-1]:
                    rep.step(f"repeat {r + 1}: {n} consumers, {mode} the archive job")
                    with run.engine.connect() as conn:
                        driver.reset(conn, names)
                    common = dict(batch=o.batch, payload_bytes=o.payload_bytes, producers=o.producers,
                                  consumers=n, seconds=o.seconds)
                    job = None
                    if mode == "with":
                        with Upkeep(run, names, KIND).beside() as job:
                            cycle = run.python_phase(KIND, names, "cycle", **common)
                    else:
                        cycle = run.python_phase(KIND, names, "cycle", **common)
                    m, messages = per[(n, mode)], cycle["messages"]
                    m["rate"].append(cycle["rate"])
                    m["p50"].append(cycle["p50_ms"])
                    m["p99"].append(cycle["p99_ms"])
                    m["load"].append((load_average() or [None])[0])
                    for role in ("producer", "consumer"):
                        m[f"{role}_cpu"].append(1000 * cycle["cpu_seconds"][role] / messages if messages else None)
                    if job is not None and job.result is not None:
                        m["job_cpu"].append(1000 * job.result["cpu_seconds"] / messages if messages else None)
                        m["emptied"].append(job.result["generations_emptied"])
                        m["errors"].append(job.result["errors"])
                    rep.done()
    with run.engine.connect() as conn:
        driver.reset(conn, names)
    rows: list[dict[str, Any]] = []
    for n in counts:
        for mode in MODES:
            m = per[(n, mode)]
            metrics = {key: stat(m[key]) for key in ("producer_cpu", "consumer_cpu")}
            metrics["load_1min"] = stat(m["load"])
            if mode == "with":
                metrics["vs_without"] = stat([ratio(a, b) for a, b in zip(m["rate"], per[(n, "without")]["rate"])])
                metrics |= {"job_cpu": stat(m["job_cpu"]), "generations_emptied": stat(m["emptied"]),
                            "errors": stat(m["errors"])}
            rows.append({
                "subject": f"queuectl {KIND}, {'archive job beside' if mode == 'with' else 'no archive job'}",
                "phase": "full-cycle",
                "params": {"kind": KIND, "batch": o.batch, "producers": o.producers, "consumers": n,
                           "payload_bytes": o.payload_bytes, "archive_job": mode == "with"},
                "rate": stat(m["rate"]),
                "ceiling": None,
                "fraction_of_ceiling": None,
                "latency_ms": {"p50": stat(m["p50"]), "p99": stat(m["p99"])},
                "metrics": metrics,
            })
    targets = []
    if TARGET_CONSUMERS in counts:
        value = next(row["metrics"]["vs_without"]["median"] for row in rows
                     if row["params"]["archive_job"] and row["params"]["consumers"] == TARGET_CONSUMERS)
        targets.append({"name": f"archive job beside a full-speed cycle, {TARGET_CONSUMERS} consumers: rate with "
                                "it over rate without (same repeat)",
                        "value": value, "threshold": TARGET_SHARE,
                        "met": None if value is None else value >= TARGET_SHARE})
    if o.plots:
        from pathlib import Path

        from queuectl.bench.consumer_plots import plot_archive_curve

        plot_archive_curve(Path(f"{o.plots}-{KIND}.png"), rows, producers=o.producers, batch=o.batch,
                           repeat=o.repeat, seconds=o.seconds, goal=TARGET_SHARE)
    return {
        "name": "archive",
        "description": f"full cycle with the archive job beside and without, by consumer count, {o.producers} "
                       f"producers, batch {o.batch}",
        "notes": [
            "each count's two full cycles run back to back from an emptied queue, their order turned at every "
            "count and repeat; the archive job (copy to history, rotation of the generations) runs beside one of "
            "them for its whole length, continuous, with its defaults, as the scheduler runs it",
            "x without: the rate with the job over the rate without it in the same repeat (median of the "
            "quotients); on a machine whose cores the cycle saturates it is the share of the CPU the job leaves "
            "the cycle, so it falls where each message costs less or the job's work per message more",
            "job CPU: the archive job's own process time per 1,000 messages (its statements' share is the "
            "server's); gens: generations it emptied (truncates) per run; CPU: the worker processes' own "
            "seconds per 1,000 messages",
            f"load_1min: the machine's 1-minute load average after each run ({os.cpu_count()} cores)",
        ],
        "display_metrics": [["x without", "vs_without"], ["gens", "generations_emptied"],
                            ["job CPU s/1k", "job_cpu"], ["prod CPU s/1k", "producer_cpu"],
                            ["cons CPU s/1k", "consumer_cpu"], ["load", "load_1min"]],
        "ceilings": [],
        "rows": rows,
        "targets": targets,
        "unavailable": [],
    }
