"""reliable_0008 and the one-table kinds' <kind>_0004: the functions that look rows up keep
plans that go through an index, even when a session cached them while the queue was empty
or held a page (analysed) and the tables grew afterwards (no ANALYZE in between); a running
session gets the setting at its next call after the upgrade; the downgrade resets exactly
that setting (and puts the previous dequeue back); `queuectl grant` keeps it."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from lab_probes import lab_module
from queuectl.bench.drivers import BinaryArray, bench_sql, enqueue_in_chunks, plan_shared_hits
from queuectl.grants import grant_queue
from queuectl.install import downgrade_queue, head_of, install_queue, upgrade_queue
from queuectl.registry import list_queues
from queuectl.client import open_queue
from queuectl.kindspec import FifoSettings
from queuectl.names import QueueNames

from test_grant import roles  # noqa: F401  (the fixture: three fresh roles)

GUARDED = ("dequeue", "ack", "nack", "extend_lease", "release")
GROWN_TO = 20_000
GUARD = ["enable_seqscan=off", "jit=off"]  # what the revisions set (sorted)


def proconfig(engine, queue: str, functions=GUARDED) -> dict[str, list[str]]:
    """Each of the queue's guarded functions: its SET clauses (pg_proc.proconfig)."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT p.proname, coalesce(p.proconfig, '{}') FROM pg_proc p "
            "WHERE p.pronamespace = 'queuectl'::regnamespace AND p.proname = ANY(:names)"),
            {"names": [f"{queue}_{fn}" for fn in functions]}).all()
    return {name.removeprefix(f"{queue}_"): sorted(config) for name, config in rows}


