"""The T-SQL watermark kind, checked without a server: the rendered procedures hold the forms
that its safety argument (sql/mssql/watermark.sql's header) rests on.

No SQL Server runs here, so these tests read the rendered T-SQL: they show that a statement
is where the argument needs it (a draw inside its INSERT, a bounded lock wait before a read,
the walk before the row lock), not that the server behaves as the argument says. Each
section still parses (check_tsql).
"""

from __future__ import annotations

import re
from importlib import resources

import pytest

from queuectl.sqlfiles import sections, split_go_batches
from test_mssql_offline import check_tsql, rendered

ITEMS = '"queuectl"."orders_items"'
WATERMARK = '"queuectl"."orders_watermark"'


def procedure(name: str) -> str:
    """The rendered CREATE OR ALTER PROCEDURE batch of orders_<name>, comments removed and
    whitespace folded to single spaces."""
    section_name = "create_dequeue" if name == "dequeue" else "create_functions"
    [batch] = [b for b in split_go_batches(rendered("watermark", section_name))
               if re.match(r'\s*(?:--[^\n]*\n\s*)*CREATE OR ALTER PROCEDURE "queuectl"\."orders_%s"\s' % name, b)]
    return " ".join(re.sub(r"--[^\n]*", "", batch).split())


def statements(body: str) -> list[str]:
    """The statements of a folded procedure text, split at semicolons (no string literal in
    these procedures holds one)."""
    return [s.strip() for s in body.split(";") if s.strip()]


def block(text: str, start: str, end: str, after: int = 0) -> tuple[int, int]:
    """(start, end) offsets of the first `start` ... `end` span at or after `after`."""
    begin = text.index(start, after)
    return begin, text.index(end, begin) + len(end)


def header() -> str:
    text = resources.files("queuectl.sql").joinpath("mssql", "watermark.sql").read_text()
    return " ".join(text[: text.index("-- name:")].replace("--", " ").split())


@pytest.mark.parametrize("name", sorted(sections("mssql", "watermark")))
def test_every_watermark_section_parses(name):
    check_tsql(rendered("watermark", name))


def test_enqueue_many_draws_its_ids_only_inside_the_insert_of_the_items():
    """The move's argument needs a drawn id to be part of the INSERT that makes its row. Ids
    drawn into a table variable and inserted by a later statement live, drawn and rowless,
    for as long as the caller's transaction runs: no grace covers that. So every NEXT VALUE
    FOR of enqueue_many sits in an INSERT INTO the items table ... SELECT."""
    body = procedure("enqueue_many")
    drawing = [s for s in statements(body) if "NEXT VALUE FOR" in s]
    assert drawing, "enqueue_many draws no id"
    for statement in drawing:
        statement = statement.removeprefix("AS BEGIN ").strip()
        assert statement.startswith(f"INSERT INTO {ITEMS} (id, payload, headers)"), statement
        assert " SELECT NEXT VALUE FOR " in statement and "OVER (ORDER BY" in statement, statement
        # NEXT VALUE FOR is refused with TOP or OFFSET, or in a subquery or CTE
        assert not re.search(r"\bTOP\b|\bOFFSET\b|\bWITH\s+\w+\s+AS\s*\(", statement), statement
    # the ids come back through OUTPUT, ascending: the OVER clause drew them in input order
    assert f"INSERT INTO {ITEMS} (id, payload, headers) OUTPUT inserted.id INTO @ids (id)" in body
    assert re.search(r"SELECT i\.id FROM @ids AS i ORDER BY i\.id; END$", body)


def test_the_moves_reads_wait_a_bounded_time_and_a_timeout_keeps_the_old_low():
    """The move's reads of the items table wait behind consumers that hold deleted rows in
    long transactions: each lock wait is bounded by a LOCK_TIMEOUT set inside the procedure
    (it ends with it), after the DELETE (which keeps the caller's setting), inside a TRY
    whose CATCH swallows only error 1222 (and 601) and changes nothing: the session's low,
    candidate and epoch are written only at the end of the TRY, after every read. XACT_ABORT
    is off first, so a lock timeout cannot doom a caller's transaction."""
    body = procedure("dequeue")
    delete = body.index("DELETE FROM picked")
    timeout = re.search(r"SET LOCK_TIMEOUT (\d+);", body)
    assert timeout and 0 < int(timeout.group(1)) <= 1000, "the move's lock waits are not bounded"
    assert delete < body.index("SET XACT_ABORT OFF;") < timeout.start()
    try_start, try_end = block(body, "BEGIN TRY", "END TRY")
    assert timeout.start() < try_start
    reads = [m.start() for m in re.finditer(rf"FROM ({re.escape(ITEMS)}|{re.escape(WATERMARK)}) AS \w+ WITH \((?!UPDLOCK, READPAST)", body)]
    move_reads = [r for r in reads if r > delete]
    assert move_reads and all(try_start < r < try_end for r in move_reads), "a read of the move is outside the bounded TRY"
    first_write = body.index("EXEC sys.sp_set_session_context @key = @k_low", try_start)
    assert max(move_reads) < first_write < try_end
    catch_start, catch_end = block(body, "BEGIN CATCH", "END CATCH")
    catch = body[catch_start:catch_end]
    assert "IF ERROR_NUMBER() NOT IN (1222, 601) OR XACT_STATE() = -1 THROW;" in catch
    assert "@low" not in catch and "sp_set_session_context" not in catch and "@cand" not in catch
    # the TRY holds the move's only writes of the session's low
    assert [m.start() for m in re.finditer(r"@key = @k_low,", body)][-1] < try_end


