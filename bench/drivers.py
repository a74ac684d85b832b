"""How `queuectl bench` drives one queue kind: a registry the lead can extend.

A driver knows, for its kind: how to install and empty a bench queue, how a worker
process opens a session and enqueues / takes / finishes messages through the kind's own
Python client, which pgbench scripts call the same SQL API without Python, and how to
count consumed items on the server. Adding a kind is one class and one `register()`.

Drivers are looked up by name inside the worker processes too (forked from a fresh fork server, or spawned), so
they must be importable module-level objects without state.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from queuectl.messages import messages_from
from queuectl.engine import adapter_for
from queuectl.engine.postgresql import BinaryArray  # BinaryArray: the client's binary array parameters
from queuectl.errors import UsageError
from queuectl.kindspec import kind_template_values
from queuectl.names import DEFAULT_SCHEMA, QueueNames
from queuectl.sqlfiles import render

ENGINE_DIR = "postgresql"
BENCH_SQL = "bench"
LEASE_SECONDS = 300.0  # long enough that no bench message is ever re-claimed


class Session(Protocol):
    """One worker's connection to a bench queue."""

    def enqueue(self, payloads: list[bytes]) -> None: ...

    def take(self, n: int) -> tuple[list[bytes], Any]:
        """Claim up to n messages: their payloads and a token for finish()."""
        ...

    def finish(self, token: Any) -> None:
        """Complete what take() returned (ack); a no-op for destructive kinds."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class PgbenchScripts:
    """SQL-only twin of a Session: bench.sql sections and the -D variables they read."""

    enqueue_section: str
    consume_section: str
    variables: dict[str, str]


class KindDriver(Protocol):
    name: str
    description: str

    def install(self, engine: Engine, names: QueueNames) -> None: ...

    def uninstall(self, engine: Engine, names: QueueNames) -> None: ...

    def reset(self, conn: Connection, names: QueueNames) -> None: ...

    def open(self, url: str, names: QueueNames) -> Session: ...

    def consumed(self, conn: Connection, names: QueueNames) -> tuple[int, float | None]:
        """Items consumed since the last reset, and the server-side span in seconds (or None)."""
        ...

    def ready(self, conn: Connection, names: QueueNames) -> int: ...

    def pgbench(self, names: QueueNames, batch: int, payloads: Sequence[bytes]) -> PgbenchScripts | None: ...

    def tables(self, names: QueueNames) -> list[str]:
        """Table names (unqualified) whose churn statistics the bench reports."""
        ...


def bench_sql(section: str, values: dict[str, str | int]) -> str:
    return render(ENGINE_DIR, BENCH_SQL, section, values)


def run_bench_sections(engine: Engine, names: QueueNames, *sections: str,
                       sql: Callable[[str, dict[str, str | int]], str] = bench_sql) -> None:
    """Run bench.sql sections (or those `sql` renders) for a bench-only design's queue names,
    in one transaction."""
    from queuectl.sqlfiles import split_statements

    with engine.begin() as conn:
        for section in sections:
            for statement in split_statements(sql(section, names.template_values())):
                conn.exec_driver_sql(statement)


def reinstall_queue(engine: Engine, name: str, kind: str = "reliable", settings: Any = None, *,
                    revision: str | None = None, schema: str = DEFAULT_SCHEMA) -> None:
    """Install a bench queue at `revision` (None: the head), first removing one of that name
    left by an aborted run."""
    from queuectl.install import install_queue, uninstall_queue
    from queuectl.registry import get_queue

    with engine.connect() as conn:
        existing = get_queue(conn, name, schema)
    if existing is not None:
        uninstall_queue(engine, name, schema)
    install_queue(engine, name, kind, settings, schema=schema, revision=revision)


def analyze_filled(engine: Engine, design: str, names: QueueNames, kind: str = "reliable") -> None:
    """Statistics and visibility map for a design's freshly filled tables, as autovacuum
    gives a live queue's (bench.sql <design>_analyze says why); VACUUM needs autocommit.
    `kind` names the installed kind whose table names the section uses."""
    values = {**names.template_values(), **kind_template_values(names, kind)}
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(bench_sql(f"{design}_analyze", values))


FILL_CHUNK = 1000  # items per enqueue_many when a bench fills a queue
_SHARED_HIT = re.compile(r"shared hit=(\d+)")


def enqueue_in_chunks(queue: Any, payload: bytes, rows: int) -> None:
    """Enqueue `rows` copies of `payload` through any kind's client, FILL_CHUNK at a time."""
    for start in range(0, rows, FILL_CHUNK):
        queue.enqueue_many([payload] * min(FILL_CHUNK, rows - start))


