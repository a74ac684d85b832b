"""Probe: where the reliable queue's claim decays under a pinned xmin horizon, and a claim that starts its walks past the dead prefix.

    python bench/lab/wm_claim.py [--designs base,wm_ready,wm_both] [--rate 800] [--window 60] [--repeats 2]
                                 [--move-every 10] [--archive-min-age 10] [--url URL] [--json out.json]
    python bench/lab/wm_claim.py --check [--check-items 6000] [--url URL] [--json out.json]
    python bench/lab/wm_claim.py --drain 50000 [--drain-batch 100] [--designs base,wm_all] [--repeats 3]

Each design is a reliable queue installed at the head revision (its tables, indexes and
autovacuum settings are the product's), driven by 2 producer threads at a fixed offered rate
(enqueue_many of what the schedule owes, every 10 ms) and 2 consumer threads (dequeue(10), then
ack; an empty claim waits 5 ms), for a clean window, then a held window (a REPEATABLE READ snapshot
open in another session, reading an unrelated table), while an archiver moves DONE rows older
than --archive-min-age to history once a second (the product's archive job):

  * base:     the product's enqueue_many, dequeue and ack;
  * wm_ready: the prototype (sql/wm_claim.sql): the ready walk starts at per-priority bounds;
  * wm_lease: the prototype with only the expired-lease walk bounded;
  * wm_both:  both walks bounded;
  * wm_all:   both walks and the archive's walk of the finished index bounded.

Every design runs its clean and held windows, in turn, the order reversed every other repeat.
Per 5 s: completed/s, backlog, end-to-end latency p50/p99, and per claim (a dequeue call, empty
ones included) the index entries each index returned (idx_tup_read: each one a heap tuple
visited; while the horizon is pinned, dead entries are returned and their heap tuples checked)
and the index buffers; heap buffers per message; dead rows and sizes per table; per archive
batch, the finished index's entries.

--check runs the concurrency check on the wm_both design instead, under a held snapshot: producers
that keep some enqueue transactions open for up to 1.5 s, items at three priorities, some
delayed; consumers that ack, nack (backoff 0-0.2 s), release (after up to 0.5 s: the other
sessions' bounds have passed the items by then), roll their claim back, or abandon their lease
(1 s) to expiry; once the producers are done, one more session claims 50 fresh items, holds
them 1.5 s while the consumers poll the idle queue, and releases them. Every committed item must
be acked exactly once; reported: the
largest wait between an item becoming claimable and its first claim, per cause.
--unsafe-release is the check's control: release without the epoch bump must strand items.
--drain measures the claim's own cost at full speed with nothing held: a filled queue drained
by 2 consumers (claim --drain-batch, ack), the designs alternating.
Without --url the embedded server is used (as `queuectl` itself does).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from typing import Any

import psycopg
import sqlalchemy as sa

from lab_helpers import lab_sql
from queuectl.bench.core import percentile
from queuectl.bench.drivers import reinstall_queue
from queuectl.bench.report import write_json
from queuectl.catalog import QueueSettings
from queuectl.engine import make_engine
from queuectl.install import uninstall_queue
from queuectl.jobs.archive import ArchiveConfig, run_once
from queuectl.names import QueueNames, quote_ident

LAB = "wmlab"
DESIGNS = {  # design: (ready bound, lease bound); None: the product's functions
    "base": None, "wm_ready": (1, 0), "wm_lease": (0, 1), "wm_both": (1, 1), "wm_all": (1, 1),
}
BOUNDED_ARCHIVE = {"wm_all"}  # the archive's walk starts at its session's bound too
PAYLOAD = os.urandom(300)
SAMPLE_S = 5.0


def _values(names: QueueNames, engine: sa.Engine, design: str, move_every: int) -> dict[str, str | int]:
    values: dict[str, str | int] = dict(names.template_values())
    lab = quote_ident(LAB)
    values["lab"] = lab
    for fn in ("dequeue", "ack", "nack", "release", "extend_lease", "enqueue_many"):
        values[f"wm_{fn}"] = f"{lab}.{quote_ident(names.table(fn))}"
    values["epoch"] = f"{lab}.{quote_ident(names.table('epoch'))}"
    with engine.connect() as conn:
        values["meta_oid"] = int(conn.execute(sa.text(lab_sql("wm_claim", "meta_oid", {})),
                                              {"meta": names.qualified("meta")}).scalar_one())
    ready, lease = DESIGNS[design] or (0, 0)
    values.update(ready_bound=ready, lease_bound=lease, move_every=move_every)
    return values


def install(engine: sa.Engine, design: str, move_every: int, settings: QueueSettings | None = None
            ) -> tuple[QueueNames, dict[str, str | int]]:
    names = QueueNames(f"wmc_{design}")
    reinstall_queue(engine, names.queue, settings=settings, schema=names.schema)
    values = _values(names, engine, design, move_every)
    with engine.begin() as conn:
        conn.exec_driver_sql(lab_sql("wm_claim", "wm_schema", values))
        conn.exec_driver_sql(lab_sql("wm_claim", "statements_on", values))
        conn.exec_driver_sql(lab_sql("wm_claim", "hold_table", values))
        conn.exec_driver_sql(lab_sql("wm_claim", "wm_drop", values))
        if DESIGNS[design] is not None:
            conn.exec_driver_sql(lab_sql("wm_claim", "wm_install", values))
    return names, values


def uninstall(engine: sa.Engine, names: QueueNames, values: dict[str, str | int]) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(lab_sql("wm_claim", "wm_drop", values))
    uninstall_queue(engine, names.queue, names.schema)


class Calls:
    """The SQL each design's clients send."""

    def __init__(self, design: str, values: dict[str, str | int]) -> None:
        wm = DESIGNS[design] is not None
        values = dict(values)
        for name in ("dequeue", "ack", "nack", "release"):
            values[f"q_{name}"] = values[f"wm_{name}" if wm else f"fn_{name}"]
        self.enqueue = lab_sql("wm_claim", "client_enqueue_wm" if wm else "client_enqueue_product", values)
        self.enqueue_ids = lab_sql("wm_claim", "client_enqueue_ids", values)
        self.enqueue_product = lab_sql("wm_claim", "client_enqueue_product", values)
        self.dequeue, self.ack, self.nack, self.release, self.release_product = (
            lab_sql("wm_claim", f"client_{name}", values)
            for name in ("dequeue", "ack", "nack", "release", "release_product"))


