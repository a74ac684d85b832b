"""Probe: the server CPU one NOTIFY costs for every session that LISTENs in the database, on any channel.

    python bench/lab/listener_cost.py [--url URL] [--pgdata DIR] [--listeners 0,8,32] [--rounds 3] [--notifies 5000]

For each count of listening sessions (each LISTENs on a channel nobody notifies, and sits
idle, as a worker's LISTEN session does between wake-ups), one session sends --notifies
autocommit `SELECT pg_notify(...)` on another channel; the server's CPU over those
statements (every process of the local server, from /proc, as
bench/lab/consumers_cpu.py reads it) per notification, and notifications/s. PostgreSQL 15
signals every backend that LISTENs in the database at each committed notification, whatever
its channel; each signalled backend wakes, reads the notification queue and discards what
is not for it. With many consumers that each keep a LISTEN session, every enqueue that
notifies pays that for all of them. Counts run in the order given, --rounds times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from consumers_cpu import server_cpu

from queuectl.engine.embedded import default_home

LISTEN_CHANNEL = "queuectl_probe_listen"
NOTIFY_CHANNEL = "queuectl_probe_notify"
WARMUP = 200


def measure(dsn: str, postmaster: int, listeners: int, notifies: int) -> dict[str, float]:
    import psycopg
    from psycopg import sql

    idle = [psycopg.connect(dsn, autocommit=True) for _ in range(listeners)]
    try:
        for conn in idle:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(LISTEN_CHANNEL)))
        with psycopg.connect(dsn, autocommit=True) as sender:
            for _ in range(WARMUP):
                sender.execute("SELECT pg_notify(%s, '')", (NOTIFY_CHANNEL,))
            cpu0, t0 = server_cpu(postmaster), time.perf_counter()
            for _ in range(notifies):
                sender.execute("SELECT pg_notify(%s, '')", (NOTIFY_CHANNEL,))
            seconds, cpu1 = time.perf_counter() - t0, server_cpu(postmaster)
    finally:
        for conn in idle:
            conn.close()
    return {"listeners": listeners, "notifies_per_s": notifies / seconds,
            "server_cpu_us_per_notify": 1e6 * (cpu1 - cpu0) / notifies}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=None, help="database URL (default: $QUEUECTL_URL, else the embedded server)")
    parser.add_argument("--pgdata", type=Path, default=None, help="the local server's data directory")
    parser.add_argument("--listeners", default="0,8,32", help="comma-separated counts of listening sessions")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--notifies", type=int, default=5000)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    from sqlalchemy.engine import make_url

    from queuectl.bench.report import write_json
    from queuectl.engine import resolve_url
    from queuectl.engine.urls import mask_url

    url = resolve_url(args.url)
    pgdata = args.pgdata or default_home() / "pgdata"
    postmaster = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    counts = [int(c) for c in args.listeners.split(",")]
    runs = []
    for r in range(args.rounds):
        for n in counts:
            res = measure(dsn, postmaster, n, args.notifies)
            runs.append({"round": r + 1, **res})
            print(f"round {r + 1}: {n:3} listening sessions: {res['notifies_per_s']:7,.0f} notifies/s, "
                  f"server CPU {res['server_cpu_us_per_notify']:6.1f} us per notify", flush=True)
            time.sleep(1)
    summary = {n: statistics.median(x["server_cpu_us_per_notify"] for x in runs if x["listeners"] == n)
               for n in counts}
    print("medians, server CPU us per notify: " + ", ".join(f"{n} listening: {v:.1f}" for n, v in summary.items()))
    write_json(args.json_path, {"url": mask_url(url), "args": vars(args) | {"pgdata": str(pgdata)}, "runs": runs,
                                "median_us_per_notify": {str(k): v for k, v in summary.items()}})
    if args.json_path:
        print(json.dumps({"json": args.json_path}))


if __name__ == "__main__":
    main()
