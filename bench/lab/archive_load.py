"""Probe: foreground throughput with continuous archiving on vs off, in the same run.

    python bench/lab/archive_load.py [--url URL] [--repeats 3] [--pairs 3] [--window 5]

Each repeat installs a fresh queue and starts P producers (enqueue_many of 20) and C
consumers (dequeue 20 + ack) in separate processes at full speed (producers pausing while
more than --backlog messages wait, as the bench's full cycle does, so enqueues and acks
run at one steady rate; with --backlog 0 producers outrun the consumers and the backlog
grows for the whole run, as in the probe's first versions), plus one archiver
process (the library's archive.run_continuous). After a warm-up the archiver is switched
off and on in alternating windows (off, on, off, on, ...) while the load keeps running, so
both modes see the same table, the same machine and the same drift; throughput is the
number of items acked per second in each window. A repeat's loss is
1 - median(on windows) / median(off windows); the result is the median over repeats.
Prints every window and writes JSON (--json).

Where the CPU goes (a local server only): every session names itself (application_name
qa_fg for the producers and consumers, qa_archiver for the archiver), and each window
records the CPU the foreground's backends, the archiver's backends and the archiver's own
process spent (from /proc), per 1,000 messages acked (each enqueued, claimed and acked,
in a steady state) and per 1,000 rows archived. On a
machine whose cores the full-speed cycle saturates, the archiver's CPU per row (its
backend and its process) over the foreground's CPU per message (the producers' and
consumers' backends and processes) bounds what archiving can leave: at most
1 / (1 + that ratio) of the foreground's rate, whatever the pacing.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import threading
import time
from typing import Any

QUEUE = "bench_archive"
TICK = os.sysconf("SC_CLK_TCK")


def _named(url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    return u.update_query_dict({"application_name": name}).render_as_string(hide_password=False)


def _cpu(pid: int) -> float:
    """CPU seconds of a process so far (0 once it is gone)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def _backends(engine: Any) -> dict[str, list[int]]:
    """The server pids of the probe's sessions, by application_name."""
    import sqlalchemy as sa

    from queuectl.bench.drivers import bench_sql

    with engine.connect() as conn:
        rows = conn.execute(sa.text(bench_sql("sessions_by_name", {})), {"names": ["qa_fg", "qa_archiver"]}).all()
    out: dict[str, list[int]] = {"qa_fg": [], "qa_archiver": []}
    for pid, name in rows:
        out[name].append(int(pid))
    return out


def _producer(url: str, stop: Any, enqueued: Any, acked: Any, backlog: int) -> None:
    """enqueue_many of 20 at full speed, pausing while more than `backlog` wait (0: never)."""
    from queuectl.client import Queue

    with Queue(_named(url, "qa_fg"), QUEUE) as q:
        n = 0
        while not stop.is_set():
            if backlog and enqueued.value - acked.value > backlog:
                time.sleep(0.001)
                continue
            q.enqueue_many([f'{{"n": {n + i}}}'.encode() for i in range(20)])
            n += 20
            with enqueued.get_lock():
                enqueued.value += 20


def _consumer(url: str, stop: Any, acked: Any) -> None:
    from queuectl.client import Queue

    with Queue(_named(url, "qa_fg"), QUEUE) as q:
        while not stop.is_set():
            batch = q.dequeue(20, lease=60)
            if batch:
                done = q.ack(batch)
                with acked.get_lock():
                    acked.value += done
            else:
                time.sleep(0.005)


def _history_rows(engine: Any) -> int:
    """Rows in the queue's history table: what the archiver has committed so far, whatever
    its rounds (run_continuous reports its progress once per round, and a round that rotates
    a large generation can outlast a window)."""
    import sqlalchemy as sa

    from queuectl.names import DEFAULT_SCHEMA, QueueNames

    history = sa.table(QueueNames(QUEUE, DEFAULT_SCHEMA).table("history"), schema=DEFAULT_SCHEMA)
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(history)).scalar_one())


def _archiver(url: str, stop: Any, active: Any, min_age: float, delay: float, batch: int, pid: Any) -> None:
    """Archive continuously while `active` is set; pause (between batches) while it is not."""
    from queuectl.engine import make_engine
    from queuectl.jobs.archive import ArchiveConfig, run_continuous

    pid.value = os.getpid()
    engine = make_engine(_named(url, "qa_archiver"))
    config = ArchiveConfig(min_age=min_age, delay=delay, batch=batch)
    while not stop.is_set():
        if not active.wait(0.05):
            continue
        pause = threading.Event()

        def watch() -> None:
            while active.is_set() and not stop.is_set():
                time.sleep(0.01)
            pause.set()

        threading.Thread(target=watch, daemon=True).start()
        run_continuous(engine, QUEUE, config, stop=pause)


