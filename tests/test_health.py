"""`queuectl health`: each condition is created for real on the test server and must be
flagged with the right severity and a concrete piece of advice; a healthy queue is quiet."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
import uuid

import jsonschema
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from jobs_helpers import invoke, wait_until
from queuectl.catalog import QueueSettings
from queuectl.client import Queue
from queuectl.engine import make_engine
from queuectl.errors import UsageError
from queuectl.health import Check, HealthOptions, HealthReport, health_report, load_config, report_schema
from queuectl.thresholds import CRITICAL, DEFAULT_THRESHOLDS, INFO, OK, WARNING, apply_settings, parse_value
from queuectl.install import install_queue

from conftest import run_cli


def report(engine: Engine, *settings: str, queues: list[str] | None = None, **options) -> HealthReport:
    return health_report(engine, queues, options=HealthOptions(**options).with_settings(settings))


def the(rep: HealthReport, check_id: str, obj: str | None = None) -> Check:
    found = [c for c in rep.checks if c.id == check_id and (obj is None or c.object == obj)]
    assert len(found) == 1, f"expected one {check_id} {obj or ''} check, got {found}"
    return found[0]


def vacuum(engine: Engine, table: str) -> None:
    """VACUUM reports the dead tuples it could not remove straight to the statistics."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f"VACUUM (ANALYZE) queuectl.{table}"))


def churn(queue: Queue, n: int, batch: int = 1000) -> None:
    """n items through the whole life cycle: enqueue, dequeue, ack (three row versions each)."""
    for start in range(0, n, batch):
        queue.enqueue_many([b"x"] * min(batch, n - start))
        queue.ack(queue.dequeue(batch))


def advice_lines(stdout: bytes) -> list[str]:
    return [ln for ln in stdout.decode().splitlines() if ln.startswith(("WARNING", "CRITICAL"))]


# -- a healthy queue ------------------------------------------------------------------------------


@pytest.mark.slow
def test_healthy_queue_exits_0_with_no_advice_lines(orders, db_url):
    orders.enqueue_many([f"order {i}".encode() for i in range(50)])
    orders.ack(orders.dequeue(20))
    orders.enqueue(b"later", delay=3600)

    result = run_cli("health", url=db_url)
    text = result.stdout.decode()
    assert result.returncode == 0, text + result.stderr.decode()
    assert "Advice" not in text and advice_lines(result.stdout) == []
    assert ": OK" in text.splitlines()[0]
    assert "Jobs: no runs recorded" in text

    data = json.loads(run_cli("health", "--json", url=db_url).stdout)
    assert data["verdict"] == "OK" and data["exit_code"] == 0
    assert all(c["status"] in (OK, INFO) and c["advice"] is None for c in data["checks"])
    [q] = data["queues"]
    assert q["depth"] == {"ready": 30, "scheduled": 1, "processing": 0, "done": 20, "dead": 0}
    assert q["rates"]["enqueued"] == 51 and q["rates"]["completed"] == 20
    # reliable_0012: meta and data are three generation slots each; the parents hold no rows
    assert {"orders_meta0", "orders_meta1", "orders_meta2", "orders_data0", "orders_data1", "orders_data2",
            "orders_history"} == {t["table"] for t in data["storage"]["tables"]}


# -- cleanup blockers -----------------------------------------------------------------------------


