"""reliable queue: the archive job's copy to history costs about a quarter less a row

Revision ID: reliable_0018
Revises: reliable_0017

The archive job copies each generation's finished rows to history (rot_copy) in batches
before it truncates the generation's slot: beside a full-speed cycle on saturated cores,
every microsecond it spends a row is taken from the consumers. reliable_0017's copy picked a
batch into a materialized CTE, looked each row up in history into another, joined the
payloads, sorted, and inserted with ON CONFLICT DO NOTHING, which probed history's key a
second time and made every insert speculative (a WAL record more a row). This revision's
rot_copy finds the batch's last id, then inserts the batch in one statement, with the one
look-up and without ON CONFLICT: two rotators copying the same rows at once now cost the
second a unique_violation on that batch, which the archive job sends again (it then finds
the rows in history). It also returns a NULL last_id for a batch that read the slot's
finished rows to their end, so the job's precopy stops there instead of asking once more.
Same signature: the function is replaced in place and keeps its grants; the downgrade puts
reliable_0017's body back. SQL Server's sections are empty: its rot_copy moves the rows it
copies out of the slot, and two rotators never take the same row.
"""

from queuectl.migrations.queue_ops import replace_functions, set_version

revision = "reliable_0018"
down_revision = "reliable_0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replace_functions("reliable", "create_rot_copy_0018")
    set_version(revision)


def downgrade() -> None:
    replace_functions("reliable", "create_rot_copy_0017")
    set_version(down_revision)
