"""Single-runner locks: one installer per catalog, one runner per job and queue, one export
per queue, whoever runs them and wherever.

A lock is session-level (PostgreSQL advisory lock, SQL Server application lock) and held on
a connection of its own, so it outlives the short transactions of the work it guards and
goes away with its session when a runner dies. The statements are in sql/<engine>/locks.sql.

Any role that can connect can take such a lock if it knows its key. Each key therefore ends
in the catalog's lock seed (table lock_seed, revision catalog_0004), which only the catalog's
owner can read: a role that can merely connect cannot compute queuectl's keys. While the
catalog has no seed yet (the first install, or a catalog not yet upgraded) the key is the
lock's bare name. No wait is unbounded, and a refusal names the session holding the lock
(pid, role, application), so a squatter is seen and can be ended.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from queuectl.engine import adapter_for
from queuectl.engine.urls import first_line
from queuectl.errors import QueuectlError
from queuectl.names import quote_ident, validate_schema_name
from queuectl.sqlfiles import render

log = logging.getLogger("queuectl.locks")

POLL_S = 0.25  # how often a bounded wait tries the lock again


class LockBusy(QueuectlError):
    """Another session holds the lock (after the wait, if there was one); the message names it."""


@dataclass(frozen=True)
class Lock:
    """A single-runner lock of the catalog in `schema`: `name` tells what it guards, `what`
    says it in a message ("the install lock of schema 'queuectl'")."""

    schema: str
    name: str
    what: str

    def __post_init__(self) -> None:
        validate_schema_name(self.schema)


def _sql(conn: Connection, section: str, schema: str | None = None) -> sa.TextClause:
    values = {"schema": quote_ident(schema)} if schema else {}
    return sa.text(render(adapter_for(conn).sql_dir, "locks", section, values))


def _end_transaction(conn: Connection) -> None:
    """Commit what a lock statement opened: a wait must not keep a transaction (and its
    snapshot) open, and on an autocommit connection this does nothing."""
    conn.commit()


def seed(conn: Connection, schema: str) -> str | None:
    """The catalog's lock seed; None while the catalog has none."""
    if not sa.inspect(conn).has_table("lock_seed", schema=schema):
        _end_transaction(conn)
        return None
    try:
        value = conn.execute(_sql(conn, "read_seed", schema)).scalar()
    except DBAPIError as exc:
        conn.rollback()
        raise QueuectlError(
            f"cannot read the catalog's lock seed {schema}.lock_seed ({first_line(exc.orig)}): queuectl's "
            "installs, jobs and exports run as the catalog's owner, or as a role granted SELECT on that table"
        ) from None
    _end_transaction(conn)
    return value


def key_of(conn: Connection, lock: Lock) -> str:
    """The key the server knows the lock by: its name, then the catalog's seed."""
    salt = seed(conn, lock.schema)
    return f"{lock.name}:{salt}" if salt else lock.name


def try_take(conn: Connection, key: str) -> bool:
    """Take the lock of this key now if it is free; False at once when another session has it."""
    got = bool(conn.execute(_sql(conn, "try_lock"), {"key": key}).scalar())
    _end_transaction(conn)
    return got


def release(conn: Connection, key: str) -> bool:
    """Give the lock up (True when this session held it)."""
    released = bool(conn.execute(_sql(conn, "unlock"), {"key": key}).scalar())
    _end_transaction(conn)
    return released


def holder(conn: Connection, key: str) -> dict | None:
    """The session holding the lock (pid, role_name, application_name, backend_start), or None
    when this role cannot see it (SQL Server without VIEW SERVER STATE) or it is gone."""
    try:
        row = conn.execute(_sql(conn, "holder"), {"key": key}).mappings().first()
        _end_transaction(conn)
    except DBAPIError:
        conn.rollback()
        return None
    return dict(row) if row is not None else None


def describe(session: dict | None) -> str:
    """A holder in words: "pid 4242 (role 'etl', application 'psql')"."""
    if session is None:
        return "a session this role cannot see"
    parts = [f"role {session['role_name']!r}"] if session["role_name"] else []
    if session["application_name"]:
        parts.append(f"application {session['application_name']!r}")
    if session["backend_start"] is not None:
        parts.append(f"connected at {session['backend_start']:%Y-%m-%d %H:%M:%S}")
    return f"pid {session['pid']}" + (f" ({', '.join(parts)})" if parts else "")


def busy_message(conn: Connection, lock: Lock, key: str, waited: float | None = None) -> str:
    """One line: which lock, who holds it, how long we waited, what ends it."""
    session = holder(conn, key)
    message = f"{lock.what} is held by {describe(session)}"
    if waited:
        message += f"; waited {waited:g} s"
    if session is not None:
        message += f"; it ends with that session ({adapter_for(conn).advice_words.end_session(session['pid'])})"
    return message


def take(conn: Connection, lock: Lock, wait: float) -> str:
    """Take the lock, trying for up to `wait` seconds; returns the key held (give it to
    release()). LockBusy, naming the holder, when it stays taken."""
    key = key_of(conn, lock)
    deadline = time.monotonic() + max(wait, 0.0)
    warned = False
    while not try_take(conn, key):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LockBusy(busy_message(conn, lock, key, waited=wait))
        if not warned:
            log.warning("waiting up to %g s for %s, held by %s", wait, lock.what, describe(holder(conn, key)))
            warned = True
        time.sleep(min(POLL_S, remaining))
    return key
