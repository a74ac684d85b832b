"""The sustained scenario's paced workers: producers that offer a fixed rate, consumers that take what comes.

A producer sends a batch when its schedule says so, never faster; one that falls behind
sends at once and records how late it was. Every payload carries the time of its enqueue
call in its first 8 bytes (warm-up payloads carry WARMUP_STAMP, so their latency is not
counted); a consumer records when it finished each message and its end-to-end latency.
Used by queuectl.bench.sustained for queuectl's kinds and by
queuectl.bench.sustained_peers for the peers that have a take/finish session (PgQ).
"""

from __future__ import annotations

import math
import random
import time
from array import array
from dataclasses import dataclass
from typing import Any, Iterator

from queuectl.bench.workers import (STAMP, WARMUP_CALLS, WorkerSpec, consume, payload_pool, pick_batch, run_loop,
                                    warm_up_consumer)

WARMUP_STAMP = 0.0  # warm-up messages carry no send time: their latency is not counted


# -- worker processes (module-level and stateless: started in fresh processes) ------------------------------------


@dataclass(frozen=True)
class PacedSpec(WorkerSpec):
    rate: float = 0.0  # producer: messages/s it offers
    phase: float = 0.0  # producer: its first send, as a fraction of its period (producers spread out)


def paced_worker(spec: PacedSpec, ready: Any, go: Any, stop: Any, results: Any, backlog: Any) -> None:
    """Process entry point (workers.run_loop): times are time.time() values."""
    loop = producer if spec.role == "producer" else consumer
    run_loop(spec, ready, go, stop, results, lambda session: loop(session, spec))


class Schedule:
    """A paced producer's sends: the k-th is due at its start + k periods (one batch per
    period at spec.rate), producers spread over one period by spec.phase; what each send
    carried is recorded beside when it was due and when it went."""

    def __init__(self, spec: PacedSpec) -> None:
        self.batch = spec.batch
        self.period = spec.batch / spec.rate
        self.t0 = time.time() + spec.phase * self.period
        self.k = 0
        self.due_at, self.sent_at, self.accepted = array("d"), array("d"), array("l")

    def next_due(self) -> float:
        return self.t0 + self.k * self.period

    def sent(self, due: float, at: float, accepted: int) -> None:
        self.due_at.append(due)
        self.sent_at.append(at)
        self.accepted.append(accepted)
        self.k += 1

    def report(self) -> dict[str, Any]:
        return {"batch": self.batch, "due": self.due_at, "sent": self.sent_at, "accepted": self.accepted}


def producer(session: Any, spec: PacedSpec) -> Iterator[Any]:
    from queuectl.client import QueueFullError

    pool = payload_pool(spec.payload_bytes, max(64, spec.batch * 4), spec.seed)
    rng = random.Random(spec.seed + 1)
    n = spec.batch

    def send(payloads: list[bytes]) -> int:
        try:
            session.enqueue(payloads)
            return len(payloads)
        except QueueFullError as exc:  # the ring stayed full: what got in is in exc.enqueued
            return len(exc.enqueued)

    warm = sum(send(pick_batch(pool, rng, n, WARMUP_STAMP)) for _ in range(WARMUP_CALLS))
    stop = yield warm
    schedule = Schedule(spec)
    while not stop.is_set():
        due = schedule.next_due()
        wait = due - time.time()
        if wait > 0 and stop.wait(wait):
            break
        now = time.time()
        schedule.sent(due, now, send(pick_batch(pool, rng, n, now)))
    yield schedule.report()


def consumer(session: Any, spec: PacedSpec) -> Iterator[Any]:
    stop = yield warm_up_consumer(session, spec.batch)
    done_at, latency = array("d"), array("d")
    unpack = STAMP.unpack_from

    def done(payloads: list[bytes]) -> None:
        now = time.time()
        for p in payloads:
            sent = unpack(p)[0]
            done_at.append(now)
            latency.append(now - sent if sent != WARMUP_STAMP else math.nan)

    consume(session, spec.batch, stop, done)
    yield {"done": done_at, "latency": latency}
