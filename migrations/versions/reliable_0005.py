"""reliable queue: dequeue finds the picked rows through the primary key, whatever the statistics

Revision ID: reliable_0005
Revises: reliable_0004

reliable_0001's dequeue joined its picks to the meta table. The ready pick's LIMIT holds a
subquery the planner cannot estimate, so it assumed a tenth of the table would be picked,
and once the table had statistics it ran the join as a hash join over a sequential scan of
the whole meta table: every dequeue read every row not archived yet (376 buffers and 4.0
ms per dequeue of 10 at 20,000 rows; 5.2-5.5 ms per call at 40,000, against 0.14 ms this
way). This version updates `WHERE id = ANY (ARRAY(<picks>))`: the same rows, claimed in
the same one statement. CREATE OR REPLACE keeps the function's EXECUTE grants, and the
migration gives a function `queuectl grant` secured its SECURITY DEFINER back: nothing to
re-run. SQL Server's procedure updates through its pick and needs no change (its section
is empty).
"""

from queuectl.migrations.queue_ops import replace_functions, set_version

revision = "reliable_0005"
down_revision = "reliable_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replace_functions("reliable", "create_dequeue_0005")
    set_version(revision)


def downgrade() -> None:
    replace_functions("reliable", "create_dequeue_0001")
    set_version(down_revision)
