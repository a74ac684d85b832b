"""The asyncio consumer loop: `await AsyncQueue.consume(handler)` with async handlers.

The rules are the blocking worker's (queuectl.worker, whose docstring has the reasons), on
an event loop instead of threads:

Waking
    A psycopg AsyncConnection of its own (the AsyncListener) carries the waiting; the event
    loop watches its socket, so an idle worker sleeps until a notification, a poll timer or
    a stop. Before it sleeps the loop registers as a possibly sleeping consumer
    (`<queue>_wait_begin()`, reliable_0006+) and looks once more; a busy loop gives the
    registration up (`<queue>_wait_end()`). Polling with the same adaptive back-off
    (PollBackoff: 50 ms doubling to poll_interval) runs underneath, so a lost notification
    costs latency, never items.

Many consumers
    As the blocking worker's (queuectl.worker, "Many consumers", with the same Gather window
    and SeatTimes): one consumer per queue, the looker, holds the queue's seat, a
    session-level advisory lock only ever tried on its AsyncListener's session; only the
    looker LISTENs and registers, so a notification signals one backend. The others look
    after their gather window (up to poll_interval) and try the seat after an empty look,
    at most once per poll_interval. A looker whose claim drained the queue looks again
    after its window (at most 50 ms); two empty looks in a row and it registers, looks once
    more and sleeps on the channel. A looker outrun to what a notification announced gives
    its registration up and looks again after 50 ms; one with no room for new items (its
    handlers all busy) gives the seat up after 50 ms; one that stops or dies frees the seat
    with its session. Blocking and asyncio consumers share the seat, so a mixed fleet has
    one looker.

Concurrency
    Up to `concurrency` handlers run at once as tasks; the loop claims at most
    max(concurrency, batch) items. A handler is `async def handler(message)` (a plain
    function works too, but blocks the loop while it runs). Whatever it raises is its
    item's failure only.

Leases and outcomes
    Every `heartbeat_fraction` of the lease the loop extends the leases of every item it
    holds; an item whose lease was lost is not started. Successes are acked together, each
    distinct error is one nack with the error's text (so the queue's backoff applies). A
    settling call refused on a live connection follows the blocking worker's rules
    (queuectl.worker, "Settling", one Settlements for both): sent again alone per item, then
    a nack with a fixed reason (the attempt is charged), then a release, then left to its
    lease (`unsettled`).

Stopping
    SIGTERM or SIGINT (or stop()): stop claiming, release claimed items no handler has
    started, wait for running handlers and record their outcomes, then return the stats.
    A second signal stops waiting: running handlers are cancelled and their items come back
    when their leases expire. When the client gives up reconnecting (ConnectionFailed) the
    worker stops at once and re-raises; held items come back when their leases expire.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from queuectl.arguments import schema_revision_number
from queuectl.engine import adapter_for
from queuectl.engine.urls import first_line
from queuectl.errors import ConnectionFailed, StatementCanceled, UsageError
from queuectl.messages import Message
from queuectl.sqlfiles import render
from queuectl.storable import diagnostic_text
from queuectl.worker import (
    GATHER_FIRST_WAIT, GATHER_LONGEST, IN_FLIGHT_FIRST_WAIT, WAIT_REGISTRATION_REVISION, Gather, PollBackoff, SeatTimes,
    Settlements, WorkerStats, loop_settings,
)

AsyncHandler = Callable[[Message], Awaitable[Any] | Any]
AsyncWorkerStats = WorkerStats
log = logging.getLogger("queuectl.worker")


class AsyncListener:
    """LISTEN on the queue's channel over a psycopg AsyncConnection of its own (autocommit);
    also the peers scenario's asyncio consumers' (queuectl.bench.peers).

    Opened with `seats` on a queue that notifies only registered consumers (`gated`), it
    LISTENs only while it holds the looker's seat (take_seat), as queuectl.worker.Listener
    does; otherwise from the start."""

    def __init__(self, conn: Any, sql: dict[str, str], gated: bool) -> None:
        self.conn = conn
        self._sql = sql
        self.gated = gated
        self.seated = False

    @classmethod
    async def open(cls, queue: Any, seats: bool = False) -> AsyncListener:
        import psycopg

        sql = {key: render("postgresql", "activation", key, queue.names.template_values())
               for key in ("listen", "unlisten", "notify", "wait_begin", "wait_end", "seat_take", "seat_leave")}
        gated = schema_revision_number(queue.info.schema_version) >= WAIT_REGISTRATION_REVISION
        engine = queue.engine.sync_engine
        _args, params = engine.dialect.create_connect_args(queue.engine.url)
        conn = await psycopg.AsyncConnection.connect(
            **{**params, **adapter_for(engine).connect_args(queue.engine.url)}, autocommit=True)
        try:
            if not (gated and seats):
                await conn.execute(sql["listen"])
        except BaseException:
            await conn.close()
            raise
        return cls(conn, sql, gated)

    async def take_seat(self) -> bool:
        """Become the queue's looker if no session is (a try, never a wait); the looker
        LISTENs. True when this session holds the seat."""
        if not self.seated:
            cursor = await self.conn.execute(self._sql["seat_take"])
            row = await cursor.fetchone()
            if row[0]:
                await self.conn.execute(self._sql["listen"])
                self.seated = True
        return self.seated

    async def leave_seat(self) -> None:
        """Stop LISTENing and give the seat up (registration, if any, given up before)."""
        if self.seated:
            self.seated = False
            await self.conn.execute(self._sql["unlisten"])
            await self.conn.execute(self._sql["seat_leave"])

    async def drain(self) -> int:
        """How many notifications arrived (without waiting); raises if the connection broke."""
        count = 0
        async for _ in self.conn.notifies(timeout=0.0):
            count += 1
        return count

    async def wait_begin(self) -> bool:
        cursor = await self.conn.execute(self._sql["wait_begin"])
        row = await cursor.fetchone()
        return bool(row[0])

    async def wait_end(self) -> None:
        await self.conn.execute(self._sql["wait_end"])

    async def notify(self) -> None:
        await self.conn.execute(self._sql["notify"])

    async def close(self) -> None:
        try:
            await self.conn.close()
        except Exception:  # closing a broken connection: nothing left to do
            pass


class AsyncWorker:
    """Run `await handler(message)` on every item of a reliable queue (an AsyncQueue) as it
    arrives; see the module docstring. Runs once, on the event loop that awaits run()."""

    def __init__(self, queue: Any, handler: AsyncHandler, *, notify: bool = True, burst: bool = False,
                 handle_signals: bool = True, **settings: Any) -> None:
        """settings: concurrency, batch, lease, poll_interval, min_poll_interval,
        heartbeat_fraction, log_interval, shutdown_timeout (queuectl.worker.loop_settings)."""
        self.settings = loop_settings(queue, handler, **settings)
        self.queue = queue
        self.handler = handler
        self.concurrency, self.batch, self.lease = self.settings.concurrency, self.settings.batch, self.settings.lease
        self.poll_interval, self.min_poll_interval = self.settings.poll_interval, self.settings.min_poll_interval
        self.heartbeat_every = self.settings.heartbeat_every
        self.notify = notify
        self.burst = burst
        self.log_interval, self.shutdown_timeout = self.settings.log_interval, self.settings.shutdown_timeout
        self.handle_signals = handle_signals
        self.stats = WorkerStats()
        self._ran = False
        self._stopping = False
        self._forced = False
        self._wake = asyncio.Event()
        self._work: asyncio.Queue[Message] = asyncio.Queue()
        self._held: dict[int, Message] = {}
        self._lost: set[int] = set()
        self._settlements = Settlements()  # finished items whose outcome is still to be recorded
        self._running: set[asyncio.Task[None]] = set()
        self._listener: AsyncListener | None = None
        self._listener_retry_at = 0.0
        self._registered = self._armed = False
        self._deaf_until = 0.0  # outrun: notifications are drained, not answered, until then
        self._seat = SeatTimes(self.settings.poll_interval)  # when to try the seat, when to give it up
        self._next_heartbeat = math.inf
        self._next_log = math.inf

    # -- public ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop gracefully (a second call stops waiting for running handlers)."""
        if self._stopping:
            self._forced = True
            for task in self._running:
                task.cancel()
        self._stopping = True
        self._wake.set()

    async def run(self) -> WorkerStats:
        """Process items until stopped (or, with burst, until the queue is empty); returns the stats."""
        if self._ran:
            raise UsageError("an AsyncWorker runs once: create a new one")
        self._ran = True
        self.stats = WorkerStats()
        loop = asyncio.get_running_loop()
        signals = self._install_signal_handlers(loop)
        runners = [asyncio.create_task(self._runner()) for _ in range(self.concurrency)]
        log.info("async worker %s on queue %s: concurrency %d, batch %d, lease %gs, %s", self.queue.worker,
                 self.queue.name, self.concurrency, self.batch, self.lease,
                 f"LISTEN on {self.queue.names.channel}" if self.notify else "polling")
        gave_up = False
        try:
            await self._loop()
        except ConnectionFailed:
            gave_up = True
            raise
        finally:
            try:
                if not gave_up:
                    await self._shutdown()
            finally:
                for task in runners:
                    task.cancel()
                for task in list(self._running):
                    task.cancel()
                await asyncio.gather(*runners, *self._running, return_exceptions=True)
                await self._drop_listener()
                for signum in signals:
                    loop.remove_signal_handler(signum)
        return self.stats

    # -- the control loop ------------------------------------------------------------------

    async def _loop(self) -> None:
        backoff = PollBackoff(self.min_poll_interval, self.poll_interval)
        in_flight = PollBackoff(min(IN_FLIGHT_FIRST_WAIT, self.min_poll_interval), self.poll_interval)
        outrun = PollBackoff(self.min_poll_interval, self.poll_interval)
        gather = Gather(min(GATHER_FIRST_WAIT, self.min_poll_interval), min(GATHER_LONGEST, self.min_poll_interval),
                        self.poll_interval)
        look, next_poll = True, math.inf
        notified = False  # the next look answers a notification
        now = time.monotonic()
        self._next_heartbeat = now + (self.heartbeat_every or math.inf)
        self._next_log = now + self.log_interval
        while not self._stopping:
            if self.notify and self._listener is None and time.monotonic() >= self._listener_retry_at:
                look = await self._open_listener() or look
            await self._settle()
            await self._heartbeat_if_due()
            self._log_if_due()
            room = self._room()
            seat_deadline = await self._keep_seat(room)
            if look and room:
                try:
                    messages = await self.queue.dequeue(room, lease=self.lease)
                except StatementCanceled as exc:
                    self.stats.canceled += 1
                    log.warning("%s; looking again in the next poll", exc)
                    messages = []
                self.stats.dequeues += 1
                if messages:
                    for message in messages:
                        self._held[message.id] = message
                        self._work.put_nowait(message)
                    backoff.reset()
                    in_flight.reset()
                    if notified:  # won a race: when next outrun, it waits the shortest time again
                        outrun.reset()
                    self._deaf_until, notified = 0.0, False
                    if self._registered:
                        await self._unregister()
                    gap = gather.claimed(len(messages), room, self._seated_or_ungated())
                    if gap:  # the claim drained the queue: let items gather (queuectl.worker, "Many consumers")
                        look = False
                        next_poll = self._deaf_until = time.monotonic() + gap
                    continue
                self.stats.empty_polls += 1
                look = False
                if self.burst and not self._held:
                    log.info("queue %s is empty: burst worker done", self.queue.name)
                    break
                if notified and self._registered:  # outrun: the looker is the one to announce to
                    notified = False
                    wait = gather.longest if self._seated() else outrun.next_wait()
                    await self._unregister()
                    next_poll = self._deaf_until = time.monotonic() + wait
                    continue
                notified = False
                gap = gather.claimed(0, room, self._seated_or_ungated() or await self._take_seat())
                if gap is not None:  # busy a moment ago, or not the looker: look again after a window
                    next_poll = self._deaf_until = time.monotonic() + gap
                    continue
                if self._listener is not None and self._listener.gated and not self._armed:
                    clear = await self._register()
                    if clear:
                        in_flight.reset()
                        look = True
                        continue
                    if clear is False:
                        next_poll = time.monotonic() + in_flight.next_wait()
                        continue
                next_poll = time.monotonic() + backoff.next_wait()
            deadlines = [self._next_log, next_poll if not look else math.inf]
            if self._held and self.heartbeat_every is not None:
                deadlines.append(self._next_heartbeat)
            if self._settlements.pending:
                deadlines.append(self._settlements.next_due())
            if self.notify and self._listener is None:
                deadlines.append(self._listener_retry_at)
            deadlines.append(seat_deadline)
            if await self._wait(max(0.0, min(deadlines) - time.monotonic())):
                look = notified = True
                backoff.reset()
            if time.monotonic() >= next_poll:
                look = True

    def _room(self) -> int:
        held = len(self._held)
        if held >= self.concurrency:
            return 0
        return min(self.batch, max(self.concurrency, self.batch) - held)

    async def _wait(self, timeout: float) -> bool:
        """Sleep until a notification, a wake-up or the timeout; True when notified.

        The listener's socket is watched only while sleeping: psycopg watches the same
        socket with a reader of its own while a statement runs on that connection. While
        outrun (before _deaf_until) it is not watched at all: notifications wait in it and
        are drained with the next registration."""
        deaf = time.monotonic() < self._deaf_until
        if not deaf and await self._notified():
            return True
        self._wake.clear()
        if self._finished_pending() or self._stopping:
            return False
        loop = asyncio.get_running_loop()
        fd = None if self._listener is None or deaf else self._listener.conn.fileno()
        if fd is not None:
            loop.add_reader(fd, self._wake.set)
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            if fd is not None:
                loop.remove_reader(fd)
        return not deaf and await self._notified()

    async def _notified(self) -> bool:
        """Whether notifications arrived (counted), or the listener broke (look now)."""
        if self._listener is None:
            return False
        try:
            count = await self._listener.drain()
        except Exception as exc:
            log.warning("LISTEN connection lost (%s): polling until it is reopened", first_line(exc))
            await self._drop_listener()
            return True
        self.stats.notifications += count
        return count > 0

    def _finished_pending(self) -> bool:
        return self._settlements.next_due() <= time.monotonic()

    async def _open_listener(self) -> bool:
        try:
            self._listener = await AsyncListener.open(self.queue, seats=True)
        except Exception as exc:
            log.warning("cannot LISTEN on %s (%s): polling, retry in %gs", self.queue.names.channel, first_line(exc),
                        self.poll_interval)
            self._listener_retry_at = time.monotonic() + self.poll_interval
            return False
        return True

    def _seated(self) -> bool:
        return self._listener is not None and self._listener.seated

    def _seated_or_ungated(self) -> bool:
        """Whether this consumer looks as the looker does: it holds the seat, or there is no
        seat to hold (no listener, or a queue that notifies every listener)."""
        return self._listener is None or not self._listener.gated or self._listener.seated

    async def _take_seat(self) -> bool:
        """Hold the looker's seat; False when another consumer holds it (tried at most once
        per poll_interval), or the listener connection broke (it is dropped, and polling
        covers until it is back)."""
        assert self._listener is not None
        if not self._seat.may_try(time.monotonic()):
            return False
        try:
            return await self._listener.take_seat()
        except Exception as exc:
            log.warning("LISTEN connection lost (%s): polling until it is reopened", first_line(exc))
            await self._drop_listener()
            return False

    async def _keep_seat(self, room: int) -> float:
        """A looker with no room for new items gives the seat up (queuectl.worker.SeatTimes).
        Returns when to check again (inf: nothing to check)."""
        check = self._seat.full(self._seated(), room, time.monotonic())
        if check is not None:
            return check
        if self._registered:
            await self._unregister()
        if self._listener is not None:
            try:
                await self._listener.leave_seat()
            except Exception as exc:
                log.warning("LISTEN connection lost (%s): polling until it is reopened", first_line(exc))
                await self._drop_listener()
        return math.inf

    async def _register(self) -> bool | None:
        assert self._listener is not None
        try:
            clear = await self._listener.wait_begin()
            self.stats.notifications += await self._listener.drain()
        except Exception as exc:
            log.warning("LISTEN connection lost (%s): polling until it is reopened", first_line(exc))
            await self._drop_listener()
            return None
        self._registered, self._armed = True, clear
        return clear

    async def _unregister(self) -> None:
        assert self._listener is not None
        self._registered = self._armed = False
        try:
            await self._listener.wait_end()
            self.stats.notifications += await self._listener.drain()
        except Exception as exc:
            log.warning("LISTEN connection lost (%s): polling until it is reopened", first_line(exc))
            await self._drop_listener()

    async def _drop_listener(self) -> None:
        self._registered = self._armed = False
        listener, self._listener = self._listener, None
        if listener is None:
            return
        await listener.close()
        self._listener_retry_at = time.monotonic() + self.poll_interval

    # -- handlers --------------------------------------------------------------------------

    async def _runner(self) -> None:
        while True:
            message = await self._work.get()
            if message.id in self._lost:  # its lease is gone: another consumer may be running it
                self._forget([message.id])
                self.stats.lost += 1
                continue
            task = asyncio.current_task()
            assert task is not None
            self._running.add(task)
            error = None
            try:
                result = self.handler(message)
                if inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # whatever the handler raises (SystemExit too) fails this item only
                error = diagnostic_text(exc)
            finally:  # cancelled (a forced stop): the item comes back when its lease expires
                self._running.discard(task)
            if error is not None:
                log.warning("item %d failed (attempt %d of %d): %s", message.id, message.attempts,
                            message.max_attempts, error)
            self._settlements.add(message.id, error)
            self._wake.set()

    # -- outcomes, heartbeats --------------------------------------------------------------

    async def _settle(self) -> None:
        """Record finished items as the blocking worker does (queuectl.worker, "Settling"): one
        ack for the successes, one nack per distinct error, one release for what is given back;
        a refused call's items are sent again alone, then charged, then released, then left."""
        for (step, text, _alone), ids in self._settlements.due(time.monotonic()).items():
            try:
                await self._record(step, ids, text)
            except ConnectionFailed:
                raise
            except Exception as exc:  # refused on a live connection: the items are still held
                if isinstance(exc, StatementCanceled):
                    self.stats.canceled += 1
                if self._settlements.failed(step, ids, exc, self.lease):
                    self._forget(ids)
                    self.stats.unsettled += len(ids)

    async def _record(self, step: str, ids: list[int], text: str | None) -> None:
        """One call: ack (step "outcome", no error text), nack with `text`, or release."""
        if step == "release":
            released = await self.queue.release(ids)
            self.stats.released += released
            self.stats.lost += len(ids) - released
            self._forget(ids)
            await self._announce_released()
        elif text is None:
            acked = await self.queue.ack(ids)
            self._forget(ids)
            self.stats.processed += acked
            self.stats.lost += len(ids) - acked
        else:
            statuses = await self.queue.nack(ids, text)
            self._forget(ids)
            self.stats.failed += len(statuses)
            self.stats.dead += sum(1 for status in statuses.values() if status == "dead")
            self.stats.lost += len(ids) - len(statuses)

    def _forget(self, ids: list[int]) -> None:
        for item_id in ids:
            self._held.pop(item_id, None)
            self._lost.discard(item_id)
        self._settlements.discard(ids)

    async def _heartbeat_if_due(self) -> None:
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
            kept = set(await self.queue.extend_lease(ids, lease=self.lease))
        except ConnectionFailed:
            raise
        except Exception as exc:  # canceled or refused: the leases stand; try again soon
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

    def _log_if_due(self) -> None:
        now = time.monotonic()
        if now < self._next_log:
            return
        self._next_log = now + self.log_interval
        if self._held or self.stats.processed or self.stats.failed:
            log.info("queue %s: %d processed, %d failed so far; holding %d", self.queue.name, self.stats.processed,
                     self.stats.failed, len(self._held))

    # -- stopping --------------------------------------------------------------------------

    def _install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return []
        installed: list[int] = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stop)
            installed.append(signum)
        return installed

    async def _shutdown(self) -> None:
        """Give back what no handler started, wait for running handlers, settle their outcomes."""
        unstarted = []
        while not self._work.empty():
            unstarted.append(self._work.get_nowait().id)
        if self._stopping:
            log.info("stopping: releasing %d unstarted item(s), waiting for %d in handlers", len(unstarted),
                     len(self._held) - len(unstarted))
        for item_id in unstarted:
            self._settlements.add(item_id, None, release=True)
        timeout = self.shutdown_timeout
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        try:
            await self._settle()
            while self._held and not self._forced and time.monotonic() < deadline:
                self._wake.clear()
                if not self._finished_pending():
                    try:
                        await asyncio.wait_for(self._wake.wait(), max(0.0, min(0.5, deadline - time.monotonic())))
                    except TimeoutError:
                        pass
                await self._settle()
                await self._heartbeat_if_due()
                if self._held and not self._running and self._work.empty() and not self._settlements.pending:
                    break  # what is left was lost to another consumer's lease
        except ConnectionFailed as exc:
            log.warning("could not settle every item while stopping (%s)", exc)
        if self._held:
            log.warning("stopped with %d item(s) still held: they come back when their leases expire",
                        len(self._held))
        s = self.stats
        log.info("async worker %s stopped after %.1fs: %d processed, %d failed (%d dead), %d released, %d lost, "
                 "%d unsettled", self.queue.worker, s.seconds, s.processed, s.failed, s.dead, s.released, s.lost,
                 s.unsettled)

    async def _announce_released(self) -> None:
        if self._listener is None:
            return
        try:
            await self._listener.notify()
        except Exception as exc:  # only latency is at stake
            log.warning("could not notify other consumers of released items: %s", first_line(exc))
