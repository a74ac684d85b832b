"""Probe: rows/s of `queuectl pipeline export`, N synthetic history rows exported R times into fresh lakes.

    .venv/bin/python bench/lab/export.py --rows 1000000 --repeat 3 --master 'local[2]'

Without --url (or $QUEUECTL_URL) it starts a throwaway embedded PostgreSQL under /tmp.
The Spark session is started (and timed) once before the runs; each run is
export_history() alone: bounds, JDBC read in parallel id ranges, Parquet write, commit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from queuectl.engine import make_engine
from queuectl.engine.urls import mask_url
from queuectl.install import install_queue, uninstall_queue
from queuectl.names import QueueNames
from queuectl.pipeline import export_history
from queuectl.pipeline.jdbc import find_jdbc_jar
from queuectl.pipeline.spark import get_session
from queuectl.sqlfiles import render

QUEUE = "bench_export"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=None)
    parser.add_argument("--payload-bytes", type=int, default=64)
    parser.add_argument("--url", default=os.environ.get("QUEUECTL_URL"))
    parser.add_argument("--json", dest="json_out", default=None, help="Also write the results here.")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="queuectl-bench-export-", dir="/tmp"))
    os.chmod(work, 0o755)
    server = None
    try:
        url = args.url
        if not url:
            from queuectl.engine.embedded import EmbeddedServer

            server = EmbeddedServer(work / "pg")
            url = server.ensure_running()
        engine = make_engine(url)
        install_queue(engine, QUEUE)
        t0 = time.monotonic()
        with engine.begin() as conn:
            conn.execute(
                sa.text(render("postgresql", "pipeline", "synthetic_history", {"history": QueueNames(QUEUE).qualified("history")})),
                dict(n=args.rows, first_id=0, start="2025-01-01T00:00:00Z", hours=24 * 7, payload_bytes=args.payload_bytes),
            )
        fill_s = time.monotonic() - t0
        time.sleep(1.5)  # rows must be older than the export bound's one-second margin
        t0 = time.monotonic()
        get_session(args.master, [find_jdbc_jar("postgresql")])
        session_s = time.monotonic() - t0
        runs = []
        for i in range(args.repeat):
            lake = work / f"lake-{i}"
            result = export_history(engine, str(lake), [QUEUE], partitions=args.partitions)
            assert result.rows == args.rows, result.as_dict()
            runs.append({"seconds": result.seconds, "rows_per_second": result.rows / result.seconds,
                         "partitions": result.queues[0].partitions, "files": result.queues[0].files})  # fmt: skip
            print(f"run {i + 1}: {result.rows:,} rows in {result.seconds:.2f} s = {result.rows / result.seconds:,.0f} rows/s", flush=True)
            shutil.rmtree(lake)
        summary = {
            "rows": args.rows,
            "master": args.master,
            "database": mask_url(url),
            "fill_seconds": round(fill_s, 2),
            "session_start_seconds": round(session_s, 2),
            "runs": runs,
            "median_seconds": round(statistics.median(r["seconds"] for r in runs), 2),
            "median_rows_per_second": round(statistics.median(r["rows_per_second"] for r in runs)),
            "load_average": os.getloadavg(),
            "cpus": os.cpu_count(),
        }
        print(json.dumps(summary, indent=2))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(summary, indent=2) + "\n")
        uninstall_queue(engine, QUEUE)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
