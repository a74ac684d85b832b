"""Fault suite: real producer and consumer processes on a reliable queue while faults hit.

Scenarios: SIGKILL of consumers mid-batch (also through a 20,000 item run with the xmin horizon
pinned by a REPEATABLE READ snapshot), of `queuectl worker` processes mid-batch (handler
threads, and handler processes), of the archiver mid-batch and of the scheduler mid-job;
handlers that SIGKILL their own process under `queuectl worker --processes`; a PostgreSQL
fast restart, and an immediate one (crash recovery) under `queuectl worker` processes;
pg_terminate_backend of random client backends; producers sending oversized payloads now
and then; `queuectl reorganize` rebuilding every index under the load, and a run whose
backend is terminated during REINDEX INDEX CONCURRENTLY. (The statement
timeout on the dequeue path: test_statement_timeout.py.) `queuectl worker` scenarios also
carry poison items, whose handler always fails. After each, the ledger check:

- every acknowledged enqueue (the call returned an id) is in the queue exactly once, with
  its payload (live meta+data, or history);
- every other row is an enqueue whose outcome the client reported as unknown (each at
  most once); no payload appears twice;
- no item was acked by two consumers; an item worked on more than once is counted as a
  redelivery and must be explained by the queue's own attempt count (its lease expired);
- no orphan data rows (data without meta) and no meta row without its data;
- every enqueue the server refused (payload over the limit) stored nothing: none of that
  call's payloads exists;
- every item is finished: done, or dead with its error; where poison items (and killer
  items) run, the dead letters are exactly those.

Each scenario reports its ledger's figures through the `reliability` fixture: they make the
reliability table of docs/reliability.md (reliability.py, `make reliability`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from queuectl.catalog import QueueSettings
from queuectl.install import install_queue
from queuectl.names import QueueNames

import fault_workers
from conftest import worker_processes
from fault_handlers import is_killer, is_poison
from jobs_helpers import add_finished_rows
from reliability_fixtures import reliability, reliability_figures  # noqa: F401  (fixtures of every scenario)

PROCESSES = worker_processes()
LEASE_S = 2.0
PRODUCERS = 2
CONSUMERS = 3
LOAD_S = 8.0
DRAIN_DEADLINE_S = 90.0


def _read(path: Path) -> list[dict]:
    records = []
    if not path.exists():
        return records
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # the torn last line of a SIGKILLed process
            pass
    return records


class Load:
    """Producers and consumers as processes of their own, each with its own ledger file."""

    def __init__(self, url: str, tmp: Path, oversize_every: int = 0, oversize: int = 0, consumers: int = CONSUMERS,
                 producer_pause: float = 0.003, items: int = 0, producer_batch: int = 5, consumer_batch: int = 10):
        """With `items`, the producers stop by themselves once that many enqueues were
        acknowledged between them (see wait_produced); otherwise they run until finish."""
        self.url, self.tmp = url, tmp
        self.consumer_count = consumers
        self.producer_options = (oversize_every, oversize, producer_pause, items // PRODUCERS, producer_batch)
        self.items, self.consumer_batch = items, consumer_batch
        self.stop_producers = PROCESSES.Event()
        self.stop_consumers = PROCESSES.Event()
        self.producers: list = []
        self.consumers: dict[int, object] = {}
        self.killed: list[int] = []
        self._next = 0

    def start(self) -> None:
        for i in range(PRODUCERS):
            p = PROCESSES.Process(target=fault_workers.produce, args=(self.url, i, self.stop_producers, str(self.tmp / f"producer-{i}.jsonl"),
                                                                   *self.producer_options))
            p.start()
            self.producers.append(p)
        for _ in range(self.consumer_count):
            self.add_consumer()
        self.wait_ready()

    def wait_ready(self) -> None:
        """Wait until every process has opened its Queue (a first connect is not retried)."""
        deadline = time.monotonic() + 60
        expected = len(self.producers) + len(self.consumers)
        while True:
            paths = [*self.tmp.glob("producer-*.jsonl"), *self.tmp.glob("consumer-*.jsonl")]
            if len(paths) == expected and all(any(r["ev"] == "ready" for r in _read(p)) for p in paths):
                return
            live = [*self.producers, *(p for i, p in self.consumers.items() if i not in self.killed)]
            # a producer with a share of `items` exits 0 once it has sent them
            dead = [p.exitcode for p in live if p.exitcode not in (None, 0) or (p.exitcode == 0 and not self.items)]
            assert not dead, f"a load process exited during startup: {dead}"
            assert time.monotonic() < deadline, "load processes did not start within 60 s"
            time.sleep(0.05)

    def add_consumer(self) -> int:
        i = self._next
        self._next += 1
        p = PROCESSES.Process(target=fault_workers.consume, args=(self.url, i, self.stop_consumers, str(self.tmp / f"consumer-{i}.jsonl"), LEASE_S,
                                                             self.consumer_batch))
        p.start()
        self.consumers[i] = p
        return i

    def kill_consumer_mid_batch(self) -> int:
        """SIGKILL a live consumer right after it logged a batch it got (so it holds items).

        A consumer works about 10 ms on a batch before it acks it, so only the ledger's new
        bytes are read at each look: parsing the whole file took as long as that window once
        the file had grown, and the kill then came after the ack (the test saw no item come
        back). It fails if no batch was caught."""
        i = random.choice([k for k, p in self.consumers.items() if p.is_alive()])
        path = self.tmp / f"consumer-{i}.jsonl"
        deadline = time.monotonic() + 10
        caught = False
        with open(path, "rb") as ledger:
            ledger.seek(0, os.SEEK_END)
            tail = b""
            while time.monotonic() < deadline:
                tail += ledger.read()
                lines = tail.split(b"\n")
                tail = lines.pop()  # an unfinished line, if any
                if lines and json.loads(lines[-1])["ev"] == "got" and not tail:
                    caught = True
                    break
                time.sleep(0.0005)
        os.kill(self.consumers[i].pid, signal.SIGKILL)
        self.consumers[i].join(10)
        self.killed.append(i)
        assert caught, f"consumer {i} logged no batch within 10 s before it was killed"
        return i

    def wait_produced(self, timeout: float) -> None:
        """Until the producers of a load with `items` stopped by themselves, all of them sent."""
        deadline = time.monotonic() + timeout
        for p in self.producers:
            p.join(max(0.0, deadline - time.monotonic()))
            assert p.exitcode == 0, f"producer did not send its share within {timeout} s (exit code {p.exitcode})"

    def finish(self, engine, meta: str) -> None:
        self.stop_producers.set()
        for p in self.producers:
            p.join(60)
            assert p.exitcode == 0, f"producer exited with {p.exitcode}"
        deadline = time.monotonic() + DRAIN_DEADLINE_S
        while True:  # drain: expired leases of killed consumers come back and get done
            with engine.connect() as conn:
                open_items = conn.execute(sa.text(f"SELECT count(*) FROM {meta} WHERE status IN (0, 1)")).scalar_one()
            if open_items == 0:
                break
            assert time.monotonic() < deadline, f"{open_items} items still open after {DRAIN_DEADLINE_S} s"
            time.sleep(0.2)
        self.stop_consumers.set()
        for i, p in self.consumers.items():
            p.join(60)
            if i not in self.killed:
                assert p.exitcode == 0, f"consumer {i} exited with {p.exitcode}"


def _stored_items(engine, queue_names) -> tuple[list, list]:
    """Every item the queue stores: (live meta rows with their payload, history rows)."""
    meta, data, history = (queue_names.qualified(k) for k in ("meta", "data", "history"))
    with engine.connect() as conn:
        live = conn.execute(sa.text(
            f"SELECT m.id, convert_from(d.payload, 'UTF8') AS payload, m.status, m.attempts, m.last_error "
            f"FROM {meta} m LEFT JOIN {data} d ON d.id = m.id")).all()
        archived = conn.execute(sa.text(
            f"SELECT id, convert_from(payload, 'UTF8') AS payload, status, attempts, last_error FROM {history}")).all()
    return live, archived


def check_ledger(engine, queue_names, tmp: Path, scenario: str, killed: list[int], poison_every: int = 0,
                 killer_every: int = 0) -> dict:
    """The ledger check (module docstring) over every *.jsonl ledger file in tmp; returns the
    scenario's figures. With poison_every and killer_every the dead letters are exactly the
    poison items (fault_handlers.is_poison), whose handler always fails, and the killer
    items (is_killer), whose handler always kills its process; other items never die."""
    ok: dict[int, str] = {}
    unknown: list[str] = []
    rejected: list[list[str]] = []
    got: Counter = Counter()
    acked_by: dict[int, set[str]] = {}
    partial = 0
    reconnects = 0
    for path in sorted(tmp.glob("*.jsonl")):
        for r in _read(path):
            if r["ev"] == "ok":
                for item_id, payload in r["items"]:
                    assert item_id not in ok, f"id {item_id} returned by two enqueues"
                    ok[item_id] = payload
            elif r["ev"] == "unknown":
                unknown.extend(r["payloads"])
            elif r["ev"] == "rejected":
                rejected.append(r["payloads"])
            elif r["ev"] == "got":
                got.update(r["ids"])
            elif r["ev"] == "acked":
                for item_id in r["ids"]:
                    acked_by.setdefault(item_id, set()).add(path.stem)
            elif r["ev"] == "partial":
                partial += 1
            elif r["ev"] == "end":
                reconnects += r["reconnects"]

    live, archived = _stored_items(engine, queue_names)
    meta, data = queue_names.qualified("meta"), queue_names.qualified("data")
    with engine.connect() as conn:
        orphans = conn.execute(sa.text(
            f"SELECT count(*) FROM {data} d WHERE NOT EXISTS (SELECT 1 FROM {meta} m WHERE m.id = d.id)")).scalar_one()
    rows = live + archived
    stored = {r.id: r for r in rows}
    poison = {r.id for r in rows if is_poison(r.payload or "", poison_every)}
    killers = {r.id for r in rows if is_killer(r.payload or "", killer_every)}
    always_fail = poison | killers
    lost = [i for i in ok if i not in stored]
    twice_stored = [i for i, c in Counter(r.id for r in rows).items() if c > 1]
    payloads = Counter(r.payload for r in rows)
    dup_payloads = [p for p, c in payloads.items() if c > 1]
    twice_acked = [i for i, who in acked_by.items() if len(who) > 1]
    # an item whose handler never fails is worked on again only after its lease expired
    redelivered = {i: c for i, c in got.items() if c > 1}
    extra = [r for r in rows if r.id not in ok]
    dead = [r for r in rows if r.status == 3]
    stored_rejected = [p for call in rejected for p in call if p in payloads]
    summary = {
        "scenario": scenario,
        "acknowledged_enqueues": len(ok),
        "found_exactly_once": len(ok) - len(lost),
        "outcome_unknown_enqueues": len(unknown),
        "outcome_unknown_found": len(extra),
        "done": sum(r.status == 2 for r in rows),
        "dead_with_error": sum(1 for r in dead if r.last_error),
        "lost": len(lost),
        "duplicated": len(twice_stored) + len(dup_payloads) + len(twice_acked),
        "redelivered_after_lease_expiry": sum(1 for i in redelivered if i not in always_fail),
        "partial_acks": partial,
        "consumers_killed": len(killed),
        "client_reconnects": reconnects,
        "orphan_data_rows": orphans,
        "in_history": len(archived),
    }
    if poison_every:
        summary["poison_items"] = len(poison)
    if killer_every:
        summary["killer_items"] = len(killers)
    if rejected:
        summary["rejected_calls"] = len(rejected)
        summary["rejected_payloads_stored"] = len(stored_rejected)

    assert not twice_stored, f"ids both live and in history: {twice_stored[:10]}"
    assert orphans == 0, f"{orphans} orphan data rows"
    missing_payload = [r.id for r in live if r.payload is None]
    assert not missing_payload, f"meta rows without data: {missing_payload[:10]}"
    assert not lost, f"{len(lost)} acknowledged enqueues lost, e.g. {lost[:10]}"
    wrong = [i for i, p in ok.items() if stored[i].payload != p]
    assert not wrong, f"payload differs for ids {wrong[:10]}"
    assert not dup_payloads, f"payloads stored twice: {dup_payloads[:10]}"
    unknown_set = set(unknown)
    unexplained = [r.id for r in extra if r.payload not in unknown_set]
    assert not unexplained, f"rows no producer enqueued: {unexplained[:10]}"

    assert not twice_acked, f"items acked by two consumers: {twice_acked[:10]}"
    unexplained_dups = [i for i, c in redelivered.items() if i not in stored or stored[i].attempts < c]
    assert not unexplained_dups, f"items worked on more often than dequeued: {unexplained_dups[:10]}"
    assert all(r.last_error for r in dead), "dead letter without its error"
    if poison_every or killer_every:
        dead_ids = {r.id for r in dead}
        assert dead_ids == always_fail, (
            f"dead letters that are not poison or killers: {sorted(dead_ids - always_fail)[:10]}; "
            f"poison or killer items not dead: {sorted(always_fail - dead_ids)[:10]}")
    not_done = [r.id for r in rows if r.status not in (2, 3)]
    assert not not_done, f"items left unfinished: {not_done[:10]}"
    assert not stored_rejected, f"payloads of refused enqueues were stored: {stored_rejected[:5]}"
    return summary


def _setup(engine, **settings):
    install_queue(engine, "orders", settings=QueueSettings(lease_seconds=int(LEASE_S), **settings))
    return QueueNames("orders")


def _last_event(tmp: Path, prefix: str, ev: str) -> float:
    stamps = [r["t"] for path in tmp.glob(f"{prefix}-*.jsonl") for r in _read(path) if r["ev"] == ev]
    return max(stamps, default=0.0)


def test_sigkill_consumers_mid_batch(db_url, engine, tmp_path, reliability):
    names = _setup(engine)
    load = Load(db_url, tmp_path)
    load.start()
    try:
        time.sleep(2)
        for _ in range(3):
            load.kill_consumer_mid_batch()
            load.add_consumer()
            load.wait_ready()
            time.sleep(LOAD_S / 4)
        load.finish(engine, names.qualified("meta"))
    finally:
        load.stop_producers.set()
        load.stop_consumers.set()
    summary = check_ledger(engine, names, tmp_path, "sigkill-consumers", load.killed)
    reliability(summary)
    # every killed consumer held a batch it never acked: those items came back
    assert summary["redelivered_after_lease_expiry"] >= 1


PINNED_ITEMS = 20_000  # acknowledged enqueues of the pinned-horizon run, however long they take
PINNED_KILLS = 4       # consumers SIGKILLed mid-batch, one as each fifth of the items is done


def _holder_state(engine, pid: int):
    """The holding session as the server sees it, and how many transactions back its xmin is."""
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT state, xact_start, backend_xmin::text AS xmin, age(backend_xmin) AS xmin_age "
            "FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}).one()


def _dead_rows_vacuum_leaves(engine, table: str) -> int:
    """VACUUM the table, then the dead rows it had to leave (the statistics' n_dead_tup after a
    vacuum is what it found dead but could not remove: still visible to some snapshot); of a
    partitioned table (the reliable meta table since reliable_0012), its partitions'."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f"VACUUM {table}"))
        return conn.execute(sa.text(
            "SELECT sum(n_dead_tup)::bigint FROM pg_stat_user_tables WHERE relid = CAST(:table AS regclass) "
            "OR relid IN (SELECT relid FROM pg_partition_tree(CAST(:table AS regclass)))"),
            {"table": table}).scalar_one()


