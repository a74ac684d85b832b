"""Text that comes from the server is data, never markup or terminal control, in every command.

Any role that can connect chooses its session's application_name, its role name and the
errors its objects raise; a DBA's health report and job history show them. Each case here is
made for real on the test server (second sessions idle in transaction, a role with control
characters in its name, a job run's error text) and read through the command line.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from conftest import run_cli
from jobs_helpers import wait_until
from queuectl.jobs.runner import run_job

HOSTILE_APPLICATION_NAMES = [
    "[/x]",
    "[bold]loud",
    "[link=https://example.invalid]click me[/link]",
    "back\\slash\\[/]",
    "bell\x07 and escape\x1b[2J",  # the server keeps printable ASCII: '?' for each control character
    "ünïcødé ☃ [/x]",              # ... and for each byte outside ASCII
    "[/x]" + "L" * 200,            # ... and 63 bytes at most
]


@contextmanager
def idle_in_transaction(url: str, application_names: list[str], username: str | None = None) -> Iterator[list[str]]:
    """One session per name, idle in a transaction that holds an xid; yields the names as the
    server keeps them (pg_stat_activity)."""
    target = make_url(url) if username is None else make_url(url).set(username=username)
    engines = [sa.create_engine(target.set(drivername="postgresql+psycopg"), poolclass=sa.pool.NullPool,
                                connect_args={"application_name": name}) for name in application_names]
    sessions = []
    try:
        stored = []
        for engine in engines:
            conn = engine.connect()
            sessions.append(conn)
            conn.begin()
            conn.execute(sa.text("SELECT txid_current()"))
            stored.append(conn.execute(sa.text(
                "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()")).scalar_one())
        yield stored
    finally:
        for conn in sessions:
            conn.close()
        for engine in engines:
            engine.dispose()


def test_hostile_application_names_are_printed_as_written_in_the_health_report(orders, engine, db_url):
    with idle_in_transaction(db_url, HOSTILE_APPLICATION_NAMES) as stored:
        assert "[/x]" in stored and "bell? and escape?[2J" in stored and len(stored[-1]) == 63
        text = run_cli("health", "--set", "idle_in_transaction.warn=0s", url=db_url)
        as_json = run_cli("health", "--json", "--set", "idle_in_transaction.warn=0s", url=db_url)

    output = (text.stdout + text.stderr).decode()
    assert text.returncode == 1, output[-3000:]  # WARNING: the idle sessions, nothing else
    assert "Traceback" not in output and "MarkupError" not in output
    advice = [line for line in text.stdout.decode().splitlines() if line.startswith("WARNING")]
    for name in stored:
        assert any(f"app {name!r}" in line for line in advice), (name, advice)

    report = json.loads(as_json.stdout)
    assert as_json.returncode == 1, as_json.stderr.decode()
    assert set(stored) <= {s["application_name"] for s in report["blockers"]["sessions"]}
    for name in stored:
        assert any(f"app {name!r}" in (c["advice"] or "") for c in report["checks"]), name


@contextmanager
def login_role(engine: Engine, name: str) -> Iterator[str]:
    """A role that may log in (over the socket, trust auth), with any name."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("SELECT set_config('qt.role', :name, false)"), {"name": name})
        conn.execute(sa.text("DO $$ BEGIN EXECUTE format('CREATE ROLE %I LOGIN', current_setting('qt.role')); END $$"))
    try:
        yield name
    finally:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :name"),
                         {"name": name})
            conn.execute(sa.text("DO $$ BEGIN EXECUTE format('DROP ROLE %I', current_setting('qt.role')); END $$"))


def test_control_characters_in_a_role_name_never_reach_the_terminal(orders, engine, db_url):
    """A role named with ESC sequences (clear the screen, set the window title) and a bell."""
    name = f"qt_{uuid.uuid4().hex[:6]}\x1b[2J\x1b]0;owned\x07"
    with login_role(engine, name), idle_in_transaction(db_url, ["innocent"], username=name):
        wait_until(lambda: b"idle in transaction" in run_cli(
            "health", "--set", "idle_in_transaction.warn=0s", url=db_url).stdout, timeout=20, interval=0.2)
        result = run_cli("health", "--set", "idle_in_transaction.warn=0s", url=db_url)
    assert result.returncode == 1, result.stderr.decode()
    assert b"\x1b" not in result.stdout and b"\x07" not in result.stdout
    assert f"{name[:9]}?[2J?]0;owned".encode() in result.stdout, result.stdout.decode()[-1500:]


def test_a_job_error_is_shown_as_written_in_the_job_history_and_the_health_report(orders, engine, db_url):
    """The history keeps a job's error as the server or the job wrote it; the commands that
    show it print its brackets as they are and no control character."""
    record = run_job(engine, "inspect", "orders", trigger="test")
    error = "[/x] [bold]relation \"a\x1b[2Jb\" is locked[/bold] \\[/]"
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE queuectl.job_runs SET outcome = 'failed', error = :error WHERE id = :id"),
                     {"error": error, "id": record.run_id})
    shown = error.replace("\x1b", "?")

    history = run_cli("jobs", "history", url=db_url)
    assert history.returncode == 0, history.stderr.decode()
    assert shown.encode() in history.stdout and b"\x1b" not in history.stdout, history.stdout.decode()

    health = run_cli("health", url=db_url)
    assert health.returncode == 1, (health.stdout + health.stderr).decode()[-2000:]
    assert shown.encode() in health.stdout and b"\x1b" not in health.stdout


def test_a_handler_error_with_control_characters_is_logged_as_data_by_the_worker(orders, db_url):
    """The worker's log lines carry its handlers' errors, whose texts the payloads chose."""
    orders.enqueue("\x1b[2J\x1b]0;owned\x07[/x]")
    result = run_cli("worker", "orders", "--handler", "hostile_handlers:fail_with_payload", "--burst",
                     url=db_url, env_extra={"PYTHONPATH": os.path.dirname(__file__)})
    assert result.returncode == 0, result.stderr.decode()
    assert b"ValueError: ?[2J?]0;owned?[/x]" in result.stderr, result.stderr.decode()
    assert b"\x1b" not in result.stderr and b"\x07" not in result.stderr
