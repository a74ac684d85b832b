"""Python clients for the destructive queue kinds and the ring, and `open_queue`.

Each client is a thin layer over its queue's SQL API (sql/postgresql/<kind>.sql), with the
reliable Queue's surface where it makes sense: enqueue, enqueue_many, dequeue(n), counts,
close. Dequeue deletes (or, for the ring, empties) what it returns, so there is no ack:
to undo a dequeue, take it inside `processing()`, whose transaction rolls back (and puts
the items back) when the block raises.

Each call is one statement on the client's own connection in autocommit mode, except
inside `processing()`. The watermark and ring kinds keep per-session state in that
connection (the working watermark, the ring's claimed positions): one client per thread
or process, as for Queue.

>>> q = open_queue("postgresql://app@db/app", "events")   # reads the kind from the catalog
>>> q.enqueue_many([b"a", b"b"])
>>> [item.payload for item in q.dequeue(10)]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, NamedTuple, Self

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from queuectl.arguments import (
    check_batch, check_positive_seconds, headers_list, payload_list, per_item, spread,
)
from queuectl.catalog import QueueInfo
from queuectl.client.calls import Call, T
from queuectl.client.reliable import Queue
from queuectl.engine import adapter_for, make_engine
from queuectl.engine.base import Adapter
from queuectl.errors import PayloadTooLarge, QueuectlError, UsageError
from queuectl.kindspec import kind_template_values
from queuectl.messages import Item, items_from
from queuectl.names import DEFAULT_SCHEMA, QueueNames
from queuectl.registry import require_queue
from queuectl.sqlfiles import render
from queuectl.stats import queue_counts
from queuectl.storable import headers_json, payload_bytes

RING_PUSH_TIMEOUT = 1.0  # seconds a push waits for a free slot before reporting the ring full
RING_REPAIR_GRACE = 30.0  # seconds a slot must sit unchanged before ring_repair touches it


SUB_LEASE = 30.0  # seconds a fan-out subscription's consumer holds a message before another may take it
# A fan-out ring's client calls (sections of sql/<engine>/ring.sql since ring_0006): rendered
# for fan-out rings only; the per-message ones are sent straight to the driver.
RING_FANOUT_CALLS = ("publish", "sub_take", "sub_done", "sub_return", "subscribe", "unsubscribe", "subscriptions")
RING_FANOUT_HOT_CALLS = ("publish", "sub_take", "sub_done")


class SubscriptionInfo(NamedTuple):
    """A subscription of a fan-out ring (a row of <queue>_subscriptions()).

    lag: messages pushed that it has not been handed; behind: lag over lag_limit, or
    dropped (dropped_at: when a push dropped it for lagging, with drop_when_behind);
    claimed: handed out and not acknowledged (expired: of those, past their lease)."""

    name: str
    start_pos: int
    next_pos: int | None = None
    lag: int | None = None
    lag_limit: int | None = None
    behind: bool | None = None
    drop_when_behind: bool | None = None
    dropped_at: datetime | None = None
    claimed: int | None = None
    expired: int | None = None
    oldest_claim: int | None = None
    created_at: datetime | None = None


def _subscription_info(row: Any) -> SubscriptionInfo:
    """A row of subscribe or subscriptions (subscribe's has only some of the columns)."""
    return SubscriptionInfo(**{f: row.get(f) for f in SubscriptionInfo._fields})


class QueueFullError(QueuectlError):
    """A ring stayed full for the whole push timeout; `enqueued` holds the ids that got in."""

    def __init__(self, message: str, enqueued: list[int] | None = None) -> None:
        super().__init__(message)
        self.enqueued = enqueued or []


@dataclass(frozen=True)
class WatermarkCorrection:
    """What correct_watermark changed: the stored low watermark before and after. true_low is
    None when the run deferred (SQL Server: its index walk ran out of lock wait)."""

    queue: str
    old_low: int
    new_low: int
    true_low: int | None
    changed: bool
    reason: str


@dataclass(frozen=True)
class RingRepair:
    """What ring_repair did: tombstoned positions, rescued (old, new) ids, deferred ids."""

    queue: str
    tombstoned: list[int]
    rescued: list[tuple[int, int]]
    deferred: list[int]


class ReleasedClaim(NamedTuple):
    """One claim a ring client gave up at release (a row of <queue>_ring_release).

    side: 'push' or 'pop'; item_id: the claimed position; tombstoned: its slot was free for
    it and a tombstone went in. outcome says what became of the position: 'tombstoned';
    'rescued' (a pop claim whose message arrived after the session's last pop: re-pushed at
    once under new_item_id); 'deferred' (that message stayed where it was because the ring
    stayed full: ring_repair rescues it after its grace); 'left' (the slot was not free for
    the claim: whatever arrives there later is ring_repair's). A queue still at ring_0001
    reports only tombstoned: its rows read as 'tombstoned' or 'left'.
    """

    side: str
    item_id: int
    tombstoned: bool
    new_item_id: int | None = None
    outcome: str = "left"


def _is_zero(value: object) -> bool:
    return type(value) in (int, float) and value == 0


HOT_CALLS = ("enqueue", "enqueue_many", "dequeue")


def _scalar(result: Any) -> Any:
    return result.scalar_one()


def _scalars(result: Any) -> list[Any]:
    return list(result.scalars())


class KindCalls:
    """The calls of the heap, fifo, stack, pending, watermark and ring clients, checked and
    built without I/O (queuectl.client.calls.Call): the blocking clients below and the
    asyncio ones (queuectl.client.aio) run the same calls."""

    kind = ""
    _calls: tuple[str, ...] = ("enqueue", "enqueue_many", "dequeue")
    _hot_calls: tuple[str, ...] = HOT_CALLS
    _adapter: Adapter
    names: QueueNames
    info: QueueInfo

    @property
    def name(self) -> str:
        return self.names.queue

    def _statement_keys(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The sections this client renders, and those of them it sends straight to the driver
        (read once the queue's registry entry is known: a fan-out ring has more)."""
        return self._calls, self._hot_calls

    def _refuse_options(self, priority: int, delay: float, title: str | None, due_at: datetime | None) -> None:
        """The reliable queue's options mean nothing here: refuse them rather than drop them
        (anything but their defaults: a zero int or float, None)."""
        if not _is_zero(priority):
            raise UsageError(f"{self.kind} queues have no priorities (priority is for reliable queues)")
        if title is not None:
            raise UsageError(f"{self.kind} queues keep no titles (title is for reliable queues)")
        if not _is_zero(delay) or due_at is not None:
            raise UsageError(f"{self.kind} queues have no due times (use a pending queue)")

    def _enqueue_call(self, payload: bytes | str, headers: dict[str, Any] | None, priority: int, delay: float,
                      title: str | None, due_at: datetime | None) -> Call[int]:
        self._refuse_options(priority, delay, title, due_at)
        return Call("enqueue", {"payload": payload_bytes(payload), "headers": headers_json(headers)}, _scalar,
                    resend=False)

    def _enqueue_many_call(self, payloads: Iterable[bytes | str], headers: Sequence[dict[str, Any] | None] | None,
                           ) -> Call[list[int]]:
        items = payload_list(payloads)
        if not items:
            return Call("enqueue_many", None, _scalars, empty=[])
        params = self._adapter.kind_enqueue_many_params(items, headers_list(headers, len(items)))
        return Call("enqueue_many", params, _scalars, resend=False)

    def _dequeue_call(self, n: int) -> Call[list[Item]]:
        # A destructive dequeue that reached the server may have taken its items: never resent.
        return Call("dequeue", {"batch": check_batch(n)}, self._items, resend=False)

    def _items(self, result: Any) -> list[Item]:
        return items_from(result, self._adapter.json_value)


class KindQueue(KindCalls):
    """Common part of the clients for heap, fifo, stack, pending, watermark and ring queues."""

    def __init__(self, url_or_engine: str | Engine | None, name: str, *, schema: str = DEFAULT_SCHEMA,
                 info: QueueInfo | None = None) -> None:
        """`info`: the queue's registry entry when the caller has read it already."""
        self.names = QueueNames(name, schema)
        self._owns_engine = not isinstance(url_or_engine, Engine)
        self.engine = url_or_engine if isinstance(url_or_engine, Engine) else make_engine(url_or_engine, pool_size=1)
        self._conn: Connection = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        self._in_transaction = False
        try:
            self.info: QueueInfo = info or require_queue(self._conn, name, schema)
            if self.info.kind != self.kind:
                raise UsageError(f"queue {name!r} is of kind {self.info.kind!r}, not {self.kind!r}: use open_queue()")
            values = {**self.names.template_values(), **kind_template_values(self.names, self.kind)}
            self._adapter = adapter_for(self.engine)
            calls, hot_calls = self._statement_keys()
            self._sql = {key: sa.text(render(self._adapter.sql_dir, self.kind, key, values)) for key in calls}
            # The per-message calls run as the reliable client's do (Adapter.client_statement:
            # on psycopg, straight on the driver connection); the upkeep calls keep
            # SQLAlchemy's rows, which their callers read by name.
            self._hot = {key: self._adapter.client_statement(self.engine, self._sql[key]) for key in hot_calls}
        except BaseException:
            self.close()
            raise

    @property
    def backend_pid(self) -> int:
        """The server process serving this client's session (for diagnostics and benches)."""
        dbapi: Any = self._conn.connection.dbapi_connection  # psycopg's, whose info knows it
        return int(dbapi.info.backend_pid)

    def _execute(self, key: str, params: dict[str, Any]) -> Any:
        """The call's result: keys(), all(), scalar_one() and scalars() on every call;
        SQLAlchemy's full CursorResult on the upkeep calls."""
        hot = self._hot.get(key)
        return hot(self._conn, params) if hot is not None else self._conn.execute(self._sql[key], params)

    def _run(self, call: Call[T]) -> T:
        if call.params is None:
            return call.empty  # type: ignore[return-value]  # the empty result of its kind
        try:
            return call.fetch(self._execute(call.key, call.params))
        except sa.exc.DBAPIError as exc:
            # a push over the ring's max_payload_bytes (ring_0007): the server's one line
            refused = self._adapter.payload_refusal(exc)
            if refused is None:
                raise
            raise PayloadTooLarge(refused) from None

    # -- producing -------------------------------------------------------------------

    def enqueue(
        self,
        payload: bytes | str,
        *,
        headers: dict[str, Any] | None = None,
        priority: int = 0,
        delay: float = 0.0,
        title: str | None = None,
        due_at: datetime | None = None,
    ) -> int:
        """Add one item; returns its id. Payload and headers are checked like the reliable
        Queue's (queuectl.storable) before anything is sent; a pending queue's item is due at
        `due_at` (aware datetime) or `delay` seconds from now."""
        return self._run(self._enqueue_call(payload, headers, priority, delay, title, due_at))

    def enqueue_many(
        self, payloads: Iterable[bytes | str], *, headers: Sequence[dict[str, Any] | None] | None = None
    ) -> list[int]:
        """Add many items in one statement; returns their ids in the same order."""
        return self._run(self._enqueue_many_call(payloads, headers))

    # -- consuming -------------------------------------------------------------------

    def dequeue(self, n: int = 1) -> list[Item]:
        """Take up to n items out of the queue (they are deleted: there is no ack)."""
        return self._run(self._dequeue_call(n))

    @contextmanager
    def processing(self, n: int = 1, **dequeue_options: Any) -> Iterator[list[Item]]:
        """Dequeue a batch in a transaction: committed if the block succeeds, rolled back
        (the items are back in the queue) if it raises. On a strict FIFO queue other
        consumers wait meanwhile, so the order holds across the rollback."""
        if self._in_transaction:
            raise UsageError("processing() blocks do not nest")
        self._conn.commit()  # end SQLAlchemy's logical autocommit transaction (no-op on the server)
        self._conn.execution_options(isolation_level="READ COMMITTED")
        self._in_transaction = True
        try:
            with self._conn.begin():
                yield self.dequeue(n, **dequeue_options)
        finally:
            self._in_transaction = False
            if self._conn.in_transaction():
                self._conn.rollback()
            self._conn.execution_options(isolation_level="AUTOCOMMIT")

    # -- looking ---------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Items waiting: 'ready' (and 'scheduled' for pending items not yet due)."""
        # a ring's client knows whether it fans out (RingCalls.fanout); the other kinds have no such thing
        return queue_counts(self._conn, self.name, self.kind, self.names.schema, fanout=getattr(self, "fanout", None))

    def close(self) -> None:
        self._conn.close()
        if self._owns_engine:
            self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HeapQueue(KindQueue):
    """No order promised: dequeue takes whichever unlocked items a scan meets first."""

    kind = "heap"


class FifoQueue(KindQueue):
    """Oldest first. Lax (default): consumers skip each other's rows. Strict: they wait."""

    kind = "fifo"

    @property
    def strict(self) -> bool:
        return bool(self.info.settings.as_dict().get("strict"))


class StackQueue(KindQueue):
    """Newest first (LIFO)."""

    kind = "stack"


class PendingCalls(KindCalls):
    """Items become ready at their due time (the server's clock); earliest due first."""

    kind = "pending"

    def _enqueue_call(self, payload: bytes | str, headers: dict[str, Any] | None, priority: int, delay: float,
                      title: str | None, due_at: datetime | None) -> Call[int]:
        self._refuse_options(priority, 0.0, title, None)
        params = {
            "payload": payload_bytes(payload),
            "headers": headers_json(headers),
            "due_at": _check_due(due_at),
            "delay": check_positive_seconds(delay, "delay"),
        }
        return Call("enqueue", params, _scalar, resend=False)

    def _enqueue_many_call(self, payloads: Iterable[bytes | str], headers: Sequence[dict[str, Any] | None] | None,
                           due_at: Sequence[datetime | None] | None = None,
                           delay: float | Sequence[float] = 0.0) -> Call[list[int]]:
        items = payload_list(payloads)
        if not items:
            return Call("enqueue_many", None, _scalars, empty=[])
        n = len(items)
        params = self._adapter.kind_enqueue_many_params(
            items,
            headers_list(headers, n),
            due_ats=None if due_at is None else [_check_due(d) for d in per_item(due_at, n, "due_at")],
            delays=spread(delay, n, "delay", check_positive_seconds),
        )
        return Call("enqueue_many", params, _scalars, resend=False)


class PendingQueue(PendingCalls, KindQueue):
    """Items become ready at their due time (the server's clock); earliest due first."""

    def enqueue_many(
        self,
        payloads: Iterable[bytes | str],
        *,
        headers: Sequence[dict[str, Any] | None] | None = None,
        due_at: Sequence[datetime | None] | None = None,
        delay: float | Sequence[float] = 0.0,
    ) -> list[int]:
        """Add many items in one statement, each due at its due_at or after its delay."""
        return self._run(self._enqueue_many_call(payloads, headers, due_at, delay))


def _check_due(due_at: datetime | None) -> datetime | None:
    if due_at is None:
        return None
    if not isinstance(due_at, datetime) or due_at.tzinfo is None:
        raise UsageError("due_at must be a timezone-aware datetime (e.g. datetime.now(timezone.utc))")
    return due_at.astimezone(timezone.utc)


class WatermarkCalls(KindCalls):
    """A FIFO whose dequeue scans from a low watermark kept in this client's session."""

    kind = "watermark"
    _calls: tuple[str, ...] = ("enqueue", "enqueue_many", "dequeue", "correct_watermark", "stored_watermark")

    def _correct_watermark_call(self) -> Call[WatermarkCorrection]:
        def correction(result: Any) -> WatermarkCorrection:
            row = result.mappings().one()
            return WatermarkCorrection(self.name, row["old_low"], row["new_low"], row["true_low"], row["changed"],
                                       row["reason"])
        return Call("correct_watermark", {}, correction)

    def _stored_watermark_call(self) -> Call[dict[str, Any]]:
        return Call("stored_watermark", {}, lambda result: dict(result.mappings().one()))


class WatermarkQueue(WatermarkCalls, KindQueue):
    """A FIFO whose dequeue scans from a low watermark kept in this client's session."""

    def correct_watermark(self) -> WatermarkCorrection:
        """Recompute the true low bound and fix the stored watermark (see correct_watermark())."""
        return self._run(self._correct_watermark_call())

    def stored_watermark(self) -> dict[str, Any]:
        """The stored hint: low, epoch, updated_at, corrected_at."""
        return self._run(self._stored_watermark_call())


class RingCalls(KindCalls):
    """The ring's calls, built without I/O (RingQueue's docstring has the ring's rules; a
    fan-out ring's pushes go through publish and its pops through a subscription)."""

    kind = "ring"
    _calls: tuple[str, ...] = ("enqueue", "enqueue_many", "dequeue", "ring_repair", "ring_release")

    @property
    def fanout(self) -> bool:
        """Whether this ring gives every message to each of its subscriptions (install --fanout)."""
        return bool(getattr(self.info.settings, "fanout", False))

    def _statement_keys(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if not self.fanout:
            return self._calls, self._hot_calls
        return self._calls + RING_FANOUT_CALLS, self._hot_calls + RING_FANOUT_HOT_CALLS

    def _require_fanout(self) -> None:
        if not self.fanout:
            raise UsageError(f"ring {self.name!r} does not fan out: install it with --fanout to use subscriptions")

    def _enqueue_call(self, payload: bytes | str, headers: dict[str, Any] | None, priority: int, delay: float,
                      title: str | None, due_at: datetime | None, timeout: float = RING_PUSH_TIMEOUT) -> Call[int]:
        self._refuse_options(priority, delay, title, due_at)
        if self.fanout:
            return self._publish_one_call(payload, headers, timeout)
        wait = check_positive_seconds(timeout, "timeout")
        params = {"payload": payload_bytes(payload), "headers": headers_json(headers), "timeout": wait}

        def pushed(result: Any) -> int:
            item_id = result.scalar_one()
            if item_id is None:
                raise QueueFullError(f"ring {self.name!r} stayed full for {wait:g} s: nothing was enqueued")
            return int(item_id)
        return Call("enqueue", params, pushed, resend=False)

    def _publish_one_call(self, payload: bytes | str, headers: dict[str, Any] | None, timeout: float) -> Call[int]:
        """A fan-out ring's enqueue: a publish of one message (the only push it takes)."""
        many = self._enqueue_many_call([payload], None if headers is None else [headers], timeout)

        def published(result: Any) -> int:
            try:
                return many.fetch(result)[0]
            except QueueFullError as full:
                raise QueueFullError(
                    f"ring {self.name!r} stayed full for {timeout:g} s: nothing was enqueued") from full
        return Call(many.key, many.params, published, resend=False)

    def _enqueue_many_call(self, payloads: Iterable[bytes | str], headers: Sequence[dict[str, Any] | None] | None,
                           timeout: float = RING_PUSH_TIMEOUT) -> Call[list[int]]:
        # A fan-out ring takes its pushes through publish (same claims, same QueueFullError):
        # its plain push refuses, so that no message bypasses the subscriptions.
        key = "publish" if self.fanout else "enqueue_many"
        items = payload_list(payloads)
        if not items:
            return Call(key, None, _scalars, empty=[])
        wait = check_positive_seconds(timeout, "timeout")
        params = {**self._adapter.kind_enqueue_many_params(items, headers_list(headers, len(items))), "timeout": wait}

        def pushed(result: Any) -> list[int]:
            ids = list(result.scalars())
            if len(ids) < len(items):
                raise QueueFullError(
                    f"ring {self.name!r} stayed full for {wait:g} s: {len(ids)} of {len(items)} messages enqueued",
                    ids,
                )
            return ids
        return Call(key, params, pushed, resend=False)

    def _dequeue_call(self, n: int, timeout: float = 0.0) -> Call[list[Item]]:
        params = {"batch": check_batch(n), "timeout": check_positive_seconds(timeout, "timeout")}
        if self.fanout:
            raise UsageError(f"ring {self.name!r} fans out: dequeue through a subscription "
                             f"(queue.subscription(name).dequeue(n))")
        return Call("dequeue", params, self._items, resend=False)

    # -- fan-out: subscriptions (the calls; SubscriptionCalls has a consumer's) --------------

    def _subscribe_call(self, name: str, lag_limit: int | None, drop_when_behind: bool | None,
                        ) -> Call[SubscriptionInfo]:
        self._require_fanout()
        if lag_limit is not None and (isinstance(lag_limit, bool) or not isinstance(lag_limit, int)):
            raise UsageError(f"lag_limit must be a whole number, got {lag_limit!r}")
        params = {"name": name, "lag_limit": lag_limit, "drop_when_behind": drop_when_behind}
        # not sent again after a lost connection: a subscribe that committed would fail as "exists"
        return Call("subscribe", params, lambda result: _subscription_info(result.mappings().one()), resend=False)

    def _unsubscribe_call(self, name: str) -> Call[bool]:
        self._require_fanout()
        # not sent again: a second unsubscribe would report False for one that removed it
        return Call("unsubscribe", {"name": name}, lambda result: bool(result.scalar_one()), resend=False)

    def _subscriptions_call(self) -> Call[list[SubscriptionInfo]]:
        self._require_fanout()
        return Call("subscriptions", {}, lambda result: [_subscription_info(r) for r in result.mappings().all()])

    def _repair_call(self, grace: float, timeout: float) -> Call[RingRepair]:
        params = {"grace": check_positive_seconds(grace, "grace"), "timeout": check_positive_seconds(timeout, "timeout")}

        def repaired(result: Any) -> RingRepair:
            rows = result.all()
            return RingRepair(
                self.name,
                tombstoned=[r.item_id for r in rows if r.action == "tombstone"],
                rescued=[(r.item_id, r.new_item_id) for r in rows if r.action == "rescue"],
                deferred=[r.item_id for r in rows if r.action == "deferred"],
            )
        return Call("ring_repair", params, repaired, resend=False)

    def _release_call(self) -> Call[list[ReleasedClaim]]:
        def released(result: Any) -> list[ReleasedClaim]:
            return [
                ReleasedClaim(
                    r["side"], r["item_id"], bool(r["tombstoned"]), r.get("new_item_id"),
                    r.get("outcome") or ("tombstoned" if r["tombstoned"] else "left"),  # ring_0001: no outcome
                )
                for r in result.mappings().all()
            ]
        return Call("ring_release", {}, released, resend=False)


class RingQueue(RingCalls, KindQueue):
    """A ring buffer of preallocated slots: push and pop update rows, nothing else.

    A push waits up to `timeout` seconds (default 1) for a free slot and raises
    QueueFullError when the ring stays full (its `.enqueued` are the first payloads); it
    keeps the positions it claimed but could not write for the next push, so a full ring
    leaves no hole. A pop waits up to `timeout` seconds (default 0) for the first message
    and keeps the positions it claimed that have no message yet for the next pop. A batch
    claims and writes (or takes) its positions in one statement each (ring_0003), and the
    whole call is one statement when nothing has to wait (ring_0005).

    A popper that dies holding a claimed position (its session ends) or rolls back a
    `processing()` block after taking the message leaves that message FULL at a position
    no pop will ask for again. `repair()` (the SQL function <queue>_ring_repair, for a job
    every few minutes) re-pushes such messages at new positions, so they are delivered
    (once) under a new id; it also tombstones positions claimed by pushers that died, which
    would otherwise stall pops and, one lap later, pushes into the same slot. close()
    gives up this client's claims (a pooled connection must not carry them on) and keeps
    what became of them in `released`: a message that arrived at this client's pop claim
    after its last pop is re-pushed at once (ring_0002), not left for repair().
    """

    def __init__(self, url_or_engine: str | Engine | None, name: str, *, schema: str = DEFAULT_SCHEMA,
                 info: QueueInfo | None = None) -> None:
        self.released: list[ReleasedClaim] = []  # what close() gave up (its release())
        self._subscriptions: dict[str, Subscription] = {}
        super().__init__(url_or_engine, name, schema=schema, info=info)

    # -- fan-out: subscriptions --------------------------------------------------------

    def subscribe(self, name: str, *, lag_limit: int | None = None,
                  drop_when_behind: bool | None = None) -> SubscriptionInfo:
        """Add subscription `name` online: it receives every message pushed from now on.
        lag_limit / drop_when_behind: None takes the ring's install settings."""
        return self._run(self._subscribe_call(name, lag_limit, drop_when_behind))

    def unsubscribe(self, name: str) -> bool:
        """Remove subscription `name` (the producer stops waiting for it); False if none."""
        return self._run(self._unsubscribe_call(name))

    def subscriptions(self) -> list[SubscriptionInfo]:
        """The ring's subscriptions, with their lag and claims."""
        return self._run(self._subscriptions_call())

    def subscription(self, name: str) -> Subscription:
        """This client's consumer of subscription `name` (one per name: it keeps the tokens
        of the claims it holds)."""
        self._require_fanout()
        return self._subscriptions.setdefault(name, Subscription(self, name))

    def enqueue(
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
        return self._run(self._enqueue_call(payload, headers, priority, delay, title, due_at, timeout))

    def enqueue_many(
        self,
        payloads: Iterable[bytes | str],
        *,
        headers: Sequence[dict[str, Any] | None] | None = None,
        timeout: float = RING_PUSH_TIMEOUT,
    ) -> list[int]:
        """Push many messages in one statement; QueueFullError (with .enqueued) if not all fit."""
        return self._run(self._enqueue_many_call(payloads, headers, timeout))

    def dequeue(self, n: int = 1, *, timeout: float = 0.0) -> list[Item]:
        """Pop up to n messages in position order, waiting up to `timeout` s for the first."""
        return self._run(self._dequeue_call(n, timeout))

    def repair(self, *, grace: float = RING_REPAIR_GRACE, timeout: float = RING_PUSH_TIMEOUT) -> RingRepair:
        """Run the recovery path: tombstone dead pushers' positions, rescue dead poppers' messages."""
        return self._run(self._repair_call(grace, timeout))

    def release(self) -> list[ReleasedClaim]:
        """Give up this session's kept claims: one ReleasedClaim per claim (none if none).

        A pop claim whose message arrived after this session's last pop is re-pushed at
        once (outcome 'rescued', new_item_id: its new id) rather than left for ring_repair.
        """
        return self._run(self._release_call())

    def close(self) -> None:
        """Release this client's claims (kept in `released`), then close its connection."""
        try:
            if not self._conn.closed and hasattr(self, "_sql"):
                self.released = self.release()
        finally:
            super().close()


class SubscriptionCalls:
    """A consumer's calls on one subscription of a fan-out ring, built without I/O: the
    blocking Subscription and the asyncio AsyncSubscription (queuectl.client.aio) run them.
    It keeps each claim's tries, the token its ack or nack sends with the id, so that a
    claim taken again by another consumer (a later try) is not settled by this one."""

    def __init__(self, queue: RingCalls, name: str) -> None:
        self.name = name
        self._adapter = queue._adapter
        self._tries: dict[int, int] = {}  # id -> the claim's tries (its token for ack/nack)

    def tries(self, item: Item | int) -> int:
        """How many times the message was handed out in this subscription (1: the first)."""
        return self._tries[item if isinstance(item, int) else item.id]

    def _take_call(self, n: int, lease: float, timeout: float) -> Call[list[Item]]:
        params = {"name": self.name, "batch": check_batch(n), "lease": check_positive_seconds(lease, "lease"),
                  "timeout": check_positive_seconds(timeout, "timeout")}

        def claimed(result: Any) -> list[Item]:
            keys = list(result.keys())
            rows = result.all()
            i_id, i_tries = keys.index("id"), keys.index("tries")
            for r in rows:
                self._tries[r[i_id]] = r[i_tries]
            return items_from(_Rows(keys, rows), self._adapter.json_value)
        # a take that reached the server may have claimed: never sent again
        return Call("sub_take", params, claimed, resend=False)

    def _settle_call(self, key: str, items: Iterable[Item | int]) -> Call[list[int]]:
        """sub_done (ack) or sub_return (nack) of claimed messages: the ids it matched, sorted."""
        ids = [i if isinstance(i, int) else i.id for i in items]
        missing = [i for i in ids if i not in self._tries]
        if missing:
            raise UsageError(f"messages {missing} were not claimed by this consumer of subscription {self.name!r}")
        # lists travel as each engine takes them (SQL Server's procedures: JSON text)
        params = {"name": self.name, "ids": self._adapter.id_array(ids),
                  "tries": self._adapter.list_param([self._tries[i] for i in ids])} if ids else None

        def settled(result: Any) -> list[int]:
            for i in ids:
                self._tries.pop(i, None)
            return sorted(int(i) for i in result.scalars())
        # not sent again: a settle that committed would match nothing the second time
        return Call(key, params, settled, resend=False, held=len(ids), empty=[])


class Subscription(SubscriptionCalls):
    """One consumer's handle on a subscription of a fan-out ring (RingQueue.subscription).

    dequeue(n, lease=...) claims up to n messages of the subscription, in position order,
    each for `lease` seconds; ack(items) acknowledges them, nack(items) gives them back at
    once. The consumers of one subscription compete: each message goes to one of them, once,
    unless its lease expires first (the consumer died or was too slow): then another
    consumer of the same subscription takes it again (Item.id unchanged, one more try), and
    the first consumer's ack matches nothing (ack returns the ids it acknowledged).
    """

    def __init__(self, queue: RingQueue, name: str) -> None:
        super().__init__(queue, name)
        self.queue = queue

    def dequeue(self, n: int = 1, *, lease: float = SUB_LEASE, timeout: float = 0.0) -> list[Item]:
        """Claim up to n messages, waiting up to `timeout` s for the first."""
        return self.queue._run(self._take_call(n, lease, timeout))

    def ack(self, items: Iterable[Item | int]) -> list[int]:
        """Acknowledge claimed messages; returns the ids acknowledged (a claim taken again
        by another consumer after its lease expired is not)."""
        return self.queue._run(self._settle_call("sub_done", items))

    def nack(self, items: Iterable[Item | int]) -> list[int]:
        """Give claimed messages back to the subscription at once."""
        return self.queue._run(self._settle_call("sub_return", items))


class _Rows:
    """A result already read, for items_from (keys() and all())."""

    def __init__(self, keys: list[str], rows: list[Any]) -> None:
        self._keys, self._rows = keys, rows

    def keys(self) -> list[str]:
        return self._keys

    def all(self) -> list[Any]:
        return self._rows


CLIENTS: dict[str, type[KindQueue]] = {
    cls.kind: cls for cls in (HeapQueue, FifoQueue, StackQueue, PendingQueue, WatermarkQueue, RingQueue)
}


def open_queue(url_or_engine: str | Engine | None, name: str, *, schema: str = DEFAULT_SCHEMA) -> Queue | KindQueue:
    """The client for an installed queue, whatever its kind (Queue for reliable queues)."""
    if isinstance(url_or_engine, Engine):
        engine, owns_engine = url_or_engine, False
    else:
        engine, owns_engine = make_engine(url_or_engine, pool_size=1), True
    try:
        with engine.connect() as conn:
            info = require_queue(conn, name, schema)
        if info.kind == "reliable":
            queue: Queue | KindQueue = Queue(engine, name, schema=schema, info=info)
        elif info.kind in CLIENTS:
            queue = CLIENTS[info.kind](engine, name, schema=schema, info=info)
        else:
            raise UsageError(f"queue {name!r} has kind {info.kind!r}, which this version of queuectl does not know")
    except BaseException:
        if owns_engine:
            engine.dispose()
        raise
    queue._owns_engine = owns_engine  # close() disposes an engine made here
    return queue


# -- maintenance entry points (for the scheduler's jobs) -----------------------------------


def correct_watermark(url_or_engine: str | Engine | None, name: str, *, schema: str = DEFAULT_SCHEMA,
                      info: QueueInfo | None = None) -> WatermarkCorrection:
    """Recompute watermark queue `name`'s true low bound and fix its stored watermark.

    One call of `<schema>.<name>_correct_watermark()`: lowers a watermark that is too high
    at once, raises one that is too low only over ids whose enqueue has settled (a busy
    queue may need a second run). Returns old/new stored low, the true bound, whether it
    changed and why. Safe to run at any time, from any session; meant for every 5 minutes.
    `info`: the queue's registry entry when the caller has read it already.
    """
    with WatermarkQueue(url_or_engine, name, schema=schema, info=info) as queue:
        return queue.correct_watermark()


def repair_ring(
    url_or_engine: str | Engine | None,
    name: str,
    *,
    schema: str = DEFAULT_SCHEMA,
    grace: float = RING_REPAIR_GRACE,
    timeout: float = RING_PUSH_TIMEOUT,
) -> RingRepair:
    """Run ring queue `name`'s recovery path once (`<schema>.<name>_ring_repair()`)."""
    with RingQueue(url_or_engine, name, schema=schema) as queue:
        return queue.repair(grace=grace, timeout=timeout)
