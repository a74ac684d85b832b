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
    """Dequeue and ack until stopped and the queue is empty; report how many were acked.

    Empty means no READY row left, not one empty claim: while the archive job seals a
    generation it moves that generation's READY rows forward in one transaction, and until
    it commits the claims skip the rows it holds and do not yet see their copies (they wait
    one rotation at most, and are never lost). So after 0.5 s of empty claims the consumer
    asks the counts, and goes on while READY rows remain (for 45 s at most)."""
    done = 0
    idle_since = None
    stopped_at = None
    with Queue(url, queue) as q:
        while True:
            batch = q.dequeue(20, lease=60)
            if batch:
                done += q.ack(batch)
                idle_since = None
                continue
            if stop.is_set():
                now = time.monotonic()
                stopped_at = stopped_at or now
                idle_since = idle_since or now
                if now - idle_since > 0.5:
                    if q.counts()["ready"] == 0 or now - stopped_at > 45:
                        break
                    idle_since = None
            time.sleep(0.01)
    out.put(done)
