"""`queuectl bench`: a tiny real run (processes, pgbench) whose JSON matches the schema.

No performance is asserted here: only that every figure was measured, is consistent
with the others, and that the document is what result_schema.json promises.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import zipfile
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from queuectl.bench.pgbench import Connection, find_pgbench
from conftest import process_alive, run_cli, statements_executed
from lab_probes import LAB, lab_module
from test_plan_guard import GUARD, proconfig


def _schema() -> dict:
    return json.loads(resources.files("queuectl.bench").joinpath("result_schema.json").read_text())


@pytest.mark.slow
def test_tiny_kinds_run_writes_json_that_matches_the_schema(db_url: str, engine: sa.Engine, tmp_path: Path) -> None:
    assert find_pgbench(), "pgbench is part of the PostgreSQL client tools the suite runs on"
    out = tmp_path / "bench.json"
    proc = run_cli(
        "bench", "--seconds", "1", "--repeat", "1", "--batch", "5", "--producers", "1", "--consumers", "1",
        "--json", str(out), url=db_url, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    result = json.loads(out.read_text())
    jsonschema.validate(result, _schema())

    sc = result["scenario"]
    assert sc["unavailable"] == []
    assert {(c["name"], c["clients"]) for c in sc["ceilings"]} == {
        (name, n) for name in ("SELECT 1 round trips", "single-row commits") for n in (1, 2)
    }
    assert all(c["rate"]["median"] > 0 for c in sc["ceilings"])
    phases = {row["phase"]: row for row in sc["rows"]}
    assert set(phases) == {"enqueue-only", "dequeue-only", "full-cycle"}
    for row in phases.values():
        rate, ceiling = row["rate"]["median"], row["ceiling"]["rate"]["median"]
        assert rate > 0 and ceiling > 0
        assert abs(row["fraction_of_ceiling"]["median"] - rate / ceiling) < 1e-9
    cycle = phases["full-cycle"]["latency_ms"]
    assert 0 < cycle["p50"]["median"] <= cycle["p99"]["median"]
    assert phases["enqueue-only"]["latency_ms"] is None
    assert result["environment"]["cpu_count"] >= 1 and len(result["environment"]["load_average"]) == 3
    # the pgbench commands are recorded, each on this database
    assert {"ceiling select1", "ceiling commit", "sql enqueue", "sql dequeue", "sql full-cycle"} <= set(result["commands"])
    database = make_url(db_url).database
    assert all(cmd[-1] == database for cmd in result["commands"].values())
    # the meta table's churn is reported (HOT updates counted, whatever they are)
    meta = result["scenario"]["table_stats"]["reliable"]["bench_reliable_meta"]
    assert meta["n_tup_upd"] > 0 and "n_tup_hot_upd" in meta
    # the bench queue is left empty
    with engine.connect() as conn:
        assert conn.execute(sa.text('SELECT count(*) FROM queuectl."bench_reliable_meta"')).scalar_one() == 0


def test_pgbench_gets_the_password_only_through_its_environment() -> None:
    conn = Connection.from_url("postgresql+psycopg://app:s3cr3t@db.example:6543/orders?sslmode=require")
    assert conn.args == ("-h", "db.example", "-p", "6543", "-U", "app")
    assert "s3cr3t" not in " ".join(conn.args) and "s3cr3t" not in repr(conn)
    assert conn.env == {"PGPASSWORD": "s3cr3t", "PGSSLMODE": "require"}
    socket = Connection.from_url("postgresql+psycopg://queuectl@/queuectl?host=/tmp/x/run&port=5999")
    assert socket.args == ("-h", "/tmp/x/run", "-p", "5999", "-U", "queuectl") and socket.env == {}


@pytest.mark.slow
def test_unknown_scenario_is_a_one_line_usage_error(db_url: str) -> None:
    proc = run_cli("bench", "--scenario", "nope", "--seconds", "1", url=db_url)
    assert proc.returncode == 2
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "unknown scenario 'nope'" in lines[0] and "kinds" in lines[0]


def test_one_table_baseline_hands_out_each_message_once(db_url: str, engine: sa.Engine) -> None:
    from queuectl.bench.drivers import driver_for
    from queuectl.names import QueueNames

    driver, names = driver_for("onetable"), QueueNames("bsplit_one")
    driver.install(engine, names)
    sent = [f"m{i}".encode() for i in range(30)]
    a, b = driver.open(db_url, names), driver.open(db_url, names)
    try:
        a.enqueue(sent[:20])
        b.enqueue(sent[20:])
        got: list[bytes] = []
        held_a, token_a = a.take(7)
        held_b, token_b = b.take(7)  # skips the rows a holds
        assert not set(held_a) & set(held_b)
        got += held_a + held_b
        a.finish(token_a)
        b.finish(token_b)
        while True:
            payloads, token = a.take(7)
            if not payloads:
                break
            a.finish(token)
            got += payloads
    finally:
        a.close()
        b.close()
    assert sorted(got) == sorted(sent)
    with engine.connect() as conn:
        assert driver.consumed(conn, names)[0] == 30 and driver.ready(conn, names) == 0
    # the split comparison is fair: the same plan settings as the reliable functions
    # (reliable_0008's guard) and the same columns back as the reliable dequeue
    assert proconfig(engine, "bsplit_one", ("dequeue", "ack")) == {"dequeue": GUARD, "ack": GUARD}
    reliable = QueueNames("bcols_reliable")
    driver_for("reliable").install(engine, reliable)
    assert _dequeue_columns(engine, names) == _dequeue_columns(engine, reliable)
    driver_for("reliable").uninstall(engine, reliable)
    driver.uninstall(engine, names)


def test_lean_one_table_deletes_what_is_acked_and_hands_out_each_message_once(db_url: str, engine: sa.Engine) -> None:
    """The ring scenario's one-table queue (pick and claim in one UPDATE, DELETE at
    ack): two sessions never get the same row, acked rows are gone, and a claimed but
    unacked one stays leased to its taker."""
    from queuectl.bench.drivers import driver_for
    from queuectl.names import QueueNames

    driver, names = driver_for("lean"), QueueNames("bring_lean")
    driver.install(engine, names)
    a, b = driver.open(db_url, names), driver.open(db_url, names)
    try:
        a.enqueue([b"a", b"b", b"c", b"d"])
        held_a, token_a = a.take(2)
        held_b, token_b = b.take(5)  # skips the rows a holds
        assert sorted(held_a + held_b) == [b"a", b"b", b"c", b"d"] and len(held_a) == 2
        a.finish(token_a)
        b.finish(token_b[:1])  # the other one stays claimed
        assert a.take(5) == ([], []) and b.take(5) == ([], [])
    finally:
        a.close()
        b.close()
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(f"SELECT payload, status, lease_owner FROM {names.qualified('meta')}").all()
        assert [(bytes(p), st) for p, st, _ in rows] == [(held_b[1], 1)] and rows[0][2].startswith("bench:")
        assert driver.ready(conn, names) == 0
        with pytest.raises(NotImplementedError):
            driver.consumed(conn, names)
    driver.uninstall(engine, names)


def test_reliable_sqla_kind_runs_the_same_calls_through_sqlalchemy(db_url: str, engine: sa.Engine) -> None:
    """The bench kind for the client without its driver fast path: same queue, same SQL,
    but every call through Connection.execute (the A/B of the driver-connection path)."""
    from queuectl.bench.drivers import driver_for
    from queuectl.names import QueueNames

    driver, names = driver_for("reliable_sqla"), QueueNames("bsqla")
    driver.install(engine, names)
    session = driver.open(db_url, names)
    try:
        with statements_executed(session.queue.engine) as executed:
            session.enqueue([b"a"])
            session.enqueue([b"b", b"c"])
            payloads, token = session.take(5)
            session.finish(token)
    finally:
        session.close()
    assert sorted(payloads) == [b"a", b"b", b"c"]
    calls = ['"bsqla_enqueue"(', '"bsqla_enqueue_many"(', '"bsqla_dequeue"(', '"bsqla_ack"(']
    assert len(executed) == 4 and all(call in statement for call, statement in zip(calls, executed)), executed
    with engine.connect() as conn:
        assert driver.ready(conn, names) == 0
    driver.uninstall(engine, names)


def _dequeue_columns(engine: sa.Engine, names: Any) -> list[str]:
    """The column names a design's dequeue returns (from a call on an empty queue)."""
    with engine.connect() as conn:
        result = conn.exec_driver_sql(f"SELECT * FROM {names.template_values()['fn_dequeue']}(1, 30, 'w')")
        return list(result.keys())


