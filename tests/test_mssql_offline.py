"""SQL Server, checked without a server: every T-SQL text parses with a real T-SQL parser.

No SQL Server runs here, so the mssql engine is verified offline:
  * every section of every sql/mssql/*.sql file, and the complete review script that
    `queuectl install NAME --url mssql+pyodbc://... --sql` prints, parse with sqlfluff's
    tsql dialect, batch by batch (split at GO, as sqlcmd and SSMS do). sqlfluff raises on
    any unparsable segment; on top of it the check refuses a bare word at the start of a
    batch (T-SQL would run it as a procedure call, so `SELEC 1` parses), which sqlfluff
    alone lets through. sqlglot is not the checker: its tsql reader rejects valid
    `UPDATE TOP (n)` and rewrites DELETE TOP / WHILE (DESIGN.md, section 10);
  * the check fails on broken statements (tests below break real ones);
  * both engines' SQL files define the same sections;
  * SQLAlchemy-built statements compile for the mssql dialect;
  * the mssql engine's errors are one line and say how to install the ODBC driver.
What this cannot show is behaviour: tests/test_mssql_live.py runs against a real server
when QUEUECTL_TEST_MSSQL_URL is set.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources

import pytest
import sqlalchemy as sa
import sqlfluff
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy.dialects import mssql
from sqlfluff.core import FluffConfig, Linter

from queuectl.catalog import NAME_TYPE, SETTINGS_TYPE, QueueSettings, queues_table
from queuectl.engine import adapter_for, make_engine
from queuectl.engine.mssql import MssqlAdapter
from queuectl.errors import ConnectionFailed
from queuectl.install import KINDS, install_script
from queuectl.names import QueueNames, quote_ident
from queuectl.sqlfiles import _PLACEHOLDER, render, section, sections, split_go_batches

from conftest import run_cli

MSSQL_URL = "mssql+pyodbc://sa:Not-Shown-42@nowhere.invalid:1433/app"

# Files one engine has and the other need not, and why.
POSTGRESQL_ONLY = {"bench": "benchmark helpers (VACUUM, REPEATABLE READ snapshots) run on PostgreSQL only"}
# Sections of one engine's file with no counterpart in the other's, and why. The job
# statements differ where the engines' tools do: pgstattuple/REINDEX CONCURRENTLY/VACUUM
# on one side, sys.dm_db_index_physical_stats/ALTER INDEX on the other; a PostgreSQL
# truncate is told its precopy's transaction horizon (SQL Server's precopy moves its rows
# out of the slot); a PostgreSQL function replaced by one of other arguments is created
# beside it and given its grants (SQL Server alters procedures in place).
ENGINE_SPECIFIC = {
    "grant": {"postgresql": {"carry_function_grants"}},
    "jobs": {
        "postgresql": {
            "pgstattuple_schema", "create_pgstattuple", "drop_index_concurrently", "reindex_concurrently",
            "vacuum_table", "rot_horizon", "rot_empty_since",
        },
        "mssql": {
            "index_capabilities", "reorganize_index", "update_index_statistics", "rebuild_index_online",
            "rebuild_index_resumable", "paused_rebuilds", "resume_rebuild", "update_statistics_table",
            "version_store", "snapshot_holders",
        },
    },
}

# Batches that define a module: CREATE PROCEDURE/FUNCTION/TRIGGER must be alone in a batch.
MODULE_DEFINITIONS = ("CREATE PROCEDURE", "CREATE FUNCTION", "CREATE TRIGGER", "CREATE OR ALTER")
_TRANSACTION_WORD = re.compile(r"\b(?:BEGIN\s+(?:TRAN|TRANSACTION|DISTRIBUTED)\b|COMMIT\b|ROLLBACK\b|SAVE\s+TRAN)", re.I)
_LINTER = Linter(config=FluffConfig(overrides={"dialect": "tsql"}))
_BIND = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")  # SQLAlchemy's own bind-parameter pattern


class TsqlError(AssertionError):
    pass


def check_tsql(script: str) -> int:
    """Parse every GO batch of a T-SQL script; raise TsqlError on the first bad one.

    Bind parameters (:name) become variables (@name): a value where the driver puts `?`.
    Returns the number of batches checked.
    """
    batches = split_go_batches(script)
    for number, batch in enumerate(batches, 1):
        text = _BIND.sub(r"@\1", batch)
        problem = _batch_problem(text)
        if problem is not None:
            raise TsqlError(f"batch {number}: {problem}")
    return len(batches)


@functools.cache
def _batch_problem(text: str) -> str | None:
    """What is wrong with one batch (None: it parses as T-SQL). Cached by its text: the install
    scripts of the kinds share their catalog batches, and a test that breaks one statement of a
    script parses the rest again."""
    parsed = _LINTER.parse_string(text)
    if parsed.violations or not parsed.parsed_variants or parsed.parsed_variants[0].tree is None:
        return f"{parsed.violations}\n{text}"
    tree = parsed.tree
    for segment in tree.recursive_crawl("execute_script_statement"):
        first = segment.raw.lstrip().split(None, 1)[0].upper()
        if first not in ("EXEC", "EXECUTE"):
            return f"bare word {first!r} would run as a procedure call\n{text}"
    for segment in tree.recursive_crawl("unparsable"):
        return f"unparsable {segment.raw!r}"
    return None


def kind_values(kind: str) -> dict[str, str | int]:
    """Every template value a file of `kind` may use, for queue 'orders' in schema 'queuectl'."""
    names = QueueNames("orders")
    q = names.qualified
    values: dict[str, str | int] = {**names.template_values(), **QueueSettings().as_dict()}
    try:  # the queue kinds' own names, once queuectl.kindspec is merged
        from queuectl.kindspec import kind_template_values

        values.update(kind_template_values(names, kind) if kind in ("heap", "fifo", "stack", "pending", "watermark", "ring") else {})
        if kind in ("health", "jobs"):  # one probe per kind: the destructive kinds' and the ring's names
            values.update({**kind_template_values(names, "watermark"), **kind_template_values(names, "ring")})
    except ImportError:
        values.update(
            items=q("items"), items_seq=q("items_id_seq"), items_seq_regclass=f"'{q('items_id_seq')}'",
            items_regclass=f"'{q('items')}'", due_idx=quote_ident("orders_items_due"),
            watermark=q("watermark"), fn_correct_watermark=q("correct_watermark"),
            ring=q("ring"), push_seq=q("push_seq"), pop_seq=q("pop_seq"),
            push_seq_regclass=f"'{q('push_seq')}'", pop_seq_regclass=f"'{q('pop_seq')}'",
            ring_regclass=f"'{q('ring')}'", fn_ring_repair=q("ring_repair"), fn_ring_release=q("ring_release"),
        )
    # the pipeline's export bounds (validated integers) and its catalog table
    values.update(exports=f"{quote_ident('queuectl')}.{quote_ident('pipeline_exports')}", after_id=1000,
                  upto_id=2000, before_us=1_790_000_000_000_000, after_before_us=1_780_000_000_000_000)
    values.update(job_runs=f"{quote_ident('queuectl')}.{quote_ident('job_runs')}")
    values.update(index=quote_ident("orders_meta_ready"), table=q("meta"), max_wait_minutes=1, max_duration_minutes=10)
    values.update(sub_lag_limit=512, sub_drop=0)  # the ring's make_fanout: its subscriptions' defaults
    values.update(size=1024, slot_bytes=1800, schema_literal="'queuectl'", lock_timeout_ms=5000, role=quote_ident("app_producer"),
                  function_literals="'orders_enqueue', 'orders_enqueue_many'")
    return values


def sql_files(engine: str) -> list[str]:
    folder = resources.files("queuectl.sql").joinpath(engine)
    return sorted(p.name[:-4] for p in folder.iterdir() if p.name.endswith(".sql"))


def mssql_sections() -> list[tuple[str, str]]:
    """Every section of every T-SQL file, today's and the history's."""
    return [(file, name) for file in sql_files("mssql") for history in (False, True)
            for name in sections("mssql", file, history=history)]


def rendered(file: str, name: str) -> str:
    values = kind_values(file)
    wanted = set(_PLACEHOLDER.findall(section("mssql", file, name)))
    return render("mssql", file, name, {k: values[k] for k in wanted})


# -- every T-SQL text parses ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("file", "section"), mssql_sections(), ids=lambda v: v)
def test_every_mssql_section_parses_as_tsql(file, section):
    text = "\n".join(line for line in rendered(file, section).splitlines() if not line.lstrip().startswith("--"))
    if text.lstrip().startswith("("):
        # a JDBC `dbtable` fragment, "(SELECT ...) AS alias", which Spark wraps itself
        text = f"SELECT * FROM {text.strip()}"
    check_tsql(text)


def test_mssql_has_every_queue_kind_and_feature_file():
    files = set(sql_files("mssql"))
    assert {"catalog", "catalog_jobs", "locks", "storage", "jobs", "reliable", "heap", "fifo", "stack",
            "pending", "watermark", "ring"} <= files
    missing = set(sql_files("postgresql")) - files - set(POSTGRESQL_ONLY)
    assert not missing, f"PostgreSQL SQL files without T-SQL: {sorted(missing)}"


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_offline_install_script_is_complete_tsql_with_go_batches(kind):
    script = install_script(None, "orders", kind, dialect="mssql")
    batches = split_go_batches(script)
    assert check_tsql(script) == len(batches) > 10
    assert re.search(r"^GO$", script, re.MULTILINE)
    # Alembic wraps each migration in a transaction of its own: top-level BEGIN/COMMIT
    # batches, alternating, first and last. Procedure bodies hold their own transaction
    # statements (and words like READCOMMITTEDLOCK), so only the batches outside
    # procedures and functions are searched, for every transaction word, not only these.
    top_level = [b for b in batches if not b.startswith(MODULE_DEFINITIONS)]
    marks = [m.group(0).split()[0].upper() for b in top_level for m in _TRANSACTION_WORD.finditer(b)]
    assert marks and marks == ["BEGIN", "COMMIT"] * (len(marks) // 2), marks
    assert [b.splitlines()[0] for b in top_level if _TRANSACTION_WORD.search(b)] == [
        "BEGIN TRANSACTION;", "COMMIT"] * (len(marks) // 2)
    # QUOTED_IDENTIFIER ON comes first: sqlcmd's default is OFF, and the double-quoted
    # names, filtered indexes and the procedures created over them all need it ON.
    assert batches[0].split() == "BEGIN TRANSACTION; SET QUOTED_IDENTIFIER ON; SET ANSI_NULLS ON".split()
    procedures = [b for b in batches if re.search(r"CREATE (?:OR ALTER )?PROCEDURE", b)]
    assert procedures and all(re.match(r"CREATE (?:OR ALTER )?PROCEDURE", b) for b in procedures)
    assert "CREATE TABLE queuectl.queues" in script and "INSERT INTO queuectl.queues" in script


def test_reliable_install_script_holds_the_seed_forms():
    script = install_script(None, "orders", "reliable", dialect="mssql")
    flat = " ".join(script.split())
    # filtered index on ready rows; the one-statement dequeue through an ordered CTE
    assert 'CREATE INDEX "orders_meta_ready" ON "queuectl"."orders_meta" (priority, due_at, id) WHERE status = 0' in flat
    assert "WITH picked AS ( SELECT TOP (@n)" in flat and 'WITH (UPDLOCK, READPAST, ROWLOCK, INDEX("orders_meta_ready"))' in flat
    assert "ORDER BY m.priority, m.due_at, m.id ) UPDATE p SET" in flat
    assert "OUTPUT inserted.id," in flat and "d.payload, d.headers INTO @claimed" in flat
    assert "FROM @claimed AS c ORDER BY c.priority, c.due_at, c.id; END" in flat
    # the archive job's pick and the history purge seek these (as on PostgreSQL)
    assert 'CREATE INDEX "orders_meta_finished" ON "queuectl"."orders_meta" (status, finished_at) WHERE status >= 2' in flat
    assert 'CREATE INDEX "orders_history_at" ON "queuectl"."orders_history" (archived_at)' in flat


def test_jobs_tsql_holds_the_seed_forms():
    archive = " ".join(rendered("jobs", "archive_batch").split())
    assert "DELETE TOP (@batch) m OUTPUT deleted.id" in archive and 'INTO "queuectl"."orders_history"' in archive
    assert "@batch > 4000" in archive  # below lock escalation (5000 locks per statement)
    physical = " ".join(rendered("jobs", "index_measure").split())
    for column in ("ghost_record_count", "version_ghost_record_count", "avg_fragmentation_in_percent",
                   "avg_page_space_used_in_percent", "page_count"):
        assert f"ps.{column}" in physical
    assert "'SAMPLED'" in physical and "THROW 50004" in physical  # never a NULL object id (whole database)
    assert "SERVERPROPERTY('EngineEdition') AS int) IN (3, 5, 8)" in rendered("jobs", "index_capabilities")
    assert "REBUILD WITH ( ONLINE = ON (WAIT_AT_LOW_PRIORITY" in " ".join(rendered("jobs", "rebuild_index_online").split())
    assert "RESUMABLE = ON, MAX_DURATION = 10 MINUTES" in " ".join(rendered("jobs", "rebuild_index_resumable").split())
    assert "REORGANIZE" in rendered("jobs", "reorganize_index")
    assert "sys.dm_tran_active_snapshot_database_transactions" in rendered("jobs", "snapshot_holders")
    assert "sys.dm_tran_version_store_space_usage" in rendered("jobs", "version_store")


# -- the check can fail -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("what", "break_it"),
    [
        ("unbalanced parenthesis in the pick", lambda s: s.replace("SELECT TOP (@n) m.id", "SELECT TOP (@n m.id", 1)),
        ("procedure without END", lambda s: s[: s.rindex("END")]),
        ("misspelt keyword at the start of a batch", lambda s: s.replace("CREATE OR ALTER PROCEDURE", "CREAT OR ALTER PROCEDURE", 1)),
        ("a clause out of place", lambda s: s.replace("ORDER BY m.priority, m.due_at, m.id", "ORDER m.priority BY", 1)),
    ],
)
def test_a_broken_statement_fails_the_check(what, break_it):
    good = rendered("reliable", "create_dequeue_0001")
    check_tsql(good)
    broken = break_it(good)
    assert broken != good, what
    with pytest.raises(TsqlError):
        check_tsql(broken)


def test_a_bare_word_is_refused_although_tsql_would_run_it_as_a_procedure():
    assert check_tsql("EXEC dbo.x @a = 1") == 1
    with pytest.raises(TsqlError, match="bare word"):
        check_tsql("SELEC 1")


# -- both engines, one set of names ---------------------------------------------------------


@pytest.mark.parametrize("file", sorted(set(sql_files("postgresql")) & set(sql_files("mssql"))))
def test_postgresql_and_mssql_define_the_same_sections(file):
    specific = ENGINE_SPECIFIC.get(file, {})
    pg = set(sections("postgresql", file)) - specific.get("postgresql", set())
    ms = set(sections("mssql", file)) - specific.get("mssql", set())
    assert pg == ms, f"{file}: only PostgreSQL {sorted(pg - ms)}, only SQL Server {sorted(ms - pg)}"


@pytest.mark.parametrize("file", sorted(set(sql_files("postgresql")) & set(sql_files("mssql"))))
def test_every_history_section_of_either_engine_is_found_on_both(file):
    """A revision's section that one engine keeps in its history file is found on the other
    too: in its history file, or as today's section when the body has not changed there."""
    for engine in ("postgresql", "mssql"):
        for name in sections(engine, file, history=True):
            assert section("postgresql", file, name) and section("mssql", file, name), (engine, file, name)


