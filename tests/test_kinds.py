"""The queue kinds beside reliable: install (also as a reviewed --sql script), the client
surface through open_queue, each kind's order promise, depth in `queuectl list`."""

from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from queuectl.client import Queue
from queuectl.errors import UsageError
from queuectl.install import head_of, install_queue, install_script, uninstall_queue
from queuectl.registry import list_queues
from queuectl.client import FifoQueue, HeapQueue, PendingQueue, RingQueue, StackQueue, WatermarkQueue, open_queue
from queuectl.kindspec import KINDS, FifoSettings, NoSettings, RingSettings, settings_for

from conftest import run_cli
from test_install import psql_command, schema_objects

ALL = [("reliable", {}), ("heap", {}), ("fifo", {}), ("fifo", {"strict": True}), ("stack", {}), ("pending", {}),
       ("watermark", {}), ("ring", {"size": 16})]
IDS = [k + ("-strict" if o.get("strict") else "") for k, o in ALL]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "options"), ALL, ids=IDS)
def test_install_sql_for_every_kind_runs_through_psql_on_an_empty_database(kind, options, db_url, engine):
    cli = ["install", "q1", "--kind", kind, "--sql"] + (["--strict"] if options.get("strict") else []) + (
        ["--size", str(options["size"])] if "size" in options else [])
    result = run_cli(*cli)  # no URL: the script for an empty database
    assert result.returncode == 0, result.stderr.decode()
    assert schema_objects(engine)["schema"] == 0
    env = {"PGPASSWORD": make_url(db_url).password or ""}
    psql = subprocess.run(psql_command(db_url), input=result.stdout, capture_output=True, env=env, timeout=60)
    assert psql.returncode == 0, psql.stderr.decode()
    with engine.connect() as conn:
        [info] = list_queues(conn)
    assert (info.name, info.kind, info.schema_version) == ("q1", kind, head_of(kind))
    assert info.settings == settings_for(kind, **options) if kind != "reliable" else True
    with open_queue(engine, "q1") as queue:  # what psql installed works
        queue.enqueue("via psql")
        assert [m.payload for m in queue.dequeue(1)] == [b"via psql"]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "options"), ALL[1:], ids=IDS[1:])
def test_install_uninstall_round_trip_leaves_nothing(kind, options, engine):
    install_queue(engine, "q1", kind, settings_for(kind, **options))
    objects = schema_objects(engine)
    assert [r for r in objects["relations"] if r.startswith("q1_")]
    uninstall_queue(engine, "q1")
    after = schema_objects(engine)
    assert not [r for r in after["relations"] if r.startswith("q1_")]
    assert not [f for f in after["functions"] if f.startswith("q1_")]


def test_open_queue_returns_the_client_of_each_kind(engine):
    expected = {"reliable": Queue, "heap": HeapQueue, "fifo": FifoQueue, "stack": StackQueue,
                "pending": PendingQueue, "watermark": WatermarkQueue, "ring": RingQueue}
    assert set(expected) == set(KINDS)
    for kind, cls in expected.items():
        install_queue(engine, f"k_{kind}", kind, settings_for(kind, size=4) if kind == "ring" else None)
        with open_queue(engine, f"k_{kind}") as queue:
            assert type(queue) is cls
    with pytest.raises(UsageError, match="kind 'heap', not 'fifo'"):
        FifoQueue(engine, "k_heap")


def test_fifo_is_oldest_first_and_enqueue_many_keeps_array_order(engine):
    install_queue(engine, "f", "fifo")
    with open_queue(engine, "f") as q:
        ids = q.enqueue_many([f"m{i}" for i in range(50)], headers=[{"i": i} for i in range(50)])
        assert ids == sorted(ids)
        q.enqueue("last")
        taken = [m for _ in range(6) for m in q.dequeue(10)]
        assert [m.text for m in taken] == [f"m{i}" for i in range(50)] + ["last"]
        assert [m.headers for m in taken[:3]] == [{"i": 0}, {"i": 1}, {"i": 2}]
        assert q.dequeue(5) == []


def test_stack_single_consumer_sees_exact_lifo_order(engine):
    install_queue(engine, "s", "stack")
    with open_queue(engine, "s") as q:
        q.enqueue_many(["a", "b", "c"])
        assert [m.text for m in q.dequeue(1)] == ["c"]
        q.enqueue("d")
        q.enqueue_many(["e", "f"])
        assert [m.text for m in q.dequeue(2)] == ["f", "e"]
        ids = q.enqueue_many([f"n{i}" for i in range(200)])
        taken = [q.dequeue(1)[0] for _ in range(200)]
        assert [m.id for m in taken] == ids[::-1]
        assert [m.text for m in q.dequeue(10)] == ["d", "b", "a"]


