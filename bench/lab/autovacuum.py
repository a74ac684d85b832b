"""Probe: what per-table autovacuum settings change under a steady full cycle, each kind's revision against the one before.

    python bench/lab/autovacuum.py --seconds 90 --repeats 2 [--kind K] [--url URL] [--json out.json]

Each repeat installs two queues side by side and runs the same workload on each in turn
(the order alternates between repeats):
  * reliable: one queue at reliable_0006 (no per-table settings), one at the head; each is
    pre-filled with `--backlog` messages and vacuumed and analysed (as a live queue would
    be); P producer and C consumer processes (queuectl.client.Queue: enqueue_many,
    dequeue, ack; batch `--batch`) and one archiver process (jobs/archive.py
    run_continuous, moving DONE rows older than `--archive-min-age` to history and purging
    history older than `--retention`) run for `--seconds`;
  * ring: two rings of `--ring-size` slots, one at ring_0003 and one at the head, each
    pre-filled with `--backlog` messages; producers push and consumers pop (RingQueue,
    batch `--batch`). `--payload-bytes` over ~2 kB puts the payloads in the TOAST table;
  * the one-table kinds: two queues, one at <kind>_0002 and one at the head, each
    pre-filled with `--backlog` items, vacuumed and analysed; producers enqueue_many and
    consumers dequeue (batch `--batch`; the dequeue deletes, there is no ack).
Producers pause while the backlog is deeper than `--backlog`, so the queue keeps a
standing backlog; `--rate` caps the consumers' total messages/s (0: as fast as they go),
the regime where a scale factor delays vacuum longest (a deep backlog drained slowly).
Every `--sample` seconds the probe records, per table: estimated dead rows, HOT updates,
heap (with TOAST) and index sizes, autovacuum and autoanalyze counts, the TOAST table's
dead rows and autovacuum count; and the messages/s consumed and the mean time of one
dequeue call over the interval. Reported per side: medians over the samples (per repeat,
then the median of the repeats), the autovacuum runs per table during a run and the sizes
at its end.
Without --url (or $QUEUECTL_URL) a throwaway server is started in a temporary folder;
`--naptime` then sets its autovacuum_naptime (default: the server's own, 1 min).
"""

from __future__ import annotations

import argparse
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

ONE_TABLE_KINDS = ("heap", "fifo", "stack", "pending", "watermark")
# the last revisions without per-table settings
BASELINES = {"reliable": "reliable_0006", "ring": "ring_0003", **{k: f"{k}_0002" for k in ONE_TABLE_KINDS}}
SETTINGS = ("server_version", "autovacuum_naptime", "autovacuum_vacuum_cost_delay", "autovacuum_vacuum_cost_limit",
            "autovacuum_max_workers", "autovacuum_vacuum_threshold", "autovacuum_vacuum_scale_factor",
            "autovacuum_vacuum_insert_threshold", "autovacuum_vacuum_insert_scale_factor")
FILL_STATS_WAIT_SECONDS = 15.0
EMPTY_POLL_SECONDS = 0.002
BACKLOG_PAUSE_SECONDS = 0.001


@dataclass(frozen=True)
class Options:
    kind: str = "reliable"          # reliable | ring | one of ONE_TABLE_KINDS
    seconds: float = 90.0
    repeats: int = 2
    producers: int = 2
    consumers: int = 2
    batch: int = 50
    backlog: int = 50_000
    rate: float = 0.0               # consumers' total msg/s cap (0: none)
    payload_bytes: int = 300
    sample: float = 5.0             # seconds between samples
    archive_min_age: float = 5.0    # reliable: DONE rows stay this long before the archive moves them
    retention: float = 30.0         # reliable: history rows older than this are purged
    purge_every: float = 10.0
    ring_size: int = 65_536         # ring: slots (the kind's default size)


@dataclass(frozen=True)
class Side:
    """One of the two queues a repeat compares."""

    revision: str            # install at this revision
    queue: str


def sides(kind: str) -> dict[str, Side]:
    from queuectl.install import head_of

    return {"baseline": Side(BASELINES[kind], "av_baseline"), "head": Side(head_of(kind), "av_head")}


