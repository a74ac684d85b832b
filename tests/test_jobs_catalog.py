"""catalog_0002: the job tables arrive with install and with upgrade; queues keep working."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic import command

from queuectl.catalog import CATALOG_VERSION_TABLE
from queuectl.client import Queue
from queuectl.errors import QueuectlError
from queuectl.install import _config, head_of, install_queue, install_script, upgrade_all
from queuectl.jobs.runner import run_job

from jobs_helpers import scalar


def has_table(engine, name: str) -> bool:
    return scalar(engine, "SELECT to_regclass(:n) IS NOT NULL", n=f"queuectl.{name}")


@pytest.mark.slow
def test_install_creates_the_job_tables(engine):
    install_queue(engine, "orders")
    assert head_of("catalog") == "catalog_0004_lock_seed"  # jobs tables came in catalog_0002
    assert has_table(engine, "job_runs") and has_table(engine, "health_snapshots")
    assert "CREATE TABLE \"queuectl\".job_runs" in install_script(None, "orders")


@pytest.mark.slow
def test_upgrade_adds_the_job_tables_to_an_older_catalog_and_queues_keep_working(engine):
    install_queue(engine, "orders")
    with Queue(engine, "orders") as queue:
        queue.enqueue("before the upgrade")
    with engine.connect() as conn:                      # a database installed before catalog_0002
        command.downgrade(_config("queuectl", CATALOG_VERSION_TABLE, connection=conn), "catalog_0001")
        conn.commit()
    assert not has_table(engine, "job_runs")
    with pytest.raises(QueuectlError, match="run `queuectl upgrade`"):
        run_job(engine, "reset_stale", "orders")
    upgrade_all(engine)
    assert scalar(engine, "SELECT version_num FROM queuectl.alembic_version") == head_of("catalog")
    assert run_job(engine, "archive", "orders").outcome == "succeeded"
    with Queue(engine, "orders") as queue:
        [message] = queue.dequeue(1)
        assert message.payload == b"before the upgrade"
    with engine.connect() as conn:                      # and the downgrade removes them again
        command.downgrade(_config("queuectl", CATALOG_VERSION_TABLE, connection=conn), "catalog_0001")
        conn.commit()
    assert not has_table(engine, "job_runs") and not has_table(engine, "health_snapshots")
