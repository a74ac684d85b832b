"""Probe: what the archive job's copy under the truncate's lock costs, looking up every finished row of the generation in history or only those finished since the precopy's horizon.

    python bench/lab/empty_look.py [--rows 2000] [--late 20] [--calls 40] [--url URL]

A queue of its own (lab_empty_look, reliable). --rows items are enqueued, claimed and all but
--late acked; the generation is switched and sealed; the job's horizon is taken and the
generation precopied in batches of 1,000 (as the archive job does); then the last --late are
acked (what finishes between the precopy and the truncate). Then the copy rot_empty runs under
its lock (rot_copy from id 0, all rows) is timed --calls times each way, alternating, each in
a transaction rolled back: without the horizon (every finished row looked up in history, as
before reliable_0017) and with it. Reported: the medians as the client sees them, what each
way copied, and the difference per row of the generation. Without --url the embedded server
is used (as `queuectl` itself does).
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

QUEUE = "lab_empty_look"
BATCH = 1000  # the archive job's default copy batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--late", type=int, default=20)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--url", default=None)
    args = parser.parse_args()
    engine = make_engine(args.url)
    names = QueueNames(QUEUE)
    values = names.template_values()

    def sql(section: str) -> sa.TextClause:
        return sa.text(probe_sql(f"empty_look_{section}", values))

    reinstall_queue(engine, QUEUE)
    try:
        with Queue(engine, QUEUE) as q:
            taken = claimed_items(q, args.rows)
            q.ack(taken[:len(taken) - args.late])
            with engine.begin() as conn:
                epoch = conn.execute(sql("switch")).scalar_one()
            with engine.begin() as conn:
                conn.execute(sql("seal"), {"epoch": epoch - 1})
            slot = (epoch - 1) % 3
            with engine.begin() as conn:
                horizon = conn.execute(sql("horizon")).scalar_one()
            after, precopied = 0, 0
            while True:
                with engine.begin() as conn:
                    row = conn.execute(sql("precopy"), {"slot": slot, "after": after, "batch": BATCH}).one()
                precopied += row.copied
                if row.last_id is None:
                    break
                after = row.last_id
            if args.late:
                q.ack(taken[len(taken) - args.late:])
        times: dict[str, list[float]] = {"every row": [], "since the horizon": []}
        copied: dict[str, int] = {}
        for i in range(args.calls):
            ways = [("every row", None), ("since the horizon", horizon)]
            for way, cut in ways if i % 2 == 0 else ways[::-1]:
                with engine.connect() as conn:
                    t0 = time.perf_counter()
                    copied[way] = conn.execute(sql("copy"), {"slot": slot, "horizon": cut}).one().copied
                    times[way].append((time.perf_counter() - t0) * 1e6)
                    conn.rollback()
        print(f"generation of {args.rows} rows, {precopied} precopied, {args.late} finished after; {args.calls} calls each")
        print(f"{'look-up':<20}{'median us':>12}{'copied':>8}")
        for way, samples in times.items():
            print(f"{way:<20}{statistics.median(samples):>12.0f}{copied[way]:>8}")
        saved = statistics.median(times["every row"]) - statistics.median(times["since the horizon"])
        print(f"saved: {saved:.0f} us a generation, {saved / args.rows:.2f} us a row")
    finally:
        uninstall_queue(engine, QUEUE, names.schema)


if __name__ == "__main__":
    main()
