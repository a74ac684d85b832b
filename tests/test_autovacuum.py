"""reliable_0007, ring_0004 and the one-table kinds' <kind>_0003: autovacuum storage
parameters per queue table role, set at install and by the upgrade, removed (exactly those)
by the downgrade, messages kept; the health report shows them; and the probe that measured
them (bench/lab/autovacuum.py) runs."""

from __future__ import annotations

import json
import re
from importlib import resources

import jsonschema
import pytest
import sqlalchemy as sa

from jobs_helpers import scalar, wait_until
from lab_probes import lab_module
from queuectl.client import Queue
from queuectl.health import HealthOptions, health_report, report_schema
from queuectl.install import downgrade_queue, head_of, install_queue, upgrade_queue
from queuectl.registry import list_queues
from queuectl.client import RingQueue, open_queue
from queuectl.kindspec import RingSettings
from queuectl.sqlfiles import sections

# What reliable_0007 sets, per table (sql/postgresql/reliable.sql: set_autovacuum says why).
RELIABLE_0007 = {
    "meta": ["autovacuum_vacuum_cost_delay=0", "autovacuum_vacuum_insert_scale_factor=0",
             "autovacuum_vacuum_insert_threshold=1000", "autovacuum_vacuum_scale_factor=0",
             "autovacuum_vacuum_threshold=1000"],
    "data": ["autovacuum_vacuum_cost_delay=0", "autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=1000"],
    "history": ["autovacuum_vacuum_insert_scale_factor=0", "autovacuum_vacuum_insert_threshold=100000"],
}
INSTALLED = {"meta": ["fillfactor=80"], "data": [], "history": []}  # what create_tables sets
RING_0004 = {"ring": [], "toast": ["autovacuum_vacuum_cost_delay=0"]}  # on the slots' TOAST table only
RING_INSTALLED = {"ring": ["fillfactor=50"], "toast": []}
ONE_TABLE_KINDS = ("heap", "fifo", "stack", "pending", "watermark")
# What <kind>_0003 sets on the items table (sql/postgresql/storage.sql: set_items_autovacuum).
ITEMS_0003 = {"items": ["autovacuum_vacuum_cost_delay=0", "autovacuum_vacuum_scale_factor=0",
                        "autovacuum_vacuum_threshold=1000"]}


def reloptions(engine, queue: str, suffixes=("meta", "data", "history")) -> dict[str, list[str]]:
    """pg_class.reloptions of the queue's tables, sorted ([] for none). A partitioned table
    (reliable_0012's meta and data) holds none: its generation slots must all hold the same."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT c.relname, c.relkind, coalesce(c.reloptions, '{}') FROM pg_class c "
            "WHERE c.relnamespace = 'queuectl'::regnamespace AND c.relname = ANY(:names)"),
            {"names": [f"{queue}_{s}{slot}" for s in suffixes for slot in ("", "0", "1", "2")]}).all()
    found = {name.removeprefix(f"{queue}_"): (kind, sorted(options)) for name, kind, options in rows}
    result = {}
    for s in suffixes:
        kind, options = found[s]
        if kind == "p":
            slots = [found[f"{s}{slot}"][1] for slot in "012"]
            assert options == [] and slots[1:] == slots[:2], (s, slots)
            options = slots[0]
        result[s] = options
    return result


def ring_reloptions(engine, queue: str) -> dict[str, list[str]]:
    """pg_class.reloptions of the ring's slots and of their TOAST table."""
    with engine.connect() as conn:
        ring, toast = conn.execute(sa.text(
            "SELECT coalesce(c.reloptions, '{}'), coalesce(t.reloptions, '{}') FROM pg_class c "
            "JOIN pg_class t ON t.oid = c.reltoastrelid WHERE c.oid = to_regclass(:ring)"),
            {"ring": f'queuectl."{queue}_ring"'}).one()
    return {"ring": sorted(ring), "toast": sorted(toast)}


def expected(*layers: dict[str, list[str]]) -> dict[str, list[str]]:
    return {table: sorted(o for layer in layers for o in layer.get(table, [])) for table in layers[0]}


