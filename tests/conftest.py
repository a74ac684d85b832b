"""Fixtures: a real PostgreSQL for the whole run, a fresh database per test.

The server is the embedded one, started in a private temporary home (so a developer's own
embedded server is never touched), or the server at $QUEUECTL_TEST_URL when given: that
URL must allow CREATE DATABASE.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import pty
import re
import select
import shutil
import subprocess
import struct
import sys
import tempfile
import termios
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from queuectl.client import Queue
from queuectl.engine import make_engine
from queuectl.install import install_queue

TEST_URL_ENV = "QUEUECTL_TEST_URL"

# The suite's JVMs (its Spark session, the pipeline commands it runs, a standalone cluster's
# daemons) live a minute or two: compiled by C1 alone and collected by the serial collector
# they use about a third less CPU than with the server defaults (C2 and G1 threads), and Spark
# computes the same results.
_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:CICompilerCount=1"
for _variable in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    os.environ.setdefault(_variable, _JVM_OPTIONS)
# A standalone cluster's executors are started by its worker with the application's
# spark.executor.extraJavaOptions, which spark-submit reads from $SPARK_CONF_DIR/spark-defaults.conf.
if "SPARK_CONF_DIR" not in os.environ:
    _spark_conf = Path(tempfile.mkdtemp(prefix="queuectl-test-spark-conf-"))
    (_spark_conf / "spark-defaults.conf").write_text(f"spark.executor.extraJavaOptions {_JVM_OPTIONS}\n")
    os.environ["SPARK_CONF_DIR"] = str(_spark_conf)
    atexit.register(shutil.rmtree, _spark_conf, True)

# A pytest-xdist worker starts with COLUMNS=80 and LINES=24 in its environment, which a serial
# run does not have: a rich console made at import would keep 80 columns for good, where the
# tests give each command the width they want through COLUMNS.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that asks for a Spark session is marked `spark`, and under xdist all of them run
    in one worker, so one JVM serves them (a session costs ~10 s to start and a GB to keep)."""
    for item in items:
        if "spark" in item.fixturenames:
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture(scope="session")
def embedded_server() -> Iterator[object | None]:
    """The test run's EmbeddedServer (None when $QUEUECTL_TEST_URL names the server)."""
    if os.environ.get(TEST_URL_ENV):
        yield None
        return
    from queuectl.engine.embedded import EmbeddedServer

    # Under /tmp, not pytest's tmp_path: as root the server runs as an unprivileged user
    # that must be able to reach its data directory.
    home = Path(tempfile.mkdtemp(prefix="queuectl-test-", dir="/tmp"))
    os.chmod(home, 0o755)
    server = EmbeddedServer(home / "pg")
    os.environ["QUEUECTL_HOME"] = str(home / "unused-default")  # never start the user's server
    try:
        server.ensure_running()
        # A test server needs no fsync: the suite's faults are killed processes and immediate
        # server restarts, after which the OS still holds every write; only a power cut or an
        # OS crash needs the flush. Commits cost about a fifth without it.
        engine = sa.create_engine(make_url(server.url("postgres")), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(sa.text("ALTER SYSTEM SET fsync = off"))
            conn.execute(sa.text("ALTER SYSTEM SET full_page_writes = off"))  # torn pages need an OS crash too
            conn.execute(sa.text("SELECT pg_reload_conf()"))
        engine.dispose()
        yield server
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def server_url(embedded_server) -> str:
    """Admin URL of the test server (database 'postgres')."""
    given = os.environ.get(TEST_URL_ENV)
    return given if given else embedded_server.url("postgres")


@pytest.fixture(scope="session")
def admin_engine(server_url: str) -> Iterator[Engine]:
    engine = make_engine(server_url)
    yield engine
    engine.dispose()


def _create_database(admin_engine: Engine, server_url: str, template: str | None = None) -> tuple[str, str]:
    """A new database (a copy of `template` when given): its name and URL."""
    name = f"qt_{uuid.uuid4().hex[:12]}"
    # FILE_COPY copies the template's files instead of writing each page to the WAL (WAL_LOG,
    # the default): half the time for a database of a few MB, as every test makes one.
    strategy = " STRATEGY FILE_COPY" if admin_engine.dialect.server_version_info >= (15,) else ""
    copy = (f' TEMPLATE "{template}"' if template else "") + strategy
    with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"{copy}'))
    return name, make_url(server_url).set(database=name).render_as_string(hide_password=False)


def _drop_database(admin_engine: Engine, name: str) -> None:
    with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def orders_template(admin_engine: Engine, server_url: str) -> Iterator[str]:
    """A database where the reliable queue 'orders' is installed, kept to be copied: a copy
    (CREATE DATABASE ... TEMPLATE) takes about a tenth of an install through Alembic. Nobody
    connects to it after the install, as a copy requires."""
    name, url = _create_database(admin_engine, server_url)
    installer = make_engine(url)
    try:
        install_queue(installer, "orders")
    finally:
        installer.dispose()
    yield name
    _drop_database(admin_engine, name)


@pytest.fixture
def db_url(request: pytest.FixtureRequest, admin_engine: Engine, server_url: str) -> Iterator[str]:
    """A fresh database for one test, dropped afterwards: empty, or, when the test also asks
    for `orders`, a copy of `orders_template` (the same install, done once per run)."""
    template = request.getfixturevalue("orders_template") if "orders" in request.fixturenames else None
    name, url = _create_database(admin_engine, server_url, template)
    try:
        yield url
    finally:
        _drop_database(admin_engine, name)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def orders(engine: Engine) -> Iterator[Queue]:
    """An installed reliable queue 'orders' (db_url copies it in) and a client on it."""
    queue = Queue(engine, "orders")
    yield queue
    queue.close()


def process_alive(pid: int) -> bool:
    """The process is there and has not exited (a zombie, exited but not reaped, counts as gone)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_cli(
    *args: str,
    url: str | None = None,
    input: bytes | None = None,
    timeout: float = 120,
    env_extra: dict[str, str] | None = None,
    columns: int = 200,
    tty: bool = False,
) -> subprocess.CompletedProcess:
    """Run `queuectl ARGS` as a process of its own, as a user would, `columns` wide. With `tty`
    its stdout is a pseudo-terminal of that width (colours and all, as a user sees it), read
    back into .stdout; stdin and stderr stay pipes (stdin reads `input`, or nothing).
    The process is a fork of this test process's CLI fork server (tests/cli_forkserver.py:
    the libraries imported once, queuectl itself imported by each command), or a new
    interpreter when the command's environment changes how an interpreter starts."""
    env = dict(os.environ)
    env.update(env_extra or {})
    env.pop("QUEUECTL_URL", None)
    if url is not None:
        env["QUEUECTL_URL"] = url
    env["COLUMNS"] = str(columns)
    command = [sys.executable, "-m", "queuectl.cli", *args]
    if tty:
        env["TERM"] = "xterm-256color"
        env.pop("NO_COLOR", None)
    started: list[int] = []  # the descriptors the command got; ours to close once it has them
    readers: dict[int, bytearray] = {}
    if tty:
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
        readers[leader] = bytearray()
        out = leader
        started.append(follower)
    else:
        out, follower = os.pipe()
        readers[out] = bytearray()
        started.append(follower)
    err_r, err_w = os.pipe()
    readers[err_r] = bytearray()
    started.append(err_w)
    if input is None:
        stdin_r, stdin_w = os.open(os.devnull, os.O_RDONLY), None
    else:
        stdin_r, stdin_w = os.pipe()
    started.insert(0, stdin_r)
    server = _cli_forkserver()
    try:
        if server is not None and server.serves(env):
            child = server.run(list(args), env, (stdin_r, follower, err_w))
        else:
            child = subprocess.Popen(command, stdin=stdin_r, stdout=follower, stderr=err_w, env=env)
    finally:
        for fd in started:
            os.close(fd)
    deadline = time.monotonic() + timeout
    stdin = [stdin_w]
    try:
        _communicate(readers, stdin, input or b"", deadline)
        returncode = child.wait(timeout=max(0.0, deadline - time.monotonic()))
    except (TimeoutError, subprocess.TimeoutExpired):
        child.kill()
        child.wait()
        raise subprocess.TimeoutExpired(command, timeout, bytes(readers[out]), bytes(readers[err_r])) from None
    finally:
        for fd in (*readers, *(fd for fd in stdin if fd is not None)):
            os.close(fd)
    shown = bytes(readers[out])
    if tty:
        shown = shown.replace(b"\r\n", b"\n")
    return subprocess.CompletedProcess(command, returncode, shown, bytes(readers[err_r]))