@pytest.mark.slow
def test_sigkill_consumers_with_the_horizon_pinned(db_url, engine, tmp_path, reliability):
    """A REPEATABLE READ snapshot taken before the first enqueue stays open through a 20,000
    item run with consumers SIGKILLed mid-batch: no dead row of the queue can be removed
    (what an analytics query or a forgotten idle-in-transaction session does), and still
    nothing is lost, nothing completed twice, every killed consumer's items come back."""
    names = _setup(engine)
    meta, data = names.qualified("meta"), names.qualified("data")
    with engine.begin() as conn:  # the held transaction reads this, nothing of the queue's
        conn.execute(sa.text("CREATE TABLE report_source AS SELECT generate_series(1, 1000) AS n"))
    holder = engine.connect().execution_options(isolation_level="REPEATABLE READ")
    try:
        assert holder.execute(sa.text("SELECT count(*) FROM report_source")).scalar_one() == 1000
        holder_pid = holder.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        pinned = _holder_state(engine, holder_pid)
        assert pinned.state == "idle in transaction" and pinned.xmin is not None, pinned
        load = Load(db_url, tmp_path, items=PINNED_ITEMS, producer_batch=20, consumer_batch=20)
        load.start()
        try:
            for k in range(1, PINNED_KILLS + 1):
                deadline = time.monotonic() + 300
                while True:
                    with engine.connect() as conn:
                        done = conn.execute(sa.text(f"SELECT count(*) FROM {meta} WHERE status = 2")).scalar_one()
                    if done >= k * PINNED_ITEMS // (PINNED_KILLS + 1):
                        break
                    assert time.monotonic() < deadline, f"only {done} items done after 300 s"
                    time.sleep(0.05)
                load.kill_consumer_mid_batch()
                load.add_consumer()
                load.wait_ready()
            load.wait_produced(300)
            load.finish(engine, meta)
        finally:
            load.stop_producers.set()
            load.stop_consumers.set()
        summary = check_ledger(engine, names, tmp_path, "sigkill-consumers-horizon-pinned", load.killed)

        # the horizon stayed where it was for the whole run: the same transaction, the same xmin,
        # which no item's payload row is older than (the first enqueue may take the very xid the
        # snapshot's xmin names, when nothing else ran); its snapshot still sees no item
        held = _holder_state(engine, holder_pid)
        assert (held.state, held.xact_start, held.xmin) == ("idle in transaction", pinned.xact_start, pinned.xmin)
        with engine.connect() as conn:
            not_older, stored = conn.execute(sa.text(
                f"SELECT count(*) FILTER (WHERE age(d.xmin) <= a.age), count(*) FROM {data} d, "
                "(SELECT age(backend_xmin) AS age FROM pg_stat_activity WHERE pid = :pid) a"),
                {"pid": holder_pid}).one()
        assert not_older == stored == summary["acknowledged_enqueues"] + summary["outcome_unknown_found"]
        assert holder.execute(sa.text(f"SELECT count(*) FROM {meta}")).scalar_one() == 0
        dead_rows = _dead_rows_vacuum_leaves(engine, meta)
    finally:
        holder.close()  # rolls the held transaction back: the horizon moves again
    released = _dead_rows_vacuum_leaves(engine, meta)
    summary.update(horizon_xmin=pinned.xmin, horizon_age_at_end=held.xmin_age,
                   meta_dead_rows_vacuum_left=dead_rows, meta_dead_rows_left_once_released=released)
    reliability(summary)
    assert summary["acknowledged_enqueues"] == PINNED_ITEMS
    assert summary["consumers_killed"] == PINNED_KILLS
    assert summary["redelivered_after_lease_expiry"] >= 1
    # every item's meta row was claimed and acked under the held snapshot: two dead versions each
    # that VACUUM found and could not remove; once the snapshot is gone it removes them
    assert dead_rows >= 2 * PINNED_ITEMS, dead_rows
    assert released == 0, released


