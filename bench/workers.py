"""Producer and consumer processes of `queuectl bench` (multiprocessing: forked from a fork server, core.worker_context).

Each worker opens its own session, warms up (psycopg prepares a statement on its 5th
execution), reports ready, waits for the common start signal, then works until told to
stop (or, for a draining consumer, until the queue is empty). It reports how many
messages it handled and when its last operation finished, and how many it handled while
warming up (so a scenario can balance everything sent against everything taken).

Waiting on an empty queue: a full-cycle consumer whose take came back empty waits as
queuectl's Worker does (IdleWait): on the reliable kinds it sleeps on the queue's LISTEN
channel, registered as a consumer that may sleep, with the Worker's back-off poll beneath;
the kinds that do not notify poll with that back-off alone. Idle consumers then cost the
producers no CPU, however many there are. The sustained scenario's paced consumers keep a
fixed short pause (FixedPause), so its latencies compare the kinds' storage, not their polls.

End-to-end latency: a producer writes time.time() into the first 8 bytes of every payload
just before its enqueue call; a consumer subtracts it from time.time() right after its ack
returns. All workers run on this machine, so they share one clock.
"""

from __future__ import annotations

import json
import os
import random
import select
import struct
import time
import traceback
from array import array
from dataclasses import dataclass
from collections.abc import Callable, Iterator
from typing import Any

from queuectl.names import QueueNames
from queuectl.worker import IN_FLIGHT_FIRST_WAIT, Gather, PollBackoff, SeatTimes, exit_when_orphaned

STAMP = struct.Struct("<d")
WARMUP_CALLS = 6
LATENCY_SAMPLE = 20_000  # per consumer, uniform sample sent back to the parent
EMPTY_POLL_SECONDS = 0.002  # FixedPause
STOP_CHECK_SECONDS = 0.1  # a sleeping consumer sees the end of a run within this
BACKLOG_PAUSE_SECONDS = 0.001


@dataclass
class Backlog:
    """Steady state for the full cycle: producers pause while enqueued - consumed exceeds
    `limit` (0: never). Each worker writes only its own slot of a shared array, so no lock
    is needed; producers hold the first `producers` slots."""

    slots: Any
    producers: int
    limit: int
    index: int = 0

    def add(self, n: int) -> None:
        if self.limit:
            self.slots[self.index] += n

    def too_deep(self) -> bool:
        if not self.limit:
            return False
        values = self.slots[:]
        return sum(values[: self.producers]) - sum(values[self.producers:]) > self.limit


@dataclass(frozen=True)
class WorkerSpec:
    driver: str
    url: str
    queue: str
    schema: str
    role: str  # "producer" | "consumer"
    batch: int
    payload_bytes: int
    seed: int
    drain: bool = False  # consumer: stop at the first empty take
    warmup: bool = True


# what --payload-content can fill the split with, and how its notes describe it
PAYLOAD_CONTENTS = {"random": "random (incompressible) payloads",
                    "json": "JSON-like payloads (pglz compresses them ~3x)"}
_JSON_WORDS = ("pending", "paid", "shipped", "express", "standard", "gift", "fragile", "warehouse-3", "EU", "US",
               "retry", "leave at the door")


def payload_pool(payload_bytes: int, count: int, seed: int, content: str = "random") -> list[bytes]:
    """`count` payloads of `payload_bytes` each. "random": incompressible bytes, so TOAST
    compression cannot flatter big ones. "json": a JSON array of order-like records cut to
    the size, which PostgreSQL's pglz compresses about 3x, as it does real JSON payloads."""
    if content not in PAYLOAD_CONTENTS:
        raise ValueError(f"payload content must be one of {', '.join(PAYLOAD_CONTENTS)}, got {content!r}")
    rng = random.Random(seed)
    size = max(payload_bytes, STAMP.size)
    if content == "random":
        return [rng.randbytes(size) for _ in range(count)]
    return [_json_like(rng, size) for _ in range(count)]


def _json_like(rng: random.Random, size: int) -> bytes:
    records: list[str] = []
    length = 1
    while length < size:
        record = json.dumps({"order_id": rng.randrange(10**9), "customer": f"c-{rng.randrange(10**6):06d}",
                             "sku": f"SKU-{rng.randrange(10**5):05d}", "qty": rng.randrange(1, 10),
                             "price": round(rng.uniform(1, 500), 2), "status": rng.choice(_JSON_WORDS),
                             "tags": rng.sample(_JSON_WORDS, 2)}, separators=(",", ":"))
        records.append(record)
        length += len(record) + 1
    return ("[" + ",".join(records) + "]").encode()[:size]


