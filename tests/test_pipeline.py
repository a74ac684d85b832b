"""The Spark pipeline against the real test PostgreSQL: export to a Parquet lake, purge,
crash recovery, report, and the same on a real Spark standalone cluster.

One local[2] SparkSession serves the whole module (a session costs ~10 s to start); the
tests that kill an export or use a cluster run the CLI in subprocesses with their own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

pyspark = pytest.importorskip("pyspark", reason="the spark extra is part of `make test`")

from queuectl import locks  # noqa: E402
from queuectl.engine import adapter_for  # noqa: E402
from queuectl.errors import QueuectlError, UsageError  # noqa: E402
from queuectl.install import install_queue  # noqa: E402
from queuectl.locks import Lock  # noqa: E402
from queuectl.names import QueueNames  # noqa: E402
from queuectl.pipeline import Lake, build_report, export_history, purge_exported  # noqa: E402
from queuectl.pipeline import jdbc as jdbc_module  # noqa: E402
from queuectl.pipeline import report as report_module  # noqa: E402
from queuectl.pipeline import spark as spark_module  # noqa: E402
from queuectl.pipeline.jdbc import JdbcDriver, find_jdbc_jar, jdbc_target  # noqa: E402
from queuectl.pipeline.spark import get_session  # noqa: E402
from queuectl.pipeline.standalone import StandaloneCluster  # noqa: E402
from queuectl.sqlfiles import render  # noqa: E402

from conftest import run_cli  # noqa: E402

EVERYTHING = {"upto_id": 2**62, "archived_before": datetime(9999, 1, 1, tzinfo=timezone.utc)}
START = "2025-03-01T00:00:00Z"


# -- fixtures and helpers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def spark():
    session = get_session("local[2]", [find_jdbc_jar("postgresql")])
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    return Lake(tmp_path / "lake")


def history(schema: str = "queuectl", queue: str = "orders") -> str:
    return QueueNames(queue, schema).qualified("history")


def fill_history(engine: Engine, n: int, first_id: int, *, hours: int = 12, payload_bytes: int = 64) -> None:
    """n finished rows with ids first_id+1 .. first_id+n, archived now."""
    sql = render("postgresql", "pipeline", "synthetic_history", {"history": history()})
    with engine.begin() as conn:
        conn.execute(sa.text(sql), dict(n=n, first_id=first_id, start=START, hours=hours, payload_bytes=payload_bytes))


def history_table(engine: Engine, name: str = "history") -> sa.Table:
    return sa.Table(f"orders_{name}", sa.MetaData(), autoload_with=engine, schema="queuectl")


def wait_exportable(engine: Engine, timeout: float = 30) -> None:
    """An export only takes rows archived over a second before it starts (see
    pipeline.sql export_window): poll until every row in history is that old."""
    h = history_table(engine)
    query = sa.select(sa.func.max(h.c.archived_at) < sa.func.statement_timestamp() - sa.text("interval '1 second'"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if conn.execute(query).scalar() in (True, None):
                return
        time.sleep(0.1)
    raise AssertionError("history rows never became old enough to export")


def archive_by_hand(engine: Engine, ids: list[int]) -> None:
    """What the archive job does: finished rows move from meta+data to history in one transaction."""
    meta, data, hist = (history_table(engine, t) for t in ("meta", "data", "history"))
    columns = [c.name for c in meta.c if c.name not in ("leased_until", "slot")]  # slot: reliable_0012's generation
    source = sa.select(*(meta.c[c] for c in columns), data.c.payload, data.c.headers).join(data, data.c.id == meta.c.id)
    with engine.begin() as conn:
        conn.execute(hist.insert().from_select(columns + ["payload", "headers"], source.where(meta.c.id.in_(ids))))
        conn.execute(sa.delete(data).where(data.c.id.in_(ids)))  # no foreign key cascades it since reliable_0012
        conn.execute(sa.delete(meta).where(meta.c.id.in_(ids)))


def db_fingerprint(engine: Engine, bounds: dict = EVERYTHING) -> tuple[int, int]:
    sql = render("postgresql", "pipeline", "history_checksum", {"history": history()})
    with engine.connect() as conn:
        row = conn.execute(sa.text(sql), bounds).one()
    return int(row.n), int(row.checksum)


def lake_frame(spark, lake: Lake, queue: str = "orders"):
    """The lake as any Parquet reader sees it: every file under history/, committed or not."""
    from pyspark.sql import functions as F

    if not lake.history_dir.is_dir() or not any(lake.history_dir.rglob("*.parquet")):
        return None
    return spark.read.parquet(str(lake.history_dir)).where(F.col("queue") == queue)


def lake_fingerprint(spark, lake: Lake, queue: str = "orders") -> tuple[int, int]:
    from pyspark.sql import functions as F

    frame = lake_frame(spark, lake, queue)
    if frame is None:
        return 0, 0
    digest = F.md5(F.concat(F.col("id").cast("string"), F.lit(":"), F.lower(F.hex(F.coalesce("payload", F.lit(b""))))))
    bits = F.conv(F.substring(digest, 1, 15), 16, 10).cast("decimal(38,0)")
    row = frame.agg(F.count(F.lit(1)).alias("n"), F.coalesce(F.sum(bits), F.lit(0)).alias("checksum")).collect()[0]
    return int(row["n"]), int(row["checksum"])


def lake_duplicates(spark, lake: Lake, queue: str = "orders") -> int:
    frame = lake_frame(spark, lake, queue)
    return 0 if frame is None else frame.groupBy("id").count().where("count > 1").count()


def history_ids(engine: Engine) -> set[int]:
    h = history_table(engine)
    with engine.connect() as conn:
        return set(conn.execute(sa.select(h.c.id)).scalars())


# -- export: exact, idempotent, incremental ----------------------------------------------


def test_export_200k_rows_matches_database_reruns_add_nothing_and_late_rows_follow(spark, engine, orders, lake):
    # Item 1 is enqueued first and still being retried while 200,000 later items finish:
    # its id is below everything in history when it is finally archived.
    straggler = orders.enqueue(b"slow item")
    fill_history(engine, 200_000, first_id=1_000)
    wait_exportable(engine)
    events = []
    first = export_history(engine, str(lake), ["orders"], partitions=4, progress=events.append)

    [q] = first.queues
    assert (q.rows, q.new_rows, q.late_rows, q.partitions, q.run_seq) == (200_000, 200_000, 0, 4, 1)
    assert lake_fingerprint(spark, lake) == db_fingerprint(engine) == (200_000, db_fingerprint(engine)[1])
    assert lake_duplicates(spark, lake) == 0
    days = sorted(p.name for p in (lake.history_dir / "queue=orders").iterdir())
    assert days == ["day=2025-03-01"]  # 12 hours from midnight, by finished_at
    reading = [e for e in events if e.phase == "reading"]
    assert reading and all(e.tasks_total == 4 and e.rows_total == 200_000 for e in reading)
    assert events[-1].phase == "done" and events[-1].rows_done == 200_000

    with engine.connect() as conn:
        row = conn.execute(
            sa.text(render("postgresql", "pipeline", "get_export", {"exports": '"queuectl"."pipeline_exports"'})),
            {"queue": "orders", "lake": str(lake)},
        ).one()
    assert (row.run_seq, row.exported_upto_id, row.rows_exported) == (1, 201_000, 200_000)

    again = export_history(engine, str(lake), ["orders"])
    assert again.queues[0].rows == 0 and again.queues[0].run_seq is None
    assert lake_fingerprint(spark, lake)[0] == 200_000

    # Later: the straggler (id 1) finishes and is archived, and 1,000 new items follow.
    with orders.processing(1) as batch:
        assert [m.id for m in batch] == [straggler]
    archive_by_hand(engine, [straggler])
    fill_history(engine, 1_000, first_id=201_000)
    wait_exportable(engine)
    third = export_history(engine, str(lake), ["orders"], partitions=2)
    assert (third.queues[0].new_rows, third.queues[0].late_rows, third.queues[0].run_seq) == (1_000, 1, 2)
    assert lake_fingerprint(spark, lake) == db_fingerprint(engine) == (201_001, db_fingerprint(engine)[1])
    assert lake_duplicates(spark, lake) == 0
    assert [c.rows for c in lake.commits("orders")] == [200_000, 1_001]


def test_row_archived_by_a_transaction_open_during_an_export_is_exported_next_time(spark, engine, orders, lake):
    """An archive batch that started before an export and commits after it inserts rows with
    an old id and an archived_at below the export's start: the bound waits for it."""
    fill_history(engine, 1_000, first_id=100)
    wait_exportable(engine)
    h = history_table(engine)
    with engine.connect() as archiver:
        archiver.execute(
            h.insert().values(id=50, priority=0, due_at=sa.func.now(), status=2, attempts=1, max_attempts=5,
                              enqueued_at=sa.func.now(), dequeued_at=sa.func.now(), finished_at=sa.func.now(),
                              payload=b"committed after the export")  # fmt: skip
        )
        first = export_history(engine, str(lake), ["orders"])
        archiver.commit()
    assert (first.queues[0].new_rows, first.queues[0].late_rows) == (1_000, 0)
    assert first.queues[0].bounds.upto_id == 1_100
    wait_exportable(engine)
    second = export_history(engine, str(lake), ["orders"])
    assert (second.queues[0].new_rows, second.queues[0].late_rows) == (0, 1)
    assert lake_fingerprint(spark, lake) == db_fingerprint(engine) == (1_001, db_fingerprint(engine)[1])
    assert lake_duplicates(spark, lake) == 0