def shared_hits(conn, call: str) -> int:
    """Shared buffers of one call, the function's own statements included; rolled back, so
    every call sees the same rows."""
    plan = [row[0] for row in conn.execute(sa.text(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) {call}"))]
    conn.rollback()
    return plan_shared_hits(plan) or 0  # an empty table: no buffer at all


def calls(queue: str) -> dict[str, str]:
    missing = "ARRAY[-1, -2, -3, -4, -5, -6, -7, -8, -9, -10]::bigint[]"  # ids that are not there
    return {"dequeue": f'SELECT * FROM queuectl."{queue}_dequeue"(10)',
            "ack": f'SELECT queuectl."{queue}_ack"({missing})'}


def cost_per_call(conn, queue: str, times: int = 8) -> dict[str, int]:
    """Buffers of the last of `times` calls of each: plpgsql keeps a generic plan after five."""
    return {what: [shared_hits(conn, call) for _ in range(times)][-1] for what, call in calls(queue).items()}


def small_queue(engine, name: str, revision: str | None = None, rows: int = 20, kind: str = "reliable",
                settings=None) -> None:
    """A few rows (or none), analysed as autovacuum would, and no autovacuum afterwards (it
    would replan the sessions below when it analyses the grown tables)."""
    install_queue(engine, name, kind, settings, **({"revision": revision} if revision else {}))
    tables = [QueueNames(name).qualified(role) for role in (("meta", "data") if kind == "reliable" else ("items",))]
    lab_module("lab_helpers").autovacuum_off(engine, tables)
    if rows:
        with open_queue(engine, name) as q:
            q.enqueue_many([bytes(300)] * rows)
    with engine.connect() as conn:
        conn.execute(sa.text("ANALYZE " + ", ".join(tables)))
        conn.commit()


def grow(engine, name: str, leased: int = 0) -> None:
    with open_queue(engine, name) as q:
        enqueue_in_chunks(q, bytes(300), GROWN_TO)
        if leased:
            q.dequeue(leased)  # in flight, ahead of the ready rows in id order


@pytest.fixture
def early_session(engine):
    """A session that exists before the queue grows (a consumer started on a quiet queue)."""
    conn = engine.connect()
    yield conn
    conn.close()


@pytest.mark.parametrize("rows", [0, 20], ids=["empty", "one-page"])
def test_a_session_that_planned_on_a_small_queue_reads_as_few_buffers_after_growth_as_a_new_one(
        engine, early_session, rows):
    """Empty: every index path costs the same to the planner, which is why reliable_0008 also
    reads the payloads by an array of the claimed ids (a join walked the data table's key)."""
    small_queue(engine, "q", rows=rows)
    assert proconfig(engine, "q") == {fn: GUARD for fn in GUARDED}
    cost_per_call(early_session, "q")  # plans cached on the small queue
    grow(engine, "q", leased=500)
    early = cost_per_call(early_session, "q", times=2)  # the first call marks the leased rows' old entries dead
    with engine.connect() as fresh_conn:
        fresh = cost_per_call(fresh_conn, "q")
    for what in calls("q"):
        assert early[what] <= fresh[what] * 1.5 + 10, (what, early, fresh)


def test_before_reliable_0008_the_early_session_read_the_grown_tables_whole_and_the_upgrade_fixes_it_live(
        engine, early_session):
    """reliable_0007 shows the flaw (so the test above can tell the two apart); the upgrade
    reaches the early session at its next call, without a reconnect; the downgrade removes
    the setting and nothing else."""
    small_queue(engine, "q", revision="reliable_0007")
    installed_at_0007 = dequeue_definition(engine, "q")
    assert proconfig(engine, "q") == {fn: [] for fn in GUARDED}
    cost_per_call(early_session, "q")
    grow(engine, "q", leased=500)
    with engine.connect() as fresh_conn:
        fresh = cost_per_call(fresh_conn, "q")
    stale = cost_per_call(early_session, "q", times=1)
    for what in calls("q"):
        assert stale[what] > fresh[what] * 4, (what, stale, fresh)  # the whole grown table

    assert upgrade_queue(engine, "q") == ("reliable_0007", head_of("reliable"))
    assert proconfig(engine, "q") == {fn: GUARD for fn in GUARDED}
    # against a new session on the upgraded queue (the head's tables are partitioned since
    # reliable_0012, and a session's first calls on them also read their catalog entries)
    fixed = cost_per_call(early_session, "q", times=2)
    with engine.connect() as fresh_conn:
        fresh = cost_per_call(fresh_conn, "q", times=2)
    for what in calls("q"):
        assert fixed[what] <= fresh[what] * 1.5 + 10, (what, fixed, fresh)
        # (since reliable_0012 an ack of ids that are not there probes the current slot, then
        # every slot: measured 268 buffers stale against 91)
        assert stale[what] > fixed[what] * 2.5, (what, stale, fixed)

    assert downgrade_queue(engine, "q", "reliable_0007") == (head_of("reliable"), "reliable_0007")
    assert proconfig(engine, "q") == {fn: [] for fn in GUARDED}
    assert dequeue_definition(engine, "q") == installed_at_0007


def dequeue_definition(engine, name: str) -> str:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT pg_get_functiondef(CAST(:fn AS regproc))"),
                            {"fn": f'queuectl."{name}_dequeue"'}).scalar_one().replace(f"{name}_", "NAME_")


def test_grant_keeps_the_setting_and_a_secured_queue_downgrades_to_its_secured_functions(engine, roles):
    """`queuectl grant` adds SECURITY DEFINER and a search_path to the same SET clauses; the
    downgrade resets enable_seqscan only, so the granted roles keep working."""
    producer, consumer, _ = roles
    install_queue(engine, "g")
    grant_queue(engine, "g", producer=producer, consumer=consumer)
    secured = [*GUARD, "search_path=pg_catalog, pg_temp"]
    assert proconfig(engine, "g") == {fn: secured for fn in GUARDED}
    assert downgrade_queue(engine, "g", "reliable_0007") == (head_of("reliable"), "reliable_0007")
    assert proconfig(engine, "g") == {fn: ["search_path=pg_catalog, pg_temp"] for fn in GUARDED}
    assert upgrade_queue(engine, "g") == ("reliable_0007", head_of("reliable"))
    assert proconfig(engine, "g") == {fn: secured for fn in GUARDED}
    with engine.begin() as conn:  # SET LOCAL: the pooled session goes back as it was
        conn.execute(sa.text(f'SET LOCAL ROLE "{producer}"'))
        conn.execute(sa.text('SELECT queuectl."g_enqueue"(:p)'), {"p": b"x"})
    with engine.begin() as conn:
        conn.execute(sa.text(f'SET LOCAL ROLE "{consumer}"'))
        [row] = conn.execute(sa.text('SELECT id FROM queuectl."g_dequeue"(1)')).all()
        assert conn.execute(sa.text('SELECT queuectl."g_ack"(ARRAY[:i]::bigint[])'), {"i": row.id}).scalar_one() == 1


# -- a backlog that arrives where the statistics say few rows are READY -------------------

SORT_GUARD = "enable_sort=off"
CLAIMS = ("claim_in", "claim_in0", "claim_in1", "claim_in2")


def drained_statistics(engine, name: str, tables: list[str]) -> None:
    """Statistics that say few rows are READY, as autovacuum leaves them after analysing a
    drained generation: every row of a few thousand acked, ANALYZE, then the slot emptied by
    TRUNCATE as the archive job empties it (the statistics stay; the row counts become unknown)."""
    with open_queue(engine, name) as q:
        enqueue_in_chunks(q, bytes(300), 3000)
        while batch := q.dequeue(500):
            q.ack([m.id for m in batch])
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE " + ", ".join(tables)))
        conn.execute(sa.text("TRUNCATE " + ", ".join(tables)))


@pytest.mark.parametrize("statistics", ["none", "drained"])
def test_a_claim_planned_after_a_burst_walks_the_ready_index_whatever_the_statistics_say(engine, statistics):
    """A session that plans its claim while the current slot has no statistics (every slot
    of a new queue until autovacuum first analyses it; each generation starts with a
    truncate, which leaves the row counts unknown) chose a bitmap scan of the whole ready set
    and a sort, and kept that generic plan: each dequeue(10) read every READY row of the
    slot. Since reliable_0016 the claims plan without a sort, so they walk the ready index
    in its order and stop after the batch, however large the backlog, whatever the
    statistics say (also when they describe a drained generation)."""
    install_queue(engine, "b")
    tables = [QueueNames("b").qualified(role) for role in ("meta", "data")]
    lab_module("lab_helpers").autovacuum_off(engine, tables)
    assert all(SORT_GUARD in config for config in proconfig(engine, "b", CLAIMS).values())
    if statistics == "drained":
        drained_statistics(engine, "b", tables)
    cost = {}
    for rows in (2000, GROWN_TO):
        with open_queue(engine, "b") as q:
            enqueue_in_chunks(q, bytes(300), rows)
        with engine.connect() as conn:  # a new session: it plans on the grown tables
            cost[rows] = kind_cost(conn, "b", 8)
        with engine.begin() as conn:
            conn.execute(sa.text("TRUNCATE " + ", ".join(tables)))
    assert cost[GROWN_TO] <= cost[2000] * 1.2 + 10, cost  # the batch's rows, not the backlog's
    if statistics == "drained":
        return

    assert downgrade_queue(engine, "b", "reliable_0015") == (head_of("reliable"), "reliable_0015")
    assert not any(SORT_GUARD in config for config in proconfig(engine, "b", CLAIMS).values())
    with open_queue(engine, "b") as q:
        enqueue_in_chunks(q, bytes(300), GROWN_TO)
    with engine.connect() as conn:
        unguarded = kind_cost(conn, "b", 8)
        assert unguarded > cost[GROWN_TO] * 3, (unguarded, cost)  # the flaw, so the test can tell
        assert upgrade_queue(engine, "b") == ("reliable_0015", head_of("reliable"))
        fixed = kind_cost(conn, "b", 2)  # the same session, at its next call
    assert fixed <= cost[GROWN_TO] * 1.2 + 10, (fixed, cost)


# -- the one-table kinds ------------------------------------------------------------------

KINDS = [("heap", None), ("fifo", None), ("fifo", FifoSettings(strict=True)), ("stack", None), ("pending", None),
         ("watermark", None)]
KIND_IDS = ["heap", "fifo", "fifo-strict", "stack", "pending", "watermark"]


def kind_cost(conn, queue: str, times: int) -> int:
    return [shared_hits(conn, f'SELECT * FROM queuectl."{queue}_dequeue"(10)') for _ in range(times)][-1]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "settings"), KINDS, ids=KIND_IDS)
