"""Which queues are installed, of which kind, at which schema version: the catalog's
queues table, read.

The one place that answers "is this queue installed?" for the installer, the clients, the
jobs and health. A call path reads it once and passes the QueueInfo on.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from queuectl.catalog import CATALOG_VERSION_TABLE, QueueInfo, QueueSettings, queues_table
from queuectl.errors import NotInstalledError
from queuectl.kindspec import KINDS, settings_class
from queuectl.names import DEFAULT_SCHEMA, QueueNames, validate_schema_name


def catalog_revision(conn: Connection, schema: str) -> str | None:
    """The catalog's Alembic revision in this schema, None when queuectl is not installed there."""
    if not sa.inspect(conn).has_table(CATALOG_VERSION_TABLE, schema=validate_schema_name(schema)):
        return None
    table = sa.table(CATALOG_VERSION_TABLE, sa.column("version_num"), schema=schema)
    return conn.execute(sa.select(table.c.version_num)).scalar()


def get_queue(conn: Connection, name: str, schema: str = DEFAULT_SCHEMA) -> QueueInfo | None:
    names = QueueNames(name, schema)
    if catalog_revision(conn, schema) is None:
        return None
    table = queues_table(schema)
    row = conn.execute(sa.select(table).where(table.c.name == names.queue)).mappings().first()
    return _info(row) if row else None


def require_queue(conn: Connection, name: str, schema: str = DEFAULT_SCHEMA) -> QueueInfo:
    info = get_queue(conn, name, schema)
    if info is None:
        installed = [queue.name for queue in list_queues(conn, schema)]  # read only to say what was meant
        raise NotInstalledError(f"queue {name!r} is not installed in schema {schema!r}"
                                + (f" ({meant})" if (meant := did_you_mean(name, installed)) else
                                   f": run `queuectl install {name}`"))
    return info


def did_you_mean(name: str, installed: Iterable[str]) -> str | None:
    """"did you mean 'orders'?" for a misspelt queue name ('ordrs', 'order', 'ordres'): the
    installed names closest to it (difflib's ratio of at least 0.6), or None when none is."""
    close = difflib.get_close_matches(name, list(installed), n=2, cutoff=0.6)
    return "did you mean " + " or ".join(repr(found) for found in close) + "?" if close else None


def list_queues(conn: Connection, schema: str = DEFAULT_SCHEMA) -> list[QueueInfo]:
    validate_schema_name(schema)
    if catalog_revision(conn, schema) is None:
        return []
    table = queues_table(schema)
    rows = conn.execute(sa.select(table).order_by(table.c.name)).mappings().all()
    return [_info(row) for row in rows]


def _info(row: sa.RowMapping) -> QueueInfo:
    settings = row["settings"] if isinstance(row["settings"], dict) else {}
    return QueueInfo(
        name=row["name"],
        kind=row["kind"],
        schema_version=row["schema_version"],
        created_at=row["created_at"],
        settings=settings_class(row["kind"]).from_dict(settings) if row["kind"] in KINDS else QueueSettings(),
    )