def test_current_files_hold_no_revision_sections_and_history_files_only_those():
    """The loader refuses a revision-named section in today's file and any other in a history
    file, so a current file reads as what a fresh install creates."""
    for engine in ("postgresql", "mssql"):
        for file in sql_files(engine):
            assert not [n for n in sections(engine, file) if re.search(r"_[0-9]{4}$", n)], (engine, file)
            assert all(re.search(r"_[0-9]{4}$", n) for n in sections(engine, file, history=True)), (engine, file)
    assert sections("postgresql", "reliable", history=True)  # the rule has something to find


# Sections of health.sql whose result queuectl.health does not read by column name.
HEALTH_UNREAD = {"session_limits": "run for its effect", "create_pgstattuple": "a no-op on SQL Server",
                 "now": "read with scalar_one()"}
_PARSERS = {d: Linter(config=FluffConfig(overrides={"dialect": d})) for d in ("tsql", "postgres")}


def result_columns(sql: str, dialect: str) -> list[list[str]]:
    """The column names of every result set a statement text returns: the select lists of
    its statement-level SELECTs (not those inside a CTE, subquery, INSERT or EXISTS), by
    alias, else by the column's own name. An IF/ELSE gives one list per branch."""
    text = re.sub(r"\{\{(\w+)\}\}", r"t_\1", sql)
    text = _BIND.sub(r"@\1", text) if dialect == "tsql" else text
    tree = _PARSERS[dialect].parse_string(text).tree
    found: list[list[str]] = []
    inner = {"select_statement", "common_table_expression", "insert_statement", "set_expression"}

    def walk(segment, ancestors: frozenset) -> None:
        if segment.is_type("select_statement") and not ancestors & inner:
            clause = next(segment.recursive_crawl("select_clause"))
            names = []
            for element in clause.recursive_crawl("select_clause_element", no_recursive_seg_type="select_statement"):
                alias = next(element.recursive_crawl("alias_expression", no_recursive_seg_type="select_statement"), None)
                where = alias or element
                idents = list(where.recursive_crawl("naked_identifier", "quoted_identifier",
                                                    no_recursive_seg_type="select_statement"))
                names.append(idents[-1].raw.strip('"[]') if idents else element.raw)
            found.append(names)
        for child in segment.segments:
            walk(child, ancestors | {segment.get_type()})

    walk(tree, frozenset())
    return found


