"""Probe: what a truncate of a generation's slot costs each session's next claim and ack on that slot.

The time of a claim and an ack on slot 0's own tables in one session, in steady state and
right after another session truncated the slot (the session plans them again).

    python bench/lab/replan.py [--calls 200] [--url URL]

A queue of its own (lab_replan, reliable, empty). For each call (the claim of dequeue(10),
the ack of three ids): 20 warm-up calls, then --calls timed calls in a row ("steady"), then
--calls more each right after a TRUNCATE of slot 0's tables by a second session ("after a
truncate"). Reported: the medians as the client sees them, and their difference, what each
session pays for each statement on a slot once per truncate of that slot. Without --url the
embedded server is used (as `queuectl` itself does).
"""

from __future__ import annotations

import argparse
import statistics
import time

from lab_helpers import probe_sql
from queuectl.bench.drivers import reinstall_queue
from queuectl.engine import make_engine
from queuectl.install import uninstall_queue
from queuectl.names import QueueNames

QUEUE = "lab_replan"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--url", default=None)
    args = parser.parse_args()
    engine = make_engine(args.url)
    names = QueueNames(QUEUE)
    values = names.template_values()
    reinstall_queue(engine, QUEUE)
    try:
        with engine.connect() as worker, engine.connect() as other:
            worker = worker.execution_options(isolation_level="AUTOCOMMIT")
            other = other.execution_options(isolation_level="AUTOCOMMIT")
            truncate = probe_sql("replan_truncate", values)

            def timed(sql: str) -> float:
                t0 = time.perf_counter()
                worker.exec_driver_sql(sql).fetchall()
                return (time.perf_counter() - t0) * 1e6

            print(f"{'call':<8}{'steady us':>12}{'after a truncate us':>22}{'difference us':>16}")
            for call in ("claim", "ack"):
                sql = probe_sql(f"replan_{call}", values)
                for _ in range(20):
                    timed(sql)
                steady = statistics.median(timed(sql) for _ in range(args.calls))
                after = []
                for _ in range(args.calls):
                    other.exec_driver_sql(truncate)
                    after.append(timed(sql))
                late = statistics.median(after)
                print(f"{call:<8}{steady:>12.0f}{late:>22.0f}{late - steady:>16.0f}")
    finally:
        uninstall_queue(engine, QUEUE, names.schema)


if __name__ == "__main__":
    main()
