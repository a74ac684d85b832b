"""Every queue kind under 4 producer and 4 consumer processes: each item exactly once.

Real processes (multiprocessing, spawn) against the test server; the parent compares the
exact multiset of what was enqueued with what came out.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
from collections import Counter
from datetime import timedelta

import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

import kind_workers
from queuectl.engine import make_engine
from queuectl.install import install_queue
from queuectl.kindspec import settings_for

PRODUCERS = 4
CONSUMERS = 4
PER_PRODUCER = 2_500  # 10,000 items per run
DEADLINE_S = 150.0

CASES = [
    ("heap", {}),
    ("fifo", {}),
    ("fifo", {"strict": True}),
    ("stack", {}),
    ("pending", {}),
    ("watermark", {}),
    ("ring", {"size": 1024}),  # ten laps: pushes wait on a full ring, pops on an empty one
]


def queue_name(kind: str, options: dict) -> str:
    return f"c_{kind}" + ("_strict" if options.get("strict") else "")


@pytest.fixture(scope="module")
def concurrent_run(admin_engine, server_url):
    """One database with a queue of every kind; the same 4 producer and 4 consumer
    processes go through the queues one after the other (spawning 8 processes once, not
    once per kind). Returns {queue name: [(id, payload, due_at, received_at), ...]}."""
    db = f"qk_{uuid.uuid4().hex[:12]}"
    with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{db}"'))
    url = make_url(server_url).set(database=db).render_as_string(hide_password=False)
    engine = make_engine(url)
    try:
        names = []
        for kind, options in CASES:
            names.append(queue_name(kind, options))
            install_queue(engine, names[-1], kind, settings_for(kind, **options))
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        dones = [ctx.Value("q", 0) for _ in names]
        expected = PRODUCERS * PER_PRODUCER
        consumers = [
            ctx.Process(target=kind_workers.consume_all, args=(url, names, results, dones, expected, 50, DEADLINE_S))
            for _ in range(CONSUMERS)
        ]
        producers = [
            ctx.Process(target=kind_workers.produce_all, args=(url, names, i, PER_PRODUCER, 100, 1.0))
            for i in range(PRODUCERS)
        ]
        for p in consumers + producers:
            p.start()
        got: dict[str, list[tuple]] = {name: [] for name in names}
        try:
            for _ in range(CONSUMERS * len(names)):  # read before joining (see multiprocessing docs)
                name, items = results.get(timeout=DEADLINE_S + 30)
                got[name].extend(items)
        except queue_module.Empty:
            pytest.fail("a consumer did not report within the deadline")
        finally:
            for p in consumers + producers:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
        assert [p.exitcode for p in consumers + producers] == [0] * (CONSUMERS + PRODUCERS)
        with engine.connect() as conn:
            left = {}
            for kind, options in CASES:
                name = queue_name(kind, options)
                table, where = ("ring", " WHERE state = 1") if kind == "ring" else ("items", "")
                left[name] = conn.execute(sa.text(f'SELECT count(*) FROM queuectl."{name}_{table}"{where}')).scalar()
        yield got, left
    finally:
        engine.dispose()
        with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "options"), CASES, ids=[k + ("-strict" if o.get("strict") else "") for k, o in CASES])
def test_four_producers_four_consumers_each_item_exactly_once(kind, options, concurrent_run):
    got_by_queue, left = concurrent_run
    got = got_by_queue[queue_name(kind, options)]
    expected = Counter(f"p{i}-{n}".encode() for i in range(PRODUCERS) for n in range(PER_PRODUCER))
    assert Counter(payload for _id, payload, _due, _at in got) == expected
    ids = [item_id for item_id, *_ in got]
    assert len(set(ids)) == len(ids) == sum(expected.values())
    assert left[queue_name(kind, options)] == 0  # nothing left behind
    if kind == "pending":
        # nothing came out before its due time (server-computed due_at, client clock after receipt)
        early = [(due, at) for _i, _p, due, at in got if at < due - timedelta(milliseconds=5)]
        assert early == []


@pytest.mark.slow
def test_strict_fifo_keeps_enqueue_order_across_consumer_rollbacks(engine, db_url):
    """4 consumer processes take batches in transactions; every 3rd transaction of each
    rolls back after dequeuing and logging. The committed hand-out order is the enqueue order."""
    install_queue(engine, "strictq", "fifo", settings_for("fifo", strict=True))
    total = 3_000
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE handout_log (seq bigint GENERATED ALWAYS AS IDENTITY, ids bigint[])"))
        ids = conn.execute(
            sa.text('SELECT id FROM queuectl."strictq_enqueue_many"(CAST(:p AS bytea[])) AS id'),
            {"p": [f"item-{n}".encode() for n in range(total)]},
        ).scalars().all()
    assert ids == sorted(ids)

    ctx = mp.get_context("spawn")
    done = ctx.Value("q", 0)
    workers = [
        ctx.Process(
            target=kind_workers.strict_consume,
            args=(db_url, 'queuectl."strictq_dequeue"', "handout_log", done, total, 20, 3, DEADLINE_S),
        )
        for _ in range(4)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=DEADLINE_S + 30)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]

    with engine.connect() as conn:
        logged = conn.execute(sa.text("SELECT ids FROM handout_log ORDER BY seq")).scalars().all()
        left = conn.execute(sa.text('SELECT count(*) FROM queuectl."strictq_items"')).scalar()
    handed_out = [item_id for batch in logged for item_id in batch]
    assert left == 0
    assert handed_out == ids  # exactly once, and in enqueue order
