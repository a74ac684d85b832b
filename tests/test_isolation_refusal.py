"""The ring's and the watermark kind's calls refuse REPEATABLE READ and SERIALIZABLE (ring_0008,
watermark_0005: SQLSTATE QC400, the reliable queue's form), before they read or change
anything; READ COMMITTED runs as before; enqueue-only watermark calls run at any level; the
upgrade and the downgrade keep every row and claim; the compaction hazard the check closes."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from queuectl.client import RingQueue, WatermarkQueue
from queuectl.client.calls import Call
from queuectl.client.calls import refusal as client_refusal
from queuectl.engine import adapter_for
from queuectl.errors import UsageError
from queuectl.install import downgrade_queue, install_queue, install_script, upgrade_queue
from queuectl.jobs import compact
from queuectl.kindspec import NoSettings, RingSettings

LEVELS = ("REPEATABLE READ", "SERIALIZABLE")
FORCE = compact.CompactConfig(force=True)

# each refusing call, as a SQL-API caller writes it (r: a plain ring, f: a fan-out ring with
# subscription 's' holding one claim, w: a watermark queue)
RING_CALLS = {
    "enqueue": "SELECT queuectl.\"r_enqueue\"('\\x61'::bytea, NULL, 0)",
    "enqueue_many": "SELECT * FROM queuectl.\"r_enqueue_many\"(ARRAY['\\x61'::bytea], NULL, 0)",
    "dequeue": 'SELECT * FROM queuectl."r_dequeue"(1, 0)',
    "ring_repair": "SELECT * FROM queuectl.\"r_ring_repair\"(interval '0', 0)",
    "ring_release": 'SELECT * FROM queuectl."r_ring_release"(0)',
    "publish": "SELECT * FROM queuectl.\"f_publish\"(ARRAY['\\x61'::bytea], NULL, 0)",
    "sub_take": "SELECT * FROM queuectl.\"f_sub_take\"('s', 1, 30, 0)",
    "sub_done": "SELECT * FROM queuectl.\"f_sub_done\"('s', ARRAY[:id]::bigint[], ARRAY[:tries])",
    "sub_return": "SELECT * FROM queuectl.\"f_sub_return\"('s', ARRAY[:id]::bigint[], ARRAY[:tries])",
    "subscribe": "SELECT * FROM queuectl.\"f_subscribe\"('t')",
    "unsubscribe": "SELECT queuectl.\"f_unsubscribe\"('s')",
}
WATERMARK_CALLS = {
    "dequeue": 'SELECT * FROM queuectl."w_dequeue"(1)',
    "correct_watermark": 'SELECT * FROM queuectl."w_correct_watermark"()',
}


def state(engine) -> dict:
    """Every row of the queues' tables and every sequence's position."""
    out: dict = {}
    with engine.connect() as conn:
        tables = conn.execute(sa.text(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'queuectl' "
            "AND table_type = 'BASE TABLE' AND table_name ~ '^[rfw]_' AND table_name !~ '_version$' ORDER BY 1")).scalars().all()
        for t in tables:
            out[t] = sorted(map(repr, conn.execute(sa.text(f'SELECT * FROM queuectl."{t}"')).all()))
        out["sequences"] = conn.execute(sa.text(
            "SELECT sequencename, last_value FROM pg_sequences WHERE schemaname = 'queuectl' ORDER BY 1")).all()
    return out


def at(engine, level: str):
    conn = engine.connect()
    conn.execute(sa.text(f"SET TRANSACTION ISOLATION LEVEL {level}"))
    return conn


def setup_queues(engine, ring_revision: str | None = None, watermark_revision: str | None = None) -> dict:
    """r with two messages, f with a subscription holding one claim and one message waiting,
    w with three items; returns the claim's (id, tries)."""
    install_queue(engine, "r", "ring", RingSettings(size=8), revision=ring_revision)
    install_queue(engine, "f", "ring", RingSettings(size=8, fanout=True), revision=ring_revision)
    install_queue(engine, "w", "watermark", NoSettings(), revision=watermark_revision)
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT queuectl.\"r_enqueue\"('\\x61'::bytea, NULL, 0)"))
        conn.execute(sa.text("SELECT queuectl.\"r_enqueue\"('\\x62'::bytea, NULL, 0)"))
        conn.execute(sa.text("SELECT * FROM queuectl.\"f_subscribe\"('s')"))
        conn.execute(sa.text("SELECT * FROM queuectl.\"f_publish\"(ARRAY['\\x61'::bytea, '\\x62'::bytea], NULL, 0)"))
        taken = conn.execute(sa.text("SELECT id, tries FROM queuectl.\"f_sub_take\"('s', 1, 300, 0)")).one()
        conn.execute(sa.text("SELECT queuectl.\"w_enqueue_many\"(ARRAY['\\x61'::bytea, '\\x62'::bytea, '\\x63'::bytea])"))
    return {"id": taken.id, "tries": taken.tries}