def test_heap_returns_every_item_once_in_no_promised_order(engine):
    install_queue(engine, "h", "heap")
    with open_queue(engine, "h") as q:
        ids = q.enqueue_many([f"x{i}" for i in range(300)])
        got = [m.id for _ in range(10) for m in q.dequeue(40)]
        assert sorted(got) == sorted(ids) and len(got) == 300


def test_pending_returns_nothing_before_its_due_time_then_earliest_first(engine):
    install_queue(engine, "p", "pending")
    with open_queue(engine, "p") as q:
        now = datetime.now(timezone.utc)
        late = q.enqueue("late", delay=1.2)
        early = q.enqueue("early", due_at=now + timedelta(seconds=0.6))
        q.enqueue_many(["later-1", "later-2"], delay=[1.5, 1.4])
        assert q.counts()["scheduled"] == 4 and q.counts()["ready"] == 0
        seen = []
        deadline = time.monotonic() + 10
        while len(seen) < 4 and time.monotonic() < deadline:
            for item in q.dequeue(10):
                assert datetime.now(timezone.utc) >= item.due_at  # never before it is due
                seen.append(item)
            time.sleep(0.02)
        assert [m.text for m in seen] == ["early", "late", "later-2", "later-1"]
        assert [m.id for m in seen[:2]] == [early, late]
        with pytest.raises(UsageError, match="timezone-aware"):
            q.enqueue("x", due_at=datetime.now())


def test_destructive_kinds_refuse_the_reliable_queues_options(engine):
    install_queue(engine, "f", "fifo")
    with open_queue(engine, "f") as q:
        for kwargs in ({"priority": 1}, {"delay": 5}, {"title": "t"}):
            with pytest.raises(UsageError):
                q.enqueue("x", **kwargs)
        with pytest.raises(UsageError):
            q.dequeue(0)
        assert q.counts()["ready"] == 0


def test_processing_rolls_back_into_the_queue_on_error(engine):
    install_queue(engine, "f", "fifo")
    with open_queue(engine, "f") as q:
        q.enqueue_many(["a", "b", "c"])
        with pytest.raises(RuntimeError):
            with q.processing(2) as items:
                assert [m.text for m in items] == ["a", "b"]
                raise RuntimeError("handler failed")
        with q.processing(2) as items:
            assert [m.text for m in items] == ["a", "b"]
        assert [m.text for m in q.dequeue(5)] == ["c"]


def test_strict_fifo_consumer_waits_for_the_head_while_lax_skips_it(engine, db_url):
    """The mechanism under the order promise, with two sessions and no timing luck."""
    install_queue(engine, "lax", "fifo")
    install_queue(engine, "strict", "fifo", FifoSettings(strict=True))
    other = sa.create_engine(db_url)
    try:
        for name in ("lax", "strict"):
            with open_queue(engine, name) as q:
                q.enqueue_many(["1", "2", "3", "4"])
        with other.connect() as holder:
            holder.begin()
            for name in ("lax", "strict"):  # hold items 1-2 of each queue in an open transaction
                held = holder.execute(sa.text(f'SELECT id FROM queuectl."{name}_dequeue"(2)')).scalars().all()
                assert held == [1, 2]
            with open_queue(engine, "lax") as q:
                assert [m.id for m in q.dequeue(1)] == [3]  # lax: skips past the held head
            with engine.connect() as conn:
                conn.execute(sa.text("SET lock_timeout = '300ms'"))
                with pytest.raises(OperationalError, match="lock timeout"):  # strict: waits for it
                    conn.execute(sa.text('SELECT id FROM queuectl."strict_dequeue"(1)')).all()
            holder.rollback()  # the holder fails: its items go back to the head
        with open_queue(engine, "strict") as q:
            assert [m.id for m in q.dequeue(4)] == [1, 2, 3, 4]
        with open_queue(engine, "lax") as q:
            assert [m.id for m in q.dequeue(4)] == [1, 2, 4]  # lax handed 3 out before 1 and 2
    finally:
        other.dispose()


