"""Probe: the rotation family for the reliable queue (generations emptied by TRUNCATE) against reliable_0011, clean and with the xmin horizon pinned.

    python bench/lab/rotation.py [--url URL] [--seconds 60] [--rate 800] [--periods 2000,10000]
        [--held-seconds S] [--slots 3] [--lock-timeout-ms 50] [--repeats 1] [--held-read 30] [--json out.json]
    python bench/lab/rotation.py --check 20000 [--url URL] [--json out.json]

The prototype (sql/rotation.sql, its header has the design and the safety argument) keeps
the reliable queue's meta and data in a ring of --slots LIST partitions; a rotator (here a
thread every 0.5 s, in the product a scheduler job) switches new items to the next epoch
every --periods items, seals the previous epoch (its READY rows moved forward once no
writer older than the switch runs), then archives it to history and TRUNCATEs it under a
lock_timeout, retrying when the lock is not granted.

Load (the same for every design, in turn, in one run): 2 producer threads enqueueing
300-byte payloads one per call at --rate in total, 2 consumers dequeue(10) + ack, for
--seconds with no snapshot, then --seconds with a REPEATABLE READ snapshot held open on an
unrelated table. The reliable queue is archived by the product's archive job
(run_once, min_age 0) every second beside it. Per 5 s: completed/s, backlog, end-to-end
latency (enqueue to ack) p50/p99, call latencies, index entries the claims read from the
ready and leased indexes per claim (idx_tup_read), shared buffers of one dequeue(10)
(EXPLAIN ANALYZE on a side connection, rolled back), dead rows, sizes, rotation state.
--held-read adds, for each rotated design, a window where the pinning session has also
read the queue (ACCESS SHARE on every slot until it ends): the truncate cannot run.

--check N: the concurrency check instead: 3 producers (some enqueues held open before
commit, some rolled back, priorities, delays), 3 consumers that ack, nack, release,
drop (lease expiry) or roll back their claims, a rotation every 300 items, all under a held
snapshot; then every committed id must be in meta or history exactly once, finished, and
acknowledged at most once. Also shows what a REPEATABLE READ snapshot older than a
truncate sees of the queue afterwards.

Queues live in their own schemas (rotlab_*) and are removed after. Without --url the
embedded server is used (as `queuectl` itself does).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import sqlalchemy as sa

from lab_helpers import lab_sql
from queuectl.bench.drivers import ReliableDriver
from queuectl.bench.report import write_json
from queuectl.engine import make_engine
from queuectl.engine.urls import mask_url
from queuectl.install import uninstall_queue
from queuectl.jobs.archive import ArchiveConfig, run_once
from queuectl.names import QueueNames, quote_ident

PAYLOAD = os.urandom(300)
WINDOW = 5.0
SEQUENCES = ("id_seq", "epoch_cur", "epoch_sealed", "epoch_truncated", "seal_bound", "epoch_start_id",
             "epoch_start_ms")
_BUFFERS = re.compile(r"Buffers: shared(?: hit=(\d+))?(?: read=(\d+))?")


def rot_values(schema: str, slots: int) -> dict[str, str | int]:
    """The rotation.sql placeholders for a prototype in `schema` (a validated lab name)."""
    QueueNames("x", schema)  # validates the schema name
    s = quote_ident(schema)
    values: dict[str, str | int] = {"s": s, "s_lit": f"'{schema}'", "k": slots, "meta": f"{s}.meta",
                                    "by": quote_ident(BYSTANDER)}
    for seq in SEQUENCES:
        values[f"seq_{seq}"] = f"'{s}.{seq}'"
    for fn in ("enqueue", "dequeue", "ack"):
        values[f"fn_{fn}"] = f"{s}.{fn}"
    return values


BYSTANDER = "rotlab_by"


def conninfo(engine: sa.Engine) -> str:
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


class Rel:
    """reliable_0011 as installed, archived by the product's archive job."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.names = QueueNames("rotlab_rel", "rotlab_rel")
        self.label = "reliable_0011"
        self.values: dict[str, str | int] = {**self.names.template_values(), "by": quote_ident(BYSTANDER)}
        self.enqueue, self.dequeue, self.ack, self.explain = (
            self.sql(f"load_{c}") for c in ("enqueue", "dequeue", "ack", "explain"))
        self.tables = [self.names.qualified("meta"), self.names.qualified("data")]
        self.history = self.names.qualified("history")
        self.tick = 1.0

    def sql(self, section: str) -> str:
        return lab_sql("rotation", section, self.values)

    def setup(self) -> None:
        with self.engine.begin() as conn:
            conn.exec_driver_sql(self.sql("schema_create"))
        ReliableDriver().install(self.engine, self.names)

    def teardown(self) -> None:
        uninstall_queue(self.engine, self.names.queue, self.names.schema)
        with self.engine.begin() as conn:
            conn.exec_driver_sql(self.sql("schema_drop"))

    def maintain(self, conn: psycopg.Connection, log: list[dict[str, Any]]) -> None:
        t = time.monotonic()
        result = run_once(self.engine, self.names.queue, ArchiveConfig(min_age=0, dead_min_age=0, delay=0),
                          schema=self.names.schema)
        log.append({"t": t, "what": "archive", "rows": result.rows, "ms": (time.monotonic() - t) * 1000})

    def state(self, conn: psycopg.Connection) -> dict[str, Any]:
        return {}