def test_a_fresh_reliable_queue_has_the_autovacuum_settings_of_each_table_role(engine):
    info = install_queue(engine, "orders")
    assert info.schema_version == head_of("reliable") >= "reliable_0007"
    assert reloptions(engine, "orders") == expected(INSTALLED, RELIABLE_0007)


@pytest.mark.slow
@pytest.mark.parametrize("old", ["reliable_0005", "reliable_0006"])
def test_an_older_queue_upgrades_alone_with_its_messages_and_the_downgrade_resets_exactly_what_was_set(engine, old):
    """From the revision before (reliable_0006) and from reliable_0005, through it."""
    install_queue(engine, "alpha", revision=old)
    install_queue(engine, "beta", revision=old)
    # A DBA's own setting on a parameter the revision does not own survives both ways.
    with engine.begin() as conn:
        conn.execute(sa.text('ALTER TABLE queuectl."alpha_meta" SET (autovacuum_analyze_threshold = 500)'))
    own = {"meta": ["autovacuum_analyze_threshold=500"]}
    assert reloptions(engine, "alpha") == expected(INSTALLED, own)
    with Queue(engine, "alpha") as alpha:
        ids = alpha.enqueue_many([f"a{i}" for i in range(5)])
        first, second = alpha.dequeue(2)
        assert alpha.ack([first]) == 1

        assert upgrade_queue(engine, "alpha") == (old, head_of("reliable"))
        assert reloptions(engine, "alpha") == expected(INSTALLED, own, RELIABLE_0007)
        assert reloptions(engine, "beta") == INSTALLED  # upgraded one at a time
        assert alpha.ack([second]) == 1  # the lease taken before the upgrade is still held
        third = alpha.dequeue(1)
        assert [m.text for m in third] == ["a2"]

        assert downgrade_queue(engine, "alpha", old) == (head_of("reliable"), old)
        assert reloptions(engine, "alpha") == expected(INSTALLED, own)
        assert alpha.ack(third) == 1
        assert [(m.id, m.text) for m in alpha.dequeue(5)] == [(ids[3], "a3"), (ids[4], "a4")]
    with engine.connect() as conn:
        versions = {q.name: q.schema_version for q in list_queues(conn)}
    assert versions == {"alpha": old, "beta": old}


def test_a_fresh_ring_has_no_cost_delay_on_its_toast_table_and_keeps_its_slots_settings(engine):
    info = install_queue(engine, "r", "ring", RingSettings(size=8))
    assert info.schema_version == head_of("ring") >= "ring_0004"
    assert ring_reloptions(engine, "r") == expected(RING_INSTALLED, RING_0004)


def test_a_ring_at_0003_upgrades_alone_with_its_messages_and_the_downgrade_resets_exactly_what_was_set(engine):
    install_queue(engine, "alpha", "ring", RingSettings(size=8), revision="ring_0003")
    install_queue(engine, "beta", "ring", RingSettings(size=8), revision="ring_0003")
    with engine.begin() as conn:  # a DBA's own TOAST setting, one the revision does not own
        conn.execute(sa.text('ALTER TABLE queuectl."alpha_ring" SET (toast.autovacuum_vacuum_threshold = 500)'))
    own = {"toast": ["autovacuum_vacuum_threshold=500"]}
    assert ring_reloptions(engine, "alpha") == expected(RING_INSTALLED, own)
    with RingQueue(engine, "alpha") as q:
        assert q.enqueue_many(["a0", "a1", b"x" * 5000, "a3"]) == [0, 1, 2, 3]  # one in the TOAST table
        assert [m.text for m in q.dequeue(1)] == ["a0"]
    assert upgrade_queue(engine, "alpha") == ("ring_0003", head_of("ring"))
    assert ring_reloptions(engine, "alpha") == expected(RING_INSTALLED, own, RING_0004)
    assert ring_reloptions(engine, "beta") == RING_INSTALLED  # upgraded one at a time
    with RingQueue(engine, "alpha") as q:
        assert [m.text for m in q.dequeue(1)] == ["a1"]
    assert downgrade_queue(engine, "alpha", "ring_0003") == (head_of("ring"), "ring_0003")
    assert ring_reloptions(engine, "alpha") == expected(RING_INSTALLED, own)
    with RingQueue(engine, "alpha") as q:
        assert [m.payload for m in q.dequeue(5)] == [b"x" * 5000, b"a3"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ONE_TABLE_KINDS)