def test_the_moves_present_read_counts_uncommitted_inserts_and_deletes():
    """The move's smallest present id is read twice, NOLOCK first (uncommitted inserts), then
    READCOMMITTED (rows whose DELETE has not committed: a row version under RCSI, else a lock
    wait), never with READPAST, which would step over both."""
    body = procedure("dequeue")
    dirty = body.index(f"SELECT @dirty = MIN(i.id) FROM {ITEMS} AS i WITH (NOLOCK) WHERE i.id >= @new;")
    committed = body.index(f"SELECT @committed = MIN(i.id) FROM {ITEMS} AS i WITH (READCOMMITTED) WHERE i.id >= @new;")
    assert dirty < committed
    assert "SET @new = @cand + 1; IF @dirty < @new SET @new = @dirty; IF @committed < @new SET @new = @committed;" in body
    assert not re.search(r"MIN\(i\.id\) FROM \S+ AS i WITH \([^)]*READPAST", body)


def test_a_move_uses_a_candidate_only_after_the_grace():
    """Counting calls is not counting time: a fast consumer's next move may come milliseconds
    after its candidate, before an INSERT that drew ids up to it has inserted its rows. A
    candidate is used only once older than the stored grace_ms, and its time is read after
    the candidate itself (every id up to it was drawn by then)."""
    body = procedure("dequeue")
    assert "IF @cand IS NOT NULL AND @cand_at <= DATEADD(millisecond, -@grace_ms, SYSUTCDATETIME())" in body
    drawn = body.index("SELECT @new_cand = COALESCE(CAST(s.last_used_value AS bigint), 0)")
    assert drawn < body.index("SET @new_cand_at = SYSUTCDATETIME();", drawn)
    assert "@grace_ms = w.grace_ms FROM " + WATERMARK in body
    table = " ".join(rendered("watermark", "create_tables").split())
    assert "grace_ms int NOT NULL DEFAULT 5000 CHECK (grace_ms >= 0)" in table
    # correct_watermark raises only up to a candidate of a run older than the grace
    correct = procedure("correct_watermark")
    assert "AND @corrected_at <= DATEADD(millisecond, -@grace_ms, SYSUTCDATETIME())" in correct


def test_a_move_never_passes_rows_its_own_open_transaction_deleted():
    """SESSION_CONTEXT is not transactional: a move inside a caller's transaction that rolls
    back leaves the session's low moved while the rows that transaction deleted come back,
    and the move's own reads see them gone. Each dequeue in a transaction keeps the smallest
    id it deleted, keyed by CURRENT_TRANSACTION_ID(), and a move in the same transaction
    caps the new low there before writing it anywhere."""
    body = procedure("dequeue")
    delete = body.index("DELETE FROM picked")
    kept = body.index("IF @@TRANCOUNT > 0 BEGIN SELECT @taken_min = MIN(t.id) FROM @taken AS t;")
    assert delete < kept
    assert "SET @txn = CURRENT_TRANSACTION_ID();" in body[kept:]
    assert "EXEC sys.sp_set_session_context @key = @k_held, @value = @taken_min;" in body[kept:]
    used = body.index("IF @@TRANCOUNT > 0 AND CAST(SESSION_CONTEXT(@k_txn) AS bigint) = CURRENT_TRANSACTION_ID() "
                      "SET @held = CAST(SESSION_CONTEXT(@k_held) AS bigint);")
    cap = body.index("IF @held < @new SET @new = @held;")
    assert kept < used < cap < body.index(f"UPDATE w SET low = @new") < body.index("@key = @k_low, @value = @low", cap)


def test_the_stored_hint_is_written_only_outside_a_callers_transaction():
    """A write of the watermark row inside a caller's transaction would hold its lock until
    that transaction ends, and every other session's move reads that row."""
    body = procedure("dequeue")
    assert re.search(r"IF @new > @s_low AND @s_updated < DATEADD\(second, -1, @now\) AND @@TRANCOUNT = 0 "
                     rf"UPDATE w SET low = @new, updated_at = SYSUTCDATETIME\(\) FROM {re.escape(WATERMARK)} "
                     r"AS w WITH \(ROWLOCK, READPAST\)", body)