def _conninfo(engine: sa.Engine) -> str:
    """libpq's connection string; its sessions track nested statements (needs a superuser, as the
    embedded server's; elsewhere the statement columns stay empty)."""
    dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    return dsn + ("&" if "?" in dsn else "?") + "options=-c%20pg_stat_statements.track%3Dall"


class Load:
    """2 producers at a fixed offered rate, 2 consumers dequeue(batch)+ack, counting as they go."""

    def __init__(self, dsn: str, calls: Calls, rate: float, batch: int) -> None:
        self.dsn, self.calls, self.rate, self.batch = dsn, calls, rate, batch
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.enqueued = 0
        self.completed = 0
        self.claims = 0
        self.empty_claims = 0
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._produce, args=(rate / 2,), daemon=True) for _ in range(2)]
        self.threads += [threading.Thread(target=self._consume, args=(f"c{i}",), daemon=True) for i in range(2)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _produce(self, rate: float) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                started = time.monotonic()
                sent = 0
                while not self.stop.is_set():
                    owed = min(int((time.monotonic() - started) * rate) - sent, 200)
                    if owed > 0:
                        conn.execute(self.calls.enqueue, ([PAYLOAD] * owed, [0] * owed, ["0"] * owed))
                        sent += owed
                        with self.lock:
                            self.enqueued += owed
                    time.sleep(0.01)
        except Exception as exc:  # noqa: BLE001 - reported with the run
            self.errors.append(f"producer: {exc}")

    def _consume(self, worker: str) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    rows = conn.execute(self.calls.dequeue, (self.batch, 30, worker)).fetchall()
                    if rows:
                        conn.execute(self.calls.ack, ([r[0] for r in rows], worker))
                        now = time.time()
                        with self.lock:
                            self.claims += 1
                            self.completed += len(rows)
                            self.latencies.extend(now - r[2].timestamp() for r in rows)
                    else:
                        with self.lock:
                            self.claims += 1
                            self.empty_claims += 1
                        time.sleep(0.005)
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"consumer: {exc}")

    def take(self) -> dict[str, Any]:
        with self.lock:
            out = {"enqueued": self.enqueued, "completed": self.completed, "claims": self.claims,
                   "empty_claims": self.empty_claims, "latencies": sorted(self.latencies)}
            self.latencies = []
        return out


