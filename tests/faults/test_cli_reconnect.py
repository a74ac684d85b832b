"""Long-running CLI commands on a lost connection: `queuectl archive --continuous` and
`queuectl worker` go on after pg_terminate_backend of every backend they hold; a worker
whose database is gone gives up after its reconnect budget with one masked line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from queuectl.client import Queue
from queuectl.install import install_queue

FAULTS_DIR = Path(__file__).resolve().parent
SECRET = "sekret-pw-0815"


def cli(db_url: str, *args: str, stderr, env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    env = dict(os.environ, QUEUECTL_URL=db_url, COLUMNS="200", **(env_extra or {}))
    env["PYTHONPATH"] = os.pathsep.join([str(FAULTS_DIR), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen([sys.executable, "-m", "queuectl.cli", *args], stdout=subprocess.PIPE, stderr=stderr, env=env)


def wait_for(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def terminate_other_backends(engine, spare: Queue) -> int:
    """pg_terminate_backend of every client backend of the test database but this one and
    the test's own queue client's."""
    spared = spare._conn.connection.dbapi_connection.info.backend_pid
    with engine.connect() as conn:
        killed = conn.execute(sa.text(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid() "
            "AND pid <> :spared"), {"spared": spared}).scalar_one()
        conn.commit()
    return killed


def count(engine, sql: str) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql)).scalar_one()


def test_archive_continuous_survives_terminated_backends_and_keeps_its_lock(db_url, engine, tmp_path):
    install_queue(engine, "orders")
    queue = Queue(engine, "orders")
    log = tmp_path / "archive.log"

    def finish(n: int, tag: str) -> None:
        queue.enqueue_many([f"{tag}-{i}" for i in range(n)])
        queue.ack(queue.dequeue(n))

    finish(200, "first")
    proc = cli(db_url, "archive", "orders", "--continuous", "--batch", "20", "--min-age", "0s", "--delay", "0.05s",
               stderr=log.open("wb"))
    try:
        wait_for(lambda: count(engine, "SELECT count(*) FROM queuectl.orders_history") == 200, "the first archive")
        for round_ in range(2):
            assert terminate_other_backends(engine, queue) >= 1  # its lock connection (and pooled batch connections)
            finish(100, f"after-kill-{round_}")
            # the watchdog notices within its check interval, reconnects and takes the lock again
            wait_for(lambda: "took the lock again" in log.read_text(), "the lock to be taken again", timeout=30)
            wait_for(lambda: count(engine, "SELECT count(*) FROM queuectl.orders_history") == 300 + 100 * round_,
                     "archiving after the kill")
        with engine.connect() as conn:  # its lock is held again: another runner would be refused
            running = conn.execute(sa.text("SELECT outcome, runner_pid FROM queuectl.job_runs")).all()
        assert running == [("running", proc.pid)]
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = log.read_text()
    assert proc.returncode == 0, stderr
    assert stderr.count("took the lock again") >= 2
    with engine.connect() as conn:
        run = conn.execute(sa.text("SELECT outcome, rows, error FROM queuectl.job_runs")).one()
        assert conn.execute(sa.text("SELECT count(*) FROM queuectl.orders_meta")).scalar_one() == 0
        assert conn.execute(sa.text("SELECT count(*) FROM queuectl.orders_data")).scalar_one() == 0
        payloads = Counter(conn.execute(sa.text("SELECT convert_from(payload, 'UTF8') FROM queuectl.orders_history")).scalars())
    assert run.outcome == "succeeded" and run.rows == 400 and run.error is None
    assert len(payloads) == 400 and set(payloads.values()) == {1}
    queue.close()


def worker(db_url: str, tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    handled, log = tmp_path / "handled.txt", tmp_path / "worker.log"
    handled.touch()
    proc = cli(db_url, "worker", "orders", "--handler", "fault_handlers:append", "--json", "--poll-interval", "0.5",
               *args, stderr=log.open("wb"), env_extra={"QT_HANDLED_FILE": str(handled)})
    return proc, handled, log


def test_worker_survives_terminated_backends_and_processes_every_item_once(db_url, engine, tmp_path):
    install_queue(engine, "orders")
    queue = Queue(engine, "orders")
    proc, handled, log = worker(db_url, tmp_path)
    sent: list[str] = []
    try:
        for round_ in range(3):
            batch = [f"r{round_}-{i}" for i in range(50)]
            queue.enqueue_many(batch)
            sent += batch
            wait_for(lambda: len(handled.read_text().split()) == len(sent), f"round {round_} to be handled")
            assert terminate_other_backends(engine, queue) >= 1  # its queue connection and its LISTEN connection
        late = [f"late-{i}" for i in range(50)]
        queue.enqueue_many(late)  # found by polling, or by the LISTEN connection once reopened
        sent += late
        wait_for(lambda: len(handled.read_text().split()) == len(sent), "the items after the last kill")
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log.read_text()
    assert Counter(handled.read_text().split()) == Counter(sent)  # each exactly once
    counts = json.loads(stdout)
    assert counts["processed"] == len(sent) and counts["lost"] == 0
    assert queue.counts()["done"] == len(sent)
    queue.close()


def test_worker_gives_up_after_its_reconnect_budget_with_one_masked_line(db_url, engine, admin_engine, tmp_path):
    install_queue(engine, "orders")
    url = make_url(db_url).set(password=SECRET).render_as_string(hide_password=False)  # trust auth ignores it
    proc, handled, log = worker(url, tmp_path, "--reconnect-for", "3")
    queue = Queue(engine, "orders")
    queue.enqueue_many(["a", "b"])
    wait_for(lambda: len(handled.read_text().split()) == 2, "the worker to run")
    queue.close()
    engine.dispose()
    database = make_url(db_url).database
    with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'DROP DATABASE "{database}" WITH (FORCE)'))
    started = time.monotonic()
    try:
        proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - started
    stderr = log.read_text()
    assert proc.returncode == 2, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert "gave up reconnecting to" in errors[0] and "after 3 s" in errors[0] and "***" in errors[0]
    assert SECRET not in stderr and "Traceback" not in stderr
    assert took < 60


def test_health_watch_survives_terminated_backends_and_a_restart_and_gives_up_on_a_lost_database(
        embedded_server, db_url, engine, admin_engine, tmp_path):
    install_queue(engine, "orders")
    queue = Queue(engine, "orders")
    queue.enqueue_many(["a", "b", "c"])
    url = make_url(db_url).set(password=SECRET).render_as_string(hide_password=False)
    log = tmp_path / "health.log"
    out = tmp_path / "health.jsonl"
    env = dict(os.environ, QUEUECTL_URL=url, COLUMNS="200")
    proc = subprocess.Popen([sys.executable, "-m", "queuectl.cli", "health", "orders", "--json", "--watch", "0.5",
                             "--reconnect-for", "3"], stdout=out.open("wb"), stderr=log.open("wb"), env=env)

    def reports() -> list[dict]:
        """The complete lines so far: the watch writes to a file through a block buffer, so a
        long report can reach the file in two writes and a read may fall between them."""
        text = out.read_text()
        return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line.strip()]

    try:
        wait_for(lambda: len(reports()) >= 2, "the first reports")
        for _ in range(2):
            seen = len(reports())
            assert terminate_other_backends(engine, queue) >= 1
            wait_for(lambda: len(reports()) >= seen + 3, "reports after the kill")  # the watch went on
        if embedded_server is not None:  # an external $QUEUECTL_TEST_URL server is not restarted
            queue.close()
            engine.dispose()
            seen = len(reports())
            embedded_server.restart(mode="fast")
            wait_for(lambda: len(reports()) >= seen + 3, "reports after the restart")
            queue = Queue(engine, "orders")
        queue.close()
        engine.dispose()
        database = make_url(db_url).database
        with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f'DROP DATABASE "{database}" WITH (FORCE)'))
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = log.read_text()
    assert proc.returncode == 3, stderr  # UNKNOWN: no verdict
    assert all(r["queues"][0]["name"] == "orders" for r in reports())
    assert "lost the database" in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert "health --watch: gave up reconnecting to" in errors[0] and "after 3 s" in errors[0] and "***" in errors[0]
    assert SECRET not in stderr and SECRET not in out.read_text() and "Traceback" not in stderr