def _restart_mid_load(embedded_server, mode: str, tmp: Path, consumed: tuple[str, str]) -> None:
    """Restart the server (`pg_ctl restart -m MODE`) in the middle of the load; producers and
    consumers (their ledger files' prefix and event) go on without any operator action."""
    time.sleep(LOAD_S / 2)
    before = time.time()
    assert _last_event(tmp, "producer", "ok") > before - 1, "load not running before the restart"
    embedded_server.restart(mode=mode)
    back = time.time()
    time.sleep(LOAD_S / 2)
    assert _last_event(tmp, "producer", "ok") > back + 1, "no enqueue succeeded after the restart"
    assert _last_event(tmp, *consumed) > back + 1, f"no {consumed[0]} {consumed[1]} anything after the restart"


def test_postgres_fast_restart(embedded_server, db_url, engine, tmp_path, reliability):
    if embedded_server is None:
        pytest.skip("restart scenario needs the embedded test server; $QUEUECTL_TEST_URL names an external one")
    names = _setup(engine)
    load = Load(db_url, tmp_path)
    load.start()
    try:
        _restart_mid_load(embedded_server, "fast", tmp_path, ("consumer", "acked"))
        load.finish(engine, names.qualified("meta"))
    finally:
        load.stop_producers.set()
        load.stop_consumers.set()
    summary = check_ledger(engine, names, tmp_path, "fast-restart", load.killed)
    reliability(summary)
    assert summary["client_reconnects"] >= 1


