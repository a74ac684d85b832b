"""reliable queue: the meta-table functions keep index plans whatever size they were planned at

Revision ID: reliable_0008
Revises: reliable_0007

plpgsql caches a generic plan per statement and session. A consumer that started while its
queue held a few rows keeps plans that read the meta and data tables whole, and keeps them
while a burst grows the tables, until autovacuum next analyses them: measured 1,101-1,470
buffers per dequeue(10) at 20,000 rows, growing with the table, against 139-160 in a new
session. This revision sets enable_seqscan = off and jit = off on dequeue, ack, nack,
extend_lease and release (ALTER FUNCTION ... SET: the settings hold inside those functions
only), so every plan they cache goes through an index whatever the table's size when it was
made, and no statement is JIT-compiled (a disabled sequential scan's raised cost estimate
would otherwise trigger JIT at every call; sql/postgresql/reliable.sql, section
set_plan_guard, has the figures). On an EMPTY analysed table every index path costs the
same, and the dequeue's join to the data table still walked that table's whole primary key:
the dequeue is replaced by reliable_0005's reading the payloads by an array of the claimed
ids instead (section create_dequeue). The downgrade RESETs exactly those two settings
and puts reliable_0005's dequeue back. Running consumers need no restart: a session
recompiles a function whose catalog row changed at its next call, dropping the plans it had
cached. SQL Server's sections are empty (sql/mssql/reliable.sql says why).
"""

from queuectl.migrations.queue_ops import replace_functions, run_section, set_version

revision = "reliable_0008"
down_revision = "reliable_0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replace_functions("reliable", "create_dequeue_0008")  # before the guard: it resets SET clauses
    run_section("reliable", "set_plan_guard")
    set_version(revision)


def downgrade() -> None:
    run_section("reliable", "reset_plan_guard")
    replace_functions("reliable", "create_dequeue_0005")
    set_version(down_revision)
