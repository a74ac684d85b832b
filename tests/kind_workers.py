"""Process bodies for the queue-kind concurrency tests (importable by spawned children)."""

from __future__ import annotations

import random
import time
from datetime import datetime, timezone

import sqlalchemy as sa

from queuectl.client import QueueFullError, open_queue


def produce_all(url: str, names: list[str], index: int, count: int, batch: int, max_delay: float) -> None:
    """produce() into each queue in turn (the consumers follow the same order)."""
    for name in names:
        produce(url, name, index, count, batch, max_delay)


def consume_all(url: str, names: list[str], results, dones, expected: int, batch: int, deadline_s: float) -> None:
    """consume() from each queue in turn; results get (name, items) per queue."""
    for name, done in zip(names, dones):
        consume(url, name, results, done, expected, batch, deadline_s)


def produce(url: str, name: str, index: int, count: int, batch: int, max_delay: float) -> None:
    """Enqueue payloads 'p<index>-<n>' in batches (pending queues: each with a random delay)."""
    rng = random.Random(index)
    with open_queue(url, name) as queue:
        for start in range(0, count, batch):
            payloads = [f"p{index}-{n}".encode() for n in range(start, min(start + batch, count))]
            if queue.kind == "pending":
                queue.enqueue_many(payloads, delay=[rng.uniform(0, max_delay) for _ in payloads])
                continue
            while payloads:  # a full ring takes what fits; the rest is pushed again
                try:
                    queue.enqueue_many(payloads)
                    payloads = []
                except QueueFullError as full:
                    payloads = payloads[len(full.enqueued):]


def consume(url: str, name: str, results, done, expected: int, batch: int, deadline_s: float) -> None:
    """Dequeue until `expected` items were taken by all consumers together; report
    (id, payload, due_at, received_at) for every item this consumer got."""
    got: list[tuple[int, bytes, datetime | None, datetime]] = []
    deadline = time.monotonic() + deadline_s
    with open_queue(url, name) as queue:
        options = {"timeout": 0.05} if queue.kind == "ring" else {}
        while time.monotonic() < deadline:
            with done.get_lock():
                if done.value >= expected:
                    break
            items = queue.dequeue(batch, **options)
            received = datetime.now(timezone.utc)
            if not items:
                time.sleep(0.005)
                continue
            got.extend((item.id, item.payload, item.due_at, received) for item in items)
            with done.get_lock():
                done.value += len(items)
    results.put((name, got))


def strict_consume(url: str, dequeue_fn: str, log_table: str, done, expected: int, batch: int,
                   rollback_every: int, deadline_s: float) -> None:
    """Through the SQL API: in one transaction dequeue a batch, log its ids (the log's
    identity records the order batches were handed out), sometimes roll back mid-way."""
    engine = sa.create_engine(url, pool_size=1)
    deadline = time.monotonic() + deadline_s
    n = 0
    dequeue = sa.text(f"SELECT id FROM {dequeue_fn}(:n)")
    log = sa.text(f"INSERT INTO {log_table} (ids) VALUES (:ids)")
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            with done.get_lock():
                if done.value >= expected:
                    break
            n += 1
            conn.begin()
            ids = list(conn.execute(dequeue, {"n": batch}).scalars())
            if not ids:
                conn.rollback()
                time.sleep(0.005)
                continue
            conn.execute(log, {"ids": ids})
            time.sleep(0.002)  # "processing", while the other consumers wait on the head
            if rollback_every and n % rollback_every == 0:
                conn.rollback()  # mid-way failure: the items go back to the head
                continue
            conn.commit()
            with done.get_lock():
                done.value += len(ids)
    engine.dispose()
