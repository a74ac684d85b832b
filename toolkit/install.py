"""Installing, upgrading and removing queues: every DDL statement goes through Alembic.

The catalog (branch "catalog") is upgraded first, then the queue's kind branch runs with
the queue's own version table. Concurrent installers serialise on an advisory lock.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

import queuectl.migrations
from queuectl.catalog import CATALOG_BRANCH, CATALOG_VERSION_TABLE, QueueInfo, QueueSettings, queues_table
from queuectl.engine import ADAPTERS, URL_ENV, adapter_for, adapter_for_url, check_not_empty, make_engine
from queuectl.errors import NotInstalledError, QueuectlError, UsageError
from queuectl.kindspec import KINDS, check_name_fits, check_settings, settings_class
from queuectl.kindspec import validate_kind as validate_kind  # re-exported
from queuectl.names import DEFAULT_SCHEMA, QueueNames, quote_ident, validate_schema_name
from queuectl.sqlfiles import render

_INSTALL_LOCK = "queuectl.install"


def _config(schema: str, version_table: str, **attributes: object) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(queuectl.migrations.__file__).parent))
    cfg.attributes.update(schema=schema, version_table=version_table, **attributes)
    return cfg


def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config(DEFAULT_SCHEMA, CATALOG_VERSION_TABLE))


def head_of(branch: str) -> str:
    return _script().get_revision(f"{branch}@head").revision


def validate_revision(kind: str, revision: str) -> str:
    """A revision of the kind's branch (e.g. 'reliable_0001'), for installs and downgrades."""
    known = [r.revision for r in _script().iterate_revisions(f"{kind}@head", "base")]
    if revision not in known:
        raise UsageError(f"unknown revision {revision!r} for kind {kind}: choose one of {', '.join(reversed(known))}")
    return revision


@contextmanager
def _install_lock(conn: Connection) -> Iterator[None]:
    """One installer at a time per database (session advisory lock on this connection)."""
    adapter = adapter_for(conn)
    conn.execute(sa.text(adapter.wait_lock_statement()), {"key": _INSTALL_LOCK})
    conn.commit()
    try:
        yield
    finally:
        conn.execute(sa.text(adapter.unlock_statement()), {"key": _INSTALL_LOCK})
        conn.commit()


def _catalog_revision(conn: Connection, schema: str) -> str | None:
    if not sa.inspect(conn).has_table(CATALOG_VERSION_TABLE, schema=validate_schema_name(schema)):
        return None
    table = sa.table(CATALOG_VERSION_TABLE, sa.column("version_num"), schema=schema)
    return conn.execute(sa.select(table.c.version_num)).scalar()


def upgrade_catalog(conn: Connection, schema: str = DEFAULT_SCHEMA) -> None:
    command.upgrade(_config(schema, CATALOG_VERSION_TABLE, connection=conn), f"{CATALOG_BRANCH}@head")
    conn.commit()


def get_queue(conn: Connection, name: str, schema: str = DEFAULT_SCHEMA) -> QueueInfo | None:
    names = QueueNames(name, schema)
    if _catalog_revision(conn, schema) is None:
        return None
    table = queues_table(schema)
    row = conn.execute(sa.select(table).where(table.c.name == names.queue)).mappings().first()
    return _info(row) if row else None


def require_queue(conn: Connection, name: str, schema: str = DEFAULT_SCHEMA) -> QueueInfo:
    info = get_queue(conn, name, schema)
    if info is None:
        raise NotInstalledError(
            f"queue {name!r} is not installed in schema {schema!r}: run `queuectl install {name}`"
        )
    return info


def list_queues(conn: Connection, schema: str = DEFAULT_SCHEMA) -> list[QueueInfo]:
    validate_schema_name(schema)
    if _catalog_revision(conn, schema) is None:
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


def _queue_config(names: QueueNames, kind: str, settings: QueueSettings, **attributes: object) -> Config:
    return _config(
        names.schema, names.version_table, queue=names.queue, kind=kind, settings=settings, **attributes
    )


def install_queue(
    engine: Engine,
    name: str,
    kind: str = "reliable",
    settings: QueueSettings | None = None,
    schema: str = DEFAULT_SCHEMA,
    revision: str | None = None,
) -> QueueInfo:
    """Install one queue (and the catalog, if this is the first queue in the database).

    At the newest version of its kind, or at `revision` (an older one, to be upgraded later).
    """
    names = QueueNames(name, schema)
    validate_kind(kind)
    target = f"{kind}@head" if revision is None else validate_revision(kind, revision)
    check_name_fits(names, kind)
    settings = check_settings(kind, settings)
    with engine.connect() as conn, _install_lock(conn):
        upgrade_catalog(conn, schema)
        existing = get_queue(conn, name, schema)
        if existing is not None:
            raise UsageError(
                f"queue {name!r} is already installed (kind {existing.kind}, version "
                f"{existing.schema_version}): use `queuectl upgrade {name}` or uninstall it first"
            )
        command.upgrade(_queue_config(names, kind, settings, connection=conn), target)
        conn.commit()
        return require_queue(conn, name, schema)