def test_a_one_table_queue_planned_empty_dequeues_through_its_index_after_growth_and_the_guard_comes_and_goes_live(
        engine, early_session, kind, settings):
    """At <kind>_0003 a session that planned on the empty, analysed queue reads the grown
    table whole at every dequeue; the upgrade reaches that session at its next call; the
    downgrade removes exactly the setting (and pending_0004's dequeue)."""
    functions = ("dequeue", "correct_watermark") if kind == "watermark" else ("dequeue",)
    old = f"{kind}_0003"
    small_queue(engine, "k", revision=old, rows=0, kind=kind, settings=settings)
    installed = dequeue_definition(engine, "k")
    assert proconfig(engine, "k", functions) == {fn: [] for fn in functions}
    kind_cost(early_session, "k", 8)  # plans cached on the empty table
    grow(engine, "k")
    with engine.connect() as fresh_conn:
        fresh = kind_cost(fresh_conn, "k", 8)
    stale = kind_cost(early_session, "k", 2)
    assert stale > fresh * 4, (stale, fresh)  # the whole grown table

    assert upgrade_queue(engine, "k") == (old, head_of(kind))
    assert proconfig(engine, "k", functions) == {fn: GUARD for fn in functions}
    fixed = kind_cost(early_session, "k", 2)
    assert fixed <= fresh * 1.5 + 10, (fixed, fresh)
    with open_queue(engine, "k") as q:  # and it still takes the right items
        got = [m.id for m in q.dequeue(3)]
    ids = sorted(got)
    if kind in ("fifo", "pending", "watermark"):
        assert got == ids and ids[0] == 1, got
    elif kind == "stack":
        assert got == sorted(got, reverse=True) and got[0] == GROWN_TO, got

    assert downgrade_queue(engine, "k", old) == (head_of(kind), old)
    assert proconfig(engine, "k", functions) == {fn: [] for fn in functions}
    assert dequeue_definition(engine, "k") == installed  # pending: pending_0002's dequeue again