def tables(kind: str) -> tuple[str, ...]:
    if kind == "reliable":
        return ("meta", "data", "history")
    return ("ring",) if kind == "ring" else ("items",)


# -- worker processes (spawn: module-level functions, imports inside) ----------------------


def _client(url: str, queue: str, kind: str) -> Any:
    if kind == "reliable":
        from queuectl.client import Queue

        return Queue(url, queue)
    from queuectl.client import open_queue

    return open_queue(url, queue)


def _start(ready: Any, go: Any) -> None:
    """Say this process is set up (imports done, client made), then wait for the start."""
    ready.release()
    go.wait()


def _producer(url: str, queue: str, o: Options, index: int, counts: Any, ready: Any, go: Any, stop: Any) -> None:
    from queuectl.client import QueueFullError

    payloads = [os.urandom(o.payload_bytes) for _ in range(o.batch)]
    with _client(url, queue, o.kind) as q:
        _start(ready, go)
        while not stop.is_set():
            depth = o.backlog + sum(counts[: o.producers]) - sum(counts[o.producers:])
            if depth > o.backlog:
                time.sleep(BACKLOG_PAUSE_SECONDS)
                continue
            try:
                q.enqueue_many(payloads)
                counts[index] += o.batch
            except QueueFullError as full:  # a ring that stayed full: what went in counts
                counts[index] += len(full.enqueued or [])


def _consumer(url: str, queue: str, o: Options, index: int, counts: Any, calls: Any, call_seconds: Any,
              ready: Any, go: Any, stop: Any) -> None:
    slot = index - o.producers
    pace = o.consumers / o.rate if o.rate > 0 else 0.0  # seconds per message for this consumer
    with _client(url, queue, o.kind) as q:
        _start(ready, go)
        due = time.monotonic()
        while not stop.is_set():
            t0 = time.perf_counter()
            batch = q.dequeue(o.batch)
            call_seconds[slot] += time.perf_counter() - t0
            calls[slot] += 1
            if not batch:
                time.sleep(EMPTY_POLL_SECONDS)
                continue
            if o.kind == "reliable":
                q.ack(batch)
            counts[index] += len(batch)
            if pace:
                due += pace * len(batch)
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                else:
                    due = time.monotonic()  # behind: do not build up credit


def _archiver(url: str, queue: str, o: Options, ready: Any, go: Any, stop: Any) -> None:
    from queuectl.engine import make_engine
    from queuectl.jobs.archive import ArchiveConfig, run_continuous

    engine = make_engine(url)
    config = ArchiveConfig(batch=1000, min_age=o.archive_min_age, history_retention=o.retention,
                           purge_every=o.purge_every, idle_delay=1.0)
    _start(ready, go)
    try:
        run_continuous(engine, queue, config, stop=stop)
    finally:
        engine.dispose()


# -- one run on one queue ---------------------------------------------------------------


def _sample(engine: sa.Engine, qualified: dict[str, str]) -> dict[str, dict[str, Any]]:
    from lab_helpers import probe_sql

    with engine.connect() as conn:
        rows = conn.execute(sa.text(probe_sql("autovacuum_sample", {})),
                            {"tables": list(qualified.values())}).mappings().all()
    by_name = {row["qualified"]: dict(row) for row in rows}
    return {role: {k: v for k, v in by_name[name].items() if k != "qualified"} for role, name in qualified.items()}


