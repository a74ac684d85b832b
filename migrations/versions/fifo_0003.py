"""fifo queue: autovacuum storage parameters of the items table

Revision ID: fifo_0003
Revises: fifo_0002

Every dequeue deletes: one dead row per message, at the head of the primary key, where
every dequeue starts. The server's default trigger (50 + 0.2 x reltuples dead rows) lets a
deep backlog collect a fifth of its size there before VACUUM comes. This revision gives the
items table scale factor 0, a threshold of 1,000 dead rows and no cost delay
(sql/postgresql/storage.sql, section set_items_autovacuum, says why and what it changed); the downgrade RESETs exactly those, back to the server's
settings. ALTER TABLE ... SET takes SHARE UPDATE EXCLUSIVE: producers and consumers keep
working while it runs. SQL Server has no per-table autovacuum; its section is empty
(sql/mssql/storage.sql says why).
"""

from queuectl.migrations.queue_ops import run_section, set_version

revision = "fifo_0003"
down_revision = "fifo_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_section("storage", "set_items_autovacuum")
    set_version(revision)


def downgrade() -> None:
    run_section("storage", "reset_items_autovacuum")
    set_version(down_revision)
