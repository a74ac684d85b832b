"""Many real processes on one reliable queue: nothing lost, nothing done twice.

Producers and consumers are separate OS processes (conftest.worker_processes: each a fork
of a fresh fork server, with its own engine and connection), as in production. The checks compare
exact multisets of (id, payload), so a duplicate or a loss shows up as a Counter diff.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections import Counter

import pytest
import sqlalchemy as sa

from jobs_helpers import wait_until
from queuectl.catalog import QueueSettings
from queuectl.client import Queue
from queuectl.install import install_queue

from conftest import worker_processes

PRODUCERS = 4
CONSUMERS = 4
ITEMS_PER_PRODUCER = 5_000
TOTAL = PRODUCERS * ITEMS_PER_PRODUCER  # 20,000
ENQUEUE_BATCH = 100
DEQUEUE_BATCH = 50
RUN_DEADLINE_S = 240

PROCESSES = worker_processes()


# -- process bodies (module level so the worker processes can import them) ----------


def produce(url: str, producer: int) -> list[tuple[int, bytes]]:
    """Enqueue this producer's items, half one by one and half in batches."""
    made: list[tuple[int, bytes]] = []
    with Queue(url, "orders") as queue:
        payloads = [f"p{producer}-{i}".encode() for i in range(ITEMS_PER_PRODUCER)]
        singles, batched = payloads[:500], payloads[500:]
        for payload in singles:
            made.append((queue.enqueue(payload), payload))
        for start in range(0, len(batched), ENQUEUE_BATCH):
            chunk = batched[start : start + ENQUEUE_BATCH]
            made.extend(zip(queue.enqueue_many(chunk), chunk))
    return made


def consume_until_all_done(url: str, total: int) -> list[tuple[int, bytes]]:
    """Dequeue and ack until the queue has `total` finished items; returns what it acked."""
    done: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + RUN_DEADLINE_S
    with Queue(url, "orders") as queue:
        while time.monotonic() < deadline:
            batch = queue.dequeue(DEQUEUE_BATCH, lease=60)
            if batch:
                acked = queue.ack(batch)
                assert acked == len(batch), "lost a lease during a healthy run"
                done.extend((m.id, m.payload) for m in batch)
                continue
            if queue.counts()["done"] >= total:
                return done
            time.sleep(0.01)
    raise TimeoutError(f"consumer {os.getpid()} gave up after {RUN_DEADLINE_S}s")


def hold_batch_forever(url: str, n: int, lease: float, held: "mp.Queue") -> None:
    """Claim a batch, report its ids, then hang until killed (a consumer that dies mid-batch)."""
    queue = Queue(url, "orders")
    batch = queue.dequeue(n, lease=lease)
    held.put([m.id for m in batch])
    while True:
        time.sleep(60)


# -- helpers ----------------------------------------------------------------------------


def meta_rows(engine: sa.Engine, ids: list[int]) -> dict[int, sa.RowMapping]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT id, status, attempts FROM queuectl.orders_meta WHERE id = ANY(:ids)"),
            {"ids": ids},
        ).mappings()
        return {row["id"]: row for row in rows}


def kill_holder(url: str, n: int, lease: float) -> list[int]:
    """Start a consumer that claims n items, SIGKILL it, return the ids it held."""
    held: mp.Queue = PROCESSES.Queue()
    process = PROCESSES.Process(target=hold_batch_forever, args=(url, n, lease, held))
    process.start()
    try:
        ids = held.get(timeout=60)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.join(30)
    assert process.exitcode == -signal.SIGKILL
    return ids


# -- tests --------------------------------------------------------------------------------


@pytest.mark.slow
def test_four_producers_four_consumers_complete_every_item_exactly_once(engine, db_url):
    install_queue(engine, "orders")
    with PROCESSES.Pool(PRODUCERS + CONSUMERS) as pool:
        consumers = [pool.apply_async(consume_until_all_done, (db_url, TOTAL)) for _ in range(CONSUMERS)]
        producers = [pool.apply_async(produce, (db_url, p)) for p in range(PRODUCERS)]
        produced = Counter(item for result in producers for item in result.get(RUN_DEADLINE_S))
        per_consumer = [result.get(RUN_DEADLINE_S) for result in consumers]
    consumed = Counter(item for items in per_consumer for item in items)

    assert sum(produced.values()) == TOTAL and len(produced) == TOTAL  # ids unique
    assert consumed == produced  # every (id, payload) acked exactly once: no loss, no duplicate
    assert sum(1 for items in per_consumer if items) >= 2, "work was not shared between consumers"
    with engine.connect() as conn:
        by_status = dict(conn.execute(sa.text("SELECT status, count(*) FROM queuectl.orders_meta GROUP BY 1")).all())
        attempts = dict(conn.execute(sa.text("SELECT attempts, count(*) FROM queuectl.orders_meta GROUP BY 1")).all())
    assert by_status == {2: TOTAL}  # all DONE
    assert attempts == {1: TOTAL}  # nobody got an item a second time


@pytest.mark.slow
def test_consumer_killed_mid_batch_items_come_back_after_lease_and_complete(engine, db_url):
    install_queue(engine, "orders")
    with Queue(engine, "orders") as queue:
        enqueued = dict(zip(queue.enqueue_many([f"item-{i}".encode() for i in range(30)]), range(30)))
        lease = 5.0
        held = kill_holder(db_url, 10, lease)
        claimed_at = time.monotonic()
        assert len(held) == 10

        # Before the lease expires the dead consumer's items stay invisible to others.
        others = queue.dequeue(100, lease=60)
        assert {m.id for m in others} == set(enqueued) - set(held)
        queue.ack(others)
        if time.monotonic() - claimed_at < lease - 1:
            assert queue.dequeue(100) == []

        # After expiry they come back (one more attempt used) and complete.
        back = wait_until(lambda: queue.dequeue(100, lease=60), timeout=lease + 30)
        assert sorted(m.id for m in back) == sorted(held)
        assert {m.attempts for m in back} == {2}
        assert {m.payload for m in back} == {f"item-{enqueued[i]}".encode() for i in held}
        assert queue.ack(back) == 10
        assert queue.counts()["done"] == 30
        assert queue.dequeue(100) == []


@pytest.mark.slow
def test_consumer_killed_on_last_attempt_items_go_dead_not_lost(engine, db_url):
    install_queue(engine, "orders", settings=QueueSettings(max_attempts=1))
    with Queue(engine, "orders") as queue:
        ids = queue.enqueue_many([b"a", b"b", b"c"])
        held = kill_holder(db_url, 3, lease=1.0)
        assert sorted(held) == sorted(ids)
        # The next dequeue after expiry moves them to DEAD instead of handing them out again.
        wait_until(lambda: queue.dequeue(10) == [] and queue.counts()["dead"] == 3, timeout=30, interval=0.2)
        assert {row["status"] for row in meta_rows(engine, ids).values()} == {3}
        assert queue.counts()["processing"] == 0
