"""catalog: job-run history and health snapshots

Revision ID: catalog_0002
Revises: catalog_0001
"""

from queuectl.migrations.queue_ops import run_catalog_section

revision = "catalog_0002"
down_revision = "catalog_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_catalog_section("catalog_jobs", "create_tables")


def downgrade() -> None:
    run_catalog_section("catalog_jobs", "drop_tables")
