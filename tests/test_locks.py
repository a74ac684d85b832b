"""Single-runner locks against a role that can only connect: it cannot block installs or
jobs by taking keys it can guess, a lock it does hold is named with its session, and no
wait is unbounded; a failed install gives its lock back and shows its own cause."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from queuectl import locks
from queuectl.client import Queue
from queuectl.install import install_queue, upgrade_queue
from queuectl.jobs.base import JobBusy
from queuectl.jobs.runner import lock_key, run_job
from queuectl.locks import Lock, LockBusy

from conftest import run_cli

INSTALL = Lock("queuectl", "queuectl.install", "the install lock")


@pytest.fixture
def mallory(engine, db_url) -> Iterator[sa.Engine]:
    """Connections of a role that may log in and nothing more, named 'squatter [/x]'."""
    role = f"mallory_{uuid.uuid4().hex[:6]}"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'CREATE ROLE "{role}" LOGIN'))
    url = make_url(db_url).set(username=role)
    squatter = sa.create_engine(url, connect_args={"application_name": "squatter [/x]"}, poolclass=sa.pool.NullPool)
    yield squatter
    squatter.dispose()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"))
        conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
        conn.execute(sa.text(f'DROP ROLE "{role}"'))


def squat(squatter: sa.Engine, key: str) -> sa.Connection:
    conn = squatter.connect().execution_options(isolation_level="AUTOCOMMIT")
    assert conn.execute(sa.text("SELECT pg_try_advisory_lock(hashtextextended(:k, 0))"), {"k": key}).scalar()
    return conn


def test_keys_a_connecting_role_can_guess_block_nothing_once_the_catalog_has_its_seed(engine, mallory):
    install_queue(engine, "orders")
    Queue(engine, "orders").enqueue(b"x")
    held = [squat(mallory, "queuectl.install"), squat(mallory, "queuectl.job:queuectl:archive:orders"),
            squat(mallory, "queuectl.pipeline:queuectl.orders")]
    started = time.monotonic()
    install_queue(engine, "billing", lock_wait=5)
    upgrade_queue(engine, "orders", lock_wait=5)
    assert run_job(engine, "archive", "orders").outcome == "succeeded"
    assert time.monotonic() - started < 5
    for conn in held:
        conn.close()


def test_the_lock_seed_is_not_readable_by_a_role_that_can_only_connect(engine, mallory):
    install_queue(engine, "orders")
    with mallory.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
        conn.execute(sa.text("SELECT seed FROM queuectl.lock_seed"))
    with engine.connect() as conn:
        assert locks.key_of(conn, INSTALL) != "queuectl.install"


def test_a_held_install_lock_is_waited_for_a_bounded_time_and_its_holder_named(engine, mallory):
    install_queue(engine, "orders")
    with engine.connect() as conn:
        key = locks.key_of(conn, INSTALL)  # what a role watching pg_locks could learn
    holder = squat(mallory, key)
    pid = holder.execute(sa.text("SELECT pg_backend_pid()")).scalar()
    role = mallory.url.username
    started = time.monotonic()
    with pytest.raises(LockBusy) as busy:
        install_queue(engine, "billing", lock_wait=1)
    assert 1 <= time.monotonic() - started < 10
    message = str(busy.value)
    assert "\n" not in message
    assert f"held by pid {pid} (role '{role}', application 'squatter [/x]'" in message
    assert f"pg_terminate_backend({pid})" in message and "waited 1 s" in message
    holder.close()
    install_queue(engine, "billing", lock_wait=5)  # free again once that session ends


@pytest.mark.slow
def test_the_first_install_waits_a_bounded_time_for_the_bare_key_and_names_its_holder(engine, db_url, mallory):
    holder = squat(mallory, "queuectl.install")
    with pytest.raises(LockBusy, match=f"held by pid \\d+ \\(role '{mallory.url.username}'"):
        install_queue(engine, "orders", lock_wait=0.5)
    result = run_cli("install", "orders", "--lock-wait", "0.5", url=db_url)
    waiting, error = result.stderr.decode().splitlines()  # a notice when the wait starts, then one error line
    assert result.returncode == 2 and waiting.startswith("waiting up to 0.5 s for queuectl's install lock")
    assert f"role '{mallory.url.username}', application 'squatter [/x]'" in error and "waited 0.5 s" in error
    holder.close()
    install_queue(engine, "orders", lock_wait=5)


@pytest.mark.slow
def test_a_held_job_lock_is_refused_at_once_naming_its_holder_in_the_api_and_the_cli(engine, db_url, mallory):
    install_queue(engine, "orders")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        key = locks.key_of(conn, lock_key("queuectl", "archive", "orders"))
    holder = squat(mallory, key)
    pid = holder.execute(sa.text("SELECT pg_backend_pid()")).scalar()
    with pytest.raises(JobBusy, match=f"archive on queue orders is already running elsewhere: .*pid {pid} "):
        run_job(engine, "archive", "orders")
    result = run_cli("archive", "orders", url=db_url)
    err = result.stderr.decode()
    assert result.returncode == 2 and err.count("\n") == 1
    assert f"pid {pid}" in err and mallory.url.username in err
    holder.close()


def test_a_failed_install_raises_its_own_cause_and_gives_the_install_lock_back(engine):
    install_queue(engine, "orders")
    with engine.connect() as conn:  # an object in the way of the next queue's tables
        conn.execute(sa.text("CREATE TABLE queuectl.billing_meta (id int)"))
        conn.commit()
    with pytest.raises(ProgrammingError, match='relation "billing_meta" already exists'):
        install_queue(engine, "billing")
    with sa.create_engine(engine.url, poolclass=sa.pool.NullPool).connect() as other:
        assert locks.try_take(other, locks.key_of(other, INSTALL))  # not kept by the pooled session
        assert locks.try_take(other, "queuectl.install")
    with engine.connect() as conn:
        conn.execute(sa.text("DROP TABLE queuectl.billing_meta"))
        conn.commit()
    install_queue(engine, "billing", lock_wait=5)
