"""Alembic environment for queuectl.

Two kinds of version history live in one script directory, as Alembic branches:
  * "catalog": the toolkit's own tables, tracked in <schema>.alembic_version;
  * one branch per queue kind ("reliable", ...): run once per queue, each queue tracked in
    its own version table <schema>.<queue>_version, so queues upgrade one at a time.
queuectl.install passes everything through config.attributes; there is no alembic.ini.
What differs per engine (the SQL folder, how a section splits into batches) comes from the
engine adapter; on SQL Server, Alembic itself writes `GO` after every batch in --sql mode.
"""

from alembic import context
from sqlalchemy import text

from queuectl.engine import adapter_for
from queuectl.names import quote_ident
from queuectl.sqlfiles import render

config = context.config
schema: str = config.attributes["schema"]
version_table: str = config.attributes["version_table"]

common = dict(
    version_table=version_table,
    version_table_schema=schema,
    transaction_per_migration=False,
)


def setup_statements(dialect: str) -> list[str]:
    """Session settings, then the schema (the version table lives in it, so it comes first)."""
    adapter = adapter_for(dialect)
    values = {"schema": quote_ident(schema), "schema_literal": f"'{schema}'"}
    return [
        statement
        for section in ("session_settings", "create_schema")
        for statement in adapter.split_batches(render(adapter.sql_dir, "catalog", section, values))
    ]


if context.is_offline_mode():
    context.configure(
        dialect_name=config.attributes["dialect"],
        # The script is read by psql or sqlcmd, not by a driver: a driver's paramstyle
        # (psycopg's "%s") would double every % of the SQL (format('%L') in a function body,
        # the modulo operator) in the printed script.
        dialect_opts={"paramstyle": "named"},
        literal_binds=True,
        output_buffer=config.attributes["output"],
        **common,
    )
    with context.begin_transaction():
        for statement in setup_statements(config.attributes["dialect"]):
            context.execute(statement)
        context.run_migrations()
else:
    connection = config.attributes["connection"]
    context.configure(connection=connection, **common)
    with context.begin_transaction():
        for statement in setup_statements(connection.dialect.name):
            connection.execute(text(statement))
        context.run_migrations()
