"""ring queue: no cost delay on the vacuum of the slots' TOAST table (large payloads)

Revision ID: ring_0004
Revises: ring_0003

The slots' updates are HOT and need nothing from autovacuum (measured: no setting changed
throughput, size or the HOT ratio with 300-byte payloads). Payloads over ~2 kB live in the
TOAST table, where every push inserts and every pop deletes: at 4,000 bytes it grew faster
than a vacuum throttled at the default 2 ms cost delay can clean (sql/postgresql/ring.sql,
section set_autovacuum, has the numbers). This revision sets
toast.autovacuum_vacuum_cost_delay = 0; the downgrade RESETs exactly that. ALTER TABLE ...
SET takes SHARE UPDATE EXCLUSIVE: pushes and pops keep working while it runs. SQL Server
has no per-table autovacuum; its section is empty.
"""

from queuectl.migrations.queue_ops import run_section, set_version

revision = "ring_0004"
down_revision = "ring_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_section("ring", "set_autovacuum")
    set_version(revision)


def downgrade() -> None:
    run_section("ring", "reset_autovacuum")
    set_version(down_revision)
