"""Reaching a database: URL resolution, engine creation, and the per-engine seam.

Everything above this module is engine-neutral. The adapter answers "how do I say this
on this server": which SQL folder to read, how a section splits into batches, how to take a
single-runner lock (pg_advisory_lock / sp_getapplock) and how to read storage health.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING
from urllib.parse import quote, quote_plus

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from queuectl.errors import ConnectionFailed, UsageError

if TYPE_CHECKING:
    from queuectl.advice import PostgresWords
    from queuectl.jobs.upkeep import MssqlIndexUpkeep, PostgresIndexUpkeep
    from queuectl.names import QueueNames

    IndexUpkeep = PostgresIndexUpkeep | MssqlIndexUpkeep

URL_ENV = "QUEUECTL_URL"
PASSWORD_FILE_ENV = "QUEUECTL_PASSWORD_FILE"
_DRIVERS = {"postgresql": "psycopg", "mssql": "pyodbc"}


class BinaryArray(list):
    """A list that psycopg sends as one array parameter in binary format (Adapter.payload_array)."""


def _register_binary_array() -> None:
    # On psycopg's global map, before any connection copies it; `%s` (AUTO) placeholders,
    # as SQLAlchemy renders them, then pick the binary dumper for this class only.
    try:
        import psycopg
        from psycopg.types.array import ListBinaryDumper
    except ImportError:  # a SQL Server-only installation
        return
    psycopg.adapters.register_dumper(BinaryArray, ListBinaryDumper)


_register_binary_array()


class DriverResult:
    """A driver cursor's rows behind the CursorResult calls the clients make (keys, all,
    scalar_one, scalars), for statements run by Adapter.client_statement."""

    __slots__ = ("_cursor",)

    def __init__(self, cursor: object) -> None:
        self._cursor = cursor

    def keys(self) -> list[str]:
        # From the PGresult: cursor.description builds a Column object per column on
        # every call (30 us of an 11-column dequeue's client CPU, cProfile).
        result = self._cursor.pgresult
        return [result.fname(i).decode() for i in range(result.nfields)]

    def all(self) -> list[tuple]:
        return self._cursor.fetchall()

    def scalars(self) -> list[object]:
        return [row[0] for row in self._cursor.fetchall()]

    def scalar_one(self) -> object:
        rows = self._cursor.fetchall()
        if len(rows) != 1:
            raise sa.exc.NoResultFound("no row") if not rows else sa.exc.MultipleResultsFound("more than one row")
        return rows[0][0]


class DriverStatement:
    """One client call's statement, compiled once by SQLAlchemy, executed on the driver's
    own connection under the SQLAlchemy Connection that holds it.

    SQLAlchemy's execution layer (execution context, result metadata, row processing)
    costs more client CPU than the driver call itself: a dequeue(1) + ack took 184 us of
    client CPU through Connection.execute, 102 us this way, 77 us on psycopg alone, and
    the full cycle at batch 1 (4 producers, 4 consumers, 2 cores) ran 1.28x the same
    client through Connection.execute in one run (bench/RESULTS.md, series 13).
    Errors come back as SQLAlchemy's DBAPIError, and a lost connection invalidates the
    SQLAlchemy Connection, as Connection.execute would do, so callers handle both paths
    alike."""

    __slots__ = ("sql", "_dialect", "_hide_parameters")

    def __init__(self, engine: Engine, clause: sa.TextClause) -> None:
        self.sql = clause.compile(dialect=engine.dialect).string
        self._dialect = engine.dialect
        self._hide_parameters = engine.hide_parameters

    def __call__(self, conn: sa.Connection, params: dict[str, object]) -> DriverResult:
        driver = conn.connection.driver_connection
        dbapi_error = self._dialect.loaded_dbapi.Error
        try:
            return DriverResult(driver.execute(self.sql, params))
        except dbapi_error as orig:
            lost = self._dialect.is_disconnect(orig, driver, None)
            error = DBAPIError.instance(
                self.sql, params, orig, dbapi_error, hide_parameters=self._hide_parameters,
                connection_invalidated=lost, dialect=self._dialect,
            )
            if lost:
                conn.invalidate(orig)
            raise error from orig


def through_sqlalchemy(clause: sa.TextClause) -> Callable[[sa.Connection, dict], sa.CursorResult]:
    """A client call run by SQLAlchemy's Connection.execute (the other form of a
    client_statement)."""
    return lambda conn, params: conn.execute(clause, params)


# What watches an engine's statements: SQLAlchemy's log (echo=True, or the
# sqlalchemy.engine logger set to INFO) and listeners of these events, such as an
# OpenTelemetry instrumentation or a custom disconnect check.
_WATCHING_EVENTS = ("before_execute", "after_execute", "before_cursor_execute", "after_cursor_execute")
_ENGINE_LOGGER = "sqlalchemy.engine.Engine"


def statements_watched(engine: Engine) -> bool:
    """Whether the engine logs its statements or has execution or error listeners (also
    ones set on the Engine class), when a client is created. Such a client keeps
    SQLAlchemy's execution path, which costs it client CPU (DriverStatement) but skips no
    one's log or instrumentation."""
    if engine.echo or logging.getLogger(_ENGINE_LOGGER).isEnabledFor(logging.INFO):
        return True
    if len(engine.dialect.dispatch.handle_error):
        return True
    return any(len(getattr(engine.dispatch, name)) for name in _WATCHING_EVENTS)