def worker_main(target: Callable[..., None], bench: int, *args: Any) -> None:
    """Every bench worker process's entry point: target(*args), ended as soon as the bench
    process that started it (pid `bench`) is gone. A bench killed without its cleanup
    (SIGKILL, a cancelled CI job, `timeout`) cannot stop its daemon workers; the fork server
    they were forked from ends with it, so each worker is left to another parent, and would
    otherwise go on loading the server at full speed under whatever runs next. The server
    rolls back a session whose client is gone: nothing else to clean up."""
    exit_when_orphaned(bench, every=0.5)
    target(*args)


def run_worker(spec: WorkerSpec, ready: Any, go: Any, stop: Any, results: Any, backlog: Backlog) -> None:
    """Process entry point of the bench's producers and consumers (see run_loop)."""
    loop = _producer if spec.role == "producer" else _consumer
    run_loop(spec, ready, go, stop, results, lambda session: loop(session, spec, backlog))


def run_loop(spec: Any, ready: Any, go: Any, stop: Any, results: Any, work_of: Callable[[Any], Iterator[Any]], *,
             open_session: Callable[[], Any] | None = None) -> None:
    """A worker process's life: open a session of spec.driver on its queue (or open_session's), start the work
    (work_of(session), a generator), which warms up and yields how many messages it handled
    doing so; report ready, wait for go, send it `stop`, and put what it yields then into the
    report. Every outcome (also a failure) is one dict on `results`."""
    from queuectl.bench.drivers import driver_for

    report: dict[str, Any] = {"role": spec.role, "pid": os.getpid(), "count": 0, "t_start": None, "t_end": None}
    session = None
    try:
        if open_session is not None:
            session = open_session()
        else:
            session = driver_for(spec.driver).open(spec.url, QueueNames(spec.queue, spec.schema))
        work = work_of(session)
        report["warmup_count"] = next(work)  # warm up
        ready.put(os.getpid())
        go.wait()
        cpu = time.process_time()
        report.update(work.send(stop))
        report["cpu_seconds"] = time.process_time() - cpu
    except BaseException as exc:  # reported to the parent, which fails the run with it
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["traceback"] = traceback.format_exc(limit=6)
        ready.put(os.getpid())
    finally:
        if session is not None:
            try:
                session.close()
            except Exception:
                pass
        results.put(report)


def pick_batch(pool: list[bytes], rng: random.Random, n: int, sent_at: float) -> list[bytes]:
    """n payloads from the pool (from a random place, wrapping round), each stamped with
    `sent_at` in its first 8 bytes."""
    stamp = STAMP.pack(sent_at)
    start = rng.randrange(len(pool))
    picked = pool[start:start + n] + pool[: max(0, start + n - len(pool))]
    return [stamp + p[STAMP.size:] for p in picked]


class FixedPause:
    """After an empty take, pause EMPTY_POLL_SECONDS and look again (the sustained scenario's
    paced consumers: a queue fed at a steady pace is polled at once, whatever its kind)."""

    counts: dict[str, int] = {}

    def found_work(self, got: int | None = None, asked: int = 0) -> None:
        pass

    def finished(self, stop: Any) -> None:
        pass

    def found_nothing(self, stop: Any) -> None:
        time.sleep(EMPTY_POLL_SECONDS)

    def close(self) -> None:
        pass