class Rot:
    """The rotation prototype (sql/rotation.sql) with a period of `period` items."""

    def __init__(self, engine: sa.Engine, period: int, slots: int, lock_timeout_ms: int,
                 period_seconds: float = 3600.0) -> None:
        self.engine = engine
        self.schema = f"rotlab_p{period}"
        self.period, self.period_seconds, self.slots = period, period_seconds, slots
        self.lock_timeout_ms = lock_timeout_ms
        self.label = f"rotation/{period}"
        self.values = rot_values(self.schema, slots)
        s = self.values["s"]
        self.enqueue, self.dequeue, self.ack, self.explain = (
            self.sql(f"load_{c}") for c in ("enqueue", "dequeue", "ack", "explain"))
        self.tables = [f"{s}.{quote_ident(f'{t}_{g}')}" for t in ("meta", "data") for g in range(slots)]
        self.history = f"{s}.history"
        self.tick = 0.5
        self.blocked_since: float | None = None

    def sql(self, section: str) -> str:
        return lab_sql("rotation", section, self.values)

    def setup(self) -> None:
        with psycopg.connect(conninfo(self.engine), autocommit=True) as conn:
            conn.execute(self.sql("drop"))
            conn.execute(self.sql("create"))

    def teardown(self) -> None:
        with psycopg.connect(conninfo(self.engine), autocommit=True) as conn:
            conn.execute(self.sql("drop"))

    def maintain(self, conn: psycopg.Connection, log: list[dict[str, Any]]) -> None:
        rotate_once(conn, self.sql, self.period, self.period_seconds, self.lock_timeout_ms, log)

    def state(self, conn: psycopg.Connection) -> dict[str, Any]:
        st = conn.execute(self.sql("rot_state")).fetchone()
        assert st is not None
        slots = conn.execute(self.sql("slot_stats")).fetchall()
        return {"cur": st[0], "sealed": st[1], "truncated": st[2], "cur_items": st[6] - st[4],
                "slots": {r[0]: {"live": r[2], "dead": r[3], "bytes": r[4]} for r in slots}}


def rotate_once(conn: psycopg.Connection, q: Callable[[str], str], period: int, period_seconds: float, lock_timeout_ms: int,
                log: list[dict[str, Any]], retries: int = 5) -> None:
    """One rotator pass: seal, truncate every sealed epoch (each under lock_timeout, retried
    `retries` times), switch if due. Each step its own transaction (autocommit); `q` renders
    a section of the queue's rotation.sql."""
    t = time.monotonic()
    cur = conn.execute(q("rot_state")).fetchone()[0]
    moved = conn.execute(q("rot_seal")).fetchone()[0]
    if moved is not None:
        conn.execute(q("rot_mark"), ("sealed", cur - 1))
        log.append({"t": t, "what": "seal", "epoch": cur - 1, "moved": moved, "ms": (time.monotonic() - t) * 1000})
    while True:
        t = time.monotonic()
        pre = conn.execute(q("rot_precopy")).fetchone()[0]
        if pre is not None:
            log.append({"t": t, "what": "precopy", "rows": pre, "ms": (time.monotonic() - t) * 1000})
        for attempt in range(retries + 1):
            t = time.monotonic()
            try:
                row = conn.execute(q("rot_truncate"), (lock_timeout_ms,)).fetchone()
                break
            except psycopg.errors.LockNotAvailable:
                log.append({"t": t, "what": "truncate_timeout", "attempt": attempt,
                            "ms": (time.monotonic() - t) * 1000})
                time.sleep(0.02)
        else:
            return  # next pass
        if row is None or row[0] is None:
            break
        conn.execute(q("rot_mark"), ("truncated", row[0]))
        log.append({"t": t, "what": "truncate", "epoch": row[0], "copied": row[1],
                    "moved": row[2], "lock_ms": row[3], "work_ms": row[4], "copy_ms": row[5], "truncate_ms": row[6],
                    "ms": (time.monotonic() - t) * 1000})
    t = time.monotonic()
    new = conn.execute(q("rot_switch"), (period, period_seconds)).fetchone()[0]
    if new is not None:
        log.append({"t": t, "what": "switch", "epoch": new})


