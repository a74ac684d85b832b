"""reliable queue: a claim short of a batch stays off a sealed generation the archive job has yet to empty, and the copy to history reads only what it copies

Revision ID: reliable_0015
Revises: reliable_0014

reliable_0012's dequeue, on finding the current slot short of a batch while an older slot was
sealed but not yet emptied, claimed again on the partitioned parents: every slot's tables
locked (26 relation locks) for the expired leases of that slot, and a wait behind its
truncate's ACCESS EXCLUSIVE lock. With many consumers and little backlog most claims are
short, and that window opens at every pass of the archive job that seals a generation: with
the job beside a full-speed cycle at 32 consumers, one claim in eight took that path (1,919 of
15,547 in a 20-s run), at 2.3 ms against 0.5 ms on the slot's own tables. This revision's
dequeue looks again only when a switch came meanwhile (sql/postgresql/reliable.sql:
create_dequeue). A lease that expired in a sealed slot is claimed again once the truncate has
moved its row forward, as on SQL Server, whose dequeue never took that path.
Its rot_copy passes over the rows already in history before it reads their payloads, and is
planned for each call's own arguments: the truncate's copy under its lock read every finished
row of the generation with its payload, and a generic plan read every finished row above the
batch's start at each batch (create_rot_copy). The signatures are unchanged; the downgrade
puts reliable_0012's dequeue and reliable_0014's rot_copy back. On SQL Server the sections
replace the same bodies (its rot_copy section is empty).
"""

from queuectl.migrations.queue_ops import replace_functions, run_section, set_version

revision = "reliable_0015"
down_revision = "reliable_0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # before the guard: CREATE OR REPLACE resets a function's SET clauses
    replace_functions("reliable", "create_dequeue_0015", "create_rot_copy_0015")
    run_section("reliable", "set_plan_guard")
    set_version(revision)


def downgrade() -> None:
    replace_functions("reliable", "create_dequeue_0012", "create_rot_copy_0014")
    run_section("reliable", "set_plan_guard")
    set_version(down_revision)
