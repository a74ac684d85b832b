"""reliable_0009: ack, nack, extend_lease and release find their rows through the primary
key only, so the plan a session caches for them never reads the leased index, however many
items are in flight; reliable_0008's did (its lease check implied the index's predicate).

Each check runs the function in one transaction and reads that transaction's own block
counters of the leased index (pg_stat_get_xact_blocks_fetched, a difference within the
transaction: nothing to wait for, no other session counted), with the session's generic
plans forced: plpgsql switches to the generic plan after five calls whenever it looks no
dearer, which it did in the benchmark (bench/lab/ack_plan.py)."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from lab_probes import lab_module
from queuectl.install import downgrade_queue, head_of, install_queue, upgrade_queue
from queuectl.registry import list_queues
from queuectl.names import QueueNames

from test_plan_guard import GUARD, proconfig

ACK_PLAN = lab_module("ack_plan")
WORKER, lease_items = ACK_PLAN.WORKER, ACK_PLAN.lease_items
autovacuum_off = lab_module("lab_helpers").autovacuum_off

IN_FLIGHT = 3_000  # leased items
CALLS = 8  # more than five: plpgsql's switch to a generic plan, if it were not forced


def leased_queue(engine, name: str, revision: str | None = None, *, analysed: bool) -> list[int]:
    """A queue with IN_FLIGHT items leased (and as many waiting), the probe's fill
    (bench/lab/ack_plan.py): vacuumed and analysed (or not) while 20 were leased, as a queue that
    runs small batches is, and not again when more are leased (a burst, slow handlers);
    autovacuum is off so that nothing analyses it behind the test's back. Returns the ids."""
    names = QueueNames(name)
    install_queue(engine, name, "reliable", revision=revision)
    autovacuum_off(engine, [names.qualified("meta"), names.qualified("data")])
    ids = lease_items(engine, names, IN_FLIGHT, analysed=analysed)
    assert len(ids) == IN_FLIGHT
    return ids


def call(name: str, fn: str) -> str:
    return {"ack": f'SELECT queuectl."{name}_ack"(ARRAY[:id]::bigint[], :worker)',
            "nack": f'SELECT * FROM queuectl."{name}_nack"(ARRAY[:id]::bigint[], \'boom\', :worker)',
            "extend_lease": f'SELECT * FROM queuectl."{name}_extend_lease"(ARRAY[:id]::bigint[], 60, :worker)',
            "release": f'SELECT queuectl."{name}_release"(ARRAY[:id]::bigint[], :worker)'}[fn]


def leased_index_blocks(engine, name: str, fn: str, ids: list[int]) -> tuple[int, int]:
    """Blocks of the leased index that CALLS calls of `fn` (each on one leased item) fetched,
    and how many items they changed; rolled back."""
    # reliable_0012: the leased index of slot 0, where the items are (no rotation runs here);
    # before it, the single meta table's
    fetched = sa.text("SELECT pg_stat_get_xact_blocks_fetched(coalesce(to_regclass(:slot), CAST(:ix AS regclass)))"
                      ).bindparams(slot=f'queuectl."{name}_meta0_leased"', ix=f'queuectl."{name}_meta_leased"')
    with engine.connect() as conn:
        conn.execute(sa.text("SET plan_cache_mode = force_generic_plan"))
        # the counter also holds what the session did before and has not reported yet (a
        # backend reports when idle outside a transaction, at most once a second): a
        # difference taken inside one transaction is this transaction's own
        start = conn.execute(fetched).scalar_one()
        changed = 0
        for item in ids[:CALLS]:
            rows = conn.execute(sa.text(call(name, fn)), {"id": item, "worker": WORKER}).all()
            changed += rows[0][0] if fn in ("ack", "release") else len(rows)
        blocks = conn.execute(fetched).scalar_one() - start
        conn.rollback()
        conn.execute(sa.text("RESET plan_cache_mode"))
        conn.commit()
    return int(blocks), changed


FUNCTIONS = ["ack", "nack", "extend_lease", "release"]