@pytest.mark.slow
def test_open_transaction_with_dead_rows_piling_up_names_the_pid(orders, engine, db_url):
    holder = engine.connect().execution_options(isolation_level="REPEATABLE READ")
    try:
        holder.begin()
        pid = holder.execute(sa.select(sa.func.pg_backend_pid())).scalar_one()  # takes the snapshot
        churn(orders, 3000)
        vacuum(engine, "orders_meta")  # cannot remove what the snapshot may still see

        wait_until(lambda: the(report(engine, "xact_age.warn=1s"), "blockers.session").status != OK,
                   timeout=15, interval=0.1)
        rep = report(engine, "xact_age.warn=1s", "dead_tuples.warn=1000")
        session = the(rep, "blockers.session", f"pid {pid}")
        assert session.status == WARNING
        assert f"transaction pid {pid}" in session.advice and "end it" in session.advice
        assert f"pg_terminate_backend({pid})" in session.advice
        held = rep.to_dict()["blockers"]["dead_tuples_in_queue_tables"]
        assert held >= 6000  # dequeue and ack each left a dead version of all 3000 rows
        dead = the(rep, "storage.dead_tuples", "orders_meta0")  # no rotation ran: all in slot 0
        assert dead.status == WARNING and dead.value >= 6000
        assert f"pid {pid}" in dead.advice and "holds the xmin horizon" in dead.advice
        assert rep.exit_code == 1

        # Past the critical age the CLI says CRITICAL and exits 2.
        result = run_cli("health", "--json", "--set", "xact_age.warn=1s", "--set", "xact_age.crit=1s", url=db_url)
        data = json.loads(result.stdout)
        assert result.returncode == 2 and data["verdict"] == CRITICAL
        [c] = [c for c in data["checks"] if c["object"] == f"pid {pid}"]
        assert c["status"] == CRITICAL and f"pid {pid}" in c["advice"]
    finally:
        holder.rollback()
        holder.close()

    # The holder gone, VACUUM removes the dead rows and nothing is flagged any more.
    vacuum(engine, "orders_meta")
    rep = report(engine, "xact_age.warn=1s", "dead_tuples.warn=1000")
    assert the(rep, "blockers.session").status == OK
    assert the(rep, "storage.dead_tuples", "orders_meta0").value < 1000


def test_idle_in_transaction_session_is_flagged(orders, engine):
    idle = engine.connect()
    try:
        idle.begin()
        pid = idle.execute(sa.select(sa.func.pg_backend_pid())).scalar_one()  # read committed: no snapshot kept
        wait_until(lambda: the(report(engine, "idle_in_transaction.warn=1s"), "blockers.session").status != OK,
                   timeout=15, interval=0.1)
        check = the(report(engine, "idle_in_transaction.warn=1s"), "blockers.session", f"pid {pid}")
        assert check.status == WARNING and "idle in transaction" in check.advice
        assert f"pg_terminate_backend({pid})" in check.advice
    finally:
        idle.rollback()
        idle.close()


def test_inactive_replication_slot_is_flagged_cluster_wide(orders, engine):
    slot = f"qt_health_{uuid.uuid4().hex[:8]}"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.select(sa.func.pg_create_physical_replication_slot(slot, True)))
        try:
            check = the(report(engine), "blockers.replication_slot", slot)
            assert check.status == WARNING and "INACTIVE" in check.summary
            assert f"pg_drop_replication_slot('{slot}')" in check.advice
        finally:
            conn.execute(sa.select(sa.func.pg_drop_replication_slot(slot)))
    assert not [c for c in report(engine).checks if c.object == slot]


# -- queue conditions ------------------------------------------------------------------------------


def test_expired_lease_is_a_stuck_item(orders, engine):
    orders.enqueue_many([b"a", b"b", b"c"])
    orders.dequeue(2, lease=0.2)  # the consumer "dies": never acks

    rep = wait_until(lambda: (r := report(engine)) and the(r, "queue.stuck_items").value == 2 and r,
                     timeout=15, interval=0.1)
    stuck = the(rep, "queue.stuck_items", "orders")
    assert stuck.status == WARNING
    assert "2 item(s) hold leases that expired" in stuck.advice
    assert the(report(engine, "stuck_items.crit=2"), "queue.stuck_items").status == CRITICAL
    assert the(report(engine, "stuck_items.warn=3"), "queue.stuck_items").status == OK


def test_dead_letters_over_threshold(engine):
    install_queue(engine, "mail", settings=QueueSettings(max_attempts=1))
    with Queue(engine, "mail") as mail:
        mail.enqueue_many([b"m"] * 5)
        mail.nack(mail.dequeue(5), "smtp refused")

    assert the(report(engine), "queue.dead_letters", "mail").status == WARNING  # default: any dead letter
    assert the(report(engine, "dead_letters.warn=10"), "queue.dead_letters").status == OK
    check = the(report(engine, "dead_letters.crit=5"), "queue.dead_letters", "mail")
    assert check.status == CRITICAL and check.value == 5
    assert "5 dead letter(s)" in check.advice and "last_error" in check.advice