def plan_shared_hits(plan: Sequence[str]) -> int | None:
    """The shared buffers an EXPLAIN (ANALYZE, BUFFERS) text counts for its whole statement
    (the first `shared hit=` among the top node's lines; a function scan's includes the
    function's own statements); None when the statement hit no shared buffer. The top node's
    lines are those before its first child ("->"): an INSERT ... ON CONFLICT prints four
    lines of its own before its buffers."""
    top = []
    for line in plan:
        if "->" in line:
            break
        top.append(line)
    hits = [int(m.group(1)) for line in top if (m := _SHARED_HIT.search(line))]
    return hits[0] if hits else None


def bytea_array_literal(payloads: Sequence[bytes]) -> str:
    """A bytea[] in PostgreSQL's text form, for a pgbench -D variable."""
    return "{" + ",".join(f'"\\\\x{p.hex()}"' for p in payloads) + "}"


# -- reliable ---------------------------------------------------------------------------


class _ReliableSession:
    def __init__(self, url: str, names: QueueNames) -> None:
        from queuectl.client import Queue

        self.queue = Queue(url, names.queue, schema=names.schema)

    def enqueue(self, payloads: list[bytes]) -> None:
        if len(payloads) == 1:
            self.queue.enqueue(payloads[0])
        else:
            self.queue.enqueue_many(payloads)

    def take(self, n: int) -> tuple[list[bytes], Any]:
        messages = self.queue.dequeue(n, lease=LEASE_SECONDS)
        return [m.payload for m in messages], messages

    def finish(self, token: Any) -> None:
        if token:
            self.queue.ack(token)

    def listen(self) -> Any:
        """A LISTEN session on the queue's channel, as queuectl's Worker opens one."""
        from queuectl.worker import Listener

        return Listener(self.queue)

    def close(self) -> None:
        self.queue.close()


class ReliableDriver:
    """The reliable (meta/data split, leased) queue, through queuectl.client.Queue."""

    name = "reliable"
    description = "reliable queue (meta/data split, lease, ack) via queuectl.client.Queue"
    revision: str | None = None  # None: the head

    def install(self, engine: Engine, names: QueueNames) -> None:
        reinstall_queue(engine, names.queue, revision=self.revision, schema=names.schema)

    def uninstall(self, engine: Engine, names: QueueNames) -> None:
        from queuectl.install import uninstall_queue

        uninstall_queue(engine, names.queue, names.schema)

    def reset(self, conn: Connection, names: QueueNames) -> None:
        conn.execute(sa.text(bench_sql("reliable_reset", names.template_values())))
        if self.revision is None or self.revision >= "reliable_0012":
            conn.execute(sa.text(bench_sql("reliable_reset_rotation", names.template_values())))
        conn.commit()

    def open(self, url: str, names: QueueNames) -> Session:
        return _ReliableSession(url, names)

    def consumed(self, conn: Connection, names: QueueNames) -> tuple[int, float | None]:
        row = conn.execute(sa.text(bench_sql("reliable_consumed", names.template_values()))).one()
        conn.commit()
        return int(row.n), (float(row.seconds) if row.seconds is not None else None)

    def ready(self, conn: Connection, names: QueueNames) -> int:
        n = conn.execute(sa.text(bench_sql("reliable_ready", names.template_values()))).scalar_one()
        conn.commit()
        return int(n)

    def pgbench(self, names: QueueNames, batch: int, payloads: Sequence[bytes]) -> PgbenchScripts | None:
        variables = {"batch": str(batch), "worker": "pgbench"}
        if batch == 1:
            variables["payload"] = "\\x" + payloads[0].hex()
            enqueue = "pgbench_reliable_enqueue_one"
        else:
            variables["payloads"] = bytea_array_literal(payloads[:batch])
            enqueue = "pgbench_reliable_enqueue_many"
        return PgbenchScripts(enqueue, "pgbench_reliable_consume", variables)

    def tables(self, names: QueueNames) -> list[str]:
        return [names.table("meta"), names.table("data")]