@pytest.mark.slow
@pytest.mark.parametrize("section", sorted(set(sections("postgresql", "health")) - set(HEALTH_UNREAD)))
def test_health_sections_return_the_columns_queuectl_health_reads(section):
    """queuectl.health reads both engines' rows by column name: every result set of the T-SQL
    section starts with the PostgreSQL section's columns, in order (SQL Server's own
    measurements may follow). A reserved word used as an alias unquoted (FILLFACTOR) shows
    here too: the parser does not take it as the alias."""
    [expected] = result_columns(sections("postgresql", "health")[section], "postgres")[-1:]
    results = result_columns(sections("mssql", "health")[section], "tsql")
    assert results, section
    for columns in results:
        assert columns[: len(expected)] == expected, f"{section}: {columns} does not start with {expected}"


def test_health_tsql_measures_ghosts_and_what_holds_them():
    physical = " ".join(rendered("health", "index_physical").split())
    for column in ("ghost_record_count", "version_ghost_record_count", "avg_fragmentation_in_percent",
                   "avg_page_space_used_in_percent", "page_count"):
        assert f"ps.{column}" in physical and f"AS {column}" in physical
    assert "sys.dm_db_index_physical_stats" in rendered("health", "table_physical")
    sessions = rendered("health", "sessions")
    assert "sys.dm_tran_active_snapshot_database_transactions" in sessions
    assert "sys.dm_tran_session_transactions" in sessions and "sys.dm_exec_sessions" in sessions
    assert "sys.dm_db_partition_stats" in rendered("health", "tables")
    assert "sys.dm_db_index_usage_stats" in rendered("health", "indexes")
    assert "transaction_type = 4" in rendered("health", "prepared_xacts")
    assert "low_water_mark_for_ghosts" in rendered("health", "standby_feedback")
    # SET LOCK_TIMEOUT inside sp_executesql (any statement with bind parameters) is undone
    # when it returns: the value must be rendered, and the section must bind nothing.
    limits = rendered("health", "session_limits")
    assert "SET LOCK_TIMEOUT 5000" in limits and not _BIND.findall(limits)


