"""The watermark queue: correct_watermark fixes a stored watermark that is too high or too
low, the working watermark never passes an item that can still be dequeued, and under an
open snapshot the work per dequeue stays bounded while a plain FIFO's grows."""

from __future__ import annotations

import json
import statistics

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from queuectl.install import install_queue
from queuectl.client import WatermarkQueue, correct_watermark, open_queue


def set_stored_low(engine, name: str, low: int) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f'UPDATE queuectl."{name}_watermark" SET low = :low'), {"low": low})


def test_correct_watermark_fixes_a_watermark_set_too_high_and_too_low(engine, db_url):
    install_queue(engine, "wm", "watermark")
    # the working watermark lives in the connection: fresh sessions come from a pool-less engine
    fresh_sessions = sa.create_engine(db_url, poolclass=NullPool)
    with open_queue(engine, "wm") as q:
        ids = q.enqueue_many([f"m{i}" for i in range(10)])
        assert [m.id for m in q.dequeue(3)] == ids[:3]

    set_stored_low(engine, "wm", ids[7])  # too high: items 4..7 are unreachable from it
    with open_queue(fresh_sessions, "wm") as fresh:
        assert [m.id for m in fresh.dequeue(1)] == [ids[7]]  # starts at the stored hint: skips 4..7
    fixed = correct_watermark(engine, "wm")
    assert (fixed.old_low, fixed.new_low, fixed.true_low, fixed.changed) == (ids[7], ids[3], ids[3], True)
    assert fixed.reason.startswith("lowered")
    with open_queue(fresh_sessions, "wm") as fresh:
        assert [m.id for m in fresh.dequeue(10)] == ids[3:7] + ids[8:]

    with open_queue(engine, "wm") as q:
        more = q.enqueue_many([f"n{i}" for i in range(5)])
        assert [m.id for m in q.dequeue(2)] == more[:2]
    set_stored_low(engine, "wm", 1)  # too low: dequeues would walk every old ghost again
    fixed = correct_watermark(engine, "wm")
    assert (fixed.old_low, fixed.new_low, fixed.changed) == (1, more[2], True)
    assert fixed.reason.startswith("raised")
    again = correct_watermark(engine, "wm")
    assert (again.old_low, again.new_low, again.changed) == (more[2], more[2], False)

    with open_queue(engine, "wm") as q:  # the empty queue: the bound is the next id to be drawn
        assert [m.id for m in q.dequeue(10)] == more[2:]
    set_stored_low(engine, "wm", 1)
    fixed = correct_watermark(engine, "wm")
    assert (fixed.new_low, fixed.true_low) == (more[-1] + 1, more[-1] + 1)


def test_a_running_session_adopts_a_correction_at_its_next_move(engine, db_url):
    install_queue(engine, "wm", "watermark")
    ids = []
    with open_queue(engine, "wm") as q:
        ids = q.enqueue_many([f"m{i}" for i in range(5)])
    set_stored_low(engine, "wm", ids[-1] + 100)  # a wrong hint, far above every item
    with open_queue(sa.create_engine(db_url, poolclass=NullPool), "wm") as consumer:
        assert consumer.dequeue(5) == []  # the session started from the wrong hint
        correct_watermark(engine, "wm")
        got = []
        for _ in range(101):  # the session re-reads the stored row every 100th call
            got += consumer.dequeue(5)
        assert [m.id for m in got] == ids


def test_watermark_never_passes_an_uncommitted_enqueue_or_a_rolled_back_dequeue(engine, db_url):
    """An enqueue that stays uncommitted while hundreds of later items are enqueued and
    dequeued, and a consumer whose transaction rolls back: both items still come out,
    without any correction run."""
    install_queue(engine, "wm", "watermark")
    producer_engine = sa.create_engine(db_url)
    try:
        with producer_engine.connect() as slow_producer, open_queue(engine, "wm") as consumer, \
                open_queue(engine, "wm") as producer, open_queue(engine, "wm") as failing:
            slow_producer.begin()
            slow_id = slow_producer.execute(sa.text("SELECT queuectl.\"wm_enqueue\"('slow')")).scalar()
            taken = []
            for round_ in range(6):  # 600 dequeue calls: the watermark gets every chance to move
                producer.enqueue_many([f"r{round_}-{i}" for i in range(100)])
                for _ in range(100):
                    taken += consumer.dequeue(1)
            assert len(taken) == 600 and slow_id < min(m.id for m in taken)
            state = consumer.stored_watermark()
            slow_producer.commit()  # the old, low id becomes visible only now

            xs = producer.enqueue_many(["x1", "x2"])
            try:
                with failing.processing(1) as items:
                    rolled_back = items[0].id
                    raise RuntimeError("handler failed")
            except RuntimeError:
                pass
            rest = []
            for _ in range(300):
                rest += consumer.dequeue(5)
            assert rolled_back in [slow_id, *xs]  # (a fresh session starts low: it may take the slow item)
            assert sorted(m.id for m in rest) == sorted([slow_id, *xs])  # each exactly once
            assert state["low"] <= slow_id  # the stored hint never passed the open enqueue either
    finally:
        producer_engine.dispose()