class _ReliableAckDequeueSession(_ReliableSession):
    """The consumer loop with Queue.ack_and_dequeue: finish() only remembers the batch,
    the next take() acks it and claims the next batch in one call (one transaction)."""

    defers_finish = True

    def __init__(self, url: str, names: QueueNames) -> None:
        super().__init__(url, names)
        self.pending: list[Any] = []

    def take(self, n: int) -> tuple[list[bytes], Any]:
        messages = self.queue.ack_and_dequeue(self.pending, n, lease=LEASE_SECONDS)
        self.pending = []
        return [m.payload for m in messages], messages

    def finish(self, token: Any) -> None:
        if token:
            self.pending = token

    def flush(self) -> None:
        """Ack what finish() deferred (the end of a run)."""
        if self.pending:
            self.queue.ack(self.pending)
            self.pending = []

    def close(self) -> None:
        try:
            self.flush()
        finally:
            super().close()


class ReliableAckDequeueDriver(ReliableDriver):
    """The reliable queue whose consumers ack and claim in one call (reliable_0004)."""

    name = "reliable_adq"
    description = "reliable queue, consumers call ack_and_dequeue (ack + next claim in one transaction)"

    def open(self, url: str, names: QueueNames) -> Session:
        return _ReliableAckDequeueSession(url, names)

    def pgbench(self, names: QueueNames, batch: int, payloads: Sequence[bytes]) -> PgbenchScripts | None:
        scripts = super().pgbench(names, batch, payloads)
        assert scripts is not None
        # pgbench keeps a client's variables between transactions: :ids is its last claim
        return PgbenchScripts(scripts.enqueue_section, "pgbench_reliable_ack_dequeue", {**scripts.variables, "ids": "{}"})


class ReliableNotifyAllDriver(ReliableDriver):
    """The reliable queue as it was before reliable_0006: NOTIFY in every enqueueing
    transaction, whether or not a consumer waits (same client, same consumer loop)."""

    name = "reliable_0005"
    description = "reliable queue at reliable_0005 (NOTIFY in every enqueueing transaction)"
    revision = "reliable_0005"


class ReliableLeaseScanDriver(ReliableDriver):
    """The reliable queue as it was before reliable_0009: ack, nack, extend_lease and release
    check `status = 1`, so their cached generic plans may read the whole leased index (same
    client, same consumer loop)."""

    name = "reliable_0008"
    description = "reliable queue at reliable_0008 (lease functions may scan the leased index)"
    revision = "reliable_0008"


class _ReliableSqlalchemySession(_ReliableSession):
    def __init__(self, url: str, names: QueueNames) -> None:
        from queuectl.client import Queue
        from queuectl.engine.base import through_sqlalchemy

        class SqlalchemyQueue(Queue):
            """Every call through SQLAlchemy's Connection.execute instead of the driver
            connection (same SQL, same fetches and Message building)."""

            def _statement(self, engine_dir: str, key: str) -> Any:
                return through_sqlalchemy(self._clause(engine_dir, key))

        self.queue = SqlalchemyQueue(url, names.queue, schema=names.schema)


class ReliableSqlalchemyDriver(ReliableDriver):
    """The reliable queue at the head, its client's calls through SQLAlchemy's execution
    layer instead of on the driver connection: what the driver connection saves a client."""

    name = "reliable_sqla"
    description = "reliable queue, client calls through SQLAlchemy Connection.execute"

    def open(self, url: str, names: QueueNames) -> Session:
        return _ReliableSqlalchemySession(url, names)


# -- the one-table design (bench-only baseline of the `split` scenario) ------------------


class _BenchTableSession:
    """A worker's session on a bench-only design: its bench.sql `<prefix>_enqueue_many`,
    `_dequeue` and `_ack` statements on one autocommit connection."""

    prefix = ""

    def __init__(self, url: str, names: QueueNames) -> None:
        import os

        from queuectl.engine import make_engine

        self.engine = make_engine(url, pool_size=1)
        self.conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        values = names.template_values()
        # Run as the queue clients run their calls (Adapter.client_statement), so a bench-only
        # design and the kinds it is compared with pay the same client work per call.
        adapter = adapter_for(self.engine)
        self.sql = {k: adapter.client_statement(self.engine, sa.text(bench_sql(f"{self.prefix}_{k}", values)))
                    for k in ("enqueue_many", "dequeue", "ack")}
        self.worker = f"bench:{os.getpid()}"

    def enqueue(self, payloads: list[bytes]) -> None:
        self.sql["enqueue_many"](self.conn, {"payloads": BinaryArray(payloads)}).all()

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()


