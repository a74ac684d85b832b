"""watermark queue: dequeue and correct_watermark refuse REPEATABLE READ and SERIALIZABLE (QC400)

Revision ID: watermark_0005
Revises: watermark_0004

The compact job (jobs/compact.py) TRUNCATEs the items table and inserts its live rows back
while the xmin horizon is pinned. TRUNCATE is not MVCC-safe: a REPEATABLE READ or SERIALIZABLE
transaction whose snapshot is older than the compaction sees the table empty, so a dequeue
there takes nothing and may move its session's low mark past every item (correct_watermark
brings the mark back, late), and correct_watermark there would find the table empty and raise
the stored mark past the items. Both raise QC400 at those levels before they read anything, in
the reliable queue's form (the queue, the call, the level, why); the Python client raises
UsageError with that line. enqueue and enqueue_many only insert (ids from the sequence, no
read of the table) and run at any level, as the reliable queue's enqueue does. The functions
keep their signatures and are replaced in place (grants kept, `queuectl grant`'s SECURITY
DEFINER restored); CREATE OR REPLACE resets a function's SET clauses, so watermark_0004's plan
guard is set again after each replace. The downgrade restores watermark_0001's
correct_watermark and watermark_0002's dequeue. No row is touched. SQL Server has no
compaction: create_correct_watermark is empty there and create_dequeue renders today's
procedure.
"""

from queuectl.migrations.queue_ops import replace_functions, run_section, set_version

revision = "watermark_0005"
down_revision = "watermark_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replace_functions("watermark", "create_correct_watermark", "create_dequeue")
    run_section("watermark", "set_plan_guard")
    set_version(revision)


def downgrade() -> None:
    replace_functions("watermark", "create_correct_watermark_0001", "create_dequeue_0002")
    run_section("watermark", "set_plan_guard")
    set_version(down_revision)