# A kind's dequeue sections, as (PostgreSQL section, T-SQL section): every revision's and
# today's. reliable_0005 and 0008 and the destructive kinds' <kind>_0002 changed only
# PostgreSQL's (their T-SQL sections are empty), so today's procedure serves both.
_DEQUEUE_VARIANTS = {
    "fifo": [("create_dequeue_lax_0001",) * 2, ("create_dequeue_strict_0001",) * 2,
             ("create_dequeue_lax",) * 2, ("create_dequeue_strict",) * 2],
    "ring": [("create_dequeue_0001",) * 2, ("create_dequeue_0003",) * 2, ("create_dequeue",) * 2],
    # reliable_0012: the head's dequeue hands the claim to create_claim_calls' function
    "reliable": [("create_dequeue_0001",) * 2, ("create_dequeue_0005", "create_dequeue"),
                 ("create_dequeue_0008", "create_dequeue"), ("create_claim_calls", "create_dequeue")],
    **{kind: [("create_dequeue_0001",) * 2, ("create_dequeue",) * 2]
       for kind in ("heap", "stack", "pending", "watermark")},
}
_DEQUEUE_VARIANTS["pending"].append(("create_dequeue_0002", "create_dequeue"))  # pending_0002


def _definition(kind: str, name: str, fn: str, ms_section: str | None = None) -> tuple[str, str]:
    """(PostgreSQL function, T-SQL procedure) texts of one function of a section: CREATE or
    CREATE OR REPLACE on one side, CREATE or CREATE OR ALTER on the other."""
    pg = section("postgresql", kind, name)
    called = r"(?:fn_dequeue|claim_fn)" if fn == "dequeue" else f"fn_{fn}"
    pg_fn = pg[re.search(r"CREATE (?:OR REPLACE )?FUNCTION \{\{%s\}\}\(" % called, pg).start():]
    pg_fn = pg_fn[: pg_fn.index("$fn$;") + 5]
    [ms_proc] = [b for b in split_go_batches(rendered(kind, ms_section or name))
                 if re.match(r'CREATE (?:OR ALTER )?PROCEDURE "queuectl"\."orders_%s"\s' % fn, b)]
    return pg_fn, ms_proc


def _dequeue_definitions(kind: str) -> list[tuple[str, str]]:
    """(PostgreSQL function, T-SQL procedure) texts of a kind's dequeue, per variant."""
    variants = _DEQUEUE_VARIANTS[kind]
    return [_definition(kind, pg_section, "dequeue", ms_section) for pg_section, ms_section in variants]


def check_dequeue_matches(kind: str, pg_fn: str, ms_proc: str) -> None:
    """The procedure's last result set has the function's columns, and (for every kind but
    heap and ring, which keep no order) it is sorted as the function sorts: its last
    statement is a SELECT ending in the function's ORDER BY. OUTPUT alone has no order."""
    returns = re.search(r"RETURNS TABLE \((.*?)\)\s*LANGUAGE", pg_fn, re.S).group(1)
    expected = [part.split()[0] for part in returns.split(",")]
    selects = result_columns(ms_proc, "tsql")
    if selects:
        returned = selects[-1]
    else:  # the rows of a DELETE ... OUTPUT (heap: no order to keep)
        output = re.findall(r"\bOUTPUT\s+(.*?);", ms_proc, re.S)[-1]
        returned = [part.split()[-1].split(".")[-1] for part in output.split(",")]
    assert returned == expected, kind
    if kind in ("reliable", "fifo", "stack", "pending", "watermark"):
        pg_order = re.findall(r"ORDER BY ([^;()]*?)\s*;", pg_fn)[-1]
        last_statement = ms_proc[: ms_proc.rindex("END")].rstrip().rstrip(";")
        last_statement = last_statement[last_statement.rindex(";") + 1:]
        assert last_statement.lstrip().startswith("SELECT"), f"{kind}: the batch is not returned by a final SELECT"
        ms_order = re.findall(r"ORDER BY ([^;()]*?)\s*$", last_statement.strip())
        assert ms_order and " ".join(ms_order[-1].split()) == " ".join(pg_order.split()), kind


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["reliable", "heap", "fifo", "stack", "pending", "watermark", "ring"])
def test_kind_dequeue_returns_postgresqls_columns_in_its_order(kind):
    """The clients read a dequeue's rows by column name and hand them out in the order they
    come: the procedure returns the function's columns, sorted as the function sorts them."""
    for pg_fn, ms_proc in _dequeue_definitions(kind):
        check_dequeue_matches(kind, pg_fn, ms_proc)


@pytest.mark.parametrize("name", ["create_ring_release_0001", "create_ring_release_0002", "create_ring_release_0003",
                                  "create_ring_release"])
@pytest.mark.slow
def test_ring_release_returns_postgresqls_columns(name):
    """RingQueue.release() reads ring_release's rows by column name, on both engines and at
    every revision: the procedure's result set is the function's RETURNS TABLE."""
    pg_fn, proc = _definition("ring", name, "ring_release")
    returns = re.search(r"RETURNS TABLE \((.*?)\)\s*LANGUAGE", pg_fn, re.S).group(1)
    expected = [part.split()[0] for part in returns.split(",")]
    assert expected[:3] == ["side", "item_id", "tombstoned"]  # ring_0001's columns, kept since
    assert result_columns(proc, "tsql")[-1] == expected


def test_ring_release_0002_tsql_rescues_through_the_push_procedure_under_a_savepoint():
    """The T-SQL counterpart of PostgreSQL's rescue (no server here: its form, not its run).
    The message is read with the file's lock hints, the old slot marked RESCUED and the push
    procedure called inside one transaction, with no wait (@timeout = 0: the transaction holds
    the old slot's lock); a full ring rolls back to the savepoint, and the push claim the
    failed push kept in the (non-transactional) session context is dropped."""
    flat = " ".join(rendered("ring", "create_ring_release_0002").split())
    assert "@timeout float = 0.1" in flat
    read = flat.index('FROM "queuectl"."orders_ring" AS o WITH (UPDLOCK, READPAST, ROWLOCK) '
                      "WHERE o.slot = @pos % 1024 AND o.msg_id = @pos AND o.state = 1;")
    begin, save = flat.index("BEGIN TRANSACTION;"), flat.index("SAVE TRANSACTION ring_rescue;")
    rescued = flat.index("SET state = 3, payload = NULL, headers = NULL")
    push = flat.index('INSERT INTO @pushed (id) EXEC "queuectl"."orders_enqueue" @payload = @payload, '
                      "@headers = @headers, @timeout = 0;")
    assert begin < read < save < rescued < push
    deferred = flat[push:]
    assert deferred.index("ROLLBACK TRANSACTION ring_rescue; COMMIT TRANSACTION; "
                          "EXEC sys.sp_set_session_context @key = @k_push, @value = NULL;") < deferred.index("N'deferred'")
    assert "INSERT INTO @out VALUES (N'pop', @pos, 0, @new, N'rescued');" in deferred
    assert flat.count("BEGIN TRANSACTION;") == 1 and flat.count("COMMIT TRANSACTION;") == 3  # every path commits


