"""Scenario `sustained`: each kind at a fixed offered rate, clean and with the xmin horizon pinned.

Producers offer a fixed rate (paced: each sends a batch when its schedule says so, never
faster; one that falls behind sends at once and records how late it was), consumers
dequeue a batch and ack it where the kind has an ack, through the same bench drivers as
the other scenarios. Every message carries the time of its enqueue call, so end-to-end
latency (enqueue -> ack) is known per message.

A run holds, in its own session, opened once the workers have warmed up and kept for the
whole measured window:
- none: nothing (the clean run);
- snapshot: BEGIN ISOLATION LEVEL REPEATABLE READ and a read of an unrelated table (the
  bystander): the snapshot is taken, no lock is held on the queue's tables;
- idle-in-transaction: BEGIN; SELECT txid_current(), then idle: an xid held back.
Either way no row version the queue leaves behind after the hold began can be removed
until the window ends. `both` runs a clean run, then a snapshot run, kind by kind.

Every --interval seconds: completed/s, offered/s, backlog (the kind's ready count), the
p50/p99 latency of messages completed in the interval, dead row versions and total size
(tables, indexes, TOAST) summed over all the queue's tables but history, autovacuum runs on them,
producers' refusals (a full ring's QueueFullError), and the latency of a range query on
an unrelated 1M-row table run by another thread (the bystander).

Without --rate, each kind first runs a short full-speed full cycle (the existing cycle
with its backlog limit), and the offered rate is half of the slowest kind's maximum, so
every kind can sustain it when nothing is held: one offered rate for every kind.
"""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from queuectl.bench.core import BenchRun, _ms, percentile, ratio, scenario, stat
from queuectl.bench.drivers import bench_sql, driver_for
from queuectl.bench.paced import PacedSpec, paced_worker
from queuectl.errors import UsageError
from queuectl.names import QUEUE_OBJECT_SUFFIXES, QueueNames, quote_ident
from queuectl.sqlfiles import split_statements

CALIBRATION_SECONDS = 5.0
HELD_MODE_OF_BOTH = "snapshot"
BYSTANDER_SCHEMA = "queuectl_bystander"
BYSTANDER_TABLE = "accounts"
BYSTANDER_PAUSE_SECONDS = 0.2  # between two bystander queries
# Targets: the reliable queue keeps its rate while the horizon is pinned; every other kind
# is reported, and one below 0.8x of its clean rate is flagged.
RELIABLE_HELD_OVER_CLEAN = 0.95
OTHER_HELD_OVER_CLEAN = 0.80
RELIABLE_P99_HELD_OVER_CLEAN = 2.0
# "no growth trend": over the last half of a held run the backlog grows by less than 1% of
# the offered messages per minute (a flat backlog's fit wobbles by a few messages a minute)
BACKLOG_TREND_SHARE = 0.01
SERIES_FIELDS = ("t", "completed_per_s", "offered_per_s", "enqueued_per_s", "refused", "producer_lag_ms", "backlog",
                 "latency_p50_ms", "latency_p99_ms", "dead_rows", "total_bytes", "autovacuum_runs", "bystander_ms")


def holds_for(hold: str) -> list[str]:
    """The runs of one kind: both, a clean one and a snapshot one; all, a clean one and one
    with each hold."""
    if hold == "all":
        return ["none", "snapshot", "idle-in-transaction"]
    return ["none", HELD_MODE_OF_BOTH] if hold == "both" else [hold]


def queue_name(kind: str) -> str:
    return f"sustained_{kind}"


# -- the bystander, the holder and the sampler ------------------------------------------------


def bystander_values() -> dict[str, str | int]:
    return {"bystander_schema": quote_ident(BYSTANDER_SCHEMA),
            "bystander": f"{quote_ident(BYSTANDER_SCHEMA)}.{quote_ident(BYSTANDER_TABLE)}"}


