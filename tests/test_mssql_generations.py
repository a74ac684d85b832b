"""SQL Server, checked without a server: the reliable queue's generations in T-SQL
(sql/mssql/reliable.sql's header: three slot tables per role, the rotation state in
sequences, the rotator's procedures), parse- and reference-checked, not run live.

test_mssql_offline parses every section and test_mssql_refs resolves every name; these
tests check the shape the design needs: the install creates the three slots, each
statement names only the slot tables it should, the claim is one statement per slot, the
truncate runs under a short LOCK_TIMEOUT after its table locks, the rotation state moves
only by draws, and the job runs the rotation on both engines. tests/test_mssql_live_rotation.py
runs the behaviour against a server.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from queuectl.install import install_script
from queuectl.jobs.archive import Rotator
from queuectl.jobs.base import JobTarget
from queuectl.names import QueueNames
from queuectl.sqlfiles import section, split_go_batches

from test_mssql_offline import check_tsql, rendered

SLOT_TABLE = re.compile(r'"orders_(meta|data)([0-2])"')
SINGLE_TABLE = re.compile(r'"queuectl"\."orders_(meta|data)"')
# the sections whose procedures run on the generation layout
GENERATION_SECTIONS = ("create_functions", "create_dequeue", "create_enqueue_functions", "create_rotator")


def procedures(name: str) -> dict[str, str]:
    """The CREATE OR ALTER PROCEDURE batches of a reliable.sql section, by procedure suffix."""
    found = {}
    for batch in split_go_batches(rendered("reliable", name)):
        match = re.match(r'CREATE OR ALTER PROCEDURE "queuectl"\."orders_(\w+)"', batch)
        if match:
            found[match.group(1)] = batch
    return found


def all_procedures() -> dict[str, str]:
    return {proc: text for name in GENERATION_SECTIONS for proc, text in procedures(name).items()}


def slot_branches(text: str) -> list[tuple[int, str]]:
    """(slot, body) of every per-slot branch: `IF @x = k` / `ELSE IF @x = k` / the final `ELSE`
    of such a chain (slot 2), and rot_move's `IF @to <> k` (slot k), each to its END at the
    IF's indentation."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        chain = re.match(r"^(\s*)(?:ELSE )?IF @\w+ (?:=|<>) ([0-2])$", line)
        last = re.match(r"^(\s*)ELSE$", line)
        if not (chain or last):
            continue
        indent = (chain or last).group(1)
        slot = int(chain.group(2)) if chain else 2
        body = []
        for follow in lines[i + 1:]:
            body.append(follow)
            if follow == f"{indent}END":
                break
        found.append((slot, "\n".join(body)))
    return found


# -- the layout --------------------------------------------------------------------------------


def test_the_install_creates_three_slots_of_meta_and_data_with_their_indexes():
    flat = " ".join(install_script(None, "orders", "reliable", dialect="mssql").split())
    for s in range(3):
        assert f'CREATE TABLE "queuectl"."orders_meta{s}" (' in flat
        assert f'CREATE TABLE "queuectl"."orders_data{s}" (' in flat
        assert f'CREATE INDEX "orders_meta{s}_ready" ON "queuectl"."orders_meta{s}" (priority, due_at, id) WHERE status = 0' in flat
        assert f'CREATE INDEX "orders_meta{s}_leased" ON "queuectl"."orders_meta{s}" (leased_until) WHERE status = 1' in flat
        assert (f'CREATE INDEX "orders_meta{s}_finished" ON "queuectl"."orders_meta{s}" (status, finished_at) '
                "WHERE status >= 2") in flat
    # the single tables leave; views of the same names read every slot
    assert 'DROP TABLE "queuectl"."orders_meta";' in flat and 'DROP TABLE "queuectl"."orders_data";' in flat
    assert re.search(r'CREATE OR ALTER VIEW "queuectl"\."orders_meta" AS SELECT .*? FROM "queuectl"\."orders_meta0" '
                     r'UNION ALL SELECT .*? FROM "queuectl"\."orders_meta1" UNION ALL SELECT .*? FROM "queuectl"\."orders_meta2"',
                     flat)
    for seq in ("rot_epoch", "rot_sealed", "rot_emptied", "rot_start"):
        assert re.search(rf'CREATE SEQUENCE "queuectl"\."orders_{seq}" AS bigint START WITH -?[01] MINVALUE -?[01] NO CACHE', flat)
    # the generation procedures come last: reliable_0012 creates them
    head = flat[flat.index("SET version_num='reliable_0011'"):]
    for proc in ("rot_move", "rot_follow", "ack", "nack", "dequeue", "enqueue", "rot_empty", "rot_switch"):
        assert f'CREATE OR ALTER PROCEDURE "queuectl"."orders_{proc}"' in head, proc


