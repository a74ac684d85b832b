"""A worker whose handlers or settling calls misbehave: an ack or nack the server keeps
refusing, a handler error text the database cannot store, a handler that kills its own
process or raises SystemExit / KeyboardInterrupt.

Failures are injected for real: a trigger on the queue's meta table refuses chosen updates
(a server error on a live connection, as a permission or constraint error would be), and
handlers kill their processes with SIGKILL or os._exit. Outcomes are judged by the
handlers' side effects (table `handled`) and the queue's rows.
"""

from __future__ import annotations

import collections
import logging
import signal
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from queuectl.catalog import QueueSettings
from queuectl.client import Queue
from queuectl.install import install_queue
from queuectl.worker import Worker

from activation_handlers import CREATE_TABLE
from test_worker import Recorder, Running, finished, handled, start_worker, statuses, wait_until

# Refuses, for items titled so: their ack ('unackable'), or any nack that records an error
# ('unnackable'; a release records none, and the dequeue's own "lease expired" verdict is let through).
# A nack records its error in place on the last attempt (an UPDATE to DEAD) and otherwise
# READY in the current generation: in place when the row is there (reliable_0013: an UPDATE
# from PROCESSING), else by moving it (DELETE + INSERT): all are refused.
REFUSE_SETTLING = """
CREATE FUNCTION refuse_settling() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.title = 'unackable' AND NEW.status = 2 THEN
        RAISE EXCEPTION 'acks of item % are refused here', NEW.id;
    END IF;
    IF NEW.title = 'unnackable' AND NEW.status IN (0, 3) AND NEW.last_error IS NOT NULL
       AND NEW.last_error NOT LIKE 'lease expired on its last attempt%' THEN
        IF TG_OP = 'INSERT' THEN
            RAISE EXCEPTION 'nacks of item % are refused here', NEW.id;
        ELSIF OLD.status = 1 THEN
            RAISE EXCEPTION 'nacks of item % are refused here', NEW.id;
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_settling BEFORE INSERT OR UPDATE ON queuectl.orders_meta
    FOR EACH ROW EXECUTE FUNCTION refuse_settling();
"""


def install(engine, **settings) -> None:
    install_queue(engine, "orders", settings=QueueSettings(**settings))
    with engine.begin() as conn:
        conn.execute(sa.text(CREATE_TABLE))
        conn.execute(sa.text(REFUSE_SETTLING))


def lines_about(text: str, item_id: int, cause: str) -> list[str]:
    return [line for line in text.splitlines() if str(item_id) in line and cause in line]


# -- an ack or nack the server keeps refusing ------------------------------------------------


def test_an_ack_the_server_keeps_refusing_is_logged_and_charged_until_dead_and_its_batch_is_acked(engine, caplog):
    install(engine, max_attempts=2, backoff_base_seconds=0)
    caplog.set_level(logging.INFO, logger="queuectl.worker")
    handler = Recorder()
    with Queue(engine, "orders") as queue:
        good = [f"item {i}" for i in range(9)]
        queue.enqueue_many(good[:4])
        bad = queue.enqueue("unackable", title="unackable")  # acked in one call with its neighbours
        queue.enqueue_many(good[4:])
        running = Running(Worker(queue, handler, concurrency=2, batch=10, lease=5, poll_interval=0.2))
        try:
            wait_until(lambda: statuses(engine)["unackable"][0] == 3, timeout=30, what="the unackable item to go DEAD")
            wait_until(lambda: sum(handler.texts().values()) == 11, what="every item to be handled")
        finally:
            stats = running.stop()
    assert handler.texts() == collections.Counter(good + ["unackable"] * 2)  # its max attempts, no more
    final = statuses(engine)
    assert all(final[text] == (2, 1, None) for text in good)  # acked once, never charged for the bad ack
    status, attempts, error = final["unackable"]
    assert (status, attempts) == (3, 2)
    assert error.startswith("the handler succeeded but its ack failed") and "\n" not in error
    refused = lines_about(caplog.text, bad, f"acks of item {bad} are refused here")
    assert len(refused) >= 6  # every refused try is logged, each on one line
    assert (stats.processed, stats.dead) == (9, 1)