def test_terminate_random_backends(db_url, engine, tmp_path, reliability):
    names = _setup(engine)
    load = Load(db_url, tmp_path)
    load.start()
    terminated = 0
    database = engine.url.database
    try:
        time.sleep(1)
        deadline = time.monotonic() + LOAD_S
        with engine.connect() as conn:
            while time.monotonic() < deadline:
                pids = conn.execute(sa.text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = :db AND backend_type = 'client backend' "
                    "AND pid <> pg_backend_pid() ORDER BY random() LIMIT 2"), {"db": database}).scalars().all()
                for pid in pids:
                    terminated += bool(conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one())
                conn.commit()
                time.sleep(0.3)
        load.finish(engine, names.qualified("meta"))
    finally:
        load.stop_producers.set()
        load.stop_consumers.set()
    summary = check_ledger(engine, names, tmp_path, "terminate-backends", load.killed)
    summary["backends_terminated"] = terminated
    reliability(summary)
    assert terminated >= 5
    assert summary["client_reconnects"] >= 1


def test_oversized_payloads_are_refused_mid_load_and_nothing_else_is_affected(db_url, engine, tmp_path, reliability):
    names = _setup(engine, max_payload_bytes=OVERSIZE_LIMIT)
    load = Load(db_url, tmp_path, oversize_every=7, oversize=OVERSIZE_LIMIT + 1)
    load.start()
    try:
        time.sleep(LOAD_S)
        load.finish(engine, names.qualified("meta"))
    finally:
        load.stop_producers.set()
        load.stop_consumers.set()
    summary = check_ledger(engine, names, tmp_path, "oversized-payloads", load.killed)
    reliability(summary)
    assert summary["rejected_calls"] >= 5 and summary["rejected_payloads_stored"] == 0
    assert summary["outcome_unknown_enqueues"] == 0  # a refusal is a known outcome


# -- maintenance processes killed mid-work ---------------------------------------------------------

OVERSIZE_LIMIT = 256


def _queuectl(db_url: str, log: Path, *args: str, env_extra: dict[str, str] | None = None,
              stdout=subprocess.DEVNULL) -> subprocess.Popen:
    env = dict(os.environ, QUEUECTL_URL=db_url, COLUMNS="200", **(env_extra or {}))
    return subprocess.Popen([sys.executable, "-m", "queuectl.cli", *args], stdout=stdout,
                            stderr=log.open("ab"), env=env)