def test_oldest_ready_item_older_than_threshold(orders, engine):
    old = orders.enqueue(b"forgotten")
    orders.enqueue(b"fresh")
    with engine.begin() as conn:  # the item has waited two hours
        meta = sa.table("orders_meta", sa.column("id"), sa.column("due_at"), sa.column("enqueued_at"), schema="queuectl")
        conn.execute(sa.update(meta).where(meta.c.id == old).values(
            due_at=sa.func.now() - sa.text("interval '2 hours'"), enqueued_at=sa.func.now() - sa.text("interval '2 hours'")))

    rep = report(engine)
    check = the(rep, "queue.oldest_ready_age", "orders")
    assert check.status == CRITICAL and 7100 < check.value < 7300
    assert "waited 2h" in check.advice and "are consumers running?" in check.advice
    assert rep.exit_code == 2
    warn_only = the(report(engine, "oldest_ready_age.crit=3h"), "queue.oldest_ready_age")
    assert warn_only.status == WARNING


# -- storage ---------------------------------------------------------------------------------------


def test_bloated_index_after_churn_is_measured_with_pgstatindex(orders, engine):
    """20k items pass through the ready index; one in ten comes back READY. After VACUUM
    the partial index keeps all its leaf pages with a tenth of their entries."""
    # No autovacuum in between: on a slow machine it could run while every item is held
    # (all 20k ready entries dead), empty and delete the leaf pages before the release,
    # and the test would measure a fresh, small index instead of the churned one.
    with engine.connect() as conn:
        conn.execute(sa.text("ALTER TABLE queuectl.orders_meta0 SET (autovacuum_enabled = false)"))
        conn.commit()
    for _ in range(4):  # no rotation runs here: every row stays in slot 0
        orders.enqueue_many([b"x"] * 5000)
    taken = [m for _ in range(20) for m in orders.dequeue(1000)]
    orders.release([m for m in taken if m.id % 10 == 0])
    orders.ack([m for m in taken if m.id % 10 != 0])
    vacuum(engine, "orders_meta")

    rep = report(engine, index_min_pages=10)  # far below reorganize's 1000-page default: named in the advice
    assert rep.facts.pgstattuple in ("installed", "created")
    [ready] = [ix for ix in rep.to_dict()["storage"]["indexes"] if ix["index"] == "orders_meta0_ready"]
    assert ready["leaf_pages"] >= 50 and ready["avg_leaf_density"] < 20
    check = the(rep, "storage.index_bloat", "orders_meta0_ready")
    assert check.status == CRITICAL and check.value > 60
    assert check.advice.startswith("index orders_meta0_ready")
    assert "run queuectl reorganize orders --min-pages 10" in check.advice
    # The payload table's primary key only ever saw inserts: dense, not flagged.
    assert the(rep, "storage.index_bloat", "orders_data0_pkey").status == OK
    # VACUUM freed two of the three row versions of the meta table: free space the file keeps.
    table = the(report(engine, "table_bloat.warn=20"), "storage.table_bloat", "orders_meta0")
    assert table.status == WARNING and table.value > 20 and "pg_repack" in table.advice


def test_invalid_index_left_by_a_failed_concurrent_build_is_flagged(orders, engine):
    orders.enqueue_many([b"a", b"b"])  # same priority: a unique index on it cannot be built
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        with pytest.raises(sa.exc.IntegrityError):
            conn.execute(sa.text("CREATE UNIQUE INDEX CONCURRENTLY orders_meta_prio ON queuectl.orders_meta0 (priority)"))
    check = the(report(engine), "storage.invalid_index", "orders_meta_prio")
    assert check.status == WARNING
    assert "DROP INDEX CONCURRENTLY queuectl.orders_meta_prio" in check.advice


