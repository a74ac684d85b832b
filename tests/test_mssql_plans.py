"""SQL Server plans and row versioning, checked without a server.

Every claim (a TOP pick under UPDLOCK/READPAST, or an update that finds its rows by id) must
have one plan: an index whose key order is its ORDER BY, named in a table hint so the
optimizer cannot choose a scan of the table plus a sort before TOP (which reads every
qualifying row and, under UPDLOCK, locks each of them until commit). These tests read the
rendered T-SQL: the hint list of each claimed table, the index it names in its kind's
create_tables, that index's key columns against the statement's ORDER BY, its filter
against the statement's WHERE (a filtered index hint the query does not imply leaves no
plan: error 8622), and a predicate on the leading key wherever FORCESEEK asks for a seek.
The rules come from the table-hints page,
https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table:
  * FORCESEEK with index parameters cannot be used on the target of an INSERT, UPDATE or
    DELETE (our CTE picks are such targets): the claims use INDEX (...), FORCESEEK;
  * FORCESEEK without a seekable predicate leaves no plan (error 8622);
  * READPAST skips locks, so it needs a locking read: UPDLOCK/XLOCK take locks whatever
    READ_COMMITTED_SNAPSHOT says, READCOMMITTEDLOCK forces the locking read committed.
What this cannot show is the optimizer's choice on a real server: not run live.
Then `queuectl install`'s row-versioning line, built from the catalog's row_versioning
row by a pure function, for every setting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from queuectl.engine import adapter_for
from queuectl.engine.mssql import MssqlAdapter, ROW_VERSIONING_BOTH, row_versioning_report
from queuectl.install import review_script
from queuectl.sqlfiles import section, sections

from test_mssql_offline import MSSQL_URL, check_tsql, rendered

Q = '"queuectl"'


def code(sql: str) -> str:
    """The statement text without comments, on one line (no T-SQL string here holds '--')."""
    return " ".join(re.sub(r"--[^\n]*", "", sql).split())


# A table reference with its hint list: FROM <table> [AS <alias>] WITH (<hints>)
_HINTED = re.compile(r'(?:FROM|JOIN) ("queuectl"\."orders_\w+")(?: AS (\w+))? WITH \(((?:[^()]|\([^()]*\))*)\)')


def hinted_tables(sql: str) -> list[tuple[str, str, list[str], str]]:
    """(table, alias, hints, the statement text after the hints) for every hinted table."""
    flat = code(sql)
    found = []
    for m in _HINTED.finditer(flat):
        hints = [h.strip() for h in re.split(r",(?![^()]*\))", m.group(3))]
        found.append((m.group(1), m.group(2) or "", hints, flat[m.end():]))
    return found


def index_hint(hints: list[str]) -> str | None:
    named = [h for h in hints if h.upper().startswith("INDEX")]
    assert len(named) <= 1, hints
    return re.fullmatch(r"INDEX\((.+)\)", named[0]).group(1) if named else None


@dataclass(frozen=True)
class Index:
    keys: tuple[str, ...]
    clustered: bool
    filter: str | None


def indexes_of(create_tables: str, table: str) -> dict[str, Index]:
    """The indexes a create_tables section makes on `table`, by name; the clustered one also
    under "1" (INDEX(1) names it), the nonclustered primary key under "pk"."""
    flat = code(create_tables)
    found: dict[str, Index] = {}
    body = re.search(re.escape(f"CREATE TABLE {table} (") + r"(.*?)\);? GO", flat + " GO").group(1)
    inline = re.search(r"(\w+) [^,]*?PRIMARY KEY (NONCLUSTERED|CLUSTERED)", body)
    listed = re.search(r"PRIMARY KEY (NONCLUSTERED|CLUSTERED) \(([^)]*)\)", body)
    if inline:
        pk = Index((inline.group(1),), inline.group(2) == "CLUSTERED", None)
    else:
        pk = Index(tuple(c.strip() for c in listed.group(2).split(",")), listed.group(1) == "CLUSTERED", None)
    found["pk"] = pk
    if pk.clustered:
        found["1"] = pk
    for m in re.finditer(r"CREATE (UNIQUE )?(CLUSTERED |NONCLUSTERED )?INDEX (\S+) ON " + re.escape(table)
                         + r" \(([^)]*)\)(?: WHERE ([^;]*?))?(?:;| GO|$)", flat):
        ix = Index(tuple(c.strip() for c in m.group(4).split(",")), m.group(2) == "CLUSTERED ", m.group(5))
        found[m.group(3)] = ix
        if ix.clustered:
            found["1"] = ix
    assert sum(1 for k, v in found.items() if v.clustered and k != "1") <= 1, found
    return found


def order_by(rest: str, alias: str) -> tuple[str, ...] | None:
    """The ORDER BY of the pick that follows the hints (up to the CTE's close or the end of the
    statement), as bare columns with DESC kept; None when the pick has none."""
    pick = re.split(r"\)\s*(?:UPDATE|DELETE)\b|;", rest, maxsplit=1)[0]
    m = re.search(r"ORDER BY (.*)$", pick)
    if not m:
        return None
    return tuple(c.strip().removeprefix(f"{alias}.") for c in m.group(1).split(","))


def where_of(rest: str) -> str:
    return re.split(r"\)\s*(?:UPDATE|DELETE)\b|;|ORDER BY", rest, maxsplit=1)[0]


@dataclass(frozen=True)
class Claim:
    file: str
    section: str
    table: str              # the claimed table, unqualified
    kind: str               # whose create_tables makes the table
    index: str              # what INDEX(...) must name: an index name, or "1" (clustered)
    forceseek: bool
    locks: tuple[str, ...]  # lock hints the statement must carry
    nth: int = 0            # which hinted reference of that table in the section
    tables: str = "create_tables"  # the kind's section that creates the table


# Every claim of the files this suite covers, with the plan its comment states:
#   * an ordered seek (FORCESEEK) where the statement has a predicate on the leading key;
#   * reliable's ready-row pick: INDEX only, since (priority, due_at, id) has no predicate on
#     priority (FORCESEEK would leave no plan, error 8622);
#   * fifo, stack, heap: the clustered primary key, their only index, with no predicate;
#   * the lease-checked updates (ack, nack, extend_lease, release, ack_dequeue's ack) and the
#     archive's id joins: one seek of the clustered primary key per id.
_PICK = ("UPDLOCK", "READPAST", "ROWLOCK")
CLAIMS = [
    Claim("pending", "create_dequeue", "items", "pending", '"orders_items_due"', True, _PICK),
    # the single tables (reliable_0001..0011, and the downgrade of reliable_0012)
    Claim("reliable", "create_dequeue_0001", "meta", "reliable", '"orders_meta_leased"', True, _PICK, 0),
    Claim("reliable", "create_dequeue_0001", "meta", "reliable", '"orders_meta_ready"', False, _PICK, 1),
    Claim("reliable", "create_dequeue_0001", "data", "reliable", "1", True, ()),
    *[Claim("reliable", "create_functions_0001", "meta", "reliable", "1", True, ("ROWLOCK",), n) for n in range(4)],
    # the generation slots (reliable_0012: create_rotation makes them): per slot, the claim's
    # two picks and its payload join; rot_move's delete, ack, nack, extend_lease and release by
    # id; the seal's count and pick, the precopy's pick and deletes
    *[c for s in range(3) for c in (
        Claim("reliable", "create_dequeue", f"meta{s}", "reliable", f'"orders_meta{s}_leased"', True, _PICK, 0,
              "create_rotation"),
        Claim("reliable", "create_dequeue", f"meta{s}", "reliable", f'"orders_meta{s}_ready"', False, _PICK, 1,
              "create_rotation"),
        Claim("reliable", "create_dequeue", f"data{s}", "reliable", "1", True, (), 0, "create_rotation"),
        *[Claim("reliable", "create_functions", f"meta{s}", "reliable", "1", True, ("ROWLOCK",), n, "create_rotation")
          for n in range(5)],
        Claim("reliable", "create_functions", f"data{s}", "reliable", "1", True, ("ROWLOCK",), 0, "create_rotation"),
        Claim("reliable", "create_rotator", f"meta{s}", "reliable", f'"orders_meta{s}_ready"', False, ("READPAST",), 0,
              "create_rotation"),
        Claim("reliable", "create_rotator", f"meta{s}", "reliable", f'"orders_meta{s}_ready"', False, _PICK, 1,
              "create_rotation"),
        Claim("reliable", "create_rotator", f"meta{s}", "reliable", "1", True, _PICK, 2, "create_rotation"),
        Claim("reliable", "create_rotator", f"meta{s}", "reliable", "1", True, ("ROWLOCK",), 3, "create_rotation"),
        Claim("reliable", "create_rotator", f"data{s}", "reliable", "1", True, ("ROWLOCK",), 0, "create_rotation"),
    )],
    Claim("fifo", "create_dequeue_lax", "items", "fifo", "1", False, _PICK),
    Claim("fifo", "create_dequeue_strict", "items", "fifo", "1", False, ("UPDLOCK", "ROWLOCK")),
    Claim("stack", "create_dequeue", "items", "stack", "1", False, _PICK),
    Claim("heap", "create_dequeue", "items", "heap", "1", False, _PICK),
    Claim("jobs", "archive_batch", "meta", "reliable", '"orders_meta_finished"', True, _PICK, 0),
    Claim("jobs", "archive_batch", "data", "reliable", "1", True, ("ROWLOCK",)),
    Claim("jobs", "archive_batch", "meta", "reliable", "1", True, ("ROWLOCK",), 1),
    Claim("jobs", "purge_history_batch", "history", "reliable", '"orders_history_at"', True, _PICK),
    Claim("jobs", "reset_stale_batch", "meta", "reliable", '"orders_meta_leased"', True, _PICK),
    Claim("pipeline", "purge_batch", "history", "reliable", "1", True, _PICK),
]


def _claim_id(c: Claim) -> str:
    return f"{c.file}:{c.section}:{c.table}#{c.nth}"


@pytest.mark.parametrize("claim", CLAIMS, ids=_claim_id)
def test_each_claim_names_an_index_of_its_kind_whose_keys_are_its_order(claim):
    """The hint list names the index the comment's plan needs; that index exists in the kind's
    create_tables; its key order is the pick's ORDER BY (read forwards or, for the stack,
    backwards), so no plan through it sorts before TOP; its filter is implied by the pick's
    WHERE; and FORCESEEK, where set, has a predicate on the leading key to seek on and no
    index parameters (refused on a DML target)."""
    table = f"{Q}.\"orders_{claim.table}\""
    refs = [r for r in hinted_tables(rendered(claim.file, claim.section)) if r[0] == table]
    _, alias, hints, rest = refs[claim.nth]
    upper = [h.upper() for h in hints]
    for lock in claim.locks:
        assert lock in upper, (hints, lock)
    assert index_hint(hints) == claim.index, hints
    assert ("FORCESEEK" in upper) == claim.forceseek, hints
    assert not any(h.startswith("FORCESEEK(") or h.startswith("FORCESEEK (") for h in upper), hints
    index = indexes_of(rendered(claim.kind, claim.tables), table)[claim.index]
    order = order_by(rest, alias)
    if order is not None:  # the heap's pick has none: any rows will do
        forward = tuple(c.removesuffix(" DESC") for c in order)
        descending = {c.endswith(" DESC") for c in order}
        assert len(descending) == 1, order  # one direction: a scan reads it forwards or backwards
        assert forward == index.keys[: len(forward)] and len(forward) == len(index.keys), (order, index)
    where = where_of(rest)
    if index.filter:
        assert f"{alias}.{index.filter}" in where, (index.filter, where)
    if claim.forceseek:
        lead = index.keys[0]
        prefix = f"{alias}.{lead}" if alias else lead
        seekable = re.search(re.escape(prefix) + r"\s*(?:<=|>=|<|>|=|IN\b)", where) or re.search(
            r"ON \w+\.id = " + re.escape(prefix) + r"\b|ON " + re.escape(prefix) + r" = \w+\.id\b", where)
        assert seekable, (lead, where)


def test_the_pending_table_is_clustered_on_due_time_then_id():
    """Seed 004's layout: the dequeue reads the table itself in (due_at, id) order, without
    lookups; the primary key on id stays, nonclustered (enqueue returns ids)."""
    made = indexes_of(rendered("pending", "create_tables"), f'{Q}."orders_items"')
    assert made["1"] == made['"orders_items_due"']
    assert made["1"].keys == ("due_at", "id") and made["1"].clustered and made["1"].filter is None
    assert made["pk"] == Index(("id",), False, None)
    assert 'CREATE UNIQUE CLUSTERED INDEX "orders_items_due"' in code(rendered("pending", "create_tables"))
    # exactly one more index than the clustered one: each taken row leaves two, no third
    assert len({k for k in made if k not in ("1",)}) == 2


# -- row versioning ---------------------------------------------------------------------------

# The T-SQL files this suite covers (today's and every revision's sections).
FILES = ["pending", "reliable", "fifo", "stack", "heap", "pipeline", "health", "jobs"]
LOCKING = ("UPDLOCK", "XLOCK", "READCOMMITTEDLOCK")
# A READPAST read without a locking hint reads row versions under READ_COMMITTED_SNAPSHOT, so
# it skips nothing there; one that is fine with that must say so in its section with this.
EXEMPT = "READPAST reads versions here on purpose"


def _all_sections() -> list[tuple[str, str]]:
    return [(f, n) for f in FILES for history in (False, True) for n in sections("mssql", f, history=history)]


@pytest.mark.parametrize(("file", "name"), _all_sections(), ids=lambda v: v)
def test_every_readpast_read_is_a_locking_read_or_says_why_not(file, name):
    text = section("mssql", file, name)
    for m in re.finditer(r"WITH \(((?:[^()]|\([^()]*\))*\bREADPAST\b(?:[^()]|\([^()]*\))*)\)", code(text)):
        hints = {h.strip().upper() for h in re.split(r",(?![^()]*\))", m.group(1))}
        assert hints & set(LOCKING) or EXEMPT in text, (file, name, m.group(0))


@pytest.mark.parametrize(("file", "name"), sorted({(c.file, c.section) for c in CLAIMS}), ids=lambda v: v)
def test_claim_sections_still_parse_as_tsql(file, name):
    assert check_tsql(rendered(file, name)) >= 1


@pytest.mark.parametrize("snapshot", ["OFF", "ON", "IN_TRANSITION_TO_ON", "IN_TRANSITION_TO_OFF"])
@pytest.mark.parametrize("rcsi", [True, False])
def test_install_reports_the_databases_row_versioning_in_one_line(rcsi, snapshot):
    """Which setting the database has, that queuectl's claims behave the same under either,
    what the user's own reads see, and (only where SNAPSHOT isolation is allowed) that
    queuectl's calls must not run under it (READPAST: error 650)."""
    line = row_versioning_report("app", rcsi, snapshot)
    assert "\n" not in line
    said = re.match(r"database 'app' has READ_COMMITTED_SNAPSHOT (ON|OFF)\b", line)
    assert said and said.group(1) == ("ON" if rcsi else "OFF"), line
    assert "queuectl's claims and locking reads" in line and "your own READ COMMITTED reads" in line
    if rcsi:
        assert "see the last committed rows" in line and "still shows as waiting" in line
    else:
        assert "wait for rows consumers hold" in line
    allowed = snapshot in ("ON", "IN_TRANSITION_TO_ON")
    assert ("ALLOW_SNAPSHOT_ISOLATION is ON" in line) == allowed
    assert ("error 650" in line) == allowed


