"""Producer and consumer process bodies for the fault suite (importable by "spawn").

Each process appends one JSON line per event to its own ledger file and flushes it, so a
SIGKILLed consumer leaves at most a torn last line. Lines carry time.time() stamps so the
test can tell what happened after a restart.
"""

from __future__ import annotations

import json
import time

from queuectl.client import EnqueueOutcomeUnknown, Queue
from queuectl.errors import PayloadTooLarge

QUEUE = "orders"


def _write(out, **record) -> None:
    record["t"] = time.time()
    out.write(json.dumps(record) + "\n")
    out.flush()


def produce(url: str, producer: int, stop, path: str, oversize_every: int = 0, oversize: int = 0,
            pause: float = 0.003, limit: int = 0, batch: int = 5) -> None:
    """Enqueue unique payloads (singles and batches of `batch`), pausing `pause` s between calls, until
    stop is set or, with `limit`, once that many payloads were acknowledged (the last call is cut to fit).

    Only enqueues whose call returned are recorded as "ok"; a call that raised
    EnqueueOutcomeUnknown is recorded as "unknown" (it may or may not exist). With
    oversize_every, every so many calls carries one payload of `oversize` bytes (alone,
    or inside a batch); the server must refuse the whole call: recorded as "rejected".
    """
    n = acknowledged = 0
    with open(path, "a") as out, Queue(url, QUEUE) as queue:
        _write(out, ev="ready")
        while not stop.is_set() and not (limit and acknowledged >= limit):
            if n % 2 == 0:
                payloads = [f"p{producer}-{n}"]
            else:
                payloads = [f"p{producer}-{n}-{k}" for k in range(batch)]
            if limit:
                payloads = payloads[:limit - acknowledged]
            if oversize_every and n % oversize_every == oversize_every - 1:
                payloads[-1] = payloads[-1].ljust(oversize, "x")
            n += 1
            try:
                if len(payloads) == 1:
                    ids = [queue.enqueue(payloads[0])]
                else:
                    ids = queue.enqueue_many(payloads)
            except EnqueueOutcomeUnknown as exc:
                _write(out, ev="unknown", payloads=payloads, error=str(exc))
                continue
            except PayloadTooLarge as exc:
                _write(out, ev="rejected", payloads=payloads, error=str(exc))
                continue
            _write(out, ev="ok", items=list(zip(ids, payloads)))
            acknowledged += len(ids)
            time.sleep(pause)
        _write(out, ev="end", reconnects=queue.reconnects)


def consume(url: str, consumer: int, stop, path: str, lease: float, batch_size: int = 10) -> None:
    """Dequeue batches of up to `batch_size`, "work" 1 ms per item, ack; until stop is set.

    Records the ids it got (before working on them) and the ids it acked (after ack
    returned and said it still held all of them; otherwise the batch as "partial").
    """
    with open(path, "a") as out, Queue(url, QUEUE, worker=f"consumer-{consumer}") as queue:
        _write(out, ev="ready")
        while not stop.is_set():
            batch = queue.dequeue(batch_size, lease=lease)
            if not batch:
                time.sleep(0.02)
                continue
            _write(out, ev="got", ids=[m.id for m in batch], attempts=[m.attempts for m in batch])
            for _ in batch:
                time.sleep(0.001)
            acked = queue.ack(batch)
            if acked == len(batch):
                _write(out, ev="acked", ids=[m.id for m in batch])
            else:
                _write(out, ev="partial", ids=[m.id for m in batch], acked=acked)
        _write(out, ev="end", reconnects=queue.reconnects)
