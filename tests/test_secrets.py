"""A password given in a URL never leaves the process: not on stdout or stderr of any
command, not in logs, not in the text of any error queuectl raises.

The password is distinctive and holds URL-special characters, so it is checked both as
written in the URL (percent-encoded) and decoded. Every command runs twice over TCP with
that password: once logged in for real (a role created for the test), once refused
(wrong password, unknown database, closed port).
"""

from __future__ import annotations

import logging
import sys
import traceback
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from conftest import run_cli
from queuectl.client import Queue
from queuectl.engine import make_engine, mask_url
from queuectl.errors import QueuectlError
from queuectl.health import health_report
from queuectl.install import install_queue
from queuectl.jobs.runner import run_job
from queuectl.jobs.scheduler import Scheduler, load_config

SECRET = "Zq9-s3cr3t@pw:/%x"
ENCODED = quote(SECRET, safe="")


def leaks(text: str | bytes) -> list[str]:
    """Which forms of the password occur in `text`."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return [form for form in (SECRET, ENCODED, "s3cr3t") if form in text]


def tcp_port(server_url: str) -> int:
    parsed = make_url(server_url)
    return int(parsed.port or parsed.query.get("port") or 5432)


@pytest.fixture
def login(admin_engine, server_url, db_url) -> Iterator[dict[str, str]]:
    """A superuser role with the distinctive password, and URLs that use it over TCP."""
    role = f"qt_pw_{uuid.uuid4().hex[:8]}"
    with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        listen = conn.execute(sa.text("SHOW listen_addresses")).scalar()
        assert listen, "the test server must listen on TCP: a socket login may not ask for the password"
        conn.execute(sa.text("SELECT set_config('qt.role', :r, false), set_config('qt.pw', :p, false)"),
                     {"r": role, "p": SECRET})
        conn.execute(sa.text(
            "DO $$ BEGIN EXECUTE format('CREATE ROLE %I LOGIN SUPERUSER PASSWORD %L', "
            "current_setting('qt.role'), current_setting('qt.pw')); END $$"
        ))
    port = tcp_port(server_url)
    database = make_url(db_url).database
    base = f"postgresql://{role}:{ENCODED}@127.0.0.1:{port}"
    urls = {
        "good": f"{base}/{database}",
        "wrong_password": f"postgresql://{role}:{quote(SECRET + 'no', safe='')}@127.0.0.1:{port}/{database}",
        "unknown_database": f"{base}/no_such_db_{uuid.uuid4().hex[:6]}",
        "closed_port": f"postgresql://{role}:{ENCODED}@127.0.0.1:1/{database}",
        "role": role,
    }
    try:
        yield urls
    finally:
        with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"),
                         {"r": role})
        owner = make_engine(db_url)
        try:
            with owner.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(sa.text(f'DROP OWNED BY "{role}" CASCADE'))
        finally:
            owner.dispose()
        with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f'DROP ROLE "{role}"'))


# Every command that takes a URL, as a user would type it; {url} is filled per case.
COMMANDS = [
    ["install", "orders", "--url", "{url}"],
    ["install", "other", "--sql", "--url", "{url}"],
    ["uninstall", "nothere", "--yes", "--url", "{url}"],
    ["list", "--url", "{url}"],
    ["list", "--json", "--url", "{url}"],
    ["upgrade", "--url", "{url}"],
    ["enqueue", "orders", "hello", "--url", "{url}"],
    ["dequeue", "orders", "--url", "{url}"],
    ["health", "--url", "{url}"],
    ["health", "--json", "--url", "{url}"],
    ["health", "orders", "--url", "{url}", "--set", "oldest_ready_age.warn=1s"],
    ["inspect", "orders", "--url", "{url}"],
    ["archive", "orders", "--url", "{url}"],
    ["archive", "orders", "--json", "--url", "{url}"],
    ["reorganize", "orders", "--dry-run", "--url", "{url}"],
    ["reset-stale", "orders", "--url", "{url}"],
    ["jobs", "list", "--url", "{url}"],
    ["jobs", "history", "--url", "{url}"],
    ["jobs", "run", "inspect", "orders", "--url", "{url}"],
    ["grant", "orders", "--producer", "no_such_role", "--url", "{url}"],
    ["correct-watermark", "orders", "--url", "{url}"],
    ["repair-ring", "orders", "--url", "{url}"],
    ["worker", "orders", "--handler", "json:dumps", "--burst", "--url", "{url}"],
    ["worker", "nothere", "--handler", "json:dumps", "--burst", "--url", "{url}"],
    ["scheduler", "run", "--max-seconds", "2", "--verbose", "--url", "{url}"],
    ["bench", "--seconds", "1", "--repeat", "1", "--producers", "1", "--consumers", "1", "--no-pgbench", "--url", "{url}"],
]


def run_all(commands: list[list[str]], url: str, env_url: bool = False) -> list[tuple[list[str], object]]:
    """Run every command (a few at a time); with env_url the URL comes from $QUEUECTL_URL."""
    def one(args: list[str]):
        if env_url:
            i = args.index("--url")
            return run_cli(*(args[:i] + args[i + 2:]), url=url, timeout=180)
        return run_cli(*(a.replace("{url}", url) for a in args), timeout=180)

    with ThreadPoolExecutor(3) as pool:
        return list(zip(commands, pool.map(one, commands)))


@pytest.mark.parametrize("case", ["wrong_password", "unknown_database", "closed_port"])
def test_no_command_prints_the_password_when_the_connection_fails(login, case):
    # every command for a refused password; a sample for the other failures (the machine is slow)
    commands = COMMANDS if case == "wrong_password" else [
        c for c in COMMANDS if c[0] in ("list", "health", "worker", "bench") or "--sql" in c]
    results = run_all(commands, login[case])
    for args, result in results:
        output = result.stdout + result.stderr
        assert not leaks(output), f"{args[:2]} printed the password: {output.decode()[-2000:]}"
        assert result.returncode in (2, 3), (args, result.returncode, output.decode()[-800:])
        assert b"Traceback" not in output and b"\xe2\x95\xad" not in output, (args, output.decode()[-800:])
        # the one line names the server it could not reach, masked
        assert b":***@127.0.0.1" in result.stderr, (args, result.stderr.decode())


def test_no_command_prints_the_password_when_logged_in(login):
    engine = make_engine(login["good"])
    try:
        install_queue(engine, "orders")  # so every command has its queue, whatever order they run in
    finally:
        engine.dispose()
    # the bench's error path is the same make_engine call as every command's (tested above);
    # a full measurement here would take minutes
    results = run_all([c for c in COMMANDS if c[0] != "bench"], login["good"])
    for args, result in results:
        output = result.stdout + result.stderr
        assert not leaks(output), f"{args[:3]} printed the password: {output.decode()[-2000:]}"
        assert b"Traceback" not in output, (args, output.decode()[-2000:])
    # the commands really ran logged in (a refused login would prove nothing). The commands
    # run three at a time, so two runs of one job on one queue (archive, archive --json, the
    # scheduler's own runs) can meet: the loser's one-line refusal from the job's
    # single-runner lock also proves it was logged in (it reached the lock).
    code = {" ".join(a[:2]): r for a, r in results}
    for command in ("install other", "list --url", "list --json", "enqueue orders", "inspect orders",
                    "archive orders", "reorganize orders", "worker orders", "jobs list", "health --json"):
        result = code[command]
        job_busy = (command.split()[0] in ("inspect", "archive", "reorganize") and result.returncode == 2
                    and b"is already running elsewhere (another runner holds its lock)" in result.stderr)
        assert job_busy or result.returncode in ((0, 1, 2) if command.startswith("health") else (0,)), (
            command, result.stderr.decode())
    assert code["install orders"].returncode == 2 and b"already installed" in code["install orders"].stderr
    assert ":***@127.0.0.1" in code["health --json"].stdout.decode()  # the URL is shown, masked


def test_the_url_from_the_environment_is_never_printed_either(login):
    commands = [c for c in COMMANDS if c[:2] in (["list", "--json"], ["health", "--json"], ["install", "other"])]
    for case in ("good", "wrong_password"):
        for args, result in run_all(commands, login[case], env_url=True):
            assert not leaks(result.stdout + result.stderr), (case, args)


def test_logs_at_debug_hold_no_password(login, caplog):
    """The library's own loggers and SQLAlchemy's (engine echo, pool) at DEBUG."""
    caplog.set_level(logging.DEBUG)
    for name in ("queuectl", "sqlalchemy.engine", "sqlalchemy.pool", "alembic"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        engine = make_engine(login["good"])
        engine.echo = "debug"
        install_queue(engine, "orders")
        with Queue(engine, "orders") as queue:
            queue.enqueue("x")
            queue.ack(queue.dequeue(1))
        run_job(engine, "archive", "orders", trigger="test")
        health_report(engine)
        scheduler = Scheduler(engine, load_config(None))
        scheduler.run_one("inspect", "orders")
        engine.dispose()
        # a scheduler whose database refuses the login logs the failure
        refused = sa.create_engine(make_url(login["wrong_password"]).set(drivername="postgresql+psycopg"))
        Scheduler(refused, load_config(None)).run_one("archive", "orders")
        refused.dispose()
    finally:
        for name in ("queuectl", "sqlalchemy.engine", "sqlalchemy.pool", "alembic"):
            logging.getLogger(name).setLevel(logging.NOTSET)
    text = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert "could not run" in text and "orders" in text  # the failure was logged, and is in the text checked
    assert not leaks(text), leaks(text)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


@pytest.mark.parametrize("case", ["wrong_password", "unknown_database", "closed_port"])
def test_errors_raised_by_the_library_hold_no_password(login, case):
    url = login[case]
    failures: list[BaseException] = []
    for call in (lambda: make_engine(url), lambda: Queue(url, "orders"), lambda: health_report(make_engine(url))):
        try:
            call()
        except QueuectlError as exc:
            failures.append(exc)
    assert len(failures) == 3
    for exc in failures:
        assert "***" in str(exc)
        texts = [str(e) for e in _chain(exc)] + [repr(e) for e in _chain(exc)]
        texts.append("".join(traceback.format_exception(exc)))
        # what a caller sees after `raise X from exc`, or when logging exc_info
        texts.append("".join(traceback.format_exception(type(exc), exc, exc.__traceback__, chain=True)))
        for text in texts:
            assert not leaks(text), text


def test_engines_and_clients_show_the_url_masked(login):
    engine = make_engine(login["good"])
    try:
        assert not leaks(repr(engine)) and not leaks(str(engine.url))
        assert mask_url(login["good"]).count("***") == 1 and not leaks(mask_url(login["good"]))
        install_queue(engine, "orders")
        with Queue(engine, "orders") as queue:
            assert not leaks(repr(queue))
    finally:
        engine.dispose()


def test_a_traceback_of_an_unexpected_error_would_not_show_locals():
    """Typer's pretty tracebacks can print local variables (URLs among them): they are off."""
    from queuectl.cli import app

    assert app.pretty_exceptions_show_locals is False
    assert sys.modules["queuectl.cli"].app is app
