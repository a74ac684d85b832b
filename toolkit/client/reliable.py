"""The Python client: a thin layer over the queue's SQL API in the database.

Each call is one statement on one autocommit connection (a dequeue claims its whole batch
in one round trip). A Queue object is meant for one thread; open one per thread/process.
"""

from __future__ import annotations

import operator
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from queuectl.arguments import (
    check_batch, check_max_attempts, check_priority, check_seconds, headers_list, payload_list, schema_revision_number,
    spread,
)
from queuectl.catalog import QueueInfo
from queuectl.defaults import RETRY_TOTAL_S
from queuectl.engine import adapter_for, backoff_pause, discard_connection, make_engine
from queuectl.engine.urls import error_text, mask_url
from queuectl.errors import ConnectionFailed, PayloadTooLarge, StatementCanceled, UsageError
from queuectl.messages import Message, messages_from
from queuectl.names import DEFAULT_SCHEMA, QueueNames
from queuectl.registry import require_queue
from queuectl.sqlfiles import render
from queuectl.stats import STATUS_NAMES, queue_counts
from queuectl.storable import diagnostic_text, headers_json, payload_bytes, shown, stored_text

MAX_ID = 2**63 - 1  # ids are bigint

# Reconnecting after a lost connection (server restart, pg_terminate_backend, network):
# jittered exponential backoff from RETRY_FIRST_S, each pause at most RETRY_MAX_PAUSE_S,
# giving up with ConnectionFailed once RETRY_TOTAL_S (queuectl.defaults) have passed since the failure.
RETRY_FIRST_S = 0.05
RETRY_MAX_PAUSE_S = 2.0


# Queue.ack_and_dequeue needs the queue's SQL at this reliable revision or later.
ACK_DEQUEUE_REVISION = 4


class EnqueueOutcomeUnknown(ConnectionFailed):
    """The connection broke after an enqueue was sent: it may or may not have committed.

    Never retried by the client (a retry could add the item twice); the caller decides.
    """


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


def _ids(items: Iterable[int | Message]) -> list[int]:
    if isinstance(items, (str, bytes, Message)) or not isinstance(items, Iterable):
        raise UsageError(f"items must be a list of Messages or item ids, not {type(items).__name__}")
    return [_item_id(item) for item in items]


def _item_id(item: int | Message) -> int:
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


