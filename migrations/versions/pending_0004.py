"""pending queue: the dequeue keeps index plans whatever size it was planned at

Revision ID: pending_0004
Revises: pending_0003

plpgsql caches a generic plan per statement and session. A consumer that started while the
items table was empty or held a page keeps a plan that reads the table whole, and keeps it
while the table grows, until autovacuum next analyses it (measured for this kind on an
empty table: 1,850 buffers per dequeue(10) at 20,000 rows against 54 in a new session). This revision sets enable_seqscan = off and jit = off on the
dequeue function (ALTER FUNCTION ... SET: the settings hold inside it only), as
reliable_0008 does for the reliable queue, where the reasons are given in full
(sql/postgresql/pending.sql, section set_plan_guard). On an EMPTY analysed table every
index path costs the same, and the dequeue's DELETE could still walk the whole due index:
the dequeue is replaced by pending_0002's with the picked due times also named in the
DELETE (section create_dequeue). The downgrade RESETs exactly those two settings and
puts pending_0002's dequeue back. Running consumers need no restart: a session recompiles a
function whose catalog row changed at its next call. SQL Server's sections are empty.
"""

from queuectl.migrations.queue_ops import replace_functions, run_section, set_version

revision = "pending_0004"
down_revision = "pending_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replace_functions("pending", "create_dequeue_0004")  # before the guard: it resets SET clauses
    run_section("pending", "set_plan_guard")
    set_version(revision)


def downgrade() -> None:
    run_section("pending", "reset_plan_guard")
    replace_functions("pending", "create_dequeue_0002")
    set_version(down_revision)
