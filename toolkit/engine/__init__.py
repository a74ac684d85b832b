"""Reaching a database: the engine wing's face.

Everything above the wing is engine-neutral. Each database has one module behind the
Adapter interface (queuectl.engine.base): queuectl.engine.postgresql, queuectl.engine.mssql;
queuectl.engine.embedded runs the PostgreSQL server queuectl uses when no URL is given, and
queuectl.engine.urls reads URLs and keeps their secrets out of what is shown. This module
resolves the URL, creates the engine, and maps a dialect to its adapter.
"""

from __future__ import annotations

import functools
import os
import random
import time
from typing import TYPE_CHECKING

from queuectl.engine.urls import URL_ENV, check_not_empty, error_text, mask_url, parse_url, with_password_file
from queuectl.errors import ConnectionFailed

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.engine import URL, Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

    from queuectl.engine.base import Adapter

# SQLAlchemy, the drivers and the adapters load when the first engine is made, not when this
# module is imported: the CLI imports it for every command, a refused argument included.


@functools.cache
def _adapters() -> dict[str, Adapter]:
    """The one table from a dialect name to its adapter (read through adapter_for)."""
    from queuectl.engine.mssql import MssqlAdapter
    from queuectl.engine.postgresql import PostgresAdapter

    return {
        "postgresql": PostgresAdapter("postgresql", "postgresql"),
        "mssql": MssqlAdapter("mssql", "mssql", review_script_connects=False),
    }


def adapter_for(source: Engine | sa.Connection | URL | str) -> Adapter:
    """The adapter of an engine, a connection, a URL or a dialect name (a URL without
    connecting and without loading a driver)."""
    adapters = _adapters()
    dialect = getattr(source, "dialect", None)
    if dialect is not None:
        return adapters[dialect.name]
    if isinstance(source, str) and source in adapters:
        return adapters[source]
    text = source if isinstance(source, str) else source.render_as_string(hide_password=False)
    return adapters[parse_url(text).get_backend_name()]


def resolve_url(url: str | None) -> str:
    """--url, else $QUEUECTL_URL, else the embedded server (started on first use)."""
    check_not_empty(url)
    if url:
        return url
    if os.environ.get(URL_ENV):
        return os.environ[URL_ENV]
    from queuectl.engine.embedded import EmbeddedServer, EmbeddedServerError

    try:
        return EmbeddedServer().ensure_running()
    except EmbeddedServerError as exc:
        raise ConnectionFailed(f"embedded PostgreSQL: {exc}") from None


def make_engine(url: str | None = None, *, pool_size: int = 5) -> Engine:
    """An engine for the resolved URL; fails with a one-line error when unreachable."""
    import sqlalchemy as sa

    parsed = with_password_file(parse_url(resolve_url(url)))
    adapter = _adapters()[parsed.get_backend_name()]
    adapter.check_driver(parsed)
    engine = sa.create_engine(
        parsed, pool_size=pool_size, pool_pre_ping=True, connect_args=adapter.connect_args(parsed)
    )
    check_connection(engine)
    return engine


def make_async_engine(url: str | None = None, *, pool_size: int = 1) -> AsyncEngine:
    """An asyncio engine (SQLAlchemy's, over psycopg's AsyncConnection) for the resolved URL,
    for the asyncio clients; a one-line UsageError on a database without one (SQL Server).
    It connects on first use (queuectl.client.aio checks it then, as make_engine does)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    parsed = with_password_file(parse_url(resolve_url(url)))
    adapter = _adapters()[parsed.get_backend_name()]
    adapter.check_asyncio()
    adapter.check_driver(parsed)
    return create_async_engine(parsed, pool_size=pool_size, pool_pre_ping=True, connect_args=adapter.connect_args(parsed))


def check_connection(engine: Engine) -> None:
    import sqlalchemy as sa

    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.DBAPIError as exc:
        reason = error_text(exc, engine)
        raise ConnectionFailed(f"cannot connect to {mask_url(engine.url)}: {reason}") from None


def backoff_pause(attempt: int, first: float = 0.05, cap: float = 2.0) -> float:
    """Seconds to wait before reconnect attempt `attempt` (0, 1, ...): exponential from
    `first`, at most `cap`, with "equal jitter" (half fixed, half random) so clients that
    lost the same server do not all come back in the same instant."""
    pause = min(cap, first * 2**attempt)
    return pause / 2 + random.uniform(0, pause / 2)


def connect_within(engine: Engine, seconds: float) -> sa.Connection:
    """A new autocommit connection, tried again with jittered back-off for up to `seconds`
    (a server that restarts refuses connections for a while); its last error when the server
    stays away."""
    from sqlalchemy.exc import DBAPIError

    deadline = time.monotonic() + seconds
    attempt = 0
    while True:
        try:
            return engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        except DBAPIError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise
            time.sleep(min(backoff_pause(attempt), remaining))
            attempt += 1


def discard_connection(conn: sa.Connection | None) -> None:
    """Invalidate and close a connection that may be broken (or still hold a session lock),
    so the pool never hands it out again; errors while doing so are moot."""
    if conn is None:
        return
    from sqlalchemy.exc import SQLAlchemyError

    try:
        conn.invalidate()
        conn.close()
    except SQLAlchemyError:
        pass
