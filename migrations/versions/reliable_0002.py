"""reliable queue: notify the queue's channel once per enqueueing transaction

Revision ID: reliable_0002
Revises: reliable_0001
"""

from queuectl.migrations.queue_ops import run_section, set_version

revision = "reliable_0002"
down_revision = "reliable_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_section("activation", "create_reliable_notify_0002")
    run_section("activation", "create_notify_trigger")
    set_version(revision)


def downgrade() -> None:
    run_section("activation", "drop_reliable_notify")
    set_version(down_revision)