def test_a_target_value_never_reads_as_its_goal_from_the_other_side() -> None:
    """0.949 against a goal of 0.95 printed as "95%" read as met; it gets one more digit."""
    from queuectl.bench.report import _target_value

    assert _target_value(0.949, 0.95) == "94.9%" and _target_value(0.968, 0.95) == "97%"
    assert _target_value(0.95, 0.95) == "95%"
    assert _target_value(1.047, 1.05) == "1.047x" and _target_value(1.033, 1.05) == "1.03x"
    assert _target_value(24.54, 10.0) == "24.54x" and _target_value(3, 0) == "3" and _target_value(None, 2.0) == "-"


def test_recorded_command_line_masks_a_url_password() -> None:
    from queuectl.cli.bench import _masked

    shown = _masked(["bench", "--url", "postgresql://app:s3cr3t@db/x", "--url=postgresql://app:s3cr3t@db/y"])
    assert "s3cr3t" not in " ".join(shown) and shown[2] == "postgresql://app:***@db/x"


def _run_json(db_url: str, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "bench.json"
    proc = run_cli("bench", *args, "--json", str(out), url=db_url, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    result = json.loads(out.read_text())
    jsonschema.validate(result, _schema())
    return result


@pytest.mark.slow
def test_tiny_ghosts_run_measures_every_kind_size_and_mode(db_url: str, tmp_path: Path) -> None:
    result = _run_json(db_url, tmp_path, "--scenario", "ghosts", "--rows", "200,400", "--repeat", "1")
    sc = result["scenario"]
    assert sc["unavailable"] == []
    cells = {(r["params"]["kind"], r["params"]["rows"], r["params"]["snapshot"]): r for r in sc["rows"]}
    assert set(cells) == {(k, n, s) for k in ("fifo", "watermark") for n in (200, 400) for s in (False, True)}
    for (kind, rows, snapshot), row in cells.items():
        seconds = row["metrics"]["seconds"]["median"]
        assert seconds > 0 and abs(row["rate"]["median"] - rows / seconds) < 1e-6 * rows / seconds
        assert row["ceiling"]["rate"]["median"] > 0
        assert row["metrics"]["buffers_per_dequeue"]["median"] is not None
    # the ratios are the same-repeat quotients of the drain times
    wm_held, wm_none = cells[("watermark", 400, True)], cells[("watermark", 400, False)]
    assert wm_held["metrics"]["snapshot_over_none"]["median"] == pytest.approx(
        wm_held["metrics"]["seconds"]["median"] / wm_none["metrics"]["seconds"]["median"])
    naive_held = cells[("fifo", 400, True)]
    assert naive_held["metrics"]["naive_over_watermark"]["median"] == pytest.approx(
        naive_held["metrics"]["seconds"]["median"] / wm_held["metrics"]["seconds"]["median"])
    assert [t["name"].split(":")[0] for t in sc["targets"]] == [
        "watermark at 200 rows", "watermark at 400 rows", "at 400 rows under the snapshot"]


@pytest.mark.slow
def test_tiny_ring_run_balances_every_message_and_reports_its_soak_sizes(db_url: str, tmp_path: Path) -> None:
    result = _run_json(
        db_url, tmp_path, "--scenario", "ring", "--batches", "1,10", "--producers", "1", "--consumers", "1",
        "--seconds", "1", "--repeat", "1", "--backlog", "20", "--soak", "5",
    )
    sc = result["scenario"]
    assert sc["unavailable"] == []
    rows = {(r["params"]["kind"], r["params"]["batch"]): r for r in sc["rows"]}
    assert set(rows) == {(k, b) for k in ("lean", "fifo", "ring") for b in (1, 10)}
    for row in rows.values():
        assert row["rate"]["median"] > 0 and row["metrics"]["messages_sent"]["median"] > 0
        # nothing lost, nothing orphaned: a message whose push commits at a closing consumer's
        # pop claim after its last pop is re-pushed by that consumer's release (ring_0002),
        # so none is left behind for ring_repair
        assert row["metrics"]["lost"]["values"] == [0]
        assert row["metrics"]["orphaned"]["values"] == row["metrics"]["repaired"]["values"] == [0]
        # the per-phase profile from pg_stat_statements: both sides ran statements in the server
        m = row["metrics"]
        assert m["server_us_per_push"]["median"] > 0 and m["server_us_per_pop"]["median"] > 0
        assert m["buffers_per_message"]["median"] > 0 and m["fraction_worker_time_in_server"]["median"] > 0
    assert rows[("ring", 10)]["metrics"]["ring_vs_one_table"]["median"] == pytest.approx(
        rows[("ring", 10)]["rate"]["median"] / rows[("fifo", 10)]["rate"]["median"])
    assert rows[("ring", 10)]["metrics"]["ring_vs_claim_delete"]["median"] == pytest.approx(
        rows[("ring", 10)]["rate"]["median"] / rows[("lean", 10)]["rate"]["median"])
    ratios = {t["name"]: t["value"] for t in sc["targets"] if t["name"].endswith("both at batch 10")}
    assert list(ratios.values()) == [rows[("ring", 10)]["metrics"][k]["median"]
                                     for k in ("ring_vs_claim_delete", "ring_vs_one_table")]
    assert set(sc["soak"]) == {"fifo", "ring"}  # the soak compares the ring with the fifo kind only
    ring, fifo = sc["soak"]["ring"], sc["soak"]["fifo"]
    for soak in (ring, fifo):
        assert soak["ledger"]["lost"] == soak["ledger"]["orphaned"] == soak["ledger"]["repaired"] == 0
        assert soak["ledger"]["sent"] == soak["ledger"]["taken"] > 0
    # the ring went round more than once: its sizes are judged from the first lap on
    size = ring["ring_size"]
    steady = [s for s in ring["samples"] if s["laps"] >= 1]
    assert ring["ledger"]["sent"] > size and len(steady) >= 2
    # the verdict is what the samples say (whether the heap stays byte-for-byte constant over a
    # few seconds depends on page pruning timing: that is the benchmark's measurement, not a test)
    assert ring["steady_growth_bytes"] == max(s["total_bytes"] for s in steady) - steady[0]["total_bytes"]
    assert ring["constant"] is all(
        s["total_bytes"] == steady[0]["total_bytes"] and s["indexes"] == steady[0]["indexes"] for s in steady)
    # the ring's design, checked in the server's own counters: its slots were inserted once at
    # install and are only ever updated (never a row per message, never a delete)
    last = ring["samples"][-1]
    assert last["n_tup_ins"] <= size and last["n_tup_del"] == 0 and ring["updates"] >= ring["ledger"]["sent"]
    assert ring["hot_ratio"] == pytest.approx(ring["hot_updates"] / ring["updates"])
    assert 0 < ring["hot_ratio"] <= 1 and 0 < ring["steady_hot_ratio"] <= 1
    # the one-table queue inserts and deletes a row per message (no updates), and grew from empty
    fifo_last = fifo["samples"][-1]
    assert fifo_last["n_tup_ins"] >= fifo["ledger"]["sent"] and fifo_last["n_tup_del"] > 0
    assert fifo["updates"] == 0 and fifo["hot_ratio"] is None and fifo["end_total_bytes"] > fifo["start_total_bytes"]

@pytest.mark.slow
def test_tiny_peers_run_shows_the_sql_ceiling_of_queuectls_own_full_cycle(db_url: str, tmp_path: Path) -> None:
    result = _run_json(
        db_url, tmp_path, "--scenario", "peers", "--batch", "10", "--producers", "1", "--consumers", "1",
        "--seconds", "1", "--repeat", "1",
    )
    sc = result["scenario"]
    ours, aio, peers = sc["rows"][0], sc["rows"][1], sc["rows"][2:]
    assert ours["subject"] == "queuectl reliable" and aio["subject"] == "queuectl reliable asyncio"
    # the same statements under pgbench, at the same batch and client count, in the same run
    rate, ceiling = ours["rate"]["median"], ours["ceiling"]["rate"]["median"]
    assert rate > 0 and ceiling > 0
    assert ours["fraction_of_ceiling"]["median"] == pytest.approx(rate / ceiling)
    # the asyncio client, measured in the same repeat, beside the same ceiling; its quotient over the blocking one
    aio_rate = aio["rate"]["median"]
    assert aio_rate > 0 and aio["params"] == ours["params"] and aio["ceiling"] == ours["ceiling"]
    assert aio["metrics"]["vs_sync"]["median"] == pytest.approx(aio_rate / rate)
    assert aio["fraction_of_ceiling"]["median"] == pytest.approx(aio_rate / ceiling)
    assert 0 < aio["latency_ms"]["p50"]["median"] <= aio["latency_ms"]["p99"]["median"]
    pgbench = result["commands"]["sql full-cycle"]
    assert pgbench[pgbench.index("-c") + 1] == "2"  # producers + consumers clients
    assert not any(u["subject"] == "sql reliable" for u in sc["unavailable"])
    reach = sc["targets"][1]
    assert reach["threshold"] == sc["targets"][0]["threshold"] == 5.0
    measured = [p for p in peers if p["rate"]["median"]]
    if not measured:  # the peers are optional (pip install 'queuectl[bench-peers]'): said so, not faked
        assert {u["subject"] for u in sc["unavailable"]} == {"pgqueuer", "procrastinate"}
        assert reach["value"] is None and reach["met"] is None and "verdict" not in reach
        return
    for peer in measured:
        assert peer["ceiling"] is None
        assert peer["metrics"]["sql_ceiling_x"]["median"] == pytest.approx(ceiling / peer["rate"]["median"])
        assert peer["metrics"]["asyncio_x"]["median"] == pytest.approx(aio_rate / peer["rate"]["median"])
    fastest = max(p["rate"]["median"] for p in measured)
    assert reach["value"] == pytest.approx(ceiling / fastest)
    assert reach["met"] is (reach["value"] >= 5.0)
    assert f"{5 * fastest:,.0f} msg/s" in reach["verdict"] and f"{ceiling:,.0f} msg/s" in reach["verdict"]
    assert ("unreachable" in reach["verdict"]) is (not reach["met"])


@pytest.mark.slow
def test_tiny_dequeue_plan_probe_measures_both_revisions_side_by_side(db_url: str, engine: sa.Engine) -> None:
    """`python bench/lab/dequeue_plan.py`: both queues drained and their dequeue calls
    timed, the queues removed afterwards; a reliable_0004 queue's dequeue takes longer once
    its table has statistics (the flaw reliable_0005 removes)."""
    run = lab_module("dequeue_plan").run
    from queuectl.registry import list_queues

    result = run(db_url, [20_000], repeats=1, seconds=0.2)
    cell = result["sizes"]["20000"]
    assert result["before"] == "reliable_0004" and result["head"] >= "reliable_0005"
    assert cell["before_median"] > 0 and cell["head_median"] > 0
    assert cell["ratio"] == [cell["head"][0] / cell["before"][0]]
    assert cell["call_ms_before_median"] > cell["call_ms_head_median"] > 0  # the whole-table join costs time
    with engine.connect() as conn:
        assert [q.name for q in list_queues(conn) if q.name.startswith("plan_")] == []


@pytest.mark.slow
def test_tiny_archive_load_probe_keeps_a_steady_state_and_splits_the_cpu(db_url: str) -> None:
    """`python bench/lab/archive_load.py`: windows alternate archive off / on while producers
    are held to the consumers (enqueued/s within the backlog's worth of acked/s), and each
    window says the CPU the foreground spent per message and, when it archived, the
    archiver per row, read from /proc for the sessions the probe named."""
    import argparse

    probe = lab_module("archive_load")
    args = argparse.Namespace(pairs=1, window=3.0, settle=1.0, warmup=1.0, producers=1, consumers=1, min_age=0.0,
                              delay=0.0, batch=1000, backlog=200)
    result = probe.repeat(db_url, args)
    windows = result["windows"]
    assert [w["archive"] for w in windows] == ["off", "on"]
    for w in windows:
        assert w["acked_per_s"] > 0
        assert abs(w["enqueued_per_s"] - w["acked_per_s"]) * args.window <= args.backlog + 40  # held to the consumers
        assert w["cpu_s"]["qa_fg"] > 0 and w["cpu_s"]["fg_processes"] > 0
        assert w["fg_cpu_per_1k_acked"] > w["fg_server_cpu_per_1k_acked"] > 0
    assert windows[0]["archived_per_s"] == 0 and windows[0]["cpu_s"]["archiver_process"] >= 0
    on = windows[1]
    assert on["archived_per_s"] > 0 and on["archiver_cpu_per_1k_rows"] > 0, on
    assert result["bound"] == pytest.approx(1 / (1 + result["archiver_over_foreground_cpu"]))


@pytest.mark.slow
def test_tiny_split_run_measures_both_designs_at_every_size(db_url: str, tmp_path: Path) -> None:
    """`queuectl bench --scenario split` on a fresh database (its one-table design is installed
    before any reliable queue: it once failed there for want of the schema), every size
    measured for both designs with buffers and WAL per message, JSON per the schema."""
    out = tmp_path / "split.json"
    proc = run_cli("bench", "--scenario", "split", "--batch", "10", "--consumers", "1", "--seconds", "0.5",
                   "--repeat", "1", "--json", str(out), url=db_url, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    result = json.loads(out.read_text())
    jsonschema.validate(result, _schema())
    sc = result["scenario"]
    assert sc["unavailable"] == []
    cells = {(row["subject"], row["params"]["payload_bytes"]): row for row in sc["rows"]}
    assert set(cells) == {(design, size) for design in ("one table", "meta/data split")
                          for size in (300, 1024, 4096, 16384)}
    for row in cells.values():
        assert row["rate"]["median"] > 0
        assert row["metrics"]["buffers_per_dequeue"]["median"] > 0
        assert row["metrics"]["wal_bytes_per_message"]["median"] > 0
        # the SQL ceiling: the same fill drained by the design's own statements from pgbench
        assert row["ceiling"]["rate"]["median"] > 0 and row["fraction_of_ceiling"]["median"] > 0
        assert row["params"]["prefilled"] == 5000
    for size in (300, 1024, 4096, 16384):
        assert cells[("meta/data split", size)]["metrics"]["sql_split_vs_one_table"]["median"] > 0
    assert "sql split drain" in result["commands"]
    assert len(sc["targets"]) == 2


@pytest.mark.slow
def test_split_sizes_are_chosen_with_sizes(db_url: str, tmp_path: Path) -> None:
    """--sizes picks the payload sizes (sorted, once each); the split reports every size at
    which it pays, not only a size from which it pays upward (TOAST evens the designs out
    above ~2 KB)."""
    result = _run_json(db_url, tmp_path, "--scenario", "split", "--sizes", "1900,300,1900", "--batch", "10",
                       "--consumers", "1", "--seconds", "0.5", "--repeat", "1")
    jsonschema.validate(result, _schema())
    sc = result["scenario"]
    assert sorted({row["params"]["payload_bytes"] for row in sc["rows"]}) == [300, 1900] and len(sc["rows"]) == 4
    assert "300 B: at least matches" in sc["targets"][0]["name"]
    split_rows = [row for row in sc["rows"] if row["subject"] == "meta/data split"]
    paid = [row["params"]["payload_bytes"] for row in split_rows
            if row["metrics"]["split_vs_one_table"]["median"] >= 1.05]
    assert sc["pays_at_bytes"] == paid
    assert any(note.startswith("the split pays") for note in sc["notes"])


def test_split_pays_upward_only_to_the_largest_size_measured() -> None:
    """"From a size upward" is judged on the measured sizes only, and says so: a run that
    stops at 5 KB must not read as if the split paid at 16 KB too."""
    from queuectl.bench.split import split_targets

    pays_from, pays_at, (matches, beats) = split_targets({5120: 1.13, 2048: 1.0, 4096: 1.06, 3072: 1.03}, 10)
    assert (pays_from, pays_at) == (4096, [4096, 5120])
    assert "2048 B: at least matches" in matches["name"] and matches["met"] is True
    assert beats["name"].endswith("from payload size 4096 B upward (to 5120 B, the largest measured)")
    assert beats["met"] is True and beats["value"] == 1.06
    pays_from, pays_at, (_, beats) = split_targets({300: 0.97, 1536: 1.11, 1900: 1.07, 2200: 0.96, 4096: None}, 10)
    assert (pays_from, pays_at) == (None, [1536, 1900])
    assert beats["name"].endswith("- (at no measured size)") and beats["met"] is False and beats["value"] == 1.11


@pytest.mark.slow
def test_bad_sizes_are_a_one_line_usage_error(db_url: str) -> None:
    for value, words in (("0", "--sizes must be payload sizes from 8 to 65536"), ("3,x", "--sizes takes whole numbers")):
        proc = run_cli("bench", "--scenario", "split", "--sizes", value, "--seconds", "1", url=db_url)
        assert proc.returncode == 2
        lines = proc.stderr.decode().strip().splitlines()
        assert len(lines) == 1 and words in lines[0], lines


@pytest.mark.slow
def test_an_option_the_scenario_does_not_read_is_a_one_line_usage_error(db_url: str) -> None:
    """Each scenario names the options it reads; one it ignores is refused before anything
    runs, with the scenarios that do read it (a --sizes given to the ring would otherwise
    run the ring as if it had not been said)."""
    cases = (
        (("--scenario", "ring", "--sizes", "300"), "--sizes is not used by scenario 'ring' (it is read by: cost, split)"),
        (("--scenario", "split", "--payload-bytes", "4096"),
         "--payload-bytes is not used by scenario 'split' (it is read by: archive, consumers, cost, fanout, kinds, peers, ring, sustained; the split's payload sizes are --sizes)"),
        (("--scenario", "ghosts", "--seconds", "3"), "--seconds is not used by scenario 'ghosts'"),
        (("--scenario", "peers", "--kind", "fifo"), "--kind is not used by scenario 'peers' (it is read by: consumers, cost, kinds, sustained)"),
        (("--items", "500"), "--items is not used by scenario 'kinds' (it is read by: cost, fanout)"),
        (("--scenario", "cost", "--kind", "ring"), "the ring holds at most its size"),
        (("--batches", "1,10"), "--batches is not used by scenario 'kinds' (it is read by: ring)"),
        (("--payload-content", "json"), "--payload-content is not used by scenario 'kinds' (it is read by: split)"),
        (("--minutes", "1"), "--minutes is not used by scenario 'kinds' (it is read by: sustained)"),
        (("--scenario", "sustained", "--hold", "sometimes"),
         "--hold must be one of none, snapshot, idle-in-transaction, both, all"),
    )
    for args, words in cases:
        proc = run_cli("bench", *args, url=db_url)
        assert proc.returncode == 2, (args, proc.stderr.decode()[-500:])
        lines = proc.stderr.decode().strip().splitlines()
        assert len(lines) == 1 and words in lines[0], (args, lines)


def test_every_bench_option_is_read_by_some_scenario() -> None:
    """A new BenchOptions field must be named by the scenarios that read it (or be common to
    all), or the check above would refuse it everywhere."""
    from dataclasses import fields

    from queuectl.bench.core import COMMON_OPTIONS, SCENARIO_OPTIONS, BenchOptions

    BenchOptions().validate()  # registers the built-in scenarios
    assert set(SCENARIO_OPTIONS) == {"kinds", "peers", "split", "ghosts", "ring", "sustained", "consumers", "archive",
                                     "cost", "fanout"}
    named = set(COMMON_OPTIONS).union(*SCENARIO_OPTIONS.values())
    assert {f.name for f in fields(BenchOptions)} - {"given"} <= named
    assert BenchOptions(scenario="ring", sizes=[300]).validate().sizes == [300]  # given by a caller, not the command line


@pytest.mark.slow
def test_tiny_sustained_run_holds_the_horizon_accounts_for_every_message_and_plots(db_url: str, tmp_path: Path) -> None:
    """`--scenario sustained`: a clean run then a snapshot run per kind, interleaved, each
    with its full series; the held runs really held the horizon back while the queue's
    traffic went past it; every message enqueued was completed or is still in the queue;
    a PNG per kind beside the JSON."""
    from queuectl.bench.sustained import SERIES_FIELDS

    result = _run_json(db_url, tmp_path, "--scenario", "sustained", "--kinds", "reliable,ring", "--minutes", "0.03",
                       "--interval", "1", "--hold", "both", "--rate", "200", "--producers", "1", "--consumers", "1",
                       "--bystander-rows", "20000")
    sc, su = result["scenario"], result["scenario"]["sustained"]
    runs = su["runs"]
    assert [(r["kind"], r["hold"]) for r in runs] == [
        ("reliable", "none"), ("reliable", "snapshot"), ("ring", "none"), ("ring", "snapshot")]
    assert su["offered_rate"] == 200 and su["rate_source"] == "given" and su["calibration"] == {}
    assert su["bystander_rows"] == 20_000
    for r in runs:
        assert [s["t"] for s in r["series"]] == [1.0, 2.0] and r["seconds"] == 2.0  # whole intervals
        for s in r["series"]:
            assert set(s) == set(SERIES_FIELDS) and s["backlog"] is not None and s["total_bytes"] > 0
            assert s["offered_per_s"] > 0 and s["bystander_ms"] > 0
        summary, ledger = r["summary"], r["ledger"]
        assert summary["completed_per_s"] > 0 and 0 < summary["latency_p50_ms"] <= summary["latency_p99_ms"]
        # every message enqueued (warm-up included) was completed or is still in the queue
        assert ledger["enqueued"] > 0 and ledger["enqueued"] == ledger["completed"] + ledger["left"]
        assert ledger["lost"] == 0 and summary["refused"] == 0
        if r["hold"] == "none":
            assert r["holder"] is None and summary["held_over_clean"] is None
            continue
        clean = next(c for c in runs if c["kind"] == r["kind"] and c["hold"] == "none")
        assert summary["held_over_clean"] == pytest.approx(
            summary["completed_per_s"] / clean["summary"]["completed_per_s"])
        # the holder kept one horizon for the whole window while the traffic's transactions went past it,
        # so the dead row versions the run left could not be removed
        holder = r["holder"]
        assert holder["mode"] == "snapshot" and holder["horizon_start"] == holder["horizon_end"]
        assert int(holder["horizon_start"]) <= int(holder["next_xid_start"]) < int(holder["next_xid_end"])
        assert holder["age_end"] - holder["age_start"] >= int(holder["next_xid_end"]) - int(holder["next_xid_start"]) > 0
        assert summary["dead_rows_end"] > 0
    assert [row["metrics"]["held_over_clean"]["median"] for row in sc["rows"]] == [
        r["summary"]["held_over_clean"] for r in runs]
    assert sc["targets"][-1]["name"].startswith("messages lost") and sc["targets"][-1]["met"] is True
    for kind in ("reliable", "ring"):
        png = tmp_path / f"bench-{kind}.png"
        assert su["plots"][kind] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_tiny_sustained_run_drives_every_one_table_kind_and_balances_its_messages(
        db_url: str, engine: sa.Engine, tmp_path: Path) -> None:
    """The one-table kinds that had no bench driver (heap, stack, pending, a strict fifo) run
    the sustained scenario as the others do, the compact job beside them (or, with
    --no-upkeep, nothing), each message enqueued completed or still waiting, none lost; each
    driver installs its kind (the strict fifo with its setting)."""
    from queuectl.bench.drivers import driver_for
    from queuectl.names import QueueNames
    from queuectl.registry import get_queue

    kinds = ("heap", "stack", "pending", "fifo_strict")
    result = _run_json(db_url, tmp_path, "--scenario", "sustained", "--kinds", ",".join(kinds), "--minutes", "0.02",
                       "--interval", "1", "--hold", "both", "--rate", "200", "--producers", "1", "--consumers", "1",
                       "--bystander-rows", "20000")
    runs = result["scenario"]["sustained"]["runs"]
    assert result["scenario"]["sustained"]["upkeep"] is True
    assert [(r["kind"], r["hold"]) for r in runs] == [(k, h) for k in kinds for h in ("none", "snapshot")]
    for r in runs:
        ledger = r["ledger"]
        assert r["summary"]["completed_per_s"] > 0 and r["series"][-1]["total_bytes"] > 0
        assert ledger["enqueued"] > 0 and ledger["enqueued"] == ledger["completed"] + ledger["left"]
        assert ledger["lost"] == 0
        assert r["upkeep"]["job"] == "compact" and r["upkeep"]["errors"] == 0  # beside the load, as scheduled
    # --no-upkeep: the same load with no job beside it (the "before" of compaction), said in the notes
    bare = _run_json(db_url, tmp_path, "--scenario", "sustained", "--kinds", "heap", "--minutes", "0.02",
                     "--interval", "1", "--hold", "none", "--rate", "200", "--producers", "1", "--consumers", "1",
                     "--bystander-rows", "20000", "--no-upkeep")
    assert bare["scenario"]["sustained"]["upkeep"] is False
    assert [r["upkeep"] for r in bare["scenario"]["sustained"]["runs"]] == [None]
    assert any(n.startswith("upkeep: none (--no-upkeep)") for n in bare["scenario"]["notes"])
    installed = {}
    for name in kinds:
        driver, names = driver_for(name), QueueNames(f"bdrv_{name}")
        driver.install(engine, names)
        try:
            with engine.connect() as conn:
                installed[name] = get_queue(conn, names.queue)
        finally:
            driver.uninstall(engine, names)
    assert {k: i.kind for k, i in installed.items()} == {
        "heap": "heap", "stack": "stack", "pending": "pending", "fifo_strict": "fifo"}
    assert installed["fifo_strict"].settings.as_dict()["strict"] is True


def test_tiny_sustained_run_measures_its_peers_beside_queuectl_or_says_how_to_install_them(
        db_url: str, tmp_path: Path) -> None:
    """--kinds reliable,pgq,pgqueuer: each peer runs the same paced load, hold and sampling
    as queuectl's kind, in the same database (so the holder pins the peer too), through its
    own API; PgQ with one consumer process. Every message a peer took is in its ledger. A
    peer that is not installed is reported as not measured, with the command that installs
    it, and the run goes on. Peers are reported, never held to queuectl's targets."""
    from queuectl.bench.core import SUSTAINED_PEERS
    from queuectl.bench.sustained_peers import PEERS

    assert tuple(PEERS) == SUSTAINED_PEERS
    result = _run_json(db_url, tmp_path, "--scenario", "sustained", "--kinds", "reliable,pgq,pgqueuer",
                       "--minutes", "0.03", "--interval", "1", "--hold", "both", "--rate", "200",
                       "--producers", "1", "--consumers", "2", "--bystander-rows", "20000")
    sc, su = result["scenario"], result["scenario"]["sustained"]
    missing = {u["subject"].split()[0]: u["reason"] for u in sc["unavailable"] if u["subject"] != "plots"}
    measured = {r["kind"] for r in su["runs"]}
    assert measured == {"reliable"} | ({"pgq", "pgqueuer"} - {m.lower() for m in missing})
    for peer, reason in missing.items():  # said so, with the way to install it, not faked
        assert ("apt-get install postgresql-15-pgq3" in reason) if peer == "PgQ" else ("bench-peers" in reason)
    for r in su["runs"]:
        assert r["ledger"]["enqueued"] > 0 and r["ledger"]["lost"] == 0, (r["kind"], r["hold"], r["ledger"])
        assert r["summary"]["completed_per_s"] > 0
        if r["kind"] == "reliable":
            assert "peer" not in r
            continue
        assert r["peer"]["consumers"] == (1 if r["kind"] == "pgq" else 2) and r["upkeep"] is None
        assert all(s["total_bytes"] > 0 and s["backlog"] is not None for s in r["series"])
        if r["hold"] == "snapshot":  # the holder pinned the peer's database too
            assert r["holder"]["horizon_start"] == r["holder"]["horizon_end"]
            assert int(r["holder"]["next_xid_end"]) > int(r["holder"]["next_xid_start"])
    subjects = [row["subject"] for row in sc["rows"]]
    assert subjects[:2] == ["queuectl reliable"] * 2
    assert all(s.startswith(("PgQ ", "PgQueuer ")) for s in subjects[2:])
    assert not any(t["name"].startswith(("pgq", "pgqueuer")) for t in sc["targets"])


def test_the_sustained_peers_are_kinds_of_the_sustained_scenario_only() -> None:
    from queuectl.bench.core import BenchOptions
    from queuectl.errors import UsageError

    assert BenchOptions(scenario="sustained", kinds=["reliable", "pgq"]).validate().kinds == ["reliable", "pgq"]
    assert BenchOptions(scenario="sustained", kinds=["pgqueuer"], rate=100).validate().rate == 100
    with pytest.raises(UsageError, match="peers alone need --rate"):
        BenchOptions(scenario="sustained", kinds=["pgq", "pgqueuer"]).validate()
    with pytest.raises(UsageError, match="no bench driver for kind 'pgq'.*with --scenario sustained, the peers pgq"):
        BenchOptions(scenario="kinds", kinds=["pgq"]).validate()


def test_an_idle_bench_consumer_waits_as_the_worker_does(db_url: str, engine: sa.Engine) -> None:
    """A full cycle's consumer whose take came back empty (IdleWait, with the Worker's Listener
    and PollBackoff): registers and looks once more, then sleeps on the queue's channel until
    an enqueue announces itself; a take that finds work gives the registration up; one that
    answered a notification and found nothing was outrun and leaves the channel. Kinds that
    do not notify have no listener: they wait the back-off alone."""
    import threading

    from queuectl.bench.drivers import driver_for
    from queuectl.bench.workers import idle_wait_for
    from queuectl.names import QueueNames
    from queuectl.worker import PollBackoff
    from test_notify import waiting_sessions

    names = QueueNames("bench_reliable")
    driver = driver_for("reliable")
    driver.install(engine, names)
    consumer, producer = driver.open(db_url, names), driver.open(db_url, names)
    idle, stop = idle_wait_for(consumer), threading.Event()
    try:
        assert idle.listener is not None and idle.listener.gated
        idle.rule.backoff = PollBackoff(30, 30)  # so what ends a sleep within seconds is the channel
        assert consumer.take(10)[0] == []
        idle.found_nothing(stop)  # registers, and returns at once for one more look
        assert idle.rule.armed and waiting_sessions(engine) == 1
        assert consumer.take(10)[0] == []
        threading.Timer(0.3, producer.enqueue, ([b"announced"],)).start()
        started = time.monotonic()
        idle.found_nothing(stop)
        assert 0.2 < time.monotonic() - started < 10 and idle.rule.notified
        payloads, token = consumer.take(10)
        assert payloads == [b"announced"]
        consumer.finish(token)
        idle.found_work()
        assert waiting_sessions(engine) == 0 and not idle.rule.registered
        idle.found_nothing(stop)  # the drain's empty take: registers again
        assert waiting_sessions(engine) == 1
        def notify() -> None:  # a notification with nothing behind it: another consumer was faster
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT pg_notify(:channel, '')"), {"channel": names.channel})
                conn.commit()

        threading.Timer(0.3, notify).start()
        idle.found_nothing(stop)  # woken by a notification with nothing behind it...
        assert idle.rule.notified
        idle.found_nothing(stop)  # ...so this empty take was outrun: registration given up
        assert waiting_sessions(engine) == 0
        assert idle.counts == {"work_takes": 1, "empty_takes": 5, "notified_takes": 2, "outrun": 1, "registrations": 2,
                               "gathers": 0, "seat_tries": 1}
    finally:
        idle.close()
        consumer.close()
        producer.close()
    fifo = driver_for("fifo")
    fifo.install(engine, QueueNames("bench_fifo"))
    session = fifo.open(db_url, QueueNames("bench_fifo"))
    try:
        assert idle_wait_for(session).listener is None
    finally:
        session.close()


@pytest.mark.slow
def test_tiny_consumers_curve_measures_each_count_against_four_and_plots(db_url: str, tmp_path: Path) -> None:
    """`--scenario consumers`: a full cycle and a dequeue-only phase at each count, each
    read against 4 consumers in the same repeat, the consumers' takes and waits per batch,
    the workers' CPU, the archive job beside each full cycle unless --no-upkeep, and a PNG
    of the curve beside the JSON."""
    result = _run_json(db_url, tmp_path, "--scenario", "consumers", "--consumer-counts", "4,2", "--seconds", "0.5",
                       "--repeat", "1", "--batch", "5", "--producers", "1")
    sc = result["scenario"]
    assert result["options"]["consumer_counts"] == [2, 4]
    rows = {(r["phase"], r["params"]["consumers"]): r for r in sc["rows"]}
    assert set(rows) == {(phase, n) for phase in ("full-cycle", "dequeue-only") for n in (2, 4)}
    for (phase, n), row in rows.items():
        assert row["rate"]["median"] > 0 and row["params"]["batch"] == 5
        assert row["metrics"]["vs_4"]["median"] == pytest.approx(row["rate"]["median"] / rows[(phase, 4)]["rate"]["median"])
        assert row["metrics"]["load_1min"]["median"] >= 0
        if phase == "full-cycle":
            assert row["params"]["producers"] == 1 and 0 < row["latency_ms"]["p50"]["median"] <= row["latency_ms"]["p99"]["median"]
            assert row["metrics"]["producer_cpu"]["median"] > 0 and row["metrics"]["consumer_cpu"]["median"] > 0
            assert row["metrics"]["empty_takes"]["median"] >= row["metrics"]["outrun"]["median"] >= 0
            # the archive job ran beside each full cycle (the default, as the scheduler runs it)
            assert row["metrics"]["generations_emptied"]["median"] >= 0
        else:
            assert row["latency_ms"] is None and "empty_takes" not in row["metrics"]
            assert "generations_emptied" not in row["metrics"]
    assert any(n.startswith("upkeep: beside each full cycle") for n in sc["notes"])
    assert sc["targets"] == []  # the target reads 32 consumers against 4
    assert (tmp_path / "bench-reliable.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # --no-upkeep: no job beside the cycles, said in the notes
    bare = _run_json(db_url, tmp_path, "--scenario", "consumers", "--consumer-counts", "1", "--seconds", "0.5",
                     "--repeat", "1", "--batch", "5", "--producers", "1", "--no-upkeep")["scenario"]
    assert all("generations_emptied" not in r["metrics"] for r in bare["rows"])
    assert any(n.startswith("upkeep: none (--no-upkeep)") for n in bare["notes"])
    # the curve's counts are --consumer-counts; --consumers would be silently ignored, so it is refused
    proc = run_cli("bench", "--scenario", "consumers", "--consumers", "8", url=db_url)
    assert proc.returncode == 2
    assert proc.stderr.decode() == ("error: --consumers is not used by scenario 'consumers' "
                                    "(it is read by: cost, kinds, peers, ring, split, sustained)\n")


@pytest.mark.slow
def test_tiny_archive_curve_runs_each_count_with_the_job_and_without_and_plots(db_url: str, tmp_path: Path) -> None:
    """`--scenario archive`: at each count the full cycle from an emptied queue twice, with the
    archive job beside it and without, the rate with it read against the rate without in the
    same repeat; the job's generations and CPU on its runs only; the target at 4 consumers;
    a PNG of the curve beside the JSON."""
    result = _run_json(db_url, tmp_path, "--scenario", "archive", "--consumer-counts", "4,1", "--seconds", "1",
                       "--repeat", "1", "--batch", "5", "--producers", "1")
    sc = result["scenario"]
    assert result["options"]["consumer_counts"] == [1, 4]
    rows = {(r["params"]["consumers"], r["params"]["archive_job"]): r for r in sc["rows"]}
    assert set(rows) == {(n, job) for n in (1, 4) for job in (False, True)}
    for (n, job), row in rows.items():
        assert row["rate"]["median"] > 0 and row["params"]["batch"] == 5 and row["params"]["producers"] == 1
        assert row["phase"] == "full-cycle" and 0 < row["latency_ms"]["p50"]["median"] <= row["latency_ms"]["p99"]["median"]
        assert row["metrics"]["producer_cpu"]["median"] > 0 and row["metrics"]["consumer_cpu"]["median"] > 0
        if job:
            without = rows[(n, False)]["rate"]["median"]
            assert row["metrics"]["vs_without"]["median"] == pytest.approx(row["rate"]["median"] / without)
            # the job ran beside this cycle (its own CPU), without an error
            assert row["metrics"]["job_cpu"]["median"] > 0 and row["metrics"]["errors"]["median"] == 0
            assert row["metrics"]["generations_emptied"]["median"] >= 0
        else:
            assert "vs_without" not in row["metrics"] and "generations_emptied" not in row["metrics"]
    [target] = sc["targets"]
    assert target["threshold"] == 0.9 and target["value"] == rows[(4, True)]["metrics"]["vs_without"]["median"]
    assert target["met"] == (target["value"] >= 0.9)
    assert (tmp_path / "bench-reliable.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # without 4 among the counts there is no target (it reads 4 consumers)
    bare = _run_json(db_url, tmp_path, "--scenario", "archive", "--consumer-counts", "1", "--seconds", "0.5",
                     "--repeat", "1", "--batch", "5", "--producers", "1")["scenario"]
    assert bare["targets"] == [] and len(bare["rows"]) == 2


def _descendants(pid: int) -> set[int]:
    """The live processes below `pid` (children, their children, ...), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.mark.slow
def test_a_killed_bench_leaves_no_worker_behind(db_url: str) -> None:
    """A bench killed without its cleanup (SIGKILL; a CI job cancelled; `timeout`) leaves no
    worker running: each worker process ends once the process that started it is gone, instead
    of going on loading the server at full speed under whatever is measured next."""
    bench = subprocess.Popen([sys.executable, "-m", "queuectl.cli", "bench", "--url", db_url, "--no-pgbench",
                              "--seconds", "60", "--repeat", "1", "--batch", "5", "--producers", "2",
                              "--consumers", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, workers = time.monotonic() + 90, set()
        while len(workers) < 3 and time.monotonic() < deadline:  # the fork server and two producers at least
            time.sleep(0.2)
            workers = _descendants(bench.pid)
            assert bench.poll() is None, "the bench ended before its workers started"
        assert len(workers) >= 3, f"the bench's workers did not start: {workers}"
        os.kill(bench.pid, signal.SIGKILL)
        bench.wait(timeout=10)
        deadline = time.monotonic() + 15
        while (left := {p for p in workers if process_alive(p)}) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == set(), f"workers still running after their bench was killed: {left}"
    finally:
        if bench.poll() is None:
            bench.kill()
        for pid in _descendants(bench.pid) | workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.mark.slow
def test_tiny_cost_run_claims_a_fixed_count_from_each_backlog_and_accounts_for_it(
        db_url: str, engine: sa.Engine, tmp_path: Path) -> None:
    """`--scenario cost`: each backlog is filled to its size through the queue's own
    enqueue_many, and in every repeat one consumer claims and acks exactly --items messages
    of it, from size + items down to size; every message filled is claimed or still ready,
    nothing claimed is left unacked; the payload curve's full cycle writes at least each
    payload's size of WAL per message; the curves are PNGs beside the JSON, the console
    tables fit 80 columns, and no bench queue is left behind."""
    from rich.console import Console

    from queuectl.bench.report import cost_tables

    items = 300
    result = _run_json(db_url, tmp_path, "--scenario", "cost", "--rows", "3000,200", "--sizes", "300,16384",
                       "--items", str(items), "--repeat", "2", "--seconds", "1", "--producers", "1", "--consumers", "1")
    sc = result["scenario"]
    c = sc["cost"]
    assert c["backlogs"] == [200, 3000] and c["sizes"] == [300, 16384] and sc["unavailable"] == []
    for f, rows in zip(c["fills"], (200, 3000)):
        assert (f["rows"], f["payload_bytes"]) == (rows, 300)
        assert f["seconds"] > 0 and f["table_bytes"] > 0 and f["wal_bytes"] >= rows * 300
    for p, rows in zip(c["backlog"], (200, 3000)):
        assert p["rows"] == rows and p["ready_start"] == [rows + items] * 2 and p["ready_end"] == [rows] * 2
        for rate, us in zip(p["rate"]["values"], p["us_per_msg"]["values"]):
            assert rate > 0 and rate * us == pytest.approx(1e6)
        assert p["buffers_per_msg"]["median"] > 0 and p["wal_bytes_per_msg"]["median"] > 0
    assert all(c["backlog"][0][k]["values"] == [1.0, 1.0]
               for k in ("over_smallest", "server_over_smallest", "buffers_over_smallest"))
    assert [e["expected_ready"] for e in c["ledger"]] == [e["ready"] for e in c["ledger"]] == [200, 3000]
    assert all(e["processing"] == 0 and e["left"] == e["ready"] for e in c["ledger"])
    assert [t["met"] for t in sc["targets"]][-1] is True and "3,000 ready / at 200" in sc["targets"][0]["name"]
    for p, size in zip(c["payload"], (300, 16384)):
        cycle, drain = p["cycle"], p["claim_ack"]
        assert cycle["mb_per_s"]["median"] == pytest.approx(cycle["rate"]["median"] * size / 1e6)
        assert cycle["wal_per_msg"]["median"] >= size and drain["us_per_msg"]["median"] > 0
    for curve in ("backlog", "payload"):
        png = tmp_path / f"bench-{curve}.png"
        assert c["plots"][curve] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    console = Console(width=80, record=True)
    for title, table in cost_tables(sc):
        console.print(title)
        console.print(table)
    lines = console.export_text().splitlines()
    assert len(lines) == 2 * (2 + 2) and all(len(line) <= 80 for line in lines) and "…" not in "\n".join(lines)
    with engine.connect() as conn:
        left = conn.execute(sa.text("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'cost\\_%'")).scalar_one()
    assert left == 0


def test_an_idle_transaction_holds_its_xid_while_others_commit(db_url: str, engine: sa.Engine) -> None:
    """The sustained scenario's idle-in-transaction hold: the holder's xid stays the horizon
    while other sessions' transactions go by, and is let go when the hold ends."""
    from types import SimpleNamespace

    from queuectl.bench.sustained import holding, horizon

    run = SimpleNamespace(engine=engine)
    with holding(run, "idle-in-transaction") as holder:
        before = horizon(run, holder)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for _ in range(5):
                conn.exec_driver_sql("SELECT txid_current()")
        after = horizon(run, holder)
    assert before["horizon"] == after["horizon"] and after["age"] >= before["age"] + 5
    with holding(run, "none") as nothing:
        assert nothing is None
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT backend_xid FROM pg_stat_activity WHERE pid = :p"),
                            {"p": before["pid"]}).scalar_one_or_none() is None


def test_sustained_series_counts_each_interval_and_the_table_fits_80_columns() -> None:
    """The series from the workers' records: messages by the interval they were completed in
    (warm-up messages, without a send time, only in the ledger), offers and refusals by the
    interval of their call, the backlog's trend over the last half; the console table of
    the widest realistic figures fits 80 columns without cutting a cell."""
    import math
    from rich.console import Console

    from queuectl.bench.report import sustained_table
    from queuectl.bench.sustained import summarise

    t0 = 1000.0
    producer = {"role": "producer", "warmup_count": 20, "batch": 10, "due": [t0 + 0.1, t0 + 1.1, t0 + 2.5],
                "sent": [t0 + 0.1, t0 + 1.4, t0 + 2.5], "accepted": [10, 10, 4]}
    consumer = {"role": "consumer", "warmup_count": 12, "done": [t0 + 0.2] * 3 + [t0 + 1.5] * 10 + [t0 + 2.6] * 4,
                "latency": [math.nan] * 3 + [0.1] * 10 + [0.1] * 4}
    samples = [{"k": k, "backlog": b, "dead_rows": 10 * k, "total_bytes": 8192 * (k + 1), "autovacuum_runs": k // 2}
               for k, b in enumerate([0, 30, 60, 90])]
    r = summarise(kind="fifo", hold="snapshot", rate=10.0, interval=1.0, count=3, t_go=t0, reports=[producer, consumer],
                  samples=samples, bystander=[(t0 + 0.5, 2.0), (t0 + 2.2, 4.0), (t0 + 9.0, 99.0)], left=15, holder=None)
    assert [s["completed_per_s"] for s in r["series"]] == [0.0, 10.0, 4.0]
    assert [s["offered_per_s"] for s in r["series"]] == [10.0, 10.0, 10.0]
    assert [s["refused"] for s in r["series"]] == [0, 0, 6] and r["summary"]["refused"] == 6
    assert [round(s["producer_lag_ms"]) for s in r["series"]] == [0, 300, 0]
    assert [s["autovacuum_runs"] for s in r["series"]] == [0, 1, 0]
    assert [s["bystander_ms"] for s in r["series"]] == [2.0, None, 4.0]
    assert r["summary"]["backlog_slope_per_min"] == pytest.approx(30 * 60)
    assert r["ledger"] == {"enqueued": 44, "completed": 29, "left": 15, "lost": 0}
    r["kind"], r["hold"] = "watermark", "idle-in-transaction"
    r["summary"].update(held_over_clean=0.67, completed_per_s=1345.0, backlog_slope_per_min=-12345.0,
                        latency_p99_ms=2345.6, dead_rows_end=131957, total_bytes_end=123 * 1048576, refused=12345)
    console = Console(width=80, record=True)
    console.print(sustained_table({"sustained": {"offered_rate": 800.0, "runs": [r]}}))
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in "\n".join(lines)
    assert lines[-1].split() == ["watermark", "idle-in-tx", "1,345", "0.67x", "-12,345", "2,346", "131,957", "123.0",
                                 "12,345"]


def test_sustained_options_are_checked_before_anything_runs() -> None:
    from queuectl.bench.core import BenchOptions
    from queuectl.errors import UsageError

    options = BenchOptions(scenario="sustained").validate()
    assert (options.producers, options.consumers, options.batch, options.hold) == (2, 2, 10, "both")
    assert BenchOptions().validate().producers == 4  # the other scenarios keep theirs
    for bad, words in (({"minutes": 0}, "--minutes"), ({"interval": 0.1}, "--interval"), ({"rate": 0}, "--rate"),
                         ({"bystander_rows": 10_000}, "--bystander-rows")):
        with pytest.raises(UsageError, match=words):
            BenchOptions(scenario="sustained", **bad).validate()


def test_the_consumers_curve_measures_twenty_second_phases_unless_told() -> None:
    """The consumers curve's full cycles need about 20 s to reach a steady state; the other
    scenarios keep 10 s, and --seconds wins over both."""
    from queuectl.bench.core import BenchOptions

    assert BenchOptions(scenario="consumers").validate().seconds == 20.0
    assert BenchOptions().validate().seconds == 10.0
    assert BenchOptions(scenario="consumers", seconds=5.0).validate().seconds == 5.0


def test_json_payloads_are_compressed_inline_where_random_ones_go_out_of_line(db_url: str, engine: sa.Engine) -> None:
    """--payload-content json: the split's fill writes payloads that PostgreSQL compresses
    (pglz) and keeps in the one-table row at 4 KB; random 4 KB payloads do not compress and
    are stored out of line (TOAST). That difference is what the option is there to measure."""
    from types import SimpleNamespace

    from queuectl.bench.core import BenchOptions
    from queuectl.bench.drivers import driver_for
    from queuectl.bench.split import _fill
    from queuectl.bench.workers import payload_pool
    from queuectl.names import QueueNames

    (a, b), (c,) = payload_pool(4096, 2, seed=1, content="json"), payload_pool(4096, 1, seed=1, content="json")
    assert len(a) == len(b) == 4096 and a != b and a == c  # sized, varied, reproducible
    assert a.startswith(b'[{"order_id":')
    with pytest.raises(ValueError):
        payload_pool(10, 1, seed=1, content="xml")
    driver, names = driver_for("onetable"), QueueNames("bcontent_one")
    stored: dict[str, set] = {}
    for content in ("json", "random"):
        driver.install(engine, names)
        try:
            run = SimpleNamespace(url=db_url, options=BenchOptions(scenario="split", payload_content=content))
            _fill(run, "onetable", names, 20, 4096)
            with engine.connect() as conn:
                table = names.qualified("meta")
                stored[content] = set(conn.execute(sa.text(
                    f"SELECT pg_column_compression(payload), pg_column_size(payload) < 2000 FROM {table}")).all())
                toast_bytes = conn.execute(sa.text(
                    "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = CAST(:t AS regclass)"),
                    {"t": table}).scalar_one()
                stored[content].add(("TOAST table used", toast_bytes > 0))
        finally:
            driver.uninstall(engine, names)
    # compressed, and the row keeps it inline: nothing in the TOAST table
    assert stored["json"] == {("pglz", True), ("TOAST table used", False)}
    # not compressible: stored as it is, out of line, the row holds a pointer to it
    assert stored["random"] == {(None, False), ("TOAST table used", True)}


def test_one_table_dequeue_claims_with_the_reliable_dequeue_statement() -> None:
    """bench.sql's one-table dequeue is a deliberate copy of the reliable dequeue's claim
    (the split scenario compares the tables, not two statements): its picks and its UPDATE
    must stay the text of reliable.sql's dequeue, up to the lease default."""
    from queuectl.sqlfiles import sections

    def claim(text: str) -> str:
        start = text.index("WITH expired AS MATERIALIZED (")
        end = text.index("RETURNING", start)
        # the reliable walk is limited to the open generations' slots (reliable_0012): one
        # table has none
        return " ".join(text[start:end].replace("{{lease_seconds}}", "30").replace("m.slot = ANY (p_open) AND ", "")
                        .replace("{{claim_meta}}", "{{meta}}").split())

    assert claim(sections("postgresql", "bench")["onetable_create"]) == claim(sections("postgresql", "reliable")["create_claim_calls"])


def test_one_table_ack_is_the_reliable_ack_statement() -> None:
    """The one-table ack is the reliable ack's UPDATE, word for word (reliable_0009's
    lease check through the primary key only), so neither design's ack gets another plan."""
    from queuectl.sqlfiles import sections

    def ack(text: str) -> str:
        text = text.replace("{{claim_meta}}", "{{meta}}")
        start = text.index("UPDATE {{meta}} m\n    SET status = 2")
        end = text.index("GET DIAGNOSTICS", start)
        return " ".join(text[start:end].split())

    assert ack(sections("postgresql", "bench")["onetable_create"]) == ack(sections("postgresql", "reliable")["create_claim_calls"])


def _table_definition(engine: sa.Engine, table: str) -> dict[str, Any]:
    """What a write to `table` pays for besides its own row: its indexes (definitions from
    USING on, without the index and table names), CHECK constraints and storage parameters."""
    with engine.connect() as conn:
        oid = conn.execute(sa.text("SELECT CAST(:t AS regclass)::oid"), {"t": table}).scalar_one()
        indexes = conn.execute(sa.text(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = :oid"), {"oid": oid}).scalars().all()
        checks = conn.execute(sa.text(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = :oid AND contype = 'c'"),
            {"oid": oid}).scalars().all()
        options = conn.execute(sa.text(
            "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = :oid"), {"oid": oid}).scalar_one()
    return {
        "indexes": sorted(d[d.index(" USING "):] for d in indexes),
        "checks": sorted(checks),
        "options": sorted(options),
    }


def test_one_table_baseline_pays_for_what_the_reliable_meta_table_pays_for(engine: sa.Engine) -> None:
    """The split scenario compares where the payload lives, nothing else: the one-table
    baseline has the reliable meta table's indexes (the finished-rows index included, which
    every ack writes), CHECK constraints and storage parameters (fillfactor, reliable_0007's
    autovacuum settings), as installed by the newest revision."""
    from queuectl.bench.drivers import driver_for
    from queuectl.names import QueueNames

    one, split = QueueNames("bdef_one"), QueueNames("bdef_split")
    driver_for("onetable").install(engine, one)
    driver_for("reliable").install(engine, split)
    try:
        baseline = _table_definition(engine, one.qualified("meta"))
        # the reliable queue's rows are written to its generation slots (reliable_0012): slot 0's
        # table holds the indexes, checks and storage parameters (the others are the same)
        meta = _table_definition(engine, split.qualified("meta0"))
        assert meta == _table_definition(engine, split.qualified("meta1"))
        assert len(meta["indexes"]) == 4 and any("WHERE (status >= 2)" in d for d in meta["indexes"])
        assert baseline == meta
    finally:
        driver_for("reliable").uninstall(engine, split)
        driver_for("onetable").uninstall(engine, one)


# -- the product bench and the lab beside it ----------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
PROBES = sorted(p for p in LAB.glob("*.py") if p.name != "lab_helpers.py")


def test_the_wheel_holds_the_bench_scenarios_and_nothing_of_the_lab(tmp_path: Path) -> None:
    """`pip install .` gets `queuectl bench` and its scenarios; the lab (bench/lab/: probes,
    their SQL, RESULTS.md, results/*.json) stays in the checkout. Built from a copy of the
    folders pyproject.toml maps into the package, bench/lab/ included, so no build/ left by
    an earlier build can hide or add a file."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    src = tmp_path / "src"
    for folder in {d.split("/")[0] for d in config["tool"]["setuptools"]["package-dir"].values()}:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for file in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / file, src / file)
    assert (src / "bench" / "lab" / "RESULTS.md").is_file() and list((src / "bench" / "lab" / "results").glob("*.json"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True, text=True, timeout=300)
    # The packaging itself is clean: setuptools' deprecation and "package would be ignored"
    # notices (BuildBackendWarning, SetuptoolsDeprecationWarning) come through even --quiet.
    assert "Warning:" not in build.stdout + build.stderr, (build.stdout + build.stderr)[-3000:]
    [wheel] = (tmp_path / "dist").glob("queuectl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert sorted(n for n in names if n.startswith("queuectl/sql/") and n.endswith(".sql")) == sorted(
        f"queuectl/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / "sql").rglob("*.sql"))
    bench = sorted(n.removeprefix("queuectl/bench/") for n in names if n.startswith("queuectl/bench/"))
    assert bench == sorted([p.name for p in (ROOT / "bench").glob("*.py")] + ["result_schema.json"])
    assert "queuectl/sql/postgresql/bench.sql" in names  # the scenarios' own SQL
    with zipfile.ZipFile(wheel) as whl:  # a standalone script (a probe) is not a scenario
        scripts = [n for n in names if n.startswith("queuectl/bench/") and n.endswith(".py")
                   and ("argparse" in (text := whl.read(n).decode()) or "__main__" in text)]
    assert scripts == []
    assert [n for n in names if "lab" in n.split("/") or "results" in n.split("/")
            or n.endswith(("RESULTS.md", "probes.sql", "lab_helpers.py"))] == []


def test_every_lab_probe_runs_from_a_checkout_and_says_what_it_measures() -> None:
    """Each probe opens with one line saying what it measures, names the command that runs
    it, and answers --help when run that way (its lab-local imports resolve)."""
    assert len(PROBES) >= 11
    for probe in PROBES:
        doc = probe.read_text().split('"""')[1]
        first, rest = doc.split("\n", 1)
        assert first.startswith("Probe: ") and first.endswith("."), probe.name
        assert f"bench/lab/{probe.name}" in rest, probe.name
        proc = subprocess.run([sys.executable, str(probe.relative_to(ROOT)), "--help"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "usage:" in proc.stdout, (probe.name, proc.stderr[-2000:])

