"""What a dequeue returns: one record per item, built from the dequeue functions' rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any


class _Payload:
    """The text of a record's payload (UTF-8)."""

    payload: bytes

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8")


@dataclass(frozen=True)
class Message(_Payload):
    """One dequeued item, leased to this client until `leased_until`."""

    id: int
    payload: bytes
    headers: dict[str, Any] | None
    priority: int
    attempts: int
    max_attempts: int
    title: str | None
    enqueued_at: datetime
    dequeued_at: datetime
    due_at: datetime
    leased_until: datetime


# The dequeue functions' columns, by name (their positions are looked up per result).
_MESSAGE_COLUMNS = (
    "id", "payload", "headers", "priority", "attempts", "max_attempts", "title",
    "enqueued_at", "dequeued_at", "due_at", "leased_until",
)


def messages_from(result: Any, json_value: Callable[[Any], Any]) -> list[Message]:
    """The Messages of a dequeue result with the _MESSAGE_COLUMNS (bench/split.py's one-table
    baseline decodes its rows here too, so both designs pay the same client work)."""
    # Plain rows indexed by positions looked up once: dict-like rows were ~7% of a
    # consumer's time (py-spy), and attribute access by name costs more than building
    # the Message (cProfile).
    keys = list(result.keys())
    (i_id, i_payload, i_headers, i_priority, i_attempts, i_max, i_title, i_enq, i_deq, i_due, i_lease) = (
        keys.index(column) for column in _MESSAGE_COLUMNS
    )
    messages = []
    for r in result.all():
        payload = r[i_payload]
        messages.append(Message(
            id=r[i_id],
            payload=payload if type(payload) is bytes else bytes(payload),
            headers=json_value(r[i_headers]),
            priority=r[i_priority],
            attempts=r[i_attempts],
            max_attempts=r[i_max],
            title=r[i_title],
            enqueued_at=r[i_enq],
            dequeued_at=r[i_deq],
            due_at=r[i_due],
            leased_until=r[i_lease],
        ))
    return messages


@dataclass(frozen=True)
class Item(_Payload):
    """One dequeued item; it is no longer in the queue."""

    id: int
    payload: bytes
    headers: dict[str, Any] | None
    enqueued_at: datetime
    dequeued_at: datetime
    due_at: datetime | None = None


def items_from(result: Any, json_value: Callable[[Any], Any]) -> list[Item]:
    """The Items of a destructive dequeue's result (the kinds other than reliable)."""
    # Positions looked up once, plain rows indexed by them: a mapping's get("due_at")
    # raised and caught a KeyError per row on every kind without due times, and
    # attribute access by name costs more than the rest of building an Item (cProfile).
    keys = list(result.keys())
    i_id, i_payload, i_headers = keys.index("id"), keys.index("payload"), keys.index("headers")
    i_enq, i_deq = keys.index("enqueued_at"), keys.index("dequeued_at")
    i_due = keys.index("due_at") if "due_at" in keys else None
    items = []
    for r in result.all():
        payload = r[i_payload]
        items.append(Item(
            id=r[i_id],
            payload=payload if type(payload) is bytes else bytes(payload),
            headers=json_value(r[i_headers]),
            enqueued_at=r[i_enq],
            dequeued_at=r[i_deq],
            due_at=None if i_due is None else r[i_due],
        ))
    return items