class _OneTableSession(_BenchTableSession):
    prefix = "onetable"

    def __init__(self, url: str, names: QueueNames) -> None:
        super().__init__(url, names)
        self.json_value = adapter_for(self.engine).json_value

    def take(self, n: int) -> tuple[list[bytes], Any]:
        # The same columns as the reliable dequeue, decoded into the same Messages by the
        # client's own decoder: the two designs differ in their tables, not their clients.
        params = {"batch": n, "lease_seconds": LEASE_SECONDS, "worker": self.worker}
        messages = messages_from(self.sql["dequeue"](self.conn, params), self.json_value)
        return [m.payload for m in messages], [m.id for m in messages]

    def finish(self, token: Any) -> None:
        if token:
            self.sql["ack"](self.conn, {"ids": BinaryArray(token), "worker": self.worker}).scalar_one()


class OneTableDriver:
    """Bench-only: the reliable queue's columns and payload in one table (sql/postgresql/bench.sql)."""

    name = "onetable"
    description = "one wide table (bench-only baseline for the meta/data split)"

    def install(self, engine: Engine, names: QueueNames) -> None:
        run_bench_sections(engine, names, "onetable_drop", "onetable_create")

    def uninstall(self, engine: Engine, names: QueueNames) -> None:
        run_bench_sections(engine, names, "onetable_drop")

    def reset(self, conn: Connection, names: QueueNames) -> None:
        conn.execute(sa.text(bench_sql("onetable_reset", names.template_values())))
        conn.commit()

    def open(self, url: str, names: QueueNames) -> Session:
        return _OneTableSession(url, names)

    def consumed(self, conn: Connection, names: QueueNames) -> tuple[int, float | None]:
        row = conn.execute(sa.text(bench_sql("onetable_consumed", names.template_values()))).one()
        conn.commit()
        return int(row.n), (float(row.seconds) if row.seconds is not None else None)

    def ready(self, conn: Connection, names: QueueNames) -> int:
        n = conn.execute(sa.text(bench_sql("onetable_ready", names.template_values()))).scalar_one()
        conn.commit()
        return int(n)

    def pgbench(self, names: QueueNames, batch: int, payloads: Sequence[bytes]) -> PgbenchScripts | None:
        variables = {"batch": str(batch), "worker": "pgbench", "payloads": bytea_array_literal(payloads[:batch])}
        return PgbenchScripts("pgbench_onetable_enqueue_many", "pgbench_onetable_consume", variables)

    def tables(self, names: QueueNames) -> list[str]:
        return [names.table("meta")]


# -- the lean one-table queue (bench-only baseline of the `ring` scenario) ------------------


class _LeanSession(_BenchTableSession):
    prefix = "lean"

    def take(self, n: int) -> tuple[list[bytes], Any]:
        params = {"batch": n, "lease_seconds": LEASE_SECONDS, "worker": self.worker}
        result = self.sql["dequeue"](self.conn, params)
        keys = list(result.keys())
        i_id, i_payload = keys.index("id"), keys.index("payload")
        rows = result.all()
        return [bytes(r[i_payload]) for r in rows], [r[i_id] for r in rows]

    def finish(self, token: Any) -> None:
        if token:
            self.sql["ack"](self.conn, {"ids": BinaryArray(token), "worker": self.worker})