def refusal(engine, level: str, sql: str, params: dict) -> DBAPIError:
    conn = at(engine, level)
    try:
        with pytest.raises(DBAPIError) as caught:
            conn.execute(sa.text(sql), params if ":id" in sql else {})
    finally:
        conn.rollback()
        conn.close()
    return caught.value


@pytest.mark.parametrize("level", LEVELS)
def test_every_ring_and_watermark_call_that_reads_the_queue_refuses_the_level_and_changes_nothing(engine, level):
    claim = setup_queues(engine)
    before = state(engine)
    fanout = {"publish", "sub_take", "sub_done", "sub_return", "subscribe", "unsubscribe"}
    calls = [("f" if c in fanout else "r", c, s) for c, s in RING_CALLS.items()]
    calls += [("w", c, s) for c, s in WATERMARK_CALLS.items()]
    for queue, call, sql in calls:
        exc = refusal(engine, level, sql, claim)
        assert exc.orig.sqlstate == "QC400", (call, exc)
        message = exc.orig.diag.message_primary
        assert message.startswith(f"queue '{queue}': {call} runs in READ COMMITTED transactions only "
                                  f"(this one is {level.lower()}): an older snapshot sees the "), message
        assert "compact job has rewritten" in message
    assert state(engine) == before  # nothing claimed, released, repaired, moved or drawn


def test_read_committed_runs_every_call_and_watermark_enqueues_run_at_any_level(engine):
    claim = setup_queues(engine)
    with at(engine, "READ COMMITTED") as conn:
        assert [r.payload for r in conn.execute(sa.text(RING_CALLS["dequeue"]))] == [b"a"]
        assert conn.execute(sa.text(RING_CALLS["enqueue"])).scalar() is not None
        assert len(conn.execute(sa.text(RING_CALLS["enqueue_many"])).all()) == 1
        conn.execute(sa.text(RING_CALLS["ring_repair"])).all()
        conn.execute(sa.text(RING_CALLS["ring_release"])).all()
        assert conn.execute(sa.text(RING_CALLS["sub_return"]), claim).scalars().all() == [claim["id"]]
        [taken] = conn.execute(sa.text(RING_CALLS["sub_take"])).all()
        assert conn.execute(sa.text(RING_CALLS["sub_done"]), {"id": taken.id, "tries": taken.tries}).scalars().all() \
            == [taken.id]
        assert len(conn.execute(sa.text(RING_CALLS["publish"])).all()) == 1
        assert conn.execute(sa.text(RING_CALLS["subscribe"])).one().name == "t"
        assert conn.execute(sa.text("SELECT queuectl.\"f_unsubscribe\"('t')")).scalar() is True
        assert [r.payload for r in conn.execute(sa.text(WATERMARK_CALLS["dequeue"]))] == [b"a"]
        conn.execute(sa.text(WATERMARK_CALLS["correct_watermark"])).one()
        conn.commit()
    for level in LEVELS:
        # an insert needs no snapshot of the items table: ids come from the sequence
        with at(engine, level) as conn:
            assert conn.execute(sa.text("SELECT queuectl.\"w_enqueue\"('\\x64'::bytea)")).scalar() is not None
            assert len(conn.execute(sa.text("SELECT queuectl.\"w_enqueue_many\"(ARRAY['\\x65'::bytea])")).all()) == 1
            conn.commit()
    with WatermarkQueue(engine, "w") as q:
        assert [m.payload for m in q.dequeue(10)] == [b"b", b"c", b"d", b"e", b"d", b"e"]  # once per level


def test_the_client_raises_usage_error_with_the_servers_line(engine):
    """The clients run at READ COMMITTED; a refusal that reaches them (a caller's own
    transaction) is the UsageError the reliable queue's refusal gives, with the server's line."""
    claim = setup_queues(engine)
    adapter = adapter_for(engine)
    for queue, call, sql in (("r", "dequeue", RING_CALLS["dequeue"]), ("f", "sub_done", RING_CALLS["sub_done"]),
                             ("w", "dequeue", WATERMARK_CALLS["dequeue"])):
        exc = refusal(engine, "SERIALIZABLE", sql, claim)
        raised = client_refusal(adapter, Call(call, {}, list), queue, exc, "test")
        assert isinstance(raised, UsageError)
        assert str(raised) == exc.orig.diag.message_primary
        assert str(raised).startswith(f"queue '{queue}': {call} runs in READ COMMITTED transactions only")