def install_script(
    engine: Engine | None,
    name: str,
    kind: str = "reliable",
    settings: QueueSettings | None = None,
    schema: str = DEFAULT_SCHEMA,
    dialect: str = "postgresql",
) -> str:
    """The exact SQL an install would run, for review; nothing is executed.

    With an engine, the catalog part starts from the database's current catalog version;
    without one (or on an empty database) the script creates the catalog too.
    """
    names = QueueNames(name, schema)
    validate_kind(kind)
    check_name_fits(names, kind)
    settings = check_settings(kind, settings)
    current = None
    if engine is not None:
        dialect = engine.dialect.name
        with engine.connect() as conn:
            current = _catalog_revision(conn, schema)
            if current and get_queue(conn, name, schema):
                raise UsageError(f"queue {name!r} is already installed: nothing to install")
    out = io.StringIO()
    catalog_range = f"{current}:{CATALOG_BRANCH}@head" if current else f"{CATALOG_BRANCH}@head"
    if current != head_of(CATALOG_BRANCH):
        command.upgrade(
            _config(schema, CATALOG_VERSION_TABLE, dialect=dialect, output=out), catalog_range, sql=True
        )
    command.upgrade(_queue_config(names, kind, settings, dialect=dialect, output=out), f"{kind}@head", sql=True)
    return out.getvalue()


def review_script(
    url: str | None,
    name: str,
    kind: str = "reliable",
    settings: QueueSettings | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> str:
    """`install --sql`: the script for the URL's engine (--url, else $QUEUECTL_URL, else
    PostgreSQL). It connects only where the engine adapter says a review script starts from
    the database's state (PostgreSQL); a SQL Server script is complete and made offline."""
    check_not_empty(url)
    resolved = url or os.environ.get(URL_ENV)
    adapter = adapter_for_url(resolved) if resolved else ADAPTERS["postgresql"]
    engine = make_engine(resolved) if resolved and adapter.review_script_connects else None
    return install_script(engine, name, kind, settings, schema, dialect=adapter.dialect)


def upgrade_queue(engine: Engine, name: str, schema: str = DEFAULT_SCHEMA) -> tuple[str, str]:
    """Bring one queue to the newest version of its kind; returns (before, after)."""
    with engine.connect() as conn, _install_lock(conn):
        upgrade_catalog(conn, schema)
        info = require_queue(conn, name, schema)
        names = QueueNames(name, schema)
        command.upgrade(_queue_config(names, info.kind, info.settings, connection=conn), f"{info.kind}@head")
        conn.commit()
        return info.schema_version, require_queue(conn, name, schema).schema_version


def downgrade_queue(engine: Engine, name: str, revision: str, schema: str = DEFAULT_SCHEMA) -> tuple[str, str]:
    """Take one queue back to an older revision of its kind (not to base: that is uninstall)."""
    with engine.connect() as conn, _install_lock(conn):
        info = require_queue(conn, name, schema)
        target = validate_revision(info.kind, revision)
        command.downgrade(_queue_config(QueueNames(name, schema), info.kind, info.settings, connection=conn), target)
        conn.commit()
        return info.schema_version, require_queue(conn, name, schema).schema_version


def upgrade_all(engine: Engine, schema: str = DEFAULT_SCHEMA) -> list[tuple[str, str, str]]:
    """Upgrade the catalog, then every queue one at a time; returns (name, before, after)."""
    with engine.connect() as conn:
        with _install_lock(conn):
            upgrade_catalog(conn, schema)
        queues = list_queues(conn, schema)
    return [(q.name, *upgrade_queue(engine, q.name, schema)) for q in queues]


def uninstall_queue(engine: Engine, name: str, schema: str = DEFAULT_SCHEMA) -> QueueInfo:
    """Downgrade the queue's branch to base (dropping its objects) and its version table."""
    names = QueueNames(name, schema)
    with engine.connect() as conn, _install_lock(conn):
        info = require_queue(conn, name, schema)
        command.downgrade(_queue_config(names, info.kind, info.settings, connection=conn), f"{info.kind}@base")
        _drop_table(conn, names.version_table, schema)
        conn.commit()
        return info


def _drop_table(conn: Connection, table: str, schema: str) -> None:
    """Drop an Alembic version table (Alembic empties it at base but leaves it)."""
    sa.Table(table, sa.MetaData(), schema=schema).drop(conn, checkfirst=True)


def remove_everything(engine: Engine, schema: str = DEFAULT_SCHEMA) -> list[str]:
    """Uninstall every queue, downgrade the catalog to base and drop the then empty schema.

    Returns the queues removed. A schema still holding objects queuectl did not create is
    left in place with an error.
    """
    validate_schema_name(schema)
    with engine.connect() as conn:
        queues = [q.name for q in list_queues(conn, schema)]
    for name in queues:
        uninstall_queue(engine, name, schema)
    with engine.connect() as conn, _install_lock(conn):
        if _catalog_revision(conn, schema) is not None:
            command.downgrade(_config(schema, CATALOG_VERSION_TABLE, connection=conn), f"{CATALOG_BRANCH}@base")
            _drop_table(conn, CATALOG_VERSION_TABLE, schema)
            conn.commit()
        engine_dir = adapter_for(conn).sql_dir
        contents = conn.execute(
            sa.text(render(engine_dir, "catalog", "schema_contents", {})), {"schema": schema}
        ).one()
        if contents.relations or contents.functions:
            raise QueuectlError(
                f"schema {schema!r} still holds {contents.relations} relations and "
                f"{contents.functions} functions not created by queuectl: left in place"
            )
        conn.execute(sa.text(render(engine_dir, "catalog", "drop_schema", {"schema": quote_ident(schema)})))
        conn.commit()
    return queues
