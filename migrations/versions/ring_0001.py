"""ring queue: preallocated slots, push/pop sequences, updates only; the repair path

Revision ID: ring_0001
Revises:
"""

from queuectl.migrations.queue_ops import register, run_section, unregister

revision = "ring_0001"
down_revision = None
branch_labels = ("ring",)
depends_on = None


def upgrade() -> None:
    run_section("ring", "create_tables")
    run_section("ring", "create_enqueue_0001")
    run_section("ring", "create_enqueue_many_0001")
    run_section("ring", "create_dequeue_0001")
    run_section("ring", "create_ring_repair_0001")
    run_section("ring", "create_ring_release_0001")
    register(revision)


def downgrade() -> None:
    unregister()
    run_section("ring", "drop_ring_release_0001")
    run_section("ring", "drop_functions")
    run_section("ring", "drop_tables")