class Archiver:
    """The product's archive job, one run_once a second, recording each run's batches; with
    `values`, the prototype's batch instead (wm_archive_batch), its bound moved before each run."""

    def __init__(self, engine: sa.Engine, names: QueueNames, min_age: float,
                 values: dict[str, str | int] | None = None) -> None:
        self.engine, self.names, self.values = engine, names, values
        self.config = ArchiveConfig(min_age=min_age, delay=0.05)
        self.stop = threading.Event()
        self.batches = 0
        self.rows = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run if values is None else self._run_bounded, daemon=True)

    def _run_bounded(self) -> None:
        assert self.values is not None
        sql = {k: sa.text(lab_sql("wm_claim", f"wm_archive_{k}", self.values))
               for k in ("batch", "settled", "move", "clock", "xmax")}
        bound, candidate = "-infinity", None
        while not self.stop.wait(1.0):
            try:
                with self.engine.connect() as conn:
                    conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                    if candidate and conn.execute(sql["settled"], {"cx": candidate[1]}).scalar_one():
                        bound = conn.execute(sql["move"], {"bound": bound, "ct": candidate[0]}).scalar_one()
                        candidate = None
                    if candidate is None:
                        candidate = (conn.execute(sql["clock"]).scalar_one(), conn.execute(sql["xmax"]).scalar_one())
                    while not self.stop.is_set():
                        n = conn.execute(sql["batch"], {"bound": bound, "min_age_seconds": self.config.min_age,
                                                        "dead_min_age_seconds": self.config.dead_min_age,
                                                        "batch": self.config.batch}).rowcount
                        self.batches += 1
                        self.rows += n
                        if n < self.config.batch:
                            break
                        time.sleep(self.config.delay)
            except Exception as exc:  # noqa: BLE001
                self.errors.append(str(exc))

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                result = run_once(self.engine, self.names.queue, self.config, schema=self.names.schema, stop=self.stop)
                self.batches += result.batches
                self.rows += result.rows
            except Exception as exc:  # noqa: BLE001
                self.errors.append(str(exc))


def _stats(engine: sa.Engine, names: QueueNames) -> dict[str, dict[str, int]]:
    tables = [names.qualified(t) for t in ("meta", "data", "history")]
    out: dict[str, dict[str, int]] = {}
    with engine.connect() as conn:
        for row in conn.execute(sa.text(lab_sql("wm_claim", "index_sample", {})), {"tables": tables}):
            out[row.name.removeprefix(names.queue + "_")] = {
                "scans": int(row.idx_scan), "entries": int(row.idx_tup_read), "blocks": int(row.blocks),
                "bytes": int(row.bytes)}
        for row in conn.execute(sa.text(lab_sql("wm_claim", "table_sample", {})), {"tables": tables}):
            out["table:" + row.name.removeprefix(names.queue + "_")] = {
                "dead": int(row.n_dead_tup), "live": int(row.n_live_tup), "heap_blocks": int(row.heap_blocks),
                "bytes": int(row.bytes), "autovacuums": int(row.autovacuum_count)}
        for row in conn.execute(sa.text(lab_sql("wm_claim", "statement_sample", {})), {"meta": names.qualified("meta")}):
            cat = _statement_kind(row.query)
            if cat:
                agg = out.setdefault("stmt:" + cat, {"calls": 0, "blocks": 0, "ms": 0})
                agg["calls"] += int(row.calls)
                agg["blocks"] += int(row.blocks)
                agg["ms"] += float(row.ms)
    return out


