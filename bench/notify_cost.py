"""What the enqueue notification (reliable_0002) costs producers.

    python -m queuectl.bench.notify_cost [--url URL] [--rounds 5] [--producers 1,4] [--seconds 3]

Two queues side by side, one at reliable_0001 (no notification) and one at the head
(statement-level trigger + pg_notify). Each round runs, in turn on each queue, P producer
processes doing single-item enqueues (one transaction each) for `seconds`, then one
process doing enqueue_many of 100; the order of the two queues alternates between
rounds. Reported: medians of items/s over the rounds.

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
            from queuectl.embedded import EmbeddedServer

            server = EmbeddedServer(Path(tmp) / "pg")
            url = server.ensure_running()
        engine = make_engine(url)
        queues = {"without notify (0001)": "nc_plain", "with notify (0002)": "nc_notify"}
        install_queue(engine, "nc_plain", revision="reliable_0001")
        install_queue(engine, "nc_notify")
        results: dict[tuple[str, str], list[float]] = {}
        try:
            for round_ in range(args.rounds):
                order = list(queues.items()) if round_ % 2 == 0 else list(reversed(queues.items()))
                for label, queue in order:
                    for p in counts:
                        rate = measure(url, queue, p, args.seconds, _single_producer)
                        results.setdefault((f"single enqueues, {p} producer(s)", label), []).append(rate)
                    rate = measure(url, queue, 1, args.seconds, _batch_producer)
                    results.setdefault(("enqueue_many(100), 1 producer", label), []).append(rate)
                print(f"round {round_ + 1} done", flush=True)
        finally:
            for queue in queues.values():
                uninstall_queue(engine, queue)
            engine.dispose()
            if server is not None:
                server.stop()
    print(f"medians of {args.rounds} rounds, items/s (load average now {os.getloadavg()[0]:.1f}):")
    scenarios = sorted({s for s, _ in results})
    for scenario in scenarios:
        plain = statistics.median(results[(scenario, "without notify (0001)")])
        notify = statistics.median(results[(scenario, "with notify (0002)")])
        print(f"  {scenario:36s} without {plain:9,.0f}   with {notify:9,.0f}   ({100 * (notify / plain - 1):+.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
