"""The suite's CLI fork server (tests/cli_forkserver.py, behind conftest's run_cli) runs a
command as a new interpreter would: the same bytes out, the same exit status, its own
environment (libpq's included), stdin, working directory and multiprocessing children, and a
signal's death reported as subprocess reports it."""

from __future__ import annotations

import os
import signal
import sys
import textwrap

import pytest
from sqlalchemy.engine import make_url

import conftest
from cli_forkserver import ForkServer
from conftest import run_cli


def _both_ways(monkeypatch: pytest.MonkeyPatch, *args: str, **kw):
    forked = run_cli(*args, **kw)
    monkeypatch.setenv("QUEUECTL_TEST_NO_FORKSERVER", "1")
    try:
        started = run_cli(*args, **kw)
    finally:
        monkeypatch.delenv("QUEUECTL_TEST_NO_FORKSERVER")
    return forked, started


@pytest.mark.slow
def test_a_forked_command_is_what_a_new_interpreter_would_be(db_url, orders, tmp_path, monkeypatch) -> None:
    assert conftest._cli_forkserver() is not None  # the suite does use it
    closed = "postgresql://someone:s3cret-pw@127.0.0.1:1/nowhere"
    cases = [
        (("--help",), {"columns": 80}),
        (("list",), {"url": db_url, "columns": 80, "tty": True}),  # colours on a terminal
        (("install", "bad name!"), {"url": db_url}),  # a usage error: exit 2
        (("health", "--format", "json", "--url", closed), {}),  # cannot connect: masked, exit 3
        (("enqueue", "orders", "-"), {"url": db_url, "input": b"from stdin \xe2\x9c\x93"}),
    ]
    for args, kw in cases:
        forked, started = _both_ways(monkeypatch, *args, **kw)
        assert (forked.returncode, forked.stderr) == (started.returncode, started.stderr), args
        if args[0] == "enqueue":  # each run enqueued its own item: ids 1 and 2
            assert forked.returncode == 0 and forked.stdout != started.stdout
        else:
            assert forked.stdout == started.stdout, args
        assert b"s3cret-pw" not in forked.stdout + forked.stderr
    assert forked.returncode == 0

    # libpq reads the environment the command was given (the database to use), not the server's
    login = make_url(db_url)
    no_database = login.set(database="").render_as_string(hide_password=False)
    assert b"no queues installed" in run_cli("list", url=no_database).stdout  # libpq's default database
    forked, started = _both_ways(monkeypatch, "list", url=no_database, env_extra={"PGDATABASE": login.database})
    assert forked.returncode == started.returncode == 0 and b"orders" in forked.stdout
    assert forked.stdout == started.stdout

    # the working directory comes first on sys.path, as under `python -m`; a handler found there
    # runs, here through multiprocessing's spawn (whose children find `__main__` as -m set it)
    (tmp_path / "cwd_handlers.py").write_text(textwrap.dedent("""
        def handle(message):
            with open("handled.txt", "a") as out:
                out.write(message.text + "\\n")
    """))
    monkeypatch.chdir(tmp_path)
    done = run_cli("worker", "orders", "--handler", "cwd_handlers:handle", "--burst", "--processes", "--concurrency", "2",
                   url=db_url, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert sorted((tmp_path / "handled.txt").read_text().splitlines()) == ["from stdin \u2713"] * 2


def test_the_fork_server_reports_a_signal_and_real_processes_stay_for_interpreter_settings(db_url, orders) -> None:
    server = ForkServer()
    try:
        read_end, write_end = os.pipe()  # the command waits on its stdin, which stays open
        null = os.open(os.devnull, os.O_RDWR)
        try:
            command = server.run(["enqueue", "orders", "-", "--url", db_url], dict(os.environ), (read_end, null, null))
        finally:
            os.close(null)
            os.close(read_end)
        os.kill(command.pid, signal.SIGKILL)
        assert command.wait(timeout=30) == -signal.SIGKILL
        os.close(write_end)
        env = dict(os.environ)
        assert server.serves(env)
        assert not server.serves({**env, "PYTHONPATH": "/elsewhere"})  # read at interpreter start
        assert not server.serves({**env, "FORCE_COLOR": "1"})  # read when rich/typer are imported
        assert server.serves({**env, "PGPASSFILE": "/elsewhere", "COLUMNS": "80"})  # read at run time
    finally:
        server.close()
    # and a command run for a new interpreter's setting really gets one
    shown = run_cli("--version", env_extra={"PYTHONPATH": os.path.dirname(__file__)})
    assert shown.returncode == 0 and shown.args[0] == sys.executable
