"""reliable queue: autovacuum storage parameters per table role (meta, data, history)

Revision ID: reliable_0007
Revises: reliable_0006

PostgreSQL's default trigger (50 + 0.2 x reltuples dead rows) lets a queue's meta table
collect a fifth of its backlog as dead index entries at the head of the ready index, which
every dequeue walks. This revision gives each table the parameters its role needs
(sql/postgresql/reliable.sql, section set_autovacuum, says which and why); the downgrade
RESETs exactly those, back to the server's settings. ALTER TABLE ... SET takes SHARE
UPDATE EXCLUSIVE: producers and consumers keep working while it runs. SQL Server has no
per-table autovacuum; its section is empty (sql/mssql/reliable.sql says why).
"""

from queuectl.migrations.queue_ops import run_section, set_version

revision = "reliable_0007"
down_revision = "reliable_0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_section("reliable", "set_autovacuum")
    set_version(revision)


def downgrade() -> None:
    run_section("reliable", "reset_autovacuum")
    set_version(down_revision)
