"""reliable queue: the rotator copies a generation to history in id order

Revision ID: reliable_0014
Revises: reliable_0013

Two rotators (two archive jobs, or one and a manual run) may copy the same generation at
once; both insert the same history keys, and ON CONFLICT makes the second wait on the
first's uncommitted key. reliable_0012's rot_copy inserted in its join's order, which can
follow the data table's physical order (rot_move puts stragglers after newer rows), so two
copies could each wait on a key the other inserted first: a deadlock (40P01), which the
archive job retries. This revision's rot_copy inserts in id order (sql/postgresql/reliable.sql:
create_rot_copy), so no two copies wait on each other. Its signature and result are
unchanged; the downgrade puts reliable_0012's body back. On SQL Server rot_copy picks its
rows WITH (UPDLOCK, READPAST) and moves them, so two rotators never insert the same key: its
section adds nothing.
"""

from queuectl.migrations.queue_ops import replace_functions, set_version

revision = "reliable_0014"
down_revision = "reliable_0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replace_functions("reliable", "create_rot_copy_0014")
    set_version(revision)


def downgrade() -> None:
    replace_functions("reliable", "create_rot_copy_0012")
    set_version(down_revision)
