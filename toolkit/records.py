"""Dequeued items as JSON-ready records: what `queuectl dequeue` prints, one per line.

A payload that is UTF-8 text is shown as text, any other as hex, and the record says which.
A reliable queue's items are leased (or done at once with `ack`); the other kinds hand
their items out destructively, so their records say "removed".
"""

from __future__ import annotations

from typing import Any

from queuectl.client import Queue
from queuectl.errors import UsageError


def dequeue_records(queue: Any, batch: int, *, lease: float | None = None, ack: bool = False,
                    subscription: str | None = None) -> list[dict[str, Any]]:
    """Claim up to `batch` due items of an open queue (any kind) and return them as records;
    with `ack` a reliable queue's items, or a fan-out ring subscription's, are marked done at
    once. `subscription`: take from that subscription of a fan-out ring."""
    if subscription is not None:
        return _subscription_records(queue, subscription, batch, lease=lease, ack=ack)
    if getattr(queue, "fanout", False):
        raise UsageError(f"ring {queue.name!r} fans out: read it through a subscription with --subscription NAME "
                         f"(queuectl subscriptions {queue.name} lists them)")
    if isinstance(queue, Queue):
        messages = queue.dequeue(batch, lease=lease)
        if ack:
            queue.ack(messages)
        return [
            {
                "id": m.id, **_payload(m.payload), "headers": m.headers, "priority": m.priority,
                "attempts": m.attempts, "title": m.title, "enqueued_at": m.enqueued_at.isoformat(),
                "leased_until": None if ack else m.leased_until.isoformat(),
                "status": "done" if ack else "processing",
            }
            for m in messages
        ]
    if lease is not None:
        raise UsageError(f"{queue.kind} queues have no leases: items are removed when dequeued")
    if ack:
        raise UsageError(f"{queue.kind} queues need no --ack: items are removed when dequeued")
    return [
        {
            "id": item.id, **_payload(item.payload), "headers": item.headers,
            "enqueued_at": item.enqueued_at.isoformat() if item.enqueued_at else None,
            "dequeued_at": item.dequeued_at.isoformat(),
            "due_at": item.due_at.isoformat() if item.due_at else None,
            "status": "removed",
        }
        for item in queue.dequeue(batch)
    ]


def _payload(payload: bytes) -> dict[str, str]:
    try:
        return {"payload": payload.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"payload": payload.hex(), "encoding": "hex"}


def _subscription_records(queue: Any, name: str, batch: int, *, lease: float | None, ack: bool) -> list[dict[str, Any]]:
    """A fan-out ring subscription's take: claimed for `lease` seconds (then another consumer of
    the subscription may take the message again), or acknowledged at once with `ack`."""
    if not getattr(queue, "fanout", False):
        raise UsageError(f"queue {queue.name!r} is not a fan-out ring: --subscription applies to rings installed "
                         "with --fanout")
    consumer = queue.subscription(name)
    items = consumer.dequeue(batch) if lease is None else consumer.dequeue(batch, lease=lease)
    tries = {item.id: consumer.tries(item) for item in items}
    if ack and items:
        consumer.ack(items)
    return [
        {
            "id": item.id, **_payload(item.payload), "headers": item.headers, "subscription": name,
            "tries": tries[item.id], "enqueued_at": item.enqueued_at.isoformat() if item.enqueued_at else None,
            "dequeued_at": item.dequeued_at.isoformat(), "status": "done" if ack else "claimed",
        }
        for item in items
    ]
