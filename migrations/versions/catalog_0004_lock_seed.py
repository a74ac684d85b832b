"""catalog: the lock seed, a random text every single-runner lock key ends in

Revision ID: catalog_0004_lock_seed
Revises: catalog_0003_pipeline

Any role that can connect can take any advisory lock (PostgreSQL) or application lock
(SQL Server) whose key it knows. With this seed in the keys (queuectl.locks), a role that
cannot read the table cannot compute them: only the catalog's owner can.
"""

import sqlalchemy as sa
from alembic import context, op

from queuectl.names import quote_ident
from queuectl.sqlfiles import render, split_statements

revision = "catalog_0004_lock_seed"
down_revision = "catalog_0003_pipeline"
branch_labels = None
depends_on = None


def _run(section: str) -> None:
    engine = op.get_context().dialect.name
    values = {"schema": quote_ident(context.config.attributes["schema"])}
    for statement in split_statements(render(engine, "locks", section, values)):
        op.execute(sa.text(statement))


def upgrade() -> None:
    _run("create_seed")


def downgrade() -> None:
    _run("drop_seed")
