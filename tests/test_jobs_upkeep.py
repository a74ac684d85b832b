"""The reorganize job's decisions and statements on both engines, without a server.

* decide: pure functions of measured-looking numbers (thresholds -> action) on PostgreSQL
  and SQL Server;
* plan: for a SQL Server engine that never connects (create_mock_engine on an mssql+pyodbc
  URL), the job's own plan_index renders exactly the T-SQL it would run, and every
  statement passes the offline T-SQL check of tests/test_mssql_offline.py (which is shown
  to fail on a broken one);
* the measured-looking rows have the columns the T-SQL sections return (parsed with
  sqlfluff), so the Python reads what the server would send.
What this cannot show is that SQL Server runs them: see tests/test_mssql_live.py.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from queuectl.engine import adapter_for
from queuectl.errors import UsageError
from queuectl.jobs.base import JobTarget
from queuectl.jobs.reorganize import ReorganizeConfig, ReorganizeResult, plan_index
from queuectl.engine.base import IndexMeasure, ServerAbilities
from queuectl.engine.mssql import MssqlIndexUpkeep, decide_mssql
from queuectl.engine.postgresql import PostgresIndexUpkeep, decide_postgresql
from queuectl.names import QueueNames
from queuectl.sqlfiles import sections

from test_mssql_offline import MSSQL_URL, TsqlError, check_tsql, result_columns

PK = "PK__orders_m__3213E83F5D1A8B2C"   # how SQL Server names the meta table's unnamed primary key
CONFIG = ReorganizeConfig()              # 1000 pages, 5 % / 30 %, page density 70 %, resumable
ENTERPRISE = ServerAbilities(online_rebuild=True, resumable_rebuild=True)
ENTERPRISE_2016 = ServerAbilities(online_rebuild=True, resumable_rebuild=False)
STANDARD = ServerAbilities(online_rebuild=False, resumable_rebuild=False)


def mssql_engine() -> sa.engine.Engine:
    """An mssql engine that never connects: every statement would land in the list."""
    return sa.create_mock_engine(MSSQL_URL, lambda statement, *args, **kw: None)


def mssql_target() -> JobTarget:
    return JobTarget(QueueNames("orders"), None, adapter_for(mssql_engine()).sql_dir)


def dmv_row(pages: int, fragmentation: float, density: float | None, *, ghosts: int = 0, version_ghosts: int = 0,
            page_locks: bool = True, fill_factor: int = 0) -> dict:
    """One row of sql/mssql/jobs.sql:index_measure, as sys.dm_db_index_physical_stats gives it."""
    return {"leaf_pages": pages, "avg_fragmentation_in_percent": fragmentation,
            "avg_page_space_used_in_percent": density, "record_count": pages * 40,
            "ghost_record_count": ghosts, "version_ghost_record_count": version_ghosts,
            "allow_page_locks": int(page_locks), "fill_factor": fill_factor or 100}


def mssql_measure(*args, **kw) -> IndexMeasure:
    row = dmv_row(*args, **kw)
    return MssqlIndexUpkeep().measure_row(IndexMeasure(bytes=row["leaf_pages"] * 8192, pages=row["leaf_pages"]), row)


def pg_measure(pages: int, bloat: float | None, density: float, fragmentation: float) -> IndexMeasure:
    """A pgstatindex measurement as the PostgreSQL index upkeep keeps it."""
    return IndexMeasure(bytes=pages * 8192, pages=pages, leaf_pages=pages - 10, internal_pages=9, empty_pages=0,
                        deleted_pages=0, leaf_density=density, leaf_fragmentation=fragmentation, bloat_pct=bloat)


def sql_lines(text: str) -> str:
    """A statement without its comment lines, whitespace normalised: what a reader compares."""
    return " ".join(" ".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("--")).split())


# -- decisions, PostgreSQL ------------------------------------------------------------------------


@pytest.mark.parametrize(("measure", "decision", "why"), [
    (pg_measure(6000, 76.0, 21.0, 12.0), "rebuild", "bloat 76 %, leaf density 21 %, fragmentation 12 %: at or above 30 % / 30 %"),
    (pg_measure(6000, 4.0, 88.0, 41.0), "rebuild", "fragmentation 41 %: at or above"),
    (pg_measure(6000, 12.0, 80.0, 3.0), "watch", "above 5 %, below the rebuild thresholds"),
    (pg_measure(6000, 2.0, 89.0, 1.0), "ok", "bloat 2 %, leaf density 89 %, fragmentation 1 %"),
    (pg_measure(400, 90.0, 9.0, 50.0), "small", "400 pages < 1000"),
    (IndexMeasure(bytes=8192 * 50, pages=50), "not measured", "pgstattuple missing"),
])
def test_postgresql_decision_from_pgstatindex_numbers(measure, decision, why):
    assert decide_postgresql(measure, CONFIG) == (decision, decide_postgresql(measure, CONFIG)[1])
    got, reason = decide_postgresql(measure, CONFIG)
    assert got == decision and why in reason


# -- decisions, SQL Server ------------------------------------------------------------------------


@pytest.mark.parametrize(("measure", "can", "decision", "why"), [
    # the Books Online bands: under 5 % nothing, 5-30 % REORGANIZE, above 30 % REBUILD ONLINE
    (mssql_measure(5000, 3.0, 92.0), ENTERPRISE, "ok", "fragmentation 3 %, page density 92 %"),
    (mssql_measure(5000, 12.5, 88.0, ghosts=1800), ENTERPRISE, "reorganize", "from 5 % to 30 %"),
    (mssql_measure(5000, 47.0, 64.0), ENTERPRISE, "rebuild", "at or above 30 % (online, resumable)"),
    (mssql_measure(5000, 47.0, 64.0), ENTERPRISE_2016, "rebuild", "at or above 30 % (online)"),
    # Standard edition: no online rebuild, so REORGANIZE, and the reason says so
    (mssql_measure(5000, 47.0, 64.0), STANDARD, "reorganize", "this edition has no online rebuild: reorganizing"),
    # a hot meta table: hardly fragmented but its pages half empty (ghosts cleaned, space left)
    (mssql_measure(2500, 1.5, 52.0, ghosts=40_000, version_ghosts=9_000), ENTERPRISE, "reorganize",
     "pages less than 70 % full"),
    # under 1000 pages: left alone whatever the numbers (Randal: "don't bother")
    (mssql_measure(600, 80.0, 30.0), ENTERPRISE, "small", "600 pages < 1000"),
    # page locks disallowed: REORGANIZE would fail (reference dba.md 1.7) ...
    (mssql_measure(5000, 12.0, 85.0, page_locks=False), ENTERPRISE, "skipped", "ALLOW_PAGE_LOCKS is OFF"),
    # ... but an online rebuild does not need them
    (mssql_measure(5000, 35.0, 85.0, page_locks=False), ENTERPRISE, "rebuild", "at or above 30 %"),
    (mssql_measure(5000, 35.0, 85.0, page_locks=False), STANDARD, "skipped", "ALLOW_PAGE_LOCKS is OFF"),
])
def test_mssql_decision_from_physical_stats_numbers(measure, can, decision, why):
    got, reason = decide_mssql(measure, CONFIG, can)
    assert got == decision, reason
    assert why in reason


def test_mssql_reason_reports_the_measurements_that_drove_it():
    _, reason = decide_mssql(mssql_measure(5000, 12.5, 88.0, ghosts=1800, version_ghosts=7), CONFIG, ENTERPRISE)
    assert reason.startswith("fragmentation 12 %, page density 88 %, 1800 ghost / 7 version ghost records")


def test_mssql_thresholds_are_the_configs():
    strict = ReorganizeConfig(watch_pct=15, rebuild_fragmentation_pct=60, min_page_density_pct=50, min_pages=100)
    assert decide_mssql(mssql_measure(500, 12.5, 88.0), strict, ENTERPRISE)[0] == "ok"
    assert decide_mssql(mssql_measure(500, 47.0, 88.0), strict, ENTERPRISE)[0] == "reorganize"
    assert decide_mssql(mssql_measure(500, 61.0, 88.0), strict, ENTERPRISE)[0] == "rebuild"
    no_resume = ReorganizeConfig(resumable=False)
    assert "(online)" in decide_mssql(mssql_measure(5000, 61.0, 88.0), no_resume, ENTERPRISE)[1]


# -- the engine seam ------------------------------------------------------------------------------


def test_each_engine_gets_its_own_upkeep_from_the_adapter():
    assert isinstance(adapter_for(mssql_engine()).index_upkeep, MssqlIndexUpkeep)
    pg = sa.create_mock_engine("postgresql+psycopg://u@nowhere.invalid/db", lambda *a, **k: None)
    assert isinstance(adapter_for(pg).index_upkeep, PostgresIndexUpkeep)


# -- what the job would run on SQL Server, rendered offline ---------------------------------------


def test_mssql_rebuild_plan_is_an_online_resumable_rebuild_of_the_quoted_index():
    upkeep = adapter_for(mssql_engine()).index_upkeep
    before = mssql_measure(5000, 47.0, 64.0)
    config = ReorganizeConfig(lock_timeout=5, statement_timeout=1800)
    report, statements = plan_index(upkeep, mssql_target(), "meta", PK, before, config, ENTERPRISE)
    assert (report.decision, report.action, report.error) == ("rebuild", None, None)
    assert [sql_lines(s) for s in report.statements] == [
        f'ALTER INDEX "{PK}" ON "queuectl"."orders_meta" REBUILD WITH ( ONLINE = ON (WAIT_AT_LOW_PRIORITY '
        "(MAX_DURATION = 1 MINUTES, ABORT_AFTER_WAIT = SELF)), RESUMABLE = ON, MAX_DURATION = 30 MINUTES)"]
    assert [str(s) for s in statements] == report.statements  # what run() executes is what the report shows
    for text in report.statements:
        check_tsql(text)


def test_mssql_rebuild_without_resumable_support_is_online_only():
    report, _ = plan_index(MssqlIndexUpkeep(), mssql_target(), "data", "PK__orders_d__3213E83F0A1B2C3D",
                           mssql_measure(5000, 47.0, 64.0), CONFIG, ENTERPRISE_2016)
    [text] = report.statements
    assert sql_lines(text) == (
        'ALTER INDEX "PK__orders_d__3213E83F0A1B2C3D" ON "queuectl"."orders_data" REBUILD WITH ( ONLINE = ON '
        "(WAIT_AT_LOW_PRIORITY (MAX_DURATION = 1 MINUTES, ABORT_AFTER_WAIT = SELF)))")
    check_tsql(text)


@pytest.mark.parametrize("can", [ENTERPRISE, STANDARD])
def test_mssql_reorganize_plan_reorganizes_then_updates_the_index_statistics(can):
    before = mssql_measure(5000, 12.5 if can is ENTERPRISE else 47.0, 88.0)
    report, _ = plan_index(MssqlIndexUpkeep(), mssql_target(), "meta", "orders_meta_ready", before, CONFIG, can)
    assert report.decision == "reorganize"
    assert [sql_lines(s) for s in report.statements] == [
        'ALTER INDEX "orders_meta_ready" ON "queuectl"."orders_meta" REORGANIZE WITH (LOB_COMPACTION = ON)',
        'UPDATE STATISTICS "queuectl"."orders_meta" "orders_meta_ready"',
    ]
    for text in report.statements:
        check_tsql(text)


def test_mssql_dry_run_reports_the_statements_it_would_run():
    report, statements = plan_index(MssqlIndexUpkeep(), mssql_target(), "meta", "orders_meta_ready",
                                    mssql_measure(5000, 12.5, 88.0), ReorganizeConfig(dry_run=True), ENTERPRISE)
    assert report.action == "would reorganize" and len(report.statements) == 2 and statements


@pytest.mark.parametrize("decision_input", [mssql_measure(5000, 3.0, 92.0), mssql_measure(600, 80.0, 30.0),
                                            mssql_measure(5000, 12.0, 85.0, page_locks=False)])
def test_mssql_no_statement_when_nothing_is_to_be_done(decision_input):
    report, statements = plan_index(MssqlIndexUpkeep(), mssql_target(), "meta", "orders_meta_ready",
                                    decision_input, CONFIG, ENTERPRISE)
    assert report.decision in ("ok", "small", "skipped") and statements == [] and report.statements == []


def test_mssql_table_step_and_leftover_resume_render_as_tsql():
    target = mssql_target()
    upkeep = MssqlIndexUpkeep()
    steps = [sql_lines(str(statement)) for _table, statement in upkeep.table_step(target)]
    # reliable_0012 and later: meta and data are views over the generation slots on SQL Server
    assert steps == [f'UPDATE STATISTICS "queuectl"."orders_{t}{s}"' for t in ("meta", "data") for s in range(3)]
    resume = str(upkeep._statement(target, "meta", PK, "resume_rebuild", ReorganizeConfig(statement_timeout=90)))
    assert sql_lines(resume) == (
        f'ALTER INDEX "{PK}" ON "queuectl"."orders_meta" RESUME WITH ( MAX_DURATION = 2 MINUTES, '
        "WAIT_AT_LOW_PRIORITY (MAX_DURATION = 1 MINUTES, ABORT_AFTER_WAIT = SELF))")
    for text in steps + [resume]:
        check_tsql(text)


def test_postgresql_plan_is_reindex_concurrently_as_before():
    target = JobTarget(QueueNames("orders"), None, "postgresql")
    report, _ = plan_index(PostgresIndexUpkeep(), target, "meta", "orders_meta_ready",
                           pg_measure(6000, 76.0, 21.0, 12.0), CONFIG, ServerAbilities(measure_with='"public"'))
    assert [sql_lines(s) for s in report.statements] == ['REINDEX INDEX CONCURRENTLY "queuectl"."orders_meta_ready"']
    watch, statements = plan_index(PostgresIndexUpkeep(), target, "meta", "orders_meta_ready",
                                   pg_measure(6000, 12.0, 80.0, 3.0), CONFIG, ServerAbilities())
    assert watch.decision == "watch" and statements == []


# -- the checks can fail --------------------------------------------------------------------------


def test_an_index_name_queuectl_will_not_quote_fails_that_index_only():
    report, statements = plan_index(MssqlIndexUpkeep(), mssql_target(), "meta", 'ix"]; DROP TABLE x; --',
                                    mssql_measure(5000, 47.0, 64.0), CONFIG, ENTERPRISE)
    assert report.action == "failed" and "refusing to quote catalog name" in report.error and statements == []
    with pytest.raises(UsageError):
        MssqlIndexUpkeep()._statement(mssql_target(), "meta", "bad name", "reorganize_index", CONFIG)


@pytest.mark.parametrize("break_it", [
    lambda s: s.replace("ABORT_AFTER_WAIT = SELF)),", "ABORT_AFTER_WAIT = SELF),", 1),   # a parenthesis short
    lambda s: s.replace("REBUILD WITH", "REBUILD WIHT", 1),                                # a misspelt keyword
])
def test_a_broken_rendered_statement_fails_the_tsql_check(break_it):
    report, _ = plan_index(MssqlIndexUpkeep(), mssql_target(), "meta", PK, mssql_measure(5000, 47.0, 64.0),
                           CONFIG, ENTERPRISE)
    [good] = report.statements
    check_tsql(good)
    broken = break_it(good)
    assert broken != good
    with pytest.raises(TsqlError):
        check_tsql(broken)


# -- the rows the Python reads are the rows the T-SQL returns --------------------------------------

# section -> the columns queuectl.jobs reads from it on SQL Server
READ_COLUMNS = {
    "index_measure": set(dmv_row(1, 1.0, 1.0)),
    "index_capabilities": {"online_rebuild", "resumable_rebuild"},
    "paused_rebuilds": {"index_name", "bytes"},
}
# sections both engines define, read with PostgreSQL's columns
SHARED = ("table_indexes", "table_vitals", "table_physical", "xmin_holders")


def columns_of(file_text: str) -> set[str]:
    results = result_columns(file_text, "tsql")
    assert results
    return set().union(*map(set, results))


@pytest.mark.parametrize("section", sorted(READ_COLUMNS))
def test_mssql_sections_return_the_columns_the_job_reads(section):
    assert READ_COLUMNS[section] <= columns_of(sections("mssql", "jobs")[section])


@pytest.mark.parametrize("section", SHARED)
def test_shared_job_sections_return_postgresqls_columns_on_mssql(section):
    # a UNION's columns are its first branch's (result_columns skips set expressions)
    expected = result_columns(sections("postgresql", "jobs")[section].split("UNION ALL")[0], "postgres")[-1]
    for columns in result_columns(sections("mssql", "jobs")[section], "tsql"):
        assert columns == expected, section


def test_a_renamed_column_fails_the_column_check():
    text = sections("mssql", "jobs")["index_measure"].replace("AS ghost_record_count", "AS ghosts")
    assert not READ_COLUMNS["index_measure"] <= columns_of(text)


def test_result_summary_uses_the_engines_words():
    result = ReorganizeResult(dry_run=False, vacuumed=["orders_meta", "orders_data"], adapter=adapter_for("mssql"))
    assert result.summary() == "rebuilt 0 of 0 indexes; updated statistics of orders_meta, orders_data"
    assert ReorganizeResult(dry_run=False, vacuumed=["orders_meta"]).summary() == (
        "rebuilt 0 of 0 indexes; vacuumed orders_meta")