def _statement_kind(query: str) -> str | None:
    """Which of the cycle's statements a pg_stat_statements entry is (nested ones included)."""
    if "WITH expired AS MATERIALIZED" in query:
        return "claim"
    if "INSERT INTO" in query and "history" in query:
        return "archive"
    if query.lstrip().startswith("UPDATE") and "finished_at = " in query and "last_error" not in query:
        return "ack"  # (constants are normalised: "status = $1, ..., leased_until = $2")
    if "ORDER BY m.due_at, m.id" in query or "ORDER BY m.leased_until LIMIT" in query:
        return "move"
    return None


def _index_name(key: str) -> str:
    return {"meta_ready": "ready", "meta_leased": "leased", "meta_finished": "finished", "meta_pkey": "meta_pk",
            "data_pkey": "data_pk"}.get(key, key)


def window(engine: sa.Engine, names: QueueNames, load: Load, archiver: Archiver, seconds: float,
           label: str) -> list[dict[str, Any]]:
    """Samples every 5 s over `seconds`: rates, backlog, latency and the per-claim breakdown."""
    samples: list[dict[str, Any]] = []
    prev = _stats(engine, names)
    prev_load = load.take()
    prev_batches = archiver.batches
    t0 = time.monotonic()
    for k in range(1, int(seconds / SAMPLE_S) + 1):
        time.sleep(max(0.0, t0 + k * SAMPLE_S - time.monotonic()))
        cur = _stats(engine, names)
        now_load = load.take()
        claims = now_load["claims"] - prev_load["claims"]
        done = now_load["completed"] - prev_load["completed"]
        lat = now_load["latencies"]
        batches = archiver.batches - prev_batches
        per_claim = {}
        for key, v in cur.items():
            if key.startswith("stmt:"):
                was = prev.get(key, {"calls": 0, "blocks": 0, "ms": 0})
                calls_ = v["calls"] - was["calls"]
                if key == "stmt:move":  # the prototype's moves, per claim
                    per_claim["move_blocks_per_claim"] = (v["blocks"] - was["blocks"]) / claims if claims else None
                else:
                    per_claim[f"{key[5:]}_blocks_per_call"] = (v["blocks"] - was["blocks"]) / calls_ if calls_ else None
                    per_claim[f"{key[5:]}_ms_per_call"] = (v["ms"] - was["ms"]) / calls_ if calls_ else None
                continue
            if key.startswith("table:") or key not in prev:
                continue
            d_entries = v["entries"] - prev[key]["entries"]
            d_blocks = v["blocks"] - prev[key]["blocks"]
            name = _index_name(key)
            if name == "finished":
                per_claim["archive_batch_entries"] = d_entries / batches if batches else None
                per_claim["archive_batch_blocks"] = d_blocks / batches if batches else None
            elif name != "history_at" and not name.startswith("history"):
                per_claim[f"{name}_entries"] = d_entries / claims if claims else None
                per_claim[f"{name}_blocks"] = d_blocks / claims if claims else None
        meta, data = cur["table:meta"], cur["table:data"]
        sample = {
            "window": label, "t": round(k * SAMPLE_S, 1), "completed_per_s": done / SAMPLE_S,
            "claims_per_s": claims / SAMPLE_S,
            "empty_claims": now_load["empty_claims"] - prev_load["empty_claims"],
            "backlog": now_load["enqueued"] - now_load["completed"],
            "p50_ms": (percentile(lat, 0.5) or 0) * 1000, "p99_ms": (percentile(lat, 0.99) or 0) * 1000,
            "meta_heap_blocks_per_msg": (meta["heap_blocks"] - prev["table:meta"]["heap_blocks"]) / done if done else None,
            "data_heap_blocks_per_msg": (data["heap_blocks"] - prev["table:data"]["heap_blocks"]) / done if done else None,
            "archive_batches": batches, **per_claim,
            "dead_meta": meta["dead"], "dead_data": data["dead"],
            "meta_bytes": meta["bytes"], "data_bytes": data["bytes"], "history_bytes": cur["table:history"]["bytes"],
            "autovacuums": meta["autovacuums"] + data["autovacuums"],
        }
        samples.append(sample)
        print(f"  {label:5} t={sample['t']:5.0f}s {sample['completed_per_s']:6.0f}/s backlog {sample['backlog']:6} "
              f"p99 {sample['p99_ms']:7.1f} ms  per claim: ready {per_claim.get('ready_entries') or 0:8.1f} "
              f"leased {per_claim.get('leased_entries') or 0:8.1f} meta_pk {per_claim.get('meta_pk_entries') or 0:5.1f} "
              f"data_pk {per_claim.get('data_pk_entries') or 0:5.1f} entries, claim {per_claim.get('claim_blocks_per_call') or 0:7.1f} "
              f"move {per_claim.get('move_blocks_per_claim') or 0:5.1f} blocks, {per_claim.get('claim_ms_per_call') or 0:6.2f} ms; archive batch "
              f"{per_claim.get('archive_batch_entries') or 0:8.1f}; dead meta {meta['dead']:7} "
              f"meta+data {(meta['bytes'] + data['bytes']) / 1e6:6.1f} MB", flush=True)
        prev, prev_load = cur, now_load
    return samples