def _install(engine: sa.Engine, url: str, side: Side, o: Options) -> None:
    """Install the side's queue and pre-fill its backlog; a reliable queue is then vacuumed
    and analysed, once the fill's row counts have reached the statistics: a session sends
    them when it ends (or up to 10 s after its last transaction), and inserts counted after
    the VACUUM would bring insert-driven autovacuum forward on one side and not the other."""
    from queuectl.bench.drivers import analyze_filled, enqueue_in_chunks
    from queuectl.install import install_queue
    from queuectl.kindspec import RingSettings
    from queuectl.names import QueueNames

    names = QueueNames(side.queue)
    settings = RingSettings(size=o.ring_size) if o.kind == "ring" else None
    install_queue(engine, side.queue, o.kind, settings, revision=side.revision)
    with _client(url, side.queue, o.kind) as queue:  # its own engine: its session ends with it
        enqueue_in_chunks(queue, bytes(o.payload_bytes), o.backlog)
    if o.kind != "ring":
        role = tables(o.kind)[0]
        first = {role: names.qualified(role)}
        deadline = time.monotonic() + FILL_STATS_WAIT_SECONDS
        while _sample(engine, first)[role]["n_ins_since_vacuum"] < o.backlog and time.monotonic() < deadline:
            time.sleep(0.1)
        analyze_filled(engine, "reliable" if o.kind == "reliable" else "items", names, o.kind)


def _run_side(engine: sa.Engine, url: str, name: str, o: Options) -> dict[str, Any]:
    """The workload on one queue for o.seconds; the samples taken meanwhile."""
    from queuectl.names import QueueNames

    names = QueueNames(name)
    qualified = {role: names.qualified(role) for role in tables(o.kind)}
    ctx = mp.get_context("spawn")
    ready, go, stop = ctx.Semaphore(0), ctx.Event(), ctx.Event()
    counts = ctx.Array("q", o.producers + o.consumers, lock=False)
    calls = ctx.Array("q", o.consumers, lock=False)
    call_seconds = ctx.Array("d", o.consumers, lock=False)
    procs = [ctx.Process(target=_producer, args=(url, name, o, i, counts, ready, go, stop)) for i in range(o.producers)]
    procs += [ctx.Process(target=_consumer, args=(url, name, o, o.producers + i, counts, calls, call_seconds, ready, go, stop))
              for i in range(o.consumers)]
    if o.kind == "reliable":
        procs.append(ctx.Process(target=_archiver, args=(url, name, o, ready, go, stop)))
    for p in procs:
        p.start()
    samples: list[dict[str, Any]] = []
    try:
        set_up, deadline = 0, time.monotonic() + 120
        while set_up < len(procs):  # every process set up before the clock starts, however loaded the machine
            if ready.acquire(timeout=0.5):
                set_up += 1
            elif time.monotonic() > deadline or any(not p.is_alive() for p in procs):
                raise RuntimeError(f"a worker process of the autovacuum probe on {name} did not start")
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
            consumed, n_calls, seconds = sum(counts[o.producers:]), sum(calls), sum(call_seconds)
            sampled = _sample(engine, qualified)
            interval = now - last[0]
            samples.append({
                "t": round(now - started, 2),
                "rate": (consumed - last[1]) / interval if interval > 0 else 0.0,
                "dequeue_ms": 1000 * (seconds - last[3]) / (n_calls - last[2]) if n_calls > last[2] else None,
                "depth": o.backlog + sum(counts[: o.producers]) - consumed,
                "tables": sampled,
            })
            last = (now, consumed, n_calls, seconds)
    finally:
        stop.set()
        go.set()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()
    return {"first": first, "samples": samples, "consumed": sum(counts[o.producers:])}