def _runs(engine) -> list:
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT job, outcome, runner_pid, rows FROM queuectl.job_runs ORDER BY id")).all()


def _wait_running(engine, job: str, pid: int, timeout: float = 60.0) -> None:
    """Until `pid` has a run of `job` in progress (its history row says 'running')."""
    deadline = time.monotonic() + timeout
    while not any(r.job == job and r.outcome == "running" and r.runner_pid == pid for r in _runs(engine)):
        assert time.monotonic() < deadline, f"no {job} run of pid {pid} started within {timeout} s"
        time.sleep(0.02)


def _history_count(engine, names) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text(f"SELECT count(*) FROM {names.qualified('history')}")).scalar_one()


def _archive_everything(engine) -> None:
    from queuectl.jobs.archive import ArchiveConfig
    from queuectl.jobs.runner import run_job

    record = run_job(engine, "archive", "orders", ArchiveConfig(min_age=0, dead_min_age=0, delay=0))
    assert record.outcome == "succeeded", record.error


def test_sigkill_archiver_mid_batch(db_url, engine, tmp_path, reliability):
    names = _setup(engine)
    load = Load(db_url, tmp_path)
    load.start()
    log = tmp_path / "archive.log"
    args = ("archive", "orders", "--continuous", "--batch", "25", "--min-age", "0s", "--dead-min-age", "0s",
            "--delay", "0.02s")
    killed: list[int] = []
    archiver = None
    try:
        for _ in range(3):
            archiver = _queuectl(db_url, log, *args)
            _wait_running(engine, "archive", archiver.pid)
            before = _history_count(engine, names)
            deadline = time.monotonic() + 30
            while _history_count(engine, names) == before:  # it is moving rows: kill it among its batches
                assert time.monotonic() < deadline, "the archiver moved nothing"
                time.sleep(0.01)
            time.sleep(random.uniform(0.1, 0.6))
            os.kill(archiver.pid, signal.SIGKILL)
            archiver.wait(30)
            killed.append(archiver.pid)
        archiver = _queuectl(db_url, log, *args)  # a last one runs through the end of the load
        _wait_running(engine, "archive", archiver.pid)  # (and has its signal handlers)
        time.sleep(LOAD_S / 4)
        load.finish(engine, names.qualified("meta"))
        archiver.send_signal(signal.SIGTERM)
        assert archiver.wait(60) == 0, log.read_text()
    finally:
        load.stop_producers.set()
        load.stop_consumers.set()
        if archiver is not None and archiver.poll() is None:
            archiver.kill()
    _archive_everything(engine)
    summary = check_ledger(engine, names, tmp_path, "sigkill-archiver", load.killed)
    runs = _runs(engine)
    summary.update(archivers_killed=len(killed),
                   runs_abandoned=sum(r.outcome == "abandoned" for r in runs),
                   runs_succeeded=sum(r.outcome == "succeeded" for r in runs))
    reliability(summary)
    with engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT count(*) FROM {names.qualified('meta')}")).scalar_one() == 0
    assert summary["in_history"] == summary["acknowledged_enqueues"] + summary["outcome_unknown_found"]
    # every killed run is on record as abandoned, none is left 'running'
    assert sorted(r.runner_pid for r in runs if r.outcome == "abandoned") == sorted(killed)
    assert not [r for r in runs if r.outcome == "running"]


SCHEDULER_CONFIG = """
[scheduler]
refresh = "1s"
workers = 2

[jobs.archive]
interval = "1s"
max_seconds = "2s"
batch = 40
min_age = "0s"
dead_min_age = "0s"
delay = "0.05s"

[jobs.reset_stale]
interval = "1s"

[jobs.inspect]
enabled = false

[jobs.reorganize]
enabled = false

[jobs.correct_watermark]
enabled = false
"""


def test_sigkill_scheduler_mid_job(db_url, engine, tmp_path, reliability):
    names = _setup(engine)
    config = tmp_path / "scheduler.toml"
    config.write_text(SCHEDULER_CONFIG)
    log = tmp_path / "scheduler.log"
    load = Load(db_url, tmp_path)
    load.start()
    killed: list[int] = []
    scheduler = None
    try:
        for _ in range(2):
            scheduler = _queuectl(db_url, log, "scheduler", "run", "--config", str(config))
            _wait_running(engine, "archive", scheduler.pid)
            time.sleep(random.uniform(0.2, 0.8))
            os.kill(scheduler.pid, signal.SIGKILL)
            scheduler.wait(30)
            killed.append(scheduler.pid)
        scheduler = _queuectl(db_url, log, "scheduler", "run", "--config", str(config))
        last = scheduler.pid
        # the jobs resume: the dead runners' locks went with their sessions
        deadline = time.monotonic() + 60
        while not {"archive", "reset_stale"} <= {r.job for r in _runs(engine) if r.runner_pid == last and r.outcome == "succeeded"}:
            assert time.monotonic() < deadline, f"jobs did not resume after the restart: {log.read_text()[-2000:]}"
            time.sleep(0.1)
        load.finish(engine, names.qualified("meta"))
        scheduler.send_signal(signal.SIGTERM)
        assert scheduler.wait(60) == 0, log.read_text()[-2000:]
    finally:
        load.stop_producers.set()
        load.stop_consumers.set()
        if scheduler is not None and scheduler.poll() is None:
            scheduler.kill()
    _archive_everything(engine)
    summary = check_ledger(engine, names, tmp_path, "sigkill-scheduler", load.killed)
    runs = _runs(engine)
    summary.update(schedulers_killed=len(killed),
                   runs_abandoned=sum(r.outcome == "abandoned" for r in runs),
                   runs_succeeded=sum(r.outcome == "succeeded" for r in runs),
                   runs_failed=sum(r.outcome == "failed" for r in runs))
    reliability(summary)
    # nothing of the killed schedulers is left 'running'; each left at least its archive run abandoned
    assert not [r for r in runs if r.outcome == "running"]
    assert {r.runner_pid for r in runs if r.outcome == "abandoned"} == set(killed)
    assert not [r for r in runs if r.outcome == "failed"]
    assert summary["in_history"] == summary["acknowledged_enqueues"] + summary["outcome_unknown_found"]


