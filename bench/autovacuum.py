"""Probe: what reliable_0006's per-table autovacuum settings change under a steady full
cycle, against a queue at reliable_0005 (the server's autovacuum defaults), in one run.

    python -m queuectl.bench.autovacuum --seconds 90 --repeats 2 [--url URL] [--json out.json]

Each repeat installs two queues side by side, one at reliable_0005 and one at the head,
and runs the same workload on each in turn (the order alternates between repeats): the
queue is pre-filled with `--backlog` messages and vacuumed and analysed (as a live queue
would be), then P producer and C consumer processes (queuectl.client.Queue: enqueue_many,
dequeue, ack; batch `--batch`) and one archiver process (jobs/archive.py run_continuous,
moving DONE rows older than `--archive-min-age` to history and purging history older than
`--retention`) run for `--seconds`. Producers pause while the backlog is deeper than
`--backlog`, so the meta table keeps a standing backlog; `--rate` caps the consumers'
total messages/s (0: as fast as they go), the regime where a scale factor delays vacuum
longest (a deep backlog drained slowly).
Every `--sample` seconds the probe records, per table (meta, data, history): estimated
dead rows, heap+TOAST and index sizes, autovacuum and autoanalyze counts; and the
messages/s acked and the mean time of one dequeue call over the interval. Reported per
revision: medians over the samples (per repeat, then the median of the repeats), the
autovacuum runs per table during a run and the sizes at its end.
Without --url (or $QUEUECTL_URL) a throwaway server is started in a temporary folder;
`--naptime` then sets its autovacuum_naptime (default: the server's own, 1 min).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

BASELINE = "reliable_0005"
TABLES = ("meta", "data", "history")
SETTINGS = ("server_version", "autovacuum_naptime", "autovacuum_vacuum_cost_delay", "autovacuum_vacuum_cost_limit",
            "autovacuum_max_workers", "autovacuum_vacuum_threshold", "autovacuum_vacuum_scale_factor",
            "autovacuum_vacuum_insert_threshold", "autovacuum_vacuum_insert_scale_factor")
QUEUES = {"baseline": "av_baseline", "head": "av_head"}
FILL_BATCH = 1000
EMPTY_POLL_SECONDS = 0.002
BACKLOG_PAUSE_SECONDS = 0.001


@dataclass(frozen=True)
class Options:
    seconds: float = 90.0
    repeats: int = 2
    producers: int = 2
    consumers: int = 2
    batch: int = 50
    backlog: int = 50_000
    rate: float = 0.0               # consumers' total msg/s cap (0: none)
    payload_bytes: int = 300
    sample: float = 5.0             # seconds between samples
    archive_min_age: float = 5.0    # DONE rows stay this long before the archive moves them
    retention: float = 30.0         # history rows older than this are purged
    purge_every: float = 10.0


# -- worker processes (spawn: module-level functions, imports inside) ----------------------


def _producer(url: str, queue: str, o: Options, index: int, counts: Any, go: Any, stop: Any) -> None:
    from queuectl.client import Queue

    payloads = [os.urandom(o.payload_bytes) for _ in range(o.batch)]
    with Queue(url, queue) as q:
        go.wait()
        while not stop.is_set():
            depth = o.backlog + sum(counts[: o.producers]) - sum(counts[o.producers:])
            if depth > o.backlog:
                time.sleep(BACKLOG_PAUSE_SECONDS)
                continue
            q.enqueue_many(payloads)
            counts[index] += o.batch


def _consumer(url: str, queue: str, o: Options, index: int, counts: Any, calls: Any, call_seconds: Any,
              go: Any, stop: Any) -> None:
    from queuectl.client import Queue

    slot = index - o.producers
    pace = o.consumers / o.rate if o.rate > 0 else 0.0  # seconds per message for this consumer
    with Queue(url, queue) as q:
        go.wait()
        due = time.monotonic()
        while not stop.is_set():
            t0 = time.perf_counter()
            batch = q.dequeue(o.batch)
            call_seconds[slot] += time.perf_counter() - t0
            calls[slot] += 1
            if not batch:
                time.sleep(EMPTY_POLL_SECONDS)
                continue
            q.ack(batch)
            counts[index] += len(batch)
            if pace:
                due += pace * len(batch)
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                else:
                    due = time.monotonic()  # behind: do not build up credit


def _archiver(url: str, queue: str, o: Options, go: Any, stop: Any) -> None:
    from queuectl.engine import make_engine
    from queuectl.jobs.archive import ArchiveConfig, run_continuous

    engine = make_engine(url)
    config = ArchiveConfig(batch=1000, min_age=o.archive_min_age, history_retention=o.retention,
                           purge_every=o.purge_every, idle_delay=1.0)
    go.wait()
    try:
        run_continuous(engine, queue, config, stop=stop)
    finally:
        engine.dispose()


# -- one run on one queue ---------------------------------------------------------------


def _sample(engine: sa.Engine, qualified: dict[str, str]) -> dict[str, dict[str, Any]]:
    from queuectl.bench.drivers import bench_sql

    with engine.connect() as conn:
        rows = conn.execute(sa.text(bench_sql("autovacuum_sample", {})),
                            {"tables": list(qualified.values())}).mappings().all()
    by_name = {row["qualified"]: dict(row) for row in rows}
    return {role: {k: v for k, v in by_name[name].items() if k != "qualified"} for role, name in qualified.items()}


def _fill(engine: sa.Engine, name: str, o: Options, revision: str | None) -> None:
    from queuectl.bench.drivers import analyze_filled
    from queuectl.client import Queue
    from queuectl.install import install_queue
    from queuectl.names import QueueNames

    install_queue(engine, name, **({"revision": revision} if revision else {}))
    payload = bytes(o.payload_bytes)
    with Queue(engine, name) as queue:
        for start in range(0, o.backlog, FILL_BATCH):
            queue.enqueue_many([payload] * min(FILL_BATCH, o.backlog - start))
    analyze_filled(engine, "reliable", QueueNames(name))


def _run_side(engine: sa.Engine, url: str, name: str, o: Options) -> dict[str, Any]:
    """The workload on one queue for o.seconds; the samples taken meanwhile."""
    from queuectl.names import QueueNames

    names = QueueNames(name)
    qualified = {role: names.qualified(role) for role in TABLES}
    ctx = mp.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    counts = ctx.Array("q", o.producers + o.consumers, lock=False)
    calls = ctx.Array("q", o.consumers, lock=False)
    call_seconds = ctx.Array("d", o.consumers, lock=False)
    procs = [ctx.Process(target=_producer, args=(url, name, o, i, counts, go, stop)) for i in range(o.producers)]
    procs += [ctx.Process(target=_consumer, args=(url, name, o, o.producers + i, counts, calls, call_seconds, go, stop))
              for i in range(o.consumers)]
    procs.append(ctx.Process(target=_archiver, args=(url, name, o, go, stop)))
    for p in procs:
        p.start()
    samples: list[dict[str, Any]] = []
    try:
        time.sleep(1.0)  # let them connect (as notify_cost does)
        go.set()
        started = time.monotonic()
        last = (started, 0, 0, 0.0)
        first = _sample(engine, qualified)
        while True:
            remaining = started + o.seconds - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(o.sample, remaining))
            if any(not p.is_alive() for p in procs):
                raise RuntimeError(f"a worker process of the autovacuum probe on {name} ended early")
            now = time.monotonic()
            acked, n_calls, seconds = sum(counts[o.producers:]), sum(calls), sum(call_seconds)
            tables = _sample(engine, qualified)
            interval = now - last[0]
            samples.append({
                "t": round(now - started, 2),
                "rate": (acked - last[1]) / interval if interval > 0 else 0.0,
                "dequeue_ms": 1000 * (seconds - last[3]) / (n_calls - last[2]) if n_calls > last[2] else None,
                "depth": o.backlog + sum(counts[: o.producers]) - acked,
                "tables": tables,
            })
            last = (now, acked, n_calls, seconds)
    finally:
        stop.set()
        go.set()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()
    return {"first": first, "samples": samples, "acked": sum(counts[o.producers:])}


def _summary(side: dict[str, Any]) -> dict[str, Any]:
    """Medians over a run's samples; autovacuum runs and sizes from its first to last sample."""
    samples = side["samples"]
    first, end = side["first"], samples[-1]["tables"] if samples else side["first"]

    def median(values: list[Any]) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    out: dict[str, Any] = {
        "rate": median([s["rate"] for s in samples]),
        "dequeue_ms": median([s["dequeue_ms"] for s in samples]),
        "acked": side["acked"],
    }
    for role in TABLES:
        out[role] = {
            "dead_median": median([s["tables"][role]["n_dead_tup"] for s in samples]),
            "dead_max": max((s["tables"][role]["n_dead_tup"] for s in samples), default=None),
            "bytes_median": median([s["tables"][role]["table_bytes"] + s["tables"][role]["index_bytes"] for s in samples]),
            "table_bytes_end": end[role]["table_bytes"],
            "index_bytes_end": end[role]["index_bytes"],
            "autovacuums": end[role]["autovacuum_count"] - first[role]["autovacuum_count"],
            "autoanalyzes": end[role]["autoanalyze_count"] - first[role]["autoanalyze_count"],
        }
    return out