def test_upgrade_and_downgrade_keep_every_row_and_claim(engine):
    claim = setup_queues(engine, ring_revision="ring_0007", watermark_revision="watermark_0004")
    before = state(engine)
    # the old bodies do not refuse
    with at(engine, "REPEATABLE READ") as conn:
        conn.execute(sa.text(RING_CALLS["ring_release"])).all()
        conn.execute(sa.text(WATERMARK_CALLS["correct_watermark"])).one()
        conn.rollback()
    assert upgrade_queue(engine, "r", schema="queuectl") == ("ring_0007", "ring_0008")
    assert upgrade_queue(engine, "f", schema="queuectl") == ("ring_0007", "ring_0008")
    assert upgrade_queue(engine, "w", schema="queuectl") == ("watermark_0004", "watermark_0005")
    assert state(engine) == before
    for sql in (RING_CALLS["dequeue"], RING_CALLS["sub_done"], WATERMARK_CALLS["dequeue"]):
        assert refusal(engine, "REPEATABLE READ", sql, claim).orig.sqlstate == "QC400"
    with engine.connect() as conn:  # the plan guard is set again after the replace
        config = conn.execute(sa.text("SELECT proconfig FROM pg_proc WHERE proname = 'w_dequeue'")).scalar()
        assert config and "enable_seqscan=off" in config
    assert downgrade_queue(engine, "r", "ring_0007", schema="queuectl")[1] == "ring_0007"
    assert downgrade_queue(engine, "f", "ring_0007", schema="queuectl")[1] == "ring_0007"
    assert downgrade_queue(engine, "w", "watermark_0004", schema="queuectl")[1] == "watermark_0004"
    assert state(engine) == before
    with engine.connect() as conn:
        config = conn.execute(sa.text("SELECT proconfig FROM pg_proc WHERE proname = 'w_dequeue'")).scalar()
        assert config and "enable_seqscan=off" in config
        lang = conn.execute(sa.text("SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
                                    "WHERE p.proname = 'f_sub_done'")).scalar()
        assert lang == "sql"  # ring_0006's body back
    with at(engine, "REPEATABLE READ") as conn:  # the old bodies are back: no refusal
        conn.execute(sa.text(RING_CALLS["sub_done"]), claim).all()
        conn.rollback()
    # up again, and everything is delivered once, the claim acknowledged under its id
    upgrade_queue(engine, "r", schema="queuectl")
    upgrade_queue(engine, "f", schema="queuectl")
    upgrade_queue(engine, "w", schema="queuectl")
    with engine.begin() as conn:
        assert conn.execute(sa.text(RING_CALLS["sub_done"]), claim).scalars().all() == [claim["id"]]
        assert [r.payload for r in conn.execute(sa.text("SELECT * FROM queuectl.\"f_sub_take\"('s', 10, 30, 0)"))] \
            == [b"b"]
    with RingQueue(engine, "r") as q:
        assert [m.payload for m in q.dequeue(10)] == [b"a", b"b"]
    with WatermarkQueue(engine, "w") as q:
        assert [m.payload for m in q.dequeue(10)] == [b"a", b"b", b"c"]


def test_install_sql_shows_the_check():
    for kind, settings in (("ring", RingSettings(size=8)), ("watermark", NoSettings())):
        script = install_script(None, "q", kind, settings)
        assert "ERRCODE = 'QC400'" in script
        assert "READ COMMITTED transactions only" in script


@pytest.mark.parametrize("revision", ["ring_0007", "ring_0008"])
def test_a_pop_older_than_a_compaction_gives_up_its_claims_before_the_check_and_is_refused_after(engine, revision):
    install_queue(engine, "r", "ring", RingSettings(size=4), revision=revision)
    with RingQueue(engine, "r") as q:
        ids = q.enqueue_many([b"a", b"b"])
    old = at(engine, "REPEATABLE READ")
    try:
        old.execute(sa.text("SELECT 1 FROM pg_class LIMIT 1")).scalar()  # the snapshot, before the compaction
        assert compact.run_once(engine, "r", FORCE, schema="queuectl").compactions == 1
        if revision == "ring_0007":
            # the hazard: the slots look empty to it; it claims both positions and gives them up
            assert old.execute(sa.text('SELECT * FROM queuectl."r_dequeue"(2, 0)')).all() == []
            old.commit()
            assert old.execute(sa.text('SELECT * FROM queuectl."r_dequeue"(2, 0)')).all() == []
            old.commit()
        else:
            with pytest.raises(DBAPIError) as caught:
                old.execute(sa.text('SELECT * FROM queuectl."r_dequeue"(2, 0)'))
            assert caught.value.orig.sqlstate == "QC400"
            old.rollback()
    finally:
        old.close()
    with RingQueue(engine, "r") as q:
        taken = q.dequeue(10)
        if revision == "ring_0007":
            assert taken == []  # both wait for ring_repair, which moves them to new ids
            again = []
            for _ in range(3):  # a rescued message may land on a position the old session claimed
                q.repair(grace=0)
                again += q.dequeue(10)
            assert sorted(m.payload for m in again) == [b"a", b"b"] and {m.id for m in again}.isdisjoint(ids)
        else:
            assert [(m.id, m.payload) for m in taken] == list(zip(ids, [b"a", b"b"]))  # delivered at once, same ids
