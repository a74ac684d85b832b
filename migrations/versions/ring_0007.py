"""ring queue: messages larger than a slot's in-row width go to a side table; a hard maximum

Revision ID: ring_0007
Revises: ring_0006

A message whose payload + headers (as text) is over the ring's slot_bytes (default 1,800) is
stored in <queue>_ring_large by its push; the slot holds a pointer (large_id) and no payload,
so slot rows stay narrow and are never TOASTed. A plain ring's pop deletes the side row in
the statement that takes the slot; a fan-out ring's publish deletes it when it reuses the slot
(every subscription has acknowledged the message by then), and so does the guard when it
turns the slot into a tombstone. A message over max_payload_bytes (default 1 MiB) is refused
by the server in one line (SQLSTATE QC413, the client's PayloadTooLarge) and nothing of the
call is stored. ring_repair and ring_release move a rescued message's pointer, never its
payload (sql/postgresql/ring.sql, create_large_table, has the measurements). The upgrade adds
the column (no rewrite: no default) and the table, replaces the functions in place (CREATE OR
REPLACE keeps grants; SECURITY DEFINER is restored where `queuectl grant` set it) and records
the two settings in the registry; messages in flight and subscriptions stay as they are (a
slot without a pointer keeps its payload). On SQL Server a fan-out ring's guard trigger holds
the text its procedure made, so both directions remake it (refresh_fanout_guard). A ring installed before this revision has no
limit: the upgrade gives it the defaults; `queuectl install --max-payload-bytes` sets another
on a new ring. The downgrade moves every message waiting in the side table back into its slot
(no message is lost), then drops the table and the column and restores ring_0006's functions:
the plain ones are ring_0005's bodies (ring_0006 left them as they were), kept in history as
ring_0003's bodies, then ring_0005's where it has one (SQL Server's ring_0005 sections are
empty, so there the ring_0003 bodies stay); the fan-out ones are ring_0006's.
"""

from alembic import context

from queuectl.migrations.queue_ops import record_settings, replace_functions, run_section, set_version

revision = "ring_0007"
down_revision = "ring_0006"
branch_labels = None
depends_on = None

NEW_SETTINGS = ("slot_bytes", "max_payload_bytes")


def _fanout() -> bool:
    return context.config.attributes["settings"].fanout


def upgrade() -> None:
    run_section("ring", "create_large_table")
    replace_functions("ring", "create_enqueue_many_0007", "create_enqueue_0007", "create_dequeue_0007",
                      "create_ring_repair_0007", "create_ring_release_0007", "create_fanout_guard",
                      "create_publish_0007", "create_sub_take_0007")
    if _fanout():
        run_section("ring", "refresh_fanout_guard")  # SQL Server's trigger, made from the new guard
    record_settings()
    set_version(revision)


def downgrade() -> None:
    # the bodies that read no side table first, so no call reaches it after the move below
    replace_functions("ring", "create_enqueue_many_0003", "create_enqueue_many_0005", "create_enqueue_0003",
                      "create_dequeue_0003", "create_dequeue_0005", "create_ring_repair_0001",
                      "create_ring_release_0003", "create_fanout_guard_0006", "create_publish_0006",
                      "create_sub_take_0006")
    if _fanout():
        # SQL Server's trigger back to ring_0006's text, which reads no side table, before it goes
        run_section("ring", "refresh_fanout_guard")
    run_section("ring", "drop_large_table")
    record_settings(without=NEW_SETTINGS)
    set_version(down_revision)
