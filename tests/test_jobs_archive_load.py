"""Archive under load and after a SIGKILL: every id in exactly one place, payload intact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from queuectl.client import Queue
from queuectl.jobs.runner import run_job
from queuectl.jobs.archive import ArchiveConfig

from conftest import worker_processes
from jobs_helpers import job_runs, placement, rows, scalar, wait_until
from jobs_workers import consumer, producer


def start_cli(*args: str, url: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "QUEUECTL_URL"}
    env["QUEUECTL_URL"] = url
    return subprocess.Popen([sys.executable, "-m", "queuectl.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_continuous_archive_under_load_keeps_every_id_in_exactly_one_place(db_url, engine, orders: Queue):
    archiver = start_cli("archive", "orders", "--continuous", "--min-age", "0s", "--delay", "50ms",
                         "--batch", "500", url=db_url)
    ctx = worker_processes()
    stop_producers, stop_consumers = ctx.Event(), ctx.Event()
    sent_q, done_q = ctx.Queue(), ctx.Queue()
    producers = [ctx.Process(target=producer, args=(db_url, "orders", i, stop_producers, sent_q)) for i in range(4)]
    consumers = [ctx.Process(target=consumer, args=(db_url, "orders", stop_consumers, done_q)) for _ in range(4)]
    for p in producers + consumers:
        p.start()
    stalled = None
    try:
        # load runs until the archiver has moved a good share while producers still produce
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM queuectl.orders_history") >= 5000, timeout=60, interval=0.2)
        time.sleep(2)
        archived_during_load = scalar(engine, "SELECT count(*) FROM queuectl.orders_history")
        stop_producers.set()
        sent = [pair for _ in producers for pair in sent_q.get(timeout=60)]
        stop_consumers.set()
        acked = sum(done_q.get(timeout=60) for _ in consumers)
        for p in producers + consumers:
            p.join(timeout=30)
        # the archiver catches up with everything finished, then stops cleanly on SIGTERM
        try:
            wait_until(lambda: scalar(engine, "SELECT count(*) FROM queuectl.orders_meta") == 0, timeout=60,
                       interval=0.2)
        except AssertionError:  # say what was left and what the archiver said (it is stopped below)
            left = [tuple(r) for r in rows(engine, "SELECT slot, status, count(*) FROM queuectl.orders_meta "
                                                   "GROUP BY slot, status ORDER BY slot, status")]
            rot = tuple(rows(engine, "SELECT * FROM queuectl.orders_rot_state()")[0])
            stalled = f"meta not emptied within 60 s: (slot, status, rows) {left}; rot_state {rot}"
            raise
    finally:
        archiver.send_signal(signal.SIGTERM)
        stdout, stderr = archiver.communicate(timeout=30)
        for p in producers + consumers:
            if p.is_alive():
                p.kill()
        if stalled:
            raise AssertionError(f"{stalled}; archiver's stderr: {stderr.decode()[-3000:]}")
    assert archiver.returncode == 0, stderr.decode()
    assert "stop requested" in stdout.decode()
    assert acked == len(sent) > 5000 and archived_during_load > 0
    expected = Counter(sent)
    assert len(expected) == len(sent)                      # ids are unique
    places = placement(engine)
    assert places["live"] + places["history"] == expected  # every id once, with its own payload
    assert not set(places["live"]) & set(places["history"])
    [run] = job_runs(engine)
    assert (run.job, run.outcome, run.rows) == ("archive", "succeeded", len(sent))
    for row in rows(engine, "SELECT payload, headers FROM queuectl.orders_history"):  # headers travelled too
        number, seq = bytes(row.payload).split(b"-")[:2]
        assert row.headers == {"p": int(number[1:]), "n": int(seq)}


@pytest.mark.slow
def test_archive_killed_mid_run_then_rerun_loses_and_duplicates_nothing(db_url, engine, orders: Queue):
    ids = []
    for chunk in range(3):
        ids += orders.enqueue_many([f"item-{chunk}-{i}".encode() for i in range(10_000)])
    for _ in range(3):
        orders.ack(orders.dequeue(10_000))
    before = placement(engine)
    assert sum(before["live"].values()) == 30_000 and not before["history"]
    archiver = start_cli("archive", "orders", "--min-age", "0s", "--batch", "200", "--delay", "0s", url=db_url)
    try:
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM queuectl.orders_history") >= 3000, timeout=60, interval=0.02)
    finally:
        archiver.kill()                                      # SIGKILL, mid-batch or between batches
        archiver.wait(timeout=10)
    mid = placement(engine)
    moved = sum(mid["history"].values())
    assert 3000 <= moved < 30_000 and moved % 200 == 0      # whole batches only
    # The generation's finished rows are copied in batches, then the generation is emptied
    # by one TRUNCATE (reliable_0012): killed in between, a copied row is in both places,
    # the same in each; nothing is lost and history holds each id once.
    assert not mid["history"] - before["live"] and max(mid["history"].values()) == 1
    assert not before["live"] - (mid["live"] | mid["history"])
    [killed] = job_runs(engine)
    assert killed.outcome == "running"                      # its runner died before recording the end
    record = run_job(engine, "archive", "orders", ArchiveConfig(min_age=0, delay=0))
    assert record.outcome == "succeeded" and record.rows == 30_000 - moved
    after = placement(engine)
    assert not after["live"] and after["history"] == before["live"]
    assert [r.outcome for r in job_runs(engine)] == ["abandoned", "succeeded"]