class LeanDriver:
    """Bench-only: the common one-table queue (pick and claim in one UPDATE, DELETE at ack),
    plain statements from sql/postgresql/bench.sql (lean_*)."""

    name = "lean"
    description = "one table, pick + claim by UPDATE, DELETE at ack (bench-only baseline for the ring)"

    def install(self, engine: Engine, names: QueueNames) -> None:
        run_bench_sections(engine, names, "lean_drop", "lean_create")

    def uninstall(self, engine: Engine, names: QueueNames) -> None:
        run_bench_sections(engine, names, "lean_drop")

    def reset(self, conn: Connection, names: QueueNames) -> None:
        conn.commit()
        self.install(conn.engine, names)

    def open(self, url: str, names: QueueNames) -> Session:
        return _LeanSession(url, names)

    def consumed(self, conn: Connection, names: QueueNames) -> tuple[int, float | None]:
        raise NotImplementedError(f"{self.name}: acked rows are deleted, leaving no record of consumed items")

    def ready(self, conn: Connection, names: QueueNames) -> int:
        n = conn.execute(sa.text(bench_sql("lean_ready", names.template_values()))).scalar_one()
        conn.commit()
        return int(n)

    def pgbench(self, names: QueueNames, batch: int, payloads: Sequence[bytes]) -> PgbenchScripts | None:
        return None

    def tables(self, names: QueueNames) -> list[str]:
        return [names.table("meta")]


# -- destructive kinds (heap, fifo, stack, pending, watermark, ring), through queuectl.client ---------

RING_BENCH_SIZE = 8192  # slots of a bench ring unless a scenario installs it with its own size


class _KindSession:
    def __init__(self, url: str, names: QueueNames, kind: str) -> None:
        from queuectl.client import CLIENTS

        self.queue = CLIENTS[kind](url, names.queue, schema=names.schema)

    def enqueue(self, payloads: list[bytes]) -> None:
        if len(payloads) == 1:
            self.queue.enqueue(payloads[0])
        else:
            self.queue.enqueue_many(payloads)

    def take(self, n: int) -> tuple[list[bytes], Any]:
        return [item.payload for item in self.queue.dequeue(n)], None

    def finish(self, token: Any) -> None:
        """Nothing to do: the dequeue already removed the items."""

    def close(self) -> None:
        self.queue.close()


class KindQueueDriver:
    """A destructive kind (no ack) through its own client, queuectl.client.CLIENTS[kind];
    `name` when the driver is a variant of its kind (a strict FIFO: `strict`)."""

    def __init__(self, kind: str, description: str, *, name: str | None = None, strict: bool = False) -> None:
        self.kind = kind
        self.name = name or kind
        self.strict = strict
        self.description = description

    def install(self, engine: Engine, names: QueueNames, size: int | None = None) -> None:
        from queuectl.install import install_queue, uninstall_queue
        from queuectl.registry import get_queue
        from queuectl.kindspec import settings_for

        with engine.connect() as conn:
            existing = get_queue(conn, names.queue, names.schema)
        if existing is not None:
            uninstall_queue(engine, names.queue, names.schema)
        ring_size = (size or RING_BENCH_SIZE) if self.kind == "ring" else None
        install_queue(engine, names.queue, self.kind, settings_for(self.kind, size=ring_size, strict=self.strict),
                      names.schema)

    def uninstall(self, engine: Engine, names: QueueNames) -> None:
        from queuectl.install import uninstall_queue

        uninstall_queue(engine, names.queue, names.schema)

    def reset(self, conn: Connection, names: QueueNames) -> None:
        """A fresh queue of the same size: a ring's slots and sequences start over."""
        size = None
        if self.kind == "ring":
            from queuectl.registry import get_queue

            info = get_queue(conn, names.queue, names.schema)
            size = info.settings.as_dict()["size"] if info is not None else None
        conn.commit()
        self.install(conn.engine, names, size)

    def open(self, url: str, names: QueueNames) -> Session:
        return _KindSession(url, names, self.kind)

    def consumed(self, conn: Connection, names: QueueNames) -> tuple[int, float | None]:
        raise NotImplementedError(f"{self.name}: destructive reads leave no record of consumed items")

    def ready(self, conn: Connection, names: QueueNames) -> int:
        from queuectl.stats import queue_counts

        n = queue_counts(conn, names.queue, self.kind, names.schema).get("ready", 0)
        conn.commit()
        return int(n)

    def pgbench(self, names: QueueNames, batch: int, payloads: Sequence[bytes]) -> PgbenchScripts | None:
        return None

    def tables(self, names: QueueNames) -> list[str]:
        if self.kind == "watermark":
            return [names.table("items"), names.table("watermark")]
        return [names.table("ring" if self.kind == "ring" else "items")]


FANOUT_SUBSCRIPTION = "bench"  # the one subscription of a bench fan-out ring, its consumers competing