def _communicate(readers: dict[int, bytearray], stdin: list[int | None], data: bytes, deadline: float) -> None:
    """Feed `data` to the command's stdin (stdin[0], closed and set to None once all is
    written) and read every reader to its end (EOF, or EIO from a pseudo-terminal whose other
    end closed), all at once, so a full pipe never blocks the command; TimeoutError at the
    deadline."""
    open_readers = set(readers)
    sent = 0
    stdin_w = stdin[0]
    if stdin_w is not None:
        os.set_blocking(stdin_w, False)
    while open_readers or stdin_w is not None:
        if stdin_w is not None and sent >= len(data):
            os.close(stdin_w)
            stdin[0] = stdin_w = None
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        writers = [stdin_w] if stdin_w is not None else []
        readable, writable, _ = select.select(list(open_readers), writers, [], min(left, 1.0))
        for fd in readable:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the pseudo-terminal's other end is closed
                chunk = b""
            if chunk:
                readers[fd] += chunk
            else:
                open_readers.discard(fd)
        if writable and stdin_w is not None:
            try:
                sent += os.write(stdin_w, data[sent:sent + 65536])
            except BrokenPipeError:
                sent = len(data)


def worker_processes():
    """The multiprocessing context for the tests' producer and consumer processes: each a
    fork of a fresh, single-threaded fork server that imported the client once (a process
    of its own, killable on its own, sharing nothing with the test process), instead of a
    new interpreter importing it again (~0.5 s of CPU each). Arguments reach the processes
    pickled, as with spawn; the fork server's environment is the test process's when it
    first started."""
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["queuectl.client", "queuectl.engine.postgresql", "queuectl.worker", "sqlalchemy",
                                "psycopg"])
    return ctx


