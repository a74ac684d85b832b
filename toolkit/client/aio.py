"""The asyncio clients: AsyncQueue (reliable) and one per other kind, opened by open_async_queue.

>>> queue = await open_async_queue("postgresql://app@db/app", "orders")   # the kind's client
>>> await queue.enqueue(b'{"order": 42}')
>>> async with queue.processing(10) as batch:     # acks on success, nacks on exception
...     for message in batch: await handle(message)
>>> await queue.consume(handle)                  # the async worker loop (queuectl.asyncworker)

Same calls, arguments, return values, errors and reconnect rules as the blocking clients
(queuectl.client.Queue and queuectl.client.kinds), because both run the same calls, built
without I/O (queuectl.client.calls, KindCalls): only the sending differs. Each call is one
statement (the same section of sql/postgresql/<kind>.sql) on the client's own psycopg
AsyncConnection in autocommit mode, sent straight to the driver as the blocking clients
do; reading the registry, counts() and the upkeep calls (watermark, ring repair) go
through SQLAlchemy's asyncio engine on that same connection. Inside `transaction()` the
client's calls and the caller's own statements share one transaction (a business row and
its task commit together).

PostgreSQL only: SQL Server's driver (pyodbc) has no asyncio connection, and opening an
asyncio client there is a one-line UsageError. A client runs one statement at a time (its
connection's lock serialises tasks that share it): open one per task that needs its own pace.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from queuectl.catalog import QueueInfo
from queuectl.client.calls import RELIABLE_CALLS, Call, Reconnecting, ReliableCalls, T, refusal
from queuectl.defaults import RETRY_TOTAL_S
from queuectl.client.kinds import (
    RING_PUSH_TIMEOUT, RING_REPAIR_GRACE, SUB_LEASE, KindCalls, PendingCalls, ReleasedClaim, RingCalls, RingRepair,
    SubscriptionCalls, SubscriptionInfo, WatermarkCalls, WatermarkCorrection,
)
from queuectl.client.reliable import client_worker_name
from queuectl.engine import adapter_for, make_async_engine
from queuectl.engine.urls import error_text, mask_url
from queuectl.errors import ConnectionFailed, UsageError
from queuectl.kindspec import kind_template_values
from queuectl.messages import Item, Message
from queuectl.names import DEFAULT_SCHEMA, QueueNames
from queuectl.registry import require_queue
from queuectl.sqlfiles import render
from queuectl.stats import queue_counts

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from queuectl.asyncworker import AsyncHandler, AsyncWorkerStats

__all__ = [
    "AsyncFifoQueue", "AsyncHeapQueue", "AsyncKindQueue", "AsyncPendingQueue", "AsyncQueue", "AsyncRingQueue",
    "AsyncStackQueue", "AsyncSubscription", "AsyncWatermarkQueue", "open_async_queue",
]


class _AsyncClient:
    """What every asyncio client shares: its engine and connection, the run of one call
    (with the blocking Queue's reconnect rules), counts(), transaction(), close()."""

    kind = ""
    _calls: tuple[str, ...] = ()
    _hot_calls: tuple[str, ...] = ()

    def __init__(self, engine: AsyncEngine, name: str, *, schema: str = DEFAULT_SCHEMA, info: QueueInfo,
                 owns_engine: bool = False) -> None:
        """Not connected yet: use `await open_async_queue(...)` or `await AsyncQueue.open(...)`."""
        self.names = QueueNames(name, schema)
        self.engine = engine
        self.info = info
        self._owns_engine = owns_engine
        self._adapter = adapter_for(engine.sync_engine)
        self._adapter.check_asyncio()
        if info.kind != self.kind:
            raise UsageError(f"queue {name!r} is of kind {info.kind!r}, not {self.kind!r}: use open_async_queue()")
        values: dict[str, str | int] = {**self.names.template_values(), **kind_template_values(self.names, self.kind)}
        calls, hot_calls = self._statement_keys()
        self._clauses = {key: sa.text(render(self._adapter.sql_dir, self.kind, key, values)) for key in calls}
        self._hot = {key: self._adapter.async_client_statement(engine.sync_engine, self._clauses[key])
                     for key in hot_calls}
        self._conn: AsyncConnection | None = None
        self._driver: Any = None  # psycopg's AsyncConnection under self._conn
        self._tx_owner: asyncio.Task[Any] | None = None  # the task inside transaction()
        self._tx_lock = asyncio.Lock()
        self.retry_total = RETRY_TOTAL_S
        self.reconnects = 0

    @property
    def name(self) -> str:
        return self.names.queue

    def _statement_keys(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The sections this client renders, and those it sends straight to the driver
        (KindCalls._statement_keys for the other kinds)."""
        return self._calls, self._hot_calls

    @property
    def backend_pid(self) -> int | None:
        """The server process serving this client's session (None while disconnected)."""
        return None if self._driver is None else int(self._driver.info.backend_pid)

    # -- the connection ---------------------------------------------------------------

    async def _connect(self, conn: AsyncConnection | None = None) -> None:
        """Take `conn` (open_async_queue's, which read the registry) or open a new one."""
        conn = conn or await _autocommit_connection(self.engine)
        try:
            raw = await conn.get_raw_connection()
        except BaseException:
            await conn.close()
            raise
        self._conn, self._driver = conn, raw.driver_connection

    async def _drop_connection(self) -> None:
        """Invalidate and close a connection that may be broken, so the pool never hands it out again."""
        conn, self._conn, self._driver = self._conn, None, None
        if conn is None:
            return
        try:
            await conn.invalidate()
            await conn.close()
        except sa.exc.SQLAlchemyError:
            pass

    async def _send(self, call: Call[Any]) -> Any:
        hot = self._hot.get(call.key)
        if hot is not None:
            return await hot.run(self._driver, call.params)
        assert self._conn is not None
        return await self._conn.execute(self._clauses[call.key], call.params)

    async def _run(self, call: Call[T]) -> T:
        """Run one call's statement; on a lost connection reconnect and, when the call allows
        it, send it again: queuectl.client.Queue._call's rules, in the same words. Inside
        transaction() nothing is sent again: the transaction died with its connection."""
        if call.params is None:
            return call.empty  # type: ignore[return-value]  # the empty result of its kind
        await self._outside_others_transaction()
        retry: Reconnecting | None = None
        while True:
            sent = False
            try:
                if self._driver is None:
                    await self._connect()
                sent = True
                return call.fetch(await self._send(call))
            except sa.exc.DBAPIError as exc:
                lost = exc.connection_invalidated or (not sent and isinstance(exc, sa.exc.OperationalError))
                reason = error_text(exc, self.engine.url)
                if not lost:
                    refused = refusal(self._adapter, call, self.name, exc, reason)
                    if refused is exc:
                        raise
                    raise refused from None
                await self._drop_connection()
                if self._tx_owner is not None:
                    raise ConnectionFailed(
                        f"{call.key} on queue {self.name!r}: connection to {mask_url(self.engine.url)} lost inside "
                        f"transaction(); the server rolled the transaction back ({reason})"
                    ) from None
                retry = retry or Reconnecting(self.retry_total)
                pause = retry.pause_after(call, sent, self.name, self.engine.url, reason)
                self.reconnects += 1
                await asyncio.sleep(pause)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        """One transaction around the block: the client's calls in it, and the caller's own
        statements on the psycopg AsyncConnection it yields, commit together when the block
        ends and roll back together when it raises. Other tasks that use this client
        meanwhile wait for the block to end (their calls do not join its transaction).

        >>> async with queue.transaction() as conn:
        ...     await conn.execute("INSERT INTO orders (id) VALUES (%s)", (42,))
        ...     await queue.enqueue(b'{"order": 42}')
        """
        if self._tx_owner is not None and self._tx_owner is asyncio.current_task():
            raise UsageError("transaction() blocks do not nest")
        async with self._tx_lock:
            if self._driver is None:
                await self._connect()
            self._tx_owner = asyncio.current_task()
            try:
                async with self._driver.transaction():
                    yield self._driver
            finally:
                self._tx_owner = None

    async def _outside_others_transaction(self) -> None:
        """Wait while another task is inside transaction(): its statements, not ours, belong there."""
        while self._tx_owner is not None and self._tx_owner is not asyncio.current_task():
            async with self._tx_lock:
                pass

    # -- looking ---------------------------------------------------------------------

    async def counts(self) -> dict[str, int]:
        """Items by status, as the blocking clients' counts()."""
        await self._outside_others_transaction()
        if self._conn is None:
            await self._connect()
        assert self._conn is not None
        return await self._conn.run_sync(queue_counts, self.name, self.kind, self.names.schema,
                                         fanout=getattr(self, "fanout", None))

    async def close(self) -> None:
        await self._close_connection()
        if self._owns_engine:
            await self.engine.dispose()

    async def _close_connection(self) -> None:
        conn, self._conn, self._driver = self._conn, None, None
        if conn is not None:
            await conn.close()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _autocommit_connection(engine: AsyncEngine) -> AsyncConnection:
    conn = await engine.connect()
    try:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
    except BaseException:
        await conn.close()
        raise
    return conn


class AsyncQueue(_AsyncClient):
    """The reliable queue's asyncio client: queuectl.client.Queue's calls, awaited.

    >>> queue = await AsyncQueue.open("postgresql://app@db/app", "orders")
    >>> await queue.enqueue(b'{"order": 42}', priority=0)
    >>> async with queue.processing(10) as batch:   # acks on success, nacks on exception
    ...     for message in batch: await handle(message)
    """

    kind = "reliable"
    _calls = RELIABLE_CALLS
    _hot_calls = RELIABLE_CALLS

    def __init__(self, engine: AsyncEngine, name: str, *, schema: str = DEFAULT_SCHEMA, info: QueueInfo,
                 worker: str | None = None, owns_engine: bool = False) -> None:
        if info.kind != "reliable":
            raise UsageError(f"queue {name!r} is of kind {info.kind!r}; AsyncQueue speaks 'reliable': "
                             f"use open_async_queue()")
        super().__init__(engine, name, schema=schema, info=info, owns_engine=owns_engine)
        self.worker = client_worker_name(worker)
        self._reliable = ReliableCalls(self._adapter, self.names.queue, self.worker, info)

    @classmethod
    async def open(cls, url_or_engine: str | AsyncEngine | None, name: str, *, schema: str = DEFAULT_SCHEMA,
                   worker: str | None = None) -> AsyncQueue:
        """A connected client on reliable queue `name` (url: as make_engine's; None: $QUEUECTL_URL
        or the embedded server)."""
        return await _open(url_or_engine, name, schema, worker, reliable_only=True)  # type: ignore[return-value]

    async def enqueue(
        self,
        payload: bytes | str,
        *,
        headers: dict[str, Any] | None = None,
        priority: int = 0,
        delay: float = 0.0,
        title: str | None = None,
        max_attempts: int | None = None,
    ) -> int:
        """Add one item; returns its id (Queue.enqueue)."""
        return await self._run(self._reliable.enqueue(payload, headers, priority, delay, title, max_attempts))

    async def enqueue_many(
        self,
        payloads: Iterable[bytes | str],
        *,
        headers: Sequence[dict[str, Any] | None] | None = None,
        priority: int | Sequence[int] = 0,
        delay: float | Sequence[float] = 0.0,
        title: str | None | Sequence[str | None] = None,
        max_attempts: int | None = None,
    ) -> list[int]:
        """Add many items in one statement; returns their ids in order (Queue.enqueue_many)."""
        return await self._run(self._reliable.enqueue_many(payloads, headers, priority, delay, title, max_attempts))

    async def dequeue(self, n: int = 1, *, lease: float | None = None) -> list[Message]:
        """Claim up to n due items for `lease` seconds (default: the queue's setting)."""
        return await self._run(self._reliable.dequeue(n, lease))

    async def ack(self, items: Iterable[int | Message]) -> int:
        """Mark items done; returns how many this client still held."""
        return await self._run(self._reliable.ack(items))

    async def nack(self, items: Iterable[int | Message], error: str | BaseException | None = None, *,
                   base_delay: float | None = None, max_delay: float | None = None) -> dict[int, str]:
        """Record a failed attempt (Queue.nack); returns {id: new status} for the items still held."""
        return await self._run(self._reliable.nack(items, error, base_delay, max_delay))

    async def extend_lease(self, items: Iterable[int | Message], lease: float | None = None) -> list[int]:
        """Push the lease of held items forward (a heartbeat); returns the ids still held."""
        return await self._run(self._reliable.extend_lease(items, lease))

    async def release(self, items: Iterable[int | Message]) -> int:
        """Give held items back untouched, without using up an attempt."""
        return await self._run(self._reliable.release(items))

    async def ack_and_dequeue(self, done: Iterable[int | Message], n: int = 1, *,
                              lease: float | None = None) -> list[Message]:
        """Ack `done` and claim up to n more in one statement (Queue.ack_and_dequeue)."""
        return await self._run(self._reliable.ack_and_dequeue(done, n, lease))

    @asynccontextmanager
    async def processing(self, n: int = 1, *, lease: float | None = None) -> AsyncIterator[list[Message]]:
        """Dequeue a batch; ack it all if the block succeeds, nack it all with the error if not."""
        batch = await self.dequeue(n, lease=lease)
        try:
            yield batch
        except BaseException as exc:
            if batch:
                await self.nack(batch, exc)
            raise
        else:
            await self.ack(batch)

    async def consume(self, handler: AsyncHandler, **options: Any) -> AsyncWorkerStats:
        """Run `await handler(message)` on every item as it arrives, until SIGTERM/SIGINT or
        stop(): acks on success, nacks with the error on exception, extends leases of slow
        handlers, wakes on the queue's notifications. Options and the rules:
        queuectl.asyncworker.AsyncWorker."""
        from queuectl.asyncworker import AsyncWorker

        return await AsyncWorker(self, handler, **options).run()


class AsyncKindQueue(KindCalls, _AsyncClient):
    """The asyncio client of the heap, fifo, stack, pending, watermark and ring kinds: the
    blocking KindQueue's calls, awaited. Dequeue deletes what it returns; processing()
    takes a batch inside a transaction that rolls back (the items are back) if the block raises."""

    async def enqueue(
        self,
        payload: bytes | str,
        *,
        headers: dict[str, Any] | None = None,
        priority: int = 0,
        delay: float = 0.0,
        title: str | None = None,
        due_at: datetime | None = None,
    ) -> int:
        """Add one item; returns its id (KindQueue.enqueue)."""
        return await self._run(self._enqueue_call(payload, headers, priority, delay, title, due_at))

    async def enqueue_many(self, payloads: Iterable[bytes | str], *,
                           headers: Sequence[dict[str, Any] | None] | None = None) -> list[int]:
        """Add many items in one statement; returns their ids in the same order."""
        return await self._run(self._enqueue_many_call(payloads, headers))

    async def dequeue(self, n: int = 1) -> list[Item]:
        """Take up to n items out of the queue (they are deleted: there is no ack)."""
        return await self._run(self._dequeue_call(n))

    @asynccontextmanager
    async def processing(self, n: int = 1, **dequeue_options: Any) -> AsyncIterator[list[Item]]:
        """Dequeue a batch in a transaction: committed if the block succeeds, rolled back (the
        items are back in the queue) if it raises."""
        async with self.transaction():
            yield await self.dequeue(n, **dequeue_options)


class AsyncHeapQueue(AsyncKindQueue):
    """No order promised."""

    kind = "heap"


class AsyncFifoQueue(AsyncKindQueue):
    """Oldest first (lax or strict, as installed)."""

    kind = "fifo"


class AsyncStackQueue(AsyncKindQueue):
    """Newest first (LIFO)."""

    kind = "stack"


class AsyncPendingQueue(PendingCalls, AsyncKindQueue):
    """Items become ready at their due time; earliest due first."""

    async def enqueue_many(
        self,
        payloads: Iterable[bytes | str],
        *,
        headers: Sequence[dict[str, Any] | None] | None = None,
        due_at: Sequence[datetime | None] | None = None,
        delay: float | Sequence[float] = 0.0,
    ) -> list[int]:
        """Add many items in one statement, each due at its due_at or after its delay."""
        return await self._run(self._enqueue_many_call(payloads, headers, due_at, delay))


class AsyncWatermarkQueue(WatermarkCalls, AsyncKindQueue):
    """A FIFO whose dequeue scans from a low watermark kept in this client's session."""

    async def correct_watermark(self) -> WatermarkCorrection:
        """Recompute the true low bound and fix the stored watermark."""
        return await self._run(self._correct_watermark_call())

    async def stored_watermark(self) -> dict[str, Any]:
        """The stored hint: low, epoch, updated_at, corrected_at."""
        return await self._run(self._stored_watermark_call())


class AsyncRingQueue(RingCalls, AsyncKindQueue):
    """The ring buffer's asyncio client (queuectl.client.RingQueue's rules): close() gives up
    this client's claims and keeps what became of them in `released`. A fan-out ring's
    enqueue and enqueue_many publish to its subscriptions; its consumers take messages
    through subscription(name), and its plain dequeue is refused."""

    def __init__(self, engine: AsyncEngine, name: str, *, schema: str = DEFAULT_SCHEMA, info: QueueInfo,
                 owns_engine: bool = False) -> None:
        self.released: list[ReleasedClaim] = []
        self._subscriptions: dict[str, AsyncSubscription] = {}
        super().__init__(engine, name, schema=schema, info=info, owns_engine=owns_engine)

    async def subscribe(self, name: str, *, lag_limit: int | None = None,
                        drop_when_behind: bool | None = None) -> SubscriptionInfo:
        """Add subscription `name` online (RingQueue.subscribe)."""
        return await self._run(self._subscribe_call(name, lag_limit, drop_when_behind))

    async def unsubscribe(self, name: str) -> bool:
        """Remove subscription `name`; False if none (RingQueue.unsubscribe)."""
        return await self._run(self._unsubscribe_call(name))

    async def subscriptions(self) -> list[SubscriptionInfo]:
        """The ring's subscriptions, with their lag and claims."""
        return await self._run(self._subscriptions_call())

    def subscription(self, name: str) -> AsyncSubscription:
        """This client's consumer of subscription `name`, one per name (RingQueue.subscription)."""
        self._require_fanout()
        return self._subscriptions.setdefault(name, AsyncSubscription(self, name))

    async def enqueue(
        self,
        payload: bytes | str,
        *,
        headers: dict[str, Any] | None = None,
        timeout: float = RING_PUSH_TIMEOUT,
        priority: int = 0,
        delay: float = 0.0,
        title: str | None = None,
        due_at: datetime | None = None,
    ) -> int:
        """Push one message; returns its id (its position). QueueFullError when full."""
        return await self._run(self._enqueue_call(payload, headers, priority, delay, title, due_at, timeout))

    async def enqueue_many(
        self,
        payloads: Iterable[bytes | str],
        *,
        headers: Sequence[dict[str, Any] | None] | None = None,
        timeout: float = RING_PUSH_TIMEOUT,
    ) -> list[int]:
        """Push many messages in one statement; QueueFullError (with .enqueued) if not all fit."""
        return await self._run(self._enqueue_many_call(payloads, headers, timeout))

    async def dequeue(self, n: int = 1, *, timeout: float = 0.0) -> list[Item]:
        """Pop up to n messages in position order, waiting up to `timeout` s for the first."""
        return await self._run(self._dequeue_call(n, timeout))

    async def repair(self, *, grace: float = RING_REPAIR_GRACE, timeout: float = RING_PUSH_TIMEOUT) -> RingRepair:
        """Run the recovery path (RingQueue.repair)."""
        return await self._run(self._repair_call(grace, timeout))

    async def release(self) -> list[ReleasedClaim]:
        """Give up this session's kept claims (RingQueue.release)."""
        return await self._run(self._release_call())

    async def close(self) -> None:
        """Release this client's claims (kept in `released`), then close its connection."""
        try:
            if self._driver is not None and not self._driver.closed:
                self.released = await self.release()
        finally:
            await super().close()


class AsyncSubscription(SubscriptionCalls):
    """One consumer's handle on a subscription of a fan-out ring (AsyncRingQueue.subscription):
    queuectl.client.Subscription's calls and rules, awaited."""

    def __init__(self, queue: AsyncRingQueue, name: str) -> None:
        super().__init__(queue, name)
        self.queue = queue

    async def dequeue(self, n: int = 1, *, lease: float = SUB_LEASE, timeout: float = 0.0) -> list[Item]:
        """Claim up to n messages for `lease` seconds, waiting up to `timeout` s for the first."""
        return await self.queue._run(self._take_call(n, lease, timeout))

    async def ack(self, items: Iterable[Item | int]) -> list[int]:
        """Acknowledge claimed messages; returns the ids acknowledged (Subscription.ack)."""
        return await self.queue._run(self._settle_call("sub_done", items))

    async def nack(self, items: Iterable[Item | int]) -> list[int]:
        """Give claimed messages back to the subscription at once; returns the ids given back."""
        return await self.queue._run(self._settle_call("sub_return", items))


ASYNC_CLIENTS: dict[str, type[_AsyncClient]] = {
    cls.kind: cls
    for cls in (AsyncQueue, AsyncHeapQueue, AsyncFifoQueue, AsyncStackQueue, AsyncPendingQueue, AsyncWatermarkQueue,
                AsyncRingQueue)
}


async def open_async_queue(url_or_engine: str | AsyncEngine | None, name: str, *, schema: str = DEFAULT_SCHEMA,
                           worker: str | None = None) -> AsyncQueue | AsyncKindQueue:
    """The connected asyncio client for an installed queue, whatever its kind (AsyncQueue for
    reliable queues): the asyncio form of queuectl.client.open_queue. `url_or_engine`: a URL
    (None: $QUEUECTL_URL or the embedded server) or an engine from make_async_engine, which
    the client then leaves open at close(). `worker` names a reliable client's leases."""
    return await _open(url_or_engine, name, schema, worker, reliable_only=False)  # type: ignore[return-value]


async def _open(url_or_engine: str | AsyncEngine | None, name: str, schema: str, worker: str | None, *,
                reliable_only: bool) -> _AsyncClient:
    owns_engine = url_or_engine is None or isinstance(url_or_engine, str)
    engine = url_or_engine if not (url_or_engine is None or isinstance(url_or_engine, str)) \
        else make_async_engine(url_or_engine)
    conn = None
    try:
        try:
            conn = await _autocommit_connection(engine)
        except sa.exc.DBAPIError as exc:
            raise ConnectionFailed(f"cannot connect to {mask_url(engine.url)}: {error_text(exc, engine.url)}") from None
        info = await conn.run_sync(require_queue, name, schema)
        cls = AsyncQueue if reliable_only else ASYNC_CLIENTS.get(info.kind)
        if cls is None:
            raise UsageError(f"queue {name!r} has kind {info.kind!r}, which this version of queuectl does not know")
        client = (AsyncQueue(engine, name, schema=schema, info=info, worker=worker, owns_engine=owns_engine)
                  if cls is AsyncQueue else cls(engine, name, schema=schema, info=info, owns_engine=owns_engine))
        await client._connect(conn)
        return client
    except BaseException:
        if conn is not None:
            await conn.close()
        if owns_engine:
            await engine.dispose()
        raise
