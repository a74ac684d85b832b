"""The command line as a user drives it: real subprocesses against the test server."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from queuectl.engine import make_engine
from queuectl.registry import get_queue, list_queues
from queuectl.stats import queue_counts

from conftest import process_alive, run_cli
from test_install import psql_command, schema_objects

BAD_NAMES = ["Orders", "a-b", "x; drop table t", "a" * 60, "1abc", "", "ordérs", 'o"rders', "alembic"]
SECRET = "Sup3r-Secret-pw"


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in result.stderr.decode().splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one error line, got: {lines}"
    assert lines[0].startswith("error:")
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_queue_name_is_one_line_exit_2_and_nothing_created(name, db_url, engine):
    result = run_cli("install", name, url=db_url)
    assert result.returncode == 2
    assert "queue name" in one_error_line(result)
    assert result.stdout == b""
    assert schema_objects(engine)["schema"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("command", [["enqueue", "Bad-Name", "x"], ["dequeue", "Bad-Name"], ["uninstall", "Bad-Name", "--yes"]])
def test_other_commands_refuse_bad_names_too(command, db_url):
    result = run_cli(*command, url=db_url)
    assert result.returncode == 2
    one_error_line(result)


@pytest.mark.slow
def test_unreachable_url_is_one_line_exit_2_without_password():
    url = f"postgresql://alice:{SECRET}@127.0.0.1:1/nowhere"
    for args in (["install", "orders", "--url", url], ["list", "--url", url], ["enqueue", "orders", "x", "--url", url]):
        result = run_cli(*args)
        assert result.returncode == 2
        line = one_error_line(result)
        assert "cannot connect" in line and "alice:***@127.0.0.1:1" in line
        assert SECRET not in (result.stdout + result.stderr).decode()


@pytest.mark.slow
def test_password_never_appears_in_any_output(server_url, db_url, admin_engine):
    """A real login with a password: every command's output is free of it."""
    role = f"pw_{uuid.uuid4().hex[:8]}"
    with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f"DROP ROLE IF EXISTS {role}"))
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD '{SECRET}'"))
    try:
        parsed = make_url(db_url)
        # over TCP so that the password is really used (the socket may be trusted)
        port = parsed.port or parsed.query.get("port") or 5432
        with admin_engine.connect() as conn:
            listen = conn.execute(sa.text("SHOW listen_addresses")).scalar()
        if listen in ("", None):
            pytest.fail("the test server must listen on TCP for this test")
        url = f"postgresql://{role}:{SECRET}@127.0.0.1:{port}/{parsed.database}"
        outputs = [
            run_cli("install", "orders", "--url", url),
            run_cli("install", "orders", "--url", url),  # error path: already installed
            run_cli("install", "other", "--sql", "--url", url),
            run_cli("enqueue", "orders", "hello", "--url", url),
            run_cli("dequeue", "orders", "--url", url),
            run_cli("list", "--url", url),
            run_cli("list", "--json", "--url", url),
            run_cli("upgrade", "--url", url),
            run_cli("enqueue", "nothere", "x", "--url", url),
            run_cli("install", "orders", "--url", url.replace(SECRET, SECRET + "wrong")),
        ]
        assert outputs[0].returncode == 0, outputs[0].stderr
        assert outputs[3].returncode == 0 and outputs[4].returncode == 0
        assert outputs[9].returncode == 2
        for result in outputs:
            assert SECRET not in (result.stdout + result.stderr).decode()
    finally:
        # the role owns objects in the test database: drop them there, then the role
        db_engine = make_engine(db_url)
        try:
            with db_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(sa.text(f"DROP OWNED BY {role} CASCADE"))
        finally:
            db_engine.dispose()
        with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(
                sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"),
                {"r": role},
            )
            conn.execute(sa.text(f"DROP ROLE {role}"))


