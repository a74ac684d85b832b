"""reliable_0004: ack_and_dequeue acks a finished batch and claims the next in one call and
one transaction, only for items this worker holds; queues upgrade to it one at a time and
downgrade cleanly."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from queuectl.client import Queue
from queuectl.errors import UsageError
from queuectl.install import downgrade_queue, head_of, install_queue, upgrade_queue

from test_install import schema_objects


def statuses_and_xmins(queue: Queue, ids: list[int]) -> dict[int, tuple[int, str]]:
    """{id: (status, xmin)}: rows written by one transaction share its xmin."""
    with queue.engine.connect() as conn:
        rows = conn.execute(
            sa.text(f"SELECT id, status, xmin::text AS xmin FROM {queue.names.qualified('meta')} WHERE id = ANY(:ids)"),
            {"ids": ids},
        ).all()
    return {r.id: (r.status, r.xmin) for r in rows}


def test_fresh_install_is_at_the_head_with_the_function(engine):
    info = install_queue(engine, "orders")
    assert head_of("reliable") >= "reliable_0004" and info.schema_version == head_of("reliable")
    assert "orders_ack_dequeue" in schema_objects(engine)["functions"]


def test_ack_and_dequeue_acks_the_batch_and_claims_the_next_in_one_transaction(orders: Queue):
    ids = orders.enqueue_many([f"m{i}" for i in range(5)])
    first = orders.dequeue(2)
    assert [m.id for m in first] == ids[:2]
    second = orders.ack_and_dequeue(first, 2)
    assert [m.id for m in second] == ids[2:4] and [m.text for m in second] == ["m2", "m3"]
    assert all(m.attempts == 1 and m.leased_until > m.dequeued_at for m in second)
    rows = statuses_and_xmins(orders, ids[:4])
    assert [rows[i][0] for i in ids[:4]] == [2, 2, 1, 1]  # acked DONE, claimed PROCESSING
    assert len({rows[i][1] for i in ids[:4]}) == 1  # one transaction wrote all four
    # the last one: nothing left to claim, but the ack still lands
    third = orders.ack_and_dequeue(second, 2)
    assert [m.id for m in third] == [ids[4]]
    assert orders.ack_and_dequeue(third, 2) == []
    assert orders.counts() == {"ready": 0, "scheduled": 0, "processing": 0, "done": 5, "dead": 0}


def test_ack_and_dequeue_with_nothing_to_ack_is_a_dequeue(orders: Queue):
    ids = orders.enqueue_many(["a", "b"])
    assert [m.id for m in orders.ack_and_dequeue([], 5)] == ids
    assert orders.counts()["processing"] == 2


def test_ack_and_dequeue_acks_only_items_this_worker_holds(orders: Queue, engine):
    ids = orders.enqueue_many(["mine", "theirs", "next"])
    other = Queue(engine, "orders")
    try:
        [mine] = orders.dequeue(1)
        [theirs] = other.dequeue(1)
        [nxt] = orders.ack_and_dequeue([mine, theirs], 1)
        assert nxt.id == ids[2]
        rows = statuses_and_xmins(orders, ids)
        assert rows[mine.id][0] == 2 and rows[theirs.id][0] == 1  # the other worker's item is still leased
        assert other.ack([theirs]) == 1
    finally:
        other.close()


def test_bad_batch_is_refused_before_reaching_the_database(orders: Queue):
    with pytest.raises(UsageError, match="batch size"):
        orders.ack_and_dequeue([], 0)


def test_queue_at_0002_upgrades_alone_and_downgrades_cleanly(engine):
    install_queue(engine, "alpha", revision="reliable_0003")
    install_queue(engine, "beta", revision="reliable_0003")
    assert "alpha_ack_dequeue" not in schema_objects(engine)["functions"]
    with Queue(engine, "alpha") as alpha:
        alpha.enqueue("a0")
        with pytest.raises(UsageError, match="reliable_0003.*queuectl upgrade alpha"):
            alpha.ack_and_dequeue([], 1)

    assert upgrade_queue(engine, "alpha") == ("reliable_0003", head_of("reliable"))
    functions = schema_objects(engine)["functions"]
    assert "alpha_ack_dequeue" in functions and "beta_ack_dequeue" not in functions
    with Queue(engine, "alpha") as alpha:
        [m] = alpha.ack_and_dequeue([], 1)
        assert m.text == "a0" and alpha.ack_and_dequeue([m], 1) == []
        assert alpha.counts()["done"] == 1

    assert downgrade_queue(engine, "alpha", "reliable_0003") == (head_of("reliable"), "reliable_0003")
    assert "alpha_ack_dequeue" not in schema_objects(engine)["functions"]
    with Queue(engine, "alpha") as alpha:  # the two-call loop still works at 0002
        alpha.enqueue("a1")
        [m] = alpha.dequeue(1)
        assert alpha.ack([m]) == 1
        with pytest.raises(UsageError, match="queuectl upgrade alpha"):
            alpha.ack_and_dequeue([], 1)
