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
from queuectl import locks
from queuectl.catalog import CATALOG_BRANCH, CATALOG_VERSION_TABLE, QueueInfo, QueueSettings
from queuectl.engine import adapter_for, make_engine
from queuectl.engine.urls import URL_ENV, check_not_empty
from queuectl.errors import QueuectlError, UsageError
from queuectl.kindspec import KINDS, check_name_fits, check_settings, validate_kind
from queuectl.defaults import INSTALL_LOCK_WAIT_S
from queuectl.locks import Lock
from queuectl.names import (
    DEFAULT_SCHEMA, QueueNames, quote_ident, shared_object_names, validate_new_queue_name, validate_schema_name,
)
from queuectl.registry import catalog_revision, get_queue, list_queues, require_queue
from queuectl.sqlfiles import render

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
def _install_lock(conn: Connection, schema: str, *, upgrade: bool = False, wait: float = INSTALL_LOCK_WAIT_S
                  ) -> Iterator[None]:
    """One installer at a time per catalog (session locks on this connection, queuectl.locks),
    with the catalog brought to its newest revision first when `upgrade`.

    While the catalog has no lock seed the installer takes the lock's bare name (every
    installer does, so they still serialise), upgrades the catalog, which creates the seed,
    and then takes the seeded key as well, which installers that start later take alone.
    On any failure the transaction is rolled back before the locks are given up, so the
    cause is what the caller sees (not "current transaction is aborted"), and a connection
    that cannot give them up is closed rather than returned to the pool still holding them.
    """
    lock = Lock(schema, "queuectl.install", f"queuectl's install lock of schema {schema!r}")
    held: list[str] = []
    try:
        held.append(locks.take(conn, lock, wait))  # the bare name while the catalog has no seed
        if upgrade:
            upgrade_catalog(conn, schema)
        if locks.key_of(conn, lock) != held[0]:  # this upgrade, or an earlier installer, made the seed
            held.append(locks.take(conn, lock, wait))
        yield
    except BaseException:
        _rollback_quietly(conn)
        raise
    finally:
        _release_all(conn, held)


def _rollback_quietly(conn: Connection) -> None:
    try:
        conn.rollback()
    except Exception:  # a lost connection: _release_all closes it
        pass


def _release_all(conn: Connection, keys: list[str]) -> None:
    try:
        for key in reversed(keys):
            locks.release(conn, key)
    except Exception:
        # The session may still hold a lock: end it (the server releases a session's locks
        # when it ends) instead of pooling it.
        conn.invalidate()


def upgrade_catalog(conn: Connection, schema: str = DEFAULT_SCHEMA) -> None:
    command.upgrade(_config(schema, CATALOG_VERSION_TABLE, connection=conn), f"{CATALOG_BRANCH}@head")
    conn.commit()


def check_no_shared_names(name: str, kind: str, installed: list[QueueInfo]) -> None:
    """Refuse a queue whose objects could be named like an installed queue's. New names
    cannot clash (names.validate_new_queue_name); a queue installed by an older queuectl may."""
    for other in installed:
        shared = shared_object_names(name, kind, other.name, other.kind) if other.kind in KINDS else []
        if shared:
            raise UsageError(
                f"queue {name!r} would share object names with installed queue {other.name!r} "
                f"({', '.join(shared[:3])}), and a grant or drop could reach the other queue: choose another name"
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
    lock_wait: float = INSTALL_LOCK_WAIT_S,
) -> QueueInfo:
    """Install one queue (and the catalog, if this is the first queue in the database).

    At the newest version of its kind, or at `revision` (an older one, to be upgraded later).
    Waits up to `lock_wait` seconds for another install, upgrade or uninstall to finish.
    """
    validate_kind(kind)
    names = QueueNames(validate_new_queue_name(name, kind), schema)
    target = f"{kind}@head" if revision is None else validate_revision(kind, revision)
    check_name_fits(names, kind)
    settings = check_settings(kind, settings)
    with engine.connect() as conn, _install_lock(conn, schema, upgrade=True, wait=lock_wait):
        existing = get_queue(conn, name, schema)
        if existing is not None:
            raise UsageError(
                f"queue {name!r} is already installed (kind {existing.kind}, version "
                f"{existing.schema_version}): use `queuectl upgrade {name}` or uninstall it first"
            )
        check_no_shared_names(name, kind, list_queues(conn, schema))
        command.upgrade(_queue_config(names, kind, settings, connection=conn), target)
        conn.commit()
        return require_queue(conn, name, schema)