@pytest.mark.parametrize("kind", ["heap", "fifo", "stack", "pending", "watermark"])
def test_destructive_kinds_install_to_the_head_keeping_their_first_dequeue_procedure(kind):
    """<kind>_0002 changes PostgreSQL's dequeue only and <kind>_0003 PostgreSQL's autovacuum
    parameters only: the offline install creates the dequeue procedure once (CREATE OR
    ALTER, so the downgrade can run it again; watermark_0005 runs the same text again) and
    its 0002 and 0003 steps run no batch of their own, only the version bookkeeping."""
    script = install_script(None, "orders", kind, dialect="mssql")
    batches = split_go_batches(script)
    dequeue = [b for b in batches if re.match(r'CREATE (?:OR ALTER )?PROCEDURE "queuectl"\."orders_dequeue"\s', b)]
    # watermark_0005 renders today's procedure again (its isolation check is PostgreSQL's)
    assert len(dequeue) == (2 if kind == "watermark" else 1) and set(dequeue) == {dequeue[0]}
    assert dequeue[0].startswith("CREATE OR ALTER PROCEDURE")
    assert f"UPDATE queuectl.orders_version SET version_num='{kind}_0002'" in script
    assert f"UPDATE queuectl.orders_version SET version_num='{kind}_0003'" in script
    assert "ALTER TABLE" not in script  # no per-table autovacuum on SQL Server
    after_0001 = script[script.index(f"VALUES ('{kind}_0001')"):]
    if kind == "watermark":
        after_0001 = after_0001[:after_0001.index("SET version_num='watermark_0004'")]
    assert "PROCEDURE" not in after_0001


def test_ring_install_script_ends_with_ring_0003s_procedures():
    """The offline install runs ring_0001 (its procedures and release), ring_0002 (drops the
    release, creates the rescuing one) and ring_0003 (alters push, pop and release in place):
    the last definitions the script leaves are ring_0003's, with a release per kept claim."""
    batches = split_go_batches(install_script(None, "orders", "ring", dialect="mssql"))
    release = [b for b in batches if '"queuectl"."orders_ring_release"' in b]
    # ring_0007 alters them once more (the side table's pointer), ring_0008 renders the same
    # bodies again (its isolation check is PostgreSQL's): both keep ring_0003's marks
    assert [b.split(None, 4)[:4] for b in release] == [
        ["CREATE", "OR", "ALTER", "PROCEDURE"],
        ["DROP", "PROCEDURE", "IF", "EXISTS"],
        ["CREATE", "OR", "ALTER", "PROCEDURE"], ["CREATE", "OR", "ALTER", "PROCEDURE"],
        ["CREATE", "OR", "ALTER", "PROCEDURE"], ["CREATE", "OR", "ALTER", "PROCEDURE"]]
    assert release[5] == release[4]
    assert "@timeout float = 0.1" not in release[0] and "@timeout float = 0.1" in release[2]
    assert "WHILE EXISTS (SELECT 1 FROM @claims)" not in release[2] and "WHILE EXISTS (SELECT 1 FROM @claims)" in release[3]
    ring_0003 = {"enqueue": "FOR JSON PATH", "enqueue_many": "orders_ring_push", "dequeue": "sp_sequence_get_range"}
    for fn, mark in ring_0003.items():
        defined = [b for b in batches if re.match(r'CREATE (?:OR ALTER )?PROCEDURE "queuectl"\."orders_%s"\s' % fn, b)]
        assert len(defined) == 4 and mark not in defined[0] and mark in defined[1] and mark in defined[2], fn
        assert defined[3] == defined[2], fn
    flat = " ".join(batches)
    assert flat.index("schema_version=N'ring_0002'") < flat.index("schema_version=N'ring_0003'")
    assert "UPDATE queuectl.queues SET schema_version=N'ring_0003'" in flat


# The procedures ring_0003 replaces, in the order its upgrade runs their sections.
_RING_0003 = ("enqueue_many", "enqueue", "dequeue", "ring_release")


def ring_0003_procedures() -> dict[str, str]:
    """The T-SQL of ring_0003's procedures by name, one batch each; enqueue_many's section
    creates SQL Server's push procedure (ring_push) first, in a batch of its own."""
    procedures = {fn: split_go_batches(rendered("ring", f"create_{fn}_0003")) for fn in _RING_0003}
    procedures["ring_push"] = procedures["enqueue_many"][:1]
    procedures["enqueue_many"] = procedures["enqueue_many"][1:]
    assert all(len(batches) == 1 for batches in procedures.values()), procedures
    return {fn: batches[0] for fn, batches in procedures.items()}


