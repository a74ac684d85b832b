"""The ring's T-SQL holds no lock through a back-off, reads the ring with locks under RCSI,
repairs in bounded statements and builds its slots with room to grow.

No SQL Server runs here: these tests read the rendered T-SQL (its form, not its run) and
parse it with check_tsql. Each names the defect it guards against and why its textual check
is enough (sql/mssql/ring.sql's header has the reasoning with its sources).
"""

from __future__ import annotations

import re

import pytest

from queuectl.sqlfiles import sections, split_go_batches
from test_mssql_offline import check_tsql, rendered

RING = '"queuectl"."orders_ring"'
_PROC = re.compile(r'CREATE OR ALTER PROCEDURE "queuectl"\."orders_(\w+)"')
_COMMENT = re.compile(r"--[^\n]*")
# a reference to the slots table: not a longer name (orders_ring_push) and not a text
# literal naming it (OBJECT_ID('"queuectl"."orders_ring"'))
_RING_REF = re.compile(r"(?<!')" + re.escape(RING) + r"(?!')")
_INSERT_EXEC = re.compile(r'INSERT\s+INTO\s+@?\w+\s*(?:\([^)]*\))?\s*EXEC(?:UTE)?\s+"queuectl"\."orders_(\w+)"', re.I)
_EXEC = re.compile(r'\bEXEC(?:UTE)?\s+"queuectl"\."orders_(\w+)"([^;]*);', re.I)


def flat(text: str) -> str:
    """The T-SQL without comments, on one line, single-spaced."""
    return " ".join(_COMMENT.sub("", text).split())


def procedures(history: bool) -> dict[str, str]:
    """Every ring procedure body (comment-free, flattened) by name: today's (history=False) or
    those of the history file, keyed by section name there (one name has several bodies)."""
    found: dict[str, str] = {}
    for name in sections("mssql", "ring", history=history):
        if not name.startswith("create_"):
            continue
        for batch in split_go_batches(rendered("ring", name)):
            body = flat(batch)
            match = _PROC.search(body)
            if match:
                found[f"{match.group(1)}@{name}" if history else match.group(1)] = body
    return found


def waiting(bodies: dict[str, str]) -> set[str]:
    """The procedures that can WAITFOR: their own WAITFOR, or an EXEC of one that can."""
    waits = {name for name, body in bodies.items() if "WAITFOR" in body}
    while True:
        more = {name for name, body in bodies.items()
                if any(callee in waits for callee, _ in _EXEC.findall(body))} - waits
        if not more:
            return waits
        waits |= more


def transaction_spans(body: str) -> list[tuple[int, int]]:
    """(start, end) of each BEGIN TRANSACTION ... its COMMIT TRANSACTION in straight-line text.
    Used on the procedures that back off, each of which opens at most one transaction at a
    time and commits it in the same block (a savepoint rollback does not end it)."""
    spans, start = [], None
    for match in re.finditer(r"BEGIN TRANSACTION;|COMMIT TRANSACTION;", body):
        if match.group(0).startswith("BEGIN"):
            assert start is None, "a nested BEGIN TRANSACTION: this check does not model it"
            start = match.start()
        elif start is not None:
            spans.append((start, match.end()))
            start = None
    assert start is None, "a BEGIN TRANSACTION without its COMMIT"
    return spans


# -- 1. a push on a full ring does not keep the lock of the slot it waits for ------------------
#
# INSERT ... EXEC runs the procedure inside the INSERT's transaction: the procedure's own
# COMMIT only lowers @@TRANCOUNT, so every lock it took (the update lock on the full slot
# among them) lasts through its WAITFOR, and the pop that would free that slot skips it with
# READPAST. So: no INSERT ... EXEC of a procedure that can wait; within a procedure, no
# WAITFOR (nor an EXEC of a procedure that can wait, unless with @timeout = 0) between its
# BEGIN TRANSACTION and COMMIT; and the push, whose caller may hold a transaction open, does
# not wait while @@TRANCOUNT > 0.


def test_no_ring_procedure_is_read_through_insert_exec():
    bodies = procedures(history=False)
    for name, body in bodies.items():
        assert not _INSERT_EXEC.findall(body), name  # OUTPUT parameters instead, everywhere
    assert {"ring_push", "enqueue", "enqueue_many", "dequeue", "ring_repair", "ring_release"} <= set(bodies)
    assert {"ring_push", "enqueue", "enqueue_many", "dequeue"} <= waiting(bodies)  # the walk sees the calls


