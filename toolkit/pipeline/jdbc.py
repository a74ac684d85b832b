"""How Spark reaches the database: the JDBC driver jar and the JDBC URL.

No Maven repository is assumed reachable, so the driver jar is found on disk, in this
order: an explicit path (--jdbc-jar), $QUEUECTL_JDBC_JAR, the system's Java library folder
(/usr/share/java, where Debian's libpostgresql-jdbc-java puts it), the local Maven
repository (~/.m2). The JDBC URL is derived from the SQLAlchemy URL; the user name and
password travel as JDBC connection properties, never inside the URL, so nothing printed
(masked SQLAlchemy URL, JDBC URL) contains the secret.

SQL Server (documented, not exercised by the pipeline yet): the jar is Microsoft's
mssql-jdbc (`com.microsoft.sqlserver:mssql-jdbc`, e.g. mssql-jdbc-12.8.1.jre11.jar), the
driver class com.microsoft.sqlserver.jdbc.SQLServerDriver, and
    mssql+pyodbc://user:pw@host:1433/db?TrustServerCertificate=yes
maps to
    jdbc:sqlserver://host:1433;databaseName=db;trustServerCertificate=true
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from sqlalchemy.engine import URL

from queuectl.engine.urls import mask_url, parse_url
from queuectl.errors import UsageError

JAR_ENV = "QUEUECTL_JDBC_JAR"


@dataclass(frozen=True)
class JdbcDriver:
    """Where a dialect's driver is looked for, and what to tell the user when it is not."""

    driver_class: str
    system_globs: tuple[str, ...]
    maven_globs: tuple[str, ...]
    install_hint: str


DRIVERS = {
    "postgresql": JdbcDriver(
        driver_class="org.postgresql.Driver",
        system_globs=("/usr/share/java/postgresql*.jar",),
        maven_globs=("~/.m2/repository/org/postgresql/postgresql/*/postgresql-*.jar",),
        install_hint=(
            "install Debian's libpostgresql-jdbc-java (apt-get install libpostgresql-jdbc-java), "
            f"or give the jar with --jdbc-jar or ${JAR_ENV}"
        ),
    ),
    "mssql": JdbcDriver(
        driver_class="com.microsoft.sqlserver.jdbc.SQLServerDriver",
        system_globs=("/usr/share/java/mssql-jdbc*.jar",),
        maven_globs=("~/.m2/repository/com/microsoft/sqlserver/mssql-jdbc/*/mssql-jdbc-*.jar",),
        install_hint=(
            "download Microsoft's mssql-jdbc jar (com.microsoft.sqlserver:mssql-jdbc) and give it "
            f"with --jdbc-jar or ${JAR_ENV}"
        ),
    ),
}


def find_jdbc_jar(dialect: str, explicit: str | None = None) -> Path:
    """The driver jar for `dialect`, found without network access, or a one-line error."""
    driver = _driver(dialect)
    for source, given in (("--jdbc-jar", explicit), (f"${JAR_ENV}", os.environ.get(JAR_ENV))):
        if given:
            path = Path(given).expanduser()
            if not path.is_file():
                raise UsageError(f"{source} points at {path}, which is not a file")
            return path.absolute()
    for pattern in driver.system_globs + driver.maven_globs:
        # Newest name last in sorted order; prefer real files over the versionless symlink.
        found = sorted(glob.glob(os.path.expanduser(pattern)))
        found = [f for f in found if not f.endswith(("-sources.jar", "-javadoc.jar"))]
        if found:
            return Path(found[-1]).resolve()
    raise UsageError(f"no {dialect} JDBC driver jar found: {driver.install_hint}")


def _driver(dialect: str) -> JdbcDriver:
    try:
        return DRIVERS[dialect]
    except KeyError:
        raise UsageError(f"no JDBC mapping for dialect {dialect!r}") from None


@dataclass(frozen=True)
class JdbcTarget:
    """A JDBC URL without credentials, plus the properties Spark passes to the driver."""

    url: str
    driver_class: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    shown: str = ""  # the masked SQLAlchemy URL, for messages

    def spark_options(self) -> dict[str, str]:
        options = {"url": self.url, "driver": self.driver_class}
        if self.user:
            options["user"] = self.user
        if self.password:
            options["password"] = self.password
        return options


def jdbc_target(sqlalchemy_url: str | URL) -> JdbcTarget:
    """Map a SQLAlchemy URL to JDBC. A Unix-socket URL of queuectl's embedded server is
    swapped for its TCP address (JDBC has no socket support); other socket URLs are refused."""
    url = parse_url(str(sqlalchemy_url) if isinstance(sqlalchemy_url, URL) else sqlalchemy_url)
    if isinstance(sqlalchemy_url, URL) and sqlalchemy_url.password:
        url = url.set(password=sqlalchemy_url.password)
    dialect = url.get_backend_name()
    if dialect == "postgresql":
        url = _tcp_url(url)
        return _postgresql(url)
    if dialect == "mssql":
        return _mssql(url)
    raise UsageError(f"no JDBC mapping for dialect {dialect!r}")


def _tcp_url(url: URL) -> URL:
    socket_dir = url.query.get("host")
    if isinstance(socket_dir, tuple):
        socket_dir = socket_dir[0]
    if url.host and not url.host.startswith("/") and not socket_dir:
        return url
    socket_dir = socket_dir or url.host
    if not socket_dir:
        raise UsageError(
            f"{mask_url(url)} has no host: Spark's JDBC reads need a TCP address (host:port)"
        )
    home = Path(unquote(socket_dir)).parent
    if (home / "server.json").is_file():
        from queuectl.engine.embedded import EmbeddedServer

        tcp = parse_url(EmbeddedServer(home).tcp_url(url.database or "queuectl"))
        return tcp
    raise UsageError(
        f"{mask_url(url)} connects through a Unix socket, which JDBC cannot use: "
        "give a TCP URL (postgresql://user:password@host:5432/db)"
    )


def _postgresql(url: URL) -> JdbcTarget:
    host = url.host or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    query = {k: (v[0] if isinstance(v, tuple) else v) for k, v in url.query.items()}
    params = []
    # libpq options that pgjdbc understands under the same name.
    for key in ("sslmode", "sslrootcert", "sslcert", "sslkey", "application_name", "options"):
        if key in query:
            params.append(f"{key}={query[key]}")
    if "connect_timeout" in query:
        params.append(f"connectTimeout={query['connect_timeout']}")
    suffix = ("?" + "&".join(params)) if params else ""
    jdbc = f"jdbc:postgresql://{host}:{url.port or 5432}/{url.database or ''}{suffix}"
    return JdbcTarget(jdbc, DRIVERS["postgresql"].driver_class, url.username, url.password, mask_url(url))


def _mssql(url: URL) -> JdbcTarget:
    query = {k.lower(): (v[0] if isinstance(v, tuple) else v) for k, v in url.query.items()}
    parts = [f"jdbc:sqlserver://{url.host or 'localhost'}:{url.port or 1433}"]
    if url.database:
        parts.append(f"databaseName={url.database}")
    if "encrypt" in query:
        parts.append(f"encrypt={'true' if query['encrypt'].lower() in ('yes', 'true', 'mandatory') else 'false'}")
    if "trustservercertificate" in query:
        parts.append(
            f"trustServerCertificate={'true' if query['trustservercertificate'].lower() in ('yes', 'true') else 'false'}"
        )
    return JdbcTarget(";".join(parts), DRIVERS["mssql"].driver_class, url.username, url.password, mask_url(url))
