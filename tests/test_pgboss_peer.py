"""pg-boss as a peer of the sustained scenario (bench/pgboss/peer.mjs under Node, driven by
queuectl.bench.sustained_peers): a short real run through its own API, and the refusal when
Node or the package is missing. The real runs need Node and `make peer-pgboss`; without them
they are reported as skipped, with that command as the reason."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
import sqlalchemy as sa

from queuectl.bench import sustained_peers
from queuectl.bench.drivers import bench_sql
from queuectl.bench.sustained_peers import (PGBOSS_ANSWER_SECONDS, PGBOSS_SCHEMA, PgBossPeer, PgBossProcess,
                                            _pgboss_report, _pgboss_spec)
from queuectl.names import QueueNames, quote_ident
from conftest import run_cli
from test_bench import _schema

VALUES: dict[str, str | int] = {"schema": quote_ident(PGBOSS_SCHEMA)}


def _installed_or_skip() -> None:
    reason = PgBossPeer().unavailable(None)
    if reason is not None:
        pytest.skip(reason)


def _ask(node: PgBossProcess) -> dict[str, Any]:
    return node.receive(PGBOSS_ANSWER_SECONDS)


@pytest.mark.slow
def test_every_job_a_pgboss_producer_sends_is_completed_once_by_its_consumers(db_url: str, engine: sa.Engine) -> None:
    """One paced producer, two work() consumers: once the producer has stopped and the queue is
    empty, every job it inserted (warm-up included) is in state completed, none ran twice
    (retry_count 0), the consumers' handlers saw exactly as many jobs, and the reports parse:
    sends on their schedule, a latency for every job sent in the window. Thousands of jobs go
    to two consumers, so a consumer's report (two numbers a job) is longer than a pipe's buffer.
    The rate stays within the consumers' reach: once inserts stop, no NOTIFY wakes a worker,
    and what is left is fetched a batch per worker per notifyPollingIntervalSeconds (30 s)."""
    _installed_or_skip()
    peer, names = PgBossPeer(), QueueNames("pgboss_once", "queuectl")
    run = SimpleNamespace(engine=engine, url=db_url)
    peer.install(run, names)
    nodes: list[PgBossProcess] = []
    try:
        assert peer.label.startswith("pg-boss 12.") and "job_common" in peer.tables

        def start(role: str, seed: int, batch: int, **more: Any) -> PgBossProcess:
            node = PgBossProcess(_pgboss_spec(role, db_url, names.queue, batch=batch, payload_bytes=300, seed=seed,
                                              **more))
            nodes.append(node)
            return node

        producer = start("producer", 1000, 100, rate=1500.0, phase=0.5)
        consumers = [start("consumer", 2000 + i, 100) for i in range(2)]
        warm = {id(n): int(_ask(n)["warmup_count"]) for n in [producer, *consumers]}
        t_go = time.time()
        for node in [producer, *consumers]:
            node.send("go")
        time.sleep(5.0)
        producer.send("stop")
        sent = _pgboss_report(_ask(producer)["report"])
        deadline = time.time() + 90
        while peer.left(run, names) and time.time() < deadline:  # the consumers take what is left
            time.sleep(0.2)
        assert peer.left(run, names) == 0
        for node in consumers:
            node.send("stop")
        took = [_pgboss_report(_ask(n)["report"]) for n in consumers]
    finally:
        for node in nodes:
            node.close()
    try:
        with engine.connect() as conn:
            states = {row.state: (row.jobs, row.retried) for row in conn.execute(
                sa.text(bench_sql("pgboss_states", VALUES)), {"queue": names.queue})}
    finally:
        peer.uninstall(run, names)
    enqueued = warm[id(producer)] + sum(sent["accepted"])
    assert warm[id(producer)] == 600 and sum(sent["accepted"]) >= 5000  # 6 warm-up batches; 5 s at 1,500 a second
    assert states == {"completed": (enqueued, 0)}
    assert sum(t["warmup_count"] + len(t["done"]) for t in took) == enqueued
    assert all(t["retried"] == 0 for t in took) and all(len(t["done"]) > 0 for t in took)
    assert list(sent["due"]) == sorted(sent["due"]) and all(s >= d - 0.001 for d, s in zip(sent["due"], sent["sent"]))
    assert sent["due"][0] >= t_go - 0.5 and sent["batch"] == 100 and set(sent["accepted"]) == {100}
    latencies = [x for t in took for x in t["latency"] if not math.isnan(x)]
    assert len(latencies) == sum(sent["accepted"])  # each job sent in the window, once
    assert all(0 <= x < 10 for x in latencies)


@pytest.mark.slow
def test_a_tiny_sustained_run_measures_pgboss_clean_and_held(db_url: str, tmp_path: Path) -> None:
    """--kinds pgboss: the same paced load, hold and sampling as queuectl's kinds, in the same
    database (the holder pins pg-boss too); the numbers of every interval parse, every job is
    in the ledger, and the row names pg-boss and its version."""
    _installed_or_skip()
    out = tmp_path / "bench.json"
    proc = run_cli("bench", "--scenario", "sustained", "--kinds", "pgboss", "--minutes", "0.05", "--interval", "1",
                   "--hold", "both", "--rate", "100", "--producers", "1", "--consumers", "2",
                   "--bystander-rows", "20000", "--json", str(out), url=db_url, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    result = json.loads(out.read_text())
    jsonschema.validate(result, _schema())
    sc, su = result["scenario"], result["scenario"]["sustained"]
    assert [r["hold"] for r in su["runs"]] == ["none", "snapshot"]
    for r in su["runs"]:
        assert r["peer"] == {"label": r["peer"]["label"], "consumers": 2} and r["peer"]["label"].startswith("pg-boss 12.")
        ledger = r["ledger"]
        assert ledger["enqueued"] > 0 and ledger["lost"] == 0 and ledger["completed"] + ledger["left"] == ledger["enqueued"]
        assert len(r["series"]) == 3 and r["summary"]["completed_per_s"] > 50
        for s in r["series"]:
            assert s["total_bytes"] > 0 and s["backlog"] is not None and s["dead_rows"] is not None
            assert s["latency_p50_ms"] is not None and 0 < s["latency_p50_ms"] <= s["latency_p99_ms"]
        if r["hold"] == "snapshot":
            assert r["holder"]["horizon_start"] == r["holder"]["horizon_end"]
    assert [row["subject"] for row in sc["rows"]] == [su["runs"][0]["peer"]["label"]] * 2
    assert not any(t["name"].startswith("pgboss") for t in sc["targets"])


def test_without_node_or_the_package_pgboss_is_refused_in_one_line_naming_make_peer_pgboss(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    peer = PgBossPeer()
    monkeypatch.setattr(sustained_peers, "pgboss_dir", lambda: tmp_path)  # nothing installed there
    monkeypatch.setattr(sustained_peers.shutil, "which", lambda name: "/usr/bin/node")
    no_package = peer.unavailable(None)
    monkeypatch.setattr(sustained_peers.shutil, "which", lambda name: None)
    no_node = peer.unavailable(None)
    for reason in (no_package, no_node):
        assert reason is not None and "\n" not in reason and "make peer-pgboss" in reason
    assert no_node.startswith("Node.js is not installed") and no_package.startswith("pg-boss is not installed")
    (tmp_path / "node_modules" / "pg-boss").mkdir(parents=True)
    (tmp_path / "node_modules" / "pg-boss" / "package.json").write_text("{}")
    monkeypatch.setattr(sustained_peers.shutil, "which", lambda name: "/usr/bin/node")
    assert peer.unavailable(None) is None


def test_the_pgboss_peer_is_pinned_and_its_install_is_reproducible() -> None:
    """package.json names one exact version, package-lock.json locks it (npm ci installs
    exactly that), node_modules is not in git, and make peer-pgboss runs npm ci there."""
    root = Path(sustained_peers.__file__).resolve().parent.parent
    here = Path(sustained_peers.pgboss_dir())
    wanted = json.loads((here / "package.json").read_text())["dependencies"]["pg-boss"]
    lock = json.loads((here / "package-lock.json").read_text())
    assert wanted[0].isdigit() and lock["packages"]["node_modules/pg-boss"]["version"] == wanted
    assert lock["packages"]["node_modules/pg-boss"]["integrity"].startswith("sha512-")
    assert "bench/pgboss/node_modules/" in (root / ".gitignore").read_text().splitlines()
    makefile = (root / "Makefile").read_text()
    assert "cd bench/pgboss && npm ci" in makefile and "\npeer-pgboss:" in makefile