def test_without_pgstattuple_rights_the_report_degrades_with_a_note(orders, engine, admin_engine, db_url):
    """A role that may not CREATE EXTENSION still gets a verdict; density is an INFO note."""
    role = f"qt_mon_{uuid.uuid4().hex[:8]}"
    with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN"))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"GRANT USAGE ON SCHEMA queuectl TO {role}"))
            conn.execute(sa.text(f"GRANT SELECT ON ALL TABLES IN SCHEMA queuectl TO {role}"))
        monitor = make_engine(make_url(db_url).set(username=role).render_as_string(hide_password=False))
        try:
            rep = report(monitor)
        finally:
            monitor.dispose()
        assert rep.facts.pgstattuple.startswith("unavailable: CREATE EXTENSION pgstattuple failed")
        note = the(rep, "storage.pgstattuple")
        assert note.status == INFO and "ask a superuser" in note.summary
        assert rep.verdict == OK and rep.exit_code == 0
        assert any("pg_read_all_stats" in n for n in rep.facts.notes)
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP OWNED BY {role}"))
        with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f"DROP ROLE {role}"))


def test_pgstatindex_denied_and_a_locked_queue_become_notes_not_a_failed_report(orders, engine, admin_engine, db_url):
    """pgstatindex needs pg_stat_scan_tables; a queue locked by DDL hits the lock timeout."""
    install_queue(engine, "mail")
    role = f"qt_mon_{uuid.uuid4().hex[:8]}"
    with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN"))
    locker = engine.connect()
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pgstattuple"))
            conn.execute(sa.text(f"GRANT USAGE ON SCHEMA queuectl TO {role}"))
            conn.execute(sa.text(f"GRANT SELECT ON ALL TABLES IN SCHEMA queuectl TO {role}"))
        locker.begin()
        locker.execute(sa.text("LOCK TABLE queuectl.mail_meta IN ACCESS EXCLUSIVE MODE"))
        monitor = make_engine(make_url(db_url).set(username=role).render_as_string(hide_password=False))
        try:
            rep = health_report(monitor, options=HealthOptions(lock_timeout_ms=300))
        finally:
            monitor.dispose()
        assert any(n.startswith("pgstatindex not read: permission denied") for n in rep.facts.notes), rep.facts.notes
        assert all(ix.get("physical") is None for ix in rep.facts.indexes)
        locked = the(rep, "queue.probe", "mail")
        assert locked.status == WARNING and "lock timeout" in locked.advice
        assert the(rep, "queue.oldest_ready_age", "orders").status == OK
        assert any(n.startswith("locked in ACCESS EXCLUSIVE mode") and "mail_meta" in n for n in rep.facts.notes)
        jsonschema.validate(rep.to_dict(), report_schema())
    finally:
        locker.rollback()
        locker.close()
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP OWNED BY {role}"))
        with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f"DROP ROLE {role}"))


# -- jobs --------------------------------------------------------------------------------------------


def test_job_history_is_read_when_the_scheduler_table_exists(orders, engine):
    """The catalog's job_runs table (written by the job runner) is read back and graded."""
    runs = sa.Table("job_runs", sa.MetaData(), schema="queuectl", autoload_with=engine)
    ago = lambda minutes: sa.func.now() - sa.func.make_interval(0, 0, 0, 0, 0, minutes)  # noqa: E731
    with engine.begin() as conn:
        conn.execute(runs.insert().values(job="archive", queue="orders", started_at=ago(10), finished_at=ago(9),
                                          rows=500, outcome="succeeded", runner_host="h1", runner_pid=1))
        for minutes in (50, 30, 5):
            conn.execute(runs.insert().values(job="reorganize", queue="orders", started_at=ago(minutes),
                                              finished_at=ago(minutes - 1), rows=0, outcome="failed", runner_host="h1", runner_pid=1,
                                              error="canceling statement due to lock timeout"))
    rep = report(engine)
    archive = the(rep, "jobs.last_run", "archive on orders")
    assert archive.status == OK and archive.advice is None
    reorganize = the(rep, "jobs.last_run", "reorganize on orders")
    assert reorganize.status == CRITICAL  # 3 failures in a day
    assert "failed 3 time(s)" in reorganize.advice and "lock timeout" in reorganize.advice
    [row] = [r for r in rep.to_dict()["jobs"]["runs"] if r["job"] == "archive"]
    assert row["rows"] == 500 and 59 < row["duration_s"] < 61 and row["last_success_at"] is not None