def test_the_slot_tables_take_no_foreign_key_so_truncate_table_may_empty_them():
    """TRUNCATE TABLE refuses a table that a foreign key references: data's key to meta stays
    on the single tables only."""
    text = rendered("reliable", "create_rotation")
    assert "REFERENCES" not in text and text.count("CREATE TABLE") == 6


# -- every statement names the slot tables it should ---------------------------------------------


def test_no_generation_procedure_writes_or_reads_the_single_table_names():
    """<queue>_meta and <queue>_data are views over the slots once reliable_0012 ran: a claim,
    an ack or a move through them would fail (hints on a view) or lock every slot."""
    found = {proc: SINGLE_TABLE.findall(text) for proc, text in all_procedures().items()}
    assert {proc: names for proc, names in found.items() if names} == {}
    assert len(found) >= 15, sorted(found)


def test_each_per_slot_branch_names_only_its_own_slots_tables():
    checked = 0
    for proc, text in all_procedures().items():
        for slot, body in slot_branches(text):
            names = {int(n) for _, n in SLOT_TABLE.findall(body)}
            assert names <= {slot}, (proc, slot, body[:300])
            checked += bool(names)
    assert checked >= 40, checked


def test_the_procedures_that_may_meet_a_row_in_any_slot_reach_all_three():
    for proc in ("ack", "nack", "extend_lease", "release", "rot_move"):
        text = all_procedures()[proc]
        assert {n for _, n in SLOT_TABLE.findall(text)} == {"0", "1", "2"}, proc


def test_the_writers_follow_a_switch_inside_their_transaction():
    """header, 2: enqueue, enqueue_many, nack and release read the epoch, write, and move their
    own rows if a switch came meanwhile, before they commit."""
    for proc in ("enqueue", "enqueue_many", "nack", "release"):
        text = all_procedures()[proc]
        follow = text.index('EXEC "queuectl"."orders_rot_follow"')
        assert text.index("BEGIN TRANSACTION;") < follow < text.index("COMMIT TRANSACTION;"), proc


def test_ack_dequeue_names_no_table_and_calls_ack_inside_its_transaction():
    batch = split_go_batches(rendered("reliable", "create_ack_dequeue"))[0]
    assert not SINGLE_TABLE.search(batch) and not SLOT_TABLE.search(batch)
    flat = " ".join(batch.split())
    assert 'INSERT INTO @acked (acked) EXEC "queuectl"."orders_ack" @ids = @ack_ids, @worker = @worker;' in flat
    assert flat.index("BEGIN TRANSACTION;") < flat.index("INSERT INTO @acked") < flat.index("COMMIT TRANSACTION;")


# -- the claim ------------------------------------------------------------------------------------


def test_the_claim_is_one_statement_per_slot_through_its_ready_index():
    text = all_procedures()["dequeue"]
    flat = " ".join(text.split())
    claims = re.findall(r"WITH picked AS \( SELECT TOP \(@n - @got\) .*? SET @got \+= @@ROWCOUNT;", flat)
    assert len(claims) == 3
    for s, claim in enumerate(claims):
        assert (f'FROM "queuectl"."orders_meta{s}" AS m WITH (UPDLOCK, READPAST, ROWLOCK, '
                f'INDEX("orders_meta{s}_ready"))') in claim
        assert "ORDER BY m.priority, m.due_at, m.id ) UPDATE p SET" in claim
        assert f'JOIN "queuectl"."orders_data{s}" AS d WITH (INDEX(1), FORCESEEK) ON d.id = p.id;' in claim
        assert claim.count("UPDATE ") == 1 and "INTO @claimed" in claim
        assert {n for _, n in SLOT_TABLE.findall(claim)} == {str(s)}
    # the open slots only: the previous epoch's while it is not sealed, then the current one
    assert "CASE WHEN @sealed >= @epoch - 1 THEN @epoch ELSE @epoch - 1 END" in flat
    assert flat.index("orders_rot_sealed") < flat.index("orders_rot_epoch")  # header, 3


