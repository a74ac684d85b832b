"""The health facts as Prometheus / OpenMetrics metrics: `queuectl health --format openmetrics`
and `queuectl metrics serve`, read back with prometheus_client's own parsers and compared with
what the database holds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import sqlalchemy as sa
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_prometheus
from sqlalchemy.engine import make_url

from conftest import run_cli
from jobs_helpers import invoke, wait_until
from queuectl.engine import make_engine
from queuectl.health import health_report
from queuectl.metrics import HealthCollector, exposition, families
from test_secrets import leaks, login  # noqa: F401  (login: a role with a distinctive password)

# Label values written by anyone: a job name, an application name, a role name. Each holds
# what the text formats must escape (quote, backslash, newline) and what would end a label set.
HOSTILE_JOB = 'nightly "x"} 1\nqueuectl_up 0 \\'
HOSTILE_APP = 'app "q"} \\ {x="1"}'
HOSTILE_ROLE = 'ro"le} \\ x'


def samples(text: str, parse=parse_openmetrics) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for family in parse(text) for s in family.samples]


def value(found: list, name: str, **labels: str) -> float:
    matches = [v for n, lab, v in found if n == name and labels.items() <= lab.items()]
    assert len(matches) == 1, f"{name} {labels}: {matches}"
    return matches[0]


def fill_orders(orders) -> None:
    """2 dead, 6 ready, 3 processing, 1 done, 1 scheduled: 13 enqueued in the rate window."""
    orders.enqueue_many([b"doomed-1", b"doomed-2"])
    for _ in range(5):  # max_attempts is 5
        orders.nack(orders.dequeue(2), "boom", base_delay=0)
    orders.enqueue_many([f"order {i}".encode() for i in range(10)])
    taken = orders.dequeue(4)
    orders.ack(taken[:1])
    orders.enqueue(b"later", delay=3600)


def test_health_openmetrics_says_what_the_database_holds_and_escapes_label_values(orders, engine, db_url, admin_engine):
    fill_orders(orders)
    assert orders.counts() == {"ready": 6, "scheduled": 1, "processing": 3, "done": 1, "dead": 2}
    runs = sa.Table("job_runs", sa.MetaData(), schema="queuectl", autoload_with=engine)
    ago = lambda minutes: sa.func.now() - sa.func.make_interval(0, 0, 0, 0, 0, minutes)  # noqa: E731
    with engine.begin() as conn:
        conn.execute(runs.insert().values(job="archive", queue="orders", started_at=ago(10), finished_at=ago(9),
                                          rows=500, outcome="succeeded", runner_host="h", runner_pid=1))
        conn.execute(runs.insert().values(job=HOSTILE_JOB, queue="orders", started_at=ago(3), finished_at=ago(2),
                                          rows=0, outcome="failed", runner_host="h", runner_pid=1, error="x"))
    with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("SELECT set_config('qt.role', :r, false)"), {"r": HOSTILE_ROLE})
        conn.execute(sa.text("DO $$ BEGIN EXECUTE format('CREATE ROLE %I LOGIN', current_setting('qt.role')); END $$"))
    holder_engine = sa.create_engine(make_url(db_url).set(username=HOSTILE_ROLE), poolclass=sa.pool.NullPool)
    holder = holder_engine.connect()
    try:
        holder.execute(sa.text("SELECT set_config('application_name', :a, false)"), {"a": HOSTILE_APP})
        holder.commit()
        holder.execute(sa.select(sa.func.txid_current()))  # holds an xid: a cleanup blocker
        result = run_cli("health", "--format", "openmetrics", url=db_url)
        report = health_report(engine)
    finally:
        holder.rollback()
        holder.close()
        holder_engine.dispose()
        with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("DO $$ BEGIN EXECUTE format('DROP ROLE %I', current_setting('qt.role')); END $$"))

    text = result.stdout.decode()
    assert result.returncode == 1, result.stderr.decode()  # dead letters and a failed job: WARNING
    assert text.endswith("# EOF\n") and result.stderr == b""
    found = samples(text)
    q = {"schema": "queuectl", "queue": "orders", "kind": "reliable"}
    depth = {status: value(found, "queuectl_queue_items", **q, status=status) for status in orders.counts()}
    assert depth == {k: float(v) for k, v in orders.counts().items()}
    assert value(found, "queuectl_health_status") == 1.0
    assert value(found, "queuectl_queue_rate_window_seconds", **q) == 300.0
    assert value(found, "queuectl_queue_enqueue_rate", **q) * 300 == pytest.approx(13)
    assert value(found, "queuectl_queue_dequeue_rate", **q) * 300 == pytest.approx(2 + 4)  # the dead ones, then 4
    assert value(found, "queuectl_queue_completion_rate", **q) * 300 == pytest.approx(1)
    assert value(found, "queuectl_queue_dead_letter_rate", **q) * 300 == pytest.approx(2)
    assert 0 < value(found, "queuectl_queue_oldest_ready_age_seconds", **q) < 60
    assert value(found, "queuectl_queue_rotation_lag", **q) == 13.0  # every id so far, no rotation ran
    assert value(found, "queuectl_index_valid", index="orders_meta0_pkey") == 1.0
    assert value(found, "queuectl_index_scans_total", index="orders_meta0_pkey") >= 0

    # free text comes back exactly as written: escaped, never a label set or a sample of its own
    session = value(found, "queuectl_cleanup_session_transaction_age_seconds", role=HOSTILE_ROLE, application=HOSTILE_APP)
    assert 0 <= session <= value(found, "queuectl_cleanup_oldest_xmin_age_seconds")
    assert value(found, "queuectl_job_last_run_outcome", job_name=HOSTILE_JOB, queue="orders", outcome="failed") == 1.0
    assert value(found, "queuectl_job_failures", job_name=HOSTILE_JOB) == 1.0
    assert value(found, "queuectl_job_last_run_duration_seconds", job_name="archive", queue="orders") == pytest.approx(60)
    assert value(found, "queuectl_job_last_run_rows", job_name="archive") == 500.0
    assert not any(s[0] == "queuectl_up" for s in found)  # the job name's "queuectl_up 0" stayed in its label

    # the Prometheus text format of the same facts, for node_exporter's textfile collector
    prom = samples(exposition(report, "prometheus").decode(), parse_prometheus)
    assert value(prom, "queuectl_queue_items", **q, status="dead") == 2.0
    [meta] = [t for t in report.to_dict()["storage"]["tables"] if t["table"] == "orders_meta0"]
    assert value(prom, "queuectl_table_dead_rows", table="orders_meta0") == meta["dead_tuples"]
    assert value(prom, "queuectl_table_size_bytes", table="orders_meta0") == meta["table_bytes"] > 0
    assert value(prom, "queuectl_job_last_run_outcome", job_name=HOSTILE_JOB, outcome="failed") == 1.0
    assert {n for n, _, _ in prom} == {n for n, _, _ in found}
    assert all(n.startswith("queuectl_") for n, _, _ in found)


def test_health_format_options_and_help(capsys, monkeypatch):
    code, out, err = invoke(capsys, monkeypatch, "health", "--json", "--format", "openmetrics")
    assert code == 3 and out == "" and err.count("\n") == 1 and "--json and --format openmetrics" in err
    code, out, err = invoke(capsys, monkeypatch, "health", "--format", "prometheus", "--watch", "5")
    assert code == 3 and "queuectl metrics serve" in err and "Traceback" not in err
    code, out, _ = invoke(capsys, monkeypatch, "health", "--help")
    assert code == 0 and "openmetrics" in out and "prometheus" in out
    code, out, _ = invoke(capsys, monkeypatch, "metrics", "serve", "--help")
    assert code == 0 and "--port" in out and "loopback" in out and "SIGTERM" in out
    code, out, err = invoke(capsys, monkeypatch, "metrics", "serve", "--port", "70000")
    assert code == 2 and "--port must be from 0 to 65535" in err


def test_a_slow_gathering_answers_up_0_within_the_timeout_and_is_shared(orders, engine):
    """A scrape never waits longer than the timeout; scrapes during a slow gathering share it
    instead of piling more queries on the server."""
    calls, errors = [], []

    def gather():
        calls.append(time.monotonic())
        if len(calls) == 1:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT pg_sleep(0.8)"))
        return health_report(engine)

    collector = HealthCollector(gather, "queuectl", timeout=0.2, on_error=errors.append)
    started = time.monotonic()
    first, second = list(collector.collect()), list(collector.collect())
    assert time.monotonic() - started < 0.8
    for scrape in (first, second):
        assert [f.samples[0].value for f in scrape if f.name == "queuectl_up"] == [0.0]
        assert not any(f.name == "queuectl_queue_items" for f in scrape)
    assert len(calls) == 1 and [str(e) for e in errors] == ["health facts not gathered within 0.2 s"] * 2
    wait_until(lambda: collector._running.done(), timeout=10)
    collector._timeout = 60  # the next scrape gathers anew, however slow this machine is now
    fresh = {f.name: f for f in collector.collect()}
    assert len(calls) == 2 and fresh["queuectl_up"].samples[0].value == 1.0
    assert {f.name for f in families(health_report(engine))} <= set(fresh)


def _serve(url: str, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "QUEUECTL_URL"}
    env["QUEUECTL_URL"] = url
    return subprocess.Popen([sys.executable, "-m", "queuectl.cli", "metrics", "serve", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _scrape(url: str, accept: str | None = None) -> tuple[str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=20) as response:
        return response.headers["Content-Type"], response.read().decode()


@pytest.mark.slow
def test_metrics_serve_is_scraped_fresh_hides_the_password_and_stops_on_sigterm_and_ctrl_c(
        orders, login, admin_engine, db_url):  # noqa: F811
    by_sigint = _serve(login["good"], "--port", "0", "--timeout", "3")
    by_sigterm = _serve(login["good"], "--port", "0", "--timeout", "3")
    procs = [by_sigint, by_sigterm]
    database = make_url(db_url).database
    try:
        starts = [p.stdout.readline() for p in procs]
        for line in starts:
            assert line.startswith("serving http://127.0.0.1:") and "***" in line and not leaks(line), line
        endpoint = starts[1].split()[1]
        taken = run_cli("metrics", "serve", "--port", endpoint.rsplit(":", 1)[1].split("/")[0], url=login["good"])
        assert taken.returncode == 2 and taken.stderr.decode().startswith("error: cannot listen on 127.0.0.1 port")

        orders.enqueue_many([b"a", b"b"])
        kind, text = _scrape(endpoint, "application/openmetrics-text; version=1.0.0")
        assert kind.startswith("application/openmetrics-text")
        found = samples(text)
        assert value(found, "queuectl_up") == 1.0
        assert value(found, "queuectl_queue_items", queue="orders", status="ready") == 2.0

        orders.enqueue_many([b"c", b"d", b"e"])  # each scrape gathers afresh
        kind, text = _scrape(endpoint)
        assert kind.startswith("text/plain")
        assert value(samples(text, parse_prometheus), "queuectl_queue_items", queue="orders", status="ready") == 5.0

        # the database goes away: the scrape still answers, with queuectl_up 0 and a warning line
        with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false'))
            conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"),
                         {"r": login["role"]})
        try:
            _, text = _scrape(endpoint)
        finally:
            with admin_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(sa.text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true'))
        found = samples(text, parse_prometheus)
        assert value(found, "queuectl_up") == 0.0 and not any(n == "queuectl_queue_items" for n, _, _ in found)
        assert value(samples(_scrape(endpoint)[1], parse_prometheus), "queuectl_up") == 1.0  # and recovers

        by_sigint.send_signal(signal.SIGINT)
        by_sigterm.send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=30) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0]
    for (out, err), start in zip(outputs, starts):
        assert out == "stopped\n" and "Traceback" not in err and not leaks(start + out + err)
    assert outputs[0][1] == ""
    assert outputs[1][1].startswith("warning: scrape answered queuectl_up 0:") and outputs[1][1].count("\n") == 1


def test_every_metric_is_listed_in_the_operations_guide_and_the_dashboard_asks_for_no_other():
    import re
    from pathlib import Path

    import queuectl.metrics

    source = Path(queuectl.metrics.__file__).read_text("utf-8")
    counters = set(re.findall(r'counter\("(queuectl_\w+)"', source))
    made = {name + "_total" if name in counters else name for name in re.findall(r'\("(queuectl_\w+)"', source)}
    guide = (Path(__file__).parents[1] / "docs" / "operations.md").read_text("utf-8")
    section = guide.split("## Metrics for Prometheus", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(queuectl_\w+)` \|", section, re.MULTILINE))
    assert listed == made and len(made) > 30
    dashboard = json.loads((Path(__file__).parents[1] / "docs" / "grafana-queuectl.json").read_text("utf-8"))
    asked = set(re.findall(r"queuectl_\w+", " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])))
    assert asked <= made and len(asked) > 15