def test_export_refuses_while_another_export_of_the_queue_runs(spark, engine, orders, lake):
    fill_history(engine, 10, first_id=0)
    lock = Lock("queuectl", "queuectl.pipeline:queuectl.orders", "the export lock")
    with engine.connect() as conn:
        key = locks.take(conn, lock, 0)
        with pytest.raises(QueuectlError, match="another export or purge of queue 'orders' is running: .* held by pid"):
            export_history(engine, str(lake), ["orders"], lock_wait=0.5)
        locks.release(conn, key)
    assert not lake.commits("orders")


# -- purge ---------------------------------------------------------------------------------


def test_purge_removes_exactly_the_exported_rows_and_keeps_newer_ones(spark, engine, orders, lake):
    pending = orders.enqueue(b"still retrying")
    fill_history(engine, 20_000, first_id=100)
    wait_exportable(engine)
    export_history(engine, str(lake), ["orders"])
    exported = history_ids(engine)
    assert len(exported) == 20_000

    # After the export: 500 new ids, and the long-retried item 1 archived (an old id).
    fill_history(engine, 500, first_id=20_100)
    with orders.processing(1):
        pass
    archive_by_hand(engine, [pending])
    newer = history_ids(engine) - exported
    assert len(newer) == 501

    batches = []
    purged = purge_exported(engine, str(lake), "orders", batch=1_000, progress=batches.append)
    assert purged == 20_000
    assert history_ids(engine) == newer
    assert len(batches) == 21  # 20 full batches and the empty one that ends the loop
    assert lake_fingerprint(spark, lake)[0] == 20_000  # the lake keeps what was purged

    # The CLI's --purge exports the newer rows, then deletes them too.
    wait_exportable(engine)
    export_history(engine, str(lake), ["orders"], purge=True)
    assert history_ids(engine) == set()
    assert lake_fingerprint(spark, lake)[0] == 20_501
    assert lake_duplicates(spark, lake) == 0


