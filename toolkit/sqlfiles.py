"""Load named SQL texts from sql/<engine>/<file>.sql and fill their identifiers.

A file is a list of sections, each opened by a header line ``-- name: <section>`` and a
comment saying what it does (Procrastinate's queries.sql habit). Templates name
identifiers as ``{{meta}}``; they are filled only from QueueNames.template_values() or
from validated integers, through render() below.

sql/<engine>/<file>.sql holds what a fresh install creates today, so a reader sees a kind's
current API top to bottom. A body that a later revision replaced, kept for queues installed
at an older revision and for downgrades, is named for the revision that installed it
(``create_dequeue_0005``) and lives in sql/<engine>/history/<file>.sql. One rule finds a
section: a name ending in a four-digit revision is read from the history file, or, when that
file does not hold it, is still today's section of the name without the suffix (the body has
not changed on that engine since the revision).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib import resources

from queuectl.errors import QueuectlError

_HEADER = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"\{\{([a-z_][a-z0-9_]*)\}\}")
_REVISION = re.compile(r"^(?P<current>[a-z_][a-z0-9_]*?)_[0-9]{4}$")
HISTORY = "history"


@cache
def sections(engine: str, file: str, *, history: bool = False) -> dict[str, str]:
    """All sections of sql/<engine>/<file>.sql (today's), or of sql/<engine>/history/<file>.sql
    (bodies that later revisions replaced; an engine without any has no such file), by name."""
    folder = resources.files("queuectl.sql").joinpath(engine)
    path = folder.joinpath(HISTORY, f"{file}.sql") if history else folder.joinpath(f"{file}.sql")
    if history and not path.is_file():
        return {}
    where = f"sql/{engine}/{HISTORY}/{file}.sql" if history else f"sql/{engine}/{file}.sql"
    parts = _HEADER.split(path.read_text("utf-8"))
    found: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in found:
            raise QueuectlError(f"{where} defines section {name!r} twice")
        if bool(_REVISION.match(name)) != history:
            raise QueuectlError(f"{where}: section {name!r} belongs in the "
                                f"{'current' if history else 'history'} file")
        found[name] = body.strip() + "\n"
    return found


def section(engine: str, file: str, name: str) -> str:
    """The text of one section, found by the module's rule (see the docstring above)."""
    revision = _REVISION.match(name)
    if revision:
        kept = sections(engine, file, history=True).get(name)
        if kept is not None:
            return kept
        name = revision.group("current")
    try:
        return sections(engine, file)[name]
    except KeyError:
        raise QueuectlError(f"sql/{engine}/{file}.sql has no section {name!r}") from None


def render(engine: str, file: str, name: str, values: Mapping[str, str | int]) -> str:
    """The section's SQL with every {{placeholder}} filled; a missing value is an error."""
    template = section(engine, file, name)

    def fill(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise QueuectlError(f"sql/{engine}/{file}.sql:{name} needs a value for {{{{{key}}}}}")
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise QueuectlError(f"template value {key!r} must be a quoted identifier or an int")
        return str(value)

    return _PLACEHOLDER.sub(fill, template)


def split_statements(sql: str) -> list[str]:
    """Split a section into statements at top-level semicolons.

    Aware of 'strings', "identifiers", -- comments and $tag$ bodies, which is all our own
    SQL files use; it exists because a driver runs one statement per prepared execute.
    """
    statements: list[str] = []
    start = i = 0
    n = len(sql)
    while i < n:
        c = sql[i]
        if c == "-" and sql.startswith("--", i):
            i = sql.find("\n", i)
            i = n if i < 0 else i
        elif c in ("'", '"'):
            i = sql.find(c, i + 1)
            if i < 0:
                raise QueuectlError("unterminated quote in SQL text")
        elif c == "$":
            tag = re.match(r"\$[A-Za-z_]*\$", sql[i:])
            if tag:
                end = sql.find(tag.group(0), i + len(tag.group(0)))
                if end < 0:
                    raise QueuectlError(f"unterminated {tag.group(0)} body in SQL text")
                i = end + len(tag.group(0)) - 1
        elif c == ";":
            statements.append(sql[start:i])
            start = i + 1
        i += 1
    statements.append(sql[start:])
    cleaned = (_strip_comment_lines(s) for s in statements)
    return [s for s in cleaned if s]


_GO_LINE = re.compile(r"^[ \t]*GO[ \t]*;?[ \t]*$", re.MULTILINE | re.IGNORECASE)


def split_go_batches(sql: str) -> list[str]:
    """Split a T-SQL section into batches at lines holding only `GO` (sqlcmd's separator).

    GO is not T-SQL: the client sends each batch on its own. Our T-SQL files never put GO
    inside a string or a block comment, so a line-based split is exact for them. A final
    semicolon is dropped (Alembic's --sql output appends its own terminator).
    """
    batches = (_strip_comment_lines(b).rstrip(";").rstrip() for b in _GO_LINE.split(sql))
    return [b for b in batches if b]


def _strip_comment_lines(statement: str) -> str:
    lines = [ln for ln in statement.strip().splitlines() if not ln.lstrip().startswith("--")]
    return "\n".join(lines).strip()