def test_a_fresh_one_table_queue_has_the_autovacuum_settings_on_its_items_table(engine, kind):
    info = install_queue(engine, "q", kind)
    assert info.schema_version == head_of(kind) >= f"{kind}_0003"
    assert reloptions(engine, "q", ("items",)) == ITEMS_0003
    if kind == "watermark":  # its one-row hint table keeps what create_tables gave it
        assert reloptions(engine, "q", ("watermark",)) == {"watermark": ["fillfactor=50"]}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ONE_TABLE_KINDS)
def test_a_one_table_queue_at_0002_upgrades_alone_with_its_items_and_the_downgrade_resets_exactly_what_was_set(
        engine, kind):
    old = f"{kind}_0002"
    install_queue(engine, "alpha", kind, revision=old)
    install_queue(engine, "beta", kind, revision=old)
    with engine.begin() as conn:  # a DBA's own setting on a parameter the revision does not own
        conn.execute(sa.text('ALTER TABLE queuectl."alpha_items" SET (autovacuum_analyze_threshold = 500)'))
    own = {"items": ["autovacuum_analyze_threshold=500"]}
    assert reloptions(engine, "alpha", ("items",)) == own
    with open_queue(engine, "alpha") as alpha:
        alpha.enqueue_many([f"a{i}" for i in range(6)])
        taken = [m.text for m in alpha.dequeue(2)]
    assert upgrade_queue(engine, "alpha") == (old, head_of(kind))
    assert reloptions(engine, "alpha", ("items",)) == expected(own, ITEMS_0003)
    assert reloptions(engine, "beta", ("items",)) == {"items": []}  # upgraded one at a time
    with open_queue(engine, "alpha") as alpha:
        taken += [m.text for m in alpha.dequeue(2)]
    assert downgrade_queue(engine, "alpha", old) == (head_of(kind), old)
    assert reloptions(engine, "alpha", ("items",)) == own
    with open_queue(engine, "alpha") as alpha:
        taken += [m.text for m in alpha.dequeue(10)]
    assert sorted(taken) == [f"a{i}" for i in range(6)]  # every item once, none lost by either step
    if kind in ("fifo", "watermark"):
        assert taken == [f"a{i}" for i in range(6)]
    elif kind == "stack":
        assert taken == [f"a{i}" for i in reversed(range(6))]
    with engine.connect() as conn:
        versions = {q.name: q.schema_version for q in list_queues(conn)}
    assert versions == {"alpha": old, "beta": old}


# -- the SQL sections: what a kind's set_autovacuum sets, its reset_autovacuum resets ------

_ALTER = re.compile(r"ALTER TABLE (\{\{\w+\}\}) (SET|RESET) \((.*?)\);", re.S)


def autovacuum_sections() -> list[tuple[str, str, str]]:
    """(file:set section, set section, reset section) of every pair of PostgreSQL sections
    set_<x>autovacuum / reset_<x>autovacuum (a kind's own, or storage.sql's shared one)."""
    files = [p.name.removesuffix(".sql") for p in resources.files("queuectl.sql").joinpath("postgresql").iterdir()
             if p.name.endswith(".sql")]
    found = []
    for file in sorted(files):
        own = sections("postgresql", file)
        for name in own:
            if re.fullmatch(r"(re)?set_\w*autovacuum", name):
                pair = name.removeprefix("re").removeprefix("set_")
                found.append((f"{file}:{pair}", own.get(f"set_{pair}", ""), own.get(f"reset_{pair}", "")))
    return sorted(set(found))


