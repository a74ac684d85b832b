"""fifo queue: one identity-ordered table; lax (skip locked) or strict (consumers wait) dequeue

Revision ID: fifo_0001
Revises:
"""

from alembic import context

from queuectl.migrations.queue_ops import register, run_section, unregister

revision = "fifo_0001"
down_revision = None
branch_labels = ("fifo",)
depends_on = None


def _dequeue_section() -> str:
    strict = context.config.attributes["settings"].as_dict().get("strict", False)
    return "create_dequeue_strict_0001" if strict else "create_dequeue_lax_0001"


def upgrade() -> None:
    run_section("fifo", "create_tables")
    run_section("fifo", "create_functions")
    run_section("fifo", _dequeue_section())
    register(revision)


def downgrade() -> None:
    unregister()
    run_section("fifo", "drop_functions")
    run_section("fifo", "drop_tables")
