"""Probe: one consumer's dequeue+ack rate on an analyzed reliable queue, reliable_0004 against the head.

    python bench/lab/dequeue_plan.py --rows 20000,100000 --repeats 3 [--url URL]

For each size, two queues are installed side by side, one at reliable_0004 and one at the
head, each filled with `rows` messages of 300 B and then vacuumed and analyzed (as
autovacuum does to a live queue), and one consumer drains `dequeue(100)` + `ack` for
`--seconds` on each in turn, alternating which goes first. Reported per size: messages/s
(median of the repeats), the median time of one dequeue(100) call during the drain, and
the head / reliable_0004 ratio of the rates taken per repeat.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import sqlalchemy as sa

from queuectl.bench.drivers import analyze_filled, enqueue_in_chunks
from queuectl.bench.report import write_json
from queuectl.client import Queue
from queuectl.engine import make_engine
from queuectl.install import head_of, install_queue, uninstall_queue
from queuectl.registry import list_queues
from queuectl.names import QueueNames

BEFORE = "reliable_0004"
PAYLOAD = bytes(300)


def _fill(engine: sa.Engine, name: str, rows: int, revision: str | None) -> None:
    install_queue(engine, name, **({"revision": revision} if revision else {}))
    with Queue(engine, name) as queue:
        enqueue_in_chunks(queue, PAYLOAD, rows)
    analyze_filled(engine, "reliable", QueueNames(name))


def _drain(engine: sa.Engine, name: str, seconds: float) -> tuple[float, float]:
    """Messages per second, and the median time of one dequeue(100) call (client clock)."""
    with Queue(engine, name) as queue:
        for _ in range(6):  # psycopg prepares on the 5th execution; plpgsql may go generic after 5
            queue.ack(queue.dequeue(100))
        done, calls, started = 0, [], time.perf_counter()
        while time.perf_counter() - started < seconds:
            before = time.perf_counter()
            batch = queue.dequeue(100)
            calls.append(time.perf_counter() - before)
            if not batch:
                break
            done += queue.ack(batch)
        return done / (time.perf_counter() - started), statistics.median(calls) * 1000


def run(url: str | None, sizes: list[int], repeats: int, seconds: float) -> dict[str, Any]:
    engine = make_engine(url)
    results: dict[str, Any] = {"head": head_of("reliable"), "before": BEFORE, "seconds": seconds, "sizes": {}}
    try:
        for rows in sizes:
            cell: dict[str, Any] = {"before": [], "head": [], "ratio": []}
            for repeat in range(repeats):
                names = {"before": "plan_before", "head": "plan_head"}
                for name in names.values():
                    if _exists(engine, name):
                        uninstall_queue(engine, name)
                _fill(engine, names["before"], rows, BEFORE)
                _fill(engine, names["head"], rows, None)
                order = ("before", "head") if repeat % 2 == 0 else ("head", "before")
                drained = {which: _drain(engine, names[which], seconds) for which in order}
                for which, (rate, call_ms) in drained.items():
                    cell[which].append(rate)
                    cell.setdefault(f"call_ms_{which}", []).append(call_ms)
                cell["ratio"].append(drained["head"][0] / drained["before"][0])
                for name in names.values():
                    uninstall_queue(engine, name)
            for key in ("before", "head", "ratio", "call_ms_before", "call_ms_head"):
                cell[f"{key}_median"] = statistics.median(cell[key])
            results["sizes"][str(rows)] = cell
            print(f"{rows:>7} rows: {BEFORE} {cell['before_median']:,.0f} msg/s ({cell['call_ms_before_median']:.2f} ms "
                  f"per dequeue(100)), {results['head']} {cell['head_median']:,.0f} msg/s "
                  f"({cell['call_ms_head_median']:.2f} ms), "
                  f"head/before per repeat {' / '.join(f'{r:.2f}' for r in cell['ratio'])}, median {cell['ratio_median']:.2f}x",
                  flush=True)
    finally:
        engine.dispose()
    return results


def _exists(engine: sa.Engine, name: str) -> bool:
    with engine.connect() as conn:
        return any(q.name == name for q in list_queues(conn))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="database URL (default: the embedded server)")
    parser.add_argument("--rows", default="20000,100000", help="comma-separated queue sizes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="drain time per queue and repeat")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    sizes = [int(part) for part in args.rows.split(",") if part.strip()]
    results = run(args.url, sizes, args.repeats, args.seconds)
    write_json(args.json_path, results)


if __name__ == "__main__":
    main()