@pytest.mark.slow
def test_install_enqueue_dequeue_list_uninstall_end_to_end(db_url):
    assert run_cli("install", "orders", "--max-attempts", "3", url=db_url).returncode == 0
    enq = run_cli("enqueue", "orders", "hello world", "--priority", "-1", "--title", "greeting",
                  "--headers", '{"k": "v"}', url=db_url)
    assert enq.returncode == 0, enq.stderr
    item_id = int(enq.stdout)
    assert run_cli("enqueue", "orders", "-", input=b"\xff\xfebinary", url=db_url).returncode == 0
    listed = json.loads(run_cli("list", "--json", url=db_url).stdout)
    assert listed[0]["name"] == "orders" and listed[0]["counts"]["ready"] == 2
    assert listed[0]["settings"]["max_attempts"] == 3
    out = run_cli("dequeue", "orders", "--batch", "5", "--ack", url=db_url)
    records = [json.loads(line) for line in out.stdout.decode().splitlines()]
    assert records[0] == records[0] | {"id": item_id, "payload": "hello world", "headers": {"k": "v"},
                                        "title": "greeting", "status": "done"}
    assert records[1]["encoding"] == "hex" and records[1]["payload"] == "fffe" + b"binary".hex()
    listed = json.loads(run_cli("list", "--json", url=db_url).stdout)
    assert listed[0]["counts"]["done"] == 2
    refused = run_cli("uninstall", "orders", url=db_url)
    assert refused.returncode == 2 and "--yes" in one_error_line(refused)
    assert run_cli("uninstall", "orders", "--yes", url=db_url).returncode == 0
    assert json.loads(run_cli("list", "--json", url=db_url).stdout) == []


@pytest.mark.slow
def test_install_sql_prints_the_script_and_touches_nothing(db_url, engine):
    result = run_cli("install", "orders", "--sql", url=db_url)
    assert result.returncode == 0
    assert b"CREATE FUNCTION" in result.stdout
    assert result.stderr == b"" and not result.stdout.startswith(b"-- written without")  # read from the database
    assert schema_objects(engine)["schema"] == 0
    psql = subprocess.run(psql_command(db_url), input=result.stdout, capture_output=True, timeout=60)
    assert psql.returncode == 0, psql.stderr


@pytest.mark.slow
def test_install_sql_without_a_database_says_the_script_is_from_scratch(db_url, orders):
    """`orders` is installed where the URL points; with no URL the script cannot know that and
    says so, on stderr and in its first line; with the URL there is nothing to install."""
    offline = run_cli("install", "orders", "--sql")
    note = ("written without reading a database (no --url or $QUEUECTL_URL given): this script installs the "
            "catalog and queue 'orders' from scratch, as on an empty database, whether or not they exist where it runs")
    assert offline.returncode == 0 and offline.stdout.decode().splitlines()[0] == f"-- {note}"
    assert [ln for ln in offline.stderr.decode().splitlines() if ln.strip()] == [f"note: {note}"]
    online = run_cli("install", "orders", "--sql", url=db_url)
    assert online.returncode == 2 and "already installed: nothing to install" in one_error_line(online)


@pytest.mark.slow
def test_bad_options_are_refused_with_exit_2(db_url):
    assert run_cli("install", "orders", "--max-attempts", "0", url=db_url).returncode == 2
    assert run_cli("install", "orders", "--kind", "nosuchkind", url=db_url).returncode == 2
    run_cli("install", "orders", url=db_url)
    bad_headers = run_cli("enqueue", "orders", "x", "--headers", "{not json", url=db_url)
    assert bad_headers.returncode == 2 and "not valid JSON" in one_error_line(bad_headers)
    assert run_cli("dequeue", "orders", "--batch", "0", url=db_url).returncode == 2
    assert run_cli("install", "--url", "oracle://u:p@h/x", "orders").returncode == 2
    assert run_cli("install", "--url", "not a url", "orders").returncode == 2


@pytest.mark.slow
def test_every_command_has_help():
    for args in (["--help"], ["install", "--help"], ["uninstall", "--help"], ["list", "--help"], ["upgrade", "--help"],
                 ["enqueue", "--help"], ["dequeue", "--help"], ["demo", "--help"], ["db", "--help"], ["db", "status", "--help"]):
        result = run_cli(*args)
        assert result.returncode == 0 and b"Usage" in result.stdout, args


