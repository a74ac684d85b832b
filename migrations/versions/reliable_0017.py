"""reliable queue: the archive job's truncate looks up in history only the rows finished since its precopy

Revision ID: reliable_0017
Revises: reliable_0016

The archive job copies a sealed generation's finished rows to history in batches (the
precopy, without a lock), then truncates the generation's slot under ACCESS EXCLUSIVE, and
copies first, under that lock, what finished meanwhile. That copy looked up every finished row
of the generation in history's primary key, a read of history's heap per row (its new pages
are not all-visible yet): about 2.5 us a row, on 2 saturated cores part of the job's whole
cost beside a full-speed cycle, and all of it time the slot stays locked. This revision's
rot_copy takes a transaction horizon the caller took before its precopy, and rot_empty the
epoch precopied and that horizon: the copy under the lock then looks up only the rows that a
transaction at or above the horizon finished (sql/postgresql/reliable.sql: create_rot_copy
says why the others are in history already). Both functions gain arguments with defaults,
so a call without them does what it did. They are created beside the old signatures, given
their grants (grant.sql: carry_function_grants), and the old ones dropped; the downgrade does
the same the other way. The archive job passes the horizon to queues at this revision.
SQL Server's sections are empty: its rot_copy moves the rows it copies out of the slot, so
what its truncate finds there finished since the precopy already.
"""

from queuectl.migrations.queue_ops import replace_signatures, set_version

revision = "reliable_0017"
down_revision = "reliable_0016"
branch_labels = None
depends_on = None

CHANGES = (("rot_copy", "smallint, bigint, integer", "smallint, bigint, integer, xid8"),
           ("rot_empty", "integer", "integer, bigint, xid8"))


def upgrade() -> None:
    replace_signatures("reliable", ("create_rot_copy_0017", "create_rot_empty_0017"), CHANGES,
                       drop="drop_rot_calls_unaware")
    set_version(revision)


def downgrade() -> None:
    replace_signatures("reliable", ("create_rot_copy_0015", "create_rot_empty_0012"),
                       tuple((call, new, old) for call, old, new in CHANGES), drop="drop_rot_calls_aware")
    set_version(down_revision)