def test_ring_0003_tsql_pushes_and_pops_sets_of_kept_claims():
    """The T-SQL counterpart of ring_0003 (no server here: its form, not its run). Push: the
    kept claims are read back from SESSION_CONTEXT in order, new positions come from one
    range, the free slots are locked (UPDLOCK, READPAST, ROWLOCK) and the run written in one
    UPDATE inside one short transaction, the unwritten claims go back to SESSION_CONTEXT and
    the positions come back in input order. Pop: claims topped up below the push high mark,
    every FULL claimed slot taken by one UPDATE ... OUTPUT through a READPAST pick, the rest
    kept. Release: a row per kept claim, push claims first, rescues through ring_push.
    (The push itself is ring_push; enqueue_many and enqueue return its OUTPUT ids.)"""
    procedures = ring_0003_procedures()
    push_many, push_one, pop, release = (" ".join(procedures[fn].split()) for fn in _RING_0003)
    push = " ".join(procedures["ring_push"].split())
    ring = '"queuectl"."orders_ring"'
    kept = "OPENJSON(CONCAT(N'[', CAST(SESSION_CONTEXT(@{}) AS nvarchar(4000)), N']')) AS k"
    write_back = "STRING_AGG(CAST({0}.pos AS nvarchar(20)), N',') WITHIN GROUP (ORDER BY {0}.pos)"
    assert "STRING_SPLIT" not in " ".join(procedures.values())  # its ordinal needs SQL Server 2022

    # push: same parameters as before (the client's JSON array), one probe and one write
    assert push_many.startswith('CREATE OR ALTER PROCEDURE "queuectl"."orders_enqueue_many" @items nvarchar(max), '
                                "@timeout float = 1.0 WITH EXECUTE AS OWNER AS BEGIN")
    assert push.startswith('CREATE OR ALTER PROCEDURE "queuectl"."orders_ring_push" @items nvarchar(max), '
                           "@timeout float = 1.0, @ids nvarchar(max) = NULL OUTPUT WITH EXECUTE AS OWNER AS BEGIN")
    assert kept.format("key") in push and "FROM OPENJSON(@items) AS j" in push
    assert ("EXEC sys.sp_sequence_get_range @sequence_name = '\"queuectl\".\"orders_push_seq\"', "
            "@range_size = @draw, @range_first_value = @first OUTPUT;") in push
    probe = push.index(f"JOIN {ring} AS s WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK) ON s.slot = c.pos % 1024;")
    stop = push.index("SELECT @stop = MIN(c.pos) FROM @claims AS c WHERE NOT EXISTS")
    begin = push.index("BEGIN TRANSACTION;")
    write = push.index("OUTPUT w.ord, inserted.msg_id INTO @written (ord, id)")
    recheck = push.index("WHERE r.msg_id = w.pos - 1024 AND r.state <> 1;")
    commit = push.index("COMMIT TRANSACTION;")
    assert probe < stop < begin < write < recheck < commit and push.count("UPDATE r SET") == 1
    assert "INSERT INTO @claims (pos) VALUES (NEXT VALUE FOR \"queuectl\".\"orders_push_seq\");" in push  # tombstoned
    assert push.index(write_back.format("k")) < push.index("EXEC sys.sp_set_session_context @key = @key, @value = @kept;")
    assert push.endswith("SELECT @ids = STRING_AGG(CAST(w.id AS nvarchar(max)), N',') WITHIN GROUP (ORDER BY w.ord) "
                         "FROM @written AS w; END")
    call = 'EXEC "queuectl"."orders_ring_push" @items = @items, @timeout = @timeout, @ids = @ids OUTPUT;'
    assert call in push_many and push_many.endswith(
        "SELECT CAST(j.[value] AS bigint) AS id FROM OPENJSON(CONCAT(N'[', @ids, N']')) AS j "
        "ORDER BY CAST(j.[key] AS int); END")

    # push one: the push of one, one row (NULL: full)
    assert call in push_one and push_one.endswith("SELECT CAST(@ids AS bigint) AS id; END")

    # pop: top-up bound, one take, the rest kept, written back
    assert kept.format("key") in pop and "q.last_used_value" in pop and "p.last_used_value" in pop
    take = pop.index(f"JOIN {ring} AS r WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK) ON r.slot = c.pos % 1024 "
                     "WHERE r.msg_id = c.pos AND r.state = 1 ORDER BY c.pos ) UPDATE full_slots SET state = 0")
    assert pop.index("SELECT TOP (@need)") < take < pop.index("OUTPUT deleted.msg_id, deleted.payload")
    assert "WHERE s.msg_id > c.pos OR (s.msg_id = c.pos AND s.state <> 1);" in pop  # taken, skipped, rescued
    assert "IF @taken > 0 OR SYSUTCDATETIME() >= @deadline BREAK;" in pop  # waits only while it has nothing
    assert pop.index(write_back.format("c")) < pop.index("EXEC sys.sp_set_session_context @key = @key, @value = @kept;")

    # release: every kept claim of both sides, the push side cleared before any rescue
    assert release.count("WHILE EXISTS (SELECT 1 FROM @claims)") == 2
    loops = [release.index(kept.format(side)) for side in ("k_push", "k_pop")]
    cleared = release.index("EXEC sys.sp_set_session_context @key = @k_push, @value = NULL;")
    assert loops[0] < cleared < release.index("WHILE EXISTS") < loops[1]
    save, push_call = release.index("SAVE TRANSACTION ring_rescue;"), release.index(
        'EXEC "queuectl"."orders_ring_push" @items = @one, @timeout = 0, @ids = @ids OUTPUT;')
    assert release.index("BEGIN TRANSACTION;") < save < push_call < release.index("ROLLBACK TRANSACTION ring_rescue;")
    assert release.count("BEGIN TRANSACTION;") == 1 and release.count("COMMIT TRANSACTION;") == 3
    assert release.endswith("EXEC sys.sp_set_session_context @key = @k_pop, @value = NULL; "
                            "SELECT side, item_id, tombstoned, new_item_id, outcome FROM @out ORDER BY seq; END")


@pytest.mark.parametrize(
    ("what", "break_it"),
    [
        ("unbalanced parenthesis in a kept-claims read", lambda s: s.replace("N']')) AS k", "N']') AS k", 1)),
        ("the pop's wait loop without END", lambda s: s.replace(
            "    END\n    SELECT @kept = STRING_AGG(CAST(c.pos", "    SELECT @kept = STRING_AGG(CAST(c.pos", 1)),
        ("a clause out of place in the take", lambda s: s.replace("ORDER BY c.pos\n        )", "BY ORDER c.pos\n        )", 1)),
        ("OUTPUT after its INTO", lambda s: s.replace(
            "OUTPUT w.ord, inserted.msg_id INTO @written (ord, id)", "INTO @written (ord, id) OUTPUT w.ord, inserted.msg_id", 1)),
    ],
)
@pytest.mark.slow
def test_a_broken_ring_0003_statement_fails_the_check(what, break_it):
    good = "\nGO\n".join(ring_0003_procedures().values())
    check_tsql(good)
    broken = break_it(good)
    assert broken != good, what
    with pytest.raises(TsqlError):
        check_tsql(broken)


def test_an_unsorted_output_batch_fails_the_dequeue_order_check():
    """The reliable dequeue as it was: UPDATE through the ordered pick, OUTPUT straight to the
    client. The pick's ORDER BY chose the rows, but nothing orders what OUTPUT returns."""
    pg_fn, ms_proc = _definition("reliable", "create_dequeue_0001", "dequeue")
    check_dequeue_matches("reliable", pg_fn, ms_proc)
    unsorted = re.sub(r"\s*INTO @claimed \(.*?\)\s*(FROM picked)", r"\n    \1", ms_proc, flags=re.S)
    unsorted = unsorted[: unsorted.index("    SELECT c.id")] + "END"
    assert "INTO @claimed" not in unsorted and "ORDER BY m.priority, m.due_at, m.id" in unsorted
    check_tsql(unsorted)
    with pytest.raises(AssertionError):
        check_dequeue_matches("reliable", pg_fn, unsorted)


@pytest.mark.parametrize("method", ["set_local_timeouts", "set_session_timeouts"])
def test_job_lock_timeouts_reach_sql_server_rendered(method):
    """The jobs' lock timeout on SQL Server is a rendered integer, not a bind: a SET inside
    sp_executesql (how the driver runs a statement with parameters) is undone when it
    returns. SQLAlchemy's mock engine records what the job would send, without a server."""
    from queuectl.jobs.base import JobTarget

    sent = []
    mock = sa.create_mock_engine(MSSQL_URL, lambda statement, *params, **kw: sent.append(str(statement)))
    getattr(JobTarget(QueueNames("orders"), None, "mssql"), method)(mock, lock_timeout=2.5, statement_timeout=30)
    [text] = sent
    assert "SET LOCK_TIMEOUT 2500;" in text and not _BIND.findall(text)
    check_tsql(text)
    getattr(JobTarget(QueueNames("orders"), None, "mssql"), method)(mock, lock_timeout=0.0001, statement_timeout=30)
    assert "SET LOCK_TIMEOUT 1;" in sent[-1]  # never 0, which on SQL Server means "do not wait at all"


