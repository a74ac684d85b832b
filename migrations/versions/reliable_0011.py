"""reliable queue: no session can stall producers or consumers through the activation locks

Revision ID: reliable_0011
Revises: reliable_0010

reliable_0006's notify trigger and wait_begin wait for advisory locks that any role able to
connect can take (their keys are the queue's channel hashed, and pg_locks shows them): a
session holding one exclusively stalled every enqueue, or every consumer about to sleep,
for as long as it held it. This revision replaces both (same signatures) with versions that
only try those locks: a producer that cannot take its lock notifies (a spare notification),
a consumer that cannot register looks again soon instead of sleeping
(sql/postgresql/activation.sql, create_reliable_notify). The downgrade puts
reliable_0006's functions back. SQL Server has no notifications: its sections are empty.
"""

from queuectl.migrations.queue_ops import replace_functions, set_version

revision = "reliable_0011"
down_revision = "reliable_0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replace_functions("activation", "create_reliable_notify_0011")
    set_version(revision)


def downgrade() -> None:
    replace_functions("activation", "create_reliable_notify_0006")
    set_version(down_revision)