def run_design(engine: sa.Engine, design: str, args: argparse.Namespace) -> dict[str, Any]:
    names, values = install(engine, design, args.move_every)
    dsn = _conninfo(engine)
    load = Load(dsn, Calls(design, values), args.rate, args.batch)
    archiver = Archiver(engine, names, args.archive_min_age, values if design in BOUNDED_ARCHIVE else None)
    hold: psycopg.Connection | None = None
    try:
        load.start()
        archiver.thread.start()
        print(f"{design}: clean", flush=True)
        clean = window(engine, names, load, archiver, args.window, "clean")
        hold = psycopg.connect(dsn)
        hold.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        hold.execute(lab_sql("wm_claim", "hold_read", values))
        print(f"{design}: held", flush=True)
        held = window(engine, names, load, archiver, args.held_window or args.window, "held")
    finally:
        load.close()
        archiver.stop.set()
        archiver.thread.join(60)
        if hold is not None:
            hold.rollback()
            hold.close()
        uninstall(engine, names, values)
    return {"design": design, "clean": clean, "held": held, "errors": load.errors + archiver.errors,
            "archived_rows": archiver.rows}


def summarize(samples: list[dict[str, Any]], last: int = 6) -> dict[str, Any]:
    """Medians over the window's samples (rates) and over its last `last` (the walks at their longest)."""
    tail = samples[-last:]

    def med(rows: list[dict[str, Any]], key: str) -> float | None:
        vals = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    return {"completed_per_s": med(samples, "completed_per_s"), "p99_ms": med(samples, "p99_ms"),
            "backlog_end": samples[-1]["backlog"],
            **{f"tail_{k}": med(tail, k) for k in ("ready_entries", "leased_entries", "meta_pk_entries",
                                                   "data_pk_entries", "ready_blocks", "leased_blocks",
                                                   "archive_batch_entries", "p99_ms", "completed_per_s",
                                                   "claim_blocks_per_call", "claim_ms_per_call", "move_blocks_per_claim",
                                                   "ack_blocks_per_call", "archive_blocks_per_call",
                                                   "archive_ms_per_call")},
            "dead_meta_end": samples[-1]["dead_meta"],
            "meta_data_mb_end": (samples[-1]["meta_bytes"] + samples[-1]["data_bytes"]) / 1e6}


