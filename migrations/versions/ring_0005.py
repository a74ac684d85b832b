"""ring queue: the batch push and pop in one statement each in the common case

Revision ID: ring_0005
Revises: ring_0004

ring_0003's push and pop ran five to six plpgsql statements per call, and its pop locked
the claimed slots in a pass of its own before updating them. Here the push claims, writes
and keeps in one statement when the session keeps no claim, and the pop tops up its
claims, takes the FULL slots by UPDATE alone and keeps the rest in one statement; both fall
back to ring_0003's loops when they must wait. Same rules, signatures and result columns
(sql/postgresql/ring.sql, create_enqueue_many, explains and has the numbers): CREATE OR
REPLACE keeps grants, and the migration restores SECURITY DEFINER where `queuectl grant`
set it. The downgrade restores ring_0003's functions; the session's kept claims have the
same form in both, so open sessions carry on. SQL Server's procedures already take their
slots in one UPDATE; its sections are empty.
"""

from queuectl.migrations.queue_ops import replace_functions, set_version

revision = "ring_0005"
down_revision = "ring_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replace_functions("ring", "create_enqueue_many_0005", "create_dequeue_0005")
    set_version(revision)


def downgrade() -> None:
    replace_functions("ring", "create_enqueue_many_0003", "create_dequeue_0003")
    set_version(down_revision)