def repeat(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from queuectl.bench.drivers import reinstall_queue
    from queuectl.engine import make_engine

    engine = make_engine(url)
    reinstall_queue(engine, QUEUE)
    ctx = mp.get_context("spawn")
    stop, active = ctx.Event(), ctx.Event()
    enqueued, acked = ctx.Value("q", 0), ctx.Value("q", 0)
    archiver_pid = ctx.Value("q", 0)
    procs = [ctx.Process(target=_producer, args=(url, stop, enqueued, acked, args.backlog))
             for _ in range(args.producers)]
    procs += [ctx.Process(target=_consumer, args=(url, stop, acked)) for _ in range(args.consumers)]
    procs.append(ctx.Process(target=_archiver, args=(url, stop, active, args.min_age, args.delay, args.batch,
                                                     archiver_pid)))
    for p in procs:
        p.start()
    deadline = time.monotonic() + 120
    while acked.value == 0 and time.monotonic() < deadline:  # every process up and working
        time.sleep(0.1)
    time.sleep(args.warmup)
    windows = []
    for i in range(2 * args.pairs):
        on = i % 2 == 1
        (active.set if on else active.clear)()
        time.sleep(args.settle)
        pids = _backends(engine)  # the archiver may open a session when it starts working
        pids["archiver_process"] = [archiver_pid.value]
        pids["fg_processes"] = [p.pid for p in procs[:-1] if p.pid is not None]
        c0 = {k: sum(_cpu(p) for p in v) for k, v in pids.items()}
        a0, e0, m0, t0 = acked.value, enqueued.value, _history_rows(engine), time.monotonic()
        time.sleep(args.window)
        a1, e1, m1, t1 = acked.value, enqueued.value, _history_rows(engine), time.monotonic()
        c1 = {k: sum(_cpu(p) for p in v) for k, v in pids.items()}
        dt = t1 - t0
        cpu = {k: c1[k] - c0[k] for k in c0}
        acked_n, moved_n = a1 - a0, m1 - m0
        windows.append({"archive": "on" if on else "off", "acked_per_s": acked_n / dt,
                        "enqueued_per_s": (e1 - e0) / dt, "archived_per_s": moved_n / dt,
                        "cpu_s": cpu,
                        "fg_server_cpu_per_1k_acked": 1000 * cpu["qa_fg"] / acked_n if acked_n else None,
                        "fg_cpu_per_1k_acked": 1000 * (cpu["qa_fg"] + cpu["fg_processes"]) / acked_n if acked_n else None,
                        "archiver_cpu_per_1k_rows": (1000 * (cpu["qa_archiver"] + cpu["archiver_process"]) / moved_n
                                                     if moved_n else None)})
        w = windows[-1]
        arch = w["archiver_cpu_per_1k_rows"]
        print(f"  window {i + 1:2} archive {w['archive']:3}: acked {w['acked_per_s']:7.0f}/s  enqueued "
              f"{w['enqueued_per_s']:7.0f}/s  archived {w['archived_per_s']:7.0f}/s  cpu s/1k: fg "
              f"{w['fg_cpu_per_1k_acked'] or 0:.3f} (server {w['fg_server_cpu_per_1k_acked'] or 0:.3f}), archiver "
              + (f"{arch:.3f}" if arch is not None else "-"), flush=True)
    stop.set()
    active.clear()
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    engine.dispose()
    off = statistics.median(w["acked_per_s"] for w in windows if w["archive"] == "off")
    on = statistics.median(w["acked_per_s"] for w in windows if w["archive"] == "on")
    fg = [w["fg_cpu_per_1k_acked"] for w in windows if w["fg_cpu_per_1k_acked"]]
    arch = [w["archiver_cpu_per_1k_rows"] for w in windows if w["archive"] == "on" and w["archiver_cpu_per_1k_rows"]]
    ratio = statistics.median(arch) / statistics.median(fg) if fg and arch else None
    return {"windows": windows, "off": off, "on": on, "loss": 1 - on / off if off else None,
            "archiver_over_foreground_cpu": ratio, "bound": 1 / (1 + ratio) if ratio is not None else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="database URL (default: $QUEUECTL_URL, else the embedded server)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=3, help="off/on window pairs per repeat")
    parser.add_argument("--window", type=float, default=5.0, help="measured seconds per window")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds after each switch before measuring")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--min-age", type=float, default=1.0, help="archive min age in seconds")
    parser.add_argument("--delay", type=float, default=0.2, help="archive pause between batches in seconds")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--backlog", type=int, default=2000,
                        help="producers pause while more than this many wait, so the foreground runs at a steady "
                             "state (0: never, producers outrun consumers and the backlog grows)")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    from queuectl.bench.report import write_json
    from queuectl.engine import resolve_url
    from queuectl.engine.urls import mask_url

    url = resolve_url(args.url)
    results = []
    for r in range(args.repeats):
        print(f"repeat {r + 1}:", flush=True)
        res = repeat(url, args)
        results.append(res)
        print(f"  median acked/s: off {res['off']:.0f}, on {res['on']:.0f}, loss {res['loss'] * 100:.1f} %", flush=True)
        if res["archiver_over_foreground_cpu"] is not None:
            print(f"  archiver CPU per row / foreground CPU per message: {res['archiver_over_foreground_cpu']:.2f} "
                  f"(bound on a saturated machine: on/off <= {res['bound']:.2f})", flush=True)
    off = statistics.median(r["off"] for r in results)
    on = statistics.median(r["on"] for r in results)
    loss = statistics.median(r["loss"] for r in results)
    per_repeat = ", ".join(f"{r['loss'] * 100:.1f} %" for r in results)
    print(f"\nmedians over {args.repeats} repeats ({args.producers} producers, {args.consumers} consumers, "
          f"{args.pairs} off/on pairs of {args.window:g} s; archive min-age {args.min_age:g}s, delay {args.delay:g}s, "
          f"batch {args.batch}):")
    print(f"  acked/s with archiving off {off:.0f}, on {on:.0f}; foreground loss {loss * 100:.1f} % "
          f"(per repeat: {per_repeat})")
    write_json(args.json_path, {"url": mask_url(url), "args": vars(args), "repeats": results,
                                "median_off": off, "median_on": on, "median_loss": loss})


if __name__ == "__main__":
    main()