def test_correct_watermark_walks_the_index_before_it_locks_the_watermark_row():
    """The correction's walk over every ghost must not hold the watermark row that every
    session's move reads: the walk runs first, with bounded lock waits and outside any
    transaction of its own; the row is locked (UPDLOCK) only for the compare-and-update. A
    walk that timed out writes nothing and returns one row that says so."""
    body = procedure("correct_watermark")
    walks = [m.start() for m in re.finditer(rf"MIN\(i\.id\)[^;]*? FROM {re.escape(ITEMS)}", body)]
    lock = body.index(f"FROM {WATERMARK} AS w WITH (UPDLOCK, ROWLOCK)")
    assert walks and max(walks) < lock, "the walk runs while the watermark row is locked"
    timeout = re.search(r"SET LOCK_TIMEOUT (\d+);", body)
    assert timeout and int(timeout.group(1)) > 0, "the walk's lock waits are not bounded"
    assert body.index("SET XACT_ABORT OFF;") < timeout.start() < min(walks)
    assert max(walks) < body.index("BEGIN TRANSACTION") < lock
    assert body.index("SET XACT_ABORT ON;") < body.index("BEGIN TRANSACTION")
    catch_start, catch_end = block(body, "BEGIN CATCH", "END CATCH")
    catch = body[catch_start:catch_end]
    assert max(walks) < catch_start < lock
    assert "IF ERROR_NUMBER() NOT IN (1222, 601) OR XACT_STATE() = -1 THROW;" in catch
    assert "RETURN;" in catch and "UPDATE" not in catch and "UPDLOCK" not in catch
    # the deferred row has the columns of the normal one
    deferred = re.search(r"SELECT @old AS old_low, @old AS new_low, CAST\(NULL AS bigint\) AS true_low, "
                         r"CAST\(0 AS bit\) AS changed, N'deferred: [^']*' AS reason;", catch)
    assert deferred
    assert body.rstrip().endswith("CAST(CASE WHEN @new <> @old THEN 1 ELSE 0 END AS bit) AS changed, @reason AS reason; END")


def test_a_session_that_passed_an_item_comes_back_for_it():
    """When the grace assumption fails an item can end up below every session's low while the
    stored low is not above it, so lowering the stored low alone would never bring a session
    back. The correction records the smallest id present (head); a move whose low is above
    that head, while the head row still exists, goes back to it."""
    correct = procedure("correct_watermark")
    assert "head = @head," in correct
    body = procedure("dequeue")
    probe = body.index("IF @s_head < @new AND (EXISTS (SELECT 1 FROM " + ITEMS + " AS i WITH (NOLOCK) WHERE i.id = @s_head) "
                       "OR EXISTS (SELECT 1 FROM " + ITEMS + " AS i WITH (READCOMMITTED) WHERE i.id = @s_head)) "
                       "SET @new = @s_head;")
    assert probe < body.index("SELECT @dirty = MIN(i.id)")
    table = " ".join(rendered("watermark", "create_tables").split())
    assert "head bigint NULL" in table


def test_the_header_states_what_the_argument_assumes():
    """The header's argument names each assumption the code relies on and what happens when
    one fails: ids drawn in the INSERT, the grace and its setting, the bounded waits, the
    rollback of a caller's transaction, and the late-not-lost path."""
    text = header()
    for phrase in ("ONE statement", "GRACE", "grace_ms", "assumption", "within grace_ms of drawing its id",
                   "SET LOCK_TIMEOUT", "error 1222", "ROLLBACK", "SESSION_CONTEXT is not transactional",
                   "CURRENT_TRANSACTION_ID()", "late, not lost", "READ_COMMITTED_SNAPSHOT", "NOLOCK"):
        assert phrase in text, phrase


def test_procedure_names_parameters_and_result_columns_are_the_clients():
    """The client calls the procedures by name with these parameters and reads these columns
    (queuectl.client.kinds, sql/mssql/watermark.sql's call sections)."""
    assert procedure("dequeue").startswith('CREATE OR ALTER PROCEDURE "queuectl"."orders_dequeue" @batch int = 1 WITH EXECUTE AS OWNER AS')
    assert procedure("enqueue_many").startswith('CREATE OR ALTER PROCEDURE "queuectl"."orders_enqueue_many" @items nvarchar(max) AS')
    assert procedure("correct_watermark").startswith('CREATE OR ALTER PROCEDURE "queuectl"."orders_correct_watermark" WITH EXECUTE AS OWNER AS')
    assert rendered("watermark", "dequeue").strip().endswith("@batch = :batch")
    assert rendered("watermark", "enqueue_many").strip().endswith("@items = :items")
    assert procedure("dequeue").endswith("SELECT t.id, t.payload, t.headers, t.enqueued_at, @now AS dequeued_at "
                                         "FROM @taken AS t ORDER BY t.id; END")
