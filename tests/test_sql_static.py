"""No SQL text is built from variables in library code, except through the quoting helpers.

SQL reaches the database from sql/<engine>/*.sql (sqlfiles.render fills {{placeholders}}
only with QueueNames.template_values(), quote_ident() results or ints) or from SQLAlchemy
constructs. This test reads the AST of every module under toolkit/, jobs/, bench/ and
migrations/ and looks at each call that takes SQL text -- text(), execute(),
exec_driver_sql(), executemany() -- and at each string that starts like a SQL statement:

* an f-string, `%`-format, `.format()` or `+` concatenation passed as that SQL text, or
  bound to a name that is then passed, is a finding;
* so is any f-string (anywhere) whose text starts with a SQL statement keyword;
* unless it is in ALLOWED (file, function) and every value it interpolates is a call of
  a quoting helper from queuectl.names (quote_ident, QueueNames.qualified/catalog_table).

A planted snippet proves that the check finds what it is meant to find.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("toolkit", "jobs", "bench", "migrations")
SQL_SINKS = {"text", "execute", "exec_driver_sql", "executemany"}
QUOTING_HELPERS = {"quote_ident", "qualified", "catalog_table"}
STATEMENT_START = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|GRANT|REVOKE|VACUUM|REINDEX|TRUNCATE|"
    r"WITH|COPY|EXEC|ANALYZE|CLUSTER)\b",  # not LISTEN, SET, ...: log lines start so too
)

# Places allowed to build SQL text in Python, and why. Each may interpolate only the
# quoting helpers' results (checked below), never a raw value.
ALLOWED = {
    ("toolkit/engine/embedded.py", "_ensure_database"):
        "CREATE DATABASE for the embedded server, before any engine exists; the database "
        "and role names are module constants, quoted by quote_ident (no bind parameter "
        "can stand for an identifier)",
    ("bench/lab/health.py", "_write_sample"):
        "VACUUM (ANALYZE) of a bench queue's table for the health sample; VACUUM takes no "
        "bind parameters, the table name comes from QueueNames.qualified",
    ("bench/lab/ring_large.py", "_vacuum"):
        "VACUUM of a lab ring's tables between measurements; the table name comes from QueueNames.qualified",
    ("bench/lab/ring_large.py", "_autovacuum_off"):
        "ALTER TABLE ... SET (autovacuum_enabled = false) on a lab ring's tables, so a run shows the ring's "
        "own mechanism; the table name comes from QueueNames.qualified",
}


def _dynamic(node: ast.AST) -> bool:
    """A string built at run time from parts."""
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.FormattedValue) for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
        return _stringish(node.left) or _stringish(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _stringish(node.func.value)
    if isinstance(node, ast.IfExp):
        return _dynamic(node.body) or _dynamic(node.orelse)
    return False


def _stringish(node: ast.AST) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)) or isinstance(node, ast.JoinedStr) or _dynamic(node)


def _leading_text(node: ast.AST) -> str:
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))[:40]
    return ""


def _only_quoting_helpers(node: ast.AST) -> bool:
    """Every interpolated value of the f-string is a call of a quoting helper."""
    if not isinstance(node, ast.JoinedStr):
        return False
    for value in node.values:
        if isinstance(value, ast.FormattedValue):
            call = value.value
            if not isinstance(call, ast.Call):
                return False
            func = call.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name not in QUOTING_HELPERS:
                return False
    return True


def findings(source: str, filename: str) -> list[str]:
    """SQL built from variables in `source`, outside ALLOWED; as 'file:line: what'."""
    tree = ast.parse(source)
    found: list[str] = []

    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    in_functions = {id(m) for f in functions for m in ast.walk(f)}
    scopes = [("<module>", [n for n in ast.walk(tree) if id(n) not in in_functions])]
    scopes += [(f.name, list(ast.walk(f))) for f in functions]

    for scope_name, own in scopes:
        built: dict[str, ast.AST] = {}
        for node in own:
            if isinstance(node, ast.Assign) and _dynamic(node.value):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        built[target.id] = node.value
        allowed = (filename, scope_name) in ALLOWED

        def report(node: ast.AST, expr: ast.AST, what: str) -> None:
            if allowed and _only_quoting_helpers(expr):
                return
            found.append(f"{filename}:{node.lineno}: {what}: {ast.unparse(expr)[:100]}")

        for node in own:
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name in SQL_SINKS:
                    arg = node.args[0]
                    if _dynamic(arg):
                        report(node, arg, f"SQL text built in a {name}() call")
                    elif isinstance(arg, ast.Name) and arg.id in built:
                        report(node, built[arg.id], f"SQL text built into {arg.id!r}, passed to {name}()")
            if isinstance(node, ast.JoinedStr) and _dynamic(node) and STATEMENT_START.match(_leading_text(node)):
                report(node, node, "f-string SQL statement")
    return sorted(set(found))


def library_files() -> list[Path]:
    return sorted(p for folder in LIBRARY for p in (ROOT / folder).rglob("*.py"))


def test_library_code_builds_no_sql_from_variables():
    problems = []
    for path in library_files():
        problems += findings(path.read_text("utf-8"), str(path.relative_to(ROOT)))
    assert problems == [], "SQL built from variables (move it to sql/<engine>/*.sql or quote through queuectl.names):\n" + "\n".join(problems)


def test_every_allowed_place_exists_and_builds_sql():
    """An allowlist entry whose place is gone or no longer builds SQL is stale: drop it."""
    for (filename, function), reason in ALLOWED.items():
        tree = ast.parse((ROOT / filename).read_text("utf-8"))
        bodies = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
        assert bodies, f"{filename}:{function} no longer exists"
        assert any(isinstance(n, ast.JoinedStr) and STATEMENT_START.match(_leading_text(n))
                   for n in ast.walk(bodies[0])), f"{filename}:{function} builds no SQL any more"
        assert reason


PLANTED = '''
import sqlalchemy as sa

def drop(conn, name, schema):
    conn.execute(sa.text(f"DROP TABLE {schema}.{name}"))            # f-string in text()
    conn.exec_driver_sql("DELETE FROM t WHERE k = '%s'" % name)       # % formatting
    sql = "SELECT * FROM {}".format(name)
    conn.execute(sa.text(sql))                                       # built, then passed
    conn.execute(sa.text("TRUNCATE " + name))                        # concatenation
    statement = f"VACUUM {name}"                                     # SQL-looking f-string
    return statement

def fine(conn, names):
    conn.execute(sa.text("SELECT 1"))
    conn.execute(sa.text("SELECT :v"), {"v": 1})
    message = f"queue {names.queue} not found"                       # a message, not SQL
    return message
'''


def test_the_check_finds_every_planted_way_of_building_sql():
    found = findings(PLANTED, "planted.py")
    lines = sorted({int(f.split(":")[1]) for f in found})
    assert lines == [5, 6, 8, 9, 10], found
    assert not any("fine" in f or "SELECT 1" in f for f in found)


def test_an_allowed_place_may_interpolate_only_quoting_helpers(monkeypatch):
    source = '''
def _ensure_database(conn, name):
    conn.execute(f'CREATE DATABASE {quote_ident(name)}')
    conn.execute(f'CREATE DATABASE "{name}"')
'''
    found = findings(source, "toolkit/engine/embedded.py")
    assert {f.split(":")[1] for f in found} == {"4"}, found
