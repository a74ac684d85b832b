"""A password given in a URL never leaves the process: not on stdout or stderr of any
command, not in logs, not in the text of any error queuectl raises.

The password is distinctive and holds URL-special characters, so it is checked both as
written in the URL (percent-encoded) and decoded. Every command runs twice over TCP with
that password: once logged in for real (a role created for the test), once refused
(wrong password, unknown database, closed port).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
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
from queuectl.engine import make_engine
from queuectl.engine.urls import mask_url
from queuectl.errors import QueuectlError
from queuectl.health import health_report
from queuectl.install import install_queue
from queuectl.jobs.runner import run_job
from queuectl.jobs.scheduler import Scheduler, load_config

SECRET = "Zq9-s3cr3t@pw:/%x"
ENCODED = quote(SECRET, safe="")
TAIL = SECRET.split("@", 1)[1]  # what follows the '@' a password holds


def leaks(text: str | bytes) -> list[str]:
    """Which forms of the password (or of its tail after the '@') occur in `text`."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return [form for form in (SECRET, ENCODED, "s3cr3t", TAIL, quote(TAIL, safe=""), quote(TAIL)) if form in text]


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
    ["health", "--format", "openmetrics", "--url", "{url}"],
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


@pytest.mark.slow
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


@pytest.mark.slow
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
                    and b"is already running elsewhere: its single-runner lock is held by" in result.stderr)
        assert job_busy or result.returncode in ((0, 1, 2) if command.startswith("health") else (0,)), (
            command, result.stderr.decode())
    assert code["install orders"].returncode == 2 and b"already installed" in code["install orders"].stderr
    assert ":***@127.0.0.1" in code["health --json"].stdout.decode()  # the URL is shown, masked


@pytest.mark.slow
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


def url_forms(login: dict[str, str], password: str) -> dict[str, str]:
    """The same login written the ways libpq and users write it."""
    parsed = make_url(login["good"])
    where = f"127.0.0.1:{parsed.port}"
    return {
        "query": f"postgresql://{parsed.username}@{where}/{parsed.database}?password={quote(password, safe='')}",
        "host_query": (f"postgresql:///{parsed.database}?host=127.0.0.1&port={parsed.port}&user={parsed.username}"
                       f"&password={quote(password, safe='')}"),
        "unescaped": f"postgresql://{parsed.username}:{password}@{where}/{parsed.database}",
    }


@pytest.mark.slow
@pytest.mark.parametrize("form", ["query", "host_query", "unescaped"])
def test_every_url_form_keeps_its_password_hidden(login, form):
    """?password=, ?host=...&password=... and a password with an unescaped '@' (and '/', ':'):
    refused, the one error line names the server masked; logged in, --json shows the URL masked."""
    engine = make_engine(login["good"])
    try:
        install_queue(engine, "orders")
    finally:
        engine.dispose()
    commands = [["list", "--json"], ["health", "--json"], ["worker", "orders", "--handler", "json:dumps", "--burst"],
                ["scheduler", "run", "--max-seconds", "1", "--verbose"]]
    refused = url_forms(login, SECRET + "no")[form]
    for args, result in run_all([[*c, "--url", "{url}"] for c in commands], refused):
        output = result.stdout + result.stderr
        assert not leaks(output), (args, output.decode()[-2000:])
        if args[0] != "scheduler":  # the scheduler keeps going: its runs log the failure
            assert result.returncode in (2, 3), (args, result.returncode, output.decode()[-800:])
            lines = result.stderr.decode().splitlines()
            assert len(lines) == 1 and "***" in lines[0] and "password authentication failed" in lines[0], lines
    good = url_forms(login, SECRET)[form]
    results = dict((args[0], result) for args, result in run_all([[*c, "--url", "{url}"] for c in commands], good))
    for command, result in results.items():
        output = result.stdout + result.stderr
        assert not leaks(output), (command, output.decode()[-2000:])
        assert b"Traceback" not in output, output.decode()[-2000:]
    assert results["list"].returncode == 0 and results["worker"].returncode == 0, results["list"].stderr.decode()
    shown = json.loads(results["health"].stdout)["database"]["url"]
    assert "***" in shown and make_url(shown).host in ("127.0.0.1", None), shown


@pytest.mark.slow
def test_a_password_can_stay_out_of_the_url(login, tmp_path):
    """$QUEUECTL_PASSWORD_FILE, and libpq's PGPASSFILE (psycopg reads it when the URL has no
    password); --help of --url says so."""
    parsed = make_url(login["good"])
    bare = f"postgresql://{parsed.username}@127.0.0.1:{parsed.port}/{parsed.database}"
    refused = run_cli("list", "--json", "--url", bare, env_extra={"PGPASSFILE": str(tmp_path / "none")})
    assert refused.returncode == 2 and b"password" in refused.stderr  # the login needs one

    password_file = tmp_path / "password"
    password_file.write_text(SECRET + "\n")
    given = run_cli("list", "--json", "--url", bare, env_extra={"QUEUECTL_PASSWORD_FILE": str(password_file),
                                                               "PGPASSFILE": str(tmp_path / "none")})
    assert given.returncode == 0, given.stderr.decode()
    missing = run_cli("list", "--url", bare, env_extra={"QUEUECTL_PASSWORD_FILE": str(tmp_path / "nothing")})
    assert missing.returncode == 2 and missing.stderr.decode().startswith("error: cannot read the password file")

    pgpass = tmp_path / "pgpass"
    escaped = SECRET.replace("\\", "\\\\").replace(":", "\\:")
    pgpass.write_text(f"127.0.0.1:{parsed.port}:{parsed.database}:{parsed.username}:{escaped}\n")
    pgpass.chmod(0o600)
    libpq = run_cli("list", "--json", "--url", bare, env_extra={"PGPASSFILE": str(pgpass)})
    assert libpq.returncode == 0, libpq.stderr.decode()

    helped = run_cli("worker", "--help", env_extra={"COLUMNS": "400"})
    assert b"QUEUECTL_PASSWORD_FILE" in helped.stdout and b"PGPASSFILE" in helped.stdout


LONG_RUNNING = {
    "worker": ["worker", "orders", "--handler", "json:dumps"],
    "scheduler": ["scheduler", "run"],
    "health --watch": ["health", "--watch", "1", "--json"],
    "archive --continuous": ["archive", "orders", "--continuous"],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", list(LONG_RUNNING))
def test_a_long_running_command_hides_the_password_in_its_command_line(login, command):
    """What `ps` shows every user of the machine: /proc/PID/cmdline of the running process."""
    engine = make_engine(login["good"])
    try:
        install_queue(engine, "orders")
    finally:
        engine.dispose()
    env = {k: v for k, v in os.environ.items() if k != "QUEUECTL_URL"}
    proc = subprocess.Popen([sys.executable, "-m", "queuectl.cli", *LONG_RUNNING[command], "--url", login["good"]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    cmdline = f"/proc/{proc.pid}/cmdline"
    try:
        deadline = time.monotonic() + 30
        with open(cmdline, "rb") as fh:
            shown = fh.read()
        while (leaks(shown) or b"--url" not in shown) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            with open(cmdline, "rb") as fh:
                shown = fh.read()
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert not leaks(shown), shown
        time.sleep(1.0)  # and it stays hidden while the command runs
        with open(cmdline, "rb") as fh:
            shown = fh.read()
        assert not leaks(shown) and b"***@127.0.0.1" in shown, shown
        assert b"--url" in shown and LONG_RUNNING[command][0].encode() in shown
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert not leaks(proc.stderr.read())