class IdleRule:
    """When a consumer that found the queue empty looks again, as queuectl's Worker decides it
    (queuectl.worker: "Waking", "Polling with adaptive back-off", "Many consumers"), with the
    Worker's own parts (PollBackoff, Gather, SeatTimes); the waiting itself is IdleWait's (blocking) or the peers scenario's
    (asyncio). On a queue that notifies only registered consumers (`gated`), the first
    empty take registers (wait_begin) and looks once more; while registered it sleeps until
    a notification or until the back-off's poll is due (50 ms, doubling to 2 s); a take
    that finds work gives the registration up (wait_end). A take that answered a
    notification and found nothing was outrun: it gives the registration up and sleeps
    without watching the channel, 50 ms doubling until a take that answered a notification
    finds work. With `seats` (the blocking Worker's way) only the looker, the consumer
    whose listener holds the queue's seat, registers and listens; the others try the seat
    at most once per poll interval and look with their gather window, not listening; an
    outrun looker looks again after the shortest wait. A consumer busy a moment ago (queuectl.worker.Gather) looks again after a
    claim that did not fill its batch, or after one empty take, only after a gather window
    (shrinking by a tenth after a full claim, down to 2 ms, doubling after any other, up to
    50 ms for the looker, the back-off's 2 s for the others), neither registered nor
    watching the channel; the looker's second empty take in a row turns it idle.
    Without a listener (kinds that do not notify) it waits the back-off alone.
    `counts` says what it did (the bench reports their sums)."""

    def __init__(self, gated: bool, seats: bool = False) -> None:
        self.gated = gated
        self.seats = gated and seats  # only the looker (its listener's take_seat) registers
        self.seated = False
        self.backoff = PollBackoff()
        self.seat_times = SeatTimes(self.backoff.longest)  # a consumer that is not the looker tries it this often
        self.in_flight = PollBackoff(IN_FLIGHT_FIRST_WAIT)
        self.outrun = PollBackoff()
        self.gather = Gather()
        self.gap = 0.0  # the gather window to wait after the batch just taken (0: look at once)
        self.registered = self.armed = self.notified = False
        self.counts = {"work_takes": 0, "empty_takes": 0, "notified_takes": 0, "outrun": 0, "registrations": 0,
                       "gathers": 0, "seat_tries": 0}

    def found_work(self, got: int | None = None, asked: int = 0) -> bool:
        """A take of `asked` found `got` items (None: not counted, look again at once); True
        when the registration is to be given up (wait_end). `gap` is then the gather window
        to wait once the batch is finished."""
        self.counts["work_takes"] += 1
        self.gap = 0.0 if got is None else self.gather.claimed(got, asked, self.seated or not self.seats) or 0.0
        self.counts["gathers"] += self.gap > 0
        self.counts["notified_takes"] += self.notified
        self.backoff.reset()
        self.in_flight.reset()
        if self.notified:  # won a race: the next time it is outrun, it waits the shortest time again
            self.outrun.reset()
        self.notified = False
        unregister, self.registered, self.armed = self.registered, False, False
        return unregister

    def found_nothing(self) -> tuple[str, float]:
        """A take found nothing: ("outrun", seconds) give the registration up, then sleep that
        long without watching the channel; ("gather", seconds) sleep that long without
        watching the channel (it is not registered); ("register", 0) register (then registered());
        ("sleep", seconds) sleep watching the channel, if any."""
        self.counts["empty_takes"] += 1
        self.counts["notified_takes"] += self.notified
        if self.notified and self.registered:
            self.counts["outrun"] += 1
            self.notified = self.registered = self.armed = False
            # the looker comes back after the shortest wait: it is the one to announce to
            return "outrun", self.outrun.shortest if self.seated else self.outrun.next_wait()
        self.notified = False
        if self.seats and not self.seated and self.seat_times.may_try(time.monotonic()):
            self.counts["seat_tries"] += 1
            return "seat", 0.0
        return self.seat_answered(self.seated or not self.seats)

    def seat_answered(self, seated: bool) -> tuple[str, float]:
        """After found_nothing's ("seat", 0), take_seat's answer; the step after an empty take."""
        self.seated = seated and self.seats
        gap = self.gather.claimed(0, 1, seated)
        if gap is not None:
            self.counts["gathers"] += 1
            return "gather", gap
        if self.gated and not self.armed:
            self.counts["registrations"] += 1
            return "register", 0.0
        return "sleep", self.backoff.next_wait()

    def registered_now(self, clear: bool) -> float:
        """wait_begin answered `clear`: 0 (look once more at once: every later enqueue
        announces itself), or how long to sleep while an enqueue that may have missed the
        registration is open."""
        self.registered, self.armed = True, clear
        if clear:
            self.in_flight.reset()
            return 0.0
        return self.in_flight.next_wait()

    def woken(self) -> None:
        """A notification ended a sleep: the next take answers it."""
        self.backoff.reset()
        self.notified = True


class IdleWait:
    """A blocking consumer's IdleRule, waiting on the Worker's Listener (LISTEN on the queue's
    channel on a connection of its own), if any. Sleeps are cut into STOP_CHECK_SECONDS
    slices with no query between them, so the end of a run is seen at once."""

    def __init__(self, listener: Any = None) -> None:
        self.listener = listener
        self.rule = IdleRule(listener is not None and listener.gated, seats=True)
        self.counts = self.rule.counts

    def found_work(self, got: int | None = None, asked: int = 0) -> None:
        if self.rule.found_work(got, asked):
            self.listener.wait_end()
            self.listener.drain()

    def finished(self, stop: Any) -> None:
        """The batch taken is finished: return when the next look is due (a gather window)."""
        if self.rule.gap:
            self._sleep(self.rule.gap, stop, watch=False)

    def found_nothing(self, stop: Any) -> None:
        """Return when the next look is due (or `stop` is set)."""
        step, seconds = self.rule.found_nothing()
        if step == "seat":
            step, seconds = self.rule.seat_answered(self.listener.take_seat())
        if step == "outrun":
            self.listener.wait_end()
        elif step == "register":
            clear = self.listener.wait_begin()
            self.listener.drain()  # what came in before: the look that follows covers it
            seconds = self.rule.registered_now(clear)
        self._sleep(seconds, stop, watch=step in ("register", "sleep"))

    def _sleep(self, seconds: float, stop: Any, *, watch: bool) -> None:
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self.listener is None or not watch:
                stop.wait(min(left, STOP_CHECK_SECONDS))
            elif select.select([self.listener.fd], [], [], min(left, STOP_CHECK_SECONDS))[0] and self.listener.drain():
                self.rule.woken()
                return

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()


