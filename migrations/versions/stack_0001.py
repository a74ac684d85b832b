"""stack (LIFO) queue: one table, newest-first destructive dequeue

Revision ID: stack_0001
Revises:
"""

from queuectl.migrations.queue_ops import register, run_section, unregister

revision = "stack_0001"
down_revision = None
branch_labels = ("stack",)
depends_on = None


def upgrade() -> None:
    run_section("stack", "create_tables")
    run_section("stack", "create_functions")
    run_section("stack", "create_dequeue_0001")
    register(revision)


def downgrade() -> None:
    unregister()
    run_section("stack", "drop_functions")
    run_section("stack", "drop_tables")