def test_tsql_names_the_version_its_statements_need():
    """STRING_AGG and sys.sequences.last_used_value are SQL Server 2017's, and the ring and the
    watermark kind use them: every minimum version the T-SQL files and the docs state is 2017."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    used = [f for f in sql_files("mssql") if re.search(r"STRING_AGG|last_used_value", (root / "sql" / "mssql" / f"{f}.sql").read_text())]
    assert {"ring", "watermark"} <= set(used)
    stated = re.compile(r"(?:SQL Server )?(20\d\d)(?: SP\d)? or later", re.I)
    for path in [*(root / "sql" / "mssql").rglob("*.sql"), root / "README.md", *(root / "docs").glob("*.md")]:
        for version in stated.findall(path.read_text()):
            assert version == "2017", (path.name, version)


def test_every_tsql_module_is_created_or_altered():
    """CREATE OR ALTER everywhere a procedure is made (reliable.sql's header says why: it keeps
    the grants and lets a section run again), never a plain CREATE, which fails on a second
    run and was used for ack_dequeue and the kinds' enqueue procedures."""
    for file, name in mssql_sections():
        for batch in split_go_batches(rendered(file, name)):
            statement = re.sub(r"^(\s*--[^\n]*\n)*", "", batch).lstrip()
            assert not re.match(r"CREATE\s+(PROCEDURE|FUNCTION|TRIGGER)\b", statement, re.I), (file, name)


def test_the_heap_kind_is_clustered_on_sql_server_and_says_why():
    """The heap kind keeps a clustered primary key on SQL Server: a heap drained by row-locked
    DELETEs (READPAST) keeps its emptied pages allocated, and only a table-locked DELETE,
    which would serialise consumers, gives them back. The section says so."""
    text = section("mssql", "heap", "create_tables")
    assert "PRIMARY KEY CLUSTERED" in rendered("heap", "create_tables")
    assert "Why not a heap" in text and "TABLOCK" in text and "stay allocated" in text


def test_the_rings_first_wait_is_a_real_pause():
    """The ring's push and pop back off with WAITFOR DELAY of a datetime, whose precision is
    1/300 s: a first pause of 1 ms rounded to no wait at all, so a full ring was looked at
    twice at once. Each backing-off procedure starts at a pause that a datetime keeps."""
    for file, name in mssql_sections():
        text = rendered(file, name)
        if "WAITFOR DELAY @pause" not in text:
            continue
        first = int(re.search(r"@pause_ms int = (\d+)", text).group(1))
        assert round(first * 0.3) / 300 > 0, (file, name, first)  # datetime's ticks: 1/300 s


def test_ddl_sections_hold_no_bind_parameters():
    """Alembic runs DDL sections through sa.text(): a ':word' there would become a bind."""
    for file, section in mssql_sections():
        if section.startswith(("create_", "drop_")) or section in ("session_settings",):
            assert not _BIND.findall(rendered(file, section)), (file, section)


# -- SQLAlchemy-built statements --------------------------------------------------------------


def compiled(statement) -> str:
    return str(statement.compile(dialect=mssql.dialect(), compile_kwargs={"literal_binds": True}))


def test_sqlalchemy_statements_compile_for_mssql():
    table = queues_table("queuectl")
    insert = compiled(table.insert().values(name="orders", kind="reliable", schema_version="reliable_0001",
                                            settings=sa.cast(sa.literal(QueueSettings().to_json(), sa.Text()), table.c.settings.type)))
    assert insert.startswith("INSERT INTO queuectl.queues") and "NVARCHAR(max)" in insert
    select = compiled(sa.select(table).where(table.c.name == "orders").order_by(table.c.name))
    assert "FROM queuectl.queues" in select and "N'orders'" in select
    update = compiled(table.update().where(table.c.name == "orders").values(schema_version="x", updated_at=sa.func.now()))
    assert "CURRENT_TIMESTAMP" in update
    assert compiled(table.delete().where(table.c.name == "orders")).startswith("DELETE FROM queuectl.queues")
    ddl = str(sa.schema.CreateTable(table).compile(dialect=mssql.dialect()))
    assert "name NVARCHAR(128) NOT NULL" in ddl and "settings NVARCHAR(max) NOT NULL" in ddl
    version = sa.table("alembic_version", sa.column("version_num"), schema="queuectl")
    assert compiled(sa.select(version.c.version_num)) == "SELECT queuectl.alembic_version.version_num \nFROM queuectl.alembic_version"
    for statement in (insert, select, update):
        check_tsql(statement)


def test_catalog_types_are_bounded_on_mssql_and_unchanged_on_postgresql():
    from sqlalchemy.dialects import postgresql

    assert NAME_TYPE.compile(dialect=mssql.dialect()) == "NVARCHAR(128)"
    assert NAME_TYPE.compile(dialect=postgresql.dialect()) == "TEXT"
    assert SETTINGS_TYPE.compile(dialect=postgresql.dialect()) == "JSONB"


def test_alembic_operations_compile_for_mssql_offline():
    """The migration operations Alembic emits in --sql mode, against the mssql dialect."""
    import io

    buffer = io.StringIO()
    context = MigrationContext.configure(dialect_name="mssql", opts={"as_sql": True, "output_buffer": buffer})
    ops = Operations(context)
    ops.create_table("probe", sa.Column("name", NAME_TYPE, primary_key=True), schema="queuectl")
    ops.execute(sa.text(rendered("reliable", "drop_functions")))
    script = buffer.getvalue()
    assert "CREATE TABLE queuectl.probe" in script and "\nGO\n" in script
    check_tsql(script)


# -- the engine adapter ---------------------------------------------------------------------------


def test_mssql_adapter_is_chosen_from_the_url_without_a_driver():
    adapter = adapter_for(MSSQL_URL)
    assert isinstance(adapter, MssqlAdapter) and adapter.sql_dir == "mssql"
    assert not adapter.review_script_connects and adapter_for("postgresql").review_script_connects
    try_lock, unlock = render("mssql", "locks", "try_lock", {}), render("mssql", "locks", "unlock", {})
    assert "sp_getapplock" in try_lock and "@LockOwner = 'Session'" in try_lock and "@LockTimeout = 0" in try_lock
    assert "sp_releaseapplock" in unlock
    assert adapter.list_param([3, 1, 2]) == "[3, 1, 2]"
    assert adapter.json_value('{"a": 1}') == {"a": 1}


