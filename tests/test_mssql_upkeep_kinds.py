"""The T-SQL of the upkeep on every kind (sql/mssql/jobs.sql), checked in its rendered form:
the table step renders for each kind's upkeep table, the kinds' own numbers read what the
PostgreSQL sections read (same columns), the ring's from its sequences' last_used_value and
the slots' page splits. Parse-checked (check_tsql), not run live."""

from __future__ import annotations

import re

import pytest

from queuectl.engine.mssql import MssqlIndexUpkeep
from queuectl.jobs.base import JobTarget
from queuectl.jobs.inspect import KIND_FIELDS
from queuectl.kindspec import KINDS, UPKEEP_TABLES
from queuectl.names import QueueNames
from queuectl.sqlfiles import section

from test_mssql_offline import check_tsql, rendered


class _Info:
    def __init__(self, kind: str) -> None:
        self.kind = kind


def select_list(engine: str, name: str) -> str:
    """The top-level SELECT list of a kind_* section."""
    return re.search(r"^SELECT .*?^FROM ", section(engine, "jobs", name), re.M | re.S).group(0)


# The numbers both engines give (inspect's kind_fields, health's probes read them by name).
KIND_COLUMNS = {
    "kind_ring": ("slots", "free_slots", "full_slots", "push_position", "pop_position", "sequence_gap",
                  "hot_update_pct"),
    "kind_pending": ("due", "not_due", "overdue", "oldest_due_s"),
    "kind_watermark": ("low", "head", "lag", "epoch", "updated_at", "corrected_at"),
}


@pytest.mark.parametrize("kind", KINDS)
def test_the_table_step_renders_for_every_upkeep_table_of_the_kind(kind):
    target = JobTarget(QueueNames("orders"), _Info(kind), "mssql")
    steps = MssqlIndexUpkeep().table_step(target)
    # a reliable queue's meta and data are views over its generation slots on SQL Server
    # (reliable_0012): UPDATE STATISTICS and the index DMVs work on the slots' own tables
    expected = [f"{t}{s}" for t in UPKEEP_TABLES[kind] for s in range(3)] if kind == "reliable" else list(UPKEEP_TABLES[kind])
    assert [t for t, _ in steps] == expected
    for table, statement in steps:
        text = str(statement)
        assert f'UPDATE STATISTICS "queuectl"."orders_{table}"' in text
        check_tsql(text)


@pytest.mark.parametrize("name", sorted(s for s, _ in KIND_FIELDS.values()))
def test_the_kinds_own_numbers_parse_and_match_postgresqls_columns(name):
    check_tsql(rendered("jobs", name))
    assert set(KIND_COLUMNS) == {s for s, _ in KIND_FIELDS.values()}
    for engine in ("postgresql", "mssql"):
        listed = select_list(engine, name)
        for column in KIND_COLUMNS[name]:
            assert re.search(rf"\b{column}\b", listed), (engine, name, column)


def test_the_ring_reads_its_sequences_and_page_splits_without_scanning_the_database():
    text = "\n".join(line for line in rendered("jobs", "kind_ring").splitlines() if not line.startswith("--"))
    assert text.count("last_used_value") == 2 and "sys.sequences" in text
    assert "OBJECT_ID('\"queuectl\".\"orders_push_seq\"')" in text
    assert "OBJECT_ID('\"queuectl\".\"orders_pop_seq\"')" in text
    # the DMF given the ring's object id and its clustered index (1), never NULL (every object)
    assert re.search(r"dm_db_index_operational_stats\(DB_ID\(\), OBJECT_ID\('\"queuectl\".\"orders_ring\"'\), 1, NULL\)",
                     text)
    assert "leaf_allocation_count" in text
