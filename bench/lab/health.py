"""Probe: how long `queuectl health` takes for many queues on one database, and how many statements it sends.

    python bench/lab/health.py --url postgresql://... [--queues 20] [--items 2000] [--runs 7]

Installs N reliable queues in a scratch schema (default ``bench_health``), gives each a
backlog and some finished, dead and leased items, then builds the full report (facts,
checks, rich rendering) --runs times and prints the median, min and max wall time and the
number of SQL statements one report sends. The schema is removed afterwards.
With --sample FILE it also writes the rendered text of a report with a few problems
(the README's sample).
"""

from __future__ import annotations

import argparse
import statistics
import time

import sqlalchemy as sa
from rich.console import Console

from queuectl.catalog import QueueSettings
from queuectl.client import Queue
from queuectl.cli.health import render
from queuectl.engine import make_engine
from queuectl.health import HealthOptions, health_report
from queuectl.install import install_queue, remove_everything
from queuectl.names import QueueNames


def _load(engine: sa.Engine, name: str, schema: str, items: int) -> None:
    install_queue(engine, name, settings=QueueSettings(max_attempts=1), schema=schema)
    with Queue(engine, name, schema=schema) as q:
        q.enqueue_many([b"payload"] * items)
        q.ack(q.dequeue(items // 2))  # half done
        q.nack(q.dequeue(2), "boom")  # dead letters (max_attempts=1)
        q.dequeue(3, lease=600)  # in processing


def _write_sample(engine: sa.Engine, schema: str, path: str, options: HealthOptions) -> None:
    """A report with a few real problems: a bloated index, an open transaction with dead
    rows behind it, an expired lease, dead letters; and one healthy queue. Each client has
    its own connection, closed after its work, so its statistics are flushed (a backend
    sends them at exit, otherwise up to 10 s later)."""
    url = engine.url.render_as_string(hide_password=False)
    install_queue(engine, "orders", schema=schema)
    install_queue(engine, "mail", settings=QueueSettings(max_attempts=1), schema=schema)
    install_queue(engine, "billing", schema=schema)
    with Queue(url, "orders", schema=schema) as orders:
        for _ in range(4):
            orders.enqueue_many([b"order"] * 5000)
        taken = [m for _ in range(20) for m in orders.dequeue(1000)]
        orders.release([m for m in taken if m.id % 10 == 0])
        orders.ack([m for m in taken if m.id % 10 != 0])
    time.sleep(1)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f"VACUUM (ANALYZE) {QueueNames('orders', schema).qualified('meta')}"))
    holder = engine.connect()
    holder.begin()
    holder.execute(sa.select(sa.func.txid_current()))  # an application forgot to commit
    with Queue(url, "billing", schema=schema) as billing:
        for _ in range(12):
            billing.enqueue_many([b"invoice"] * 1000)
            billing.ack(billing.dequeue(1000))
        billing.enqueue_many([b"invoice"] * 40)
    with Queue(url, "mail", schema=schema) as mail:
        mail.enqueue_many([b"mail"] * 3)
        mail.nack(mail.dequeue(3), "smtp: 550 mailbox unavailable")
    with Queue(url, "orders", schema=schema) as orders:
        orders.dequeue(2, lease=0.5)  # a consumer that died
    time.sleep(2)
    sample = health_report(engine, ["orders", "mail", "billing"], schema=schema,
                           options=options.with_settings(["xact_age.warn=1s"]))
    holder.rollback()
    holder.close()
    console = Console(record=True, width=160, force_terminal=True, file=open("/dev/null", "w"))
    console.print(render(sample))
    with open(path, "w") as f:
        f.write(console.export_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="database URL (default: $QUEUECTL_URL, else the embedded server)")
    parser.add_argument("--schema", default="bench_health")
    parser.add_argument("--queues", type=int, default=20)
    parser.add_argument("--items", type=int, default=2000, help="items enqueued per queue")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sample", help="write a rendered sample report (text) to this file")
    args = parser.parse_args()

    engine = make_engine(args.url)
    statements = 0

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _count(*_a, **_k) -> None:
        nonlocal statements
        statements += 1

    names = [f"hq{i:02d}" for i in range(1, args.queues + 1)]
    try:
        t0 = time.perf_counter()
        for name in names:
            _load(engine, name, args.schema, args.items)
        print(f"loaded {len(names)} queues x {args.items} items in {time.perf_counter() - t0:.1f}s")

        options = HealthOptions()
        health_report(engine, schema=args.schema, options=options)  # warm-up (and CREATE EXTENSION)
        timings, gather, counts = [], [], []
        sink = Console(file=open("/dev/null", "w"), width=160, force_terminal=True)
        for _ in range(args.runs):
            statements = 0
            start = time.perf_counter()
            report = health_report(engine, schema=args.schema, options=options)
            gather.append(time.perf_counter() - start)
            sink.print(render(report))
            timings.append(time.perf_counter() - start)
            counts.append(statements)
        print(f"health report for {len(names)} queues, {args.runs} runs: median {statistics.median(timings) * 1000:.0f} ms "
              f"(min {min(timings) * 1000:.0f}, max {max(timings) * 1000:.0f}), of which facts + checks median "
              f"{statistics.median(gather) * 1000:.0f} ms and rich rendering the rest; "
              f"{statistics.median(counts):.0f} SQL statements per report (incl. a SAVEPOINT/RELEASE pair per queue); "
              f"verdict {report.verdict}, {len(report.checks)} checks")

        if args.sample:
            _write_sample(engine, args.schema, args.sample, options)
            print(f"sample written to {args.sample}")
    finally:
        remove_everything(engine, args.schema)
        engine.dispose()


if __name__ == "__main__":
    main()
