"""The consumer loop: wake-ups, fallback polling, retries, heartbeats, graceful stops.

Loops under test run in threads of this process where only the loop's own behaviour is in
question, and as real `queuectl worker` processes (signalled with SIGTERM/SIGINT) where
processes and signals are. Outcomes are judged by the handlers' side effects: a Python
list in-process, table `handled` across processes, compared as exact multisets.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from queuectl.catalog import QueueSettings
from queuectl.client import Queue
from queuectl.install import downgrade_queue, head_of, install_queue
from queuectl.worker import PollBackoff, Worker, WorkerStats

from activation_handlers import CREATE_TABLE
from conftest import run_cli
from test_notify import psycopg_conninfo, waiting_sessions

TESTS_DIR = Path(__file__).parent


def wait_until(condition, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


class Recorder:
    """An in-process handler: remembers what it was called with (its side effect)."""

    def __init__(self, fail=lambda text, attempt: None, sleep: float = 0.0) -> None:
        self.calls: list[tuple[str, int, float]] = []
        self.lock = threading.Lock()
        self.fail = fail
        self.sleep = sleep

    def __call__(self, message) -> None:
        with self.lock:
            self.calls.append((message.text, message.attempts, time.monotonic()))
        if self.sleep:
            time.sleep(self.sleep)
        error = self.fail(message.text, message.attempts)
        if error:
            raise error

    def texts(self) -> collections.Counter:
        with self.lock:
            return collections.Counter(text for text, _attempt, _at in self.calls)


class Running:
    """A Worker running in a thread of the test (signals stay with pytest)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.stats: WorkerStats | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.stats = self.worker.run()
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> WorkerStats:
        self.worker.stop()
        return self.wait()

    def wait(self) -> WorkerStats:
        """Join a worker that was already told to stop (a second stop() would force it)."""
        self.thread.join(30)
        assert not self.thread.is_alive(), "worker did not stop"
        if self.error:
            raise self.error
        assert self.stats is not None
        return self.stats