# -- the concurrency check ---------------------------------------------------------------------

def check(engine: sa.Engine, args: argparse.Namespace) -> dict[str, Any]:
    """Every committed item acked exactly once, under a held snapshot, with every way back to READY."""
    settings = QueueSettings(max_attempts=1000, lease_seconds=1)
    names, values = install(engine, "wm_both", args.move_every, settings)
    calls = Calls("wm_both", values)
    if args.unsafe_release:  # the control: a release that does not tell the sessions
        calls.release = calls.release_product
    dsn = _conninfo(engine)
    lock = threading.Lock()
    committed: dict[int, tuple[float, str]] = {}  # id -> (claimable from, how it came)
    acked: dict[int, int] = {}
    ready_at: dict[int, tuple[float, str]] = {}  # id -> (claimable again from, cause): nack/release/expiry
    waits: dict[str, list[float]] = {}
    producing = threading.Event()
    stop = threading.Event()
    errors: list[str] = []
    per_producer = args.check_items // 4

    def note_wait(item: int, claimed_at: float) -> None:
        since, cause = ready_at.pop(item, None) or committed.get(item, (None, ""))
        if since is not None:
            waits.setdefault(cause, []).append(max(0.0, claimed_at - since))

    def produce(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            with psycopg.connect(dsn) as conn:
                made = 0
                while made < per_producer:
                    n = min(rnd.randint(1, 8), per_producer - made)
                    prios = [rnd.choice((0, 0, 0, 1, 2)) for _ in range(n)]
                    delayed = rnd.random() < 0.1
                    delay = rnd.uniform(0.05, 0.5) if delayed else 0.0
                    ids = [r[0] for r in conn.execute(
                        calls.enqueue_ids, ([PAYLOAD] * n, prios, [f"{delay} seconds"] * n)).fetchall()]
                    late = rnd.random() < 0.05
                    if late:
                        time.sleep(rnd.uniform(0.2, 1.5))  # the enqueue stays uncommitted meanwhile
                    if rnd.random() < 0.03:
                        conn.rollback()
                    else:
                        conn.commit()
                        at = time.monotonic() + delay
                        with lock:
                            for i in ids:
                                committed[i] = (at, "late commit" if late else ("delayed" if delayed else "enqueue"))
                        made += n
                    time.sleep(rnd.uniform(0, 0.004))
        except Exception as exc:  # noqa: BLE001
            errors.append(f"producer: {exc!r}")

    def consume(worker: str, seed: int) -> None:
        rnd = random.Random(seed)
        try:
            with psycopg.connect(dsn) as conn:
                while not stop.is_set():
                    rows = conn.execute(calls.dequeue, (rnd.randint(1, 10), 1, worker)).fetchall()
                    now = time.monotonic()
                    if not rows:
                        conn.commit()
                        if not producing.is_set():
                            with lock:
                                if len(acked) >= len(committed):
                                    return
                        time.sleep(0.003)
                        continue
                    ids = [r[0] for r in rows]
                    fate = rnd.random()
                    if fate < 0.05:
                        conn.rollback()  # the claim undone: items READY again at their keys
                        with lock:
                            for i in ids:
                                ready_at.setdefault(i, (now, "claim rolled back"))
                        continue
                    conn.commit()
                    with lock:
                        for i in ids:
                            note_wait(i, now)
                    if fate < 0.10:
                        time.sleep(rnd.uniform(0, 0.5))  # worked a while, then gives the items back
                        conn.execute(calls.release, (ids, worker))
                        conn.commit()
                        with lock:
                            for i in ids:
                                ready_at[i] = (time.monotonic(), "release")
                    elif fate < 0.17:
                        base = rnd.uniform(0, 0.1)
                        n = conn.execute(calls.nack, (ids, worker, base, 0.2)).fetchone()[0]
                        conn.commit()
                        with lock:
                            for r in rows[:n]:
                                ready_at[r[0]] = (time.monotonic() + 0.2, "nack")
                    elif fate < 0.20:
                        with lock:  # abandoned: the lease (1 s) expires, another consumer takes it
                            for i in ids:
                                ready_at[i] = (time.monotonic() + 1.0, "lease expired")
                    else:
                        n = conn.execute(calls.ack, (ids, worker)).fetchone()[0]
                        conn.commit()
                        with lock:
                            if n != len(ids):
                                errors.append(f"ack of {len(ids)} items acked {n}")
                            for i in ids:
                                acked[i] = acked.get(i, 0) + 1
        except Exception as exc:  # noqa: BLE001
            errors.append(f"consumer: {exc!r}")

    def hold_then_release() -> None:
        """While the consumers poll an idle queue, hold 50 fresh items for 1.5 s (long enough
        for every session's bounds to pass them), then release them: the case the epoch exists for."""
        with psycopg.connect(dsn) as conn:
            n = 50
            # the product's enqueue (due_at = now()), so the same transaction can claim them at once;
            # the items reach READY only through the release below, the case under test
            conn.execute(calls.enqueue_product, ([PAYLOAD] * n, [0] * n, ["0 seconds"] * n))
            ids = [r[0] for r in conn.execute(calls.dequeue, (n + 20, 30, "holder")).fetchall()]
            conn.commit()
            with lock:
                for i in ids:
                    committed.setdefault(i, (time.monotonic(), "enqueue"))
            time.sleep(1.5)
            conn.execute(calls.release, (ids, "holder"))
            conn.commit()
            with lock:
                for i in ids:
                    ready_at[i] = (time.monotonic(), "release after 1.5 s held")

    hold = psycopg.connect(dsn)
    hold.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    hold.execute(lab_sql("wm_claim", "hold_read", values))
    started = time.monotonic()
    try:
        producers = [threading.Thread(target=produce, args=(i,)) for i in range(4)]
        consumers = [threading.Thread(target=consume, args=(f"w{i}", 100 + i)) for i in range(4)]
        producing.set()
        for t in producers + consumers:
            t.start()
        for t in producers:
            t.join()
        hold_then_release()
        producing.clear()
        deadline = time.monotonic() + args.check_deadline
        for t in consumers:
            t.join(max(1.0, deadline - time.monotonic()))
        stop.set()
        for t in consumers:
            t.join(10)
    finally:
        hold.rollback()
        hold.close()
        uninstall(engine, names, values)
    missing = sorted(set(committed) - set(acked))
    twice = sorted(i for i, n in acked.items() if n > 1)
    stray = sorted(set(acked) - set(committed))
    result = {"unsafe_release": args.unsafe_release, "items": len(committed), "acked": len(acked), "missing": len(missing), "acked_twice": len(twice),
              "acked_not_committed": len(stray), "seconds": time.monotonic() - started, "errors": errors,
              "max_wait_s": {k: max(v) for k, v in waits.items()},
              "p99_wait_s": {k: percentile(sorted(v), 0.99) for k, v in waits.items()},
              "claims_by_cause": {k: len(v) for k, v in waits.items()}}
    print(result, flush=True)
    return result


# -- the cost at full speed, no horizon held ----------------------------------------------------

def drain(engine: sa.Engine, design: str, args: argparse.Namespace) -> dict[str, Any]:
    """Fill the queue with `--drain` items, then time 2 consumers claiming `--drain-batch` and acking
    until it is empty: the claim's own cost at full speed, clean (no load beside it)."""
    names, values = install(engine, design, args.move_every)
    calls, dsn = Calls(design, values), _conninfo(engine)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(0, args.drain, 1000):
                conn.execute(calls.enqueue, ([PAYLOAD] * 1000, [0] * 1000, ["0"] * 1000))
            conn.execute(lab_sql("wm_claim", "vacuum_meta", values))
        done = [0, 0]

        def consume(k: int) -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while rows := conn.execute(calls.dequeue, (args.drain_batch, 30, f"d{k}")).fetchall():
                    conn.execute(calls.ack, ([r[0] for r in rows], f"d{k}"))
                    done[k] += len(rows)

        threads = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.monotonic() - started
    finally:
        uninstall(engine, names, values)
    rate = sum(done) / seconds
    print(f"drain {design:8} {sum(done):,} items in {seconds:.2f} s: {rate:,.0f} msgs/s", flush=True)
    return {"design": design, "items": sum(done), "seconds": seconds, "msgs_per_s": rate}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="database URL (default: the embedded server)")
    parser.add_argument("--designs", default="base,wm_ready,wm_lease,wm_both", help="comma-separated: " + ", ".join(DESIGNS))
    parser.add_argument("--rate", type=float, default=800, help="offered messages/s (both producers)")
    parser.add_argument("--batch", type=int, default=10, help="dequeue batch")
    parser.add_argument("--window", type=float, default=60, help="seconds of each window (clean, held)")
    parser.add_argument("--held-window", type=float, default=None, help="seconds of the held window (default: --window)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--move-every", type=int, default=10, help="the prototype's bounds move every N calls")
    parser.add_argument("--archive-min-age", type=float, default=10, help="seconds DONE rows wait before the archive")
    parser.add_argument("--check", action="store_true", help="run the concurrency check instead")
    parser.add_argument("--drain", type=int, default=0,
                        help="instead: fill this many items and drain them with 2 consumers (clean, full speed)")
    parser.add_argument("--drain-batch", type=int, default=100)
    parser.add_argument("--check-items", type=int, default=6000)
    parser.add_argument("--check-deadline", type=float, default=60,
                        help="seconds the check's consumers keep draining after the producers finish")
    parser.add_argument("--unsafe-release", action="store_true",
                        help="the check's control: release with the product's function (no epoch bump); "
                             "released items should then be stranded below the bounds")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    engine = make_engine(args.url)
    try:
        if args.drain:
            designs = [d.strip() for d in args.designs.split(",") if d.strip()]
            runs = [drain(engine, d, args) for rep in range(args.repeats)
                    for d in (designs if rep % 2 == 0 else designs[::-1])]
            rates = {d: [r["msgs_per_s"] for r in runs if r["design"] == d] for d in designs}
            ratios = {d: statistics.median(a / b for a, b in zip(rates[d], rates[designs[0]])) for d in designs}
            print({d: round(v, 3) for d, v in ratios.items()}, flush=True)
            write_json(args.json_path, {"drain": args.drain, "batch": args.drain_batch, "runs": runs,
                                        f"median_ratio_to_{designs[0]}": ratios, "load_average": os.getloadavg()})
            return 0
        if args.check:
            write_json(args.json_path, {"check": check(engine, args), "move_every": args.move_every})
            return 0
        designs = [d.strip() for d in args.designs.split(",") if d.strip()]
        runs = []
        for rep in range(args.repeats):
            for design in designs if rep % 2 == 0 else designs[::-1]:
                run = run_design(engine, design, args)
                run["repeat"] = rep
                run["summary"] = {"clean": summarize(run["clean"]), "held": summarize(run["held"])}
                runs.append(run)
        table = {}
        for design in designs:
            mine = [r["summary"] for r in runs if r["design"] == design]
            ratios = [s["held"]["completed_per_s"] / s["clean"]["completed_per_s"] for s in mine]
            table[design] = {"held_over_clean": ratios, "median_held_over_clean": statistics.median(ratios),
                             "clean": [s["clean"] for s in mine], "held": [s["held"] for s in mine]}
            print(f"{design:9} held/clean {' / '.join(f'{r:.2f}' for r in ratios)}", flush=True)
        write_json(args.json_path, {"rate": args.rate, "batch": args.batch, "window_s": args.window, "held_window_s": args.held_window or args.window,
                                    "repeats": args.repeats, "move_every": args.move_every,
                                    "archive_min_age_s": args.archive_min_age, "load_average": os.getloadavg(),
                                    "summary": table, "runs": runs})
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
