"""The Python client: a thin layer over the queue's SQL API in the database.

Each call is one statement on one autocommit connection (a dequeue claims its whole batch
in one round trip). A Queue object is meant for one thread; open one per thread/process.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from queuectl.catalog import QueueInfo
from queuectl.client.calls import (
    RELIABLE_CALLS, Call, EnqueueOutcomeUnknown, T, Reconnecting, ReliableCalls, refusal,
)
from queuectl.defaults import RETRY_TOTAL_S
from queuectl.engine import adapter_for, discard_connection, make_engine
from queuectl.engine.urls import error_text
from queuectl.errors import UsageError
from queuectl.messages import Message
from queuectl.names import DEFAULT_SCHEMA, QueueNames
from queuectl.registry import require_queue
from queuectl.sqlfiles import render
from queuectl.stats import queue_counts
from queuectl.storable import stored_text

__all__ = ["EnqueueOutcomeUnknown", "Queue", "client_worker_name"]


def client_worker_name(worker: str | None) -> str:
    """The name a client's leases carry: the caller's, or host:pid:random."""
    return stored_text(worker, "worker") or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


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
        self.worker = client_worker_name(worker)
        self._owns_engine = not isinstance(url_or_engine, Engine)
        self.engine = url_or_engine if isinstance(url_or_engine, Engine) else make_engine(url_or_engine, pool_size=1)
        self.retry_total = RETRY_TOTAL_S
        self.reconnects = 0
        self._conn: sa.Connection | None = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        self.info: QueueInfo = info or require_queue(self._conn, name, schema)
        if self.info.kind != "reliable":
            raise UsageError(f"queue {name!r} is of kind {self.info.kind!r}; Queue speaks 'reliable': "
                             f"use queuectl.open_queue(url, {name!r}), which opens the client of any kind")
        self._adapter = adapter_for(self.engine)
        self._calls = ReliableCalls(self._adapter, self.names.queue, self.worker, self.info)
        self._sql = self._statements(self._adapter.sql_dir)

    def _statements(self, engine_dir: str) -> dict[str, Callable[[sa.Connection, dict[str, Any]], Any]]:
        # All at once: whether they run on the driver connection is decided when the
        # client is created (Adapter.client_statement), not at a call's first use.
        return {key: self._statement(engine_dir, key) for key in RELIABLE_CALLS}

    def _statement(self, engine_dir: str, key: str) -> Callable[[sa.Connection, dict[str, Any]], Any]:
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
        return self._call(self._calls.enqueue(payload, headers, priority, delay, title, max_attempts))

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
        return self._call(self._calls.enqueue_many(payloads, headers, priority, delay, title, max_attempts))

    # -- consuming -------------------------------------------------------------------

    def dequeue(self, n: int = 1, *, lease: float | None = None) -> list[Message]:
        """Claim up to n due items for `lease` seconds (default: the queue's setting)."""
        return self._call(self._calls.dequeue(n, lease))

    def ack(self, items: Iterable[int | Message]) -> int:
        """Mark items done; returns how many this client still held (others lost their lease)."""
        return self._call(self._calls.ack(items))

    def nack(
        self,
        items: Iterable[int | Message],
        error: str | BaseException | None = None,
        *,
        base_delay: float | None = None,
        max_delay: float | None = None,
    ) -> dict[int, str]:
        """Record a failed attempt: retried after exponential backoff, or DEAD after max_attempts.

        `error` is diagnostic text, stored whatever it holds (queuectl.storable.diagnostic_text:
        NUL and lone surrogates replaced, cut to 2,000 characters; an exception reads
        "TypeName: message"). Returns {id: new status} for the items this client still held.
        """
        return self._call(self._calls.nack(items, error, base_delay, max_delay))

    def extend_lease(self, items: Iterable[int | Message], lease: float | None = None) -> list[int]:
        """Push the lease of held items forward (a heartbeat); returns the ids still held."""
        return self._call(self._calls.extend_lease(items, lease))

    def release(self, items: Iterable[int | Message]) -> int:
        """Give held items back untouched, without using up an attempt."""
        return self._call(self._calls.release(items))

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
        return self._call(self._calls.ack_and_dequeue(done, n, lease))

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

    def _call(self, call: Call[T]) -> T:
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
        if call.params is None:
            return call.empty  # type: ignore[return-value]  # the empty result of its kind
        retry: Reconnecting | None = None
        while True:
            sent = False
            try:
                conn = self._conn
                if conn is None or conn.invalidated or conn.closed:
                    conn = self._reconnect()
                sent = True
                return call.fetch(self._sql[call.key](conn, call.params))
            except sa.exc.DBAPIError as exc:
                if not self._lost_connection(exc, sent):
                    refused = refusal(self._adapter, call, self.name, exc, self._reason(exc))
                    if refused is exc:
                        raise
                    raise refused from None
                self._drop_connection()
                retry = retry or Reconnecting(self.retry_total)
                pause = retry.pause_after(call, sent, self.name, self.engine.url, self._reason(exc))
                self.reconnects += 1
                time.sleep(pause)

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

    def _reconnect(self) -> sa.Connection:
        self._drop_connection()
        self._conn = conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        return conn

    # -- looking ---------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Items by status: ready, scheduled, processing, done, dead."""
        conn = self._conn if self._conn is not None else self._reconnect()
        return queue_counts(conn, self.name, self.info.kind, self.names.schema)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
