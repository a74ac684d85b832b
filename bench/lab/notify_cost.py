"""Probe: what the enqueue notification costs producers, per reliable revision.

    python bench/lab/notify_cost.py [--url URL] [--rounds 5] [--producers 1,4] [--seconds 3]

Queues side by side: reliable_0001 (no notification), reliable_0005 (reliable_0002's
trigger: NOTIFY in every enqueueing transaction), the head (reliable_0006: NOTIFY only
while a consumer is registered as possibly sleeping) with no consumer registered, and the
head again while one session is registered (LISTEN + wait_begin, as an idle worker is).
Each round runs, in turn on each queue, P producer processes doing single-item enqueues
(one transaction each) for `seconds`, then one process doing enqueue_many of 100; the
order of the queues is rotated between rounds. Reported: medians of items/s over the
rounds, and each one's ratio to the queue without notification.

Why producers matter: PostgreSQL serialises the commits of all transactions that sent a
notification (PreCommit_Notify takes a cluster-wide lock held through commit, so that
notifications are queued in commit order). Concurrent single-item producers that notify
therefore stop sharing WAL flushes (group commit); batch enqueues pay it once per batch.
Without --url (or $QUEUECTL_URL) a throwaway server is started in a temporary folder.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _single_producer(url: str, queue: str, seconds: float, start: mp.Event, out: mp.Queue) -> None:
    from queuectl.client import Queue

    with Queue(url, queue) as q:
        start.wait()
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            q.enqueue(b"x" * 100)
            n += 1
    out.put(n)


def _batch_producer(url: str, queue: str, seconds: float, start: mp.Event, out: mp.Queue) -> None:
    from queuectl.client import Queue

    with Queue(url, queue) as q:
        start.wait()
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            n += len(q.enqueue_many([b"x" * 100] * 100))
    out.put(n)


def measure(url: str, queue: str, producers: int, seconds: float, target) -> float:
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, queue, seconds, start, out)) for _ in range(producers)]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let them connect
    start.set()
    total = sum(out.get(timeout=seconds + 120) for _ in procs)
    for p in procs:
        p.join()
    return total / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--producers", default="1,4", help="comma-separated producer counts for single enqueues")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.producers.split(",")]

    from queuectl.engine import make_engine
    from queuectl.install import install_queue, uninstall_queue

    url = args.url or os.environ.get("QUEUECTL_URL")
    server = None
    with tempfile.TemporaryDirectory(prefix="queuectl-notify-cost-", dir="/tmp") as tmp:
        os.chmod(tmp, 0o755)
        if not url:
            from queuectl.engine.embedded import EmbeddedServer

            server = EmbeddedServer(Path(tmp) / "pg")
            url = server.ensure_running()
        engine = make_engine(url)
        # label -> (queue, revision, a consumer session registered while producers run)
        queues = {
            "0001 no notify": ("nc_plain", "reliable_0001", False),
            "0005 always": ("nc_always", "reliable_0005", False),
            "head, none waits": ("nc_gated", None, False),
            "head, one waits": ("nc_waited", None, True),
        }
        for queue, revision, _waits in queues.values():
            install_queue(engine, queue, **({"revision": revision} if revision else {}))
        results: dict[tuple[str, str], list[float]] = {}
        try:
            labels = list(queues)
            for round_ in range(args.rounds):
                order = labels[round_ % len(labels):] + labels[:round_ % len(labels)]
                for label in order:
                    queue, _revision, waits = queues[label]
                    waiter = _registered_session(url, queue) if waits else None
                    try:
                        for p in counts:
                            rate = measure(url, queue, p, args.seconds, _single_producer)
                            results.setdefault((f"single enqueues, {p} producer(s)", label), []).append(rate)
                        rate = measure(url, queue, 1, args.seconds, _batch_producer)
                        results.setdefault(("enqueue_many(100), 1 producer", label), []).append(rate)
                    finally:
                        if waiter is not None:
                            waiter.close()
                print(f"round {round_ + 1} done", flush=True)
        finally:
            for queue, _revision, _waits in queues.values():
                uninstall_queue(engine, queue)
            engine.dispose()
            if server is not None:
                server.stop()
    print(f"medians of {args.rounds} rounds, items/s, (x the queue without notification); "
          f"load average now {os.getloadavg()[0]:.1f}")
    print(f"| scenario | {' | '.join(queues)} |")
    print(f"|---|{'---:|' * len(queues)}")
    for scenario in sorted({s for s, _ in results}):
        plain = statistics.median(results[(scenario, "0001 no notify")])
        cells = []
        for label in queues:
            rate = statistics.median(results[(scenario, label)])
            runs = " / ".join(f"{r:,.0f}" for r in results[(scenario, label)])
            cells.append(f"{rate:,.0f} ({rate / plain:.2f}x; {runs})")
        print(f"| {scenario} | {' | '.join(cells)} |")
    return 0


def _registered_session(url: str, queue: str):
    """A session that LISTENs on the queue's channel and is registered as a consumer that may
    sleep (the activation.sql calls an idle worker makes), held while producers run."""
    from queuectl.engine import make_engine
    from queuectl.names import QueueNames
    from queuectl.sqlfiles import render

    names = QueueNames(queue)
    engine = make_engine(url, pool_size=1)
    raw = engine.raw_connection()
    conn = raw.driver_connection
    raw.detach()
    engine.dispose()
    conn.rollback()
    conn.autocommit = True
    conn.execute(render("postgresql", "activation", "listen", names.template_values()))
    conn.execute(render("postgresql", "activation", "wait_begin", names.template_values()))
    return conn


if __name__ == "__main__":
    sys.exit(main())
