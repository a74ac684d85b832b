"""reliable queue: notify only when a consumer may be waiting

Revision ID: reliable_0006
Revises: reliable_0005

reliable_0002 notified the queue's channel from every enqueueing transaction. PostgreSQL
serialises the commits of transactions that issued NOTIFY (a database-wide lock held from
before the commit record until it is flushed), so concurrent single-item producers queued
behind one another: 277 enqueues/s with the notification against 899 without at 4 pgbench
clients, whether or not any consumer was listening. Now the
trigger notifies only while some consumer session is registered as possibly sleeping
(`<queue>_wait_begin()`, which queuectl's worker calls on its LISTEN session before it
sleeps), with an "in flight" lock that lets a consumer tell whether an enqueue that did
not see its registration is still open: no wake-up is missed (sql/postgresql/activation.sql,
create_reliable_notify_0006, has the protocol and why it holds).

Upgrading a live queue: workers of an older queuectl never register, so after the upgrade
they are woken only while a new worker sleeps, and otherwise find items by their fallback
poll (every 2 s at most by default): nothing is lost, latency rises until they are
restarted. A plain LISTEN client of the channel must call `<queue>_wait_begin()` the same way.
SQL Server has no notifications: its sections are empty.
"""

from queuectl.migrations.queue_ops import replace_functions, set_version

revision = "reliable_0006"
down_revision = "reliable_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replace_functions("activation", "create_reliable_notify", "create_reliable_notify_0006")
    set_version(revision)


def downgrade() -> None:
    replace_functions("activation", "create_reliable_notify_0002", "drop_wait_functions")
    set_version(down_revision)
