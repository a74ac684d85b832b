"""SQL Server, checked without a server: every name the T-SQL uses resolves (tsql_refs.py).

test_mssql_offline proves that every section parses; these tests prove that every table,
column, sequence, procedure (and its parameters), function and variable a section or an
install script names is one the install scripts create, the statement declares, or a
documented system object of tsql_refs' allow-list, and that the check fails on each kind of
broken reference. Nothing here ran on a server: the T-SQL is reference-checked, not run live.
"""

from __future__ import annotations

import re

import pytest

from queuectl.install import KINDS

import tsql_refs
from test_mssql_offline import check_tsql, mssql_sections
from tsql_refs import RefError, catalogue, check_install_script, check_refs, check_section, section_text


# -- every section and every install script resolves ----------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("file", "section"), mssql_sections(), ids=lambda v: v)
def test_every_mssql_section_resolves(file, section):
    check_section(file, section)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_every_install_script_resolves(kind):
    coverage = check_install_script(kind)
    assert coverage.resolved["table"] >= 15 and coverage.resolved["column"] >= 70, coverage.resolved


@pytest.mark.slow
def test_the_check_resolves_nearly_everything_and_names_what_it_skips():
    """Coverage over every section: thousands of columns and variables resolved; what is not
    resolved is only dynamic SQL text and INSERT ... EXEC result sets, each one listed here."""
    total = tsql_refs.Coverage()
    for file, section in mssql_sections():
        total.add(check_section(file, section))
    resolved = total.resolved
    assert resolved["column"] > 1500 and resolved["variable"] > 800 and resolved["table"] > 100, resolved
    assert resolved["procedure"] > 40 and resolved["parameter"] > 100 and resolved["sequence"] > 20, resolved
    assert resolved["system view"] > 50 and resolved["system procedure"] > 20 and resolved["arity"] > 60, resolved
    skipped = sorted({(re.sub(r", batch \d+", "", where), why) for where, why in total.skipped})
    assert skipped == [
        ("catalog:create_schema: EXEC (N'CREATE SCHEMA \"queuectl\"')", "dynamic SQL text"),
        ("grant:grant_execute: EXEC sys.sp_executesql @sql", "dynamic SQL text"),
        # ack_dequeue keeps ack's result set (acked) out of its own
        ("reliable:create_ack_dequeue: INSERT INTO @acked EXEC", "a procedure's result set"),
        ("ring:create_enqueue_many_0001: INSERT INTO @pushed EXEC", "a procedure's result set"),
        # the fan-out guard trigger and the ring's CHECK constraint and pop sequence, named by
        # QUOTENAME of catalog names (a trigger or an ALTER cannot take a variable name)
        ("ring:create_fanout_guard: EXEC sys.sp_executesql @sql", "dynamic SQL text"),
        ("ring:create_fanout_guard_0006: EXEC sys.sp_executesql @sql", "dynamic SQL text"),
        ("ring:create_ring_release_0002: INSERT INTO @pushed EXEC", "a procedure's result set"),
        ("ring:make_fanout: EXEC sys.sp_executesql @sql", "dynamic SQL text"),
        ("ring:unmake_fanout: EXEC sys.sp_executesql @sql", "dynamic SQL text"),
    ], skipped


# -- the check fails on each kind of broken reference --------------------------------------------

