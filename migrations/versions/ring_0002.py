"""ring queue: ring_release re-pushes at once a message that arrived at the session's own pop claim

Revision ID: ring_0002
Revises: ring_0001

ring_0001's ring_release cannot tombstone a pop claim whose push committed after the
session's last pop: the message then waits, orphaned, for ring_repair's grace. This
version rescues it at once and returns two more columns (new_item_id, outcome). The
function is dropped and created (its result columns change), which drops what `queuectl
grant` gave it (EXECUTE for the consumer role; on PostgreSQL also SECURITY DEFINER): re-run
`queuectl grant` after this upgrade or its downgrade, as after any upgrade that recreates
functions.
"""

from queuectl.migrations.queue_ops import run_section, set_version

revision = "ring_0002"
down_revision = "ring_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_section("ring", "drop_ring_release_0001")
    run_section("ring", "create_ring_release_0002")
    set_version(revision)


def downgrade() -> None:
    run_section("ring", "drop_ring_release")
    run_section("ring", "create_ring_release_0001")
    set_version(down_revision)
