"""Probe: the archive job's own time per generation, alone on the server, and its client's CPU: the pass that switches, seals, precopies and empties a generation of the reliable queue.

    python bench/lab/job_alone.py [--items 2000] [--rounds 12] [--late 20] [--url URL]

A queue of its own (lab_job_alone, reliable, generations of --items ids). Each round enqueues
--items 300-byte items, claims them all and acks all but --late (those stay leased across the
pass, and the truncate moves them forward; the next round acks them), then times the archive
job's rotation (queuectl.jobs.archive.Rotator, as the scheduler runs it: two passes, the first
switching and sealing, the second emptying what the first could not). Reported: each round's
time, the job's client CPU (this process's) and what the passes did, and the medians over the
rounds after the first two. Run it from
two checkouts in turn to compare revisions (the queue is installed at the checkout's head);
with pg_stat_statements the job's statements can be read per call. Without --url the embedded
server is used (as `queuectl` itself does).
"""

from __future__ import annotations

import argparse
import statistics
import time

from lab_helpers import claimed_items
from queuectl.bench.drivers import reinstall_queue
from queuectl.client import Queue
from queuectl.engine import make_engine
from queuectl.install import uninstall_queue
from queuectl.jobs.archive import ArchiveConfig, Rotator
from queuectl.jobs.base import JobTarget
from queuectl.names import QueueNames

QUEUE = "lab_job_alone"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--late", type=int, default=20)
    parser.add_argument("--url", default=None)
    args = parser.parse_args()
    engine = make_engine(args.url)
    names = QueueNames(QUEUE)
    reinstall_queue(engine, QUEUE)
    try:
        target = JobTarget.resolve(engine, QUEUE, names.schema, ("reliable",))
        rotator = Rotator(engine, target, ArchiveConfig(rotate_items=args.items))
        times: list[float] = []
        cpus: list[float] = []  # this process's CPU: the job's own client side
        held: list = []
        with Queue(engine, QUEUE) as q:
            for r in range(args.rounds):
                taken = claimed_items(q, args.items)
                q.ack(held + taken[:len(taken) - args.late])
                held = taken[len(taken) - args.late:]
                t0, c0 = time.perf_counter(), time.process_time()
                passes = (rotator.rotate(), rotator.rotate())
                times.append((time.perf_counter() - t0) * 1000)
                cpus.append((time.process_time() - c0) * 1000)
                done = "; ".join(f"switched {p.switched}, emptied {p.emptied}, copied {p.copied}" for p in passes)
                print(f"round {r + 1}: {times[-1]:.1f} ms, client CPU {cpus[-1]:.1f} ms ({done})", flush=True)
        print(f"{target.info.schema_version}: median {statistics.median(times[2:]):.1f} ms a generation of {args.items} ids, "
              f"the job's client CPU {statistics.median(cpus[2:]):.1f} ms")
    finally:
        uninstall_queue(engine, QUEUE, names.schema)


if __name__ == "__main__":
    main()