BREAKS = [
    # (what, file, section, good text, broken text, the culprit the message names)
    ("misspelt column of sys.sequences", "ring", "create_dequeue",
     "q.last_used_value", "q.last_used_valu", "sys.sequences has no column 'last_used_valu'"),
    ("misspelt column of sys.sequences (watermark)", "watermark", "create_functions",
     "s.last_used_value", "s.last_used_valu", "sys.sequences has no column 'last_used_valu'"),
    ("undeclared variable", "reliable", "create_functions",
     "DATEADD(millisecond, @lease_ms, SYSUTCDATETIME())", "DATEADD(millisecond, @lease_msec, SYSUTCDATETIME())",
     "undeclared variable @lease_msec"),
    ("OUTPUT deleted. of a missing column", "fifo", "create_dequeue_lax",
     "OUTPUT deleted.id,", "OUTPUT deleted.a,", "OUTPUT deleted.a: CTE picked has no column 'a'"),
    ("OUTPUT inserted. of a missing column", "reliable", "create_functions",
     "OUTPUT inserted.id, inserted.leased_until", "OUTPUT inserted.id, inserted.leased_untl",
     "orders_meta0 has no column 'leased_untl'"),
    ("missing table", "reliable", "create_dequeue",
     'JOIN "queuectl"."orders_data0" AS d', 'JOIN "queuectl"."orders_dat" AS d', 'unknown table "queuectl"."orders_dat"'),
    ("misspelt procedure in EXEC", "reliable", "create_ack_dequeue",
     'EXEC "queuectl"."orders_dequeue"', 'EXEC "queuectl"."orders_dequeu"', 'unknown procedure "queuectl"."orders_dequeu"'),
    ("EXEC with an undeclared parameter name", "reliable", "create_ack_dequeue",
     "@lease_seconds = @lease_seconds", "@lease_secs = @lease_seconds", "no parameter @lease_secs"),
    ("client call with an undeclared parameter name", "reliable", "ack",
     "@worker = :worker", "@owner = :worker", "orders_ack: no parameter @owner"),
    ("client call without a required parameter", "reliable", "ack",
     "@ids = :ids, ", "", "orders_ack: @ids not passed and without default"),
    ("system procedure with an undeclared parameter name", "ring", "create_enqueue_many",
     "@range_size = @draw", "@range_sizes = @draw", "sp_sequence_get_range: no parameter @range_sizes"),
    ("misspelt sequence in NEXT VALUE FOR", "reliable", "create_enqueue_functions",
     'NEXT VALUE FOR "queuectl"."orders_meta_id_seq"', 'NEXT VALUE FOR "queuectl"."orders_meta_id_sq"',
     'unknown sequence "queuectl"."orders_meta_id_sq"'),
    ("misspelt sequence passed by name", "ring", "create_enqueue_many",
     "@sequence_name = '\"queuectl\".\"orders_push_seq\"'", "@sequence_name = '\"queuectl\".\"orders_psh_seq\"'",
     "unknown sequence queuectl.orders_psh_seq"),
    ("column a table variable does not declare", "reliable", "create_dequeue",
     "c.priority", "c.prio", "table variable @claimed has no column 'prio'"),
    ("INSERT with fewer values than columns", "reliable", "create_enqueue_functions",
     "VALUES (@id, @payload, @headers)", "VALUES (@id, @payload)", 'INSERT INTO "queuectl"."orders_data0": 2 values for 3 columns'),
    ("OUTPUT INTO with fewer columns than outputs", "fifo", "create_dequeue_lax",
     "INTO @taken (id, payload, headers, enqueued_at)", "INTO @taken (id, payload, headers)",
     "OUTPUT INTO @taken: 4 values for 3 columns"),
    ("unqualified column no source has", "reliable", "create_functions",
     "m.lease_owner = @worker", "lease_ownr = @worker", "column lease_ownr: no source in scope has it"),
    ("alias not in scope", "reliable", "create_dequeue", "ORDER BY c.priority", "ORDER BY x.priority",
     "no table or alias 'x' in scope"),
    ("system view outside the allow-list", "ring", "create_dequeue",
     "FROM sys.sequences AS p", "FROM sys.sequence AS p", "unknown table sys.sequence"),
    ("misspelt built-in function", "reliable", "create_functions",
     "finished_at = SYSUTCDATETIME()", "finished_at = SYSUTCDATETIM()", "unknown function sysutcdatetim"),
    ("string into a smallint column", "reliable", "create_functions",
     "UPDATE m SET status = 2,", "UPDATE m SET status = N'done',", "type mismatch: N'done' into status (smallint)"),
    ("rollback to a savepoint never saved", "ring", "create_ring_release",
     "ROLLBACK TRANSACTION ring_rescue;", "ROLLBACK TRANSACTION ring_rescu;", "no SAVE TRANSACTION ring_rescu"),
    ("OUTPUT of a column the joined table lacks", "reliable", "create_dequeue",
     "inserted.leased_until, d.payload, d.headers", "inserted.leased_until, d.payloads, d.headers",
     "orders_data0 has no column 'payloads'"),
    ("misspelt data type", "reliable", "create_functions",
     "@worker nvarchar(200) = NULL", "@worker nvarchr(200) = NULL", "unknown data type nvarchr"),
    ("foreign key to a missing column", "reliable", "create_tables",
     '"queuectl"."orders_meta" (id)', '"queuectl"."orders_meta" (ids)', "orders_meta has no column 'ids'"),
    ("index key the table does not have", "reliable", "create_tables",
     "(priority, due_at, id) WHERE status = 0", "(priority, due, id) WHERE status = 0", "has no column 'due'"),
    # the ring's side-table pointer: a column ALTER TABLE ... ADD gives the slots, and drops
    ("column dropped that the table does not have", "ring", "drop_large_table",
     "DROP COLUMN large_id", "DROP COLUMN large_ids", "column large_ids: no source in scope has it"),
    ("misspelt column that ALTER TABLE added", "ring", "create_dequeue",
     "r.changed_at, r.large_id", "r.changed_at, r.larg_id", "orders_ring has no column 'larg_id'"),
]