@pytest.mark.slow
@pytest.mark.parametrize("analysed", [False, True], ids=["unanalysed", "analysed"])
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_the_lease_functions_do_not_read_the_leased_index(engine, fn, analysed):
    """The planner looks at the leased index's metapage once (its height); besides that,
    only extend_lease touches the index: its new row version is still leased, so each call
    inserts one entry (one descent, root to leaf: 2-3 blocks)."""
    ids = leased_queue(engine, "q", analysed=analysed)
    blocks, changed = leased_index_blocks(engine, "q", fn, ids)
    assert changed == CALLS
    if fn == "extend_lease":
        assert blocks <= 3 * CALLS + 1, blocks
    else:
        assert blocks <= 1, blocks  # the planner's look at the index's metapage (its height)


@pytest.mark.slow
@pytest.mark.parametrize("analysed", [False, True], ids=["unanalysed", "analysed"])
def test_before_reliable_0009_every_ack_read_the_whole_leased_index_and_the_upgrade_fixes_it(engine, analysed):
    """reliable_0008 shows the flaw, so the test above can tell the two apart; the upgrade
    keeps the plan guard (CREATE OR REPLACE resets SET clauses) and the downgrade puts the
    previous functions back, guard included."""
    ids = leased_queue(engine, "q", "reliable_0008", analysed=analysed)
    before = definitions(engine, "q")
    blocks, changed = leased_index_blocks(engine, "q", "ack", ids)
    assert changed == CALLS
    assert blocks >= 2 * CALLS, blocks  # root and leaves, every call

    assert upgrade_queue(engine, "q") == ("reliable_0008", head_of("reliable"))
    assert proconfig(engine, "q") == {fn: GUARD for fn in ("dequeue", *FUNCTIONS)}
    blocks, changed = leased_index_blocks(engine, "q", "ack", ids)
    assert changed == CALLS and blocks <= 1, blocks

    assert downgrade_queue(engine, "q", "reliable_0008") == (head_of("reliable"), "reliable_0008")
    assert proconfig(engine, "q") == {fn: GUARD for fn in ("dequeue", *FUNCTIONS)}
    assert definitions(engine, "q") == before


def definitions(engine, name: str) -> dict[str, str]:
    with engine.connect() as conn:
        return {fn: conn.execute(sa.text("SELECT pg_get_functiondef(CAST(:fn AS regproc))"),
                                 {"fn": f'queuectl."{name}_{fn}"'}).scalar_one() for fn in FUNCTIONS}


@pytest.mark.slow
def test_tiny_ack_plan_probe(db_url, engine):
    """`python bench/lab/ack_plan.py` on a tiny run: both parts measure both revisions;
    the head's ack never reads the leased index; the cycle acks what it claims; the probe
    removes its queues."""
    REVISIONS, run = ACK_PLAN.REVISIONS, ACK_PLAN.run

    result = json.loads(json.dumps(run(db_url, ["in-flight", "cycle"], in_flight=[40], acks=5, batches=[10],
                                       rounds=2, seconds=1, clients=2, autovacuum=False)))
    cells = result["in_flight"]["cells"]
    assert sorted((c["design"], c["analysed_at_20_leased"]) for c in cells) == sorted(
        (d, a) for d in REVISIONS for a in (True, False))
    for cell in cells:
        assert cell["in_flight"] == 40 and cell["acks"] == 5 and cell["ack_us_median"] > 0, cell
        # the head's meta table is three generation slots (reliable_0012); the items are in slot 0
        meta = "meta0" if cell["design"] == "head" else "meta"
        assert cell["blocks_per_ack"][meta] > 0 and cell["blocks_per_ack"][f"{meta}_pkey"] > 0, cell
        if cell["design"] == "head":
            assert cell["blocks_per_ack"].get("meta0_leased", 0) == 0, cell
    cycle = {c["design"]: c for c in result["cycle"]["cells"]}
    assert set(cycle) == set(REVISIONS) and cycle["0008"]["ratio_to_0008"] == 1.0
    for cell in cycle.values():
        assert len(cell["msgs_per_s"]) == 2 and min(cell["msgs_per_s"]) > 0 and cell["failed"] == 0, cell
        assert cell["autovacuums"] == [0, 0], cell
        for left in cell["left"]:
            assert set(left) <= {"0", "2"}, left  # READY and DONE: every claim was acked
    with engine.connect() as conn:
        assert [q.name for q in list_queues(conn) if q.name.startswith("ack_plan_")] == []