class Queue:
    """A handle on one installed queue.

    >>> q = Queue("postgresql://app@db/app", "orders")
    >>> q.enqueue(b'{"order": 42}', priority=0)
    >>> with q.processing(10) as batch:        # acks on success, nacks on exception
    ...     for message in batch: handle(message)
    """

    def __init__(
        self,
        url_or_engine: str | Engine | None,
        name: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        worker: str | None = None,
        info: QueueInfo | None = None,
    ) -> None:
        """`info`: the queue's registry entry when the caller has read it already (open_queue)."""
        self.names = QueueNames(name, schema)
        self.worker = stored_text(worker, "worker") or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._owns_engine = not isinstance(url_or_engine, Engine)
        self.engine = url_or_engine if isinstance(url_or_engine, Engine) else make_engine(url_or_engine, pool_size=1)
        self.retry_total = RETRY_TOTAL_S
        self.reconnects = 0
        self._conn: sa.Connection | None = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        self.info: QueueInfo = info or require_queue(self._conn, name, schema)
        if self.info.kind != "reliable":
            raise UsageError(f"queue {name!r} is of kind {self.info.kind!r}; this client speaks 'reliable'")
        self._adapter = adapter_for(self.engine)
        self._sql = self._statements(self._adapter.sql_dir)

    def _statements(self, engine_dir: str) -> dict[str, Callable[[sa.Connection, dict], Any]]:
        # All at once: whether they run on the driver connection is decided when the
        # client is created (Adapter.client_statement), not at a call's first use.
        wanted = ("enqueue", "enqueue_many", "dequeue", "ack", "nack", "extend_lease", "release", "ack_dequeue")
        return {key: self._statement(engine_dir, key) for key in wanted}

    def _statement(self, engine_dir: str, key: str) -> Callable[[sa.Connection, dict], Any]:
        return self._adapter.client_statement(self.engine, self._clause(engine_dir, key))

    def _clause(self, engine_dir: str, key: str) -> sa.TextClause:
        return sa.text(render(engine_dir, self.info.kind, key, self.names.template_values()))

    @property
    def name(self) -> str:
        return self.names.queue

    # -- producing -------------------------------------------------------------------

    def enqueue(
        self,
        payload: bytes | str,
        *,
        headers: dict[str, Any] | None = None,
        priority: int = 0,
        delay: float = 0.0,
        title: str | None = None,
        max_attempts: int | None = None,
    ) -> int:
        """Add one item; returns its id. Lower priority numbers are dequeued first.

        Payload, title and headers together count against the queue's max_payload_bytes.
        Every argument is checked before anything is sent (UsageError, one line; text rules:
        queuectl.storable)."""
        params = {
            "payload": payload_bytes(payload),
            "headers": headers_json(headers),
            "priority": check_priority(priority),
            "delay": check_seconds(delay, "delay"),
            "title": stored_text(title, "title"),
            "max_attempts": check_max_attempts(max_attempts),
        }
        return self._call("enqueue", params, lambda r: r.scalar_one(), resend=False)

    def enqueue_many(
        self,
        payloads: Iterable[bytes | str],
        *,
        headers: Sequence[dict[str, Any] | None] | None = None,
        priority: int | Sequence[int] = 0,
        delay: float | Sequence[float] = 0.0,
        title: str | None | Sequence[str | None] = None,
        max_attempts: int | None = None,
    ) -> list[int]:
        """Add many items in one statement; returns their ids in the same order.

        headers: None or one entry per payload; priority, delay and title: one value for all
        or a list of one per payload. Checked like enqueue()'s, all before anything is sent."""
        items = payload_list(payloads)
        max_attempts = check_max_attempts(max_attempts)
        if not items:
            return []
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
        params = self._adapter.enqueue_many_params(rows, max_attempts)
        return self._call("enqueue_many", params, lambda r: list(r.scalars()), resend=False)

    # -- consuming -------------------------------------------------------------------

    def dequeue(self, n: int = 1, *, lease: float | None = None) -> list[Message]:
        """Claim up to n due items for `lease` seconds (default: the queue's setting)."""
        params = {
            "batch": check_batch(n),
            "lease_seconds": check_seconds(lease, "lease", low=0.001),
            "worker": self.worker,
        }
        return self._call("dequeue", params, self._messages)

    def _messages(self, result: Any) -> list[Message]:
        return messages_from(result, self._adapter.json_value)

    def ack(self, items: Iterable[int | Message]) -> int:
        """Mark items done; returns how many this client still held (others lost their lease)."""
        ids = _ids(items)
        if not ids:
            return 0
        params = {"ids": self._adapter.id_array(ids), "worker": self.worker}
        return self._call("ack", params, lambda r: r.scalar_one(), held=len(ids))

    def nack(
        self,
        items: Iterable[int | Message],
        error: str | None = None,
        *,
        base_delay: float | None = None,
        max_delay: float | None = None,
    ) -> dict[int, str]:
        """Record a failed attempt: retried after exponential backoff, or DEAD after max_attempts.

        `error` is diagnostic text, stored whatever it holds (queuectl.storable.diagnostic_text:
        NUL and lone surrogates replaced, cut to 2,000 characters; an exception reads
        "TypeName: message"). Returns {id: new status} for the items this client still held.
        """
        ids = _ids(items)
        if not ids:
            return {}
        params = {
            "ids": self._adapter.id_array(ids),
            "error": diagnostic_text(error),
            "worker": self.worker,
            "base_seconds": check_seconds(base_delay, "base delay"),
            "max_seconds": check_seconds(max_delay, "max delay"),
        }
        return self._call("nack", params, _new_statuses, held=len(ids))

    def extend_lease(self, items: Iterable[int | Message], lease: float | None = None) -> list[int]:
        """Push the lease of held items forward (a heartbeat); returns the ids still held."""
        ids = _ids(items)
        if not ids:
            return []
        params = {"ids": self._adapter.id_array(ids), "lease_seconds": check_seconds(lease, "lease", low=0.001), "worker": self.worker}
        return self._call("extend_lease", params, _column("id"), held=len(ids))

    def release(self, items: Iterable[int | Message]) -> int:
        """Give held items back untouched, without using up an attempt."""
        ids = _ids(items)
        if not ids:
            return 0
        params = {"ids": self._adapter.id_array(ids), "worker": self.worker}
        return self._call("release", params, lambda r: r.scalar_one(), held=len(ids))

    def ack_and_dequeue(
        self, done: Iterable[int | Message], n: int = 1, *, lease: float | None = None
    ) -> list[Message]:
        """Ack `done` and claim up to n more, in one call and one transaction (reliable_0004).

        A consumer loop's ack and its next dequeue cost one round trip and one commit
        instead of two. Returns the new batch only; use ack() when you need to know how
        many of `done` this client still held. Resent after a lost connection like ack
        and dequeue (the ack touches only items this worker holds; a lost claim's items
        come back when their lease expires).
        """
        if schema_revision_number(self.info.schema_version) < ACK_DEQUEUE_REVISION:
            raise UsageError(
                f"queue {self.name!r} is at {self.info.schema_version}; ack_and_dequeue needs "
                f"reliable_{ACK_DEQUEUE_REVISION:04d}: run `queuectl upgrade {self.name}`"
            )
        ids = _ids(done)
        params = {
            "ack_ids": self._adapter.id_array(ids),
            "batch": check_batch(n),
            "lease_seconds": check_seconds(lease, "lease", low=0.001),
            "worker": self.worker,
        }
        return self._call("ack_dequeue", params, self._messages, held=len(ids))

    @contextmanager
    def processing(self, n: int = 1, *, lease: float | None = None) -> Iterator[list[Message]]:
        """Dequeue a batch; ack it all if the block succeeds, nack it all with the error if not."""
        batch = self.dequeue(n, lease=lease)
        try:
            yield batch
        except BaseException as exc:
            if batch:
                self.nack(batch, exc)
            raise
        else:
            self.ack(batch)

    def consume(
        self,
        handler: Any,
        *,
        concurrency: int = 1,
        batch: int = 10,
        lease: float | None = None,
        poll_interval: float = 2.0,
        **options: Any,
    ) -> Any:
        """Run handler(message) on every item as it arrives, until SIGTERM/SIGINT or stop.

        Acks on success, nacks with the error on exception, extends leases of slow handlers;
        wakes on the queue's notifications, polls at most every poll_interval seconds.
        Returns the WorkerStats; further options and the design: queuectl.worker.Worker.
        """
        from queuectl.worker import Worker

        worker = Worker(self, handler, concurrency=concurrency, batch=batch, lease=lease,
                        poll_interval=poll_interval, **options)
        return worker.run()

    # -- surviving a lost connection -------------------------------------------------------

    def _call(self, key: str, params: dict[str, Any], fetch: Any, *, resend: bool = True, held: int = 0) -> Any:
        """Run one statement; on a lost connection reconnect and (when safe) send it again.

        Resending is safe for dequeue (a batch claimed by a lost call comes back when its
        lease expires) and for ack/nack/extend_lease/release (they only touch items this
        worker still holds, so a second run after a first one that committed changes
        nothing). An enqueue is resent only when the failure happened while (re)connecting,
        i.e. before the statement left this process: once it was handed to the connection,
        a broken connection cannot tell whether the autocommit INSERT committed, so the
        client raises EnqueueOutcomeUnknown instead of risking a duplicate.

        Errors on a live connection are not retried: an oversized payload raises
        PayloadTooLarge, a statement the server canceled (a timeout; it rolled back whole)
        StatementCanceled, both one line; anything else is the driver's error.
        """
        deadline = time.monotonic() + self.retry_total
        attempt = 0
        while True:
            sent = False
            try:
                if self._conn is None or self._conn.invalidated or self._conn.closed:
                    self._reconnect()
                sent = True
                return fetch(self._sql[key](self._conn, params))
            except sa.exc.DBAPIError as exc:
                if not self._lost_connection(exc, sent):
                    refused = self._refused(key, exc)
                    if refused is exc:
                        raise
                    raise refused from None
                self._drop_connection()
                if sent and not resend:
                    raise EnqueueOutcomeUnknown(
                        f"{key} on queue {self.name!r}: connection to {mask_url(self.engine.url)} lost after "
                        f"the statement was sent; it may or may not have committed ({self._reason(exc)})"
                    ) from None
                pause = backoff_pause(attempt, RETRY_FIRST_S, RETRY_MAX_PAUSE_S)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    leased = f"; the {held} items it held stay leased until their lease expires, then return" if held else ""
                    raise ConnectionFailed(
                        f"{key} on queue {self.name!r}: gave up reconnecting to {mask_url(self.engine.url)} after "
                        f"{self.retry_total:g} s ({self._reason(exc)}){leased}"
                    ) from None
                attempt += 1
                self.reconnects += 1
                time.sleep(min(pause, remaining))

    def _refused(self, key: str, exc: sa.exc.DBAPIError) -> Exception:
        """What to raise for an error on a live connection: one line for the errors a caller
        acts on (an oversized payload, a canceled statement), else the driver's error."""
        refusal = self._adapter.payload_refusal(exc)
        if refusal is not None:
            return PayloadTooLarge(refusal)
        if self._adapter.canceled(exc):
            undone = {"dequeue": "nothing was claimed", "enqueue": "nothing was enqueued",
                      "enqueue_many": "nothing was enqueued"}.get(key, "the items stay as they were")
            return StatementCanceled(
                f"{key} on queue {self.name!r} was canceled by the server and rolled back "
                f"({self._reason(exc)}): {undone}; sending it again is safe"
            )
        return exc

    def _lost_connection(self, exc: sa.exc.DBAPIError, sent: bool) -> bool:
        if exc.connection_invalidated:
            return True
        if not sent:  # connecting failed: refused, "shutting down", "starting up", ...
            return isinstance(exc, sa.exc.OperationalError)
        return self._conn is not None and (self._conn.invalidated or self._conn.closed)

    def _reason(self, exc: sa.exc.DBAPIError) -> str:
        return error_text(exc, self.engine)

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        discard_connection(conn)

    def _reconnect(self) -> None:
        self._drop_connection()
        self._conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")

    # -- looking ---------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Items by status: ready, scheduled, processing, done, dead."""
        if self._conn is None:
            self._reconnect()
        return queue_counts(self._conn, self.name, self.info.kind, self.names.schema)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> "Queue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
