"""reliable queue: generations emptied by TRUNCATE, so the queue keeps its size and its claim
cost while someone else's transaction pins the xmin horizon

Revision ID: reliable_0012
Revises: reliable_0011

A queue drained by row deletes leaves one dead version per message that VACUUM may not
remove while any snapshot older than it is open; every claim walks the dead entries at the
head of the ready and leased indexes, so a pinned horizon slows the queue and grows its
tables (bench/lab/no-decay.md: 0.76x at 1,000 msgs/s, a 25k/min backlog). This revision
partitions meta and data into three generation slots; the archive job rotates them, copying
an old generation's finished rows to history and emptying it with TRUNCATE, which frees space
and index entries whatever the horizon (sql/postgresql/reliable.sql: the header says how, and
why nothing is lost or claimed twice). The existing tables become slot 0, renamed with their
rows and indexes; the functions keep their signatures. The downgrade copies slots 1 and 2
back into slot 0 and puts reliable_0011's single tables and functions back.
On SQL Server the same sections make one table per slot, views under the old names for
readers, and the generation procedures (sql/mssql/reliable.sql's header says why a table per
slot rather than one partitioned table); parse- and reference-checked, not run live.
"""

from queuectl.migrations.queue_ops import replace_functions, run_claim_sections, run_section, set_version

revision = "reliable_0012"
down_revision = "reliable_0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_section("reliable", "create_rotation")
    run_claim_sections("reliable", "create_claim_calls_0012")
    # before the guard: CREATE OR REPLACE resets a function's SET clauses
    replace_functions("reliable", "create_functions_0012", "create_dequeue_0012", "create_enqueue_functions_0012",
                      "create_rotator_0012", "create_rot_empty_0012", "create_rot_copy_0012")
    run_section("reliable", "set_plan_guard")
    run_section("activation", "create_notify_trigger")
    set_version(revision)


def downgrade() -> None:
    run_section("reliable", "drop_rotator")
    run_section("reliable", "drop_rotation")
    replace_functions("reliable", "create_functions_0009", "create_dequeue_0008", "create_enqueue_functions_0010")
    run_section("reliable", "drop_rotation_functions")
    run_section("reliable", "set_plan_guard")
    run_section("activation", "create_notify_trigger")
    set_version(down_revision)
