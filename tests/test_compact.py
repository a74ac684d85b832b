"""Compaction (queuectl.jobs.compact): a ring's and the DELETE-drained kinds' tables keep a
bounded size while the xmin horizon is pinned, and nothing is lost or reordered meanwhile."""

from __future__ import annotations

from contextlib import contextmanager

import sqlalchemy as sa

from jobs_helpers import scalar
from queuectl.client import FifoQueue, RingQueue
from queuectl.install import install_queue
from queuectl.jobs import compact
from queuectl.kindspec import RingSettings, settings_for

FORCE = compact.CompactConfig(force=True)


@contextmanager
def pinned(engine):
    """A REPEATABLE READ snapshot held open on an unrelated table: no dead version made
    while it lasts may be pruned or vacuumed."""
    conn = engine.connect()
    try:
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS public.unrelated (x int)"))
        conn.commit()
        conn.execute(sa.text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        conn.execute(sa.text("SELECT count(*) FROM public.unrelated")).scalar()
        yield conn
    finally:
        conn.rollback()
        conn.close()


def table_bytes(engine, table: str) -> int:
    return scalar(engine, f"SELECT pg_table_size('queuectl.\"{table}\"')")


def test_smoke_ring(engine):
    install_queue(engine, "r", "ring", RingSettings(size=64))
    with RingQueue(engine, "r") as q, pinned(engine):
        for lap in range(50):
            q.enqueue_many([f"m{lap}-{i}".encode() for i in range(40)])
            got = q.dequeue(40)
            assert [i.payload for i in got] == [f"m{lap}-{i}".encode() for i in range(40)]
        before = table_bytes(engine, "r_ring")
        done = compact.run_once(engine, "r", FORCE, schema="queuectl")
        print(done.summary(), before, table_bytes(engine, "r_ring"))
        assert done.compactions == 1
        q.enqueue(b"after")
        assert [i.payload for i in q.dequeue(1)] == [b"after"]