# -- `queuectl worker` processes killed, the server crashed, reorganize under load -------------

FAULTS_DIR = Path(__file__).resolve().parent
WORK_S = 0.003      # each item's work in the handler: an item is in a handler when its worker is killed
POISON_EVERY = 53   # about one payload in 53 makes the handler fail every time: dead letters


def _processes_of(tmp: Path) -> list[int]:
    """The live processes whose environment names a ledger file under tmp: the workers of
    one test and every process they started."""
    marker = f"QT_LEDGER_FILE={tmp}/".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


class CliWorkers:
    """`queuectl worker` processes on the queue running fault_handlers.record, each with its
    own ledger file (worker-N.jsonl: a "got" line per delivery) and log; `env` is added to
    their environment (e.g. QT_KILLER_EVERY)."""

    def __init__(self, url: str, tmp: Path, *options: str, env: dict[str, str] | None = None):
        self.url, self.tmp, self.options = url, tmp, options
        self.env = env or {}
        self.procs: dict[int, subprocess.Popen] = {}
        self.killed: list[int] = []

    def start(self) -> int:
        """Start one more worker (without waiting for it: see wait_started)."""
        i = len(self.procs)
        env = {"QT_LEDGER_FILE": str(self.tmp / f"worker-{i}.jsonl"), "QT_WORK_S": str(WORK_S),
               "QT_POISON_EVERY": str(POISON_EVERY),
               "PYTHONPATH": os.pathsep.join([str(FAULTS_DIR), os.environ.get("PYTHONPATH", "")]), **self.env}
        self.procs[i] = _queuectl(self.url, self.tmp / f"worker-{i}.log", "worker", "orders", "--handler",
                                  "fault_handlers:record", "--batch", "10", "--poll-interval", "0.5", "--json",
                                  *self.options, env_extra=env, stdout=subprocess.PIPE)
        return i

    def wait_started(self) -> None:
        """Until every worker runs (its start line is in its log)."""
        deadline = time.monotonic() + 60
        for i, proc in self.procs.items():
            log = self.tmp / f"worker-{i}.log"
            while proc.pid not in self.killed and "on queue orders:" not in log.read_text():
                assert proc.poll() is None, f"worker {i} exited with {proc.returncode}: {log.read_text()[-2000:]}"
                assert time.monotonic() < deadline, f"worker {i} did not start within 60 s"
                time.sleep(0.05)

    def kill_mid_batch(self) -> int:
        """SIGKILL a live worker right after its handler started an item (so it holds items)."""
        i = random.choice([k for k, p in self.procs.items() if p.poll() is None])
        ledger = self.tmp / f"worker-{i}.jsonl"
        size = ledger.stat().st_size if ledger.exists() else 0
        deadline = time.monotonic() + 30  # (a worker just started may still be importing)
        while not ledger.exists() or ledger.stat().st_size == size:
            assert time.monotonic() < deadline, f"worker {i} started no item within 30 s"
            time.sleep(0.001)
        proc = self.procs[i]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self.killed.append(proc.pid)
        return i

    def stop(self) -> None:
        """SIGTERM every live worker: each exits 0, without a traceback, printing its counts."""
        live = {i: p for i, p in self.procs.items() if p.pid not in self.killed}
        for proc in live.values():
            proc.send_signal(signal.SIGTERM)
        for i, proc in live.items():
            stdout, _ = proc.communicate(timeout=60)
            log = (self.tmp / f"worker-{i}.log").read_text()
            assert proc.returncode == 0 and "Traceback" not in log, log[-2000:]
            assert "processed" in json.loads(stdout)

    def kill_all(self) -> None:
        """SIGKILL what is left, including handler processes a SIGKILLed worker left behind."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for pid in _processes_of(self.tmp):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _cli_workers_under_load(db_url, engine, tmp_path, scenario: str, *options: str, producer_pause: float,
                            kills: int = 0, load_s: float = 1.0, killer_every: int = 0, **settings) -> dict:
    """Producers, two `queuectl worker` processes (their handlers kill their own process on the
    killer items of `killer_every`); after `load_s` seconds, `kills` times a worker is
    SIGKILLed mid-batch and a new one started; the last ones drain the queue and stop on
    SIGTERM. `settings` are the queue's (backoff_base_seconds is 0)."""
    names = _setup(engine, backoff_base_seconds=0, **settings)
    load = Load(db_url, tmp_path, consumers=0, producer_pause=producer_pause)
    workers = CliWorkers(db_url, tmp_path, *options, env={"QT_KILLER_EVERY": str(killer_every)})
    load.start()
    try:
        workers.start()
        workers.start()
        workers.wait_started()
        time.sleep(load_s)
        for _ in range(kills):
            workers.kill_mid_batch()
            workers.start()
            time.sleep(LOAD_S / 8)
        workers.wait_started()
        load.finish(engine, names.qualified("meta"))
        workers.stop()
    finally:
        load.stop_producers.set()
        workers.kill_all()
    summary = check_ledger(engine, names, tmp_path, scenario, [], poison_every=POISON_EVERY, killer_every=killer_every)
    summary["workers_killed"] = len(workers.killed)
    return summary


def test_sigkill_cli_worker_mid_batch_threads(db_url, engine, tmp_path, reliability):
    summary = _cli_workers_under_load(db_url, engine, tmp_path, "sigkill-cli-worker-threads", "--concurrency", "4",
                                      kills=3, producer_pause=0.003)
    reliability(summary)
    # the killed workers held items they never finished: those came back after their leases
    assert summary["redelivered_after_lease_expiry"] >= 1
    assert summary["poison_items"] >= 1


