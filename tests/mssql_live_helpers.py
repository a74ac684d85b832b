"""What the live SQL Server tests share (tests/test_mssql_live*.py): the URL, the skip, the
fixtures, and the bodies of the processes they spawn.

The live tests run only when QUEUECTL_TEST_MSSQL_URL names a SQL Server database the tests
may create schemas in; `make test-mssql` runs them (docs/sqlserver.md has the commands for a
server in Docker). Without the URL each is reported as SKIPPED with the reason below. A test
module takes the fixtures by name:

    import mssql_live_helpers as live
    pytestmark = live.requires_mssql
    mssql_engine, schema = live.mssql_engine, live.schema
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from queuectl.client import Queue, QueueFullError, RingQueue, open_queue
from queuectl.engine import make_engine
from queuectl.install import remove_everything
from queuectl.kindspec import kind_template_values
from queuectl.names import QueueNames
from queuectl.sqlfiles import render

MSSQL_URL_ENV = "QUEUECTL_TEST_MSSQL_URL"
MSSQL_URL = os.environ.get(MSSQL_URL_ENV)
SKIP_REASON = f"{MSSQL_URL_ENV} not set: SQL Server not run live (make test-mssql runs these against a server)"

requires_mssql = pytest.mark.skipif(not MSSQL_URL, reason=SKIP_REASON)


@pytest.fixture
def mssql_engine() -> Iterator[Engine]:
    engine = make_engine(MSSQL_URL)
    yield engine
    engine.dispose()


@pytest.fixture
def schema(mssql_engine: Engine) -> Iterator[str]:
    """A fresh schema for the test's queues and catalog; everything in it is removed after."""
    name = f"qt_{uuid.uuid4().hex[:12]}"
    yield name
    remove_everything(mssql_engine, name)


def utc(moment: datetime) -> datetime:
    """A time the server returned (datetime2: naive UTC) as an aware UTC datetime."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def fresh_engine() -> Engine:
    """An engine without a pool: every connection is a new server session, so state a
    session keeps (the watermark kind's working watermark, the ring's kept claims) starts
    from the stored row each time."""
    assert MSSQL_URL is not None
    engine = make_engine(MSSQL_URL)
    url = engine.url
    engine.dispose()
    return sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args={"timeout": 10})


def client_sql(kind: str, section: str, name: str, schema: str) -> sa.TextClause:
    """A client call's statement exactly as the client sends it (sql/mssql/<kind>.sql)."""
    names = QueueNames(name, schema)
    values = {**names.template_values(), **kind_template_values(names, kind)}
    return sa.text(render("mssql", kind, section, values))


def rows(engine: Engine, sql: str, **params: Any) -> list[sa.Row]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(sql), params))


def scalar(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def execute(engine: Engine, sql: str, **params: Any) -> None:
    """One statement in its own committed transaction (test set-up the API has no call for)."""
    with engine.begin() as conn:
        conn.execute(sa.text(sql), params)


# -- process bodies (importable by spawned children) ------------------------------------------


def consume_reliable(url: str, schema: str, name: str, done: Any, out: Any) -> None:
    """Dequeue and ack until `done` is set and the queue stayed empty for a second."""
    taken: list[int] = []
    with Queue(url, name, schema=schema) as queue:
        idle_since = None
        while True:
            batch = queue.dequeue(25, lease=60)
            if batch:
                idle_since = None
                queue.ack(batch)
                taken.extend(m.id for m in batch)
                continue
            if done.is_set():
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 1.0:
                    break
            time.sleep(0.02)
    out.put(taken)


def produce(url: str, schema: str, name: str, index: int, count: int, batch: int, max_delay: float) -> None:
    """Enqueue payloads 'p<index>-<n>' in batches (a pending queue: each with a random delay;
    a full ring: what did not fit is pushed again)."""
    import random

    rng = random.Random(index)
    with open_queue(url, name, schema=schema) as queue:
        for start in range(0, count, batch):
            payloads = [f"p{index}-{n}".encode() for n in range(start, min(start + batch, count))]
            if queue.kind == "pending":
                queue.enqueue_many(payloads, delay=[rng.uniform(0, max_delay) for _ in payloads])
                continue
            while payloads:
                try:
                    queue.enqueue_many(payloads)
                    payloads = []
                except QueueFullError as full:
                    payloads = payloads[len(full.enqueued):]


def consume(url: str, schema: str, name: str, results: Any, done: Any, expected: int, batch: int,
            deadline_s: float) -> None:
    """Dequeue until all consumers together took `expected` items; report
    (id, payload, due_at, received_at) for every item this one took."""
    got: list[tuple[int, bytes, datetime | None, datetime]] = []
    deadline = time.monotonic() + deadline_s
    with open_queue(url, name, schema=schema) as queue:
        options = {"timeout": 0.05} if queue.kind == "ring" else {}
        while time.monotonic() < deadline:
            with done.get_lock():
                if done.value >= expected:
                    break
            items = queue.dequeue(batch, **options)
            received = datetime.now(timezone.utc)
            if not items:
                time.sleep(0.005)
                continue
            got.extend((i.id, i.payload, None if i.due_at is None else utc(i.due_at), received) for i in items)
            with done.get_lock():
                done.value += len(items)
    results.put(got)


def pop_then_die(url: str, schema: str, name: str, ready: Any) -> None:
    """Pop on an empty ring (the call claims a position and keeps it), then die by SIGKILL
    with the claim held: no close(), no release."""
    queue = RingQueue(url, name, schema=schema)
    assert queue.dequeue(1, timeout=0.05) == []
    ready.set()
    os.kill(os.getpid(), signal.SIGKILL)


def push_then_die(url: str, schema: str, name: str, ready: Any) -> None:
    """Push into a full ring (the call claims a position and keeps it), then die by SIGKILL."""
    queue = RingQueue(url, name, schema=schema)
    try:
        queue.enqueue("never stored", timeout=0.05)
    except QueueFullError:
        pass
    ready.set()
    os.kill(os.getpid(), signal.SIGKILL)


def spawn() -> Any:
    return mp.get_context("spawn")


def check_server() -> int:
    """`python tests/mssql_live_helpers.py` (the first step of `make test-mssql`): connect to
    the URL once, so a missing driver, a wrong password or a server that is not up yet is one
    line (exit 2) instead of the same error in every test."""
    import sys

    from queuectl.engine.urls import mask_url
    from queuectl.errors import QueuectlError

    if not MSSQL_URL:
        print(f"make test-mssql: {SKIP_REASON}", file=sys.stderr)
        return 2
    try:
        make_engine(MSSQL_URL).dispose()
    except QueuectlError as exc:
        print(f"make test-mssql: {exc}", file=sys.stderr)
        return 2
    print(f"make test-mssql: connected to {mask_url(MSSQL_URL)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(check_server())
