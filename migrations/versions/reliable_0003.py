"""reliable queue: enqueue refuses payloads over the queue's max_payload_bytes

Revision ID: reliable_0003
Revises: reliable_0002
"""

from queuectl.migrations.queue_ops import record_settings, run_section, set_version

revision = "reliable_0003"
down_revision = "reliable_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A queue installed before this revision gets the default limit (QueueSettings).
    run_section("reliable", "create_enqueue_functions_0003")
    record_settings()
    set_version(revision)


def downgrade() -> None:
    run_section("reliable", "create_enqueue_functions_0001")
    record_settings(without=("max_payload_bytes",))
    set_version(down_revision)