def test_sigkill_cli_worker_mid_batch_processes(db_url, engine, tmp_path, reliability):
    # each item crosses to a handler process and back: producers slow down to what two can
    # take; two kills, as each new worker spawns its handler processes (seconds on a busy host)
    summary = _cli_workers_under_load(db_url, engine, tmp_path, "sigkill-cli-worker-processes", "--processes",
                                      "--concurrency", "2", kills=2, producer_pause=0.02)
    reliability(summary)
    assert summary["redelivered_after_lease_expiry"] >= 1
    assert summary["poison_items"] >= 1


KILLER_EVERY = 97  # about one payload in 97 makes its handler SIGKILL its own process, every attempt
KILLER_MAX_ATTEMPTS = 3


def test_handlers_killing_their_process_charge_only_their_own_item(db_url, engine, tmp_path, reliability):
    # Each handler thread of `--processes` runs its own process: a killer item takes only its
    # own process down, so only it is charged; the item in the other process runs on.
    summary = _cli_workers_under_load(db_url, engine, tmp_path, "handler-kills-its-process", "--processes",
                                      "--concurrency", "2", producer_pause=0.02, load_s=LOAD_S / 2,
                                      killer_every=KILLER_EVERY, max_attempts=KILLER_MAX_ATTEMPTS)
    died = "HandlerProcessDied: handler process died (killed by signal 9, SIGKILL)"
    # the workers log one line per handler process that died under its item
    summary["handler_processes_killed"] = sum(path.read_text().count(died) for path in tmp_path.glob("worker-*.log"))
    reliability(summary)
    assert summary["killer_items"] >= 3
    assert summary["handler_processes_killed"] == KILLER_MAX_ATTEMPTS * summary["killer_items"]
    live, archived = _stored_items(engine, QueueNames("orders"))
    items = live + archived
    killers = [r for r in items if is_killer(r.payload, KILLER_EVERY)]
    # every other item ran in a process that lived: never charged for a neighbour's death
    bystanders = [r for r in items if not is_killer(r.payload, KILLER_EVERY) and not is_poison(r.payload, POISON_EVERY)]
    charged = [(r.id, r.status, r.attempts, r.last_error) for r in bystanders
               if (r.status, r.attempts) != (2, 1) or "BrokenProcessPool" in (r.last_error or "")
               or "process died" in (r.last_error or "")]
    assert not charged, f"{len(charged)} items charged for another item's handler process: {charged[:5]}"
    assert [(r.id, r.status, r.attempts, r.last_error) for r in killers] == [
        (r.id, 3, KILLER_MAX_ATTEMPTS, died) for r in killers]


def test_postgres_immediate_restart_under_cli_workers(embedded_server, db_url, engine, tmp_path, reliability):
    if embedded_server is None:
        pytest.skip("restart scenario needs the embedded test server; $QUEUECTL_TEST_URL names an external one")
    names = _setup(engine, backoff_base_seconds=0)
    load = Load(db_url, tmp_path, consumers=0)
    workers = CliWorkers(db_url, tmp_path, "--concurrency", "4")
    load.start()
    try:
        workers.start()
        workers.start()
        workers.wait_started()
        # no checkpoint, every backend killed: the server comes back by crash recovery
        _restart_mid_load(embedded_server, "immediate", tmp_path, ("worker", "got"))
        load.finish(engine, names.qualified("meta"))
        workers.stop()  # they reconnected by themselves: each stops cleanly
    finally:
        load.stop_producers.set()
        workers.kill_all()
    summary = check_ledger(engine, names, tmp_path, "immediate-restart", [], poison_every=POISON_EVERY)
    reliability(summary)
    assert summary["client_reconnects"] >= 1


def test_reorganize_under_load(db_url, engine, tmp_path, reliability):
    names = _setup(engine)
    load = Load(db_url, tmp_path)
    load.start()
    log = tmp_path / "reorganize.log"
    # thresholds at zero: every measured index is rebuilt (REINDEX CONCURRENTLY) while the load runs
    args = ("reorganize", "orders", "--min-pages", "0", "--bloat", "0", "--fragmentation", "0", "--json")
    runs: list[dict] = []
    windows: list[tuple[float, float]] = []
    try:
        time.sleep(1)
        deadline = time.monotonic() + LOAD_S / 2
        while time.monotonic() < deadline or len(runs) < 2:
            started = time.time()
            proc = _queuectl(db_url, log, *args, stdout=subprocess.PIPE)
            stdout, _ = proc.communicate(timeout=120)
            windows.append((started, time.time()))
            assert proc.returncode == 0, log.read_text()[-2000:]
            runs.append(json.loads(stdout))
        load.finish(engine, names.qualified("meta"))
    finally:
        load.stop_producers.set()
        load.stop_consumers.set()
    summary = check_ledger(engine, names, tmp_path, "reorganize-under-load", load.killed)
    rebuilt = [i for run in runs for i in run["result"]["indexes"] if i["action"] == "rebuilt"]
    summary.update(reorganize_runs=len(runs), indexes_rebuilt=len(rebuilt))
    reliability(summary)
    assert [(r["outcome"], r["error"]) for r in runs] == [("succeeded", None)] * len(runs)
    assert all(run["rows"] >= 1 for run in runs), "a run rebuilt nothing"
    _assert_load_ran_during(tmp_path, windows)
    assert _invalid_indexes(engine, names) == []  # no leftover of a REINDEX CONCURRENTLY


def _assert_load_ran_during(tmp: Path, windows: list[tuple[float, float]]) -> None:
    """Producers enqueued and consumers acked inside each (start, end) window."""
    events = [(r["ev"], r["t"]) for path in tmp.glob("*.jsonl") for r in _read(path)]
    for started, ended in windows:
        assert {"ok", "acked"} <= {ev for ev, t in events if started < t < ended}, (
            f"the load stalled between {started:.3f} and {ended:.3f}")