def test_the_row_versioning_query_parses_and_returns_what_the_report_reads():
    sql = section("mssql", "catalog", "row_versioning")
    assert check_tsql(sql) == 1
    flat = code(sql)
    for column in ("AS database_name", "d.is_read_committed_snapshot_on", "d.snapshot_isolation_state_desc"):
        assert column in flat
    assert "WHERE d.database_id = DB_ID()" in flat
    assert code(section("postgresql", "catalog", "row_versioning")) == ""  # nothing on PostgreSQL


def test_postgresql_reports_nothing_and_reads_nothing():
    """The PostgreSQL adapter answers without a query (a None connection would fail one)."""
    pg = adapter_for("postgresql")
    assert pg.install_report(None) is None and pg.review_script_notes() == []
    assert isinstance(adapter_for(MSSQL_URL), MssqlAdapter)


def test_the_offline_sql_server_review_script_says_what_install_would_report():
    """`install --sql` for SQL Server is made without a connection: its head says what both
    settings mean for the queue and gives the query that shows the database's; on PostgreSQL
    without a connection nothing is added."""
    script, _ = review_script(MSSQL_URL, "orders", "pending")
    head = script.split("\n", 4)
    assert head[1] == "-- Row versioning: " + ROW_VERSIONING_BOTH
    assert head[2].startswith("-- See the database's settings with: SELECT DB_NAME() AS database_name")
    assert head[2].endswith("WHERE d.database_id = DB_ID();")
    assert check_tsql(head[2].removeprefix("-- See the database's settings with: ")) == 1
    assert check_tsql(script) > 10
    pg_script, _ = review_script(None, "orders", "pending")
    assert "Row versioning" not in pg_script