# -- output forms ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_json_output_validates_against_the_schema_in_the_repository(orders, engine, db_url):
    orders.enqueue_many([b"x"] * 10)
    orders.dequeue(3, lease=0.1)
    holder = engine.connect()
    try:
        holder.begin()
        holder.execute(sa.select(sa.func.txid_current()))  # an xid: a real blocker row in the report
        result = run_cli("health", "--json", "--set", "xact_age.warn=0s", url=db_url)
    finally:
        holder.rollback()
        holder.close()
    data = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(report_schema())
    jsonschema.validate(data, report_schema(), format_checker=jsonschema.FormatChecker())
    assert result.returncode == data["exit_code"] == 1
    assert data["blockers"]["sessions"] and any(c["status"] == WARNING for c in data["checks"])
    # The schema is not vacuous: a check with a non-OK status must carry advice.
    broken = json.loads(result.stdout)
    [bad] = [c for c in broken["checks"] if c["status"] == WARNING][:1]
    bad["advice"] = None
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, report_schema())


@pytest.mark.slow
def test_piped_output_is_plain_text_with_advice_lines(orders, engine, db_url):
    orders.enqueue_many([b"x"] * 4)
    orders.dequeue(1, lease=0.1)
    wait_until(lambda: the(report(engine), "queue.stuck_items").value == 1, timeout=15, interval=0.1)
    result = run_cli("health", "orders", url=db_url)
    text = result.stdout.decode()
    assert result.returncode == 1
    assert "\x1b[" not in text  # no colour codes
    assert not re.search(r"[─━│┃┌┏╭╰═]", text)  # no box drawing
    counts = re.search(r": WARNING  \((\d+) critical, (\d+) warning, (\d+) info, (\d+) ok\)$", text.splitlines()[0])
    rep = report(engine)  # the JSON's counts, INFO included (here: no job history yet)
    assert counts and [int(n) for n in counts.groups()] == [rep.to_dict()["counts"][s] for s in (CRITICAL, WARNING, INFO, OK)]
    assert rep.to_dict()["counts"][INFO] >= 1
    [line] = advice_lines(result.stdout)
    assert line.startswith("WARNING  queue orders: 1 item(s) hold leases that expired")
    assert re.search(r"^orders\s+reliable\s+3\s+0\s+1\s+0\s+0\s", text, re.MULTILINE)


@pytest.mark.slow
def test_unknown_queue_and_bad_thresholds_are_one_line_unknown_exit_3(orders, db_url):
    for args, words in (
        (["health", "nosuch"], "not installed"),
        (["health", "--set", "oldest_ready_age.warn=soon"], "not a duration"),
        (["health", "--config", "/nonexistent/queuectl.toml"], "cannot read config"),
    ):
        result = run_cli(*args, url=db_url)
        lines = [ln for ln in result.stderr.decode().splitlines() if ln.strip()]
        assert result.returncode == 3, (args, result.stderr)
        assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], lines
        assert result.stdout == b""
    helped = run_cli("health", "--help")
    assert helped.returncode == 0 and b"3 UNKNOWN" in helped.stdout and b"oldest_ready_age (5m/1h)" in helped.stdout


@pytest.mark.parametrize("mode", [(), ("--json",), ("--watch", "0.5"), ("--watch", "0.5", "--json")],
                         ids=["text", "json", "watch", "watch-json"])
@pytest.mark.slow
def test_an_internal_error_is_one_line_unknown_exit_3(orders, db_url, capsys, monkeypatch, mode):
    """A fault of queuectl's own (forced here in the grading step) is no verdict: never exit 1
    (which a monitor reads as WARNING), never a traceback."""
    import queuectl.health

    def broken(*args, **kwargs):
        raise RuntimeError("grading [/x] broke")

    monkeypatch.setattr(queuectl.health, "evaluate", broken)
    code, out, err = invoke(capsys, monkeypatch, "health", *mode, url=db_url)
    assert code == 3, err
    assert err.splitlines() == ["internal error: RuntimeError: grading [/x] broke (a queuectl bug: please report it)"]
    assert out == ""


