"""`queuectl bench --scenario fanout`: one fan-out ring with 1, 2 and 4 subscriptions against
as many plain rings fed with the same messages (the copy-per-queue way, as pg-boss does).

Each run: one producer pushes --items messages in batches of --batch; one consumer per
subscription (or per copy) takes batches until it has every message. Measured per run:
messages per second per subscription (--items / the time from the first push to the last
consumer's last message), and bytes of WAL written per message (pg_current_wal_lsn before
and after, over --items: the whole server's WAL, so run it on a server of its own).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import sqlalchemy as sa

from queuectl.bench.core import BenchRun, ratio, scenario, stat
from queuectl.kindspec import RingSettings

SUBSCRIPTION_COUNTS = (1, 2, 4)
FANOUT_RING_SIZE = 8192
DESIGNS = (("fanout", "one fan-out ring, a subscription each"), ("copies", "a plain ring each, every message copied"))


def _install(run: BenchRun, design: str, n: int) -> list[str]:
    from queuectl.install import install_queue, uninstall_queue
    from queuectl.registry import get_queue

    names = ["bfan"] if design == "fanout" else [f"bfan_copy{k}" for k in range(n)]
    for name in names:
        try:
            with run.engine.connect() as conn:
                left = get_queue(conn, name, run.schema)  # a run cut short left it
        except sa.exc.DBAPIError:  # no catalog yet
            left = None
        if left is not None:
            uninstall_queue(run.engine, name, run.schema)
        install_queue(run.engine, name, "ring", RingSettings(size=FANOUT_RING_SIZE, fanout=design == "fanout"),
                      run.schema)
    return names


def _uninstall(run: BenchRun, names: list[str]) -> None:
    from queuectl.install import uninstall_queue

    for name in names:
        uninstall_queue(run.engine, name, run.schema)


def _wal(run: BenchRun) -> int:
    with run.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")).scalar())


def _one_run(run: BenchRun, design: str, n: int, items: int, batch: int, payload: bytes) -> dict[str, float]:
    from queuectl.client import RingQueue

    queues = _install(run, design, n)
    subs = [f"s{k}" for k in range(n)]
    if design == "fanout":
        with RingQueue(run.url, queues[0], schema=run.schema) as admin:
            for s in subs:
                admin.subscribe(s, lag_limit=FANOUT_RING_SIZE)
    errors: list[BaseException] = []
    done_at: list[float] = []

    def consume(k: int) -> None:
        try:
            got = 0
            if design == "fanout":
                with RingQueue(run.url, queues[0], schema=run.schema) as q:
                    sub = q.subscription(subs[k])
                    while got < items:
                        taken = sub.dequeue(batch, timeout=0.5)
                        sub.ack(taken)
                        got += len(taken)
            else:
                with RingQueue(run.url, queues[k], schema=run.schema) as q:
                    while got < items:
                        got += len(q.dequeue(batch, timeout=0.5))
            done_at.append(time.monotonic())
        except BaseException as exc:  # reported after the join
            errors.append(exc)

    def produce() -> None:
        try:
            targets = queues if design == "copies" else queues[:1]
            clients = [RingQueue(run.url, name, schema=run.schema) for name in targets]
            try:
                for start in range(0, items, batch):
                    payloads = [payload] * min(batch, items - start)
                    for c in clients:
                        c.enqueue_many(payloads, timeout=30)
            finally:
                for c in clients:
                    c.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    wal_before = _wal(run)
    started = time.monotonic()
    producer = threading.Thread(target=produce)
    producer.start()
    producer.join()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    elapsed = max(done_at) - started
    wal = _wal(run) - wal_before
    _uninstall(run, queues)
    return {"rate": items / elapsed, "wal_per_message": wal / items, "seconds": elapsed}


@scenario("fanout", "one fan-out ring with 1, 2, 4 subscriptions vs as many plain rings fed the same messages",
          ("batch", "payload_bytes", "items"))
def fanout(run: BenchRun) -> dict[str, Any]:
    o = run.options
    payload = b"x" * o.payload_bytes
    cells: dict[tuple[str, int], dict[str, list[float]]] = {
        (d, n): {"rate": [], "wal_per_message": []} for d, _ in DESIGNS for n in SUBSCRIPTION_COUNTS}
    with run.reporter.scenario("fanout", o.repeat * len(DESIGNS) * len(SUBSCRIPTION_COUNTS)) as rep:
        for r in range(o.repeat):
            for n in SUBSCRIPTION_COUNTS:
                for design, _label in DESIGNS:  # alternating, so drift hits both
                    rep.step(f"repeat {r + 1}: {design}, {n} subscription(s)")
                    res = _one_run(run, design, n, o.items, o.batch, payload)
                    cells[(design, n)]["rate"].append(res["rate"])
                    cells[(design, n)]["wal_per_message"].append(res["wal_per_message"])
                    rep.done()
    rows = []
    for n in SUBSCRIPTION_COUNTS:
        for design, label in DESIGNS:
            cell = cells[(design, n)]
            metrics = {"wal_bytes_per_message": stat(cell["wal_per_message"]),
                       "wal_bytes_per_delivery": stat([w / n for w in cell["wal_per_message"]])}
            if design == "fanout":
                metrics["fanout_vs_copies"] = stat(
                    [ratio(a, b) for a, b in zip(cell["rate"], cells[("copies", n)]["rate"])])
            rows.append({
                "subject": f"{label} ({n})", "phase": "full-cycle",
                "params": {"design": design, "subscriptions": n, "producers": 1, "consumers": n, "batch": o.batch,
                           "payload_bytes": o.payload_bytes,
                           "items": o.items, "ring_size": FANOUT_RING_SIZE},
                "rate": stat(cell["rate"]), "ceiling": None, "fraction_of_ceiling": None, "latency_ms": None,
                "metrics": metrics,
            })
    return {
        "name": "fanout",
        "description": "fan-out ring vs a copy per subscriber: messages/s per subscription and WAL per message",
        "notes": [
            f"fanout: one ring of {FANOUT_RING_SIZE:,} slots installed with --fanout and n subscriptions; the "
            "producer publishes each batch once; one consumer per subscription claims a batch (sub_take) and "
            "acknowledges it (sub_done): two statements per batch and subscription",
            f"copies: n plain rings of {FANOUT_RING_SIZE:,} slots; the producer pushes each batch into every one "
            "(n statements per batch); one consumer per ring pops (one statement per batch, no ack)",
            "rate: messages per second per subscription (each subscription receives all --items), from the first "
            "push to the last consumer's last message; all consumers run at once",
            "WAL bytes/message: pg_current_wal_lsn delta over the run / --items (one message, however many "
            "subscriptions receive it); per delivery: / n",
        ],
        "display_metrics": [["WAL B/msg", "wal_bytes_per_message"], ["WAL B/delivery", "wal_bytes_per_delivery"],
                            ["fanout x copies", "fanout_vs_copies"]],
        "ceilings": [],
        "rows": rows,
        "targets": [],
        "unavailable": [],
    }
