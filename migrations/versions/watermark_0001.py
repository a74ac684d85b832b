"""watermark queue: a FIFO that range-scans from a low watermark, and its correction

Revision ID: watermark_0001
Revises:
"""

from queuectl.migrations.queue_ops import register, run_section, unregister

revision = "watermark_0001"
down_revision = None
branch_labels = ("watermark",)
depends_on = None


def upgrade() -> None:
    run_section("watermark", "create_tables")
    run_section("watermark", "create_functions")
    run_section("watermark", "create_correct_watermark_0001")
    run_section("watermark", "create_dequeue_0001")
    register(revision)


def downgrade() -> None:
    unregister()
    run_section("watermark", "drop_functions")
    run_section("watermark", "drop_tables")