def _median(values: list[Any]) -> Any:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _summary(side: dict[str, Any], roles: tuple[str, ...]) -> dict[str, Any]:
    """Medians over a run's samples; autovacuum runs, updates and sizes from its first to last sample."""
    samples = side["samples"]
    first, end = side["first"], samples[-1]["tables"] if samples else side["first"]
    out: dict[str, Any] = {
        "rate": _median([s["rate"] for s in samples]),
        "dequeue_ms": _median([s["dequeue_ms"] for s in samples]),
        "consumed": side["consumed"],
    }
    for role in roles:
        updates = end[role]["n_tup_upd"] - first[role]["n_tup_upd"]
        out[role] = {
            "reloptions": first[role]["reloptions"],
            "toast_reloptions": first[role]["toast_reloptions"],
            "dead_median": _median([s["tables"][role]["n_dead_tup"] for s in samples]),
            "dead_max": max((s["tables"][role]["n_dead_tup"] for s in samples), default=None),
            "bytes_median": _median([s["tables"][role]["table_bytes"] + s["tables"][role]["index_bytes"] for s in samples]),
            "table_bytes_end": end[role]["table_bytes"],
            "index_bytes_end": end[role]["index_bytes"],
            "toast_bytes_end": end[role]["toast_bytes"],
            "toast_dead_median": _median([s["tables"][role]["toast_dead"] for s in samples]),
            "hot_update_pct": 100.0 * (end[role]["n_tup_hot_upd"] - first[role]["n_tup_hot_upd"]) / updates
            if updates else None,
            "autovacuums": end[role]["autovacuum_count"] - first[role]["autovacuum_count"],
            "toast_autovacuums": end[role]["toast_autovacuum_count"] - first[role]["toast_autovacuum_count"],
            "autoanalyzes": end[role]["autoanalyze_count"] - first[role]["autoanalyze_count"],
        }
    return out


def _combine(runs: list[dict[str, Any]], roles: tuple[str, ...]) -> dict[str, Any]:
    """The median over the repeats of each per-run figure."""
    combined: dict[str, Any] = {key: _median([r[key] for r in runs]) for key in ("rate", "dequeue_ms", "consumed")}
    for role in roles:
        combined[role] = {key: runs[0][role][key] if key.endswith("reloptions") else _median([r[role][key] for r in runs])
                          for key in runs[0][role]}
    return combined


def run(url: str, options: Options | None = None) -> dict[str, Any]:
    """Both sides, options.repeats times, alternating; the queues are removed afterwards."""
    from queuectl.bench.drivers import bench_sql
    from queuectl.engine import make_engine
    from queuectl.install import uninstall_queue
    from queuectl.registry import list_queues

    o = options or Options()
    if o.kind not in BASELINES:
        raise ValueError(f"kind must be one of {', '.join(BASELINES)}, got {o.kind!r}")
    if o.kind == "ring" and o.backlog >= o.ring_size:
        raise ValueError("a ring's backlog must be smaller than its size")
    engine = make_engine(url)
    both = sides(o.kind)
    roles = tables(o.kind)
    result: dict[str, Any] = {"kind": o.kind, "sides": {k: s.revision for k, s in both.items()},
                              "options": asdict(o), "runs": {k: [] for k in both}}
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(bench_sql("server_settings", {})), {"names": list(SETTINGS)}).mappings().all()
        result["server"] = {r["name"]: f"{r['setting']}{r['unit']}" for r in rows}
        for repeat in range(o.repeats):
            order = ("baseline", "head") if repeat % 2 == 0 else ("head", "baseline")
            for which in order:
                side = both[which]
                with engine.connect() as conn:
                    if any(q.name == side.queue for q in list_queues(conn)):
                        uninstall_queue(engine, side.queue)
                _install(engine, url, side, o)
                try:
                    ran = _run_side(engine, url, side.queue, o)
                finally:
                    uninstall_queue(engine, side.queue)
                summary = _summary(ran, roles)
                summary["samples"] = ran["samples"]
                result["runs"][which].append(summary)
                print(f"repeat {repeat + 1} {side.revision}: {_line(summary, roles)}", flush=True)
        result["medians"] = {which: _combine(result["runs"][which], roles) for which in both}
        result["load_average"] = os.getloadavg()[0]
    finally:
        engine.dispose()
    return result


