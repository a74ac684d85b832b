"""pending queue: items with a due time, earliest due first

Revision ID: pending_0001
Revises:
"""

from queuectl.migrations.queue_ops import register, run_section, unregister

revision = "pending_0001"
down_revision = None
branch_labels = ("pending",)
depends_on = None


def upgrade() -> None:
    run_section("pending", "create_tables")
    run_section("pending", "create_functions")
    run_section("pending", "create_dequeue_0001")
    register(revision)


def downgrade() -> None:
    unregister()
    run_section("pending", "drop_functions")
    run_section("pending", "drop_tables")
