"""The scheduled repair_ring job: a ring's recovery path (ring_repair) once a minute, so a
message a killed popper stranded waits about grace + a minute, not for someone to run
`queuectl repair-ring`."""

from __future__ import annotations

import multiprocessing as mp

import pytest

import ring_workers
from queuectl.client import RingQueue
from queuectl.errors import UsageError
from queuectl.install import install_queue
from queuectl.jobs import ringrepair
from queuectl.jobs.registry import JOBS
from queuectl.jobs.runner import run_job
from queuectl.jobs.scheduler import load_config, plan
from queuectl.kindspec import RingSettings


def test_every_ring_is_planned_for_repair_every_minute_and_no_other_kind(engine):
    install_queue(engine, "r", "ring", RingSettings(size=8))
    install_queue(engine, "f", "fifo")
    planned = {(i.job, i.queue): i.trigger_text for i in plan(engine, load_config(None))}
    assert planned[("repair_ring", "r")] == "every 1m"
    assert ("repair_ring", "f") not in planned
    assert JOBS["repair_ring"].engines is None  # both engines: ring_repair exists in T-SQL too


def test_the_job_re_pushes_a_killed_poppers_message_and_records_the_run(engine, db_url):
    """ring_workers.pop_then_die claims position 0 on an empty ring and dies (SIGKILL): the
    message then pushed at 0 is nobody's until the job's ring_repair re-pushes it at 1."""
    install_queue(engine, "r", "ring", RingSettings(size=8))
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    popper = ctx.Process(target=ring_workers.pop_then_die, args=(db_url, "r", ready))
    popper.start()
    popper.join(timeout=60)
    assert ready.is_set() and popper.exitcode == -9
    with RingQueue(engine, "r") as producer, RingQueue(engine, "r") as consumer:
        assert producer.enqueue(b"stranded") == 0
        assert consumer.dequeue(1, timeout=0.2) == []
        early = run_job(engine, "repair_ring", "r", ringrepair.RingRepairConfig(), schema="queuectl")
        assert early.outcome == "succeeded" and early.result.rows == 0  # within the 30 s grace: left alone
        record = run_job(engine, "repair_ring", "r", ringrepair.RingRepairConfig(grace=0), schema="queuectl")
        assert record.outcome == "succeeded" and record.result.rescued == [(0, 1)]
        assert "1 messages re-pushed" in record.result.summary()
        [m] = consumer.dequeue(1, timeout=1)
        assert (m.id, m.payload) == (1, b"stranded")


def test_the_job_refuses_another_kind_and_a_bad_grace(engine):
    install_queue(engine, "f", "fifo")
    with pytest.raises(UsageError, match="this job works on ring queues"):
        ringrepair.run_once(engine, "f", schema="queuectl")
    with pytest.raises(UsageError, match="grace must be a number from 0 to 86400"):
        ringrepair.RingRepairConfig(grace=-1)
