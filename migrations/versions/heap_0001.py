"""heap queue: one table, unordered destructive dequeue

Revision ID: heap_0001
Revises:
"""

from queuectl.migrations.queue_ops import register, run_section, unregister

revision = "heap_0001"
down_revision = None
branch_labels = ("heap",)
depends_on = None


def upgrade() -> None:
    run_section("heap", "create_tables")
    run_section("heap", "create_functions")
    run_section("heap", "create_dequeue_0001")
    register(revision)


def downgrade() -> None:
    unregister()
    run_section("heap", "drop_functions")
    run_section("heap", "drop_tables")