def _combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over the repeats of each per-run figure."""
    def med(values: list[Any]) -> Any:
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    combined: dict[str, Any] = {key: med([r[key] for r in runs]) for key in ("rate", "dequeue_ms", "acked")}
    for role in TABLES:
        combined[role] = {key: med([r[role][key] for r in runs]) for key in runs[0][role]}
    return combined


def run(url: str, options: Options | None = None) -> dict[str, Any]:
    """Both revisions, options.repeats times, alternating; the queues are removed afterwards."""
    from queuectl.bench.drivers import bench_sql
    from queuectl.engine import make_engine
    from queuectl.install import head_of, list_queues, uninstall_queue

    o = options or Options()
    engine = make_engine(url)
    revisions = {"baseline": BASELINE, "head": head_of("reliable")}
    result: dict[str, Any] = {"revisions": revisions, "options": asdict(o), "runs": {k: [] for k in revisions}}
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(bench_sql("server_settings", {})), {"names": list(SETTINGS)}).mappings().all()
        result["server"] = {r["name"]: f"{r['setting']}{r['unit']}" for r in rows}
        for repeat in range(o.repeats):
            order = ("baseline", "head") if repeat % 2 == 0 else ("head", "baseline")
            for which in order:
                name = QUEUES[which]
                with engine.connect() as conn:
                    if any(q.name == name for q in list_queues(conn)):
                        uninstall_queue(engine, name)
                _fill(engine, name, o, BASELINE if which == "baseline" else None)
                try:
                    side = _run_side(engine, url, name, o)
                finally:
                    uninstall_queue(engine, name)
                summary = _summary(side)
                summary["samples"] = side["samples"]
                result["runs"][which].append(summary)
                print(f"repeat {repeat + 1} {revisions[which]}: {_line(summary)}", flush=True)
        result["medians"] = {which: _combine(result["runs"][which]) for which in revisions}
        result["load_average"] = os.getloadavg()[0]
    finally:
        engine.dispose()
    return result


def _line(s: dict[str, Any]) -> str:
    meta, data, history = s["meta"], s["data"], s["history"]

    def mb(n: float | None) -> str:
        return "-" if n is None else f"{n / 2**20:.1f} MB"

    def n(value: float | None, spec: str = ",.0f") -> str:
        return "-" if value is None else format(value, spec)

    return (f"{n(s['rate'])} msg/s, dequeue {n(s['dequeue_ms'], '.2f')} ms; meta dead {n(meta['dead_median'])} "
            f"(max {n(meta['dead_max'])}), {mb(meta['bytes_median'])}, {n(meta['autovacuums'], 'g')} autovacuums; "
            f"data dead {n(data['dead_median'])}, {mb(data['bytes_median'])}, {n(data['autovacuums'], 'g')} autovacuums; "
            f"history dead {n(history['dead_median'])}, {mb(history['bytes_median'])}, "
            f"{n(history['autovacuums'], 'g')} autovacuums")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = Options()
    parser.add_argument("--url", default=None, help="database URL (default: $QUEUECTL_URL, else a throwaway server)")
    parser.add_argument("--seconds", type=float, default=d.seconds, help="run time per queue and repeat")
    parser.add_argument("--repeats", type=int, default=d.repeats)
    parser.add_argument("--producers", type=int, default=d.producers)
    parser.add_argument("--consumers", type=int, default=d.consumers)
    parser.add_argument("--batch", type=int, default=d.batch, help="enqueue_many and dequeue batch size")
    parser.add_argument("--backlog", type=int, default=d.backlog, help="messages kept waiting (pre-filled)")
    parser.add_argument("--rate", type=float, default=d.rate, help="consumers' total msg/s cap (0: none)")
    parser.add_argument("--payload-bytes", type=int, default=d.payload_bytes)
    parser.add_argument("--sample", type=float, default=d.sample, help="seconds between samples")
    parser.add_argument("--archive-min-age", type=float, default=d.archive_min_age)
    parser.add_argument("--retention", type=float, default=d.retention, help="history retention, seconds")
    parser.add_argument("--naptime", type=int, default=None,
                        help="autovacuum_naptime in seconds for the throwaway server (not with --url)")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    options = Options(seconds=args.seconds, repeats=args.repeats, producers=args.producers, consumers=args.consumers,
                      batch=args.batch, backlog=args.backlog, rate=args.rate, payload_bytes=args.payload_bytes,
                      sample=args.sample, archive_min_age=args.archive_min_age, retention=args.retention)
    url = args.url or os.environ.get("QUEUECTL_URL")
    if url and args.naptime is not None:
        parser.error("--naptime changes the server's configuration: only for the throwaway server (no --url)")
    server = None
    with tempfile.TemporaryDirectory(prefix="queuectl-autovacuum-", dir="/tmp") as tmp:
        os.chmod(tmp, 0o755)
        try:
            if not url:
                from queuectl.embedded import EmbeddedServer

                server = EmbeddedServer(Path(tmp) / "pg")
                url = server.ensure_running()
                if args.naptime is not None:
                    _set_naptime(url, args.naptime)
            result = run(url, options)
        finally:
            if server is not None:
                server.stop()
    _print_medians(result)
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as out:
            json.dump(result, out, indent=2, default=str)
    return 0


def _set_naptime(url: str, seconds: int) -> None:
    from queuectl.bench.drivers import bench_sql
    from queuectl.engine import make_engine

    engine = make_engine(url)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(bench_sql("set_naptime", {"naptime_s": int(seconds)}))
            conn.exec_driver_sql(bench_sql("reload_conf", {}))
    finally:
        engine.dispose()


def _print_medians(result: dict[str, Any]) -> None:
    server = result["server"]
    print(f"server {server.get('server_version')}, autovacuum_naptime {server.get('autovacuum_naptime')}, "
          f"load average now {result['load_average']:.1f}; medians of {result['options']['repeats']} repeats:")
    for which, revision in result["revisions"].items():
        print(f"  {revision}: {_line(result['medians'][which])}")


if __name__ == "__main__":
    sys.exit(main())