def parameters(sql: str, verb: str) -> dict[str, list[str]]:
    statements = _ALTER.findall(sql)
    assert statements and all(v == verb for _t, v, _p in statements), sql
    out: dict[str, list[str]] = {}
    for table, _verb, params in statements:
        names = [p.split("=")[0].strip() for p in params.split(",") if p.strip()]
        assert table not in out, f"{table} altered twice"
        out[table] = sorted(names)
    return out


def test_every_reset_autovacuum_resets_exactly_the_parameters_its_set_autovacuum_sets():
    found = autovacuum_sections()
    assert {"reliable:autovacuum", "ring:autovacuum", "storage:items_autovacuum"} <= {file for file, _s, _r in found}
    for file, set_sql, reset_sql in found:
        assert parameters(set_sql, "SET") == parameters(reset_sql, "RESET"), file
        # PostgreSQL 18's cap is an unknown parameter to older servers (the embedded one
        # runs 15): an install there would fail on it.
        assert "autovacuum_vacuum_max_threshold" not in set_sql, file


# -- health ------------------------------------------------------------------------------


@pytest.mark.slow
def test_health_reports_each_tables_own_autovacuum_settings_and_names_them_in_its_advice(engine, db_url):
    install_queue(engine, "new")
    install_queue(engine, "old", revision="reliable_0006")
    install_queue(engine, "r", "ring", RingSettings(size=8))
    install_queue(engine, "f", "fifo")
    with engine.begin() as conn:  # so that the dead rows below wait for the report
        conn.execute(sa.text('ALTER TABLE queuectl."old_meta" SET (autovacuum_enabled = false)'))
    with Queue(db_url, "old") as old:  # its own engine: the session ends, and flushes its statistics
        for _ in range(6):  # 12,000 dead versions in old_meta (dequeue, ack): over the 10,000 warning
            old.enqueue_many([b"x"] * 1000)
            old.ack(old.dequeue(1000))
    wait_until(lambda: scalar(engine, "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'old_meta'") >= 12_000)
    rep = health_report(engine, None, options=HealthOptions())
    data = rep.to_dict()
    jsonschema.validate(data, report_schema(), format_checker=jsonschema.FormatChecker())
    tables = {t["table"]: t for t in data["storage"]["tables"]}
    for role, options in RELIABLE_0007.items():  # reliable_0012: meta and data are three slots each
        for table in [f"new_{role}"] if role == "history" else [f"new_{role}{slot}" for slot in "012"]:
            assert tables[table]["autovacuum"] == dict(o.split("=") for o in options), table
    assert "new_meta" not in tables  # the partitioned parent holds no rows
    assert tables["old_meta"]["autovacuum"] == {"autovacuum_enabled": "false"}
    assert tables["old_data"]["autovacuum"] == {} == tables["old_history"]["autovacuum"]
    assert tables["r_ring"]["autovacuum"] == {"toast.autovacuum_vacuum_cost_delay": "0"}  # its TOAST table's
    assert tables["f_items"]["autovacuum"] == dict(o.split("=") for o in ITEMS_0003["items"])
    [dead] = [c for c in rep.checks if c.id == "storage.dead_tuples" and c.object == "old_meta"]
    assert "autovacuum is off for this table (autovacuum_enabled=false)" in dead.advice, dead.advice
    with pytest.raises(jsonschema.ValidationError):  # the field is required and typed
        broken = json.loads(json.dumps(data, default=str))
        broken["storage"]["tables"][0]["autovacuum"] = ["autovacuum_enabled=false"]
        jsonschema.validate(broken, report_schema())


# -- the probe ---------------------------------------------------------------------------


