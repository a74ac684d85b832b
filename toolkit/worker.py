"""Activation: a consumer loop that wakes when work arrives (Queue.consume, `queuectl worker`).

Waking
    PostgreSQL: a dedicated autocommit connection LISTENs on the queue's channel, which the
    queue notifies once per enqueueing transaction (reliable_0002). The control loop sleeps
    in select() on that socket and on a self-pipe (stop requests, finished handlers), so an
    idle worker spends no CPU and wakes a millisecond or two after the enqueue commits.
    A notification is only a hint to look: the loop then dequeues batch after batch until
    a dequeue comes back empty. From reliable_0006 the queue notifies only while some
    consumer is registered as possibly sleeping (a NOTIFY serialises the producers' commits,
    so busy consumers should not cost them one): before it sleeps the loop registers on
    its LISTEN session (`<queue>_wait_begin()`) and looks once more; a busy loop gives the
    registration up (`<queue>_wait_end()`). When the registration finds an enqueue still
    open that may have missed it, the loop does not sleep on the channel but looks again
    after 20 ms, doubling while that lasts (sql/postgresql/activation.sql has the protocol).
    A notification that never arrives (dropped trigger, a pooler in transaction mode, a
    listener connection that broke and is being reopened) costs latency, never items,
    because the loop also polls.

Polling with adaptive back-off
    After a dequeue that returned items the loop looks again at once (drain). After an
    empty one it waits `min_poll_interval` (50 ms), doubling after each further empty
    look up to `poll_interval` (2 s), with +-10% jitter so consumers do not poll in step;
    a notification or a non-empty dequeue resets the wait. Busy queues are thus polled
    back to back, idle ones every `poll_interval` (one index probe of an empty partial
    index per consumer every 2 s). With notifications the same back-off runs underneath
    as the fallback; with `notify=False` it is the only mechanism.

Many consumers
    One consumer at a time, the looker, holds the queue's seat: a session-level advisory
    lock on its LISTEN session (activation.sql, seat_take), only ever tried, since a wait
    in the lock manager would hold a snapshot, and the xmin horizon, for as long as it
    waits. On a queue that notifies only registered consumers only the looker LISTENs and
    registers, so a notification signals one backend (PostgreSQL signals every backend
    that LISTENs in the database at each notification, whatever its channel: about 13 us
    each). The others neither listen nor register: they look with their gather window and
    try the seat after an empty look, at most once per `poll_interval`.

    The gather window (Gather): after a claim that filled its batch a consumer looks again
    at once; after one that did not (it drained the queue), or an empty one, it looks
    again only after a window in which items can gather. The window shrinks by a tenth
    after each full claim and doubles after any other, up to 50 ms (min_poll_interval when
    shorter) for the looker and `poll_interval` for the others, so about one look in eight
    comes back short once the looks match the items. So many consumers look about as often
    as a batch forms, and most looks take a full batch, as a few consumers on a backlog do,
    instead of each batch paying an empty look, a registration and a wake-up. With 2
    producers at batch 10, 32 such consumers sent 3.5-3.7 statements per batch (6.7-8.3
    when every idle consumer registered; 4 consumers 3.1), their own CPU per message about
    halved, and their rate reached the 4-consumer one at a lower latency
    (bench/lab/RESULTS.md). A looker whose second look in a row finds nothing registers,
    looks once more and sleeps on the channel.

    Latency: an enqueue while every consumer sleeps wakes the looker a millisecond or two
    after its commit. While the looker works, nobody is registered, so producers pay no
    NOTIFY, and an item waits for the next look of a consumer: at most 50 ms for the
    looker's window, at most `poll_interval` for the others'. A looker with no room for
    new items (its handlers all busy) gives the seat up after 50 ms, and one that dies
    frees it with its session; another consumer takes it at its next empty look. A
    looker whose look after a notification finds nothing (another consumer was faster)
    gives its registration up and looks again after 50 ms, then registers again.
    queuectl.asyncworker's consumers take the same seat and window (Gather, SeatTimes).

SQL Server
    SQL Server has no LISTEN/NOTIFY, so its consumers run this same loop with notify off
    (Adapter.can_listen is False): adaptive polling as above, where the dequeue is one
    `UPDATE TOP (n) ... WITH (UPDLOCK, READPAST, ROWLOCK) ... OUTPUT` seek on the filtered
    ready index, cheap enough to repeat every 50 ms while work trickles in. Lower latency
    would need a blocking receive: a `WAITFOR (RECEIVE ...)` on a Service Broker queue fed by
    an enqueue trigger, or a `WAITFOR DELAY` loop inside the dequeue procedure holding an
    app lock; both belong with the T-SQL kind, not in this loop.

Concurrency
    `concurrency` handler threads take claimed items from a local work queue; the control
    loop (the calling thread) alone talks to the database through the Queue client:
    dequeue, ack (batched), nack (the error text, so the queue's backoff policy applies),
    heartbeat and release. Threads suit handlers that wait on I/O, the usual case, and
    share one connection. With `processes=True` each thread hands its item to a spawned
    process of its own, for CPU-bound handlers (the handler must then be a picklable,
    importable function). Whatever a handler raises, SystemExit and KeyboardInterrupt
    included, is its item's failure only: the worker and the other items go on.
    A handler process that dies (os._exit, a signal, the OOM killer) fails only the item
    it was running, known because its thread sent it that item over the process's own
    pipe: the item is nacked with "HandlerProcessDied: handler process died (killed by
    signal 9, SIGKILL)" or "(exit code N)", the thread starts a new process for its next
    item, and the items in the other processes run on untouched.

Heartbeat
    Every `heartbeat_fraction` of the lease (1/3 by default) the loop extends the lease of
    every item it holds, running or still waiting for a thread, so a handler slower than
    the lease keeps its items. An item whose lease was nevertheless lost (the process
    stalled longer than a lease) is not started; its outcome is not counted as processed.

Settling
    An item's outcome is recorded by one call (ack, or nack with the handler's error text).
    When that call fails on a live connection, for any reason (a canceled statement, a
    permission, a trigger or constraint that refuses the update, a text the database
    cannot store), the worker logs one line naming the items and the cause and sends the
    call again alone per item, at most SETTLE_TRIES (3) times in all, SETTLE_RETRY_PAUSE
    (2 s, or a tenth of the lease when shorter) apart, the items still heartbeated. Then
    it falls back, one step after another, each logged:
      1. a nack with a short fixed reason ("the handler succeeded but its ack failed
         (InternalError); see the worker's log"): the attempt is charged, so an item whose
         outcome can never be recorded still ends DEAD after its max attempts;
      2. a release: the item is given back at once with its attempt restored (once per
         item and worker, or an item whose nack always fails would run forever);
      3. giving up: the worker forgets the item and stops renewing its lease; it comes back
         when the lease expires, this attempt charged (`unsettled` in the stats).
    All of it takes a fraction of a lease, so a burst worker ends and a stop request is
    honoured; a lost connection stays the client's business (below).

Stopping
    SIGTERM or SIGINT (or Worker.stop()): stop dequeuing, give back (release) claimed
    items no thread has started, wait for running handlers and ack or nack them, then
    return. A second signal stops waiting: items still in handlers come back when their
    leases expire (handler processes still running are killed). Throughput is logged
    every `log_interval` seconds while there is work.

Faults
    A lost connection is the client's business (Queue._call reconnects with jittered
    back-off and resends what is safe to resend). A statement the server cancels (a
    statement_timeout or lock_timeout: StatementCanceled) rolled back whole: a canceled
    dequeue claimed nothing and counts as an empty look (one warning line, then the poll
    back-off); a canceled ack or nack is sent again as under Settling, its items still
    held and heartbeated meanwhile; a canceled or refused heartbeat is retried within a
    second. When the client gives up reconnecting (ConnectionFailed), the worker stops at
    once without further database calls and re-raises: held items come back when their
    leases expire.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import pickle
import queue as queue_mod
import random
import selectors
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing import connection as mp_connection
from multiprocessing import get_context
from typing import Any

from queuectl.arguments import check_batch, check_seconds, schema_revision_number
from queuectl.defaults import DEFAULT_LOG_INTERVAL, DEFAULT_POLL_INTERVAL
from queuectl.engine import adapter_for
from queuectl.engine.urls import first_line
from queuectl.errors import ConnectionFailed, StatementCanceled, UsageError
from queuectl.messages import Message
from queuectl.sqlfiles import render
from queuectl.storable import diagnostic_text

# The worker is handed a reliable client (queuectl.client.Queue, whose consume() builds a
# Worker) and never builds one: it names that type, it does not import it.
QueueClient = Any

DEFAULT_MIN_POLL_INTERVAL = 0.05  # first wait after a look found nothing
GATHER_FIRST_WAIT = 0.002  # the shortest window between a busy consumer's looks (Gather)
GATHER_LONGEST = 0.05  # the looker's longest window: the most an item waits for a busy looker's next look
FULL_CLAIM_SHRINK = 0.9  # a full claim shortens the window this much; any other doubles it
IN_FLIGHT_FIRST_WAIT = 0.02  # first wait while an enqueue that missed our registration is open
WAIT_REGISTRATION_REVISION = 6  # reliable_0006: notifications only to registered consumers
DEFAULT_HEARTBEAT_FRACTION = 1 / 3  # extend leases three times per lease
POLL_JITTER = 0.1
MAX_CONCURRENCY = 256
SETTLE_TRIES = 3  # sends of an item's own ack or nack before the fallbacks
SETTLE_RETRY_PAUSE = 2.0  # at most between those sends; a tenth of the lease when that is shorter

Handler = Callable[[Message], Any]
log = logging.getLogger("queuectl.worker")


@dataclass
class PollBackoff:
    """How long an idle consumer waits before its next look: short when busy, long when idle."""

    shortest: float = DEFAULT_MIN_POLL_INTERVAL
    longest: float = DEFAULT_POLL_INTERVAL
    jitter: float = POLL_JITTER
    _current: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._current = self.shortest

    def reset(self) -> None:
        """Work was found (or announced): the next empty look waits the shortest time again."""
        self._current = self.shortest

    def next_wait(self) -> float:
        """The wait after an empty look; each further empty look doubles it, up to `longest`."""
        wait = self._current
        self._current = min(self._current * 2, self.longest)
        return min(self.longest, wait * (1 + random.uniform(-self.jitter, self.jitter)))


@dataclass
class Gather:
    """When a consumer that is not asleep on the channel looks again (see "Many consumers"):
    after a full claim at once; after a claim that did not fill its batch (it drained the
    queue), or an empty one, only after a window in which items can gather, neither
    registered nor listening (nobody announces items to it, no notification wakes it).

    The window shrinks by a tenth after each full claim (items come faster than this
    consumer looks; not below `shortest`) and doubles after any other, up to a cap, so that
    about one look in eight comes back short once the looks match the items: for the looker (the
    consumer holding the queue's seat) `longest` (50 ms, or min_poll_interval when shorter),
    so that an item waits at most that long for its next look, for the other consumers
    `slowest` (poll_interval).
    The looker looks once more after an empty look; a second empty look in a row means the
    queue went idle (None): it then waits as an idle consumer does (registers, looks once
    more, sleeps on the channel)."""

    shortest: float = GATHER_FIRST_WAIT
    longest: float = GATHER_LONGEST
    slowest: float = DEFAULT_POLL_INTERVAL
    window: float = field(init=False)
    active: bool = field(init=False, default=False)  # the looker found work since it last went idle
    empty: bool = field(init=False, default=False)  # the last look found nothing

    def __post_init__(self) -> None:
        self.window = self.longest

    def claimed(self, got: int, asked: int, seated: bool = True) -> float | None:
        """A claim asked for `asked` items and got `got`: the seconds to wait, not listening,
        before the next look (0: look at once); None (only `seated`): the queue is idle,
        wait as idle consumers do."""
        cap = self.longest if seated else self.slowest
        if got and got >= asked:
            self.active, self.empty = True, False
            self.window = max(self.shortest, min(self.window, cap) * FULL_CLAIM_SHRINK)
            return 0.0
        if got or not seated or (self.active and not self.empty):
            self.active, self.empty = True, not got
            wait = min(self.window, cap)
            self.window = min(wait * 2, cap)
            return wait * (1 + random.uniform(-POLL_JITTER, POLL_JITTER))
        self.active = self.empty = False
        self.window = min(self.window, self.longest)
        return None


@dataclass
class SeatTimes:
    """When a consumer that is not the looker may try the queue's seat, and when a looker
    with no room for new items (its handlers all busy) gives it up (see "Many consumers").
    It sends nothing: the blocking and the asyncio worker take and leave the seat."""

    every: float = DEFAULT_POLL_INTERVAL  # a consumer that is not the looker tries the seat at most this often
    next_try: float = 0.0
    full_since: float = math.inf  # since when the looker has had no room for new items

    def may_try(self, now: float) -> bool:
        """Whether to try the seat now (True at most once per `every`)."""
        if now < self.next_try:
            return False
        self.next_try = now + self.every
        return True

    def full(self, seated: bool, room: int, now: float) -> float | None:
        """A looker without room gives the seat up after GATHER_LONGEST, so that an idle
        consumer takes it at its next look: None when that is now (the caller gives it up,
        and may take it back at its next idle look, if still free), else when to check
        again (inf: nothing to check)."""
        if not seated or room:
            self.full_since = math.inf
            return math.inf
        self.full_since = min(self.full_since, now)
        if now < self.full_since + GATHER_LONGEST:
            return self.full_since + GATHER_LONGEST
        self.full_since, self.next_try = math.inf, 0.0
        return None


@dataclass(frozen=True)
class LoopSettings:
    """A consumer loop's checked settings (the blocking Worker's and queuectl.asyncworker's)."""

    concurrency: int
    batch: int
    lease: float
    poll_interval: float
    min_poll_interval: float
    heartbeat_every: float | None  # seconds between lease extensions; None: never
    log_interval: float
    shutdown_timeout: float | None


def loop_settings(
    queue: QueueClient,
    handler: object,
    *,
    concurrency: int = 1,
    batch: int = 10,
    lease: float | None = None,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    min_poll_interval: float = DEFAULT_MIN_POLL_INTERVAL,
    heartbeat_fraction: float | None = DEFAULT_HEARTBEAT_FRACTION,
    log_interval: float = DEFAULT_LOG_INTERVAL,
    shutdown_timeout: float | None = None,
) -> LoopSettings:
    """A consumer loop's options, each checked (a one-line UsageError); `lease` defaults to the queue's."""
    if not callable(handler):
        raise UsageError(f"handler must be callable, got {type(handler).__name__}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 1 <= concurrency <= MAX_CONCURRENCY:
        raise UsageError(f"concurrency must be a whole number from 1 to {MAX_CONCURRENCY}, got {concurrency!r}")
    checked_batch = check_batch(batch)
    checked_lease = check_seconds(lease, "lease", low=0.001) or float(queue.info.settings.lease_seconds)
    longest = check_seconds(poll_interval, "poll interval", low=0.001) or DEFAULT_POLL_INTERVAL
    shortest = check_seconds(min_poll_interval, "min poll interval", low=0.001) or DEFAULT_MIN_POLL_INTERVAL
    if heartbeat_fraction is not None and not 0 < heartbeat_fraction < 1:
        raise UsageError(f"heartbeat fraction must be between 0 and 1, got {heartbeat_fraction!r}")
    return LoopSettings(
        concurrency=concurrency,
        batch=checked_batch,
        lease=checked_lease,
        poll_interval=longest,
        min_poll_interval=min(shortest, longest),
        heartbeat_every=None if heartbeat_fraction is None else checked_lease * heartbeat_fraction,
        log_interval=check_seconds(log_interval, "log interval", low=0.001) or DEFAULT_LOG_INTERVAL,
        shutdown_timeout=check_seconds(shutdown_timeout, "shutdown timeout"),
    )


@dataclass
class WorkerStats:
    """What a worker did; `lost` items were taken over by another consumer after their lease expired."""

    processed: int = 0
    failed: int = 0
    dead: int = 0
    released: int = 0
    lost: int = 0
    dequeues: int = 0
    empty_polls: int = 0
    notifications: int = 0
    heartbeats: int = 0
    canceled: int = 0  # statements the server canceled (a timeout): retried, nothing lost
    unsettled: int = 0  # items whose outcome could not be recorded: left to their lease
    started: float = field(default_factory=time.monotonic)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


@dataclass
class _Settlement:
    """An item whose outcome is not recorded yet, and how far its recording got."""

    error: str | None  # the handler's error text; None when it succeeded
    step: str = "outcome"  # "outcome": its ack or nack; "charge": a nack with a fixed reason; "release"
    tries: int = 0  # failed sends of this step
    due: float = 0.0  # time.monotonic() of the next send
    failure: str = ""  # the class of the last failed call's error

    def text(self) -> str | None:
        """The error text its next call records (None: an ack, or a release)."""
        if self.step == "outcome":
            return self.error
        if self.step == "charge":
            done = ("the handler succeeded but its ack failed" if self.error is None
                    else "the handler failed but its error could not be recorded")
            return f"{done} ({self.failure}); see the worker's log"
        return None


class Settlements:
    """Held items whose outcome is still to be recorded, and what follows when a recording
    call fails (see "Settling" above). It sends nothing: the blocking and the asyncio worker
    make the calls it names, and tell it how each went."""

    def __init__(self) -> None:
        self.pending: dict[int, _Settlement] = {}
        self._given_back: set[int] = set()  # items released because their outcome could not be recorded

    def add(self, item_id: int, error: str | None, *, release: bool = False) -> None:
        """A finished item (`error`: the handler's error text, None when it succeeded), or
        with `release` one given back unstarted."""
        self.pending[item_id] = _Settlement(error, step="release") if release else _Settlement(error)

    def due(self, now: float) -> dict[tuple[str, str | None, int], list[int]]:
        """The calls to send now, (step, error text, item id when sent alone) -> item ids:
        first sends go together (one ack, one nack per distinct error, one release); an item
        whose call failed is sent alone, so an item the server refuses holds back no other."""
        calls: dict[tuple[str, str | None, int], list[int]] = {}
        for item_id, settlement in self.pending.items():
            if settlement.due <= now:
                key = (settlement.step, settlement.text(), item_id if settlement.failure else 0)
                calls.setdefault(key, []).append(item_id)
        return calls

    def next_due(self) -> float:
        """When the next call is due (a retry waits a short pause); inf when none is pending."""
        return min((settlement.due for settlement in self.pending.values()), default=math.inf)

    def discard(self, ids: Iterable[int]) -> None:
        for item_id in ids:
            self.pending.pop(item_id, None)

    def failed(self, step: str, ids: list[int], exc: Exception, lease: float) -> bool:
        """A call of `step` for `ids` failed: log it (one line) and choose each item's next
        step. True when the items are given up: the caller forgets them (discard) and leaves
        them to their lease, counted unsettled."""
        first = self.pending[ids[0]]
        call = {"outcome": "ack" if first.error is None else "nack", "charge": "fallback nack",
                "release": "release"}[step]
        tries = first.tries + 1
        if step == "outcome" and tries < SETTLE_TRIES:
            pause = min(SETTLE_RETRY_PAUSE, lease / 10)
            then = f"sending {'each' if len(ids) > 1 else 'it'} again in {pause:g}s"
            next_step, due = step, time.monotonic() + pause
        elif step == "outcome":
            then = "recording a failed attempt with a fixed reason instead"
            next_step, due = "charge", 0.0
        elif step == "charge" and ids[0] not in self._given_back:
            then = "releasing it (its attempt is given back)"
            next_step, due = "release", 0.0
            self._given_back.add(ids[0])
        else:
            then = ("giving up: it stays leased to this worker until its lease expires, then comes back "
                    "with this attempt charged")
            next_step, due = "", 0.0
        log.warning("%s of item(s) %s failed%s: %s; %s", call, ids,
                    f" (try {tries} of {SETTLE_TRIES})" if step == "outcome" else "", first_line(exc), then)
        for item_id in ids:
            settlement = self.pending[item_id]
            settlement.failure = type(exc).__name__
            settlement.tries = tries if next_step == step else 0
            settlement.step, settlement.due = next_step, due
        return not next_step


class Listener:
    """LISTEN on the queue's channel over a connection of its own (autocommit, out of the pool);
    also the bench's consumers' (queuectl.bench.workers.IdleWait).

    On a queue that notifies only registered consumers (`gated`) it LISTENs only while it
    holds the looker's seat (take_seat); otherwise from the start."""

    def __init__(self, queue: QueueClient) -> None:
        values = queue.names.template_values()
        self._sql = {key: render("postgresql", "activation", key, values)
                     for key in ("listen", "unlisten", "notify", "wait_begin", "wait_end", "seat_take", "seat_leave")}
        # reliable_0006+: the queue notifies only consumers registered through wait_begin
        self.gated = schema_revision_number(queue.info.schema_version) >= WAIT_REGISTRATION_REVISION
        self.seated = False
        raw = queue.engine.raw_connection()
        self.conn = raw.driver_connection
        raw.detach()  # owned here and closed here, never handed back to the pool
        self.conn.rollback()  # the pool's pre-ping may have opened a transaction
        self.conn.autocommit = True
        if not self.gated:
            self.conn.execute(self._sql["listen"])
        self.fd = self.conn.fileno()

    def take_seat(self) -> bool:
        """Become the queue's looker if no session is (a try, never a wait); the looker
        LISTENs. True when this session holds the seat."""
        if not self.seated and self.conn.execute(self._sql["seat_take"]).fetchone()[0]:
            self.conn.execute(self._sql["listen"])
            self.seated = True
        return self.seated

    def leave_seat(self) -> None:
        """Stop LISTENing and give the seat up (registration, if any, given up before)."""
        if self.seated:
            self.seated = False
            self.conn.execute(self._sql["unlisten"])
            self.conn.execute(self._sql["seat_leave"])

    def drain(self) -> int:
        """How many notifications arrived (without waiting); raises if the connection broke."""
        return sum(1 for _ in self.conn.notifies(timeout=0.0))

    def notify(self) -> None:
        self.conn.execute(self._sql["notify"])

    def wait_begin(self) -> bool:
        """Register this session as one that may sleep; True when sleeping after one more
        empty look is safe, False while an enqueue that may have missed the registration is open."""
        return bool(self.conn.execute(self._sql["wait_begin"]).fetchone()[0])

    def wait_end(self) -> None:
        self.conn.execute(self._sql["wait_end"])

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # closing a broken connection: nothing left to do
            pass


def _ignore_signals() -> None:
    """Handler processes leave SIGINT/SIGTERM to the parent, which stops them gracefully."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class HandlerProcessDied(RuntimeError):
    """The process running a handler ended before the handler returned (os._exit, a signal,
    the kernel's OOM killer): the failure of the item it was running."""


ORPHAN_CHECK_S = 1.0  # how often a child process checks that the process that started it is alive


def exit_when_orphaned(parent: int, every: float = ORPHAN_CHECK_S) -> None:
    """Start a watch, in a child process, that ends the process at once when `parent` (the
    process that started it, its pid taken there: a child that read its parent's pid itself
    could read it after the parent died) is gone (SIGKILL, OOM, a cancelled job), or lingers
    unreaped: its children cannot be stopped by it any more and would go on working for
    nobody. Its users: a handler process (its item was the dead worker's: it comes back when
    its lease expires, and nobody is left to record its outcome), the demo's and the bench's
    producers and consumers (they would go on loading the server)."""

    def watch() -> None:
        while _running(parent):
            time.sleep(every)
        os._exit(1)

    threading.Thread(target=watch, name="queuectl-orphan-watch", daemon=True).start()


def _running(pid: int) -> bool:
    """The process is there and not a zombie (one that has exited, waiting to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there, under another user
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):  # no /proc: being there is all there is to know
        return True


def _serve_handler(handler: Handler, conn: mp_connection.Connection, parent: int) -> None:
    """A handler process's body: run the handler on each item received, reply with its error
    text (None on success), until the parent closes the pipe or dies."""
    _ignore_signals()
    exit_when_orphaned(parent)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        try:
            handler(message)
        except BaseException as exc:  # whatever the handler raises is this item's failure
            reply = diagnostic_text(exc)
        else:
            reply = None
        try:
            conn.send(reply)
        except OSError:  # the worker is gone
            return


class _HandlerProcess:
    """A spawned process running the handler for one handler thread, one item at a time.

    The thread sends the item over this process's own pipe and waits for the reply or for
    the process to end, so the item a dying process takes with it is known: the one it was
    sent. Only that item is charged; the other processes and their items go on. (A shared
    process pool breaks whole when one of its processes dies, failing every item in
    flight with it.) Used by its own thread only, but for kill().
    """

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.process: Any = None
        self.conn: mp_connection.Connection | None = None

    def run(self, message: Message) -> str | None:
        """The handler's error text for `message` (None when it succeeded); raises
        HandlerProcessDied when the process ended first (the next call starts a new one)."""
        if self.process is None:
            self._start()
        process, conn = self.process, self.conn
        assert conn is not None
        try:
            conn.send(message)
            if conn in mp_connection.wait([conn, process.sentinel]):
                outcome: str | None = conn.recv()  # the handler's error text, None when it returned
                return outcome
        except (EOFError, OSError):  # the pipe broke: the process is gone
            pass
        process.join()
        self.close()
        raise HandlerProcessDied(f"handler process died ({_exit_text(process.exitcode)})")

    def _start(self) -> None:
        ctx = get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_serve_handler, args=(self.handler, child_conn, os.getpid()), daemon=True,
                                   name="queuectl-handler")
        self.process.start()
        child_conn.close()

    def close(self) -> None:
        """End the process: it exits when its pipe closes (killed if it does not within 5 s)."""
        process, conn, self.process, self.conn = self.process, self.conn, None, None
        if process is None:
            return
        assert conn is not None
        conn.close()
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()

    def kill(self) -> None:
        """End the process now, whatever it runs (a forced stop; thread-safe)."""
        process = self.process
        if process is not None and process.is_alive():
            process.kill()


def _exit_text(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"killed by signal {-exitcode}, {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


class Worker:
    """Run `handler(message)` on every item of a queue as it arrives; see the module docstring.

    The Queue client is used from the thread that calls run(), and only from there.
    """

    def __init__(
        self,
        queue: QueueClient,
        handler: Handler,
        *,
        processes: bool = False,
        notify: bool = True,
        burst: bool = False,
        handle_signals: bool = True,
        **settings: Any,
    ) -> None:
        """settings: concurrency (1), batch (10), lease (the queue's), poll_interval (2 s),
        min_poll_interval (50 ms), heartbeat_fraction (1/3), log_interval (10 s),
        shutdown_timeout (none): see LoopSettings."""
        self.settings = loop_settings(queue, handler, **settings)
        if processes:
            try:
                pickle.dumps(handler)
            except Exception:
                raise UsageError("with processes the handler must be a module-level function (picklable)") from None
        self.queue = queue
        self.handler = handler
        self.concurrency, self.batch, self.lease = self.settings.concurrency, self.settings.batch, self.settings.lease
        self.poll_interval, self.min_poll_interval = self.settings.poll_interval, self.settings.min_poll_interval
        self.heartbeat_every = self.settings.heartbeat_every
        self.notify = notify and adapter_for(queue.engine).can_listen
        self.processes = processes
        self.burst = burst
        self.log_interval, self.shutdown_timeout = self.settings.log_interval, self.settings.shutdown_timeout
        self.handle_signals = handle_signals
        self.stats = WorkerStats()

        self._stop = threading.Event()
        self._force = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._work: queue_mod.SimpleQueue[Message | None] = queue_mod.SimpleQueue()
        self._done: queue_mod.SimpleQueue[tuple[int, str | None, bool]] = queue_mod.SimpleQueue()
        self._held: dict[int, Message] = {}  # claimed and not yet acked/nacked/released (control thread only)
        self._lost: set[int] = set()  # held items whose lease a heartbeat found gone
        self._settlements = Settlements()  # held items whose outcome is still to be recorded
        self._listener: Listener | None = None
        self._listener_retry_at = 0.0
        self._registered = False  # the listener session holds the queue's "waiting" registration
        self._armed = False  # ... and no enqueue that missed it was open when it was checked
        self._deaf_until: float = 0.0  # outrun: notifications are drained, not answered, until then
        self._seat = SeatTimes(self.settings.poll_interval)  # when to try the seat, when to give it up
        self._selector: selectors.BaseSelector | None = None
        self._processes: list[_HandlerProcess] = []  # one per handler thread, with processes=True
        self._threads: list[threading.Thread] = []
        self._ran = False
        self._closed = False
        self._gave_up = False  # the client gave up reconnecting: no more database calls
        self._next_heartbeat = self._next_log = math.inf
        self._logged = (0, 0, time.monotonic())

    # -- public ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop gracefully (thread-safe; a second call stops waiting for handlers)."""
        if self._stop.is_set():
            self._force.set()
        self._stop.set()
        self._wake()

    def run(self) -> WorkerStats:
        """Process items until stopped (or, with burst, until the queue is empty); returns the stats."""
        if self._ran:
            raise UsageError("a Worker runs once: create a new one")
        self._ran = True
        self.stats = WorkerStats()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        previous_handlers = self._install_signal_handlers()
        try:
            for i in range(self.concurrency):
                process = _HandlerProcess(self.handler) if self.processes else None
                if process is not None:
                    self._processes.append(process)
                thread = threading.Thread(target=self._handler_thread, args=(process,), name=f"queuectl-handler-{i}",
                                          daemon=True)
                thread.start()
                self._threads.append(thread)
        except BaseException:
            self._close(previous_handlers)
            raise
        log.info(
            "worker %s on queue %s: concurrency %d%s, batch %d, lease %gs, %s",
            self.queue.worker, self.queue.name, self.concurrency, " processes" if self.processes else " threads",
            self.batch, self.lease,
            f"LISTEN on {self.queue.names.channel} + poll every {self.poll_interval:g}s at most" if self.notify
            else f"polling {self.min_poll_interval:g}-{self.poll_interval:g}s",
        )
        try:
            self._loop()
        except ConnectionFailed:
            # The client retried for its whole budget: settling now would wait as long
            # again per call. What is held comes back when its lease expires.
            self._gave_up = True
            self._force.set()
            raise
        finally:
            try:
                self._shutdown()
            finally:
                self._close(previous_handlers)
        return self.stats

    # -- the control loop ------------------------------------------------------------------

    def _loop(self) -> None:
        backoff = PollBackoff(self.min_poll_interval, self.poll_interval)
        in_flight = PollBackoff(min(IN_FLIGHT_FIRST_WAIT, self.min_poll_interval), self.poll_interval)
        outrun = PollBackoff(self.min_poll_interval, self.poll_interval)
        gather = Gather(min(GATHER_FIRST_WAIT, self.min_poll_interval), min(GATHER_LONGEST, self.min_poll_interval),
                        self.poll_interval)
        look = True  # dequeue at the next chance: at start, on a notification, when a poll is due
        notified = False  # the next look answers a notification
        next_poll = math.inf
        now = time.monotonic()
        self._next_heartbeat = now + (self.heartbeat_every or math.inf)
        self._next_log = now + self.log_interval
        self._logged = (0, 0, now)
        while not self._stop.is_set():
            if self.notify and self._listener is None and time.monotonic() >= self._listener_retry_at:
                if self._open_listener():
                    look = True  # items may have arrived while nobody listened
            self._settle()
            self._heartbeat_if_due()
            self._log_if_due()
            room = self._room()
            seat_deadline = self._keep_seat(room)
            if look and room:
                try:
                    messages = self.queue.dequeue(room, lease=self.lease)
                except StatementCanceled as exc:  # rolled back whole: nothing claimed; look again later
                    self.stats.canceled += 1
                    log.warning("%s; looking again in the next poll", exc)
                    messages = []
                self.stats.dequeues += 1
                if messages:
                    for message in messages:
                        self._held[message.id] = message
                        self._work.put(message)
                    backoff.reset()
                    in_flight.reset()
                    if notified:  # won a race: when next outrun, it waits the shortest time again
                        outrun.reset()
                    self._deaf_until, notified = 0.0, False
                    if self._registered:
                        self._unregister()  # busy: producers need not announce to us
                    gap = gather.claimed(len(messages), room, self._listener is None or self._listener.seated
                                         or not self._listener.gated)
                    if not gap:
                        continue  # drain: look again at once
                    # the claim drained the queue: let items gather (see "Many consumers")
                    look = False
                    next_poll = self._deaf_until = time.monotonic() + gap
                    continue
                self.stats.empty_polls += 1
                look = False
                if self.burst and not self._held and self._done.empty():
                    log.info("queue %s is empty: burst worker done", self.queue.name)
                    break
                if notified and self._registered:
                    # Another consumer took what the notification announced (see "Many consumers");
                    # the looker comes back after the shortest wait: it is the one to announce to.
                    notified = False
                    seated = self._listener is not None and self._listener.seated
                    self._unregister()
                    wait = gather.longest if seated else outrun.next_wait()
                    next_poll = self._deaf_until = time.monotonic() + wait
                    continue
                notified = False
                seated = self._listener is None or not self._listener.gated or self._take_seat()
                gap = gather.claimed(0, room, seated)
                if gap is not None:  # busy a moment ago, or not the looker: look again after a window
                    next_poll = self._deaf_until = time.monotonic() + gap
                    continue
                if self._listener is not None and self._listener.gated and not self._armed:
                    clear = self._register()
                    if clear:
                        in_flight.reset()
                        look = True  # one more look, now that every later enqueue will announce itself
                        continue
                    if clear is False:  # an enqueue that may have missed the registration is still open
                        next_poll = time.monotonic() + in_flight.next_wait()
                        continue
                next_poll = time.monotonic() + backoff.next_wait()
            now = time.monotonic()
            deadlines = [self._next_log]
            if not look:
                deadlines.append(next_poll)
            if self._held and self.heartbeat_every is not None:
                deadlines.append(self._next_heartbeat)
            if self._settlements.pending:
                deadlines.append(self._next_settle())
            if self.notify and self._listener is None:
                deadlines.append(self._listener_retry_at)
            deadlines.append(seat_deadline)
            if self._wait(max(0.0, min(deadlines) - now)):
                look = notified = True
                backoff.reset()
            if time.monotonic() >= next_poll:
                look = True

    def _room(self) -> int:
        """How many items to claim now: up to a batch, never more than max(concurrency, batch) held."""
        held = len(self._held)
        if held >= self.concurrency:
            return 0
        return min(self.batch, max(self.concurrency, self.batch) - held)

    def _wait(self, timeout: float) -> bool:
        """Sleep until a notification, a wake-up or the timeout; True when notified. While
        outrun (before _deaf_until) the listener's socket is not watched: notifications wait
        in it and are drained with the next registration."""
        assert self._selector is not None
        notified = False
        deaf = self._listener is not None and time.monotonic() < self._deaf_until
        if deaf:
            assert self._listener is not None
            self._selector.unregister(self._listener.fd)
            try:
                events = self._selector.select(timeout)
            finally:
                self._selector.register(self._listener.fd, selectors.EVENT_READ)
        else:
            events = self._selector.select(timeout)
        for key, _events in events:
            if key.fd == self._wake_r:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            elif self._listener is not None:
                try:
                    count = self._listener.drain()
                except Exception as exc:  # the listener connection broke: poll until it is back
                    log.warning("LISTEN connection lost (%s): polling until it is reopened", first_line(exc))
                    self._drop_listener()
                    notified = True  # look now: something may have been missed
                    continue
                if count:
                    self.stats.notifications += count
                    notified = True
        return notified

    def _wake(self) -> None:
        """Interrupt the control loop's wait (safe from signal handlers and other threads)."""
        if self._closed:
            return
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wake-up is pending anyway) or already closed

    def _open_listener(self) -> bool:
        try:
            self._listener = Listener(self.queue)
        except Exception as exc:
            log.warning("cannot LISTEN on %s (%s): polling, retry in %gs", self.queue.names.channel, first_line(exc),
                        self.poll_interval)
            self._listener_retry_at = time.monotonic() + self.poll_interval
            return False
        assert self._selector is not None
        self._selector.register(self._listener.fd, selectors.EVENT_READ)
        return True

    def _take_seat(self) -> bool:
        """Hold the looker's seat (see "Many consumers"); False when another consumer holds
        it (tried at most once per poll_interval), or the listener connection broke (it is
        dropped, and polling covers until it is back)."""
        assert self._listener is not None
        if self._listener.seated:
            return True
        if not self._seat.may_try(time.monotonic()):
            return False
        try:
            return self._listener.take_seat()
        except Exception as exc:
            log.warning("LISTEN connection lost (%s): polling until it is reopened", first_line(exc))
            self._drop_listener()
            return False

    def _keep_seat(self, room: int) -> float:
        """A looker with no room for new items gives the seat up (SeatTimes.full). Returns
        when to check again (inf: nothing to check)."""
        check = self._seat.full(self._listener is not None and self._listener.seated, room, time.monotonic())
        if check is not None:
            return check
        if self._registered:
            self._unregister()
        if self._listener is not None:
            try:
                self._listener.leave_seat()
            except Exception as exc:
                log.warning("LISTEN connection lost (%s): polling until it is reopened", first_line(exc))
                self._drop_listener()
        return math.inf

    def _register(self) -> bool | None:
        """Tell producers this consumer may sleep (reliable_0006: they notify only then); None
        when the listener connection broke (it is dropped, and polling covers until it is back)."""
        assert self._listener is not None
        try:
            clear = self._listener.wait_begin()
            self.stats.notifications += self._listener.drain()  # any that came in with the reply
        except Exception as exc:
            log.warning("LISTEN connection lost (%s): polling until it is reopened", first_line(exc))
            self._drop_listener()
            return None
        self._registered, self._armed = True, clear
        return clear

    def _unregister(self) -> None:
        assert self._listener is not None
        self._registered = self._armed = False
        try:
            self._listener.wait_end()
            self.stats.notifications += self._listener.drain()
        except Exception as exc:
            log.warning("LISTEN connection lost (%s): polling until it is reopened", first_line(exc))
            self._drop_listener()

    def _drop_listener(self) -> None:
        self._registered = self._armed = False
        if self._listener is None:
            return
        assert self._selector is not None
        try:
            self._selector.unregister(self._listener.fd)
        except (KeyError, ValueError):
            pass
        self._listener.close()
        self._listener = None
        self._listener_retry_at = time.monotonic() + self.poll_interval

    # -- outcomes, heartbeats, throughput ----------------------------------------------------

    def _settle(self) -> None:
        """Record the outcomes of finished handlers (see "Settling" in the module docstring).

        First sends go together: one ack for what succeeded, one nack per distinct error,
        one release for what is given back. An item whose call failed is sent again alone,
        so an item the server refuses cannot hold back the others of its call. Items stay
        in _held, and keep their heartbeat, until their outcome is recorded or given up.
        """
        while True:
            try:
                item_id, error, ran = self._done.get_nowait()
            except queue_mod.Empty:
                break
            if ran:
                self._settlements.add(item_id, error)
            else:
                self._forget([item_id])
                self.stats.lost += 1
        for (step, text, _alone), ids in self._settlements.due(time.monotonic()).items():
            try:
                self._record(step, ids, text)
            except ConnectionFailed:  # the client gave up reconnecting: the worker stops
                raise
            except Exception as exc:  # whatever refused the call, the items are still held
                self._record_failed(step, ids, exc)

    def _record(self, step: str, ids: list[int], text: str | None) -> None:
        """One call: ack (step "outcome", no error text), nack with `text`, or release."""
        if step == "release":
            released = self.queue.release(ids)
            self.stats.released += released
            self.stats.lost += len(ids) - released
            self._forget(ids)
            self._announce_released()
        elif text is None:
            acked = self.queue.ack(ids)
            self._forget(ids)
            self.stats.processed += acked
            self.stats.lost += len(ids) - acked
        else:
            statuses = self.queue.nack(ids, text)
            self._forget(ids)
            self.stats.failed += len(statuses)
            self.stats.dead += sum(1 for status in statuses.values() if status == "dead")
            self.stats.lost += len(ids) - len(statuses)

    def _record_failed(self, step: str, ids: list[int], exc: Exception) -> None:
        """A settling call failed: Settlements chooses each item's next step."""
        if isinstance(exc, StatementCanceled):
            self.stats.canceled += 1
        if self._settlements.failed(step, ids, exc, self.lease):
            self._forget(ids)
            self.stats.unsettled += len(ids)

    def _next_settle(self) -> float:
        """When the next settling call is due (a retry waits a short pause)."""
        return self._settlements.next_due()

    def _forget(self, ids: list[int]) -> None:
        for item_id in ids:
            self._held.pop(item_id, None)
            self._lost.discard(item_id)
        self._settlements.discard(ids)

    def _heartbeat_if_due(self) -> None:
        if self.heartbeat_every is None:
            return
        now = time.monotonic()
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + self.heartbeat_every
        ids = [item_id for item_id in self._held if item_id not in self._lost]
        if not ids:
            return
        try:
            kept = set(self.queue.extend_lease(ids, lease=self.lease))
        except ConnectionFailed:
            raise
        except Exception as exc:  # canceled or refused: the leases stand as they were; try again soon
            if isinstance(exc, StatementCanceled):
                self.stats.canceled += 1
            self._next_heartbeat = now + min(self.heartbeat_every, 1.0)
            log.warning("heartbeat of %d item(s) failed: %s; trying again", len(ids), first_line(exc))
            return
        self.stats.heartbeats += 1
        gone = [item_id for item_id in ids if item_id not in kept]
        if gone:
            self._lost.update(gone)
            log.warning("lost the lease of %d item(s) %s: another consumer may run them", len(gone), gone[:10])

    def _log_if_due(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now < self._next_log:
            return
        self._next_log = now + self.log_interval
        processed, failed, since = self._logged
        done, bad = self.stats.processed - processed, self.stats.failed - failed
        if done or bad or self._held or final:
            seconds = max(now - since, 1e-9)
            log.info(
                "queue %s: %d processed, %d failed in %.1fs (%.1f/s); holding %d; %d notifications, %d empty polls so far",
                self.queue.name, done, bad, seconds, (done + bad) / seconds, len(self._held),
                self.stats.notifications, self.stats.empty_polls,
            )
        self._logged = (self.stats.processed, self.stats.failed, now)

    # -- handlers --------------------------------------------------------------------------

    def _handler_thread(self, process: _HandlerProcess | None) -> None:
        try:
            while True:
                message = self._work.get()
                if message is None:
                    return
                if message.id in self._lost:  # its lease is gone: another consumer may be running it
                    self._done.put((message.id, None, False))
                    self._wake()
                    continue
                error = None
                try:
                    if process is None:
                        self.handler(message)
                    else:
                        error = process.run(message)
                except BaseException as exc:  # whatever the handler raises (SystemExit too) fails this item only
                    error = diagnostic_text(exc)
                if error is not None:
                    log.warning("item %d failed (attempt %d of %d): %s", message.id, message.attempts,
                                message.max_attempts, error)
                self._done.put((message.id, error, True))
                self._wake()
        finally:
            if process is not None:
                process.close()

    # -- stopping --------------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, self._on_signal)
        return previous

    def _on_signal(self, signum: int, frame: object) -> None:
        # Only flags and a pipe write here: logging from a signal handler can deadlock.
        self.stop()

    def _shutdown(self) -> None:
        """Give back what no thread started, wait for running handlers, settle their outcomes."""
        unstarted: list[int] = []
        while True:
            try:
                message = self._work.get_nowait()
            except queue_mod.Empty:
                break
            if message is not None:
                unstarted.append(message.id)
        for _ in self._threads:
            self._work.put(None)
        if self._gave_up:
            log.warning("connection lost for good: %d held item(s) come back when their leases expire",
                        len(self._held))
            return
        if self._stop.is_set():
            log.info("stopping: releasing %d unstarted item(s), waiting for %d in handlers", len(unstarted),
                     len(self._held) - len(unstarted))
        for item_id in unstarted:
            self._settlements.add(item_id, None, release=True)
        try:
            self._settle()
            deadline = math.inf if self.shutdown_timeout is None else time.monotonic() + self.shutdown_timeout
            while self._held and not self._force.is_set() and time.monotonic() < deadline:
                now = time.monotonic()
                self._wait(max(0.0, min(0.5, deadline - now, self._next_settle() - now)))
                self._settle()
                self._heartbeat_if_due()
            self._settle()
        except ConnectionFailed as exc:
            log.warning("could not settle every item while stopping (%s)", exc)
        if self._held:
            log.warning("stopped with %d item(s) still in handlers: they come back when their leases expire",
                        len(self._held))
        self._log_if_due(final=True)
        s = self.stats
        log.info("worker %s stopped after %.1fs: %d processed, %d failed (%d dead), %d released, %d lost, "
                 "%d unsettled", self.queue.worker, s.seconds, s.processed, s.failed, s.dead, s.released, s.lost,
                 s.unsettled)

    def _announce_released(self) -> None:
        """Wake other consumers so they take the released items now, not at their next poll."""
        if self._listener is None:
            return
        try:
            self._listener.notify()
        except Exception as exc:  # only latency is at stake
            log.warning("could not notify other consumers of released items: %s", first_line(exc))

    def _close(self, previous_handlers: dict[int, Any]) -> None:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
        if self._listener is not None:
            self._drop_listener()
        for thread in self._threads:
            thread.join(timeout=0 if self._held else 5)
        # Each thread ends its own process on its way out; one still running (a forced stop)
        # is killed now, or interpreter exit would wait for it (handler processes ignore
        # SIGTERM). Its item comes back when its lease expires.
        for process in self._processes:
            process.kill()
        if self._selector is not None:
            self._selector.close()
        self._closed = True
        os.close(self._wake_r)
        os.close(self._wake_w)


def resolve_handler(spec: str) -> Handler:
    """'package.module:function' (as `queuectl worker --handler` takes it) -> the function.

    Every way the spec can be wrong is a one-line UsageError. The current directory is
    importable, as with `python -m`.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--handler {spec!r}: expected module:function, e.g. myapp.tasks:send_receipt")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UsageError(f"--handler {spec!r}: no module named {exc.name!r} (is it on PYTHONPATH?)") from None
        raise UsageError(f"--handler {spec!r}: importing {module_name} failed: {_one_line(exc)}") from None
    except Exception as exc:
        raise UsageError(f"--handler {spec!r}: importing {module_name} failed: {_one_line(exc)}") from None
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"--handler {spec!r}: {module_name} has no attribute {attr!r}") from None
    if not callable(target):
        raise UsageError(f"--handler {spec!r}: {attr} is a {type(target).__name__}, not a function")
    handler: Handler = target
    return handler


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
