"""The client's batch enqueue sends arrays of defaults as NULL: the items must come out
exactly as if every default had been spelled out, and per-item values must still apply."""

from __future__ import annotations

import time

import sqlalchemy as sa

from queuectl.client import Queue


def _rows(queue: Queue, ids: list[int]) -> dict[int, sa.RowMapping]:
    rows = queue._conn.execute(
        sa.text('SELECT id, priority, title, due_at - enqueued_at AS delay FROM queuectl."orders_meta" WHERE id = ANY(:ids)'),
        {"ids": ids},
    ).mappings()
    return {r["id"]: r for r in rows}


def test_enqueue_many_with_only_defaults_gives_default_items(orders: Queue) -> None:
    ids = orders.enqueue_many([b"a", b"b", b"c"])
    rows = _rows(orders, ids)
    assert [(rows[i]["priority"], rows[i]["title"], rows[i]["delay"].total_seconds()) for i in ids] == [(0, None, 0.0)] * 3
    assert [m.payload for m in orders.dequeue(3)] == [b"a", b"b", b"c"]


def test_enqueue_many_applies_per_item_values_beside_defaults(orders: Queue) -> None:
    ids = orders.enqueue_many(["x", "y", "z"], priority=[0, 2, 0], delay=[0, 0, 60], title=[None, "t", None])
    rows = _rows(orders, ids)
    assert [(rows[i]["priority"], rows[i]["title"]) for i in ids] == [(0, None), (2, "t"), (0, None)]
    assert [round(rows[i]["delay"].total_seconds()) for i in ids] == [0, 0, 60]
    assert [m.payload for m in orders.dequeue(3)] == [b"x", b"y"]  # z is not due for a minute


def test_enqueue_many_takes_tiny_delays_which_python_prints_in_e_notation(orders):
    """f"{7e-05} seconds" is no interval: delays are sent with fixed decimals."""
    ids = orders.enqueue_many([b"a", b"b"], delay=[0.00007, 0.0])
    assert len(ids) == 2
    got = []
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        got += orders.dequeue(2)
    assert sorted(m.id for m in got) == sorted(ids)
