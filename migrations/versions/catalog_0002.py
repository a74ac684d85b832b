"""catalog: job-run history and health snapshots

Revision ID: catalog_0002
Revises: catalog_0001
"""

import sqlalchemy as sa
from alembic import context, op

from queuectl.names import quote_ident
from queuectl.sqlfiles import render, split_statements

revision = "catalog_0002"
down_revision = "catalog_0001"
branch_labels = None
depends_on = None


def _run(section: str) -> None:
    engine = op.get_context().dialect.name
    values = {"schema": quote_ident(context.config.attributes["schema"])}
    for statement in split_statements(render(engine, "catalog_jobs", section, values)):
        op.execute(sa.text(statement))


def upgrade() -> None:
    _run("create_tables")


def downgrade() -> None:
    _run("drop_tables")