MSSQL_DRIVER = "ODBC Driver 18 for SQL Server"
MSODBC_HOWTO = (
    "install Microsoft's msodbcsql18 (Debian/Ubuntu: add packages.microsoft.com's apt repository, "
    "then `ACCEPT_EULA=Y apt-get install msodbcsql18 unixodbc`; see "
    "https://learn.microsoft.com/sql/connect/odbc/linux-mac/installing-the-microsoft-odbc-driver-for-sql-server)"
)


@dataclass(frozen=True)
class Adapter:
    """What differs per engine, in one place.

    Statements come from sql/<sql_dir>/*.sql like all other SQL; this class only knows
    which file holds them, how a section splits into batches, and what the driver needs.
    """

    dialect: str
    sql_dir: str
    # On SQL Server a review script (`install --sql`) never connects: it is the complete
    # script, written for a DBA who may review it on a machine without the ODBC driver.
    # On PostgreSQL it starts from the database's current catalog version when a URL is given.
    review_script_connects: bool = True

    @property
    def can_listen(self) -> bool:
        """Consumers can sleep until notified (LISTEN/NOTIFY); SQL Server consumers poll (queuectl.worker)."""
        return self.dialect == "postgresql"

    def _sql(self, file: str, section: str, values: dict[str, str | int] | None = None) -> str:
        from queuectl.sqlfiles import render

        return render(self.sql_dir, file, section, values or {})

    def split_batches(self, sql: str) -> list[str]:
        """One section's text as the units a driver executes one by one: on PostgreSQL the
        statements at top-level semicolons."""
        from queuectl.sqlfiles import split_statements

        return split_statements(sql)

    def check_driver(self, url: URL) -> None:
        """Fail with one line saying what to install when the DBAPI driver cannot load."""

    def connect_args(self) -> dict[str, object]:
        """Login timeout in seconds, so an unreachable server fails fast."""
        return {"connect_timeout": 10}

    def client_statement(self, engine: Engine, clause: sa.TextClause) -> Callable[[sa.Connection, dict], object]:
        """How a client runs one of its hot calls (enqueue, dequeue, ack, ...): on psycopg,
        straight on the driver connection (DriverStatement), unless someone watches the
        engine's statements (statements_watched): then through Connection.execute, so its
        log and its event listeners see every call. The result answers keys(), all(),
        scalar_one() and scalars()."""
        if statements_watched(engine):
            return through_sqlalchemy(clause)
        return DriverStatement(engine, clause)

    # -- what a failed statement means -------------------------------------------------

    # SQLSTATEs of a statement the server canceled and rolled back: query_canceled
    # (statement_timeout, pg_cancel_backend) and lock_not_available (lock_timeout).
    _CANCELED = ("57014", "55P03")

    def payload_refusal(self, exc: DBAPIError) -> str | None:
        """The server's message when an enqueue refused an oversized payload (reliable_0003:
        SQLSTATE QC413), else None."""
        orig = exc.orig
        if getattr(orig, "sqlstate", None) != "QC413":
            return None
        diag = getattr(orig, "diag", None)
        return getattr(diag, "message_primary", None) or first_line(orig)

    def canceled(self, exc: DBAPIError) -> bool:
        """The server canceled the statement (a timeout): it rolled back whole."""
        return getattr(exc.orig, "sqlstate", None) in self._CANCELED

    # -- how the client's values travel ------------------------------------------------

    def list_param(self, values: list) -> object:
        """A list as one bind value: a PostgreSQL array."""
        return values

    def id_array(self, ids: list[int]) -> object:
        """The client's item ids (always CAST to bigint[] in its SQL) as one bind value, in
        binary format: psycopg's text format formats and checks every element in Python."""
        return BinaryArray(ids)

    def payload_array(self, payloads: list[bytes]) -> object:
        """Payloads (bytea[]) as one bind value in binary format. In text format psycopg
        escapes every element in Python (a regex substitution per element) and the server
        parses the hex back: 1.6 ms of client CPU per 100 x 300 B against 0.18 ms in binary
        (2026-11-23, 2 cores; bench/RESULTS.md, series 6)."""
        return BinaryArray(payloads)

    def json_value(self, value: object) -> object:
        """A JSON column as Python: psycopg already decodes jsonb."""
        return value

    def enqueue_many_params(self, items: list[dict[str, object]], max_attempts: int | None) -> dict[str, object]:
        """enqueue_many's bind values from per-item dicts (payload bytes, headers JSON text,
        priority, delay seconds, title): parallel arrays on PostgreSQL.

        An array holding only defaults goes as NULL (the function pads it with defaults):
        adapting and sending three arrays per batch was a fifth of a producer's time (py-spy).
        Delays are formatted with fixed decimals: `f"{7e-05} seconds"` is not an interval.
        """
        priorities = [item["priority"] for item in items]
        delays = [item["delay"] for item in items]
        titles = [item["title"] for item in items]
        with_headers = any(item["headers"] is not None for item in items)
        return {
            "payloads": self.payload_array([item["payload"] for item in items]),
            "headers": [item["headers"] for item in items] if with_headers else None,
            "priorities": priorities if any(priorities) else None,
            "delays": [f"{d:.6f} seconds" for d in delays] if any(delays) else None,
            "titles": titles if any(t is not None for t in titles) else None,
            "max_attempts": max_attempts,
        }

    def kind_enqueue_many_params(
        self,
        payloads: list[bytes],
        headers: list[str | None] | None,
        due_ats: list[datetime | None] | None = None,
        delays: list[float] | None = None,
    ) -> dict[str, object]:
        """enqueue_many's bind values for the other kinds (queuectl.kinds): payloads, headers
        JSON texts, and for pending queues due times (aware, UTC) and delays in seconds;
        parallel arrays on PostgreSQL."""
        params: dict[str, object] = {"payloads": self.payload_array(payloads), "headers": headers}
        if delays is not None:
            params.update(due_ats=due_ats, delays=[timedelta(seconds=d) for d in delays])
        return params

    @property
    def advice_words(self) -> "PostgresWords":
        """The words of health's advice on this engine (VACUUM, pg_terminate_backend, ...)."""
        from queuectl.advice import PostgresWords

        return PostgresWords()

    @property
    def index_upkeep(self) -> "IndexUpkeep":
        """How this engine measures, judges and maintains an index (the reorganize and
        inspect jobs' seam): pgstatindex, REINDEX CONCURRENTLY and VACUUM here."""
        from queuectl.jobs.upkeep import PostgresIndexUpkeep

        return PostgresIndexUpkeep()

    def storage_health(self, conn: sa.Connection, names: "QueueNames") -> list[dict[str, object]]:
        """Physical health of a queue's tables and indexes, one dict per index (or heap).

        Same keys on both engines: table_name, index_name, pages, live_rows, dead_rows (dead
        tuples / ghost records), version_dead_rows (version ghosts; None on PostgreSQL),
        fragmentation_pct, page_density_pct (None where the engine does not say cheaply).
        """
        sql = self._sql("storage", "storage_health", names.template_values())
        rows = conn.execute(sa.text(sql), {"schema": names.schema, "queue": names.queue}).mappings()
        return [dict(row) for row in rows]


