"""reliable queue: ack_dequeue, a consumer's ack and its next claim in one call

Revision ID: reliable_0004
Revises: reliable_0003
"""

from queuectl.migrations.queue_ops import run_section, set_version

revision = "reliable_0004"
down_revision = "reliable_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_section("reliable", "create_ack_dequeue")
    set_version(revision)


def downgrade() -> None:
    run_section("reliable", "drop_ack_dequeue")
    set_version(down_revision)
