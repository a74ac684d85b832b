"""Probe: what one compaction costs under its lock, by live rows, with an array or a temporary table.

The product's compact job (queuectl.jobs.compact) copies the live rows into an array.

    python bench/lab/compact_cost.py [--rows 8192,50000,65536] [--repeats 5] [--url URL] [--json out.json]

For each row count: a fifo queue holding that many 300-byte items, compacted `repeats` times
each way (the product's compact_items with its array in scan order, and sorted by id; a temporary table
dropped at commit), with a REPEATABLE READ snapshot held open throughout; a ring of that
many slots, compacted by
the product's compact_ring (and sorted by slot). Reported: the median and largest seconds under the lock (measured
inside the transaction, after the lock is granted), and the dead catalog versions the runs left
(pg_class, pg_attribute, pg_type, pg_depend: a temporary table writes rows there, which the
pinned horizon keeps); the ring also with its three empty side tables truncated as well
(what the job avoids). Without --url (or $QUEUECTL_URL) a throwaway server is started.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from lab_helpers import lab_sql
from queuectl.install import install_queue, uninstall_queue
from queuectl.jobs.base import JobTarget
from queuectl.kindspec import RingSettings
from queuectl.names import QueueNames
from queuectl.registry import require_queue

PAYLOAD = b"p" * 300
RING_ONLY = {"ring_due": 1, "large_due": 0, "subs_due": 0, "slots_due": 0}  # what the job does for a plain ring
ALL_FOUR = dict.fromkeys(RING_ONLY, 1)  # the side table and the fan-out tables too, empty as they are


def target(engine: sa.Engine, name: str) -> JobTarget:
    with engine.connect() as conn:
        info = require_queue(conn, name, "queuectl")
    return JobTarget(QueueNames(name, "queuectl"), info, "postgresql")


def compact_once(engine: sa.Engine, statement: sa.TextClause) -> float:
    with engine.connect() as conn:
        conn.execute(statement)
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
        rows_seconds = conn.execute(sa.text("SELECT current_setting('queuectl.compacted', true)")).scalar_one()
        conn.commit()
    return float(rows_seconds.split()[1])


def catalog_dead(engine: sa.Engine) -> int:
    time.sleep(1.1)  # statistics reach the collector at most once a second
    with engine.connect() as conn:
        return int(conn.execute(sa.text(lab_sql("compact_cost", "catalog_dead", {}))).scalar_one())


def one_size(engine: sa.Engine, rows: int, repeats: int) -> dict:
    install_queue(engine, "cc", "fifo")
    install_queue(engine, "cr", "ring", RingSettings(size=rows))
    fifo, ring = target(engine, "cc"), target(engine, "cr")
    with engine.begin() as conn:
        conn.execute(sa.text('INSERT INTO queuectl."cc_items" (payload) SELECT :p FROM generate_series(1, :n)'),
                     {"p": PAYLOAD, "n": rows})
        conn.execute(sa.text('UPDATE queuectl."cr_ring" SET payload = :p, state = 0'), {"p": PAYLOAD})
    holder = engine.connect()
    holder.execute(sa.text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
    holder.execute(sa.text(lab_sql("compact_cost", "hold", {}))).scalar()
    out: dict = {"rows": rows}
    try:
        for label, statement in (
            ("fifo_array_sorted", sa.text(fifo.sql("compact_items", max_rows=10_000_000).text.replace(
                "SELECT * FROM unnest(v_items);", "SELECT * FROM unnest(v_items) u ORDER BY u.id;"))),
            ("fifo_array", fifo.sql("compact_items", max_rows=10_000_000)),
            ("fifo_temp_table", sa.text(lab_sql("compact_cost", "compact_temp", {"items": fifo.names.qualified("items")}))),
            ("ring_array_sorted", sa.text(ring.sql("compact_ring", max_rows=10_000_000, **RING_ONLY).text.replace(
                "SELECT * FROM unnest(v_ring);", "SELECT * FROM unnest(v_ring) u ORDER BY u.slot;"))),
            ("ring_array", ring.sql("compact_ring", max_rows=10_000_000, **RING_ONLY)),
            ("ring_all_four_tables", ring.sql("compact_ring", max_rows=10_000_000, **ALL_FOUR)),
        ):
            before = catalog_dead(engine)
            seconds = [compact_once(engine, statement) for _ in range(repeats)]
            out[label] = {"lock_ms_median": round(statistics.median(seconds) * 1000, 2),
                          "lock_ms_max": round(max(seconds) * 1000, 2),
                          "catalog_dead_versions": catalog_dead(engine) - before}
            print(f"{rows:>7,} rows {label:>16}: lock {out[label]['lock_ms_median']:7.2f} ms median, "
                  f"{out[label]['lock_ms_max']:7.2f} max; catalog dead versions +{out[label]['catalog_dead_versions']}",
                  flush=True)
    finally:
        holder.rollback()
        holder.close()
        uninstall_queue(engine, "cc", "queuectl")
        uninstall_queue(engine, "cr", "queuectl")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="8192,50000,65536")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--url", default=os.environ.get("QUEUECTL_URL"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="queuectl-compact-", dir="/tmp") as tmp:
        server = None
        url = args.url
        if not url:
            from queuectl.engine.embedded import EmbeddedServer

            os.chmod(tmp, 0o755)
            server = EmbeddedServer(Path(tmp) / "pg")
            server.ensure_running()
            url = server.url("postgres")
        engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        try:
            for rows in (int(r) for r in args.rows.split(",")):
                results.append(one_size(engine, rows, args.repeats))
        finally:
            engine.dispose()
            if server is not None:
                server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