def _odbc_message(exc: DBAPIError) -> str:
    """pyodbc errors carry (sqlstate, message): the message's first line."""
    args = getattr(exc.orig, "args", ())
    text = args[1] if len(args) > 1 and isinstance(args[1], str) else str(exc.orig or "")
    return first_line(text) if text.strip() else ""


@dataclass(frozen=True)
class MssqlAdapter(Adapter):
    """SQL Server through pyodbc and Microsoft's ODBC Driver 18."""

    def client_statement(self, engine: Engine, clause: sa.TextClause) -> Callable[[sa.Connection, dict], object]:
        """Through SQLAlchemy's Connection.execute: its text() turns the named binds into
        pyodbc's `?` markers, and nobody has measured pyodbc's own cost here."""
        return through_sqlalchemy(clause)

    def split_batches(self, sql: str) -> list[str]:
        """Batches separated by `GO` lines, as sqlcmd and SSMS split them (a CREATE
        PROCEDURE must be alone in its batch)."""
        from queuectl.sqlfiles import split_go_batches

        return split_go_batches(sql)

    @property
    def advice_words(self) -> "PostgresWords":
        """Ghost records, the version store, KILL <session>, ALTER INDEX ... REORGANIZE."""
        from queuectl.advice import MssqlWords

        return MssqlWords()

    @property
    def index_upkeep(self) -> "IndexUpkeep":
        """sys.dm_db_index_physical_stats, ALTER INDEX ... REORGANIZE / REBUILD (ONLINE,
        RESUMABLE where the edition allows) and UPDATE STATISTICS."""
        from queuectl.jobs.upkeep import MssqlIndexUpkeep

        return MssqlIndexUpkeep()

    def check_driver(self, url: URL) -> None:
        try:
            import pyodbc
        except ModuleNotFoundError:
            raise ConnectionFailed(
                "SQL Server needs the pyodbc package: pip install 'queuectl[mssql]', and " + MSODBC_HOWTO
            ) from None
        except ImportError as exc:  # pyodbc is there but the unixODBC library is not
            raise ConnectionFailed(
                f"pyodbc cannot load ({first_line(exc)}): no ODBC driver manager: " + MSODBC_HOWTO
            ) from None
        wanted = url.query.get("driver", MSSQL_DRIVER)
        if wanted not in pyodbc.drivers():
            found = ", ".join(pyodbc.drivers()) or "none"
            raise ConnectionFailed(
                f"ODBC driver {wanted!r} is not installed (installed: {found}): " + MSODBC_HOWTO
            )

    def connect_args(self) -> dict[str, object]:
        return {"timeout": 10}  # pyodbc's login timeout

    def payload_refusal(self, exc: DBAPIError) -> str | None:
        """THROW 50413 in the enqueue procedures; the message without ODBC's [..] prefixes."""
        text = _odbc_message(exc)
        if "(50413)" not in text:
            return None
        return re.sub(r"^(\[[^\]]*\]\s*)+", "", text).split(" (50413)")[0]

    def canceled(self, exc: DBAPIError) -> bool:
        """Lock request time out (1222) or the client's query timeout (HYT00)."""
        args = getattr(exc.orig, "args", ())
        return (bool(args) and args[0] == "HYT00") or "(1222)" in _odbc_message(exc)

    def list_param(self, values: list) -> object:
        """ODBC has no arrays: a JSON array, read by OPENJSON in the procedures."""
        return json.dumps(values)

    def id_array(self, ids: list[int]) -> object:
        """Item ids as a JSON array, like any list here."""
        return self.list_param(ids)

    def json_value(self, value: object) -> object:
        """JSON columns are nvarchar on SQL Server."""
        return json.loads(value) if isinstance(value, str) else value

    def enqueue_many_params(self, items: list[dict[str, object]], max_attempts: int | None) -> dict[str, object]:
        """One JSON array of item objects; payloads as hex (CONVERT style 2 decodes them)."""
        doc = [
            {
                "payload": bytes(item["payload"]).hex(),
                "headers": None if item["headers"] is None else json.loads(item["headers"]),
                "priority": item["priority"],
                "delay": item["delay"],
                "title": item["title"],
            }
            for item in items
        ]
        return {"items": json.dumps(doc), "max_attempts": max_attempts}

    def kind_enqueue_many_params(
        self,
        payloads: list[bytes],
        headers: list[str | None] | None,
        due_ats: list[datetime | None] | None = None,
        delays: list[float] | None = None,
    ) -> dict[str, object]:
        """One JSON array of item objects, read by OPENJSON in the kinds' enqueue_many
        procedures: payload as hex, headers as JSON, due_at as naive UTC (datetime2), delay."""
        doc: list[dict[str, object]] = []
        for i, payload in enumerate(payloads):
            item: dict[str, object] = {
                "payload": bytes(payload).hex(),
                "headers": None if headers is None or headers[i] is None else json.loads(headers[i]),
            }
            if delays is not None:
                due = None if due_ats is None else due_ats[i]
                item["due_at"] = None if due is None else due.astimezone(timezone.utc).replace(tzinfo=None).isoformat()
                item["delay"] = delays[i]
            doc.append(item)
        return {"items": json.dumps(doc)}


