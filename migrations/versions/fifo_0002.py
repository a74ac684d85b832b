"""fifo queue: dequeue deletes its picks through the primary key, not through a join to them

Revision ID: fifo_0002
Revises: fifo_0001

fifo_0001's dequeues (lax and strict) joined their picks to the items table. The pick's LIMIT
is the function's p_batch, which a generic plan cannot see: it assumes a tenth of the table
is picked and hashes the picks against a sequential scan of the whole table, so every dequeue
reads every item still queued. That plan runs under plan_cache_mode = force_generic_plan, and
wherever plpgsql caches the generic plan itself (measured with generic plans: 1,775 buffers
and 5-16 ms per dequeue of 10 at 40,000 analyzed rows, 122 at 2,000; the custom plans the
default setting kept at those sizes read 65 at both). This version deletes `WHERE id = ANY
(ARRAY(<picks>))`: the same rows, taken in the same one statement with the same locks (strict
FIFO still waits for the head rows, in id order); 57 buffers and 0.1-0.4 ms at both sizes,
generic plan or custom. A generic plan cached while the table held only a few pages still
scans the grown table whole, in either shape, until an ANALYZE or VACUUM of the table replans
it: not addressed here. CREATE OR REPLACE keeps the function's EXECUTE grants, and the
migration gives a function `queuectl grant` secured its SECURITY DEFINER back: nothing to
re-run. SQL Server's procedures delete through their pick and need no change (their sections
are empty).
"""

from alembic import context

from queuectl.migrations.queue_ops import replace_functions, set_version

revision = "fifo_0002"
down_revision = "fifo_0001"
branch_labels = None
depends_on = None


def _dequeue_sections() -> tuple[str, str]:
    """(this revision's dequeue section, fifo_0001's) for the queue's mode."""
    strict = context.config.attributes["settings"].as_dict().get("strict", False)
    if strict:
        return "create_dequeue_strict_0002", "create_dequeue_strict_0001"
    return "create_dequeue_lax_0002", "create_dequeue_lax_0001"


def upgrade() -> None:
    replace_functions("fifo", _dequeue_sections()[0])
    set_version(revision)


def downgrade() -> None:
    replace_functions("fifo", _dequeue_sections()[1])
    set_version(down_revision)