@dataclass
class Shared:
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    enqueued: int = 0
    completed: int = 0
    claims: int = 0
    e2e: list[tuple[float, float]] = field(default_factory=list)       # (monotonic at ack, seconds)
    calls: list[tuple[float, float, str]] = field(default_factory=list)  # (monotonic start, seconds, kind)
    errors: list[str] = field(default_factory=list)


def producer(url: str, design: Any, rate: float, sh: Shared) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        nxt = time.monotonic()
        while not sh.stop.is_set():
            nxt += 1.0 / rate
            delay = nxt - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t = time.monotonic()
            conn.execute(design.enqueue, (PAYLOAD,))
            dt = time.monotonic() - t
            with sh.lock:
                sh.enqueued += 1
                sh.calls.append((t, dt, "enqueue"))


def consumer(url: str, design: Any, worker: str, sh: Shared) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        while not sh.stop.is_set():
            t = time.monotonic()
            rows = conn.execute(design.dequeue, (10, worker)).fetchall()
            t1 = time.monotonic()
            if not rows:
                with sh.lock:
                    sh.calls.append((t, t1 - t, "claim"))
                    sh.claims += 1
                time.sleep(0.01)
                continue
            acked = conn.execute(design.ack, ([r[0] for r in rows], worker)).fetchone()[0]
            t2 = time.monotonic()
            now = time.time()
            with sh.lock:
                sh.claims += 1
                sh.calls.append((t, t1 - t, "claim"))
                sh.calls.append((t1, t2 - t1, "ack"))
                sh.completed += acked
                sh.e2e.extend((t2, now - float(r[1])) for r in rows)