def idle_wait_for(session: Any) -> IdleWait:
    """The Worker's wait for this session: on its queue's channel when its kind notifies
    (the session has listen()), else the back-off poll alone."""
    listen = getattr(session, "listen", None)
    return IdleWait(listen() if listen is not None else None)


def consume(session: Any, batch: int, stop: Any, done: Callable[[list[bytes]], None], *, drain: bool = False,
            idle: Any = None) -> None:
    """Take and finish batches until `stop` is set (or, draining, the queue is empty), calling
    done(payloads) once a batch is finished; after an empty take, `idle` (IdleWait or
    FixedPause; None: FixedPause) says when to look again. A session that `defers_finish`
    (ack_and_dequeue) acks a batch with its next take: the batch is done when that take returns."""
    deferred = bool(getattr(session, "defers_finish", False))
    idle = idle or FixedPause()
    held: list[bytes] = []
    while not stop.is_set():
        payloads, token = session.take(batch)
        if held:
            done(held)
            held = []
        if not payloads:
            if drain:
                break
            idle.found_nothing(stop)
            continue
        idle.found_work(len(payloads), batch)
        session.finish(token)
        if deferred:
            held = payloads
        else:
            done(payloads)
        idle.finished(stop)
    if held:
        session.flush()
        done(held)


def warm_up_consumer(session: Any, batch: int) -> int:
    """WARMUP_CALLS takes, each finished (psycopg prepares a statement on its 5th execution),
    and a deferred ack flushed: the messages this claimed, which the timed work does not count."""
    warm = 0
    for _ in range(WARMUP_CALLS):
        payloads, token = session.take(batch)
        session.finish(token)
        warm += len(payloads)
    if getattr(session, "defers_finish", False):
        session.flush()
    return warm


def _producer(session: Any, spec: WorkerSpec, backlog: Backlog):
    pool = payload_pool(spec.payload_bytes, max(64, spec.batch * 4), spec.seed)
    rng = random.Random(spec.seed + 1)
    n = spec.batch

    def batch_now() -> list[bytes]:
        return pick_batch(pool, rng, n, time.time())

    warm = 0
    if spec.warmup:
        for _ in range(WARMUP_CALLS):
            session.enqueue(batch_now())
            backlog.add(n)
            warm += n
    stop = yield warm
    count = 0
    t_start = time.time()
    t_end = t_start
    while not stop.is_set():
        if backlog.too_deep():
            time.sleep(BACKLOG_PAUSE_SECONDS)
            continue
        session.enqueue(batch_now())
        backlog.add(n)
        count += n
        t_end = time.time()
    yield {"count": count, "t_start": t_start, "t_end": t_end}


def _consumer(session: Any, spec: WorkerSpec, backlog: Backlog):
    idle = FixedPause() if spec.drain else idle_wait_for(session)  # a drain stops at its first empty take
    warm = 0
    if spec.warmup:  # on a pre-filled queue the warm-up's claims are finished, not counted
        warm = warm_up_consumer(session, spec.batch)
        backlog.add(warm)
    stop = yield warm
    latencies = array("d")
    count = 0
    t_start = time.time()
    t_end = t_start
    unpack = STAMP.unpack_from

    def done(payloads: list[bytes]) -> None:
        nonlocal count, t_end
        backlog.add(len(payloads))
        now = time.time()
        t_end = now
        count += len(payloads)
        if not spec.drain:
            latencies.extend(now - unpack(p)[0] for p in payloads)

    try:
        consume(session, spec.batch, stop, done, drain=spec.drain, idle=idle)
    finally:
        idle.close()
    sample = list(latencies)
    if len(sample) > LATENCY_SAMPLE:
        sample = random.Random(spec.seed).sample(sample, LATENCY_SAMPLE)
    yield {"count": count, "t_start": t_start, "t_end": t_end, "latencies": sample, "observed": len(latencies),
           "idle": idle.counts}
