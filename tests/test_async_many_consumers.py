"""Many asyncio consumers on one queue (queuectl.asyncworker, as queuectl.worker's "Many
consumers"): one looker at a time holds the queue's seat, LISTENs and registers; the others
look with their gather window. Nothing announced is missed while every consumer sleeps, the
seat passes on when its holder is killed, a lone consumer's latency stays within the gather
window, and what arrives while the looker is busy waits for another consumer's next look.

Run as a script, this file is an asyncio worker process for the kill test:
    python tests/test_async_many_consumers.py URL POLL_INTERVAL
"""

from __future__ import annotations

import asyncio
import collections
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent


class AsyncRecorder:
    """An async handler: remembers what it was called with, then sleeps `sleep` seconds
    without blocking the event loop."""

    def __init__(self, sleep: float = 0.0) -> None:
        self.calls: list[tuple[str, int, float]] = []
        self.lock = threading.Lock()
        self.sleep = sleep

    async def __call__(self, message) -> None:
        with self.lock:
            self.calls.append((message.text, message.attempts, time.monotonic()))
        if self.sleep:
            await asyncio.sleep(self.sleep)

    def texts(self) -> collections.Counter:
        with self.lock:
            return collections.Counter(text for text, _attempt, _at in self.calls)


class AsyncRunning:
    """AsyncWorkers on one event loop in a thread of the test (signals stay with pytest),
    each on an AsyncQueue of its own."""

    def __init__(self, db_url: str, count: int, handler, **settings) -> None:
        self.workers: list = []
        self.stats: list = []
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(db_url, count, handler, settings), daemon=True)
        self._thread.start()
        assert self._started.wait(60), "the workers did not start"
        if self._error is not None:
            raise self._error

    def _run(self, db_url: str, count: int, handler, settings: dict) -> None:
        asyncio.run(self._main(db_url, count, handler, settings))

    async def _main(self, db_url: str, count: int, handler, settings: dict) -> None:
        from queuectl.asyncworker import AsyncWorker
        from queuectl.client.aio import AsyncQueue

        self.loop = asyncio.get_running_loop()
        queues = []
        try:
            queues = [await AsyncQueue.open(db_url, "orders") for _ in range(count)]
            self.workers = [AsyncWorker(q, handler, handle_signals=False, **settings) for q in queues]
        except BaseException as exc:
            self._error = exc
            self._started.set()
            raise
        self._started.set()
        try:
            self.stats = await asyncio.gather(*(w.run() for w in self.workers))
        finally:
            for q in queues:
                await q.close()

    def stop(self) -> list:
        for worker in self.workers:
            self.loop.call_soon_threadsafe(worker.stop)
        self._thread.join(60)
        assert not self._thread.is_alive(), "the workers did not stop"
        return self.stats


async def _serve(url: str, poll_interval: float) -> None:
    """A worker process: the AsyncWorker running activation_handlers.record until SIGTERM."""
    from activation_handlers import record
    from queuectl.client.aio import AsyncQueue

    queue = await AsyncQueue.open(url, "orders")
    try:
        await queue.consume(record, poll_interval=poll_interval)
    finally:
        await queue.close()


if __name__ == "__main__":
    sys.path.insert(0, str(TESTS_DIR))
    asyncio.run(_serve(sys.argv[1], float(sys.argv[2])))
    sys.exit(0)


import pytest  # noqa: E402

from queuectl.client import Queue  # noqa: E402
from queuectl.worker import GATHER_LONGEST  # noqa: E402

from test_many_consumers import seat_holders, seat_passes_on_when_its_holder_is_killed  # noqa: E402
from test_notify import psycopg_conninfo, waiting_sessions  # noqa: E402
from test_worker import wait_until  # noqa: E402


def start_async_worker(db_url: str, log: Path, poll_interval: float) -> subprocess.Popen:
    """This file as a worker process (an AsyncWorker on `orders`), its stderr in `log`."""
    env = dict(os.environ, QT_HANDLED_DSN=psycopg_conninfo(db_url), QT_HANDLER_SLEEP="0",
               PYTHONPATH=os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), db_url, str(poll_interval)],
                            stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=env)


@pytest.mark.slow
def test_an_enqueue_while_32_async_workers_sleep_is_announced_to_the_one_looker(db_url, engine, orders):
    """32 idle asyncio workers: one holds the seat and is the one registered session (a
    notification signals one backend); each enqueue while all sleep is announced to it and
    taken within a second, although every worker polls only every 30 s."""
    handler = AsyncRecorder()
    running = AsyncRunning(db_url, 32, handler, batch=10, poll_interval=30, min_poll_interval=30)
    stats: list = []
    try:
        wait_until(lambda: all(w.stats.empty_polls >= 2 for w in running.workers), timeout=60,
                   what="every worker's first looks")
        wait_until(lambda: waiting_sessions(engine) == 1 and len(seat_holders(engine)) == 1, timeout=30,
                   what="one looker registered")
        time.sleep(1.0)  # the others' windows grow past a second
        announced = sum(w.stats.notifications for w in running.workers)
        with Queue(engine, "orders") as producer:
            for i in range(3):
                wait_until(lambda: waiting_sessions(engine) == 1, timeout=10, what="the looker asleep again")
                sent = time.monotonic()
                producer.enqueue(f"item {i}")
                wait_until(lambda: handler.texts()[f"item {i}"] == 1, timeout=10, what="the wake-up")
                assert handler.calls[-1][2] - sent < 1.0
        assert sum(w.stats.notifications for w in running.workers) >= announced + 3
        assert len(seat_holders(engine)) == 1
    finally:
        stats = running.stop()
    assert sum(s.processed for s in stats) == 3
    assert seat_holders(engine) == []  # a clean stop gives the seat up with its session