@pytest.mark.slow
def test_demo_runs_and_completes_items(db_url, engine, orders):
    """On a queue of its own, which it removes: the user's `orders` (here holding an item
    that is not an order) is left as it was."""
    orders.enqueue("not an order {")
    result = run_cli("demo", "--seconds", "3", url=db_url, timeout=180)
    assert result.returncode == 0, result.stderr.decode()
    text = result.stdout.decode()
    assert "demo summary" in text and "installed queue queuectl_demo for the demo" in text
    completed = next(line for line in text.splitlines() if "completed  " in line or "│ completed " in line)
    assert int("".join(ch for ch in completed.split("completed", 1)[1] if ch.isdigit())) > 0
    with engine.connect() as conn:
        assert [q.name for q in list_queues(conn)] == ["orders"]
        assert queue_counts(conn, "orders", "reliable")["ready"] == 1


@pytest.mark.slow
def test_demo_keep_leaves_its_queue_and_items_for_the_pipeline(db_url, engine):
    result = run_cli("demo", "--seconds", "1", "--queue", "kept", "--keep", url=db_url, timeout=180)
    assert result.returncode == 0, result.stderr.decode()
    assert "installed queue kept for the demo (kept when it ends)" in result.stdout.decode()
    with engine.connect() as conn:
        assert queue_counts(conn, "kept", "reliable")["done"] > 0


def test_demo_refuses_an_existing_queue(db_url, orders):
    result = run_cli("demo", "--queue", "orders", "--seconds", "1", url=db_url)
    assert result.returncode == 2
    assert "queue 'orders' exists: the demo installs a queue of its own" in one_error_line(result)


def test_demo_consumer_completes_any_payload(db_url, orders):
    """Not JSON, JSON that is not an order, an order: each is completed, none kills the consumer."""
    from queuectl.demo import _consumer

    payloads = ["not json {", "[1, 2]", json.dumps({"order": "1-1", "sku": 7, "qty": 1})]
    orders.enqueue_many(payloads)
    ctx = multiprocessing.get_context("spawn")
    stop, go, waits = ctx.Event(), ctx.Event(), ctx.Queue()
    stop.set()  # producers done: drain and return
    go.set()
    completed, ready = ctx.Value("q", 0), ctx.Value("i", 0)
    _consumer(db_url, "orders", stop, completed, 2, waits, ready, go)
    assert completed.value == len(payloads) and len(waits.get(timeout=5)) == len(payloads)
    assert orders.counts()["ready"] == 0


def _spawned_children(pid: int) -> list[int]:
    """Processes that `pid` started with multiprocessing's spawn (its demo workers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"multiprocessing.spawn" in cmdline and b"resource_tracker" not in cmdline:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow
def test_a_killed_demo_leaves_no_producer_or_consumer_running(db_url, engine):
    """The demo killed without its cleanup (SIGKILL, a closed terminal's job killed): its
    producers and consumers end within seconds instead of going on for the run's length."""
    from queuectl.install import uninstall_queue

    env = {**os.environ, "QUEUECTL_URL": db_url, "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "queuectl.cli", "demo", "--seconds", "120"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(children) < 4:  # every worker started
            assert time.monotonic() < deadline and proc.poll() is None, "the demo did not get going"
            time.sleep(0.2)
            children = _spawned_children(proc.pid)
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while (left := [p for p in children if process_alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], f"demo workers still running after the demo was killed: {left}"
    finally:
        proc.kill()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        uninstall_queue(engine, "queuectl_demo")  # the demo was killed before its own cleanup


def test_demo_process_that_dies_stops_the_demo_in_one_line_and_it_cleans_up(db_url, engine):
    env = {**os.environ, "QUEUECTL_URL": db_url, "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "queuectl.cli", "demo", "--seconds", "120"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:  # running: every worker started and items completed
            assert time.monotonic() < deadline and proc.poll() is None, "the demo did not get going"
            with engine.connect() as conn:
                running = get_queue(conn, "queuectl_demo") is not None and sum(
                    queue_counts(conn, "queuectl_demo", "reliable").values()) > 0
            if running and len(_spawned_children(proc.pid)) == 4:
                break
            time.sleep(0.2)
        killed_at = time.monotonic()
        os.kill(_spawned_children(proc.pid)[0], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert time.monotonic() - killed_at < 20  # not the run's 120 s, nor a 60 s wait on a queue
    assert proc.returncode == 2
    lines = [ln for ln in stderr.decode().splitlines() if ln.strip()]
    assert len(lines) == 1 and re.fullmatch(r"error: demo stopped: (producer|consumer) \d exited with code -9", lines[0]), lines
    with engine.connect() as conn:
        assert get_queue(conn, "queuectl_demo") is None