def _line(s: dict[str, Any], roles: tuple[str, ...]) -> str:
    def mb(n: float | None) -> str:
        return "-" if n is None else f"{n / 2**20:.1f} MB"

    def n(value: float | None, spec: str = ",.0f") -> str:
        return "-" if value is None else format(value, spec)

    parts = [f"{n(s['rate'])} msg/s, dequeue {n(s['dequeue_ms'], '.2f')} ms"]
    for role in roles:
        t = s[role]
        text = (f"{role} dead {n(t['dead_median'])} (max {n(t['dead_max'])}), {mb(t['bytes_median'])}, "
                f"{n(t['autovacuums'], 'g')} autovacuums")
        if t["hot_update_pct"] is not None:
            text += f", HOT {n(t['hot_update_pct'], '.2f')}%"
        if t["toast_bytes_end"]:
            text += (f"; its TOAST {mb(t['toast_bytes_end'])} at the end, dead {n(t['toast_dead_median'])}, "
                     f"{n(t['toast_autovacuums'], 'g')} autovacuums")
        parts.append(text)
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = Options()
    parser.add_argument("--url", default=None, help="database URL (default: $QUEUECTL_URL, else a throwaway server)")
    parser.add_argument("--kind", choices=tuple(BASELINES), default=d.kind)
    parser.add_argument("--seconds", type=float, default=d.seconds, help="run time per queue and repeat")
    parser.add_argument("--repeats", type=int, default=d.repeats)
    parser.add_argument("--producers", type=int, default=d.producers)
    parser.add_argument("--consumers", type=int, default=d.consumers)
    parser.add_argument("--batch", type=int, default=d.batch, help="enqueue_many and dequeue batch size")
    parser.add_argument("--backlog", type=int, default=None,
                        help=f"messages kept waiting, pre-filled (default: {d.backlog:,}; ring: a quarter of its size)")
    parser.add_argument("--rate", type=float, default=d.rate, help="consumers' total msg/s cap (0: none)")
    parser.add_argument("--payload-bytes", type=int, default=d.payload_bytes)
    parser.add_argument("--sample", type=float, default=d.sample, help="seconds between samples")
    parser.add_argument("--archive-min-age", type=float, default=d.archive_min_age)
    parser.add_argument("--retention", type=float, default=d.retention, help="history retention, seconds")
    parser.add_argument("--ring-size", type=int, default=d.ring_size)
    parser.add_argument("--naptime", type=int, default=None,
                        help="autovacuum_naptime in seconds for the throwaway server (not with --url)")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    backlog = args.backlog if args.backlog is not None else (args.ring_size // 4 if args.kind == "ring" else d.backlog)
    options = Options(kind=args.kind, seconds=args.seconds, repeats=args.repeats, producers=args.producers,
                      consumers=args.consumers, batch=args.batch, backlog=backlog, rate=args.rate,
                      payload_bytes=args.payload_bytes, sample=args.sample, archive_min_age=args.archive_min_age,
                      retention=args.retention, ring_size=args.ring_size)
    url = args.url or os.environ.get("QUEUECTL_URL")
    if url and args.naptime is not None:
        parser.error("--naptime changes the server's configuration: only for the throwaway server (no --url)")
    server = None
    with tempfile.TemporaryDirectory(prefix="queuectl-autovacuum-", dir="/tmp") as tmp:
        os.chmod(tmp, 0o755)
        try:
            if not url:
                from queuectl.engine.embedded import EmbeddedServer

                server = EmbeddedServer(Path(tmp) / "pg")
                url = server.ensure_running()
                if args.naptime is not None:
                    _set_naptime(url, args.naptime)
            result = run(url, options)
        finally:
            if server is not None:
                server.stop()
    _print_medians(result)
    from queuectl.bench.report import write_json

    write_json(args.json_path, result, default=str)
    return 0


def _set_naptime(url: str, seconds: int) -> None:
    from lab_helpers import probe_sql
    from queuectl.engine import make_engine

    engine = make_engine(url)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(probe_sql("set_naptime", {"naptime_s": int(seconds)}))
            conn.exec_driver_sql(probe_sql("reload_conf", {}))
    finally:
        engine.dispose()


def _print_medians(result: dict[str, Any]) -> None:
    server = result["server"]
    roles = tables(result["kind"])
    print(f"server {server.get('server_version')}, autovacuum_naptime {server.get('autovacuum_naptime')}, "
          f"load average now {result['load_average']:.1f}; medians of {result['options']['repeats']} repeats:")
    for which, label in result["sides"].items():
        print(f"  {label}: {_line(result['medians'][which], roles)}")


if __name__ == "__main__":
    sys.exit(main())
