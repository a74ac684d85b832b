"""catalog: the lock seed, a random text every single-runner lock key ends in

Revision ID: catalog_0004_lock_seed
Revises: catalog_0003_pipeline

Any role that can connect can take any advisory lock (PostgreSQL) or application lock
(SQL Server) whose key it knows. With this seed in the keys (queuectl.locks), a role that
cannot read the table cannot compute them: only the catalog's owner can.
"""

from queuectl.migrations.queue_ops import run_catalog_section

revision = "catalog_0004_lock_seed"
down_revision = "catalog_0003_pipeline"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_catalog_section("locks", "create_seed")


def downgrade() -> None:
    run_catalog_section("locks", "drop_seed")