ADAPTERS = {
    "postgresql": Adapter("postgresql", "postgresql"),
    "mssql": MssqlAdapter("mssql", "mssql", review_script_connects=False),
}


def adapter_for_url(url: str | URL) -> Adapter:
    """The adapter for a URL's dialect, without connecting (and without loading a driver)."""
    text = url.render_as_string(hide_password=False) if isinstance(url, URL) else url
    return ADAPTERS[parse_url(text).get_backend_name()]


def adapter_for(engine_or_conn: Engine | sa.Connection) -> Adapter:
    return ADAPTERS[engine_or_conn.dialect.name]


# Keywords whose value is a secret in URL queries and in libpq / ODBC connection strings.
_SECRET_KEYWORDS = ("password", "sslpassword", "pwd")
_SECRET_PARAM = re.compile(
    r"(?i)\b(password|sslpassword|pwd)(\s*=\s*)('(?:[^'\\]|\\.)*'|\{(?:[^}]|\}\})*\}|[^\s&;'\"]+)"
)
# scheme://user:PASSWORD@host: the password runs to the last '@' before the query, as
# browsers read a URL (WHATWG), so an unescaped '@' in it does not cut it short.
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][\w+.-]*://[^:/?#@\s]*:)([^?#\s]*)(@)")
MASK = "***"


