"""Process bodies for the fan-out fault run (tests/test_ring_fanout.py): a producer that
publishes numbered messages and consumers of one subscription each, every process writing a
ledger of JSON lines (flushed per line, so a SIGKILLed consumer leaves at most a torn last
line)."""

from __future__ import annotations

import json
import time

from queuectl.client import QueueFullError, RingQueue


def _write(out, **record) -> None:
    out.write(json.dumps(record) + "\n")
    out.flush()


def produce(url: str, name: str, count: int, batch: int, path: str) -> None:
    """Publish messages 0..count-1 (payload "m<i>") in batches, retrying what a full ring
    did not take; one "ok" line per call with the (id, payload) pairs it stored."""
    with open(path, "a") as out, RingQueue(url, name) as queue:
        n = 0
        while n < count:
            payloads = [f"m{i}" for i in range(n, min(n + batch, count))]
            try:
                ids = queue.enqueue_many(payloads, timeout=5.0)
            except QueueFullError as full:
                ids = full.enqueued
            _write(out, ev="ok", items=list(zip(ids, payloads[:len(ids)])))
            n += len(ids)
        _write(out, ev="done", n=n)


def consume(url: str, name: str, subscription: str, path: str, stop, batch: int = 50, lease: float = 2.0,
            work: float = 0.001) -> None:
    """Claim, "process" (sleep `work` s), acknowledge, until `stop` is set and nothing is left.
    A "got" line per claim (ids and tries), an "acked" line with the ids the ack matched."""
    with open(path, "a") as out, RingQueue(url, name) as queue:
        sub = queue.subscription(subscription)
        _write(out, ev="ready")
        while True:
            items = sub.dequeue(batch, lease=lease, timeout=0.2)
            if not items:
                if stop.is_set():
                    break
                continue
            _write(out, ev="got", items=[[m.id, sub.tries(m), m.text] for m in items])
            time.sleep(work)
            _write(out, ev="acked", ids=sub.ack(items))