def test_no_wait_inside_a_procedures_own_transaction():
    bodies = procedures(history=False)
    waits = waiting(bodies)
    for name, body in bodies.items():
        for start, end in transaction_spans(body) if "WAITFOR" in body else []:
            assert "WAITFOR" not in body[start:end], name
        for match in _EXEC.finditer(body):
            callee, arguments = match.groups()
            if callee not in waits:
                continue
            # after a BEGIN TRANSACTION in the text: possibly inside it (branches that commit
            # early make a count of COMMITs unreliable, so any call after one counts)
            if "BEGIN TRANSACTION;" in body[: match.start()]:  # one try, no wait
                assert "@timeout = 0," in arguments or arguments.rstrip().endswith("@timeout = 0"), (name, callee)
    # ring_release's rescue is such a call: inside its transaction, after the savepoint
    release = bodies["ring_release"]
    call = release.index('EXEC "queuectl"."orders_ring_push" @items = @one, @timeout = 0, @ids = @ids OUTPUT;')
    assert release.index("BEGIN TRANSACTION;") < release.index("SAVE TRANSACTION ring_rescue;") < call


def test_the_push_waits_only_outside_any_transaction():
    """A caller's transaction keeps what the push wrote (and, without the probe, the full slot
    it looked at) locked until it commits: the push does not back off there at all."""
    bodies = procedures(history=False)
    push = bodies.get("ring_push") or bodies["enqueue_many"]  # the procedure that backs off when full
    guard = push.index("IF @@TRANCOUNT > 0 OR SYSUTCDATETIME() >= @deadline BREAK;")
    assert guard < push.index("WAITFOR DELAY @pause;") and push.count("WAITFOR") == 1
    # the run is undone to its savepoint when a slot changed since the probe, and its OUTPUT
    # rows with it (a table variable keeps its rows through a rollback)
    assert ("IF @run < @want BEGIN ROLLBACK TRANSACTION ring_run; DELETE FROM @written WHERE ord >= @done; "
            "DELETE FROM @large WHERE ord >= @done; SET @run = 0; END COMMIT TRANSACTION;") in push


def test_the_pop_keeps_no_lock_on_the_slots_it_does_not_take():
    """The pop waits only while it has taken nothing, with no transaction of its own; inside a
    caller's (processing()) it then holds no lock on the ring only if none of its reads keeps
    one: no UPDLOCK (held to the end of the transaction even on a slot that does not qualify;
    an UPDATE releases its own update lock there)."""
    pop = procedures(history=False)["dequeue"]
    assert "UPDLOCK" not in pop
    assert pop.index("IF @taken > 0 OR SYSUTCDATETIME() >= @deadline BREAK;") < pop.index("WAITFOR DELAY @pause;")
    # its one transaction (ring_0007: the take and the delete of its side-table rows) commits
    # before the wait
    assert pop.count("BEGIN TRANSACTION") == pop.count("COMMIT TRANSACTION") <= 1
    if "BEGIN TRANSACTION" in pop:
        assert pop.index("BEGIN TRANSACTION") < pop.index("COMMIT TRANSACTION") < pop.index("WAITFOR DELAY @pause;")


def test_history_bodies_called_through_insert_exec_keep_no_slot_lock_while_waiting():
    """ring_0001's batch push and ring_0002's release read enqueue_0001 through INSERT ... EXEC
    (SQL Server refuses nothing else there at that revision): the procedure they call keeps no
    lock on a slot it does not write (no UPDLOCK), and the release, whose own transaction holds
    the old slot, calls it with @timeout = 0."""
    bodies = procedures(history=True)
    push = bodies["enqueue@create_enqueue_0001"]
    assert "WAITFOR" in push and "UPDLOCK" not in push
    for name, body in bodies.items():
        for callee in _INSERT_EXEC.findall(body):
            assert callee == "enqueue", (name, callee)
    release = bodies["ring_release@create_ring_release_0002"]
    assert 'EXEC "queuectl"."orders_enqueue" @payload = @payload, @headers = @headers, @timeout = 0;' in release
    assert "UPDLOCK" not in bodies["dequeue@create_dequeue_0001"]


# -- 2. RCSI: every read of the ring is a locking read -----------------------------------------
#
# Under READ_COMMITTED_SNAPSHOT a plain read, READPAST or not, reads the last committed
# version of a locked slot instead of skipping it. Every FROM/JOIN of the slots table carries
# UPDLOCK or READCOMMITTEDLOCK, or its section says "version read:" (a version is fine there,
# and the comment says why). The target of "UPDATE <ring> SET ... WHERE slot = ..." is read
# with update locks under RCSI too, and INSERT/CREATE/ALTER/DROP are not reads.

_DDL_OR_TARGET = re.compile(r"(?:UPDATE|INSERT INTO|CREATE TABLE|DROP TABLE IF EXISTS|ALTER INDEX ALL ON|ALTER TABLE)\s*$")
_HINTS = re.compile(r"\s*(?:AS \w+ )?WITH \(([^)]*)\)")