@pytest.mark.parametrize("kind", KINDS)
def test_enqueue_many_values_are_what_the_tsql_reads(kind):
    """The client's enqueue_many values travel as one JSON array on SQL Server: its item keys
    are the OPENJSON paths of the kind's procedure, and its bind names the call's."""
    from datetime import datetime, timedelta, timezone

    adapter = adapter_for("mssql")
    due = datetime(2030, 1, 2, 3, 4, 5, 600000, tzinfo=timezone(timedelta(hours=2)))
    if kind == "reliable":
        item = {"payload": b"\x00\xff", "headers": '{"a": 1}', "priority": 0, "delay": 1.5, "title": None}
        params = adapter.enqueue_many_params([item], None)
    elif kind == "pending":
        params = adapter.kind_enqueue_many_params([b"\x00\xff"], ['{"a": 1}'], due_ats=[due], delays=[1.5])
    else:
        params = adapter.kind_enqueue_many_params([b"\x00\xff"], ['{"a": 1}'])
    [doc] = json.loads(params["items"])
    # the reliable kind's enqueue procedures have sections of their own (reliable_0001, _0003),
    # and so has each of the ring's procedures
    for name in {"reliable": ("create_enqueue_functions_0001", "create_enqueue_functions_0003"),
                 "ring": ("create_enqueue_many_0001", "create_enqueue_many")}.get(kind, ("create_functions",)):
        paths = set(re.findall(r"'\$\.(\w+)'", rendered(kind, name)))
        assert set(doc) == paths, (kind, name)
    assert doc["payload"] == "00ff" and doc["headers"] == {"a": 1}  # CONVERT(varbinary, hex, 2); AS JSON
    if kind == "pending":
        assert doc["due_at"] == "2030-01-02T01:04:05.600000"  # naive UTC: datetime2 refuses an offset
    call_binds = set(_BIND.findall(rendered(kind, "enqueue_many")))
    assert call_binds == set(params) | ({"timeout"} if kind == "ring" else set()), kind


def test_go_batches_split_on_go_lines_only():
    text = "SELECT 1;\nGO\nSELECT 'GO' AS go_column\n  go  \nEXEC x;\nGo;\n-- only a comment\nGO\n"
    assert split_go_batches(text) == ["SELECT 1", "SELECT 'GO' AS go_column", "EXEC x"]


def test_mssql_url_without_odbc_driver_is_one_clear_line():
    with pytest.raises(ConnectionFailed) as caught:
        make_engine(MSSQL_URL)
    message = str(caught.value)
    assert "\n" not in message and "msodbcsql18" in message and "Not-Shown-42" not in message


@pytest.mark.slow
def test_cli_install_sql_for_mssql_prints_the_script_without_connecting():
    """nowhere.invalid cannot resolve and no ODBC driver manager exists here: any connection
    attempt would fail, so a complete script proves none was made."""
    result = run_cli("install", "orders", "--url", MSSQL_URL, "--sql")
    assert result.returncode == 0, result.stderr.decode()
    script = result.stdout.decode()
    assert check_tsql(script) > 10
    assert "Not-Shown-42" not in script + result.stderr.decode()
    live = run_cli("install", "orders", "--url", MSSQL_URL)
    assert live.returncode == 2
    [line] = [ln for ln in live.stderr.decode().splitlines() if ln.strip()]
    assert line.startswith("error:") and "msodbcsql18" in line and "Not-Shown-42" not in line


def test_reliable_enqueue_refuses_oversized_messages_in_tsql():
    """reliable_0003 and reliable_0010 on SQL Server: both procedures THROW 50413 before
    writing anything; the head's count payload + title + headers."""
    script = install_script(None, "orders", "reliable", QueueSettings(max_payload_bytes=777), dialect="mssql")
    flat = " ".join(script.split())
    assert "IF DATALENGTH(@payload) > 777 BEGIN" in flat  # reliable_0003
    assert "WHERE DATALENGTH(s.payload) > 777 ORDER BY s.ord" in flat
    head = flat[flat.index("SET version_num='reliable_0009'"):]  # the step to reliable_0010
    assert "IF @payload_bytes + @title_bytes + @headers_bytes > 777 BEGIN" in head  # reliable_0010
    assert "WHERE s.payload_bytes + s.title_bytes + s.headers_bytes > 777 ORDER BY s.ord" in head
    assert "DECLARE @title_bytes bigint = ISNULL(DATALENGTH(@title), 0);" in head
    assert "@title nvarchar(max) = NULL" in head and "title nvarchar(max) '$.title'" in head
    # reliable_0003, reliable_0010 and reliable_0012 (the generation layout) create them
    assert flat.count("THROW 50413, @refused, 1;") == 6
    assert flat.count("THROW 50413, @refused, 1; END; BEGIN TRANSACTION;") == 3  # refused before the transaction
    assert "CREATE OR ALTER PROCEDURE \"queuectl\".\"orders_enqueue_many\"" in flat


def test_mssql_payload_refusal_and_timeouts_are_recognised_from_pyodbc_errors():
    class PyodbcError(Exception):  # pyodbc errors carry (sqlstate, message)
        pass

    def wrapped(*args: str) -> sa.exc.DBAPIError:
        return sa.exc.DBAPIError("EXEC x", {}, PyodbcError(*args))

    adapter = adapter_for("mssql")
    refused = wrapped("42000", "[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]queue 'orders': message "
                               "of 5 bytes (payload 1 + title 4 + headers 0) is over max_payload_bytes 4: nothing was "
                               "enqueued (50413) (SQLExecDirectW)")
    assert adapter.payload_refusal(refused) == ("queue 'orders': message of 5 bytes (payload 1 + title 4 + headers 0) "
                                                "is over max_payload_bytes 4: nothing was enqueued")
    assert not adapter.canceled(refused)
    assert adapter.canceled(wrapped("HYT00", "[HYT00] [Microsoft][ODBC Driver 18 for SQL Server]Query timeout expired (0)"))
    assert adapter.canceled(wrapped("HY000", "[HY000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Lock request time out period exceeded. (1222)"))
    assert adapter.payload_refusal(wrapped("42000", "[42000] something else (50000)")) is None


def test_every_tsql_procedure_and_trigger_clears_a_callers_rowcount():
    """SET ROWCOUNT 0 beside SET NOCOUNT ON in every procedure and trigger (reliable.sql's header:
    a caller's SET ROWCOUNT n would stop their statements after n rows and refuse NEXT VALUE FOR;
    the setting is undone when the module returns)."""
    modules = 0
    for file, name in mssql_sections():
        for batch in split_go_batches(rendered(file, name)):
            statement = re.sub(r"^(\s*--[^\n]*\n)*", "", batch).lstrip()
            if re.match(r"CREATE\s+OR\s+ALTER\s+(PROCEDURE|TRIGGER)\b", statement, re.I):
                modules += 1
                assert re.search(r"SET NOCOUNT ON; SET ROWCOUNT 0;", statement), (file, name, statement[:120])
    assert modules > 40, modules
