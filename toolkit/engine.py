"""Reaching a database: URL resolution, engine creation, and the per-engine seam.

Everything above this module is engine-neutral. The adapter answers "how do I say this
on this server": which SQL folder to read and how to take a single-runner lock.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from queuectl.errors import ConnectionFailed, UsageError

URL_ENV = "QUEUECTL_URL"
_DRIVERS = {"postgresql": "psycopg", "mssql": "pyodbc"}


@dataclass(frozen=True)
class Adapter:
    """What differs per engine, in one place."""

    dialect: str
    sql_dir: str

    @property
    def can_listen(self) -> bool:
        """Consumers can sleep until notified (LISTEN/NOTIFY); SQL Server consumers poll (queuectl.worker)."""
        return self.dialect == "postgresql"

    def lock_statement(self) -> str:
        """Session-level try-lock for single-runner work; :key is a text key."""
        if self.dialect == "postgresql":
            return "SELECT pg_try_advisory_lock(hashtextextended(:key, 0))"
        raise UsageError(f"locks are not implemented for {self.dialect} yet")

    def unlock_statement(self) -> str:
        if self.dialect == "postgresql":
            return "SELECT pg_advisory_unlock(hashtextextended(:key, 0))"
        raise UsageError(f"locks are not implemented for {self.dialect} yet")

    def wait_lock_statement(self) -> str:
        if self.dialect == "postgresql":
            return "SELECT pg_advisory_lock(hashtextextended(:key, 0))"
        raise UsageError(f"locks are not implemented for {self.dialect} yet")


ADAPTERS = {"postgresql": Adapter("postgresql", "postgresql"), "mssql": Adapter("mssql", "mssql")}


def adapter_for(engine_or_conn: Engine | sa.Connection) -> Adapter:
    return ADAPTERS[engine_or_conn.dialect.name]


def mask_url(url: str | URL) -> str:
    """The URL as it may be shown: password replaced by ***."""
    try:
        parsed = url if isinstance(url, URL) else make_url(url)
    except ArgumentError:
        return "<unparsable URL>"
    return parsed.render_as_string(hide_password=True)


def parse_url(url: str) -> URL:
    """Validate a database URL and pin the driver queuectl uses for its dialect."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UsageError(
            "invalid database URL: expected e.g. postgresql://user@host:5432/dbname"
        ) from None
    backend = parsed.get_backend_name()
    if backend in ("postgres",):
        backend = "postgresql"
    if backend not in _DRIVERS:
        raise UsageError(
            f"unsupported database dialect {backend!r} in {mask_url(parsed)}: "
            "queuectl supports postgresql and mssql"
        )
    return parsed.set(drivername=f"{backend}+{_DRIVERS[backend]}")


def resolve_url(url: str | None) -> str:
    """--url, else $QUEUECTL_URL, else the embedded server (started on first use)."""
    if url:
        return url
    if os.environ.get(URL_ENV):
        return os.environ[URL_ENV]
    from queuectl.embedded import EmbeddedServer, EmbeddedServerError

    try:
        return EmbeddedServer().ensure_running()
    except EmbeddedServerError as exc:
        raise ConnectionFailed(f"embedded PostgreSQL: {exc}") from None


def make_engine(url: str | None = None, *, pool_size: int = 5) -> Engine:
    """An engine for the resolved URL; fails with a one-line error when unreachable."""
    parsed = parse_url(resolve_url(url))
    connect_args = {"connect_timeout": 10} if parsed.get_backend_name() == "postgresql" else {}
    engine = sa.create_engine(
        parsed, pool_size=pool_size, pool_pre_ping=True, connect_args=connect_args
    )
    check_connection(engine)
    return engine


def check_connection(engine: Engine) -> None:
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except DBAPIError as exc:
        reason = first_line(exc.orig)
        if engine.url.password:
            reason = reason.replace(str(engine.url.password), "***")
        raise ConnectionFailed(f"cannot connect to {mask_url(engine.url)}: {reason}") from None


def first_line(exc: BaseException | None) -> str:
    text = str(exc or "").strip()
    return text.splitlines()[0] if text else type(exc).__name__
