"""catalog: what each Parquet lake holds of each queue's history (queuectl pipeline export)

Revision ID: catalog_0003_pipeline
Revises: catalog_0002

A mirror of the lake's own commit log (<lake>/_commits/<queue>/): the lake holds exactly
the history rows with id <= exported_upto_id and archived_at < archived_before. Kept in the
database so that purging and health checks can see how far the lake has got.
"""

import sqlalchemy as sa
from alembic import context, op

from queuectl.catalog import NAME_TYPE

revision = "catalog_0003_pipeline"
down_revision = "catalog_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pipeline_exports",
        sa.Column("queue", NAME_TYPE, primary_key=True),
        # a lake path or URI; bounded so SQL Server can index it (NVARCHAR(450) = 900 bytes)
        sa.Column("lake", sa.Text().with_variant(sa.NVARCHAR(450), "mssql"), primary_key=True),
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
