"""The reliable queue's calls as data, shared by the blocking Queue and the asyncio AsyncQueue.

Every call of a client checks its arguments, builds the bind values of one statement (a
named section of sql/<engine>/reliable.sql) and says how to read its result and whether it
may be sent again after a lost connection. That part does no I/O, so both clients run the
same Call objects: Queue on a blocking connection, AsyncQueue on psycopg's async one. So
do the words of their errors and their reconnect schedule.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from queuectl.arguments import (
    check_batch, check_max_attempts, check_priority, check_seconds, headers_list, payload_list, schema_revision_number,
    spread,
)
from queuectl.catalog import QueueInfo
from queuectl.engine import backoff_pause
from queuectl.engine.base import Adapter
from queuectl.engine.urls import mask_url
from queuectl.errors import ConnectionFailed, PayloadTooLarge, StatementCanceled, UsageError
from queuectl.messages import Message, messages_from
from queuectl.stats import STATUS_NAMES
from queuectl.storable import diagnostic_text, headers_json, payload_bytes, shown, stored_text

MAX_ID = 2**63 - 1  # ids are bigint

# Reconnecting after a lost connection (server restart, pg_terminate_backend, network):
# jittered exponential backoff from RETRY_FIRST_S, each pause at most RETRY_MAX_PAUSE_S,
# giving up with ConnectionFailed once RETRY_TOTAL_S (queuectl.defaults) have passed since the failure.
RETRY_FIRST_S = 0.05
RETRY_MAX_PAUSE_S = 2.0

# Queue.ack_and_dequeue needs the queue's SQL at this reliable revision or later.
ACK_DEQUEUE_REVISION = 4

# The reliable client's statements (sections of sql/<engine>/reliable.sql).
RELIABLE_CALLS = ("enqueue", "enqueue_many", "dequeue", "ack", "nack", "extend_lease", "release", "ack_dequeue")


class EnqueueOutcomeUnknown(ConnectionFailed):
    """The connection broke after an enqueue was sent: it may or may not have committed.

    Never retried by the client (a retry could add the item twice); the caller decides.
    """


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One client call: the statement's section name, its bind values, how to read its
    result, whether it may be sent again after a lost connection, and how many items it
    touches that this client holds (for the give-up message). `params` None: nothing needs
    sending (an ack of no items) and the call's result is `empty`."""

    key: str
    params: dict[str, Any] | None
    fetch: Callable[[Any], T]
    resend: bool = True
    held: int = 0
    empty: T | None = None


def _column(name: str) -> Callable[[Any], list[Any]]:
    """A fetch of one named column from every row of a result."""
    def fetch(result: Any) -> list[Any]:
        i = list(result.keys()).index(name)
        return [row[i] for row in result.all()]
    return fetch


def _new_statuses(result: Any) -> dict[int, str]:
    """nack's rows as {id: status name}."""
    keys = list(result.keys())
    i_id, i_status = keys.index("id"), keys.index("status")
    return {row[i_id]: STATUS_NAMES[row[i_status]] for row in result.all()}


def _scalar(result: Any) -> Any:
    return result.scalar_one()


def _scalars(result: Any) -> list[Any]:
    return list(result.scalars())


def ids_of(items: Iterable[int | Message]) -> list[int]:
    if isinstance(items, (str, bytes, Message)) or not isinstance(items, Iterable):
        raise UsageError(f"items must be a list of Messages or item ids, not {type(items).__name__}")
    return [item_id(item) for item in items]


def item_id(item: int | Message) -> int:
    """A Message's id, or a whole number (anything with __index__ but bool) within bigint."""
    if isinstance(item, Message):
        return item.id
    if not isinstance(item, bool):
        try:
            value = operator.index(item)
        except TypeError:
            pass
        else:
            if 1 <= value <= MAX_ID:
                return value
    raise UsageError(f"item ids must be Messages or whole numbers from 1 to {MAX_ID}, got {shown(item)}")


