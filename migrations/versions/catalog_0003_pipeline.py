"""catalog: what each Parquet lake holds of each queue's history (queuectl pipeline export)

Revision ID: catalog_0003_pipeline
Revises: catalog_0001

A mirror of the lake's own commit log (<lake>/_commits/<queue>/): the lake holds exactly
the history rows with id <= exported_upto_id and archived_at < archived_before. Kept in the
database so that purging and health checks can see how far the lake has got.
"""

import sqlalchemy as sa
from alembic import context, op

revision = "catalog_0003_pipeline"
# Chained to catalog_0001 while written in parallel with the jobs tables' catalog_0002;
# re-chain after catalog_0002 when both are merged.
down_revision = "catalog_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pipeline_exports",
        sa.Column("queue", sa.Text, primary_key=True),
        sa.Column("lake", sa.Text, primary_key=True),
        sa.Column("run_seq", sa.Integer, nullable=False),
        sa.Column("exported_upto_id", sa.BigInteger, nullable=False),
        sa.Column("archived_before", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rows_exported", sa.BigInteger, nullable=False),
        sa.Column("rows_purged", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=context.config.attributes["schema"],
    )


def downgrade() -> None:
    op.drop_table("pipeline_exports", schema=context.config.attributes["schema"])