@pytest.mark.slow
def test_the_seat_passes_on_when_its_async_holder_is_killed(db_url, engine, orders, tmp_path):
    """Three asyncio worker processes: SIGKILL the looker; its session's seat is freed,
    another worker takes it within its poll interval and registers, and the next enqueue
    is announced to that one and taken at once."""
    seat_passes_on_when_its_holder_is_killed(
        db_url, engine, orders, tmp_path, lambda url, log: start_async_worker(url, log, 2))


def test_a_lone_async_worker_takes_a_trickle_within_the_gather_window(db_url, engine, orders):
    """A lone asyncio worker that just took a short batch looks again after its gather
    window (at most 50 ms), not after its 30 s poll: items trickling in 20 ms apart wait
    little, with no notification needed; once the queue is idle it registers, and the
    next enqueue is announced."""
    handler = AsyncRecorder()
    running = AsyncRunning(db_url, 1, handler, batch=10, poll_interval=30, min_poll_interval=30)
    [worker] = running.workers
    sent: dict[str, float] = {}
    try:
        wait_until(lambda: waiting_sessions(engine) == 1, what="the idle worker's registration")
        with Queue(engine, "orders") as producer:
            for i in range(40):
                sent[f"trickle {i}"] = time.monotonic()
                producer.enqueue(f"trickle {i}")
                time.sleep(0.02)
            wait_until(lambda: sum(handler.texts().values()) == 40, timeout=10, what="the trickle")
            waits = sorted(at - sent[text] for text, _attempt, at in handler.calls)
            # the gather window bounds a busy worker's next look; the rest is this machine's noise
            assert waits[len(waits) // 2] < GATHER_LONGEST + 0.1 and waits[-1] < 1.0, waits
            # while it works nobody is registered: producers pay no NOTIFY for most items
            assert worker.stats.notifications < 20, worker.stats
            wait_until(lambda: waiting_sessions(engine) == 1, timeout=5, what="the registration once idle")
            notified = worker.stats.notifications
            sent["idle"] = time.monotonic()
            producer.enqueue("idle")
            wait_until(lambda: handler.texts()["idle"] == 1, timeout=10, what="the wake-up")
        assert handler.calls[-1][2] - sent["idle"] < 1.0
        assert worker.stats.notifications > notified
    finally:
        [stats] = running.stop()
    assert stats.processed == 41


def test_an_idle_async_worker_takes_what_arrives_while_the_looker_is_busy(db_url, engine, orders):
    """Nobody registered: the looker is busy with a slow item (no room, so it gives the seat
    up) and the other worker sleeps unregistered. An enqueue then waits at most for the
    other's next look (its window, at most the 1 s poll interval), not for the looker."""
    handler = AsyncRecorder(sleep=4.0)
    running = AsyncRunning(db_url, 2, handler, batch=1, poll_interval=1)
    stats: list = []
    try:
        wait_until(lambda: all(w.stats.empty_polls >= 2 for w in running.workers) and waiting_sessions(engine) == 1
                   and len(seat_holders(engine)) == 1, timeout=30, what="one looker, one worker asleep")
        time.sleep(1.5)  # the other's window reaches the poll interval
        with Queue(engine, "orders") as producer:
            producer.enqueue("slow 1")
            wait_until(lambda: handler.texts()["slow 1"] == 1, timeout=5, what="the first item")
            # Its taker is in its handler, without room. The taker is most often the looker
            # (announced), but the sleeper's own look can come first. Either way the busy one
            # gives its seat up (the other may take it at its next look: every session is named
            # queuectl, so the holder is told apart by the workers' own state).
            [busy] = [w for w in running.workers if w._held]
            wait_until(lambda: busy._listener is None or not busy._listener.seated, timeout=3,
                       what="the busy worker's seat given up")
            assert len(seat_holders(engine)) <= 1
            sent = time.monotonic()
            producer.enqueue("slow 2")
            wait_until(lambda: handler.texts()["slow 2"] == 1, timeout=10, what="the second item")
        assert handler.calls[-1][2] - sent < 2.5  # not the looker's 4 s handler
    finally:
        stats = running.stop()
    assert sum(s.processed for s in stats) == 2
