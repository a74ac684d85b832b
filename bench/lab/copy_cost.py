"""Probe: what the archive job's precopy costs a row at two revisions of the reliable queue: a generation's finished rows copied to history in the job's batches.

    python bench/lab/copy_cost.py [--old reliable_0017] [--rows 2000] [--rounds 40] [--url URL]

Two queues of their own: lab_copy_old at --old and lab_copy_new at the head. Each gets --rows
300-byte items, claimed and acked (a generation of finished rows in slot 0). Each round, for
each queue in turn (the order alternating): history vacuumed (the previous round's rolled-back
rows leave dead entries in its key), then the precopy timed as the archive job runs it (rot_copy
in batches of 1,000 from id 0 until it returns no last id), in one transaction rolled back.
Reported: the medians per generation and per row, and the new over the old. Without --url the
embedded server is used (as `queuectl` itself does).
"""

from __future__ import annotations

import argparse
import statistics
import time

import sqlalchemy as sa

from lab_helpers import claimed_items, probe_sql
from queuectl.bench.drivers import reinstall_queue
from queuectl.client import Queue
from queuectl.engine import make_engine
from queuectl.install import uninstall_queue
from queuectl.names import QueueNames

BATCH = 1000  # the archive job's default copy batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default="reliable_0017")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--url", default=None)
    args = parser.parse_args()
    engine = make_engine(args.url)
    queues = {"old": QueueNames("lab_copy_old"), "new": QueueNames("lab_copy_new")}
    sql = {way: {section: sa.text(probe_sql(f"copy_cost_{section}", names.template_values()))
                 for section in ("batch", "vacuum")} for way, names in queues.items()}
    try:
        for way, names in queues.items():
            reinstall_queue(engine, names.queue, revision=args.old if way == "old" else None)
            with Queue(engine, names.queue) as q:
                q.ack(claimed_items(q, args.rows))
        times: dict[str, list[float]] = {"old": [], "new": []}
        copied: dict[str, int] = {}
        calls: dict[str, int] = {}
        for r in range(args.rounds):
            for way in ("old", "new") if r % 2 == 0 else ("new", "old"):
                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    conn.execute(sql[way]["vacuum"])
                with engine.connect() as conn:
                    after, copied[way], calls[way] = 0, 0, 0
                    t0 = time.perf_counter()
                    while after is not None:
                        row = conn.execute(sql[way]["batch"], {"slot": 0, "after": after, "batch": BATCH}).one()
                        copied[way] += row.copied
                        calls[way] += 1
                        after = row.last_id
                    times[way].append((time.perf_counter() - t0) * 1000)
                    conn.rollback()
        print(f"a generation of {args.rows} finished rows, batches of {BATCH}, {args.rounds} rounds")
        print(f"{'revision':<16}{'calls':>6}{'copied':>8}{'median ms':>11}{'us a row':>10}")
        for way, names in queues.items():
            revision = args.old if way == "old" else "head"
            med = statistics.median(times[way])
            print(f"{revision:<16}{calls[way]:>6}{copied[way]:>8}{med:>11.2f}{med * 1000 / args.rows:>10.2f}")
        ratios = [n / o for o, n in zip(times["old"], times["new"])]
        print(f"head / {args.old}: {statistics.median(ratios):.2f}x (median of the rounds' quotients)")
    finally:
        for names in queues.values():
            uninstall_queue(engine, names.queue, names.schema)


if __name__ == "__main__":
    main()