def burst(engine, name: str, rows: int = GROWN_TO) -> None:
    """`rows` items enqueued in one call (bench.sql cost_fill), so in one transaction: one
    due time for all."""
    with engine.begin() as conn:
        conn.execute(sa.text(bench_sql("cost_fill", QueueNames(name).template_values())),
                     {"pool": BinaryArray([bytes(300)]), "rows": rows})


def test_a_pending_dequeue_planned_on_an_empty_table_deletes_its_picks_without_walking_their_due_time(
        engine, early_session):
    """A session that planned its dequeue on the empty table (a new queue, or after the compact
    job's TRUNCATE) ANDed, for the DELETE of its picks, a scan of the due index by their due
    times: after a burst enqueued in one transaction (one due time for all) each dequeue(10)
    read every entry of it. Since pending_0005 the DELETE takes the picks by row address and
    that session reads what a new one reads; pending_0004 shows the flaw (and the upgrade
    reaches the early session at its next call)."""
    install_queue(engine, "p", "pending")
    table = QueueNames("p").qualified("items")
    lab_module("lab_helpers").autovacuum_off(engine, [table])
    cost = {}
    for revision in (head_of("pending"), "pending_0004"):
        if revision == "pending_0004":
            assert downgrade_queue(engine, "p", revision) == (head_of("pending"), revision)
        with engine.begin() as conn:
            conn.execute(sa.text("TRUNCATE " + table))
        kind_cost(early_session, "p", 8)  # plans cached on the empty table
        burst(engine, "p")
        with engine.connect() as fresh_conn:
            fresh = kind_cost(fresh_conn, "p", 8)
        cost[revision] = (kind_cost(early_session, "p", 2), fresh)
    (fixed, fresh), (stale, fresh_before) = cost[head_of("pending")], cost["pending_0004"]
    assert fixed <= fresh * 1.2 + 10, cost
    assert stale > fresh_before * 2, cost  # the flaw, so the test can tell
    assert upgrade_queue(engine, "p") == ("pending_0004", head_of("pending"))
    assert kind_cost(early_session, "p", 2) <= fresh * 1.2 + 10, cost
    with open_queue(engine, "p") as q:  # and it still takes the earliest due, in order
        got = [m.id for m in q.dequeue(5)]
    assert got == sorted(got) and len(got) == 5, got


