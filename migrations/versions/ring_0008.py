"""ring queue: its calls refuse REPEATABLE READ and SERIALIZABLE transactions (SQLSTATE QC400)

Revision ID: ring_0008
Revises: ring_0007

The compact job (jobs/compact.py) TRUNCATEs a ring's tables and inserts their live rows back
while the xmin horizon is pinned. TRUNCATE is not MVCC-safe: a REPEATABLE READ or SERIALIZABLE
transaction whose snapshot is older than the compaction sees the tables empty, so a pop there
would give up its claims (ring_repair delivers their messages later, under new ids), a push
would find no free slot, ring_repair, ring_release, publish, sub_take, sub_done and
sub_return would act on slots and claims they cannot see, subscribe would pass its fan-out
test on any ring and unsubscribe would report an existing subscription missing. This revision
makes each of those calls raise QC400 at those levels before it reads anything, in the
reliable queue's form (the queue, the call, the level, why); the Python client raises
UsageError with that line, as for the reliable queue. subscriptions, a read-only report,
returns what the caller's snapshot sees, as a SELECT on the tables would. Every function
keeps its signature; sub_done and sub_return become
plpgsql (a SQL function cannot raise) around the same statement. The upgrade and the
downgrade replace bodies in place (CREATE OR REPLACE keeps grants; `queuectl grant`'s
SECURITY DEFINER is restored): slots, claims kept in sessions and subscriptions stay as they
are. The downgrade restores ring_0007's bodies (ring_0006's for subscribe, unsubscribe, sub_done
and sub_return).
SQL Server has no compaction: its sections render today's procedures unchanged.
"""

from queuectl.migrations.queue_ops import replace_functions, set_version

revision = "ring_0008"
down_revision = "ring_0007"
branch_labels = None
depends_on = None

_CALLS = ("create_enqueue_many", "create_enqueue", "create_dequeue", "create_ring_repair", "create_ring_release",
          "create_publish", "create_sub_take", "create_sub_done", "create_sub_return", "create_subscribe",
          "create_unsubscribe")
_PREVIOUS = ("create_enqueue_many_0007", "create_enqueue_0007", "create_dequeue_0007", "create_ring_repair_0007",
             "create_ring_release_0007", "create_publish_0007", "create_sub_take_0007", "create_sub_done_0006",
             "create_sub_return_0006", "create_subscribe_0006", "create_unsubscribe_0006")


def upgrade() -> None:
    replace_functions("ring", *_CALLS)
    set_version(revision)


def downgrade() -> None:
    replace_functions("ring", *_PREVIOUS)
    set_version(down_revision)