def test_a_nack_the_server_keeps_refusing_ends_a_burst_worker_with_the_item_released_once(db_url, engine, tmp_path):
    install(engine, max_attempts=3, backoff_base_seconds=0)
    with Queue(engine, "orders") as queue:
        bad = queue.enqueue("poison", title="unnackable")
        queue.enqueue_many(good := [f"item {i}" for i in range(5)])
    log = tmp_path / "worker.log"
    worker = start_worker(db_url, log, "--burst", "--lease", "30", "--poll-interval", "0.2",
                          handler="record_unless_poison", env_extra={"QT_POISON": "raise"})
    counts = finished(worker, log, timeout=60)
    assert handled(engine) == collections.Counter(good)
    # released once (its attempt given back), then left to its lease by this worker: the
    # attempt stays charged, so such an item dead-letters after its max attempts
    assert statuses(engine)["poison"] == (1, 1, None)
    assert (counts["processed"], counts["released"], counts["unsettled"]) == (5, 1, 1)
    text = log.read_text()
    assert len(lines_about(text, bad, f"nacks of item {bad} are refused here")) >= 6
    assert any(str(bad) in line and "its lease" in line for line in text.splitlines())
    assert "Traceback" not in text


def test_the_first_sigterm_stops_a_worker_whose_nack_keeps_failing(db_url, engine, tmp_path):
    install(engine, max_attempts=3, backoff_base_seconds=0)
    with Queue(engine, "orders") as queue:
        bad = queue.enqueue("poison", title="unnackable")
    log = tmp_path / "worker.log"
    worker = start_worker(db_url, log, "--lease", "30", "--poll-interval", "0.2",
                          handler="record_unless_poison", env_extra={"QT_POISON": "raise"})
    try:
        wait_until(lambda: "cannot handle poison" in log.read_text(), what="the handler's failure")
    except AssertionError:
        worker.kill()
        raise
    signalled = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    counts = finished(worker, log, timeout=30)
    assert time.monotonic() - signalled < 15
    assert counts["released"] == 1  # given back, its attempt restored
    assert statuses(engine)["poison"] == (0, 0, None)
    assert lines_about(log.read_text(), bad, f"nacks of item {bad} are refused here")


def test_a_handler_error_with_a_nul_byte_does_not_hang_a_burst_worker(db_url, engine, tmp_path):
    install(engine, max_attempts=1)
    with Queue(engine, "orders") as queue:
        queue.enqueue("poison")
        queue.enqueue_many(good := [f"item {i}" for i in range(5)])
    log = tmp_path / "worker.log"
    worker = start_worker(db_url, log, "--burst", "--poll-interval", "0.2",
                          handler="record_unless_poison", env_extra={"QT_POISON": "nul"})
    counts = finished(worker, log, timeout=60)
    assert handled(engine) == collections.Counter(good)
    status, attempts, error = statuses(engine)["poison"]
    assert (status, attempts) == (3, 1) and error  # dead-lettered with a storable reason
    assert (counts["processed"], counts["dead"]) == (5, 1)


# -- handlers that kill their process or ask to exit -----------------------------------------