# -- the rotator ----------------------------------------------------------------------------------


def test_the_truncate_runs_under_a_short_lock_timeout_after_its_table_locks():
    text = all_procedures()["rot_empty"]
    flat = " ".join(text.split())
    timeout = flat.index("SET LOCK_TIMEOUT 50;")
    begin = flat.index("BEGIN TRANSACTION;")
    for s in range(3):
        lock = flat.index(f'FROM "queuectl"."orders_meta{s}" AS m WITH (TABLOCKX, HOLDLOCK)')
        assert f'FROM "queuectl"."orders_data{s}" AS d WITH (TABLOCKX, HOLDLOCK)' in flat
        truncate = flat.index(f'TRUNCATE TABLE "queuectl"."orders_meta{s}";')
        assert timeout < begin < lock < truncate < flat.index("COMMIT TRANSACTION;", truncate)
        assert f'TRUNCATE TABLE "queuectl"."orders_data{s}";' in flat
    # the state is read again under the locks, and nothing is done if another rotator moved on
    assert flat.index("WITH (TABLOCKX, HOLDLOCK)") < flat.index("@epoch = @again OUTPUT")
    # no other procedure truncates
    others = [p for p, t in all_procedures().items() if "TRUNCATE" in t and p != "rot_empty"]
    assert others == []


def test_no_statement_moves_or_copies_past_lock_escalation():
    """A statement that takes 5,000 row locks on one table escalates to a table lock, which
    would stop every claim on the slot: the seal and the truncate move 2,000 rows at a time,
    the precopy refuses batches over 4,000."""
    procs = all_procedures()
    assert procs["rot_seal"].count("SELECT TOP (2000) m.id") == 3
    assert procs["rot_empty"].count("SELECT TOP (2000) m.id") == 3
    assert "@batch > 4000" in procs["rot_copy"] and "@batch = 4000" in procs["rot_empty"]


def test_the_rotation_state_moves_only_by_draws_under_an_application_lock():
    text = section("mssql", "reliable", "create_rotator") + section("mssql", "reliable", "create_functions")
    assert "ALTER SEQUENCE" not in text and "ALTER SEQUENCE" not in section("mssql", "reliable", "create_rotation")
    procs = all_procedures()
    for proc in ("rot_switch", "rot_mark"):
        flat = " ".join(procs[proc].split())
        lock = flat.index("EXEC @rc = sys.sp_getapplock")
        assert "@LockOwner = 'Transaction'" in flat
        assert flat.index("BEGIN TRANSACTION;") < lock < flat.index("NEXT VALUE FOR")
    assert "sys.sp_sequence_get_range" in procs["rot_switch"]
    # without the lock (sp_getapplock < 0) nothing advances
    assert "IF @rc >= 0 AND" in procs["rot_switch"] and "IF @rc < 0\n        THROW 50013" in procs["rot_mark"]


def test_every_procedure_that_reads_the_rotation_state_runs_as_its_owner():
    """Metadata visibility follows the caller: a role granted only EXECUTE would read no row of
    sys.sequences, and every epoch would be NULL."""
    readers = {p: t for p, t in all_procedures().items() if "sys.sequences" in t}
    assert len(readers) >= 12
    assert [p for p, t in readers.items() if "WITH EXECUTE AS OWNER" not in t] == []


def test_the_older_revisions_and_the_downgrade_keep_the_single_table_bodies():
    """reliable_0001..0011 create, and the downgrade of reliable_0012 puts back, procedures on
    the single tables (sql/mssql/history/reliable.sql)."""
    for name in ("create_functions_0001", "create_functions_0009", "create_dequeue_0001", "create_dequeue_0008",
                 "create_enqueue_functions_0010"):
        text = rendered("reliable", name)
        assert SINGLE_TABLE.search(text) and not SLOT_TABLE.search(text), name
        check_tsql(text)
    down = rendered("reliable", "drop_rotation")
    assert 'CREATE TABLE "queuectl"."orders_meta" (' in down and "REFERENCES" in down
    assert down.index("DROP SEQUENCE") < down.index("DROP VIEW") < down.index('CREATE TABLE "queuectl"."orders_meta"')


