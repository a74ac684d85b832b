"""catalog: the queue registry

Revision ID: catalog_0001
Revises:
"""

import sqlalchemy as sa
from alembic import context, op

from queuectl.catalog import NAME_TYPE, SETTINGS_TYPE

revision = "catalog_0001"
down_revision = None
branch_labels = ("catalog",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "queues",
        sa.Column("name", NAME_TYPE, primary_key=True),
        sa.Column("kind", NAME_TYPE, nullable=False),
        sa.Column("schema_version", NAME_TYPE, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        # PostgreSQL stores this default as '{}'::jsonb, as before; SQL Server as N'{}'.
        sa.Column("settings", SETTINGS_TYPE, nullable=False, server_default=sa.text("'{}'")),
        schema=context.config.attributes["schema"],
    )


def downgrade() -> None:
    op.drop_table("queues", schema=context.config.attributes["schema"])
