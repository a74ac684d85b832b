"""heap, fifo, stack, pending and watermark at <kind>_0002: the dequeue's cost does not grow
with the table when the function runs a generic plan (<kind>_0001's join to the picks became
a hash join over the whole table), and a queue holding items upgrades to it and back alone,
its order intact after each step."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from queuectl.bench.drivers import plan_shared_hits
from queuectl.install import downgrade_queue, head_of, install_queue, upgrade_queue
from queuectl.client import open_queue
from queuectl.kindspec import FifoSettings

PAYLOAD = bytes(300)
KINDS = [("fifo", FifoSettings()), ("fifo", FifoSettings(strict=True)), ("heap", None), ("stack", None),
         ("pending", None), ("watermark", None)]
IDS = ["fifo", "fifo-strict", "heap", "stack", "pending", "watermark"]


def filled(engine, name: str, kind: str, settings, rows: int, revision: str | None = None) -> None:
    install_queue(engine, name, kind, settings, **({"revision": revision} if revision else {}))
    with open_queue(engine, name) as q:
        for _ in range(rows // 1000):
            q.enqueue_many([PAYLOAD] * 1000)
    with engine.connect() as conn:
        conn.execute(sa.text(f'ANALYZE queuectl."{name}_items"'))  # as autovacuum would, sooner
        conn.commit()


def buffers_per_dequeue(engine, name: str, calls: int = 8) -> int:
    """Shared buffers of one dequeue(10), the function's own statements included, on its
    `calls`-th call in a session that runs generic plans. These functions' custom plans see
    p_batch and stay on the primary key at both sizes; the generic plan is the one
    plan_cache_mode = force_generic_plan (a server, database or role setting) always runs
    and the one plpgsql keeps after five calls when it costs no more, so it is the plan
    measured here."""
    with engine.connect() as conn:
        conn.execute(sa.text("SET plan_cache_mode = force_generic_plan"))
        for _ in range(calls):
            plan = [row[0] for row in conn.execute(sa.text(
                f'EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) SELECT * FROM queuectl."{name}_dequeue"(10)'))]
            conn.commit()
    hit = plan_shared_hits(plan)
    assert hit is not None, plan
    return hit


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "settings"), KINDS, ids=IDS)
def test_dequeue_touches_as_many_buffers_at_40000_rows_as_at_2000(engine, kind, settings):
    """Measured: ~57 buffers per dequeue of 10 at both sizes."""
    filled(engine, "small", kind, settings, 2_000)
    filled(engine, "large", kind, settings, 40_000)
    small, large = buffers_per_dequeue(engine, "small"), buffers_per_dequeue(engine, "large")
    assert large <= small * 1.5, (small, large)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "settings"), KINDS, ids=IDS)
def test_before_0002_the_dequeue_scanned_the_whole_table(engine, kind, settings):
    """The same measurement at <kind>_0001 shows the flaw the revision removes (~122 buffers
    at 2,000 rows, ~1,775 at 40,000), so the test above can tell the two apart."""
    filled(engine, "small", kind, settings, 2_000, revision=f"{kind}_0001")
    filled(engine, "large", kind, settings, 40_000, revision=f"{kind}_0001")
    small, large = buffers_per_dequeue(engine, "small"), buffers_per_dequeue(engine, "large")
    assert large > small * 3, (small, large)


def dequeue_definition(engine, name: str) -> str:
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT pg_get_functiondef(p.oid) FROM pg_proc p "
            "WHERE p.pronamespace = 'queuectl'::regnamespace AND p.proname = :fn"),
            {"fn": f"{name}_dequeue"}).scalar_one().replace(f"{name}_", "NAME_")


def enqueue_labelled(q, kind: str, labels: list[str]) -> list[str]:
    """Enqueue the labels; returns the order the kind promises to hand them out in (a pending
    queue's labels are due in reverse, the last one not yet: it must stay)."""
    if kind != "pending":
        q.enqueue_many(labels)
        return {"stack": labels[::-1]}.get(kind, labels)
    now = datetime.now(timezone.utc)
    due = [now - timedelta(minutes=len(labels) - i) for i in range(len(labels))][::-1]
    due[-1] = now + timedelta(hours=1)
    q.enqueue_many(labels, due_at=due)
    return labels[-2::-1]


def check_step(kind: str, got: list[str], expected: list[str]) -> None:
    """The items taken in one step are the next ones in the kind's order (a heap promises no
    order: just as many; the test checks its multiset at the end)."""
    assert len(got) == len(expected) if kind == "heap" else got == expected, (got, expected)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "settings"), KINDS, ids=IDS)
def test_queue_at_0001_upgrades_alone_and_downgrades_to_the_same_function(engine, kind, settings):
    old_revision, new_revision = f"{kind}_0001", f"{kind}_0002"
    install_queue(engine, "alpha", kind, settings, revision=old_revision)
    install_queue(engine, "beta", kind, settings, revision=old_revision)
    old = dequeue_definition(engine, "beta")
    assert dequeue_definition(engine, "alpha") == old and "USING picked" in old
    with open_queue(engine, "alpha") as alpha:  # one session across every step
        order = enqueue_labelled(alpha, kind, [f"a{i}" for i in range(6)])
        got = [m.text for m in alpha.dequeue(1)]
        check_step(kind, got, order[:1])

        head = head_of(kind)  # <kind>_0002 replaced the dequeue; later revisions leave it
        assert head >= new_revision
        assert upgrade_queue(engine, "alpha") == (old_revision, head)
        new = dequeue_definition(engine, "alpha")
        # pending_0005 deletes its picks by row address
        if kind == "pending":
            picks = "ctid = ANY (ARRAY(SELECT p.row_address"
        else:
            picks = "= ANY (ARRAY(SELECT p.id FROM picked p))"
        assert new != old and picks in new and "USING picked" not in new
        assert ("SKIP LOCKED" in new) == ("SKIP LOCKED" in old)  # strict FIFO still waits
        assert dequeue_definition(engine, "beta") == old  # upgraded one at a time
        step = [m.text for m in alpha.dequeue(2)]
        check_step(kind, step, order[1:3])
        got += step

        assert downgrade_queue(engine, "alpha", old_revision) == (head, old_revision)
        assert dequeue_definition(engine, "alpha") == old  # exactly <kind>_0001's function again
        step = [m.text for m in alpha.dequeue(10)]
        check_step(kind, step, order[3:])
        got += step
    assert sorted(got) == sorted(order)  # every item once; a pending item not yet due stays