# -- the probe ---------------------------------------------------------------------------


@pytest.mark.slow
def test_tiny_plan_guard_probe_runs_both_parts_and_removes_its_queues(db_url, engine):
    """`python bench/lab/plan_guard.py` on a tiny run: the stale part shows the early
    session of the revision before reading more than the head's; pgbench ran each side."""
    probe = lab_module("plan_guard")
    BATCHES, PREFILLS, run = probe.BATCHES, probe.PREFILLS, probe.run

    result = json.loads(json.dumps(run(db_url, ["reliable", "fifo"], grow=3000, leased=50, rows=500, repeats=1,
                                       seconds=1)))
    cells = {(c["kind"], c["revision"], c["prefill"]): c for c in result["stale"]}
    assert len(cells) == 2 * 2 * len(PREFILLS)
    for kind, before in (("reliable", "reliable_0007"), ("fifo", "fifo_0003")):
        for prefill in PREFILLS:
            old, new = cells[(kind, before, prefill)], cells[(kind, head_of(kind), prefill)]
            assert new["buffers_early"] <= new["buffers_new_session"] * 1.5 + 10, new
            assert old["buffers_early"] > new["buffers_early"], (old, new)
    assert [c["kind"] for c in result["cost"]] == ["reliable", "fifo"]
    for cell in result["cost"]:
        assert set(cell["batches"]) == {str(b) for b in BATCHES}
        for b in cell["batches"].values():
            assert b["before_median"] > 0 and b["head_median"] > 0 and b["ratio"] > 0
    with engine.connect() as conn:
        assert [q.name for q in list_queues(conn) if q.name.startswith("pg_")] == []


@pytest.mark.slow
def test_tiny_hot_bound_probe_makes_only_the_reduced_claim_hot(db_url, engine):
    """`python bench/lab/hot_bound.py` on a tiny run: every queue cycled messages under
    pgbench; the installed reliable queue's meta updates are never HOT (status is in its
    indexes' predicates), the reduced `hot` queue's claims are, autovacuum stays off the tables
    when asked, and the probe removes its queues."""
    probe = lab_module("hot_bound")
    DESIGNS, run = probe.DESIGNS, probe.run

    result = json.loads(json.dumps(run(db_url, [10], rounds=2, seconds=1, clients=2, autovacuum=False)))
    assert result["autovacuum"] is False
    cells = {c["design"]: c for c in result["cells"]}
    assert set(cells) == set(DESIGNS)
    for design, cell in cells.items():
        assert len(cell["msgs_per_s"]) == 2 and min(cell["msgs_per_s"]) > 0, cell
        assert cell["failed"] == 0 and cell["updates"] > 0, cell
        assert cell["autovacuums"] == [0, 0], cell  # autovacuum is off on the probe's tables
        for left in cell["left"]:  # nothing but READY rows and, for the acking queues, DONE rows
            assert set(left) <= ({"0"} if design == "hot" else {"0", "2"}), (design, left)
    assert cells["rel"]["hot_updates"] == 0 and cells["nofin"]["hot_updates"] == 0
    # the claim is the hot queue's only update: most of them must be HOT
    assert cells["hot"]["hot_ratio"] > 0.5, cells["hot"]
    assert cells["rel"]["ratio_to_rel"] == 1.0
    with engine.connect() as conn:
        assert [q.name for q in list_queues(conn) if q.name.startswith("hot_bound_")] == []
