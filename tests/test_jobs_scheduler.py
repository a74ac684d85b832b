"""The scheduler: several instances never run the same job on the same queue at once,
one dying leaves the others working, and failures are recorded without stopping it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
import sqlalchemy as sa

from queuectl.client import Queue
from queuectl.errors import UsageError
from queuectl.install import install_queue
from queuectl.jobs.scheduler import load_config, overview, plan

from conftest import run_cli
from jobs_helpers import add_finished_rows, invoke, job_runs, rows, scalar, wait_until

FAST = """
[scheduler]
refresh = "1s"

[jobs.archive]
interval = "1s"
min_age = "0s"
batch = 100
delay = "50ms"
max_seconds = "0.8s"     # each run lasts ~0.8 s while there is backlog: runs would collide without the lock
lock_timeout = "{lock}"

[jobs.reset_stale]
interval = "1s"
lock_timeout = "{lock}"

[jobs.inspect]
interval = "1s"
lock_timeout = "{lock}"

[jobs.reorganize]
interval = "1s"
lock_timeout = "{lock}"
"""


def start_scheduler(config: Path, url: str, seconds: float) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "QUEUECTL_URL"}
    env["QUEUECTL_URL"] = url
    return subprocess.Popen(
        [sys.executable, "-m", "queuectl.cli", "scheduler", "run", "--config", str(config), "--max-seconds", str(seconds)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_two_schedulers_never_overlap_and_one_survives_the_other(db_url, engine, orders: Queue, tmp_path):
    add_finished_rows(engine, 30_000)
    config = tmp_path / "queuectl.toml"
    config.write_text(FAST.format(lock="2s"))
    first = start_scheduler(config, db_url, 90)
    second = start_scheduler(config, db_url, 90)
    try:
        # both are working before one of them is killed
        wait_until(lambda: scalar(engine, "SELECT count(DISTINCT runner_pid) FROM queuectl.job_runs") == 2, timeout=30)
        time.sleep(6)
        first.kill()
        _, first_err = first.communicate(timeout=10)
        killed_at = scalar(engine, "SELECT clock_timestamp()")
        # the survivor runs until it has run every job three times since the kill (a fixed
        # run time left it too little of it when the start was slow), then stops as on SIGTERM
        wait_until(lambda: scalar(
            engine, "SELECT count(*) FROM (SELECT job FROM queuectl.job_runs WHERE started_at > :at "
                    "AND runner_pid = :pid GROUP BY job HAVING count(*) >= 3) AS done",
            at=killed_at, pid=second.pid) == 4, timeout=60)
        second.terminate()
        _, second_err = second.communicate(timeout=60)
    finally:
        for process in (first, second):
            if process.poll() is None:
                process.kill()
    assert second.returncode == 0, second_err.decode()[-2000:]
    runs = job_runs(engine)
    by_target = defaultdict(list)
    for run in runs:
        by_target[(run.job, run.queue)].append(run)
    assert set(by_target) == {("archive", "orders"), ("reset_stale", "orders"), ("inspect", "orders"), ("reorganize", "orders")}
    for target, target_runs in by_target.items():
        for earlier, later in zip(target_runs, target_runs[1:]):
            assert earlier.finished_at is not None and earlier.finished_at <= later.started_at, (target, earlier, later)
    # contention really happened: runs were skipped because the other scheduler held them
    assert "skipped, another runner has it" in first_err.decode() + second_err.decode()
    # after the kill the survivor keeps running every job; nothing is left 'running'
    survivor = second.pid
    for target, target_runs in by_target.items():
        assert len([r for r in target_runs if r.started_at > killed_at and r.runner_pid == survivor]) >= 3, target
        assert all(r.runner_pid == survivor for r in target_runs if r.started_at > killed_at)
    assert not [r for r in runs if r.outcome == "running"]
    assert {r.runner_pid for r in runs if r.outcome == "abandoned"} <= {first.pid}
    assert {r.outcome for r in runs if r.outcome != "abandoned"} == {"succeeded"}


@pytest.mark.slow
def test_a_failing_job_is_recorded_and_the_scheduler_keeps_going(db_url, engine, orders: Queue, tmp_path):
    install_queue(engine, "blocked")
    config = tmp_path / "queuectl.toml"
    config.write_text(FAST.format(lock="300ms"))
    scheduler = start_scheduler(config, db_url, 9)
    try:
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM queuectl.job_runs WHERE queue = 'blocked'") >= 4, timeout=30)
        with engine.connect() as blocker:         # an ALTER TABLE waiting/holding: every job on 'blocked' times out
            blocker.execute(sa.text("LOCK TABLE queuectl.blocked_meta IN ACCESS EXCLUSIVE MODE"))
            wait_until(lambda: scalar(engine, "SELECT count(DISTINCT job) FROM queuectl.job_runs "
                                              "WHERE queue = 'blocked' AND outcome = 'failed'") == 4, timeout=20)
            blocker.rollback()
        released_at = scalar(engine, "SELECT clock_timestamp()")
        _, err = scheduler.communicate(timeout=60)
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
    assert scheduler.returncode == 0, err.decode()[-2000:]
    failed = rows(engine, "SELECT job, error FROM queuectl.job_runs WHERE outcome = 'failed'")
    assert {f.job for f in failed} == {"archive", "reset_stale", "inspect", "reorganize"}
    assert all("lock timeout" in f.error for f in failed), failed
    # it kept going: every job succeeded again on the blocked queue afterwards, and on the other queue throughout
    again = rows(engine, "SELECT DISTINCT job FROM queuectl.job_runs WHERE queue = 'blocked' "
                         "AND outcome = 'succeeded' AND started_at > :t", t=released_at)
    assert {r.job for r in again} == {"archive", "reset_stale", "inspect", "reorganize"}
    assert not rows(engine, "SELECT 1 FROM queuectl.job_runs WHERE queue = 'orders' AND outcome <> 'succeeded'")
    assert "failed after" in err.decode()


def test_default_plan_covers_every_job_of_every_installed_queue(engine, orders: Queue):
    install_queue(engine, "emails")
    items = plan(engine, load_config(None))
    assert sorted((i.job, i.queue, i.trigger_text) for i in items) == sorted(
        [(job, q, trigger) for q in ("emails", "orders") for job, trigger in (
            ("archive", "every 1m"), ("reset_stale", "every 30s"), ("inspect", "every 5m"),
            ("reorganize", "cron 17 3 * * *"))])
    # correct_watermark is registered for watermark queues only (none installed here)
    assert "correct_watermark" in load_config(None).jobs


def test_config_file_selects_queues_triggers_and_options(engine, orders: Queue, tmp_path):
    install_queue(engine, "emails")
    path = tmp_path / "q.toml"
    path.write_text('[jobs.archive]\ncron = "*/5 * * * *"\nqueues = ["emails"]\nbatch = 250\nmin_age = "5m"\n'
                    '[jobs.inspect]\nenabled = false\n')
    config = load_config(path)
    assert config.jobs["archive"].config.batch == 250 and config.jobs["archive"].config.min_age == 300
    items = {(i.job, i.queue): i.trigger_text for i in plan(engine, config)}
    assert items[("archive", "emails")] == "cron */5 * * * *" and ("archive", "orders") not in items
    assert not [k for k in items if k[0] == "inspect"]
    assert items[("reset_stale", "orders")] == "every 30s"


@pytest.mark.parametrize("text, message", [
    ("[jobs.archive]\nbatch = 0\n", "batch"),
    ("[jobs.nosuchjob]\n", "unknown job"),
    ("[jobs.archive]\ninterval = \"soon\"\n", "duration"),
    ("[jobs.archive]\ncolour = 1\n", "unknown option"),
    ("[jobs.archive]\ninterval = \"1m\"\ncron = \"* * * * *\"\n", "not both"),
    ("[jobs.archive]\ncron = \"61 * * * *\"\n", "cron"),
    ("[elsewhere]\n", "unknown section"),
    ("not toml [", "not valid TOML"),
])
def test_bad_config_is_a_one_line_usage_error(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_config(path)


@pytest.mark.slow
def test_jobs_cli_list_history_and_manual_runs(db_url, engine, orders: Queue, capsys, monkeypatch):
    def cli(*args: str) -> tuple[int, str, str]:
        return invoke(capsys, monkeypatch, *args, url=db_url)

    orders.enqueue_many(["a", "b", "c"])
    orders.ack(orders.dequeue(2))
    assert cli("reset-stale", "orders")[0] == 0
    archived = run_cli("archive", "orders", "--min-age", "0s", url=db_url)  # once as a real process
    assert archived.returncode == 0 and "moved 2 rows" in archived.stdout.decode(), archived.stderr.decode()
    code, out, _ = cli("inspect", "orders", "--json")
    snapshot = json.loads(out)["result"]["snapshot"]
    assert code == 0 and snapshot["ready"] == 1 and isinstance(snapshot["meta_table_bytes"], int)
    code, out, _ = cli("inspect", "orders")  # sizes as health shows them, not raw bytes
    assert code == 0 and re.search(r"meta_table_bytes\s+\d+\.\d (B|kB|MB)\s", out), out
    assert str(snapshot["meta_table_bytes"]) not in out
    code, out, _ = cli("reorganize", "orders", "--dry-run")
    assert code == 0 and "dry run" in out
    code, _, err = cli("jobs", "run", "archive", "orders", "-o", "min_age=0s", "-o", "batch=5")
    assert code == 0, err
    history = json.loads(cli("jobs", "history", "--last", "3", "--json")[1])
    assert [(h["job"], h["outcome"]) for h in history] == [("archive", "succeeded"), ("reorganize", "succeeded"),
                                                           ("inspect", "succeeded")]
    assert "reset_stale" in cli("jobs", "history")[1]
    listed = json.loads(cli("jobs", "list", "--json")[1])
    by_job = {r["job"]: r for r in listed}
    assert set(by_job) == {"archive", "reset_stale", "inspect", "reorganize"}
    assert by_job["archive"]["last_outcome"] == "succeeded" and by_job["archive"]["next_run"] is not None
    table = cli("jobs", "list")[1]
    assert "reset_stale" in table and "every 30s" in table
    # user errors: one line, exit 2
    for args in (["archive", "orders", "--min-age", "soon"], ["archive", "nothere"], ["jobs", "run", "vacuum", "orders"],
                 ["jobs", "history", "--last", "0"]):
        code, _, err = cli(*args)
        assert code == 2 and len(err.strip().splitlines()) == 1, (args, err)


def test_a_job_already_running_elsewhere_is_refused(db_url, engine, orders: Queue, capsys, monkeypatch):
    from queuectl.jobs.runner import lock_key, single_runner

    with single_runner(engine, lock_key("queuectl", "archive", "orders"), "archive on queue orders"):
        code, _, err = invoke(capsys, monkeypatch, "archive", "orders", url=db_url)
    assert code == 2 and "already running elsewhere" in err
    assert invoke(capsys, monkeypatch, "archive", "orders", url=db_url)[0] == 0


def test_job_commands_have_help(capsys, monkeypatch):
    for args in (["archive"], ["reorganize"], ["inspect"], ["reset-stale"], ["jobs"], ["jobs", "list"],
                 ["jobs", "history"], ["jobs", "run"], ["scheduler"], ["scheduler", "run"]):
        code, out, _ = invoke(capsys, monkeypatch, *args, "--help")
        assert code == 0 and "Usage" in out, args


UNPLANNED = ('[jobs.archive]\nqueues = ["orders", "ordres"]\n'      # a typo: no queue of that name
             '[jobs.correct_watermark]\nqueues = ["orders"]\n')     # a reliable queue: the job serves watermark ones
UNPLANNED_LINES = [
    "[jobs.archive] names queue 'ordres', but it is not installed in schema queuectl: archive never runs on it",
    "[jobs.correct_watermark] names queue 'orders', but it is a reliable queue and correct_watermark serves "
    "watermark queues: correct_watermark never runs on it",
]


@pytest.mark.slow
def test_the_scheduler_warns_at_start_about_each_queue_its_config_names_that_a_job_never_runs_on(db_url, orders, tmp_path):
    path = tmp_path / "q.toml"
    path.write_text(UNPLANNED)
    result = run_cli("scheduler", "run", "--config", str(path), "--max-seconds", "1", url=db_url)
    assert result.returncode == 0, result.stderr.decode()
    warnings = [line.split("queuectl.scheduler: ", 1)[1] for line in result.stderr.decode().splitlines()
                if " WARNING queuectl.scheduler: [jobs." in line]
    assert warnings == UNPLANNED_LINES, result.stderr.decode()


@pytest.mark.slow
def test_jobs_list_marks_the_queues_its_config_names_that_a_job_never_runs_on(db_url, orders, tmp_path):
    path = tmp_path / "q.toml"
    path.write_text(UNPLANNED)
    listed = json.loads(run_cli("jobs", "list", "--config", str(path), "--json", url=db_url).stdout)
    problems = {(r["job"], r["queue"]): r["problem"] for r in listed}
    assert problems[("archive", "orders")] is None
    assert [problems[("archive", "ordres")], problems[("correct_watermark", "orders")]] == UNPLANNED_LINES
    assert next(r for r in listed if r["queue"] == "ordres")["next_run"] is None
    table = run_cli("jobs", "list", "--config", str(path), url=db_url)
    assert table.returncode == 0, table.stderr.decode()
    text = table.stdout.decode()
    assert "ordres" in text and "never" in text
    assert [line.removeprefix("warning: ") for line in text.splitlines() if line.startswith("warning:")] == UNPLANNED_LINES


@pytest.mark.slow
def test_health_with_the_scheduler_config_warns_about_the_queues_a_job_never_runs_on(db_url, orders, tmp_path):
    path = tmp_path / "queuectl.toml"
    path.write_text("[health]\nrate_window = \"1m\"\n" + UNPLANNED)
    result = run_cli("health", "--config", str(path), "--json", url=db_url)
    report = json.loads(result.stdout)
    assert result.returncode == 1 and report["verdict"] == "WARNING", result.stderr.decode()
    found = [c for c in report["checks"] if c["id"] == "jobs.unplanned_queue"]
    assert [(c["object"], c["status"]) for c in found] == [("archive on ordres", "WARNING"),
                                                            ("correct_watermark on orders", "WARNING")]
    assert [c["advice"].split(": correct the name")[0] for c in found] == UNPLANNED_LINES
    text = run_cli("health", "--config", str(path), url=db_url).stdout.decode()
    assert any(line.startswith("WARNING") and "names queue 'ordres'" in line for line in text.splitlines())
    # without the scheduler's tables in the file there is nothing to check
    path.write_text("[health]\nrate_window = \"1m\"\n")
    assert run_cli("health", "--config", str(path), url=db_url).returncode == 0