def statuses(engine, queue: str = "orders") -> dict[str, tuple[int, int, str | None]]:
    """payload -> (status, attempts, last_error) for every item of the queue."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            f"SELECT convert_from(d.payload, 'UTF8') AS item, m.status, m.attempts, m.last_error "
            f"FROM queuectl.{queue}_meta m JOIN queuectl.{queue}_data d USING (id)"
        )).all()
    return {r.item: (r.status, r.attempts, r.last_error) for r in rows}


# -- the poll back-off ---------------------------------------------------------------------


def test_poll_backoff_doubles_up_to_its_bound_and_resets_on_work():
    backoff = PollBackoff(shortest=0.05, longest=1.0, jitter=0.0)
    assert [backoff.next_wait() for _ in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    backoff.reset()
    assert backoff.next_wait() == 0.05
    jittered = PollBackoff(shortest=1.0, longest=1.0, jitter=0.1)
    waits = [jittered.next_wait() for _ in range(200)]
    assert all(0.9 <= w <= 1.0 for w in waits) and len(set(waits)) > 1


# -- waking --------------------------------------------------------------------------------


def test_idle_worker_wakes_on_the_notification_and_drains_in_batches(engine, orders):
    handler = Recorder()
    # polls 30 s apart: anything handled sooner was woken by a notification
    running = Running(Worker(orders, handler, batch=10, poll_interval=30, min_poll_interval=30))
    try:
        wait_until(lambda: running.worker.stats.empty_polls >= 1, what="the first empty look")
        with Queue(engine, "orders") as producer:
            producer.enqueue("first")
            wait_until(lambda: handler.texts() == {"first": 1}, timeout=10, what="the wake-up")
            assert running.worker.stats.notifications >= 1
            dequeues = running.worker.stats.dequeues
            producer.enqueue_many([f"item {i}" for i in range(45)])
            wait_until(lambda: sum(handler.texts().values()) == 46, timeout=10, what="the drain")
    finally:
        stats = running.stop()
    assert handler.texts() == collections.Counter(["first"] + [f"item {i}" for i in range(45)])
    assert stats.dequeues - dequeues >= 5  # batches of at most 10
    assert stats.processed == 46 and stats.failed == 0
    assert {s for s, _a, _e in statuses(engine).values()} == {2}


def test_busy_worker_gives_up_its_registration_and_an_idle_one_holds_it(engine, orders):
    """reliable_0006: producers notify only registered consumers, so a busy worker must not
    stay registered (its producers would pay a serialised commit each) and an idle one must."""
    handler = Recorder(sleep=1.0)
    running = Running(Worker(orders, handler, batch=1, poll_interval=30, min_poll_interval=30))
    try:
        wait_until(lambda: waiting_sessions(engine) == 1, what="the idle worker's registration")
        with Queue(engine, "orders") as producer:
            producer.enqueue_many(["slow 1", "slow 2"])
            wait_until(lambda: handler.texts()["slow 1"] == 1, timeout=10, what="the wake-up")
            # the loop hands the claim to the handler's thread, then gives its registration up
            wait_until(lambda: waiting_sessions(engine) == 0, timeout=5, what="the busy worker's unregistration")
            assert running.worker.stats.processed < 2  # given up while busy, not after the drain
            wait_until(lambda: sum(handler.texts().values()) == 2, timeout=10)
        wait_until(lambda: waiting_sessions(engine) == 1, what="the registration after the drain")
    finally:
        stats = running.stop()
    assert stats.processed == 2
    # stopped: its session is gone (a backend leaves pg_stat_activity a moment after its client)
    wait_until(lambda: waiting_sessions(engine) == 0, what="the stopped worker's session to end")


@pytest.mark.slow
def test_a_looker_outrun_to_a_notification_gives_its_registration_up_and_takes_it_back_soon(engine, orders):
    """Many consumers: a worker whose look after a notification finds nothing gives its
    registration up (so producers stop announcing to it). The looker (here the lone worker,
    holding the queue's seat) looks again after the gather window's 50 ms, not after its
    back-off poll, and registers again: it is the one consumer producers announce items to."""
    handler = Recorder()
    running = Running(Worker(orders, handler, batch=10, poll_interval=3, min_poll_interval=1.5))
    try:
        # registered, and asleep after its one more look (what comes with the registration's reply is drained)
        wait_until(lambda: waiting_sessions(engine) == 1 and running.worker.stats.empty_polls >= 2,
                   what="the idle worker's sleep")
        notified, looks = running.worker.stats.notifications, running.worker.stats.empty_polls
        with engine.connect() as conn:  # a notification with nothing behind it: another consumer was faster
            conn.execute(sa.text("SELECT pg_notify(:channel, '')"), {"channel": orders.names.channel})
            conn.commit()
        outrun = time.monotonic()
        wait_until(lambda: running.worker.stats.empty_polls >= looks + 3, timeout=5.0,
                   what="the outrun look, the look 50 ms later and the one after registering again")
        assert time.monotonic() - outrun < 1.0  # not the back-off poll's 1.35-1.65 s
        assert running.worker.stats.notifications == notified + 1
        wait_until(lambda: waiting_sessions(engine) == 1, timeout=5.0, what="the registration taken back")
        with Queue(engine, "orders") as producer:
            sent = time.monotonic()
            producer.enqueue("announced")
            wait_until(lambda: handler.texts() == {"announced": 1}, timeout=10, what="the wake-up")
        assert handler.calls[0][2] - sent < 1.0  # announced, not found by the 1.5 s poll
        assert running.worker.stats.notifications >= notified + 2
    finally:
        stats = running.stop()
    assert stats.processed == 1 and stats.failed == 0


def test_idle_worker_finds_an_enqueue_that_was_open_when_it_registered(engine, orders):
    """An enqueue whose trigger ran before the worker registered does not notify; the
    worker sees it was open and looks again soon (polls are 30 s apart here)."""
    handler = Recorder()
    with engine.connect() as producer:
        producer.execute(sa.text("SELECT queuectl.orders_enqueue(CAST(:p AS bytea))"), {"p": b"open"})
        running = Running(Worker(orders, handler, poll_interval=30, min_poll_interval=30))
        try:
            wait_until(lambda: running.worker.stats.empty_polls >= 2, what="the worker's empty looks")
            time.sleep(0.5)
            committed = time.monotonic()
            producer.commit()
            wait_until(lambda: handler.texts() == {"open": 1}, timeout=10, what="the open enqueue")
            took = handler.calls[0][2] - committed
            assert took < 5, took
            # now registered with nothing in flight: the next enqueue is announced
            wait_until(lambda: waiting_sessions(engine) == 1, what="the registration")
            notifications = running.worker.stats.notifications
            with Queue(engine, "orders") as queue:
                queue.enqueue("announced")
            wait_until(lambda: handler.texts()["announced"] == 1, timeout=10, what="the wake-up")
            assert running.worker.stats.notifications > notifications
        finally:
            stats = running.stop()
    assert stats.processed == 2


def test_notifications_dropped_mid_run_every_item_is_still_processed(engine, orders):
    handler = Recorder()
    running = Running(Worker(orders, handler, concurrency=2, batch=5, poll_interval=0.3))
    expected: list[str] = []
    try:
        # registered first (LISTEN, nothing in flight): otherwise a worker slow to start finds the
        # first items by its poll and none of them is announced
        wait_until(lambda: waiting_sessions(engine) == 1, what="the registration")
        with Queue(engine, "orders") as producer:
            for i in range(20):
                expected.append(producer_item := f"before {i}")
                producer.enqueue(producer_item)
            wait_until(lambda: sum(handler.texts().values()) == 20, what="items announced by notifications")
            assert running.worker.stats.notifications >= 1
            # drop the notification while the worker runs (the per-queue downgrade)
            assert downgrade_queue(engine, "orders", "reliable_0001") == (head_of("reliable"), "reliable_0001")
            notifications = running.worker.stats.notifications
            for i in range(30):
                expected.append(producer_item := f"after {i}")
                producer.enqueue(producer_item)
                time.sleep(0.01)
            producer.enqueue_many(batch := [f"after many {i}" for i in range(25)])
            expected += batch
            wait_until(lambda: sum(handler.texts().values()) == 75, what="items found by the fallback poll")
    finally:
        stats = running.stop()
    assert handler.texts() == collections.Counter(expected)
    assert stats.notifications == notifications  # nothing announced them: polling found them
    assert stats.processed == 75


def test_listener_connection_killed_mid_run_polling_covers_and_listening_resumes(engine, orders):
    handler = Recorder()
    running = Running(Worker(orders, handler, poll_interval=0.3))
    # the listener's last statement: its LISTEN, or (reliable_0006) its registration calls
    listening = sa.text("SELECT pid FROM pg_stat_activity WHERE (query LIKE '%LISTEN \"queuectl.orders\"%' "
                        "OR query LIKE '%orders_wait_%') "
                        "AND datname = current_database() AND pid <> pg_backend_pid()")
    try:
        # autocommit: pg_stat_activity is read once per transaction
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            wait_until(lambda: conn.execute(listening).first() is not None, what="the LISTEN session")
            [listener_pid] = conn.execute(listening).scalars().all()
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": listener_pid})
        with Queue(engine, "orders") as producer:
            for i in range(20):
                producer.enqueue(f"item {i}")
                time.sleep(0.02)
            wait_until(lambda: sum(handler.texts().values()) == 20, what="items while the listener is down")
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:  # a new LISTEN session
                wait_until(lambda: [p for p in conn.execute(listening).scalars() if p != listener_pid],
                           what="the LISTEN session to be reopened")
            # it LISTENs as the looker just before it registers: the enqueue is to find it registered
            wait_until(lambda: waiting_sessions(engine) == 1, what="the reopened session's registration")
            notifications = running.worker.stats.notifications
            producer.enqueue("after reopening")
            wait_until(lambda: handler.texts()["after reopening"] == 1)
            wait_until(lambda: running.worker.stats.notifications > notifications, what="notifications to resume")
    finally:
        stats = running.stop()
    assert handler.texts() == collections.Counter([f"item {i}" for i in range(20)] + ["after reopening"])
    assert stats.processed == 21


def test_worker_with_notifications_off_polls_every_item(engine, orders):
    handler = Recorder()
    running = Running(Worker(orders, handler, batch=3, notify=False, poll_interval=0.2))
    expected = [f"item {i}" for i in range(40)]
    try:
        # its first look finds the queue empty (a slow start could otherwise find every item there)
        wait_until(lambda: getattr(getattr(running.worker, "stats", None), "empty_polls", 0) >= 1)
        with Queue(engine, "orders") as producer:
            for text in expected:
                producer.enqueue(text)
        wait_until(lambda: sum(handler.texts().values()) == 40)
    finally:
        stats = running.stop()
    assert handler.texts() == collections.Counter(expected)
    assert stats.notifications == 0 and stats.empty_polls >= 1


# -- failures and retries ------------------------------------------------------------------


@pytest.mark.slow
def test_raising_handler_is_nacked_with_its_error_and_retried_until_dead(engine):
    install_queue(engine, "orders", settings=QueueSettings(max_attempts=3, backoff_base_seconds=1))

    def fail(text, attempt):
        if text == "poison":
            return ValueError(f"cannot parse poison (attempt {attempt})")
        if text == "flaky" and attempt == 1:
            return TimeoutError("downstream timeout")
        return None

    handler = Recorder(fail)
    with Queue(engine, "orders") as queue:
        queue.enqueue_many(["poison", "flaky", "fine"])
        running = Running(Worker(queue, handler, concurrency=2, batch=5, poll_interval=0.2))
        try:
            wait_until(lambda: handler.texts()["poison"] == 3 and handler.texts()["flaky"] == 2, what="the retries")
            wait_until(lambda: statuses(engine)["poison"][0] == 3, what="poison to go DEAD")
        finally:
            stats = running.stop()
    assert handler.texts() == {"poison": 3, "flaky": 2, "fine": 1}  # as the policy allows, no more
    final = statuses(engine)
    assert final["poison"] == (3, 3, "ValueError: cannot parse poison (attempt 3)")
    assert final["flaky"] == (2, 2, "TimeoutError: downstream timeout")
    assert final["fine"] == (2, 1, None)
    # the retry waited for the queue's backoff (1 s after the first failure)
    calls = {(text, attempt): at for text, attempt, at in handler.calls}
    assert calls[("flaky", 2)] - calls[("flaky", 1)] >= 0.9
    assert calls[("poison", 3)] - calls[("poison", 2)] >= 1.9  # 2 s before the third attempt
    assert (stats.processed, stats.failed, stats.dead) == (2, 4, 1)


def test_queue_consume_in_burst_mode_drains_and_returns_its_counts(orders):
    handler = Recorder(lambda text, attempt: RuntimeError("no") if text == "item 3" else None)
    orders.enqueue_many([f"item {i}" for i in range(25)])
    previous = signal.getsignal(signal.SIGTERM)
    stats = orders.consume(handler, batch=10, burst=True, notify=True)  # this test's main thread
    assert signal.getsignal(signal.SIGTERM) is previous  # the worker's signal handlers are gone again
    assert handler.texts() == collections.Counter(f"item {i}" for i in range(25))
    assert (stats.processed, stats.failed) == (24, 1)
    assert orders.counts()["scheduled"] == 1  # the failed one waits for its retry


def test_handler_raising_system_exit_fails_its_item_only_and_the_worker_goes_on(engine, orders):
    handler = Recorder(lambda text, attempt: SystemExit("asked to quit") if text == "quit" else None)
    orders.enqueue("quit")
    running = Running(Worker(orders, handler, poll_interval=0.2))
    try:
        wait_until(lambda: handler.texts()["quit"] == 1, what="the quitting handler")
        orders.enqueue("after")
        wait_until(lambda: handler.texts()["after"] == 1, what="the next item")
        assert running.thread.is_alive()
    finally:
        stats = running.stop()
    assert (stats.processed, stats.failed) == (1, 1)
    assert statuses(engine)["quit"] == (0, 1, "SystemExit: asked to quit")


# -- stopping ------------------------------------------------------------------------------


def test_stop_gives_back_unstarted_items_and_finishes_the_running_one(engine, orders):
    release_first = threading.Event()
    started = threading.Event()

    def handler(message):
        started.set()
        assert release_first.wait(20)

    orders.enqueue_many([f"item {i}" for i in range(10)])
    running = Running(Worker(orders, handler, concurrency=1, batch=10, poll_interval=0.2))
    assert started.wait(20)
    running.worker.stop()
    wait_until(lambda: running.worker.stats.released == 9, what="the unstarted items to be released")
    release_first.set()
    stats = running.wait()  # stop() again would be the second signal: a forced stop
    assert (stats.processed, stats.released) == (1, 9)
    final = statuses(engine)
    assert sorted(final.values()) == [(0, 0, None)] * 9 + [(2, 1, None)]  # released: READY, no attempt used


# -- real processes ------------------------------------------------------------------------


def start_worker(db_url: str, log: Path, *args: str, sleep: float = 0.0, handler: str = "record",
                 env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    """`queuectl worker orders` running activation_handlers.<handler>, its stderr in `log`."""
    env = dict(os.environ, QUEUECTL_URL=db_url, QT_HANDLED_DSN=psycopg_conninfo(db_url),
               QT_HANDLER_SLEEP=str(sleep), PYTHONPATH=os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
               **(env_extra or {}))
    return subprocess.Popen(
        [sys.executable, "-m", "queuectl.cli", "worker", "orders", "--handler", f"activation_handlers:{handler}",
         "--json", "--log-interval", "1", *args],
        stdout=subprocess.PIPE, stderr=log.open("wb"), env=env,
    )


def finished(proc: subprocess.Popen, log: Path, timeout: float = 60) -> dict:
    """The final counts of a worker that exits by itself (0) within `timeout`; one that does
    not is killed, so a hanging worker fails its test instead of hanging the suite."""
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"worker still running after {timeout}s:\n{log.read_text()}") from None
    assert proc.returncode == 0, log.read_text()
    return json.loads(stdout)


def handled(engine) -> collections.Counter:
    with engine.connect() as conn:
        return collections.Counter(conn.execute(sa.text("SELECT item FROM handled")).scalars())


@pytest.mark.slow
def test_handler_slower_than_the_lease_keeps_its_items_through_heartbeats(db_url, engine, orders, tmp_path):
    with engine.begin() as conn:
        conn.execute(sa.text(CREATE_TABLE))
    items = [f"slow {i}" for i in range(8)]
    orders.enqueue_many(items)
    # two workers, 2.5 s per item against a 1 s lease: only heartbeats keep the items
    workers = [start_worker(db_url, tmp_path / f"w{i}.log", "--lease", "1", "--concurrency", "2", "--batch", "2",
                            "--burst", "--poll-interval", "0.2", sleep=2.5) for i in range(2)]
    results = [finished(w, tmp_path / f"w{i}.log") for i, w in enumerate(workers)]
    assert handled(engine) == collections.Counter(items)  # each exactly once
    assert {v for v in statuses(engine).values()} == {(2, 1, None)}  # done on the first attempt
    assert sum(r["processed"] for r in results) == 8
    assert sum(r["lost"] for r in results) == 0
    assert all(r["heartbeats"] >= 3 for r in results if r["processed"])


def test_without_heartbeats_a_handler_slower_than_the_lease_runs_twice(engine, orders):
    """The control for the test above: the same race, heartbeats off, is caught."""
    handler = Recorder(sleep=2.5)
    orders.enqueue_many(["a", "b", "c"])
    workers = [Running(Worker(Queue(engine, "orders"), handler, concurrency=2, batch=1, lease=1,
                              poll_interval=0.2, heartbeat_fraction=None)) for _ in range(2)]
    wait_until(lambda: sum(handler.texts().values()) > 3, what="a second run of an expired item")
    results = [running.stop() for running in workers]  # each finishes what it runs, then settles
    assert max(handler.texts().values()) >= 2
    assert sum(r.lost for r in results) >= 1  # the first runner's ack found its lease gone
    for running in workers:
        running.worker.queue.close()


def test_sigterm_mid_run_loses_nothing_and_runs_nothing_twice(db_url, engine, orders, tmp_path):
    with engine.begin() as conn:
        conn.execute(sa.text(CREATE_TABLE))
    logs = [tmp_path / "threads.log", tmp_path / "processes.log", tmp_path / "finisher.log"]
    threads = start_worker(db_url, logs[0], "--concurrency", "3", "--batch", "5", "--lease", "5", sleep=0.02)
    procs = start_worker(db_url, logs[1], "--concurrency", "2", "--batch", "4", "--lease", "5", "--processes", sleep=0.02)
    for log in logs[:2]:  # signal handlers are in place once the worker says where it listens
        wait_until(lambda: "LISTEN on queuectl.orders" in log.read_text(), what=f"{log.name} to start")
    expected = []
    for round_ in range(30):  # a stream: 30 transactions of 10 items, 50 ms apart
        batch = [f"r{round_} i{i}" for i in range(10)]
        orders.enqueue_many(batch)
        expected += batch
        if round_ == 10:
            threads.send_signal(signal.SIGTERM)
        if round_ == 20:
            procs.send_signal(signal.SIGINT)
        time.sleep(0.05)
    stopped = [finished(threads, logs[0]), finished(procs, logs[1])]
    assert all(r["processed"] > 0 for r in stopped)
    assert sum(handled(engine).values()) < len(expected)  # the stops left work behind
    finisher = finished(start_worker(db_url, logs[2], "--burst", "--batch", "20", "--concurrency", "4"), logs[2])
    assert finisher["processed"] > 0
    assert handled(engine) == collections.Counter(expected)  # every item, each exactly once
    assert {status for status, _a, _e in statuses(engine).values()} == {2}
    assert sum(r["processed"] for r in stopped + [finisher]) == len(expected)
    assert sum(r["lost"] for r in stopped + [finisher]) == 0


# -- the command line ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nocolon", "expected module:function"),
        ("no_such_module_xyz:run", "no module named 'no_such_module_xyz'"),
        ("json:no_such_function", "json has no attribute 'no_such_function'"),
        ("json:__doc__", "__doc__ is a str, not a function"),
        (":run", "expected module:function"),
    ],
)
def test_bad_handler_spec_is_one_line_exit_2(spec, message, db_url):
    result = run_cli("worker", "orders", "--handler", spec, url=db_url)
    assert result.returncode == 2
    lines = [ln for ln in result.stderr.decode().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], lines