def hide_secrets(text: str, url: str | URL | None = None) -> str:
    """`text` as it may be shown: the password of every URL in it, every password= /
    sslpassword= / PWD= value (URL queries, libpq and ODBC connection strings), and the
    secrets of `url` wherever they occur (raw or percent-encoded), replaced by ***."""
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + MASK + m.group(3), text)
    text = _SECRET_PARAM.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
    for secret in url_secrets(url) if url is not None else ():
        for form in dict.fromkeys((secret, quote(secret, safe=""), quote_plus(secret), quote(secret))):
            text = text.replace(form, MASK)
    return text


def url_secrets(url: str | URL) -> list[str]:
    """The secrets a URL holds: its password, secret query parameters, PWD= in odbc_connect."""
    try:
        parsed = read_url(url)
    except UsageError:
        return []
    found = [str(parsed.password)] if parsed.password else []
    for key, value in parsed.query.items():
        for item in value if isinstance(value, tuple) else (value,):
            if key.lower() in _SECRET_KEYWORDS:
                found.append(item)
            else:
                found += [m.group(3).strip("'{}") for m in _SECRET_PARAM.finditer(item)]
    return [secret for secret in found if secret]


def mask_url(url: str | URL) -> str:
    """The URL as it may be shown: its password, and every secret in its query, as ***."""
    try:
        parsed = read_url(url)
    except UsageError:
        return "<unparsable URL>"
    shown = parsed
    if parsed.password and not parsed.username:  # libpq's form: user and password in the query
        shown = parsed.set(password=None).update_query_dict({"password": MASK})
    return hide_secrets(shown.render_as_string(hide_password=True), parsed).replace(quote_plus(MASK), MASK)


