"""reliable queue: the claims walk the ready index in its order whatever their plan was made on

Revision ID: reliable_0016
Revises: reliable_0015

The claims (the one statement on the parents and on each slot's tables) keep one generic plan
per session, made again after each truncate of a slot they name, that is at the start of every
generation, when the slot's row counts are unknown. On a slot autovacuum had not analysed yet
(every slot of a new queue, for a while) the planner counted a few READY rows, read them all
through a bitmap scan and sorted them for the batch, and kept that plan while a backlog filled
the slot: every dequeue(10) then read the whole backlog. This revision sets enable_sort = off
on the four claim functions (sql/postgresql/reliable.sql, section set_sort_guard, has the
figures), so they walk the ready index in its own order and stop after the batch. The
downgrade RESETs exactly that setting. Running consumers need no restart: a session
recompiles a function whose catalog row changed at its next call. SQL Server's sections are
empty: its claims name the ready index and read it in order.
"""

from queuectl.migrations.queue_ops import run_section, set_version

revision = "reliable_0016"
down_revision = "reliable_0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_section("reliable", "set_sort_guard")
    set_version(revision)


def downgrade() -> None:
    run_section("reliable", "reset_sort_guard")
    set_version(down_revision)