class ReliableCalls:
    """The reliable queue's calls, built and checked without I/O (the docs of each are on
    queuectl.client.Queue's methods of the same name)."""

    def __init__(self, adapter: Adapter, name: str, worker: str, info: QueueInfo) -> None:
        self.adapter = adapter
        self.name = name
        self.worker = worker
        self.info = info

    def messages(self, result: Any) -> list[Message]:
        return messages_from(result, self.adapter.json_value)

    def enqueue(self, payload: bytes | str, headers: dict[str, Any] | None, priority: int, delay: float,
                title: str | None, max_attempts: int | None) -> Call[int]:
        params = {
            "payload": payload_bytes(payload),
            "headers": headers_json(headers),
            "priority": check_priority(priority),
            "delay": check_seconds(delay, "delay"),
            "title": stored_text(title, "title"),
            "max_attempts": check_max_attempts(max_attempts),
        }
        return Call("enqueue", params, _scalar, resend=False)

    def enqueue_many(
        self,
        payloads: Iterable[bytes | str],
        headers: Sequence[dict[str, Any] | None] | None,
        priority: int | Sequence[int],
        delay: float | Sequence[float],
        title: str | None | Sequence[str | None],
        max_attempts: int | None,
    ) -> Call[list[int]]:
        items = payload_list(payloads)
        max_attempts = check_max_attempts(max_attempts)
        if not items:
            return Call("enqueue_many", None, _scalars, empty=[])
        n = len(items)
        rows = [
            {"payload": p, "headers": h, "priority": pr, "delay": d, "title": t}
            for p, h, pr, d, t in zip(
                items,
                headers_list(headers, n) or [None] * n,
                spread(priority, n, "priority", check_priority),
                spread(delay, n, "delay", lambda d, what: check_seconds(d, what) or 0.0),
                spread(title, n, "title", stored_text),
            )
        ]
        return Call("enqueue_many", self.adapter.enqueue_many_params(rows, max_attempts), _scalars, resend=False)

    def dequeue(self, n: int, lease: float | None) -> Call[list[Message]]:
        params = {
            "batch": check_batch(n),
            "lease_seconds": check_seconds(lease, "lease", low=0.001),
            "worker": self.worker,
        }
        return Call("dequeue", params, self.messages)

    def ack(self, items: Iterable[int | Message]) -> Call[int]:
        ids = ids_of(items)
        params = {"ids": self.adapter.id_array(ids), "worker": self.worker} if ids else None
        return Call("ack", params, _scalar, held=len(ids), empty=0)

    def nack(self, items: Iterable[int | Message], error: str | BaseException | None, base_delay: float | None,
             max_delay: float | None) -> Call[dict[int, str]]:
        ids = ids_of(items)
        params = {
            "ids": self.adapter.id_array(ids),
            "error": diagnostic_text(error),
            "worker": self.worker,
            "base_seconds": check_seconds(base_delay, "base delay"),
            "max_seconds": check_seconds(max_delay, "max delay"),
        } if ids else None
        return Call("nack", params, _new_statuses, held=len(ids), empty={})

    def extend_lease(self, items: Iterable[int | Message], lease: float | None) -> Call[list[int]]:
        ids = ids_of(items)
        params = {"ids": self.adapter.id_array(ids), "lease_seconds": check_seconds(lease, "lease", low=0.001),
                  "worker": self.worker} if ids else None
        return Call("extend_lease", params, _column("id"), held=len(ids), empty=[])

    def release(self, items: Iterable[int | Message]) -> Call[int]:
        ids = ids_of(items)
        params = {"ids": self.adapter.id_array(ids), "worker": self.worker} if ids else None
        return Call("release", params, _scalar, held=len(ids), empty=0)

    def ack_and_dequeue(self, done: Iterable[int | Message], n: int, lease: float | None) -> Call[list[Message]]:
        if schema_revision_number(self.info.schema_version) < ACK_DEQUEUE_REVISION:
            raise UsageError(
                f"queue {self.name!r} is at {self.info.schema_version}; ack_and_dequeue needs "
                f"reliable_{ACK_DEQUEUE_REVISION:04d}: run `queuectl upgrade {self.name}`"
            )
        ids = ids_of(done)
        params = {
            "ack_ids": self.adapter.id_array(ids),
            "batch": check_batch(n),
            "lease_seconds": check_seconds(lease, "lease", low=0.001),
            "worker": self.worker,
        }
        return Call("ack_dequeue", params, self.messages, held=len(ids))


# -- what a failed call raises ------------------------------------------------------------------


def refusal(adapter: Adapter, call: Call[Any], queue: str, exc: Any, reason: str) -> Exception:
    """What to raise for an error on a live connection: one line for the errors a caller
    acts on (an oversized payload, an isolation level refused, a canceled statement, a call
    that met a migration), else the driver's error itself."""
    refused = adapter.payload_refusal(exc)
    if refused is not None:
        return PayloadTooLarge(refused)
    refused = adapter.isolation_refusal(exc)
    if refused is not None:
        return UsageError(refused)
    undone = {"dequeue": "nothing was claimed", "sub_take": "nothing was claimed", "enqueue": "nothing was enqueued",
              "enqueue_many": "nothing was enqueued", "publish": "nothing was enqueued"}.get(
                  call.key, "the items stay as they were")
    if adapter.canceled(exc):
        return StatementCanceled(
            f"{call.key} on queue {queue!r} was canceled by the server and rolled back "
            f"({reason}): {undone}; sending it again is safe"
        )
    if adapter.schema_changed(exc):
        return StatementCanceled(
            f"{call.key} on queue {queue!r} failed whole: the queue's tables or functions changed during the "
            f"call (an upgrade or downgrade ran; {reason}): {undone}; sending it again is safe once the queue "
            "is installed"
        )
    driver_error: Exception = exc
    return driver_error


class Reconnecting:
    """The schedule of one call's reconnects after its connection was lost: jittered
    exponential pauses until `total` seconds have passed since the first loss."""

    def __init__(self, total: float) -> None:
        self.total = total
        self.deadline = time.monotonic() + total
        self.attempt = 0

    def pause_after(self, call: Call[Any], sent: bool, queue: str, url: Any, reason: str) -> float:
        """The pause before reconnecting and sending `call` again; raises when it must not
        be sent again (an enqueue that reached the server: EnqueueOutcomeUnknown) or when
        the time is up (ConnectionFailed)."""
        where = f"{call.key} on queue {queue!r}"
        if sent and not call.resend:
            raise EnqueueOutcomeUnknown(
                f"{where}: connection to {mask_url(url)} lost after the statement was sent; it may or may "
                f"not have committed ({reason})"
            ) from None
        pause = backoff_pause(self.attempt, RETRY_FIRST_S, RETRY_MAX_PAUSE_S)
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            leased = (f"; the {call.held} items it held stay leased until their lease expires, then return"
                      if call.held else "")
            raise ConnectionFailed(
                f"{where}: gave up reconnecting to {mask_url(url)} after {self.total:g} s ({reason}){leased}"
            ) from None
        self.attempt += 1
        return min(pause, remaining)