class _FanoutSession:
    def __init__(self, url: str, names: QueueNames) -> None:
        from queuectl.client import RingQueue

        self.queue = RingQueue(url, names.queue, schema=names.schema)
        self.subscription = self.queue.subscription(FANOUT_SUBSCRIPTION)

    def enqueue(self, payloads: list[bytes]) -> None:
        self.queue.enqueue_many(payloads)  # a fan-out ring's push is its publish

    def take(self, n: int) -> tuple[list[bytes], Any]:
        items = self.subscription.dequeue(n)
        return [item.payload for item in items], items

    def finish(self, token: Any) -> None:
        if token:
            self.subscription.ack(token)

    def close(self) -> None:
        self.queue.close()


class FanoutRingDriver(KindQueueDriver):
    """A fan-out ring with one subscription whose consumers compete: publish, claim, ack."""

    def __init__(self) -> None:
        super().__init__("ring", "fan-out ring, one subscription (publish; claim + ack) via queuectl.client")
        self.name = "ring_fanout"

    def install(self, engine: Engine, names: QueueNames, size: int | None = None) -> None:
        from queuectl.client import RingQueue
        from queuectl.install import install_queue, uninstall_queue
        from queuectl.kindspec import RingSettings
        from queuectl.registry import get_queue

        with engine.connect() as conn:
            existing = get_queue(conn, names.queue, names.schema)
        if existing is not None:
            uninstall_queue(engine, names.queue, names.schema)
        install_queue(engine, names.queue, "ring", RingSettings(size=size or RING_BENCH_SIZE, fanout=True),
                      names.schema)
        with RingQueue(engine, names.queue, schema=names.schema) as q:
            q.subscribe(FANOUT_SUBSCRIPTION)

    def open(self, url: str, names: QueueNames) -> Session:
        return _FanoutSession(url, names)

    def tables(self, names: QueueNames) -> list[str]:
        return [names.table(t) for t in ("ring", "subs", "sub_slots")]

    def waiting(self, engine: Engine, names: QueueNames) -> int:
        """The backlog: messages published that the subscription has not been handed, and
        those handed out but not acknowledged (a fan-out ring keeps no FULL slot)."""
        from queuectl.client import RingQueue

        with RingQueue(engine, names.queue, schema=names.schema) as q:
            [sub] = [s for s in q.subscriptions() if s.name == FANOUT_SUBSCRIPTION]
        return int(sub.lag or 0) + int(sub.claimed or 0)


DRIVERS: dict[str, KindDriver] = {}
# Kinds a user may pass to --kind; bench-only designs (onetable) are drivers but not kinds.
BENCH_KINDS: list[str] = []


def register(driver: KindDriver, *, user_kind: bool = True) -> None:
    DRIVERS[driver.name] = driver
    if user_kind and driver.name not in BENCH_KINDS:
        BENCH_KINDS.append(driver.name)


def driver_for(name: str) -> KindDriver:
    try:
        return DRIVERS[name]
    except KeyError:
        raise UsageError(f"no bench driver for kind {name!r}: choose one of {', '.join(BENCH_KINDS)}") from None


register(ReliableDriver())
register(ReliableAckDequeueDriver())
register(ReliableNotifyAllDriver())
register(ReliableLeaseScanDriver())
register(ReliableSqlalchemyDriver())
register(OneTableDriver(), user_kind=False)
register(LeanDriver(), user_kind=False)
register(KindQueueDriver("heap", "no order promised (one table, INSERT / DELETE ... RETURNING) via queuectl.client"))
register(KindQueueDriver("fifo", "lax FIFO (one table, INSERT / DELETE ... RETURNING) via queuectl.client"))
register(KindQueueDriver("fifo", "strict FIFO (one table, consumers wait for each other) via queuectl.client",
                         name="fifo_strict", strict=True))
register(KindQueueDriver("stack", "LIFO stack (one table, newest first) via queuectl.client"))
register(KindQueueDriver("pending", "due-time queue (one table, earliest due first; due at enqueue) via queuectl.client"))
register(KindQueueDriver("ring", "ring buffer (preallocated slots, UPDATE only) via queuectl.client"))
register(FanoutRingDriver())
register(KindQueueDriver("watermark", "FIFO whose dequeue starts at a low watermark (one table) via queuectl.client"))