# -- the job runs the rotation on both engines ------------------------------------------------------

ROT_COLUMNS = {
    "rot_state": ["epoch", "sealed", "emptied", "start_id", "last_id"],
    "rot_seal": ["moved"],
    "rot_next_empty": ["epoch"],
    "rot_copy": ["copied", "last_id"],
    "rot_empty": ["epoch", "copied", "moved"],
    "rot_switch": ["epoch"],
}


@pytest.mark.parametrize("name", sorted(ROT_COLUMNS))
def test_each_rotator_section_returns_postgresqls_columns(name):
    """The job reads each step's one row by column name (jobs/archive.py: Rotator)."""
    text = rendered("jobs", name)
    check_tsql(text)
    call = re.search(r'EXEC "queuectl"\."orders_(\w+)"', text).group(1)
    source = text if "SELECT" in text else all_procedures()[call]
    selects = re.findall(r"SELECT ((?:(?:CAST\([^()]*\)|@\w+|[^,;()]+?) AS \w+(?:, )?)+)", " ".join(source.split()))
    columns = {tuple(re.findall(r"AS (\w+)(?:, |$)", s.strip())) for s in selects}
    assert columns == {tuple(ROT_COLUMNS[name])}, (name, columns)


def test_rot_mark_returns_a_row_for_the_jobs_one():
    text = " ".join(split_go_batches(rendered("jobs", "rot_mark"))[0].split())
    assert text.startswith("SET NOCOUNT ON;") and text.endswith("SELECT CAST(1 AS int) AS marked")


def _target(sql_dir: str, version: str) -> JobTarget:
    info = SimpleNamespace(kind="reliable", schema_version=version)
    return JobTarget(QueueNames("orders"), info, sql_dir)  # type: ignore[arg-type]


def test_the_rotator_runs_on_both_engines():
    assert Rotator.applies(_target("mssql", "reliable_0012"))
    assert Rotator.applies(_target("postgresql", "reliable_0012"))
    assert not Rotator.applies(_target("mssql", "reliable_0011"))


def test_the_row_batches_run_once_per_slot_on_sql_server_only():
    """archive_batch and reset_stale_batch write rows with index hints, which a view refuses:
    on SQL Server at reliable_0012 they run on each slot's own tables."""
    mssql = [" ".join(s.text.split()) for s in _target("mssql", "reliable_0012").row_sql("archive_batch")]
    assert len(mssql) == 3
    for s, text in enumerate(mssql):
        assert f'FROM "queuectl"."orders_meta{s}" AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX("orders_meta{s}_finished"), FORCESEEK)' in text
        assert f'FROM "queuectl"."orders_data{s}" AS d' in text and not SINGLE_TABLE.search(text)
    stale = [" ".join(s.text.split()) for s in _target("mssql", "reliable_0012").row_sql("reset_stale_batch")]
    assert [f'INDEX("orders_meta{s}_leased")' in t for s, t in enumerate(stale)] == [True] * 3
    assert len(_target("postgresql", "reliable_0012").row_sql("archive_batch")) == 1
    assert len(_target("mssql", "reliable_0011").row_sql("archive_batch")) == 1


def test_the_upkeep_jobs_look_after_the_slot_tables_on_sql_server():
    """inspect, reorganize and upkeep read sys.indexes and table_vitals by OBJECT_ID(..., N'U'):
    a view (<queue>_meta, <queue>_data at reliable_0012) has none, so its slots are the tables."""
    assert _target("mssql", "reliable_0012").tables == ("meta0", "meta1", "meta2", "data0", "data1", "data2")
    assert _target("mssql", "reliable_0011").tables == ("meta", "data")
    assert _target("postgresql", "reliable_0012").tables == ("meta", "data")  # partitioned parents