def dequeue_buffers(conn, name: str) -> int:
    """Shared buffers one dequeue call touched (the function's own statements included)."""
    plan = conn.execute(
        sa.text(f'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM queuectl."{name}_dequeue"(1)')
    ).scalar()
    plan = plan if isinstance(plan, list) else json.loads(plan)
    top = plan[0]["Plan"]
    assert top["Actual Rows"] == 1
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"]


@pytest.mark.slow
def test_under_an_open_snapshot_watermark_work_per_dequeue_stays_bounded_and_fifo_grows(engine, db_url):
    """The ghost problem on a small scale, measured in buffers (not time): a REPEATABLE
    READ snapshot held in another session keeps every dequeued row's dead version and
    index entry; a FIFO dequeue walks all of them, the watermark dequeue only the last
    ~100 calls' worth."""
    rows = 2_500
    late: dict[str, float] = {}
    early: dict[str, float] = {}
    for kind in ("fifo", "watermark"):
        install_queue(engine, f"g_{kind}", kind)
        with open_queue(engine, f"g_{kind}") as q:
            for _ in range(rows // 500):
                q.enqueue_many([b"p" * 200] * 500)
        holder_engine = sa.create_engine(db_url)
        with holder_engine.connect().execution_options(isolation_level="REPEATABLE READ") as holder, \
                engine.connect() as consumer:
            holder.begin()
            holder.execute(sa.text(f'SELECT count(*) FROM queuectl."g_{kind}_items"')).scalar()  # take the snapshot
            consumer.execution_options(isolation_level="AUTOCOMMIT")
            counts = [dequeue_buffers(consumer, f"g_{kind}") for _ in range(rows)]
            holder.rollback()
        holder_engine.dispose()
        early[kind] = statistics.median(counts[200:500])
        late[kind] = statistics.median(counts[-300:])
        if kind == "watermark":
            # bounded: the 99th percentile of every call after warm-up (a rare call may pay a
            # one-off page or catalog read; a walk over ghosts would grow with every call)
            p99 = sorted(counts[200:])[int(0.99 * len(counts[200:]))]
            assert p99 <= early[kind] + 40, (early[kind], p99)
    assert late["watermark"] <= early["watermark"] * 1.5, (early, late)
    assert late["fifo"] >= early["fifo"] * 3, (early, late)  # the test can tell the two apart
    assert late["fifo"] >= late["watermark"] * 4, (early, late)


def test_watermark_job_fixes_a_wrong_watermark_and_records_the_run(engine, db_url):
    """The scheduler's 5-minute job: runs the kind's correction and leaves a history row."""
    from queuectl.jobs.registry import JOBS
    from queuectl.jobs.runner import run_job

    assert JOBS["correct_watermark"].kinds == ("watermark",)
    install_queue(engine, "wm", "watermark")
    with open_queue(engine, "wm") as q:
        ids = q.enqueue_many([f"m{i}" for i in range(6)])
        assert [m.id for m in q.dequeue(2)] == ids[:2]

    set_stored_low(engine, "wm", ids[5])  # too high: items 2..4 would be skipped
    record = run_job(engine, "correct_watermark", "wm")
    assert record.outcome == "succeeded" and record.rows == 1
    assert (record.result.old, record.result.new) == (ids[5], ids[2])

    set_stored_low(engine, "wm", 1)  # too low: ghosts scanned again
    record = run_job(engine, "correct_watermark", "wm")
    assert (record.result.old, record.result.new, record.rows) == (1, ids[2], 1)

    record = run_job(engine, "correct_watermark", "wm")  # nothing to fix now
    assert (record.rows, record.result.corrected) == (0, False)
    with engine.connect() as conn:
        runs = conn.execute(sa.text(
            "SELECT outcome, rows FROM queuectl.job_runs WHERE job = 'correct_watermark' AND queue = 'wm' ORDER BY id"
        )).all()
    assert [tuple(r) for r in runs] == [("succeeded", 1), ("succeeded", 1), ("succeeded", 0)]
