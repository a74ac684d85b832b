"""pending queue: the dequeue deletes its picks by row address, whatever index its plan would choose

Revision ID: pending_0005
Revises: pending_0004

pending_0004's DELETE named the picked ids and due times, so that either index was searched
for the picked values only. A plan made for an empty table (a session that planned after the
compact job's TRUNCATE, or on a new queue) ANDed a bitmap scan of the due index by the picked
due times with one of the primary key, and the rows one transaction enqueues share one due
time: that scan read every entry of the burst (measured: 132 buffers per dequeue(10) after
20,000 rows enqueued in one call, 364 after 80,000, against 54 in a new session). This
revision's dequeue deletes the picked rows by their row addresses (a TID scan), which reads
their pages only whatever the planner counts (sql/postgresql/pending.sql, create_dequeue).
The plan guard runs again (CREATE OR REPLACE resets a function's SET clauses). The downgrade
puts pending_0004's dequeue back. SQL Server's dequeue is unchanged: its DELETE goes through
its TOP pick with table hints.
"""

from queuectl.migrations.queue_ops import replace_functions, run_section, set_version

revision = "pending_0005"
down_revision = "pending_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replace_functions("pending", "create_dequeue_0005")  # before the guard: it resets SET clauses
    run_section("pending", "set_plan_guard")
    set_version(revision)


def downgrade() -> None:
    replace_functions("pending", "create_dequeue_0004")
    run_section("pending", "set_plan_guard")
    set_version(down_revision)