# -- crash safety --------------------------------------------------------------------------


def _cli_export(db_url: str, lake: Lake, *extra: str, env_extra: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "QUEUECTL_URL": db_url, "QUEUECTL_SPARK_MASTER": "local[2]", **(env_extra or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "queuectl.cli", "pipeline", "export", "orders", "--lake", str(lake.root), "--json", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


def test_export_killed_while_spark_writes_then_rerun_has_no_duplicates(spark, db_url, engine, orders, lake):
    fill_history(engine, 200_000, first_id=0)
    wait_exportable(engine)
    proc = _cli_export(db_url, lake, "--partitions", "8")
    staging = lake.root / "_staging" / "orders"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if staging.is_dir() and any(staging.rglob("*.parquet")):
            break  # Spark is writing: some task output exists
        time.sleep(0.05)
    assert proc.poll() is None, f"export finished before it could be killed: {proc.communicate()}"
    os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its Spark JVM, mid-write
    proc.wait()
    proc.communicate()
    assert not lake.commits("orders")

    result = export_history(engine, str(lake), ["orders"])
    assert result.queues[0].recovered == [(1, "discarded")]
    assert lake_fingerprint(spark, lake) == db_fingerprint(engine) == (200_000, db_fingerprint(engine)[1])
    assert lake_duplicates(spark, lake) == 0
    assert not any((lake.root / "_staging").rglob("*.parquet"))


def test_export_dying_between_renames_is_rolled_forward_without_duplicates(spark, db_url, engine, orders, lake):
    fill_history(engine, 30_000, first_id=0, hours=72)  # several day partitions, so several files
    wait_exportable(engine)
    proc = _cli_export(db_url, lake, env_extra={"QUEUECTL_PIPELINE_CRASH": "after_first_move"})
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 137, stderr.decode()[-2000:]
    published = list(lake.history_dir.rglob("*.parquet"))
    assert len(published) == 1  # one file made it before the crash
    assert not lake.commits("orders")  # ... but the run is not committed in the lake yet
    assert lake_fingerprint(spark, lake)[0] < 30_000

    result = export_history(engine, str(lake), ["orders"])
    assert result.queues[0].recovered == [(1, "rolled forward")]
    assert result.queues[0].rows == 0  # nothing left to read: run 1 covered it all
    assert lake_fingerprint(spark, lake) == db_fingerprint(engine) == (30_000, db_fingerprint(engine)[1])
    assert lake_duplicates(spark, lake) == 0
    assert [c.seq for c in lake.commits("orders")] == [1]


# -- report --------------------------------------------------------------------------------


def test_report_percentiles_and_counts_agree_with_the_database(spark, engine, orders, lake, tmp_path):
    fill_history(engine, 60_000, first_id=0, hours=6)
    wait_exportable(engine)
    export_history(engine, str(lake), ["orders"])
    out = tmp_path / "report"
    report = build_report(str(lake), out_dir=str(out))

    hours = {h["hour"]: h for h in report.queues["orders"]["hours"]}
    sql = render("postgresql", "pipeline", "hourly_percentiles", {"history": history()})
    with engine.connect() as conn:
        expected = conn.execute(sa.text(sql)).all()
    assert len(expected) == 7  # 6 hours of enqueues, the last items finish in the 7th
    for row in expected:
        got = hours[row.hour.replace(tzinfo=timezone.utc).isoformat()]
        for metric, values in (("wait_s", row.wait_s), ("processing_s", row.processing_s)):
            for key, want in zip(("p50", "p90", "p99"), values):
                assert got[metric][key] == pytest.approx(float(want), rel=0.01), (row.hour, metric, key)

    h = history_table(engine)
    hour = sa.func.date_trunc("hour", sa.func.timezone("UTC", h.c.finished_at))
    with engine.connect() as conn:
        counts = conn.execute(
            sa.select(hour, sa.func.count().filter(h.c.status == 2), sa.func.count().filter(h.c.status == 3)).group_by(hour)
        ).all()
        attempts = dict(conn.execute(sa.select(h.c.attempts, sa.func.count()).group_by(h.c.attempts)).all())
    for when, completed, dead in counts:
        got = hours[when.replace(tzinfo=timezone.utc).isoformat()]
        assert (got["completed"], got["dead"]) == (completed, dead)
        assert got["dead_rate"] == pytest.approx(dead / (completed + dead))
        assert got["throughput_per_s"] == pytest.approx(completed / 3600)
    summary = report.queues["orders"]["summary"]
    assert summary["enqueued"] == 60_000
    assert summary["attempts"] == {str(k): v for k, v in sorted(attempts.items())}

    written = json.loads((out / "report.json").read_text())
    assert written["queues"]["orders"]["summary"]["completed"] == summary["completed"]
    for chart in ("throughput.png", "latency.png", "attempts.png"):
        data = (out / chart).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, chart

    series = report.queues["orders"]["series"]  # the charts' step: from the span (just over 6 h)
    assert series["step_s"] == 300 and written["step_s"] == 300
    assert sum(p["completed"] for p in series["points"]) == summary["completed"]
    first, last = (datetime.fromisoformat(summary[k]) for k in ("first_finished", "last_finished"))
    for p in series["points"]:  # per second of the step's part between the first and last finish
        start = datetime.fromisoformat(p["at"])
        covered = (min(start + timedelta(seconds=300), last) - max(start, first)).total_seconds()
        assert p["throughput_per_s"] == pytest.approx(p["completed"] / covered)
    assert series["points"][0]["throughput_per_s"] == pytest.approx(summary["throughput_per_s"], rel=0.2)

    later = build_report(str(lake), since="2025-03-02")
    assert later.queues == {}  # every item finished on 2025-03-01


def test_chart_step_follows_the_historys_span():
    assert [report_module.step_seconds(s) for s in (20, 180, 3600, 86400, 30 * 86400, 10**9)] == [
        1, 5, 30, 900, 21600, 604800]
    assert [report_module.step_label(s) for s in (5, 900, 3600, 21600, 86400)] == ["5 s", "15 min", "1 h", "6 h", "1 day"]


def _short_run(points: int, attempts: dict[str, int]) -> dict:
    """A report's queue as compute() gives it: `points` steps of 5 s, the given attempts."""
    start = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
    pcts = {"p50": 0.01, "p90": 0.05, "p99": 2.0}
    return {"summary": {"completed": 900 * points, "throughput_per_s": 180.0, "attempts": attempts},
            "series": {"step_s": 5, "points": [
                {"at": (start + timedelta(seconds=5 * i)).isoformat(), "completed": 900, "dead": 0,
                 "throughput_per_s": 180.0, "wait_s": pcts, "processing_s": pcts} for i in range(points)]}}


def test_charts_of_a_short_run_show_points_on_a_readable_axis_and_rare_retries(tmp_path, monkeypatch):
    """One point is drawn with a marker on an axis of seconds around it (not an empty axis in
    years); attempts have integer ticks, each bar's count, and a log axis for 3 retries in 40k."""
    import matplotlib.dates as mdates

    figures = []
    save = report_module._save
    monkeypatch.setattr(report_module, "_save", lambda fig, path, plt: (figures.append(fig), save(fig, path, plt))[1])
    written = report_module.draw_charts({"q": _short_run(1, {"1": 40_000, "2": 3})}, tmp_path)
    assert [Path(w).name for w in written] == list(report_module.CHARTS)
    throughput, latency, attempts = figures
    [ax] = throughput.axes
    [line] = ax.get_lines()
    assert line.get_marker() == "o" and len(line.get_xdata()) == 1
    low, high = ax.get_xlim()
    assert (high - low) * 86400 == pytest.approx(10)  # a step either side of the point, in days
    assert all(ln.get_marker() in ("o", "s", "^") for a in latency.axes for ln in a.get_lines())
    assert latency.axes[0].get_yscale() == "log"  # p99 2 s beside p50 10 ms
    [bars] = attempts.axes
    assert bars.get_yscale() == "log"
    assert list(bars.get_xticks()) == [1, 2, 3]  # whole attempts, 1-3 at least
    assert [label.get_text() for label in bars.texts] == ["40,000", "3"]
    assert mdates.num2date(low).year == 2025


def test_report_on_an_empty_lake_is_a_usage_error(spark, tmp_path):
    with pytest.raises(UsageError, match="holds no exported history"):
        build_report(str(tmp_path / "nothing"))


# -- a real standalone cluster -------------------------------------------------------------


def test_export_and_report_on_a_standalone_cluster(spark, db_url, engine, orders, lake, tmp_path):
    fill_history(engine, 50_000, first_id=0)
    wait_exportable(engine)
    with StandaloneCluster(cores=2, memory="1g", work_dir=tmp_path / "spark") as cluster:
        exported = run_cli("pipeline", "export", "--lake", str(lake.root), "--master", cluster.master_url, "--json",
                           url=db_url, timeout=300)  # fmt: skip
        assert exported.returncode == 0, exported.stderr.decode()[-3000:]
        result = json.loads(exported.stdout)
        assert result["master"] == cluster.master_url and result["rows"] == 50_000
        reported = run_cli("pipeline", "report", "--lake", str(lake.root), "--master", cluster.master_url,
                           "--out", str(tmp_path / "out"), "--json", timeout=300)  # fmt: skip
        assert reported.returncode == 0, reported.stderr.decode()[-3000:]
        apps = cluster.state()
    report = json.loads(reported.stdout)
    assert report["queues"]["orders"]["summary"]["enqueued"] == 50_000
    assert (tmp_path / "out" / "report.json").is_file()
    # Both ran as applications of the cluster, on its worker's executors.
    finished = [a for a in apps.get("completedapps", []) + apps.get("activeapps", []) if a["name"] == "queuectl-pipeline"]
    assert len(finished) == 2
    assert lake_fingerprint(spark, lake) == db_fingerprint(engine) == (50_000, db_fingerprint(engine)[1])


# -- the JDBC driver and URL ---------------------------------------------------------------


def test_jdbc_jar_is_found_in_the_documented_order(tmp_path, monkeypatch):
    system, maven = tmp_path / "usr-share-java", tmp_path / "m2" / "org" / "postgresql" / "postgresql" / "42.7.4"
    system.mkdir()
    maven.mkdir(parents=True)
    (maven / "postgresql-42.7.4.jar").write_bytes(b"jar")
    driver = JdbcDriver("org.postgresql.Driver", (str(system / "postgresql*.jar"),), (str(tmp_path / "m2/org/postgresql/postgresql/*/postgresql-*.jar"),), "install libpostgresql-jdbc-java")
    monkeypatch.setitem(jdbc_module.DRIVERS, "postgresql", driver)
    monkeypatch.delenv("QUEUECTL_JDBC_JAR", raising=False)
    assert find_jdbc_jar("postgresql") == maven / "postgresql-42.7.4.jar"
    (system / "postgresql-42.5.5.jar").write_bytes(b"jar")
    assert find_jdbc_jar("postgresql") == system / "postgresql-42.5.5.jar"
    env_jar = tmp_path / "env.jar"
    env_jar.write_bytes(b"jar")
    monkeypatch.setenv("QUEUECTL_JDBC_JAR", str(env_jar))
    assert find_jdbc_jar("postgresql") == env_jar
    explicit = tmp_path / "explicit.jar"
    explicit.write_bytes(b"jar")
    assert find_jdbc_jar("postgresql", str(explicit)) == explicit
    with pytest.raises(UsageError, match="--jdbc-jar points at"):
        find_jdbc_jar("postgresql", str(tmp_path / "missing.jar"))


def test_missing_jdbc_jar_says_what_to_install(tmp_path, monkeypatch):
    driver = JdbcDriver("org.postgresql.Driver", (str(tmp_path / "none*.jar"),), (str(tmp_path / "m2/*.jar"),),
                        jdbc_module.DRIVERS["postgresql"].install_hint)  # fmt: skip
    monkeypatch.setitem(jdbc_module.DRIVERS, "postgresql", driver)
    monkeypatch.delenv("QUEUECTL_JDBC_JAR", raising=False)
    with pytest.raises(UsageError, match="apt-get install libpostgresql-jdbc-java"):
        find_jdbc_jar("postgresql")


def test_without_pyspark_the_error_names_the_command_that_works_from_this_checkout(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark raises ImportError
    with pytest.raises(UsageError) as caught:
        spark_module.require_pyspark()
    root = Path(__file__).resolve().parents[1]
    assert str(caught.value) == (f"the pipeline needs the spark extra (pyspark is missing): make venv-spark (in {root}), "
                                 f"or {sys.executable} -m pip install -e '{root}[spark]'")


def test_make_finds_the_jdbc_jar_where_the_pipeline_does_and_runs_the_pipeline():
    """`make jdbc` asks the pipeline's own finder (~/.m2 included) before installing a jar;
    `make pipeline` installs the spark extra, then exports and reports."""
    root = Path(__file__).resolve().parents[1]
    jdbc = subprocess.run(["make", "-n", "-B", "jdbc"], cwd=root, capture_output=True, text=True, timeout=60)
    finder, install = jdbc.stdout.index("find_jdbc_jar('postgresql')"), jdbc.stdout.index("apt-get install")
    assert finder < install
    pipeline = subprocess.run(["make", "-n", "-B", "pipeline", "PIPELINE_DIR=/x"], cwd=root, capture_output=True,
                              text=True, timeout=60).stdout
    assert "pip install --quiet -e '.[spark]'" in pipeline
    assert "queuectl pipeline export pipeline_demo --lake /x/lake" in pipeline
    assert "queuectl pipeline report --lake /x/lake --out /x/report" in pipeline


def test_jdbc_url_keeps_the_password_out_of_the_url():
    target = jdbc_target("postgresql://alice:s3cret-pw@db.example:6432/app?sslmode=require")
    assert target.url == "jdbc:postgresql://db.example:6432/app?sslmode=require"
    assert target.spark_options()["password"] == "s3cret-pw" and target.user == "alice"
    assert "s3cret-pw" not in target.shown and "s3cret-pw" not in repr(target)


def test_embedded_socket_url_maps_to_its_tcp_address(server_url):
    if "host=" not in server_url:
        pytest.skip("QUEUECTL_TEST_URL is a TCP URL: no socket mapping to check")
    target = jdbc_target(server_url)
    assert target.url.startswith("jdbc:postgresql://127.0.0.1:") and target.url.endswith("/postgres")
    assert target.password and target.password not in target.url


def test_foreign_socket_url_is_refused(tmp_path):
    with pytest.raises(UsageError, match="Unix socket, which JDBC cannot use"):
        jdbc_target(f"postgresql://me@/db?host={tmp_path}")


def test_sql_server_mapping_is_the_documented_one():
    target = jdbc_target("mssql+pyodbc://sa:pw@sql.example:1433/app?TrustServerCertificate=yes&encrypt=yes")
    assert target.url == "jdbc:sqlserver://sql.example:1433;databaseName=app;encrypt=true;trustServerCertificate=true"
    assert target.driver_class == "com.microsoft.sqlserver.jdbc.SQLServerDriver"


# -- CLI errors ----------------------------------------------------------------------------


def test_cli_errors_are_one_line_exit_2(db_url, engine, tmp_path):
    install_queue(engine, "orders")
    cases = [
        (["pipeline", "export", "Bad-Name", "--lake", str(tmp_path)], "invalid queue name"),
        (["pipeline", "export", "nosuch", "--lake", str(tmp_path)], "not installed"),
        (["pipeline", "export", "orders", "--lake", "s3a://bucket/lake"], "only file system paths"),
        (["pipeline", "export", "orders", "--lake", str(tmp_path), "--jdbc-jar", str(tmp_path / "no.jar")], "no.jar, which is not a file"),
        (["pipeline", "report", "--lake", str(tmp_path), "--since", "yesterday"], "--since must be a date"),
    ]
    for args, message in cases:
        result = run_cli(*args, url=db_url)
        lines = [ln for ln in result.stderr.decode().splitlines() if ln.strip()]
        assert result.returncode == 2, (args, result.stderr)
        assert len(lines) == 1 and message in lines[0], (args, lines)