@pytest.mark.slow
def test_config_file_sets_thresholds_and_set_wins(tmp_path, orders, db_url):
    orders.enqueue(b"x")
    config = tmp_path / "queuectl.toml"
    config.write_text('[health]\nrate_window = "1m"\n[health.thresholds]\noldest_ready_age = { warn = "0s", crit = "1h" }\n')
    data = json.loads(run_cli("health", "--json", "--config", str(config), url=db_url).stdout)
    assert data["verdict"] == WARNING and data["queues"][0]["rates"]["window_s"] == 60
    assert data["thresholds"]["oldest_ready_age"] == {"unit": "seconds", "warn": 0, "crit": 3600}
    result = run_cli("health", "--config", str(config), "--set", "oldest_ready_age.warn=off", url=db_url)
    assert result.returncode == 0


def test_threshold_values_parse_with_units():
    assert parse_value("seconds", "90s") == 90 and parse_value("seconds", "5m") == 300
    assert parse_value("seconds", "2h") == 7200 and parse_value("seconds", "500ms") == 0.5
    assert parse_value("count", "10k") == 10_000 and parse_value("count", "1.5M") == 1_500_000
    assert parse_value("percent", "61%") == 61 and parse_value("count", "off") is None
    for unit, bad in (("seconds", "5 minutes"), ("count", "lots"), ("percent", "150")):
        with pytest.raises(UsageError):
            parse_value(unit, bad)
    changed = apply_settings(DEFAULT_THRESHOLDS, ["dead_tuples.crit=off", "stuck_items.warn=5"])
    assert changed["dead_tuples"].crit is None and changed["stuck_items"].warn == 5
    assert DEFAULT_THRESHOLDS["stuck_items"].warn == 1  # defaults untouched
    with pytest.raises(UsageError, match="unknown health threshold"):
        apply_settings(DEFAULT_THRESHOLDS, ["no_such_check.warn=1"])
    with pytest.raises(UsageError, match="above crit"):
        apply_settings(DEFAULT_THRESHOLDS, ["dead_letters.warn=10", "dead_letters.crit=5"])
    with pytest.raises(UsageError, match="NAME.warn=VALUE"):
        apply_settings(DEFAULT_THRESHOLDS, ["dead_letters=10"])
    with pytest.raises(UsageError):
        load_config("/nonexistent.toml")


def test_a_queue_kind_without_a_probe_is_a_warning_not_a_silent_pass(orders, engine):
    """A kind this queuectl has no probe for (e.g. installed by a newer version) is flagged."""
    registry = sa.table("queues", sa.column("name"), sa.column("kind"), sa.column("schema_version"),
                        sa.column("settings"), schema="queuectl")
    with engine.begin() as conn:
        conn.execute(sa.insert(registry).values(name="ring1", kind="quantum", schema_version="quantum_0001",
                                                settings=sa.text("'{}'::jsonb")))
    rep = report(engine)
    check = the(rep, "queue.probe", "ring1")
    assert check.status == WARNING and "kind 'quantum'" in check.advice
    assert the(rep, "queue.oldest_ready_age", "orders").status == OK