_FORKSERVER: list = []
_FORKSERVER_LOCK = threading.Lock()


def _cli_forkserver():
    """This test process's CLI fork server, started on first use (None where it cannot run:
    QUEUECTL_TEST_NO_FORKSERVER=1 runs every command in a new interpreter)."""
    if os.environ.get("QUEUECTL_TEST_NO_FORKSERVER") == "1":
        return None
    with _FORKSERVER_LOCK:
        if not _FORKSERVER or _FORKSERVER[0][0] != os.getpid():
            from cli_forkserver import ForkServer

            _FORKSERVER[:] = [(os.getpid(), ForkServer())]
        return _FORKSERVER[0][1]


@contextmanager
def statements_sent(conn: sa.Connection) -> Iterator[list[str]]:
    """The statements this connection sends to the server inside the block, read from
    libpq's own protocol trace: one entry per Execute (the extended protocol) or Query
    (the simple one) message. An entry holds the statement's text when it was parsed in
    the block, else "" (a statement psycopg had already prepared)."""
    from psycopg import pq

    pgconn = conn.connection.driver_connection.pgconn
    sent: list[str] = []
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield sent
        finally:
            pgconn.untrace()
            trace.seek(0)
            parsed = ""
            for origin, kind, body in _TRACE_MESSAGE.findall(trace.read()):
                if origin != "F":
                    continue
                if kind == "Parse":
                    parsed = body
                elif kind == "Execute":
                    sent.append(parsed)
                    parsed = ""
                elif kind == "Query":
                    sent.append(body)


@contextmanager
def statements_executed(engine: Engine) -> Iterator[list[str]]:
    """The statements that go through SQLAlchemy's execution layer on `engine` inside the
    block (its before_cursor_execute event), in order."""
    executed: list[str] = []

    def record(conn, cursor, statement, *rest) -> None:
        executed.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield executed
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


# One protocol message of a libpq trace: direction, length, type, then its fields, which
# may run over several lines (a statement's text) up to the next message.
_TRACE_MESSAGE = re.compile(r"^([FB])\t\d+\t(\w+)(.*?)(?=^[FB]\t\d+\t|\Z)", re.MULTILINE | re.DOTALL)