def maintainer(url: str, design: Any, sh: Shared, log: list[dict[str, Any]]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        while not sh.stop.is_set():
            t = time.monotonic()
            try:
                design.maintain(conn, log)
            except Exception as exc:  # noqa: BLE001 - a probe records and goes on
                sh.errors.append(f"maintain: {exc!r}"[:300])
            sh.stop.wait(max(0.0, design.tick - (time.monotonic() - t)))


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def explain_buffers(conn: psycopg.Connection, sql: str) -> int | None:
    conn.execute("BEGIN")
    try:
        lines = [r[0] for r in conn.execute(sql).fetchall()]
    finally:
        conn.execute("ROLLBACK")
    m = _BUFFERS.search(lines[1] if len(lines) > 1 else "")
    return None if m is None else int(m.group(1) or 0) + int(m.group(2) or 0)


def queue_stats(conn: psycopg.Connection, design: Any) -> dict[str, int]:
    row = conn.execute(design.sql("queue_stats"), (design.tables,)).fetchone()
    hist = conn.execute(design.sql("history_bytes"), (design.history,)).fetchone()[0]
    return {"dead": int(row[0] or 0), "bytes": int(row[1] or 0), "autovacuums": int(row[2] or 0),
            "ready_read": int(row[3]), "leased_read": int(row[4]), "history_bytes": int(hist or 0)}


def hold(url: str, mode: str, design: Any) -> psycopg.Connection | None:
    """The pinning session: none, a REPEATABLE READ snapshot on an unrelated table, or one
    that has also read the queue's meta table (so it holds ACCESS SHARE on it)."""
    if mode == "none":
        return None
    conn = psycopg.connect(url)
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute(design.sql("pin_bystander")).fetchone()
    if mode == "snapshot_read":
        conn.execute(design.sql("pin_queue")).fetchone()
    return conn


def run_design(url: str, design: Any, phases: list[tuple[str, float]], rate: float) -> dict[str, Any]:
    design.setup()
    sh = Shared()
    log: list[dict[str, Any]] = []
    threads = [threading.Thread(target=producer, args=(url, design, rate / 2, sh), daemon=True) for _ in range(2)]
    threads += [threading.Thread(target=consumer, args=(url, design, f"w{i}", sh), daemon=True) for i in range(2)]
    threads.append(threading.Thread(target=maintainer, args=(url, design, sh, log), daemon=True))
    samples: list[dict[str, Any]] = []
    side = psycopg.connect(url, autocommit=True)
    start = time.monotonic()
    for th in threads:
        th.start()
    prev = {"t": start, "enqueued": 0, "completed": 0, "claims": 0, **queue_stats(side, design)}
    try:
        for phase, seconds in phases:
            pin = hold(url, phase, design)
            phase_end = time.monotonic() + seconds
            while time.monotonic() < phase_end - 0.01:
                time.sleep(max(0.0, min(WINDOW, phase_end - time.monotonic())))
                now = time.monotonic()
                with sh.lock:
                    cur = {"t": now, "enqueued": sh.enqueued, "completed": sh.completed, "claims": sh.claims}
                    e2e = [s for t, s in sh.e2e if t > prev["t"]]
                    calls = [(t, d, k) for t, d, k in sh.calls if t > prev["t"]]
                cur.update(queue_stats(side, design))
                dt = now - prev["t"]
                claims = max(1, cur["claims"] - prev["claims"])
                sample = {
                    "phase": phase, "t": round(now - start, 1),
                    "completed_per_s": (cur["completed"] - prev["completed"]) / dt,
                    "enqueued_per_s": (cur["enqueued"] - prev["enqueued"]) / dt,
                    "backlog": cur["enqueued"] - cur["completed"],
                    "e2e_p50_ms": (pct(e2e, 0.5) or 0) * 1000, "e2e_p99_ms": (pct(e2e, 0.99) or 0) * 1000,
                    "claim_p99_ms": (pct([d for _, d, k in calls if k == "claim"], 0.99) or 0) * 1000,
                    "claim_max_ms": max([d for _, d, k in calls if k == "claim"], default=0) * 1000,
                    "enqueue_p99_ms": (pct([d for _, d, k in calls if k == "enqueue"], 0.99) or 0) * 1000,
                    "enqueue_max_ms": max([d for _, d, k in calls if k == "enqueue"], default=0) * 1000,
                    "ready_entries_per_claim": (cur["ready_read"] - prev["ready_read"]) / claims,
                    "leased_entries_per_claim": (cur["leased_read"] - prev["leased_read"]) / claims,
                    "buffers_per_dequeue10": explain_buffers(side, design.explain),
                    "dead_rows": cur["dead"], "bytes": cur["bytes"], "history_bytes": cur["history_bytes"],
                    "autovacuums": cur["autovacuums"] - prev["autovacuums"],
                    **({"rotation": design.state(side)} if isinstance(design, Rot) else {}),
                }
                if phase == "snapshot_read":
                    sample["blockers"] = [list(map(str, r)) for r in side.execute(design.sql("rotation_blockers"))]
                samples.append(sample)
                prev = cur
                print(f"{design.label:14} {phase:13} t={sample['t']:6.1f} done/s {sample['completed_per_s']:6.0f} "
                      f"backlog {sample['backlog']:6} e2e p99 {sample['e2e_p99_ms']:7.1f} ms "
                      f"ready/claim {sample['ready_entries_per_claim']:8.1f} leased/claim "
                      f"{sample['leased_entries_per_claim']:7.1f} buf {sample['buffers_per_dequeue10']} "
                      f"dead {sample['dead_rows']:7} MB {sample['bytes'] / 2**20:6.1f}"
                      + (f" epoch {sample['rotation']['cur']}/{sample['rotation']['sealed']}/"
                         f"{sample['rotation']['truncated']} cur_items {sample['rotation']['cur_items']}"
                         if "rotation" in sample else ""), flush=True)
            if pin is not None:
                pin.rollback()
                pin.close()
    finally:
        sh.stop.set()
        for th in threads:
            th.join(timeout=30)
        side.close()
        design.teardown()
    # the JSON keeps rotation steps; timeouts and archive passes as counts (stalls, archive_passes)
    archive = [e for e in log if e["what"] == "archive"]
    return {"design": design.label, "samples": samples, "stalls": stalls(sh.calls, log), "errors": sh.errors[:20],
            "log": [{**e, "t": e["t"] - start} for e in log if e["what"] not in ("archive", "truncate_timeout")],
            **({"archive_passes": {"count": len(archive), "rows": sum(e["rows"] for e in archive)}} if archive else {})}


def stalls(calls: list[tuple[float, float, str]], log: list[dict[str, Any]]) -> dict[str, Any]:
    """Client call latencies that overlapped a truncate (its lock wait and work) or a
    timed-out attempt, against all the others."""
    windows = [(e["t"], e["t"] + e["ms"] / 1000) for e in log if e["what"] in ("truncate", "truncate_timeout")]
    if not windows:
        return {}
    windows.sort()
    near: list[float] = []
    other: list[float] = []
    i = 0
    for t, d, _ in sorted(calls):
        while i < len(windows) and windows[i][1] < t:
            i += 1
        overlaps = any(ws <= t + d and t <= we for ws, we in windows[max(0, i - 1):i + 2])
        (near if overlaps else other).append(d * 1000)
    truncates = [e for e in log if e["what"] == "truncate"]
    return {"truncates": len(truncates),
            "timeouts": sum(1 for e in log if e["what"] == "truncate_timeout"),
            "lock_ms_median": statistics.median([e["lock_ms"] for e in truncates]) if truncates else None,
            "work_ms_median": statistics.median([e["work_ms"] for e in truncates]) if truncates else None,
            "work_ms_max": max([e["work_ms"] for e in truncates], default=None),
            "calls_overlapping": len(near), "overlapping_p50_ms": pct(near, 0.5), "overlapping_p99_ms": pct(near, 0.99),
            "overlapping_max_ms": max(near, default=None), "other_p50_ms": pct(other, 0.5),
            "other_p99_ms": pct(other, 0.99), "other_max_ms": max(other, default=None)}


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for run in runs:
        by_phase: dict[str, list[dict[str, Any]]] = {}
        for s in run["samples"][1:]:  # the first window includes the start
            by_phase.setdefault(s["phase"], []).append(s)
        row: dict[str, Any] = {"design": run["design"], "repeat": run.get("repeat")}
        for phase, ss in by_phase.items():
            row[phase] = {
                "completed_per_s": statistics.mean(s["completed_per_s"] for s in ss),
                "backlog_end": ss[-1]["backlog"],
                "e2e_p99_ms_median": statistics.median(s["e2e_p99_ms"] for s in ss),
                "ready_entries_per_claim_median": statistics.median(s["ready_entries_per_claim"] for s in ss),
                "ready_entries_per_claim_max": max(s["ready_entries_per_claim"] for s in ss),
                "buffers_per_dequeue10_median": statistics.median(s["buffers_per_dequeue10"] or 0 for s in ss),
                "buffers_per_dequeue10_max": max(s["buffers_per_dequeue10"] or 0 for s in ss),
                "dead_rows_end": ss[-1]["dead_rows"], "mb_max": max(s["bytes"] for s in ss) / 2**20,
                "mb_end": ss[-1]["bytes"] / 2**20}
        if "none" in row and "snapshot" in row:
            row["held_over_clean"] = row["snapshot"]["completed_per_s"] / row["none"]["completed_per_s"]
        rows.append(row)
    return rows


# --- the concurrency check ---------------------------------------------------------------

def check(url: str, engine: sa.Engine, total: int, slots: int, lock_timeout_ms: int) -> dict[str, Any]:
    design = Rot(engine, 300, slots, lock_timeout_ms)
    design.setup()
    q = design.sql
    pin = hold(url, "snapshot", design)
    stop = threading.Event()
    lock = threading.Lock()
    committed: list[int] = []
    acks: dict[int, int] = {}
    delivered_after_ack: list[int] = []
    outcomes: dict[str, int] = {}
    log: list[dict[str, Any]] = []
    errors: list[str] = []
    per_producer = total // 3

    def produce(seed: int) -> None:
        rnd = random.Random(seed)
        with psycopg.connect(url) as conn:
            done = 0
            while done < per_producer:
                n = rnd.choice((1, 1, 1, 5))
                hold_s = rnd.choice((0.2, 0.5, 1.0)) if rnd.random() < 0.03 else 0
                rollback = rnd.random() < 0.03
                ids = []
                for _ in range(n):
                    delay = rnd.choice((0, 0, 0, 0, 0, 0, 0, 0, 0.5, 2.0))
                    ids.append(conn.execute(q("check_enqueue"), (PAYLOAD, rnd.randint(0, 2), delay)).fetchone()[0])
                if hold_s:
                    time.sleep(hold_s)
                if rollback:
                    conn.rollback()
                    continue
                conn.commit()
                with lock:
                    committed.extend(ids)
                done += n

    def consume(worker: str, seed: int) -> None:
        rnd = random.Random(seed)
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.is_set():
                try:
                    if rnd.random() < 0.05:  # a claim that rolls back
                        with conn.transaction(force_rollback=True):
                            conn.execute(q("check_dequeue"), (worker,)).fetchall()
                        with lock:
                            outcomes["claim_rolled_back"] = outcomes.get("claim_rolled_back", 0) + 1
                        continue
                    rows = conn.execute(q("check_dequeue"), (worker,)).fetchall()
                except psycopg.Error as exc:
                    errors.append(f"claim: {exc!r}"[:300])
                    continue
                if not rows:
                    time.sleep(0.02)
                    continue
                ids = [r[0] for r in rows]
                with lock:
                    delivered_after_ack.extend(i for i in ids if i in acks)
                for i in ids:
                    r = rnd.random()
                    try:
                        if r < 0.80:
                            n = conn.execute(q("load_ack"), ([i], worker)).fetchone()[0]
                            what = "ack" if n else "ack_lost_lease"
                            if n:
                                with lock:
                                    acks[i] = acks.get(i, 0) + 1
                        elif r < 0.87:
                            conn.execute(q("check_nack"), ([i], worker))
                            what = "nack"
                        elif r < 0.92:
                            conn.execute(q("check_release"), ([i], worker))
                            what = "release"
                        else:
                            what = "dropped"  # the lease expires (2 s), another claim takes it
                    except psycopg.Error as exc:
                        errors.append(f"{exc!r}"[:300])
                        what = "error"
                    with lock:
                        outcomes[what] = outcomes.get(what, 0) + 1

    def rotate() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.is_set():
                try:
                    rotate_once(conn, q, 300, 3600, lock_timeout_ms, log)
                except psycopg.Error as exc:
                    errors.append(f"rotate: {exc!r}"[:300])
                stop.wait(0.2)

    t0 = time.monotonic()
    producers = [threading.Thread(target=produce, args=(i,)) for i in range(3)]
    others = [threading.Thread(target=consume, args=(f"c{i}", 100 + i)) for i in range(3)]
    others.append(threading.Thread(target=rotate))
    for th in producers + others:
        th.start()
    late: psycopg.Connection | None = None  # a snapshot taken mid-run, see old_snapshot_view()
    late_seen = 0
    for th in producers:
        while th.is_alive():
            th.join(timeout=10)
            print(f"check: {len(committed):,} committed, outcomes {outcomes}", flush=True)
            if late is None and len(committed) > total // 3:
                late = hold(url, "snapshot", design)
                assert late is not None
                late_seen = sum(late.execute(q("check_seen")).fetchone())
                late.rollback()  # that read took ACCESS SHARE on every slot: start again without it
                late.close()
                late = hold(url, "snapshot", design)
                late_ids = len(committed)
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() - t0 < 600:
            if conn.execute(q("check_unfinished")).fetchone()[0] == 0:
                break
            time.sleep(0.5)
        time.sleep(1.0)
        stop.set()
        for th in others:
            th.join()
        seen = [r[0] for r in conn.execute(q("check_ids"))]
        unfinished = conn.execute(q("check_unfinished")).fetchone()[0]
        by_status = dict(conn.execute(q("check_by_status")).fetchall())
        data_missing = conn.execute(q("check_data_missing")).fetchone()[0]
        st = conn.execute(q("rot_state")).fetchone()
    counts: dict[int, int] = {}
    for i in seen:
        counts[i] = counts.get(i, 0) + 1
    want = set(committed)
    result = {
        "items_committed": len(committed), "seconds": time.monotonic() - t0,
        "lost": len(want - set(counts)), "duplicated": sum(1 for c in counts.values() if c > 1),
        "unexpected": len(set(counts) - want), "unfinished": unfinished, "data_missing": data_missing,
        "acked_twice": sum(1 for c in acks.values() if c > 1), "delivered_after_ack": len(delivered_after_ack),
        "by_status": {str(k): v for k, v in by_status.items()}, "outcomes": outcomes,
        "rotations": {"switches": sum(1 for e in log if e["what"] == "switch"),
                      "seals": sum(1 for e in log if e["what"] == "seal"),
                      "moved_at_seal": sum(e.get("moved", 0) for e in log if e["what"] == "seal"),
                      "truncates": sum(1 for e in log if e["what"] == "truncate"),
                      "moved_at_truncate": sum(e.get("moved", 0) for e in log if e["what"] == "truncate"),
                      "truncate_timeouts": sum(1 for e in log if e["what"] == "truncate_timeout")},
        "final_state": list(st), "errors": errors[:20],
    }
    result["old_snapshot"] = old_snapshot_view(url, design, pin)
    if late is not None:
        result["mid_run_snapshot"] = {"ids_committed_when_taken": late_ids,
                                      "meta_plus_history_seen_by_a_like_snapshot_then": late_seen,
                                      **old_snapshot_view(url, design, late)}
    design.teardown()
    print(result, flush=True)
    return result


def old_snapshot_view(url: str, design: Rot, pin: psycopg.Connection | None) -> dict[str, Any]:
    """What a REPEATABLE READ snapshot taken before the check (it read only an unrelated
    table) sees of the queue now that its early epochs were truncated, against a new one."""
    sql = design.sql("check_seen")
    out: dict[str, Any] = {}
    if pin is not None:
        out["old_snapshot_meta_history"] = list(pin.execute(sql).fetchone())
        pin.rollback()
        pin.close()
    with psycopg.connect(url, autocommit=True) as conn:
        out["new_snapshot_meta_history"] = list(conn.execute(sql).fetchone())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="database URL (default: the embedded server)")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each window (clean, held)")
    parser.add_argument("--held-seconds", type=float, default=None, help="length of the held window (default: --seconds)")
    parser.add_argument("--rate", type=float, default=800.0, help="offered messages/s, both producers together")
    parser.add_argument("--periods", default="2000,10000", help="rotation periods (items per epoch), comma-separated")
    parser.add_argument("--slots", type=int, default=3, help="generation slots (partitions) per rotated queue")
    parser.add_argument("--lock-timeout-ms", type=int, default=50, help="the truncate's lock_timeout")
    parser.add_argument("--repeats", type=int, default=1, help="rounds; each runs every design once, order reversed every other round")
    parser.add_argument("--held-read", type=float, default=0.0,
                        help="seconds of a third window for rotated designs: the pinning session has read the queue")
    parser.add_argument("--designs", default="rel,rot", help="rel, rot or both")
    parser.add_argument("--check", type=int, default=0, help="run the concurrency check with this many items instead")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    engine = make_engine(args.url)
    url = conninfo(engine)
    print(f"rotation probe on {mask_url(engine.url)}", flush=True)
    with psycopg.connect(url, autocommit=True) as conn:
        by = {"by": quote_ident(BYSTANDER)}
        conn.execute(lab_sql("rotation", "bystander", by))
        server = dict(conn.execute(lab_sql("rotation", "server_settings", by)).fetchall())
    result: dict[str, Any] = {"args": vars(args), "server": server}
    if args.check:
        result["check"] = check(url, engine, args.check, args.slots, args.lock_timeout_ms)
    else:
        designs: list[Any] = []
        if "rel" in args.designs:
            designs.append(Rel(engine))
        if "rot" in args.designs:
            designs += [Rot(engine, int(p), args.slots, args.lock_timeout_ms) for p in args.periods.split(",") if p]
        runs = []
        for rep in range(args.repeats):
            for design in (designs if rep % 2 == 0 else designs[::-1]):
                phases = [("none", args.seconds), ("snapshot", args.held_seconds or args.seconds)]
                if args.held_read and isinstance(design, Rot):
                    phases.append(("snapshot_read", args.held_read))
                run = run_design(url, design, phases, args.rate)
                run["repeat"] = rep
                runs.append(run)
        result["runs"] = runs
        result["summary"] = summarize(runs)
        for row in result["summary"]:
            print(row, flush=True)
    engine.dispose()
    write_json(args.json_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