@pytest.mark.slow
def test_tiny_autovacuum_probe_runs_both_revisions_and_returns_sane_json(db_url, engine):
    """`python bench/lab/autovacuum.py` on a few seconds: both queues run the full cycle
    (producers, consumers, archiver), are sampled, and are removed afterwards."""
    probe = lab_module("autovacuum")
    Options, run = probe.Options, probe.run

    options = Options(seconds=2.0, repeats=1, producers=1, consumers=1, batch=10, backlog=300, sample=0.5,
                      archive_min_age=0.2, retention=0.5, purge_every=0.5)
    result = json.loads(json.dumps(run(db_url, options), default=str))
    assert result["sides"] == {"baseline": "reliable_0006", "head": head_of("reliable")}
    assert result["server"]["autovacuum_naptime"].endswith("s")
    for which in ("baseline", "head"):
        [one] = result["runs"][which]
        assert len(one["samples"]) >= 3
        assert one["consumed"] > 0 and one["rate"] > 0 and one["dequeue_ms"] > 0
        for role in ("meta", "data", "history"):
            cell = one[role]
            assert cell["dead_median"] >= 0 and cell["autovacuums"] >= 0 and cell["autoanalyzes"] >= 0, (which, role)
            assert cell["table_bytes_end"] > 0 and cell["index_bytes_end"] > 0, (which, role)
        assert 0 <= one["meta"]["hot_update_pct"] < 100  # dequeue and ack change status: not HOT
        measured = {role: sorted(one[role]["reloptions"]) for role in ("meta", "data", "history")}
        assert measured == (expected(INSTALLED, RELIABLE_0007) if which == "head" else INSTALLED)
        assert one["history"]["table_bytes_end"] > 8192  # the archiver moved rows
        assert result["medians"][which]["rate"] == one["rate"]
    with engine.connect() as conn:
        assert [q.name for q in list_queues(conn) if q.name.startswith("av_")] == []


@pytest.mark.slow
def test_tiny_autovacuum_probe_of_a_ring_compares_ring_0003_with_the_head(db_url, engine):
    probe = lab_module("autovacuum")
    Options, run = probe.Options, probe.run

    options = Options(kind="ring", seconds=1.5, repeats=1, producers=1, consumers=1, batch=10, backlog=16,
                      sample=0.5, ring_size=64, payload_bytes=3000)
    result = json.loads(json.dumps(run(db_url, options), default=str))
    assert result["sides"] == {"baseline": "ring_0003", "head": head_of("ring")}
    for which in ("baseline", "head"):
        [one] = result["runs"][which]
        assert one["consumed"] > 0 and set(one) >= {"ring", "rate", "dequeue_ms", "samples"}
        assert one["ring"]["hot_update_pct"] > 50
        assert one["ring"]["toast_bytes_end"] > 0  # 3,000-byte payloads are stored out of line
        assert sorted(one["ring"]["reloptions"]) == RING_INSTALLED["ring"]
        assert sorted(one["ring"]["toast_reloptions"]) == (RING_0004["toast"] if which == "head" else [])
    with engine.connect() as conn:
        assert [q.name for q in list_queues(conn) if q.name.startswith("av_")] == []


@pytest.mark.slow
def test_tiny_autovacuum_probe_of_a_one_table_kind_compares_0002_with_the_head(db_url, engine):
    probe = lab_module("autovacuum")
    Options, run = probe.Options, probe.run

    options = Options(kind="fifo", seconds=1.5, repeats=1, producers=1, consumers=1, batch=10, backlog=500,
                      sample=0.5)
    result = json.loads(json.dumps(run(db_url, options), default=str))
    assert result["sides"] == {"baseline": "fifo_0002", "head": head_of("fifo")}
    for which in ("baseline", "head"):
        [one] = result["runs"][which]
        assert one["consumed"] > 0 and one["rate"] > 0 and len(one["samples"]) >= 2
        assert set(one) >= {"items", "rate", "dequeue_ms", "samples"}
        assert one["items"]["table_bytes_end"] > 0 and one["items"]["index_bytes_end"] > 0
        assert one["items"]["hot_update_pct"] is None  # the dequeue deletes: no updates at all
        assert sorted(one["items"]["reloptions"]) == (ITEMS_0003["items"] if which == "head" else [])
    with engine.connect() as conn:
        assert [q.name for q in list_queues(conn) if q.name.startswith("av_")] == []
