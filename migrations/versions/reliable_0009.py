"""reliable queue: ack, nack, extend_lease and release find their rows by primary key only

Revision ID: reliable_0009
Revises: reliable_0008

Each of these functions finds its items by `m.id = ANY (p_ids)` and checks `m.status = 1`.
That check implies the leased index's predicate (WHERE status = 1), so plpgsql's cached
generic plan may read the whole leased index on every call: a BitmapAnd with the primary
key on a table not analysed since it was created or truncated, an index scan filtered by id
once it is analysed. Every ack then costs one index entry per item in flight (plus the dead
entries of items leased before, until a vacuum) instead of a few primary-key pages. This
revision writes the check `m.status::integer = 1`: the same test, which no longer matches
the predicate, so the primary key is the only index path (sequential scans are off in these
functions since reliable_0008). sql/postgresql/reliable.sql, section
create_functions, has the figures. The downgrade puts reliable_0001's functions
back (history/reliable.sql, create_functions_0001). Both re-run set_plan_guard, because CREATE OR REPLACE
resets a function's SET clauses. Running consumers need no restart: a session recompiles a
function whose catalog row changed at its next call. SQL Server's section is empty
(sql/mssql/reliable.sql says why); its downgrade re-creates the same procedures.
"""

from queuectl.migrations.queue_ops import replace_functions, run_section, set_version

revision = "reliable_0009"
down_revision = "reliable_0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    replace_functions("reliable", "create_functions_0009")  # before the guard: it resets SET clauses
    run_section("reliable", "set_plan_guard")
    set_version(revision)


def downgrade() -> None:
    replace_functions("reliable", "create_functions_0001")
    run_section("reliable", "set_plan_guard")
    set_version(down_revision)