def _cli_process(url: str, *args: str, stdout=subprocess.PIPE) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "QUEUECTL_URL"}
    env.update(QUEUECTL_URL=url, COLUMNS="160", TERM="xterm")
    # SIGINT as a terminal delivers it: a suite started in the background by a shell without
    # job control inherits SIGINT ignored, and Python then never raises KeyboardInterrupt
    return subprocess.Popen([sys.executable, "-m", "queuectl.cli", *args], stdout=stdout,
                            stderr=subprocess.PIPE, env=env, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_watch_piped_with_json_prints_one_report_per_refresh_until_ctrl_c(orders, db_url):
    proc = _cli_process(db_url, "health", "--watch", "0.5", "--json")
    try:
        lines = [json.loads(proc.stdout.readline()) for _ in range(3)]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0  # the last verdict's code
    finally:
        proc.kill()
    assert [d["verdict"] for d in lines] == ["OK"] * 3
    assert lines[0]["generated_at"] < lines[1]["generated_at"] < lines[2]["generated_at"]


@pytest.mark.slow
def test_watch_on_a_terminal_refreshes_in_place(orders, db_url):
    orders.enqueue(b"x")
    leader, follower = pty.openpty()
    proc = _cli_process(db_url, "health", "--watch", "0.5", "--set", "oldest_ready_age.warn=0s", stdout=follower)
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while seen.count(b"refreshing every 0.5s") < 2 and time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                seen += os.read(leader, 65536)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 1  # WARNING: the item is older than 0s
    finally:
        proc.kill()
        os.close(leader)
    assert seen.count(b"refreshing every 0.5s") >= 2
    assert b"\x1b[" in seen  # colour and cursor movement: rich Live, not appended reports
    assert b"\x1b[2K" in seen or b"\x1b[1A" in seen  # lines erased / cursor up = redrawn in place


def test_every_queue_kind_reports_its_depth_and_kind_checks(engine):
    """heap, fifo, stack, pending, watermark and ring each get a probe: depth, due/scheduled,
    oldest waiting age, ring fill and watermark lag, with the JSON still valid."""
    from queuectl.client import open_queue
    from queuectl.kindspec import RingSettings

    for kind in ("heap", "fifo", "stack", "pending", "watermark"):
        install_queue(engine, f"q_{kind}", kind)
    install_queue(engine, "q_ring", "ring", RingSettings(size=16))
    for kind in ("heap", "fifo", "stack", "watermark", "ring"):
        with open_queue(engine, f"q_{kind}") as q:
            q.enqueue_many([f"{kind}-{i}" for i in range(13)])
    with open_queue(engine, "q_pending") as q:
        q.enqueue_many([f"now-{i}" for i in range(4)])
        q.enqueue_many([f"later-{i}" for i in range(3)], delay=3600)

    rep = report(engine, "ring_fill.warn=50", "ring_fill.crit=90")
    jsonschema.validate(rep.to_dict(), report_schema())
    queues = {q["name"]: q for q in rep.to_dict()["queues"]}
    for kind in ("heap", "fifo", "stack", "watermark", "ring"):
        assert queues[f"q_{kind}"]["depth"]["ready"] == 13, queues[f"q_{kind}"]
    assert (queues["q_pending"]["depth"]["ready"], queues["q_pending"]["depth"]["scheduled"]) == (4, 3)
    assert not [c for c in rep.checks if c.id == "queue.probe"]  # every kind was probed

    ring = the(rep, "queue.ring_fill", "q_ring")
    assert (ring.status, ring.value) == (WARNING, 81.25)  # 13 of 16 slots
    assert "add consumers" in ring.advice
    lag = the(rep, "queue.watermark_lag", "q_watermark")
    assert lag.status == OK and lag.advice is None


def test_watermark_above_a_waiting_item_is_critical_with_the_fix(engine):
    from queuectl.client import open_queue

    install_queue(engine, "wm", "watermark")
    with open_queue(engine, "wm") as q:
        ids = q.enqueue_many([f"m{i}" for i in range(5)])
    with engine.begin() as conn:
        conn.execute(sa.text('UPDATE queuectl."wm_watermark" SET low = :low'), {"low": ids[3]})
    lag = the(report(engine, queues=["wm"]), "queue.watermark_lag", "wm")
    assert lag.status == CRITICAL and lag.value == -3
    assert "queuectl correct-watermark wm" in lag.advice

    with engine.begin() as conn:
        conn.execute(sa.text('UPDATE queuectl."wm_watermark" SET low = :low'), {"low": ids[0]})
    with open_queue(sa.create_engine(str(engine.url.render_as_string(hide_password=False)), poolclass=sa.pool.NullPool), "wm") as q:
        assert [m.id for m in q.dequeue(3)] == ids[:3]
    with engine.begin() as conn:  # too low: new sessions walk the three dequeued rows' ghosts again
        conn.execute(sa.text('UPDATE queuectl."wm_watermark" SET low = :low'), {"low": ids[0]})
    lag = the(report(engine, "watermark_lag.warn=2", queues=["wm"]), "queue.watermark_lag", "wm")
    assert (lag.status, lag.value) == (WARNING, 3)
    assert "correction job" in lag.advice
