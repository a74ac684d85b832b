"""ring queue: set-based push and pop (a batch claims its positions with one nextval series
and is written or taken with one UPDATE); a session may keep several claims per side

Revision ID: ring_0003
Revises: ring_0002

ring_0001's push and pop handle one position per statement, so a batch costs as much
server time per message as single calls (83-84 us per message and side at batch 1, 10 and
100). The functions keep their signatures and result columns and are
replaced in place (CREATE OR REPLACE keeps their EXECUTE grants, and the migration gives
the functions `queuectl grant` secured their SECURITY DEFINER back: nothing to re-run).
The downgrade restores the per-position functions and ring_0002's release. A session's
kept claims are a comma-separated list here (a single value before): sessions open across
the downgrade should reconnect.
"""

from queuectl.migrations.queue_ops import replace_functions, set_version

revision = "ring_0003"
down_revision = "ring_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replace_functions("ring", "create_enqueue_many_0003", "create_enqueue_0003", "create_dequeue_0003",
                      "create_ring_release_0003")
    set_version(revision)


def downgrade() -> None:
    replace_functions("ring", "create_enqueue_0001", "create_enqueue_many_0001", "create_dequeue_0001",
                      "create_ring_release_0002")
    set_version(down_revision)