def unhinted_ring_reads(text: str) -> list[str]:
    """The reads of the slots table in one section's T-SQL that are neither locking reads nor
    marked as version reads."""
    if "version read:" in text:
        return []
    body, bad = flat(text), []
    for match in _RING_REF.finditer(body):
        before = body[: match.start()]
        if _DDL_OR_TARGET.search(before):
            continue
        assert re.search(r"(?:FROM|JOIN)\s*$", before), body[match.start() - 60: match.end() + 20]
        hints = _HINTS.match(body, match.end())
        if not hints or not {"UPDLOCK", "READCOMMITTEDLOCK"} & {h.strip() for h in hints.group(1).split(",")}:
            bad.append(body[max(0, match.start() - 40): match.end() + 60])
    return bad


@pytest.mark.parametrize("history", [False, True], ids=["today", "history"])
def test_every_read_of_the_ring_is_a_locking_read(history):
    checked = 0
    for name in sections("mssql", "ring", history=history):
        text = rendered("ring", name)
        checked += len(_RING_REF.findall(flat(text)))
        assert not unhinted_ring_reads(text), (name, unhinted_ring_reads(text))
    assert checked > (5 if history else 15)


def test_a_plain_read_of_the_ring_fails_the_rcsi_check():
    text = rendered("ring", "create_dequeue")
    assert not unhinted_ring_reads(text)
    broken = text.replace("WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK) ON s.slot", "WITH (READPAST) ON s.slot", 1)
    assert broken != text and unhinted_ring_reads(broken)


# -- 3. ring_repair: bounded statements, no table lock -------------------------------------------
#
# Lock escalation starts when one statement holds 5,000 locks on a table; a table lock is one
# READPAST cannot skip. Every statement of ring_repair that locks slots to change them is
# bounded: UPDATE TOP (n) with n well under 5,000, or one slot by its key; the search for
# candidates takes no update locks, walks the key (slot > @after) and is itself TOP-bounded.


def ring_statements(body: str) -> list[str]:
    return [s.strip() for s in body.split(";") if _RING_REF.search(s)]


def test_ring_repair_locks_slots_in_bounded_statements():
    repair = procedures(history=False)["ring_repair"]
    statements = ring_statements(repair)
    assert len(statements) >= 4
    for statement in statements:
        top = re.search(r"(?:UPDATE|SELECT) TOP \((\d+)\)", statement)
        keyed = re.search(r"WHERE (?:\w+\.)?slot = @\w+(?: % \d+)?(?: |$)", statement)
        assert (top and int(top.group(1)) <= 1000) or keyed, statement
        if "UPDLOCK" in statement or statement.startswith("UPDATE") or " UPDATE " in f" {statement}":
            assert keyed or (top and statement.lstrip().startswith("UPDATE TOP")), statement
    search = next(s for s in statements if "INSERT INTO @candidates" in s)
    assert "UPDLOCK" not in search and "WHERE r.slot > @after" in search and "ORDER BY r.slot" in search
    assert "ORDER BY o.msg_id" not in repair  # no sort of the whole ring per orphan


# -- 4. page splits: the slots are built with room to grow ---------------------------------------
#
# A slot row is 39 bytes empty (with its slot-array entry) and 45 + payload + headers full; the
# seed packs pages with empty rows unless the clustered index is rebuilt at a fill factor.


def test_ring_slots_are_built_at_a_fill_factor_with_room_for_small_messages():
    text = rendered("ring", "create_tables")
    body = flat(text)
    fill = int(re.search(r"slot int NOT NULL PRIMARY KEY CLUSTERED WITH \(FILLFACTOR = (\d+)\)", body).group(1))
    seed, rebuild = body.index(f"INSERT INTO {RING} (slot, msg_id, state)"), body.index(f"ALTER INDEX ALL ON {RING} REBUILD;")
    assert seed < rebuild  # DML ignores the fill factor: the rebuild applies it
    rows = int(8096 * fill / 100 // 39)  # empty slots per page after the rebuild
    room = 8096 // rows - 45  # bytes of payload and headers each can take with all of them FULL
    assert room >= 128, (fill, rows, room)
    assert f"FILLFACTOR {fill}" in text and f"{room} bytes of payload and headers" in text  # the comment's arithmetic


# -- every ring section still parses ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("history", [False, True], ids=["today", "history"])
def test_every_ring_section_parses(history):
    for name in sections("mssql", "ring", history=history):
        text = "\n".join(line for line in rendered("ring", name).splitlines() if not line.lstrip().startswith("--"))
        if text.strip():
            check_tsql(text)
