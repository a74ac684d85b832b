"""Alembic environment for queuectl.

Two kinds of version history live in one script directory, as Alembic branches:
  * "catalog": the toolkit's own tables, tracked in <schema>.alembic_version;
  * one branch per queue kind ("reliable", ...): run once per queue, each queue tracked in
    its own version table <schema>.<queue>_version, so queues upgrade one at a time.
queuectl.install passes everything through config.attributes; there is no alembic.ini.
"""

from alembic import context
from sqlalchemy import text

from queuectl.names import quote_ident

config = context.config
schema: str = config.attributes["schema"]
version_table: str = config.attributes["version_table"]

common = dict(
    version_table=version_table,
    version_table_schema=schema,
    transaction_per_migration=False,
)
create_schema = f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}"

if context.is_offline_mode():
    context.configure(
        dialect_name=config.attributes["dialect"],
        literal_binds=True,
        output_buffer=config.attributes["output"],
        **common,
    )
    with context.begin_transaction():
        # The version table lives in the schema, so the schema comes first.
        context.execute(create_schema)
        context.run_migrations()
else:
    connection = config.attributes["connection"]
    context.configure(connection=connection, **common)
    with context.begin_transaction():
        connection.execute(text(create_schema))
        context.run_migrations()
