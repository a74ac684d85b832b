"""reliable_0005: the dequeue's cost does not grow with the meta table once it has
statistics (reliable_0001's join to the picks became a hash join over the whole table),
and a queue upgrades to it and back alone."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from queuectl.bench.drivers import plan_shared_hits
from queuectl.client import Queue
from queuectl.install import downgrade_queue, head_of, install_queue, upgrade_queue

PAYLOAD = bytes(300)


def filled(engine, name: str, rows: int, revision: str | None = None) -> None:
    install_queue(engine, name, **({"revision": revision} if revision else {}))
    with Queue(engine, name) as q:
        for _ in range(rows // 1000):
            q.enqueue_many([PAYLOAD] * 1000)
    with engine.connect() as conn:
        conn.execute(sa.text(f'ANALYZE queuectl."{name}_meta"'))  # as autovacuum would, sooner
        conn.commit()


def buffers_per_dequeue(engine, name: str, calls: int = 8) -> int:
    """Shared buffers of one dequeue(10), the function's own statements included (EXPLAIN
    counts what runs inside a function scan), after `calls` - 1 calls: plpgsql may switch
    to a generic plan after five."""
    with engine.connect() as conn:
        for _ in range(calls):
            plan = [row[0] for row in conn.execute(sa.text(
                f'EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) SELECT * FROM queuectl."{name}_dequeue"(10)'))]
            conn.commit()
    hit = plan_shared_hits(plan)
    assert hit is not None, plan
    return hit


def dequeue_definition(engine, name: str, fn: str = "dequeue") -> str:
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT pg_get_functiondef(p.oid) FROM pg_proc p "
            "WHERE p.pronamespace = 'queuectl'::regnamespace AND p.proname = :fn"),
            {"fn": f"{name}_{fn}"}).scalar_one().replace(f"{name}_", "NAME_")


@pytest.mark.slow
def test_dequeue_touches_as_many_buffers_at_40000_rows_as_at_2000(engine):
    """At 40,000 analyzed rows reliable_0004's dequeue read ~640 buffers per call (the whole
    meta table), against ~140 at 2,000; now both stay near 140."""
    filled(engine, "small", 2_000)
    filled(engine, "large", 40_000)
    small, large = buffers_per_dequeue(engine, "small"), buffers_per_dequeue(engine, "large")
    assert large <= small * 1.5, (small, large)


def test_before_reliable_0005_the_dequeue_scanned_the_whole_table(engine):
    """The same measurement at reliable_0004 shows the flaw the revision removes (so the
    test above can tell the two apart)."""
    filled(engine, "small", 2_000, revision="reliable_0004")
    filled(engine, "large", 40_000, revision="reliable_0004")
    small, large = buffers_per_dequeue(engine, "small"), buffers_per_dequeue(engine, "large")
    assert large > small * 3, (small, large)


def test_queue_at_0004_upgrades_alone_and_downgrades_to_the_same_function(engine):
    install_queue(engine, "alpha", revision="reliable_0004")
    install_queue(engine, "beta", revision="reliable_0004")
    old = dequeue_definition(engine, "beta")
    assert dequeue_definition(engine, "alpha") == old
    with Queue(engine, "alpha") as alpha:
        ids = alpha.enqueue_many(["a0", "a1", "a2"])
        [first] = alpha.dequeue(1)

        head = head_of("reliable")
        assert head >= "reliable_0005"
        assert upgrade_queue(engine, "alpha") == ("reliable_0004", head)
        new = dequeue_definition(engine, "alpha")
        # reliable_0012: dequeue runs the claim of create_claim_calls on a slot's tables
        claim = dequeue_definition(engine, "alpha", "claim_in0")
        assert new != old and "claim_in0" in new
        assert "= ANY (ARRAY(SELECT e.id FROM expired e UNION ALL SELECT r.id FROM ready r))" in claim
        assert dequeue_definition(engine, "beta") == old  # upgraded one at a time
        assert alpha.ack([first]) == 1  # the lease taken before the upgrade is still held
        assert [(m.id, m.text, m.attempts) for m in alpha.dequeue(5)] == [(ids[1], "a1", 1), (ids[2], "a2", 1)]

    assert downgrade_queue(engine, "alpha", "reliable_0004") == (head, "reliable_0004")
    assert dequeue_definition(engine, "alpha") == old  # exactly reliable_0004's function again
    with Queue(engine, "alpha") as alpha:
        alpha.enqueue("a3")
        assert [m.text for m in alpha.dequeue(5)] == ["a3"]