def database_report(engine: Engine) -> str | None:
    """One line on a database setting that changes how the installed queue's statements, or
    the user's own reads of its tables, behave (SQL Server's read committed snapshot); None
    where the engine has none to report (PostgreSQL)."""
    with engine.connect() as conn:
        return adapter_for(conn).install_report(conn)


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
    validate_kind(kind)
    names = QueueNames(validate_new_queue_name(name, kind), schema)
    check_name_fits(names, kind)
    settings = check_settings(kind, settings)
    current = None
    if engine is not None:
        dialect = engine.dialect.name
        with engine.connect() as conn:
            current = catalog_revision(conn, schema)
            if current and get_queue(conn, name, schema):
                raise UsageError(f"queue {name!r} is already installed: nothing to install")
            if current:
                check_no_shared_names(name, kind, list_queues(conn, schema))
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
) -> tuple[str, str | None]:
    """`install --sql`: the script for the URL's engine (--url, else $QUEUECTL_URL, else
    PostgreSQL), and a note when it was written without reading a database. It connects only
    where the engine adapter says a review script starts from the database's state
    (PostgreSQL); a SQL Server script is complete and made offline. A script made without a
    connection installs from scratch, catalog included, whatever the database holds: its first
    line is a comment saying so (the note), so a script kept for later still tells."""
    check_not_empty(url)
    resolved = url or os.environ.get(URL_ENV)
    adapter = adapter_for(resolved) if resolved else adapter_for("postgresql")
    engine = make_engine(resolved) if resolved and adapter.review_script_connects else None
    script = install_script(engine, name, kind, settings, schema, dialect=adapter.dialect)
    if engine is not None:
        return script, None
    why = ("no --url or $" + URL_ENV + " given") if not resolved else f"{adapter.dialect} scripts are made offline"
    note = (f"written without reading a database ({why}): this script installs the catalog and queue {name!r} "
            "from scratch, as on an empty database, whether or not they exist where it runs")
    notes = "".join(f"-- {line}\n" for line in adapter.review_script_notes())
    return f"-- {note}\n{notes}{script}", note


def upgrade_queue(engine: Engine, name: str, schema: str = DEFAULT_SCHEMA,
                  lock_wait: float = INSTALL_LOCK_WAIT_S) -> tuple[str, str]:
    """Bring one queue to the newest version of its kind; returns (before, after)."""
    with engine.connect() as conn, _install_lock(conn, schema, upgrade=True, wait=lock_wait):
        info = require_queue(conn, name, schema)
        check_no_shared_names(name, info.kind, [q for q in list_queues(conn, schema) if q.name != name])
        names = QueueNames(name, schema)
        command.upgrade(_queue_config(names, info.kind, info.settings, connection=conn), f"{info.kind}@head")
        conn.commit()
        return info.schema_version, require_queue(conn, name, schema).schema_version


def downgrade_queue(engine: Engine, name: str, revision: str, schema: str = DEFAULT_SCHEMA,
                    lock_wait: float = INSTALL_LOCK_WAIT_S) -> tuple[str, str]:
    """Take one queue back to an older revision of its kind (not to base: that is uninstall)."""
    with engine.connect() as conn, _install_lock(conn, schema, wait=lock_wait):
        info = require_queue(conn, name, schema)
        target = validate_revision(info.kind, revision)
        command.downgrade(_queue_config(QueueNames(name, schema), info.kind, info.settings, connection=conn), target)
        conn.commit()
        return info.schema_version, require_queue(conn, name, schema).schema_version


def upgrade_all(engine: Engine, schema: str = DEFAULT_SCHEMA,
                lock_wait: float = INSTALL_LOCK_WAIT_S) -> list[tuple[str, str, str]]:
    """Upgrade the catalog, then every queue one at a time; returns (name, before, after)."""
    with engine.connect() as conn:
        with _install_lock(conn, schema, upgrade=True, wait=lock_wait):
            pass
        queues = list_queues(conn, schema)
    return [(q.name, *upgrade_queue(engine, q.name, schema, lock_wait)) for q in queues]


def uninstall_queue(engine: Engine, name: str, schema: str = DEFAULT_SCHEMA,
                    lock_wait: float = INSTALL_LOCK_WAIT_S) -> QueueInfo:
    """Downgrade the queue's branch to base (dropping its objects) and its version table."""
    names = QueueNames(name, schema)
    with engine.connect() as conn, _install_lock(conn, schema, wait=lock_wait):
        info = require_queue(conn, name, schema)
        command.downgrade(_queue_config(names, info.kind, info.settings, connection=conn), f"{info.kind}@base")
        _drop_table(conn, names.version_table, schema)
        conn.commit()
        return info


def _drop_table(conn: Connection, table: str, schema: str) -> None:
    """Drop an Alembic version table (Alembic empties it at base but leaves it)."""
    sa.Table(table, sa.MetaData(), schema=schema).drop(conn, checkfirst=True)


def remove_everything(engine: Engine, schema: str = DEFAULT_SCHEMA, lock_wait: float = INSTALL_LOCK_WAIT_S) -> list[str]:
    """Uninstall every queue, downgrade the catalog to base and drop the then empty schema.

    Returns the queues removed. A schema still holding objects queuectl did not create is
    left in place with an error.
    """
    validate_schema_name(schema)
    with engine.connect() as conn:
        queues = [q.name for q in list_queues(conn, schema)]
    for name in queues:
        uninstall_queue(engine, name, schema, lock_wait)
    with engine.connect() as conn, _install_lock(conn, schema, wait=lock_wait):
        if catalog_revision(conn, schema) is not None:
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
