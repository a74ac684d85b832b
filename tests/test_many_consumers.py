"""Many consumers on one queue (queuectl.worker, "Many consumers"): one looker at a time
holds the queue's seat, LISTENs and registers; the others poll with their gather window.
Nothing announced is missed while every consumer sleeps, the seat passes on when its holder
is killed, and a lone consumer's latency stays within the gather window."""

from __future__ import annotations

import signal
import time

import pytest
import sqlalchemy as sa

from queuectl.client import Queue
from queuectl.engine import make_engine
from queuectl.worker import GATHER_LONGEST, Worker

from activation_handlers import CREATE_TABLE
from test_notify import waiting_sessions
from test_worker import Recorder, Running, start_worker, wait_until

SEAT_HOLDERS = sa.text(
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
    "WHERE l.locktype = 'advisory' AND l.classid = 1902343283 AND l.objsubid = 2 AND l.granted")


def seat_holders(engine) -> list[str]:
    """The application_name of every session holding a seat (the looker's, 'qcts')."""
    with engine.connect() as conn:
        return list(conn.execute(SEAT_HOLDERS).scalars())


@pytest.mark.slow
def test_an_enqueue_while_32_workers_sleep_is_announced_to_the_one_looker(db_url, engine, orders):
    """32 idle workers: one holds the seat and is the one registered session (a notification
    signals one backend); each enqueue while all sleep is announced to it and taken within a
    second, although every worker polls only every 30 s."""
    handler = Recorder()
    engines = [make_engine(db_url) for _ in range(32)]
    running = [Running(Worker(Queue(e, "orders"), handler, batch=10, poll_interval=30, min_poll_interval=30,
                              handle_signals=False)) for e in engines]
    try:
        wait_until(lambda: all(r.worker.stats.empty_polls >= 2 for r in running), timeout=60,
                   what="every worker's first looks")
        wait_until(lambda: waiting_sessions(engine) == 1 and len(seat_holders(engine)) == 1, timeout=30,
                   what="one looker registered")
        time.sleep(1.0)  # the others' windows grow past a second
        announced = sum(r.worker.stats.notifications for r in running)
        with Queue(engine, "orders") as producer:
            for i in range(3):
                wait_until(lambda: waiting_sessions(engine) == 1, timeout=10, what="the looker asleep again")
                sent = time.monotonic()
                producer.enqueue(f"item {i}")
                wait_until(lambda: handler.texts()[f"item {i}"] == 1, timeout=10, what="the wake-up")
                assert handler.calls[-1][2] - sent < 1.0
        assert sum(r.worker.stats.notifications for r in running) >= announced + 3
        assert len(seat_holders(engine)) == 1
    finally:
        for r in running:
            r.worker.stop()
        stats = [r.wait() for r in running]
        for e in engines:
            e.dispose()
    assert sum(s.processed for s in stats) == 3


@pytest.mark.slow
def test_the_seat_passes_on_when_its_holder_is_killed(db_url, engine, orders, tmp_path):
    """Three `queuectl worker` processes: SIGKILL the looker; its session's seat is freed,
    another worker takes it within its poll interval and registers, and the next enqueue
    is announced to that one and taken at once."""
    seat_passes_on_when_its_holder_is_killed(
        db_url, engine, orders, tmp_path, lambda url, log: start_worker(url, log, "--poll-interval", "2"))


def seat_passes_on_when_its_holder_is_killed(db_url, engine, orders, tmp_path, start) -> None:
    """The run of the seat's hand-over, for any worker: `start(url, log)` starts one worker
    process (poll interval 2 s) on `orders`, its handler recording in the handled table."""
    with engine.begin() as conn:
        conn.execute(sa.text(CREATE_TABLE))
    sep = "&" if "?" in db_url else "?"
    procs = {f"w{i}": start(f"{db_url}{sep}application_name=w{i}", tmp_path / f"w{i}.log") for i in range(3)}
    try:
        wait_until(lambda: len(seat_holders(engine)) == 1 and waiting_sessions(engine) == 1, timeout=60,
                   what="a looker")
        [looker] = seat_holders(engine)
        procs[looker].send_signal(signal.SIGKILL)
        procs[looker].wait(10)
        killed = time.monotonic()
        wait_until(lambda: seat_holders(engine) not in ([], [looker]) and waiting_sessions(engine) == 1,
                   timeout=20, what="another worker taking the seat")
        assert time.monotonic() - killed < 10
        [heir] = seat_holders(engine)
        assert heir != looker
        time.sleep(2.5)  # the third worker's window grows to the poll interval
        sent = time.time()
        orders.enqueue("after the kill")
        with engine.connect() as conn:
            wait_until(lambda: conn.execute(sa.text("SELECT count(*) FROM handled")).scalar_one() == 1,
                       timeout=10, what="the item")
            pid, started = conn.execute(sa.text("SELECT pid, extract(epoch FROM started) FROM handled")).one()
        assert pid == procs[heir].pid  # announced to the new looker...
        assert float(started) - sent < 1.0  # ...and taken at once
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(30)
            except Exception:
                proc.kill()


def test_a_lone_worker_takes_a_trickle_within_the_gather_window(engine, orders):
    """A lone worker that just took a short batch looks again after its gather window (at
    most 50 ms), not after its 30 s poll: items trickling in 20 ms apart wait little; once
    the queue is idle it registers, and the next enqueue is announced."""
    handler = Recorder()
    running = Running(Worker(orders, handler, batch=10, poll_interval=30, min_poll_interval=30,
                             handle_signals=False))
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
            wait_until(lambda: waiting_sessions(engine) == 1, timeout=5, what="the registration once idle")
            notified = running.worker.stats.notifications
            sent["idle"] = time.monotonic()
            producer.enqueue("idle")
            wait_until(lambda: handler.texts()["idle"] == 1, timeout=10, what="the wake-up")
        assert handler.calls[-1][2] - sent["idle"] < 1.0
        assert running.worker.stats.notifications > notified
    finally:
        stats = running.stop()
    assert stats.processed == 41


def test_an_idle_worker_takes_what_arrives_while_the_looker_is_busy(db_url, engine, orders):
    """Nobody registered: the looker is busy with a slow item (no room, so it gives the seat
    up) and the other worker sleeps unregistered. An enqueue then waits at most for the
    other's next look (its window, at most the 1 s poll interval), not for the looker."""
    handler = Recorder(sleep=4.0)
    engines = [make_engine(db_url) for _ in range(2)]
    running = [Running(Worker(Queue(e, "orders"), handler, batch=1, poll_interval=1, handle_signals=False))
               for e in engines]
    try:
        wait_until(lambda: all(r.worker.stats.empty_polls >= 2 for r in running) and waiting_sessions(engine) == 1,
                   timeout=30, what="one looker, one worker asleep")
        time.sleep(1.5)  # the other's window reaches the poll interval
        with Queue(engine, "orders") as producer:
            producer.enqueue("slow 1")
            wait_until(lambda: handler.texts()["slow 1"] == 1, timeout=5, what="the first item")
            time.sleep(0.3)  # its taker (the looker, or the sleeper if its look came first) is busy
            sent = time.monotonic()
            producer.enqueue("slow 2")
            wait_until(lambda: handler.texts()["slow 2"] == 1, timeout=10, what="the second item")
        assert handler.calls[-1][2] - sent < 2.5  # not the looker's 4 s handler
    finally:
        for r in running:
            r.worker.stop()
        stats = [r.wait() for r in running]
        for e in engines:
            e.dispose()
    assert sum(s.processed for s in stats) == 2
