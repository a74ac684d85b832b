"""fifo queue: the dequeue keeps index plans whatever size it was planned at

Revision ID: fifo_0004
Revises: fifo_0003

plpgsql caches a generic plan per statement and session. A consumer that started while the
items table was empty or held a page keeps a plan that reads the table whole, and keeps it
while the table grows, until autovacuum next analyses it (measured for this kind on an
empty table: 1,770 buffers per dequeue(10) at 20,000 rows against 54 in a new session). This revision sets enable_seqscan = off and jit = off on the
dequeue function (ALTER FUNCTION ... SET: the settings hold inside it only), as
reliable_0008 does for the reliable queue, where the reasons are given in full
(sql/postgresql/fifo.sql, section set_plan_guard). The downgrade RESETs exactly those two
settings. Running consumers need no restart: a session recompiles a function whose catalog
row changed at its next call. SQL Server's sections are empty.
"""

from queuectl.migrations.queue_ops import run_section, set_version

revision = "fifo_0004"
down_revision = "fifo_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_section("fifo", "set_plan_guard")
    set_version(revision)


def downgrade() -> None:
    run_section("fifo", "reset_plan_guard")
    set_version(down_revision)
