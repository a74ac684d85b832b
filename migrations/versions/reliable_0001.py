"""reliable queue: meta/data/history tables and the SQL API

Revision ID: reliable_0001
Revises:
"""

from queuectl.migrations.queue_ops import register, run_section, unregister

revision = "reliable_0001"
down_revision = None
branch_labels = ("reliable",)
depends_on = None


def upgrade() -> None:
    run_section("reliable", "create_tables")
    run_section("reliable", "create_functions_0001")
    run_section("reliable", "create_dequeue_0001")
    run_section("reliable", "create_enqueue_functions_0001")
    register(revision)


def downgrade() -> None:
    unregister()
    run_section("reliable", "drop_functions")
    run_section("reliable", "drop_tables")