@pytest.mark.parametrize("mode, poison, reason", [
    ("processes", "sigkill", "HandlerProcessDied: handler process died (killed by signal 9"),
    ("processes", "exit", "HandlerProcessDied: handler process died (exit code 3)"),
    ("processes", "system_exit", "SystemExit: poison asks to exit"),
    ("threads", "system_exit", "SystemExit: poison asks to exit"),
    ("threads", "keyboard_interrupt", "KeyboardInterrupt: poison"),
])
def test_a_handler_that_kills_its_process_or_exits_charges_only_its_own_item(db_url, engine, tmp_path, mode, poison, reason):
    install(engine, max_attempts=3, backoff_base_seconds=0)
    good = [f"item {i}" for i in range(30)]
    with Queue(engine, "orders") as queue:
        queue.enqueue_many(good[:10])
        # first in line whenever it is ready, so each of its attempts runs beside good items
        queue.enqueue("poison", priority=-1)
        queue.enqueue_many(good[10:])
    log = tmp_path / "worker.log"
    worker = start_worker(db_url, log, "--burst", "--concurrency", "3", "--lease", "30", "--poll-interval", "0.2",
                          *(["--processes"] if mode == "processes" else []),
                          sleep=0.2, handler="record_unless_poison", env_extra={"QT_POISON": poison})
    counts = finished(worker, log, timeout=120)
    assert handled(engine) == collections.Counter(good)  # each exactly once
    final = statuses(engine)
    assert all(final[text] == (2, 1, None) for text in good)  # none charged for the poison's failure
    status, attempts, error = final["poison"]
    assert (status, attempts) == (3, 3)
    assert error.startswith(reason), error
    assert (counts["processed"], counts["failed"], counts["dead"]) == (30, 3, 1)


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        found |= {int(child) for child in task.read_text().split()}
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_a_worker_killed_with_sigkill_takes_its_handler_processes_with_it(db_url, engine, orders, tmp_path):
    """A handler process outlives nothing: with its worker gone nobody can record its item's
    outcome (the item comes back when its lease expires), so it must not keep working."""
    with engine.begin() as conn:
        conn.execute(sa.text(CREATE_TABLE))
    orders.enqueue_many(["long 1", "long 2"])
    worker = start_worker(db_url, tmp_path / "w.log", "--processes", "--concurrency", "2", sleep=120)
    handlers: set[int] = set()

    def handlers_started() -> bool:
        handlers.update(c for c in _children(worker.pid)
                        if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes())
        return len(handlers) == 2

    wait_until(handlers_started, timeout=60, what="two handler processes")
    worker.kill()
    worker.wait()
    wait_until(lambda: not any(_alive(pid) for pid in handlers), timeout=15, what="the handler processes to end")
    assert not handled(engine)


@pytest.mark.slow
def test_the_asyncio_worker_settles_a_refused_ack_by_the_same_rules(db_url, engine, caplog):
    """One Settlements for both workers: the asyncio worker's refused ack is sent again alone,
    then charged with a fixed reason, until the item is DEAD; its neighbours are acked once."""
    import asyncio

    from queuectl.asyncworker import AsyncWorker
    from queuectl.client.aio import open_async_queue

    install(engine, max_attempts=2, backoff_base_seconds=0)
    caplog.set_level(logging.INFO, logger="queuectl.worker")
    seen: collections.Counter[str] = collections.Counter()

    async def handler(message) -> None:
        seen[message.text] += 1

    async def run():
        queue = await open_async_queue(db_url, "orders")
        good = [f"item {i}" for i in range(5)]
        await queue.enqueue_many(good[:2])
        bad = await queue.enqueue("unackable", title="unackable")
        await queue.enqueue_many(good[2:])
        worker = AsyncWorker(queue, handler, concurrency=2, batch=10, lease=5, poll_interval=0.2, handle_signals=False)
        task = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 30
        while statuses(engine)["unackable"][0] != 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        worker.stop()
        stats = await task
        await queue.close()
        return good, bad, stats

    good, bad, stats = asyncio.run(run())
    assert seen == collections.Counter(good + ["unackable"] * 2)  # its max attempts, no more
    final = statuses(engine)
    assert all(final[text] == (2, 1, None) for text in good)  # acked once, never charged for the bad ack
    status, attempts, error = final["unackable"]
    assert (status, attempts) == (3, 2) and error.startswith("the handler succeeded but its ack failed")
    assert len(lines_about(caplog.text, bad, f"acks of item {bad} are refused here")) >= 6
    assert (stats.processed, stats.dead) == (5, 1)
