"""Foreground throughput with continuous archiving on vs off, in the same run.

    python -m queuectl.bench.archive_load [--url URL] [--seconds 15] [--repeats 3]

Each trial installs a fresh queue, runs P producers (enqueue_many of 20) and C consumers
(dequeue 20 + ack) in separate processes at full speed, and with archiving "on" one more
process running `archive --continuous` (the library's run_continuous). Throughput is the
number of items acked per second over the measured window, after a warm-up. Off and on
alternate (off/on, on/off, ...) so drift on the machine hits both alike; the result is
the median per mode and the loss = 1 - median(on) / median(off). Prints a table and
writes JSON (--json).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from typing import Any

QUEUE = "bench_archive"


def _producer(url: str, stop: Any, enqueued: Any) -> None:
    from queuectl.client import Queue

    with Queue(url, QUEUE) as q:
        n = 0
        while not stop.is_set():
            q.enqueue_many([f'{{"n": {n + i}}}'.encode() for i in range(20)])
            n += 20
            with enqueued.get_lock():
                enqueued.value += 20


def _consumer(url: str, stop: Any, acked: Any) -> None:
    from queuectl.client import Queue

    with Queue(url, QUEUE) as q:
        while not stop.is_set():
            batch = q.dequeue(20, lease=60)
            if batch:
                done = q.ack(batch)
                with acked.get_lock():
                    acked.value += done
            else:
                time.sleep(0.005)


def _archiver(url: str, stop: Any, moved: Any, min_age: float, delay: float, batch: int) -> None:
    from queuectl.engine import make_engine
    from queuectl.jobs.archive import ArchiveConfig, run_continuous

    engine = make_engine(url)
    config = ArchiveConfig(min_age=min_age, delay=delay, batch=batch)

    def progress(p: Any) -> None:
        moved.value = p.rows

    import threading

    event = threading.Event()
    threading.Thread(target=lambda: (stop.wait(), event.set()), daemon=True).start()
    run_continuous(engine, QUEUE, config, stop=event, on_progress=progress)


def trial(url: str, archiving: bool, args: argparse.Namespace) -> dict[str, float]:
    from queuectl.engine import make_engine
    from queuectl.install import get_queue, install_queue, uninstall_queue

    engine = make_engine(url)
    with engine.connect() as conn:
        if get_queue(conn, QUEUE):
            uninstall_queue(engine, QUEUE)
    install_queue(engine, QUEUE)
    engine.dispose()
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    enqueued, acked, moved = ctx.Value("q", 0), ctx.Value("q", 0), ctx.Value("q", 0)
    procs = [ctx.Process(target=_producer, args=(url, stop, enqueued)) for _ in range(args.producers)]
    procs += [ctx.Process(target=_consumer, args=(url, stop, acked)) for _ in range(args.consumers)]
    if archiving:
        procs.append(ctx.Process(target=_archiver, args=(url, stop, moved, args.min_age, args.delay, args.batch)))
    for p in procs:
        p.start()
    time.sleep(args.warmup)
    a0, e0, m0, t0 = acked.value, enqueued.value, moved.value, time.monotonic()
    time.sleep(args.seconds)
    a1, e1, m1, t1 = acked.value, enqueued.value, moved.value, time.monotonic()
    stop.set()
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    elapsed = t1 - t0
    return {"acked_per_s": (a1 - a0) / elapsed, "enqueued_per_s": (e1 - e0) / elapsed,
            "archived_per_s": (m1 - m0) / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="database URL (default: $QUEUECTL_URL, else the embedded server)")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured window per trial")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--min-age", type=float, default=1.0, help="archive min age in seconds")
    parser.add_argument("--delay", type=float, default=0.2, help="archive pause between batches in seconds")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    from queuectl.engine import mask_url, resolve_url

    url = resolve_url(args.url)
    results: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for r in range(args.repeats):
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
            res = trial(url, mode == "on", args)
            results[mode].append(res)
            print(f"repeat {r + 1} archive {mode:3}: acked {res['acked_per_s']:8.0f}/s  enqueued "
                  f"{res['enqueued_per_s']:8.0f}/s  archived {res['archived_per_s']:8.0f}/s", flush=True)
    med = {mode: {k: statistics.median(x[k] for x in runs) for k in runs[0]} for mode, runs in results.items()}
    loss = 1 - med["on"]["acked_per_s"] / med["off"]["acked_per_s"]
    print(f"\nmedians over {args.repeats} repeats ({args.producers} producers, {args.consumers} consumers, "
          f"{args.seconds:g} s windows, archive min-age {args.min_age:g}s delay {args.delay:g}s batch {args.batch}):")
    for mode in ("off", "on"):
        m = med[mode]
        print(f"  archive {mode:3}: acked {m['acked_per_s']:8.0f}/s  enqueued {m['enqueued_per_s']:8.0f}/s  "
              f"archived {m['archived_per_s']:8.0f}/s")
    print(f"  foreground (acked/s) loss with archiving on: {loss * 100:.1f} %")
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump({"url": mask_url(url), "args": vars(args), "runs": results, "medians": med, "loss": loss}, fh, indent=2)


if __name__ == "__main__":
    main()
