"""Installing through Alembic: review scripts, round trips, per-queue versions, removal."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from queuectl.client import Queue
from queuectl.errors import NotInstalledError, PayloadTooLarge, UsageError
from queuectl.install import (
    head_of,
    install_queue,
    install_script,
    list_queues,
    remove_everything,
    uninstall_queue,
    upgrade_all,
)


def schema_objects(engine, schema: str = "queuectl") -> dict[str, list[str]]:
    """Every relation and function in the schema, by name."""
    with engine.connect() as conn:
        relations = conn.execute(
            sa.text(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = :s ORDER BY 1"
            ),
            {"s": schema},
        ).scalars().all()
        functions = conn.execute(
            sa.text(
                "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = :s ORDER BY 1"
            ),
            {"s": schema},
        ).scalars().all()
        schema_exists = conn.execute(
            sa.text("SELECT count(*) FROM pg_namespace WHERE nspname = :s"), {"s": schema}
        ).scalar()
    return {"relations": list(relations), "functions": list(functions), "schema": schema_exists}


def psql_command(url: str) -> list[str]:
    """psql against the test database, from the parts of its SQLAlchemy URL."""
    parsed = make_url(url)
    psql = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"
    host = parsed.query.get("host") or parsed.host or "127.0.0.1"
    cmd = [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", host, "-d", parsed.database]
    if parsed.port or parsed.query.get("port"):
        cmd += ["-p", str(parsed.port or parsed.query["port"])]
    if parsed.username:
        cmd += ["-U", parsed.username]
    return cmd


def test_install_sql_script_runs_cleanly_through_psql_on_an_empty_database(db_url, engine):
    script = install_script(None, "orders")
    assert "CREATE TABLE" in script and "orders_dequeue" in script
    assert schema_objects(engine)["schema"] == 0  # generating the script touched nothing
    env = {"PGPASSWORD": make_url(db_url).password or ""}
    result = subprocess.run(psql_command(db_url), input=script.encode(), capture_output=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    # what the script installed is a working queue, registered at the head version
    with engine.connect() as conn:
        [info] = list_queues(conn)
    assert (info.name, info.kind, info.schema_version) == ("orders", "reliable", head_of("reliable"))
    with Queue(engine, "orders") as queue:
        queue.enqueue("via psql")
        assert [m.payload for m in queue.dequeue(1)] == [b"via psql"]
        # the functions' texts are the ones a migration installs: the refusal's format() has
        # its % placeholders (a driver's paramstyle once doubled them in the printed script)
        with pytest.raises(PayloadTooLarge, match=r"^queue 'orders': message of 1048577 bytes"):
            queue.enqueue(bytes(1024 * 1024 + 1))
    assert "%%" not in script


def test_install_sql_against_a_database_with_the_catalog_emits_only_the_queue(engine):
    install_queue(engine, "first")
    script = install_script(engine, "second")
    assert "CREATE TABLE queuectl.queues" not in script
    assert '"second_meta"' in script and '"first_meta"' not in script
    with pytest.raises(UsageError, match="already installed"):
        install_script(engine, "first")


def test_install_uninstall_install_round_trips(engine):
    install_queue(engine, "orders")
    with Queue(engine, "orders") as queue:
        queue.enqueue("one")
    before = schema_objects(engine)
    uninstall_queue(engine, "orders")
    after_uninstall = schema_objects(engine)
    assert not [r for r in after_uninstall["relations"] if r.startswith("orders_")]
    assert not [f for f in after_uninstall["functions"] if f.startswith("orders_")]
    install_queue(engine, "orders")
    assert schema_objects(engine) == before
    with Queue(engine, "orders") as queue:
        assert queue.counts()["ready"] == 0  # a fresh queue, the old item went with the uninstall


def test_each_queue_has_its_own_schema_version(engine):
    install_queue(engine, "alpha")
    install_queue(engine, "beta")
    with engine.connect() as conn:
        versions = dict(
            conn.execute(sa.text("SELECT 'alpha', version_num FROM queuectl.alpha_version "
                                 "UNION ALL SELECT 'beta', version_num FROM queuectl.beta_version")).all()
        )
        catalog = conn.execute(sa.text("SELECT version_num FROM queuectl.alembic_version")).scalar()
    assert versions == {"alpha": head_of("reliable"), "beta": head_of("reliable")}
    assert catalog == head_of("catalog")
    assert upgrade_all(engine) == [("alpha", versions["alpha"], versions["alpha"]), ("beta", versions["beta"], versions["beta"])]


@pytest.mark.slow
def test_downgrade_to_base_leaves_no_queue_objects(engine):
    for name in ("orders", "emails", "a" * 48):
        install_queue(engine, name)
    assert len(schema_objects(engine)["relations"]) > 10
    removed = remove_everything(engine)
    assert sorted(removed) == sorted(["orders", "emails", "a" * 48])
    assert schema_objects(engine) == {"relations": [], "functions": [], "schema": 0}


@pytest.mark.slow
def test_remove_everything_refuses_to_drop_foreign_objects(engine):
    install_queue(engine, "orders")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE queuectl.someone_elses (id int)"))
    with pytest.raises(Exception, match="not created by queuectl"):
        remove_everything(engine)
    assert "someone_elses" in schema_objects(engine)["relations"]


def test_installing_twice_is_refused_and_changes_nothing(engine):
    install_queue(engine, "orders")
    before = schema_objects(engine)
    with pytest.raises(UsageError, match="already installed"):
        install_queue(engine, "orders")
    assert schema_objects(engine) == before


def test_queue_in_a_custom_schema(engine):
    install_queue(engine, "orders", schema="billing")
    with Queue(engine, "orders", schema="billing") as queue:
        queue.enqueue("x")
        assert len(queue.dequeue(1)) == 1
    assert schema_objects(engine, "queuectl")["schema"] == 0
    with pytest.raises(NotInstalledError):
        Queue(engine, "orders")


def test_uninstalling_a_missing_queue_is_a_clear_error(engine):
    with pytest.raises(NotInstalledError, match="queuectl install nothere"):
        uninstall_queue(engine, "nothere")