@pytest.mark.parametrize(("what", "file", "section", "good", "bad", "culprit"), BREAKS, ids=[b[0] for b in BREAKS])
def test_a_broken_reference_fails_the_check(what, file, section, good, bad, culprit):
    text = section_text(file, section)
    assert good in text, what
    cat = catalogue(file)
    check_refs(text, cat, f"{file}:{section}")
    broken = text.replace(good, bad, 1)
    check_tsql(broken)  # still parses: only the reference check sees it
    with pytest.raises(RefError) as caught:
        check_refs(broken, cat, f"{file}:{section}")
    assert culprit in str(caught.value) and f"{file}:{section}" in str(caught.value), str(caught.value)


def test_an_ambiguous_unqualified_column_fails():
    text = section_text("reliable", "create_dequeue")
    good = "JOIN \"queuectl\".\"orders_data0\" AS d WITH (INDEX(1), FORCESEEK) ON d.id = p.id;"
    assert good in text
    with pytest.raises(RefError, match="column id is ambiguous"):
        check_refs(text.replace(good, good.replace("d.id = p.id", "id = p.id")), catalogue("reliable"))


def test_a_kind_resolves_against_its_own_tables():
    """pending's items table has due_at, fifo's has not: fifo's file is checked against fifo's."""
    text = section_text("fifo", "create_dequeue_lax")
    good = "ORDER BY i.id\n"
    assert good in text
    broken = text.replace(good, "ORDER BY i.due_at, i.id\n", 1)
    check_refs(broken, catalogue("pending"))
    with pytest.raises(RefError, match="has no column 'due_at'"):
        check_refs(broken, catalogue("fifo"))


def test_the_allow_list_names_each_system_object_with_its_columns():
    """No blanket acceptance of schema sys: every entry lists columns or parameters, and an
    unlisted system view fails with the column it was asked for."""
    for name, columns in {**tsql_refs.SYSTEM_VIEWS, **tsql_refs.SYSTEM_TABLE_FUNCTIONS}.items():
        assert columns and all(c == c.lower() for c in columns), name
    for name, params in tsql_refs.SYSTEM_PROCEDURES.items():
        assert params and all(p.startswith("@") or p == "*" for p in params), name
    with pytest.raises(RefError, match="unknown table sys.dm_os_wait_stats"):
        check_refs("SELECT w.wait_type FROM sys.dm_os_wait_stats AS w", catalogue("reliable"))
    with pytest.raises(RefError, match="sys.objects has no column 'nam'"):
        check_refs("SELECT o.nam FROM sys.objects AS o", catalogue("reliable"))
    check_refs("SELECT o.name FROM sys.objects AS o WHERE o.object_id = OBJECT_ID(N'\"queuectl\".\"queues\"')", catalogue("reliable"))
    with pytest.raises(RefError, match="unknown object queuectl.queue"):
        check_refs("SELECT OBJECT_ID(N'\"queuectl\".\"queue\"')", catalogue("reliable"))


def test_bind_parameters_are_declared_and_anything_else_is_not():
    check_refs("SELECT q.name FROM queuectl.queues AS q WHERE q.name = :queue", catalogue("reliable"))
    with pytest.raises(RefError, match="undeclared variable @queue"):
        check_refs("SELECT q.name FROM queuectl.queues AS q WHERE q.name = @queue", catalogue("reliable"))
    with pytest.raises(RefError, match="variable @n used before its DECLARE"):
        check_refs("SET @n = 1; DECLARE @n int;", catalogue("reliable"))


def test_a_select_list_name_is_seen_by_order_by_only():
    """SQL Server resolves a select list's alias in ORDER BY and nowhere else of its query."""
    ordered = "SELECT q.name AS queue_name FROM queuectl.queues AS q ORDER BY queue_name"
    check_refs(ordered, catalogue("reliable"))
    with pytest.raises(RefError, match="column queue_name: no source in scope has it"):
        check_refs(ordered.replace("ORDER BY", "WHERE queue_name > N'a' ORDER BY"), catalogue("reliable"))