def ensure_bystander(run: BenchRun) -> int:
    """Create and fill the bystander table unless an earlier run left it whole; its rows."""
    values = bystander_values()
    sql = {name: split_statements(bench_sql(name, values)) for name in ("bystander_create", "bystander_fill")}
    with run.engine.begin() as conn:
        for statement in sql["bystander_create"]:
            conn.exec_driver_sql(statement)
        rows = run.options.bystander_rows
        if int(conn.execute(sa.text(bench_sql("bystander_rows", values))).scalar_one()) == rows:
            return rows
        conn.execute(sa.text(bench_sql("bystander_drop", values)))
        for statement in sql["bystander_create"]:
            conn.exec_driver_sql(statement)
        for statement in sql["bystander_fill"]:
            conn.execute(sa.text(statement), {"rows": rows})
    with run.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(bench_sql("bystander_analyze", values)))
    return rows


class Bystander(threading.Thread):
    """Times the bystander's range query again and again until stopped: (start, ms) pairs."""

    def __init__(self, run: BenchRun) -> None:
        super().__init__(daemon=True)
        self.run_ = run
        self.stopped = threading.Event()
        self.timings: list[tuple[float, float]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        stmt = sa.text(bench_sql("bystander_query", bystander_values()))
        rng = random.Random(7)
        try:
            with self.run_.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                while not self.stopped.is_set():
                    started = time.time()
                    t = time.perf_counter()
                    conn.execute(stmt, {"low": rng.randrange(1, self.run_.options.bystander_rows - 10_000)}).scalar_one()
                    self.timings.append((started, (time.perf_counter() - t) * 1000.0))
                    self.stopped.wait(BYSTANDER_PAUSE_SECONDS)
        except BaseException as exc:  # seen by the parent when it joins
            self.error = exc


@contextmanager
def holding(run: BenchRun, mode: str) -> Iterator[Connection | None]:
    """A session holding the horizon back as `mode` says, for the duration of the block."""
    if mode == "none":
        yield None
        return
    values = bystander_values()
    isolation = "REPEATABLE READ" if mode == "snapshot" else "READ COMMITTED"
    conn = run.engine.connect().execution_options(isolation_level=isolation)
    try:
        conn.begin()
        conn.execute(sa.text(bench_sql("hold_snapshot" if mode == "snapshot" else "hold_xid", values))).scalar_one()
        yield conn
    finally:
        conn.rollback()
        conn.close()


def horizon(run: BenchRun, holder: Connection) -> dict[str, Any]:
    """What the holder holds back, read from another session, and the next xid there."""
    pid = holder.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
    with run.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        row = conn.execute(sa.text(bench_sql("holder_horizon", {})), {"pid": pid}).one()
        next_xid = conn.execute(sa.text(bench_sql("next_xid", {}))).scalar_one()
    return {"pid": pid, "horizon": row.horizon, "age": int(row.age), "next_xid": next_xid}


class Sampler(threading.Thread):
    """One sample of the subject's tables at t_go + k * interval, k = 0 .. count."""

    def __init__(self, run: BenchRun, names: QueueNames, subject: Any, interval: float, count: int) -> None:
        super().__init__(daemon=True)
        self.run_, self.names, self.subject = run, names, subject
        self.interval, self.count = interval, count
        self.t_go: float | None = None
        self.started = threading.Event()
        self.cancelled = threading.Event()
        self.samples: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def go(self, t_go: float) -> None:
        self.t_go = t_go
        self.started.set()

    def cancel(self) -> None:
        """The run failed: take no (more) samples."""
        self.cancelled.set()
        self.started.set()

    def sample(self, conn: Connection) -> dict[str, Any]:
        row = conn.execute(sa.text(bench_sql("sustained_tables", {})),
                           {"schema": self.subject.schema, "tables": list(self.subject.tables)}).one()
        return {"backlog": self.subject.waiting(conn, self.names), "dead_rows": int(row.dead_rows),
                "total_bytes": int(row.total_bytes),
                "autovacuum_runs": int(row.autovacuum_runs)}

    def run(self) -> None:
        try:
            self.started.wait()
            if self.cancelled.is_set() or self.t_go is None:
                return
            with self.run_.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                for k in range(self.count + 1):
                    if self.cancelled.wait(max(0.0, self.t_go + k * self.interval - time.time())):
                        return
                    self.samples.append({"k": k, **self.sample(conn)})
        except BaseException as exc:  # seen by the parent when it joins
            self.error = exc


# -- one run ------------------------------------------------------------------------------------


class Upkeep(threading.Thread):
    """The upkeep job beside the load, for the kinds it serves, as a scheduler keeps it running:
    continuous, with the job's defaults. A reliable queue: the archive job (its row batches and,
    since reliable_0012, the rotation of its generations); a ring or a DELETE-drained kind: the
    compact job (new files holding only the live rows once the dead versions outnumber them),
    whose lock time per compaction is the stall it causes the pushes and pops."""

    def __init__(self, run: BenchRun, names: QueueNames, kind: str, archive_config: Any = None) -> None:
        super().__init__(name=f"upkeep {names.queue}", daemon=True)
        self.bench, self.names, self.kind = run, names, kind
        self.archive_config = archive_config  # an ArchiveConfig; None: the job's defaults
        self.stopped = threading.Event()
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None

    @contextmanager
    def beside(self) -> Iterator["Upkeep"]:
        """Run the job for the duration of the block: started on entry, stopped and joined on
        exit; its error, if it failed, is raised once the block has ended without one."""
        self.start()
        try:
            yield self
        finally:
            self.stopped.set()
            self.join()
        if self.error is not None:
            raise self.error

    @staticmethod
    def serves(kind: str) -> bool:
        from queuectl.jobs import archive, compact

        return kind in archive.KINDS or kind in compact.KINDS

    def run(self) -> None:
        from queuectl.jobs import archive, compact

        cpu = time.thread_time()  # the job's own CPU in this process (its statements' share is the server's)
        try:
            if self.kind in archive.KINDS:
                done = archive.run_continuous(self.bench.engine, self.names.queue,
                                              self.archive_config or archive.ArchiveConfig(),
                                              schema=self.names.schema, stop=self.stopped)
                self.result = {"job": "archive", "rows": done.rows, "generations_emptied": done.rotations,
                               "errors": done.errors, "last_error": done.last_error, "rounds": done.batches,
                               "cpu_seconds": round(time.thread_time() - cpu, 3)}
                return
            result = compact.run_continuous(self.bench.engine, self.names.queue, compact.CompactConfig(),
                                            schema=self.names.schema, stop=self.stopped)
            locks = sorted(result.lock_seconds)
            self.result = {"job": "compact", "cpu_seconds": round(time.thread_time() - cpu, 3),
                           "compactions": result.compactions, "rows": result.rows,
                           "lock_ms_p50": round(locks[len(locks) // 2] * 1000, 2) if locks else None,
                           "lock_ms_max": round(locks[-1] * 1000, 2) if locks else None,
                           "lock_ms": [round(x * 1000, 2) for x in result.lock_seconds],
                           "lock_waits_given_up": result.waits, "blocked": result.blocked,
                           "skipped": result.skipped, "errors": result.errors, "last_error": result.last_error}
        except BaseException as exc:  # reported by measure()
            self.error = exc


def installed_kind(run: BenchRun, names: QueueNames) -> str:
    from queuectl.registry import get_queue

    with run.engine.connect() as conn:
        info = get_queue(conn, names.queue, names.schema)
    assert info is not None, f"bench queue {names.queue} is not installed"
    return info.kind


def left_in_queue(run: BenchRun, names: QueueNames, kind: str) -> int:
    """Messages not completed: waiting, scheduled or claimed but not acked."""
    from queuectl.stats import queue_counts

    with run.engine.connect() as conn:
        counts = queue_counts(conn, names.queue, kind, names.schema)
    return counts["ready"] + counts["scheduled"] + counts["processing"]


class KindSubject:
    """A queuectl kind as measure() runs it, through its bench driver. The peers
    (queuectl.bench.sustained_peers) answer the same calls: install / uninstall, the kind (a
    peer's own name, which no upkeep job serves), the tables to sample (in `schema`), the
    backlog (`waiting`), what a run `left`, the process target of the paced workers and the
    most consumer processes it runs (None: --consumers)."""

    label: str | None = None  # a peer's name and version; a kind is reported as "queuectl <kind>"
    max_consumers = None
    paced_target = staticmethod(paced_worker)

    def __init__(self, driver: str) -> None:
        self.driver = driver
        self.kind = ""
        self.schema = ""
        self.tables: list[str] = []

    def install(self, run: BenchRun, names: QueueNames) -> None:
        driver_for(self.driver).install(run.engine, names)
        self.kind, self.schema = installed_kind(run, names), names.schema
        # the queue's own tables (those that are tables are found); the reliable kind's history,
        # which the archive job beside the load fills, is the archive, bounded by retention
        self.tables = [names.table(s) for s in QUEUE_OBJECT_SUFFIXES[self.kind] if not s.startswith("history")]

    def uninstall(self, run: BenchRun, names: QueueNames) -> None:
        driver_for(self.driver).uninstall(run.engine, names)

    def waiting(self, conn: Connection, names: QueueNames) -> int:
        from queuectl.stats import queue_counts

        own = getattr(driver_for(self.driver), "waiting", None)  # a fan-out ring: its subscription's lag
        if own is not None:
            return int(own(conn.engine, names))
        return int(queue_counts(conn, names.queue, self.kind, names.schema)["ready"])

    def left(self, run: BenchRun, names: QueueNames) -> int:
        own = getattr(driver_for(self.driver), "waiting", None)
        if own is not None:
            return int(own(run.engine, names))
        return left_in_queue(run, names, self.kind)


def measure(run: BenchRun, driver: str, hold: str, rate: float) -> dict[str, Any]:
    """One run of a kind (or a peer, sustained_peers) at `rate` msgs/s for the window, `hold`
    held; a fresh queue."""
    from queuectl.bench.sustained_peers import peer_for

    o = run.options
    names = run.names(queue_name(driver))
    subject = peer_for(driver) or KindSubject(driver)
    subject.install(run, names)
    count = max(1, math.ceil(o.minutes * 60.0 / o.interval))
    seconds = count * o.interval
    common = dict(driver=driver, url=run.url, queue=names.queue, schema=names.schema, batch=o.batch,
                  payload_bytes=o.payload_bytes)
    specs = [PacedSpec(role="producer", seed=1000 + i, rate=rate / o.producers, phase=i / o.producers, **common)
             for i in range(o.producers)]
    consumers = min(o.consumers, subject.max_consumers or o.consumers)
    specs += [PacedSpec(role="consumer", seed=2000 + i, **common) for i in range(consumers)]
    sampler = Sampler(run, names, subject, o.interval, count)
    bystander = Bystander(run)
    upkeep = Upkeep(run, names, subject.kind) if run.options.upkeep and Upkeep.serves(subject.kind) else None
    held: dict[str, Any] = {}
    holder_facts: dict[str, Any] | None = None
    sampler.start()
    try:
        with ExitStack() as stack:

            def on_go(t_go: float) -> None:
                """Once every worker has warmed up: the hold begins, then the sampling."""
                holder = stack.enter_context(holding(run, hold))
                if holder is not None:
                    held.update(conn=holder, start=horizon(run, holder))
                sampler.go(t_go)
                bystander.start()
                if upkeep is not None:
                    upkeep.start()

            try:
                t_go, reports = run.run_workers(subject.paced_target, specs, seconds, mode=f"sustained {driver}",
                                                on_go=on_go)
            except BaseException:
                sampler.cancel()
                raise
            finally:
                bystander.stopped.set()
                if bystander.is_alive():
                    bystander.join()
                if upkeep is not None and upkeep.is_alive():
                    upkeep.stopped.set()
                    upkeep.join()
                sampler.join()
            if held:
                start, end = held["start"], horizon(run, held["conn"])
                holder_facts = {"mode": hold, "pid": start["pid"], "horizon_start": start["horizon"],
                                "horizon_end": end["horizon"], "age_start": start["age"], "age_end": end["age"],
                                "next_xid_start": start["next_xid"], "next_xid_end": end["next_xid"]}
        for thread in (sampler, bystander, upkeep):
            if thread is not None and thread.error is not None:
                raise thread.error
        left = subject.left(run, names)
    finally:
        subject.uninstall(run, names)
    result = summarise(kind=driver, hold=hold, rate=rate, interval=o.interval, count=count, t_go=t_go,
                       reports=reports, samples=sampler.samples, bystander=bystander.timings, left=left,
                       holder=holder_facts)
    result["upkeep"] = upkeep.result if upkeep is not None else None
    if subject.label is not None:
        result["peer"] = {"label": subject.label, "consumers": consumers}
    return result


def summarise(*, kind: str, hold: str, rate: float, interval: float, count: int, t_go: float,
              reports: list[dict[str, Any]], samples: list[dict[str, Any]], bystander: list[tuple[float, float]],
              left: int, holder: dict[str, Any] | None) -> dict[str, Any]:
    """The per-interval series and the run's summary from the workers' records and the samples."""
    producers = [r for r in reports if r["role"] == "producer"]
    consumers = [r for r in reports if r["role"] == "consumer"]

    def bucket(t: float) -> int | None:
        k = int((t - t_go) // interval)
        return k if 0 <= k < count else None

    # latencies (s) of the messages offered in the window and completed in each interval; a
    # warm-up message (sent before the window, no send time) is in the ledger only
    done: list[list[float]] = [[] for _ in range(count)]
    offered, accepted, lag = [0] * count, [0] * count, [0.0] * count
    for r in consumers:
        for t, lat in zip(r["done"], r["latency"]):
            k = bucket(t)
            if k is not None and not math.isnan(lat):
                done[k].append(lat)
    for r in producers:
        for due, sent, ok in zip(r["due"], r["sent"], r["accepted"]):
            k = bucket(sent)
            if k is not None:
                offered[k] += r["batch"]
                accepted[k] += ok
                lag[k] = max(lag[k], sent - due)
    by_k = {s["k"]: s for s in samples}
    queries: list[list[float]] = [[] for _ in range(count)]
    for started, ms in bystander:
        k = bucket(started)
        if k is not None:
            queries[k].append(ms)
    series = []
    for k in range(count):
        lats = sorted(done[k])
        now, before = by_k.get(k + 1), by_k.get(k)
        series.append({
            "t": round((k + 1) * interval, 3),
            "completed_per_s": len(done[k]) / interval,
            "offered_per_s": offered[k] / interval,
            "enqueued_per_s": accepted[k] / interval,
            "refused": offered[k] - accepted[k],
            "producer_lag_ms": lag[k] * 1000.0,
            "backlog": now["backlog"] if now else None,
            "latency_p50_ms": _ms(percentile(lats, 0.50)),
            "latency_p99_ms": _ms(percentile(lats, 0.99)),
            "dead_rows": now["dead_rows"] if now else None,
            "total_bytes": now["total_bytes"] if now else None,
            "autovacuum_runs": (now["autovacuum_runs"] - before["autovacuum_runs"]) if now and before else None,
            "bystander_ms": statistics.median(queries[k]) if queries[k] else None,
        })
    window = count * interval
    all_lats = sorted(x for d in done for x in d)
    all_queries = sorted(ms for q in queries for ms in q)
    first, last = by_k.get(0), by_k.get(count)
    enqueued = sum(r["warmup_count"] + sum(r["accepted"]) for r in producers)
    completed = sum(r["warmup_count"] + len(r["done"]) for r in consumers)
    summary = {
        "completed_per_s": sum(len(d) for d in done) / window,
        "offered_per_s": sum(offered) / window,
        "backlog_slope_per_min": backlog_slope(series, window),
        "backlog_end": last["backlog"] if last else None,
        "latency_p50_ms": _ms(percentile(all_lats, 0.50)),
        "latency_p99_ms": _ms(percentile(all_lats, 0.99)),
        "dead_rows_end": last["dead_rows"] if last else None,
        "total_bytes_start": first["total_bytes"] if first else None,
        "total_bytes_end": last["total_bytes"] if last else None,
        "autovacuum_runs": (last["autovacuum_runs"] - first["autovacuum_runs"]) if first and last else None,
        "refused": sum(offered) - sum(accepted),
        "producer_lag_max_ms": max(lag) * 1000.0,
        "bystander_p50_ms": percentile(all_queries, 0.50),
        "bystander_p99_ms": percentile(all_queries, 0.99),
    }
    return {
        "kind": kind, "hold": hold, "offered_rate": rate, "seconds": window, "interval": interval,
        "series": series, "summary": summary, "holder": holder,
        "ledger": {"enqueued": enqueued, "completed": completed, "left": left, "lost": enqueued - completed - left},
    }


def backlog_slope(series: list[dict[str, Any]], window: float) -> float | None:
    """Least-squares slope of the backlog over the last half of the window, messages/minute."""
    points = [(s["t"] / 60.0, s["backlog"]) for s in series if s["t"] >= window / 2 and s["backlog"] is not None]
    if len(points) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else None


# -- the scenario ------------------------------------------------------------------------------


def calibrate(run: BenchRun, driver: str) -> float:
    """The kind's full-speed full cycle (producers pause above --backlog), msgs/s."""
    o = run.options
    names = run.names(queue_name(driver))
    driver_for(driver).install(run.engine, names)
    try:
        res = run.python_phase(driver, names, "cycle", batch=o.batch, payload_bytes=o.payload_bytes,
                               producers=o.producers, consumers=o.consumers,
                               seconds=min(CALIBRATION_SECONDS, max(1.0, o.minutes * 60.0)))
    finally:
        driver_for(driver).uninstall(run.engine, names)
    return float(res["rate"])


def plots_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


@scenario("sustained", "each --kind at a fixed offered rate for --minutes, clean and with the horizon held (--hold)",
          ("kinds", "producers", "consumers", "batch", "payload_bytes", "minutes", "hold", "rate", "interval", "plots",
           "backlog", "bystander_rows", "upkeep"))
def sustained(run: BenchRun) -> dict[str, Any]:
    from queuectl.bench.sustained_peers import peer_for

    o = run.options
    if o.plots and not plots_available():
        raise UsageError("the sustained scenario's plots need matplotlib: pip install 'queuectl[bench]'")
    holds = holds_for(o.hold)
    calibration: dict[str, float] = {}
    runs: list[dict[str, Any]] = []
    unavailable: list[dict[str, str]] = []
    ours = [k for k in o.kinds if peer_for(k) is None]
    for kind in ours:
        driver_for(kind)  # an unknown kind fails here, before any run
    kinds = list(ours)
    for kind in o.kinds:
        peer = peer_for(kind)
        if peer is not None:
            reason = peer.unavailable(run)
            if reason is None:
                kinds.append(kind)
            else:
                unavailable.append({"subject": peer.label, "reason": reason})
    steps = (0 if o.rate else len(ours)) + len(kinds) * len(holds) + 1
    with run.reporter.scenario("sustained", steps) as rep:
        rep.step(f"bystander table ({o.bystander_rows:,} rows)")
        bystander_rows = ensure_bystander(run)
        rep.done()
        if o.rate is None:
            for kind in ours:
                rep.step(f"calibration: {kind} at full speed")
                calibration[kind] = calibrate(run, kind)
                rep.note(f"{kind}: clean maximum {calibration[kind]:,.0f} msgs/s")
                rep.done()
            rate = max(1.0, round(min(calibration.values()) / 2))
            rep.note(f"offered rate: {rate:,.0f} msgs/s (half the slowest kind's clean maximum)")
        else:
            rate = float(o.rate)
        for kind in kinds:
            for hold in holds:
                rep.step(f"{kind}, hold {hold}, {rate:,.0f} msgs/s offered")
                runs.append(measure(run, kind, hold, rate))
                rep.done()
    for r in runs:
        r["summary"]["held_over_clean"] = held_over_clean(r, runs)
    plots: dict[str, str] = {}
    if o.plots:
        from queuectl.bench.sustained_plots import plot_kind

        for kind in kinds:
            path = Path(f"{o.plots}-{kind}.png")
            plot_kind(path, kind, [r for r in runs if r["kind"] == kind], rate)
            plots[kind] = str(path)
    rows = [row_of(r, runs, calibration) for r in runs]
    notes = [
        f"offered rate {rate:,.0f} msgs/s across {o.producers} producers ("
        + ("given with --rate)" if o.rate else
           "half the slowest kind's clean maximum; calibration, full speed for "
           f"{min(CALIBRATION_SECONDS, o.minutes * 60):g} s per kind: "
           + ", ".join(f"{k} {v:,.0f}" for k, v in calibration.items()) + " msgs/s)"),
        f"{o.consumers} consumers dequeue({o.batch}) and ack where the kind has an ack; latency is from the "
        "producer's clock at its enqueue call to the consumer's after its ack (or destructive dequeue)",
        "hold snapshot: REPEATABLE READ and a read of an unrelated table, opened after the workers warmed up and "
        "held for the whole window; idle-in-transaction: BEGIN; SELECT txid_current(), then idle",
        f"sampled every {o.interval:g} s: backlog = the kind's ready count; dead rows, size (tables, indexes, "
        "TOAST) and autovacuum runs summed over all the queue's tables but history (the archive job's, beside the "
        "load for the reliable kind); backlog/min = least-squares slope of the "
        "backlog over the last half of the window",
        f"bystander: a sum over 10,000 primary-key rows of a {bystander_rows:,}-row table in schema "
        f"{BYSTANDER_SCHEMA}, run by another thread every {BYSTANDER_PAUSE_SECONDS:g} s; its median per interval",
        ("upkeep: each kind's job beside its load, continuous, with its defaults (reliable: archive, which rotates "
         "the generations; ring and the one-table kinds: compact)" if o.upkeep else
         "upkeep: none (--no-upkeep): no archive or compact job ran beside the load"),
    ]
    if any(peer_for(k) is not None for k in kinds):
        notes.append("peers (queuectl.bench.sustained_peers): the same paced producers, hold, sampler and bystander "
                     "in the same database, through each peer's own API; PgQ: pgq.insert_event per message, one "
                     "consumer process (a PgQ batch goes to one consumer) on next_batch / get_batch_events / "
                     "finish_batch, pgqd ticking with Debian's defaults; PgQueuer: Queries.enqueue, QueueManager "
                     "consumers counting a job when its handler runs; pg-boss (Node): insert() of a batch, work() "
                     "with batchSize --batch on a queue created with notify (its LISTEN/NOTIFY delivery), counting "
                     "a job when its handler runs, its other settings its defaults; backlog = events not yet "
                     "finished (PgQ), jobs not yet picked (PgQueuer), jobs created or waiting for a retry "
                     "(pg-boss); sizes and dead rows over the peer's own tables")
    if not o.plots:
        unavailable.append({"subject": "plots", "reason": "no --plots or --json file to put them beside"})
    return {
        "name": "sustained",
        "description": "a fixed offered rate per kind, clean and with the xmin horizon held",
        "notes": notes,
        "ceilings": [],
        "rows": rows,
        "targets": targets(runs),
        "unavailable": unavailable,
        "sustained": {
            "offered_rate": rate, "rate_source": "given" if o.rate else "calibrated", "calibration": calibration,
            "interval": o.interval, "holds": holds, "bystander_rows": bystander_rows, "upkeep": o.upkeep, "runs": runs,
            "plots": plots,
        },
    }


def clean_of(run: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((r for r in runs if r["kind"] == run["kind"] and r["hold"] == "none"), None)


def held_over_clean(run: dict[str, Any], runs: list[dict[str, Any]]) -> float | None:
    clean = clean_of(run, runs)
    if run["hold"] == "none" or clean is None:
        return None
    return ratio(run["summary"]["completed_per_s"], clean["summary"]["completed_per_s"])


def row_of(r: dict[str, Any], runs: list[dict[str, Any]], calibration: dict[str, float]) -> dict[str, Any]:
    s = r["summary"]
    cal = calibration.get(r["kind"])
    metrics = {key: stat([s[key]]) for key in (
        "offered_per_s", "backlog_slope_per_min", "backlog_end", "dead_rows_end", "total_bytes_start",
        "total_bytes_end", "autovacuum_runs", "refused", "producer_lag_max_ms", "bystander_p50_ms", "bystander_p99_ms")}
    metrics["held_over_clean"] = stat([s["held_over_clean"]])
    metrics["lost"] = stat([r["ledger"]["lost"]])
    peer = r.get("peer")
    return {
        "subject": peer["label"] if peer else f"queuectl {r['kind']}",
        "phase": f"sustained, hold {r['hold']}",
        "params": {"kind": r["kind"], "hold": r["hold"], "offered_rate": r["offered_rate"], "seconds": r["seconds"]},
        "rate": stat([s["completed_per_s"]]),
        "ceiling": None if cal is None else {"name": "clean maximum (full-speed calibration)", "rate": stat([cal])},
        "fraction_of_ceiling": None if cal is None else stat([ratio(s["completed_per_s"], cal)]),
        "latency_ms": {"p50": stat([s["latency_p50_ms"]]), "p99": stat([s["latency_p99_ms"]])},
        "metrics": metrics,
    }


def targets(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    ours = [r for r in runs if "peer" not in r]  # peers are reported, not held to queuectl's targets
    for r in ours:
        value = r["summary"]["held_over_clean"]
        if value is None:
            continue
        goal = RELIABLE_HELD_OVER_CLEAN if r["kind"] == "reliable" else OTHER_HELD_OVER_CLEAN
        out.append({"name": f"{r['kind']}: completed/s with the horizon held ({r['hold']}) / clean",
                    "value": value, "threshold": goal, "met": value >= goal})
        if r["kind"] != "reliable":
            continue
        growth = ratio(r["summary"]["backlog_slope_per_min"], r["offered_rate"] * 60.0)
        out.append({"name": f"reliable, hold {r['hold']}: backlog growth a minute over the last half / messages "
                            "offered a minute",
                    "value": growth, "threshold": BACKLOG_TREND_SHARE, "comparison": "<=",
                    "met": None if growth is None else growth <= BACKLOG_TREND_SHARE})
        clean = clean_of(r, runs)
        p99 = ratio(r["summary"]["latency_p99_ms"], clean["summary"]["latency_p99_ms"] if clean else None)
        out.append({"name": f"reliable, hold {r['hold']}: end-to-end p99 / clean p99", "value": p99,
                    "threshold": RELIABLE_P99_HELD_OVER_CLEAN, "comparison": "<=",
                    "met": None if p99 is None else p99 <= RELIABLE_P99_HELD_OVER_CLEAN})
    for r in ours:
        if r["kind"] == "ring":
            refused = float(r["summary"]["refused"])
            out.append({"name": f"ring, hold {r['hold']}: messages refused for fullness", "value": refused,
                        "threshold": 0.0, "comparison": "<=", "met": refused == 0})
    lost = float(sum(abs(r["ledger"]["lost"]) for r in ours))
    out.append({"name": "messages lost (enqueued - completed - left in the queue), all runs", "value": lost,
                "threshold": 0.0, "comparison": "<=", "met": lost == 0})
    return out