@pytest.mark.slow
def test_queuectl_list_shows_each_kinds_depth(db_url, engine):
    depths = {"reliable": 3, "heap": 2, "fifo": 5, "stack": 1, "pending": 4, "watermark": 6, "ring": 7}
    for kind, n in depths.items():
        install_queue(engine, f"d_{kind}", kind, settings_for(kind, size=16) if kind == "ring" else None)
        with open_queue(engine, f"d_{kind}") as q:
            q.enqueue_many([f"{kind}-{i}" for i in range(n + 2)])
            taken = q.dequeue(2)
            if kind == "reliable":
                q.ack(taken)
    with open_queue(engine, "d_pending") as q:
        q.enqueue("not yet", delay=600)
    listed = {row["name"]: row for row in json.loads(run_cli("list", "--json", url=db_url).stdout)}
    for kind, n in depths.items():
        row = listed[f"d_{kind}"]
        assert row["kind"] == kind and row["counts"]["ready"] == n, (kind, row)
    assert listed["d_pending"]["counts"]["scheduled"] == 1
    assert listed["d_reliable"]["counts"]["done"] == 2
    assert listed["d_ring"]["settings"] == {"size": 16, "slot_bytes": 1800, "max_payload_bytes": 1048576}
    table = run_cli("list", url=db_url).stdout.decode()
    assert "watermark" in table and "ring" in table


@pytest.mark.slow
def test_cli_enqueue_and_dequeue_work_for_every_kind(db_url, engine):
    for kind in ("heap", "fifo", "stack", "pending", "watermark", "ring"):
        install_queue(engine, f"c_{kind}", kind, settings_for(kind, size=8) if kind == "ring" else None)
        enq = run_cli("enqueue", f"c_{kind}", "hello", "--headers", '{"k": 1}', url=db_url)
        assert enq.returncode == 0, (kind, enq.stderr)
        out = run_cli("dequeue", f"c_{kind}", "--batch", "5", url=db_url)
        assert out.returncode == 0, (kind, out.stderr)
        [record] = [json.loads(line) for line in out.stdout.decode().splitlines()]
        assert record | {"id": int(enq.stdout), "payload": "hello", "headers": {"k": 1}, "status": "removed"} == record
        with open_queue(engine, f"c_{kind}") as q:
            assert q.counts()["ready"] == 0
    refused = run_cli("dequeue", "c_fifo", "--ack", url=db_url)
    assert refused.returncode == 2 and b"no --ack" in refused.stderr
    assert run_cli("enqueue", "c_stack", "x", "--priority", "3", url=db_url).returncode == 2
    delayed = run_cli("enqueue", "c_pending", "later", "--delay", "600", url=db_url)
    assert delayed.returncode == 0 and run_cli("dequeue", "c_pending", url=db_url).stdout == b""


@pytest.mark.slow
def test_install_refuses_options_of_other_kinds_and_bad_values(db_url, engine):
    for args in (["--kind", "heap", "--strict"], ["--kind", "fifo", "--size", "8"], ["--kind", "ring", "--size", "1"],
                 ["--kind", "ring", "--size", "99999999"], ["--kind", "nosuch"]):
        result = run_cli("install", "q", *args, url=db_url)
        assert result.returncode == 2, args
        assert len(result.stderr.decode().strip().splitlines()) == 1
    assert schema_objects(engine)["relations"] in ([], ["alembic_version", "queues", "queues_pkey"])
    with pytest.raises(UsageError, match="at most 45"):
        install_queue(engine, "w" * 46, "watermark")
    install_queue(engine, "w" * 45, "watermark")
    install_queue(engine, "r" * 48, "ring", RingSettings(size=4))
    with pytest.raises(UsageError, match="takes FifoSettings"):
        install_queue(engine, "f", "fifo", NoSettings())


def test_install_ring_default_size_is_65536_slots(engine):
    install_queue(engine, "big", "ring")
    with engine.connect() as conn:
        assert conn.execute(sa.text('SELECT count(*) FROM queuectl."big_ring"')).scalar() == 65_536
        [info] = list_queues(conn)
    assert info.settings == RingSettings(size=65_536)


@pytest.mark.slow
def test_kind_commands_have_help():
    for args in (["correct-watermark", "--help"], ["repair-ring", "--help"], ["install", "--help"]):
        result = run_cli(*args)
        assert result.returncode == 0 and b"Usage" in result.stdout, args
    assert b"--strict" in run_cli("install", "--help").stdout
