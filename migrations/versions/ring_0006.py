"""ring queue: fan-out, named subscriptions with their own cursors on one ring

Revision ID: ring_0006
Revises: ring_0005

Adds the subscriptions' tables (<queue>_subs, <queue>_sub_slots) and the fan-out API
(publish, subscribe, unsubscribe, subscriptions, sub_take, sub_done, sub_return) to every
ring; sql/postgresql/ring.sql, create_subscription_tables, has the design. A ring installed
with `fanout` is then made a fan-out ring (make_fanout: its slots PUBLISHED, the guard
trigger); that needs a ring never used, which a fresh install is. An existing ring keeps
working as before, every row in place: the tables are new and empty, its functions are not
touched. The downgrade of a fan-out ring turns each message a subscription has not
acknowledged into a FULL one for the plain pop (unmake_fanout), then drops what the upgrade
added and the fan-out settings. SQL Server gets the same objects (sql/mssql/ring.sql).
"""

from alembic import context

from queuectl.migrations.queue_ops import record_settings, run_section, set_version

revision = "ring_0006"
down_revision = "ring_0005"
branch_labels = None
depends_on = None

_FANOUT_SETTINGS = ("fanout", "lag_limit", "drop_when_behind")
# ring_0007's settings, which the settings read back from the registry fill with their defaults:
# a ring taken below this revision records none of them
_LATER_SETTINGS = ("slot_bytes", "max_payload_bytes")
# this revision's bodies (history sections where a later revision replaced them)
_FUNCTIONS = ("create_fanout_guard_0006", "create_publish_0006", "create_subscribe_0006", "create_unsubscribe_0006",
              "create_subscriptions_0006", "create_sub_take_0006", "create_sub_done_0006", "create_sub_return_0006")


def _settings():
    return context.config.attributes["settings"]


def upgrade() -> None:
    settings = _settings()
    # the subscriptions' defaults: the install settings of a fan-out ring (half the ring, no drop
    # for a ring installed without them)
    run_section("ring", "create_subscription_tables", settings.subscription_values())
    for section in _FUNCTIONS:
        run_section("ring", section)
    if settings.fanout:
        run_section("ring", "make_fanout")
    set_version(revision)


def downgrade() -> None:
    if _settings().fanout:
        run_section("ring", "unmake_fanout")
        record_settings(without=_FANOUT_SETTINGS + _LATER_SETTINGS)
    run_section("ring", "drop_subscription_functions")
    run_section("ring", "drop_subscription_tables")
    set_version(down_revision)