def read_url(url: str | URL) -> URL:
    """A URL as SQLAlchemy reads it, with its password where SQLAlchemy hides it when shown.

    Two forms would otherwise show it: an unescaped '@' in the password (`u:p@ss@host`: the
    user part runs to the last '@', as browsers read it) and `?password=...` (which libpq
    accepts): its value becomes the URL's password. Errors never show the URL."""
    if isinstance(url, URL):
        parsed = url
    else:
        scheme, sep, rest = url.partition("://")
        head, query_sep, query = rest.partition("?")
        if sep and head.count("@") > 1:
            userinfo, _, hostpart = head.rpartition("@")
            url = f"{scheme}://{userinfo.replace('@', '%40')}@{hostpart}{query_sep}{query}"
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise UsageError("invalid database URL: expected e.g. postgresql://user@host:5432/dbname") from None
        except ValueError:  # the port part is not a number
            raise UsageError(
                "invalid database URL: the port is not a number (expected e.g. postgresql://user@host:5432/dbname)"
            ) from None
    password = parsed.query.get("password")
    if password is not None:
        password = password[-1] if isinstance(password, tuple) else password
        parsed = parsed.difference_update_query(["password"]).set(password=password)
    return parsed


def parse_url(url: str) -> URL:
    """Validate a database URL and pin the driver queuectl uses for its dialect."""
    parsed = read_url(url)
    backend = parsed.get_backend_name()
    if backend in ("postgres",):
        backend = "postgresql"
    if backend not in _DRIVERS:
        raise UsageError(
            f"unsupported database dialect {backend!r} in {mask_url(parsed)}: "
            "queuectl supports postgresql and mssql"
        )
    parsed = parsed.set(drivername=f"{backend}+{_DRIVERS[backend]}")
    if backend == "mssql" and "driver" not in parsed.query:
        parsed = parsed.update_query_dict({"driver": MSSQL_DRIVER})
    return parsed


def check_not_empty(url: str | None) -> None:
    """`--url "$DB"` with DB unset must not silently work on another database."""
    if url is not None and not url.strip():
        raise UsageError("the database URL is empty: give one (e.g. postgresql://user@host:5432/dbname) or leave --url out")


def resolve_url(url: str | None) -> str:
    """--url, else $QUEUECTL_URL, else the embedded server (started on first use)."""
    check_not_empty(url)
    if url:
        return url
    if os.environ.get(URL_ENV):
        return os.environ[URL_ENV]
    from queuectl.embedded import EmbeddedServer, EmbeddedServerError

    try:
        return EmbeddedServer().ensure_running()
    except EmbeddedServerError as exc:
        raise ConnectionFailed(f"embedded PostgreSQL: {exc}") from None


def with_password_file(url: URL) -> URL:
    """The URL with the password read from $QUEUECTL_PASSWORD_FILE (its first line) when the
    URL has none: a password that never appears in a command line or a URL."""
    path = os.environ.get(PASSWORD_FILE_ENV)
    if not path or url.password:
        return url
    try:
        with open(path, encoding="utf-8") as fh:
            password = fh.readline().rstrip("\r\n")
    except OSError as exc:
        raise UsageError(f"cannot read the password file {path} (${PASSWORD_FILE_ENV}): {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"the password file {path} (${PASSWORD_FILE_ENV}) is not UTF-8 text") from None
    if not password:
        raise UsageError(f"the password file {path} (${PASSWORD_FILE_ENV}) is empty: its first line is the password")
    return url.set(password=password)


def make_engine(url: str | None = None, *, pool_size: int = 5) -> Engine:
    """An engine for the resolved URL; fails with a one-line error when unreachable."""
    parsed = with_password_file(parse_url(resolve_url(url)))
    adapter = ADAPTERS[parsed.get_backend_name()]
    adapter.check_driver(parsed)
    engine = sa.create_engine(
        parsed, pool_size=pool_size, pool_pre_ping=True, connect_args=adapter.connect_args()
    )
    check_connection(engine)
    return engine


def check_connection(engine: Engine) -> None:
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except DBAPIError as exc:
        reason = hide_secrets(first_line(exc.orig), engine.url)
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
    try:
        conn.invalidate()
        conn.close()
    except sa.exc.SQLAlchemyError:
        pass


def first_line(exc: BaseException | None) -> str:
    text = str(exc or "").strip()
    return text.splitlines()[0] if text else type(exc).__name__
