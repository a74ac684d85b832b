"""Database URLs and the secrets in them: parsing, the password file, and masking.

Every text queuectl shows that may hold a URL or a server's error message passes through
here first: mask_url for a URL (SQLAlchemy's own URL.render_as_string(hide_password=True),
plus the secrets of its query), hide_secrets for free text, error_text for one line of an
error.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING
from urllib.parse import quote, quote_plus

from queuectl.errors import UsageError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL, Engine

URL_ENV = "QUEUECTL_URL"
PASSWORD_FILE_ENV = "QUEUECTL_PASSWORD_FILE"
MSSQL_DRIVER = "ODBC Driver 18 for SQL Server"
_DRIVERS = {"postgresql": "psycopg", "mssql": "pyodbc"}


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
    if not isinstance(url, str):
        parsed = url
    else:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

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


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a PostgreSQL error: psycopg's, on the driver error SQLAlchemy wraps
    (`exc.orig`) or on the driver error itself; None for other errors (pyodbc's keep theirs in
    their arguments: the SQL Server adapter reads those)."""
    return getattr(getattr(exc, "orig", exc), "sqlstate", None)


def first_line(exc: BaseException | None) -> str:
    text = str(exc or "").strip()
    return text.splitlines()[0] if text else type(exc).__name__


def error_text(exc: BaseException, secrets_of: Engine | URL | str | None = None) -> str:
    """One line for an error, as it may be shown: the database's message when there is one
    (else the exception's type and first line), with no password, neither of the URL that
    `secrets_of` (an engine or a URL) holds nor of any URL in the text."""
    orig = getattr(exc, "orig", None)
    text = f"{type(exc).__name__}: {first_line(exc)}" if orig is None else first_line(orig)
    return hide_secrets(text, getattr(secrets_of, "url", secrets_of))
