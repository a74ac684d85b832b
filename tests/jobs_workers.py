"""Producer and consumer processes for the job tests (importable by spawned children)."""

from __future__ import annotations

import multiprocessing as mp
import time

from queuectl.client import Queue


def producer(url: str, queue: str, number: int, stop: mp.Event, out: mp.Queue) -> None:
    """Enqueue batches of 20 distinct payloads until stopped; report (id, payload) pairs."""
    sent: list[tuple[int, bytes]] = []
    with Queue(url, queue) as q:
        seq = 0
        while not stop.is_set():
            payloads = [f"p{number}-{seq + i}-".encode() + bytes([seq % 251]) * (seq % 40) for i in range(20)]
            ids = q.enqueue_many(payloads, headers=[{"p": number, "n": seq + i} for i in range(20)])
            sent.extend(zip(ids, payloads))
            seq += 20
    out.put(sent)


def consumer(url: str, queue: str, stop: mp.Event, out: mp.Queue) -> None:
    """Dequeue and ack until stopped and the queue is empty; report how many were acked."""
    done = 0
    idle_since = None
    with Queue(url, queue) as q:
        while True:
            batch = q.dequeue(20, lease=60)
            if batch:
                done += q.ack(batch)
                idle_since = None
                continue
            if stop.is_set():
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 0.5:
                    break
            time.sleep(0.01)
    out.put(done)
