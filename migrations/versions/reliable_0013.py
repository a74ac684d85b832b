"""reliable queue: extend_lease, nack and release on the current generation slot's own tables

Revision ID: reliable_0013
Revises: reliable_0012

reliable_0012 runs dequeue and ack on the current slot's tables, but extend_lease (the
Worker's heartbeat), nack and release run one statement on the partitioned parents: it
locks every slot's tables (extend_lease 7 relation locks, nack and release 15; 16 and 24 in
a session's first calls, past the 16 a backend takes on its fast path) and waits behind the
truncate of any slot; on the current slot's tables each takes 3, as the ack. This revision gives
each slot its own extend_lease, nack and release (one UPDATE by primary key; nack and
release leave a row of the current epoch where it is, READY again), which the API functions
call first, falling back on the parents for the ids not found there
(sql/postgresql/reliable.sql: create_functions, create_lease_calls). The functions keep
their signatures. The downgrade puts reliable_0012's bodies back and drops the per-slot calls.
On SQL Server the procedures of reliable_0012 already run each call on the current slot's
table first (sql/mssql/reliable.sql): its sections add nothing and replace the same bodies.
"""

from queuectl.migrations.queue_ops import replace_functions, run_lease_sections, run_section, set_version

revision = "reliable_0013"
down_revision = "reliable_0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_lease_sections("reliable", "create_lease_calls")
    # before the guard: CREATE OR REPLACE resets a function's SET clauses
    replace_functions("reliable", "create_functions_0013")
    run_section("reliable", "set_plan_guard")
    set_version(revision)


def downgrade() -> None:
    replace_functions("reliable", "create_functions_0012")
    run_section("reliable", "set_plan_guard")
    run_section("reliable", "drop_lease_calls")
    set_version(down_revision)
