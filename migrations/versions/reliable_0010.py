"""reliable queue: the payload limit covers everything one message stores

Revision ID: reliable_0010
Revises: reliable_0009

reliable_0003's enqueue and enqueue_many count the payload only, so a queue limited to 100
bytes stored a 5 MB title and 5 MB of headers. This revision replaces both (same
signatures: grants and callers keep working) with functions that count payload + title +
headers as stored (sql/postgresql/reliable.sql, section create_enqueue_functions) and
name the three sizes when they refuse. No row is touched; the setting keeps its name
(max_payload_bytes). The downgrade puts reliable_0003's functions back. Running producers
need no restart: a session recompiles a function whose catalog row changed at its next call.
"""

from queuectl.migrations.queue_ops import replace_functions, set_version

revision = "reliable_0010"
down_revision = "reliable_0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replace_functions("reliable", "create_enqueue_functions_0010")
    set_version(revision)


def downgrade() -> None:
    replace_functions("reliable", "create_enqueue_functions_0003")
    set_version(down_revision)