def _invalid_indexes(engine, names) -> list[str]:
    """The queue's INVALID indexes (what an interrupted REINDEX CONCURRENTLY leaves)."""
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT indexrelid::regclass::text FROM pg_index WHERE NOT indisvalid "
            "AND indrelid IN (CAST(:meta AS regclass), CAST(:data AS regclass))"),
            {"meta": names.qualified("meta"), "data": names.qualified("data")}).scalars().all()


# Finished rows beside the load, in three of the five indexes: building and validating the
# new copy of each takes ~50 ms on an idle 2-core host (more under the load), a window the
# 5 ms poll below does not miss; 300,000 would add ~4 s to the test for nothing.
BALLAST = 100_000


def _backend_building_a_new_index(engine, proc: subprocess.Popen) -> int:
    """The pid of the session of `proc` (a `queuectl reorganize`) while its REINDEX INDEX
    CONCURRENTLY builds or validates the new copy of an index (its INVALID *_ccnew exists,
    the swap has not happened yet). The statement's text begins with a comment line, so it
    is matched anywhere in the text."""
    with engine.connect() as conn:
        while True:
            pid = conn.execute(sa.text(
                "SELECT a.pid FROM pg_stat_activity a JOIN pg_stat_progress_create_index p ON p.pid = a.pid "
                "WHERE a.datname = current_database() AND a.query LIKE '%REINDEX INDEX CONCURRENTLY%' "
                "AND (p.phase LIKE 'building index%' OR p.phase LIKE 'index validation%')")).scalar()
            conn.commit()  # pg_stat_activity is read once per transaction
            if pid is not None:
                return pid
            assert proc.poll() is None, f"reorganize exited ({proc.returncode}) before a REINDEX could be cut"
            time.sleep(0.005)


def test_reorganize_terminated_mid_reindex_under_load(db_url, engine, tmp_path, reliability):
    """pg_terminate_backend on `queuectl reorganize`'s session while its REINDEX INDEX
    CONCURRENTLY builds a new index, under producers and consumers: one line, exit 3, the run
    failed with the server's reason, its *_ccnew dropped in the same run; the next run
    rebuilds every index; the load never stops and the ledger holds."""
    names = _setup(engine)
    add_finished_rows(engine, BALLAST)
    meta, data = names.qualified("meta"), names.qualified("data")
    with engine.connect() as conn:  # the ballast has ids 1..BALLAST; the load's items come after
        assert conn.execute(sa.text(f"SELECT max(id) FROM {meta}")).scalar_one() == BALLAST
    load = Load(db_url, tmp_path)
    load.start()
    log = tmp_path / "reorganize.log"
    args = ("reorganize", "orders", "--min-pages", "0", "--bloat", "0", "--fragmentation", "0")
    windows: list[tuple[float, float]] = []
    runs: list[subprocess.Popen] = []
    try:
        time.sleep(1)
        started = time.time()
        proc = _queuectl(db_url, log, *args)
        runs.append(proc)
        pid = _backend_building_a_new_index(engine, proc)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
        assert proc.wait(120) == 3, log.read_text()[-2000:]
        windows.append((started, time.time()))
        lines = log.read_text().splitlines()
        assert len(lines) == 1 and lines[0].startswith("reorganize failed: reindex orders_"), lines
        assert "terminating connection due to administrator command" in lines[0]
        assert _invalid_indexes(engine, names) == []  # dropped by the failed run itself

        started = time.time()
        again = _queuectl(db_url, log, *args, "--json", stdout=subprocess.PIPE)
        runs.append(again)
        stdout, _ = again.communicate(timeout=120)
        windows.append((started, time.time()))
        assert again.returncode == 0, log.read_text()[-2000:]
        load.finish(engine, meta)
    finally:
        load.stop_producers.set()
        load.stop_consumers.set()
        for run in runs:
            if run.poll() is None:
                run.kill()
    with engine.connect() as conn:
        cut, rerun = conn.execute(sa.text(
            "SELECT outcome, error, details FROM queuectl.job_runs WHERE job = 'reorganize' ORDER BY id")).all()
    assert (cut.outcome, cut.error) == ("failed", lines[0].removeprefix("reorganize failed: "))
    assert cut.details["connection_lost"] is True
    leftovers = cut.details["leftovers"]
    assert [(e["index"].endswith("_ccnew"), e["action"]) for e in leftovers] == [(True, "dropped")], leftovers
    second = json.loads(stdout)
    assert (rerun.outcome, second["outcome"], second["error"]) == ("succeeded", "succeeded", None)
    assert second["result"]["leftovers"] == []
    rebuilt = [i["index"] for i in second["result"]["indexes"] if i["action"] == "rebuilt"]
    assert len(rebuilt) == len(second["result"]["indexes"]) >= 5, second["result"]["indexes"]
    _assert_load_ran_during(tmp_path, windows)
    assert _invalid_indexes(engine, names) == []
    with engine.begin() as conn:  # the ballast came through whole; then only the load's items are left
        intact = conn.execute(sa.text(
            f"SELECT count(*) FROM {meta} m JOIN {data} d ON d.id = m.id "
            f"WHERE m.id <= :n AND m.status = 2 AND convert_from(d.payload, 'UTF8') = 'done-' || m.id"),
            {"n": BALLAST}).scalar_one()
        assert intact == BALLAST
        conn.execute(sa.text(f"DELETE FROM {meta} WHERE id <= :n"), {"n": BALLAST})
        conn.execute(sa.text(f"DELETE FROM {data} WHERE id <= :n"), {"n": BALLAST})  # no cascade since reliable_0012
    summary = check_ledger(engine, names, tmp_path, "reorganize-terminated-mid-reindex", load.killed)
    summary.update(ballast_rows=BALLAST, index_cut=cut.error.split(":")[0].removeprefix("reindex "),
                   leftovers_dropped=len(leftovers), indexes_rebuilt=len(rebuilt))
    reliability(summary)
