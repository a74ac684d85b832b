"""The bench run: options, environment facts, measured phases, medians and ratios.

A scenario is a function of a BenchRun that returns a result dict (see
result_schema.json). Every scenario measures its ceilings in the same run as the figures
they bound, one repeat after the other, so a noisy machine moves both alike: ratios are
taken per repeat, then their median is reported beside the medians of the figures.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import queue as queue_mod
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from queuectl.bench.drivers import BENCH_KINDS, KindDriver, PgbenchScripts, bench_sql, driver_for
from queuectl.bench.pgbench import Pgbench, PgbenchUnavailable, find_pgbench, pgbench_version
from queuectl.bench.workers import PAYLOAD_CONTENTS, Backlog, WorkerSpec, payload_pool, run_worker, worker_main
from queuectl.engine import make_engine, resolve_url
from queuectl.engine.urls import mask_url
from queuectl.errors import QueuectlError, UsageError
from queuectl.names import DEFAULT_SCHEMA, QueueNames, quote_ident, validate_schema_name

RESULT_VERSION = 1
SETTINGS_SHOWN = (
    "server_version", "synchronous_commit", "fsync", "wal_level", "shared_buffers", "work_mem",
    "max_connections", "checkpoint_timeout", "max_wal_size", "autovacuum", "wal_buffers",
    "effective_io_concurrency", "shared_preload_libraries", "track_io_timing", "full_page_writes",
)
WORKER_START_TIMEOUT = 120.0
WORKER_STOP_TIMEOUT = 120.0
COMMIT_TABLE = "bench_commit"
# The comparisons the targets are set for: full cycles at batch 100, the split at batch 10, ghosts one
# item per dequeue call, the ring's soak at batch 10.
DEFAULT_BATCH = {"split": 10, "ghosts": 1, "ring": 10, "sustained": 10, "consumers": 10, "cost": 10, "archive": 10}
# The sustained scenario offers a modest fixed rate from few processes (the table it is read against); the
# consumers curve asks what many consumers cost two producers.
DEFAULT_PRODUCERS = {"sustained": 2, "consumers": 2, "cost": 2, "archive": 2}
# the consumers and archive curves' full cycles need about 20 s to reach a steady state (docs/benchmarks.md)
DEFAULT_SECONDS = {"consumers": 20.0, "archive": 20.0}
DEFAULT_CONSUMERS = {"sustained": 2, "cost": 2}
HOLDS = ("none", "snapshot", "idle-in-transaction", "both", "all")
# what --kinds may also name in the sustained scenario (the keys of queuectl.bench.sustained_peers.PEERS)
SUSTAINED_PEERS = ("pgq", "pgqueuer", "pgboss")
DEFAULT_ROWS = {"ghosts": [30_000, 60_000], "cost": [10_000, 1_000_000, 10_000_000]}
DEFAULT_BATCHES = {"ring": [1, 10, 100]}
DEFAULT_SIZES = {"split": [300, 1024, 4096, 16384], "cost": [300, 1024, 4096, 16384, 65536]}
DEFAULT_CONSUMER_COUNTS = {"consumers": [1, 2, 4, 8, 16, 32], "archive": [1, 2, 4, 8, 16, 32]}


@dataclass
class BenchOptions:
    kinds: list[str] = field(default_factory=lambda: ["reliable"])
    producers: int | None = None  # None: the scenario's default (DEFAULT_PRODUCERS, else 4)
    consumers: int | None = None  # None: the scenario's default (DEFAULT_CONSUMERS, else 4)
    batch: int | None = None  # None: the scenario's default (DEFAULT_BATCH)
    payload_bytes: int = 300
    seconds: float | None = None  # each measured phase; None: the scenario's default (DEFAULT_SECONDS, else 10)
    repeat: int = 3
    scenario: str = "kinds"
    url: str | None = None
    schema: str = DEFAULT_SCHEMA
    pgbench: bool = True
    backlog: int | None = None  # full cycle: most messages waiting; None: auto, 0: unbounded
    rows: list[int] | None = None  # ghosts: queue sizes to drain; cost: ready backlogs; None: the scenario's default
    batches: list[int] | None = None  # ring: batch sizes compared; None: the scenario's default
    sizes: list[int] | None = None  # split, cost: payload sizes compared; None: the scenario's default
    soak: float = 0.0  # ring: seconds of soak per design (0: no soak)
    payload_content: str = "random"  # split: "random" (incompressible) or "json" (pglz compresses it ~3x)
    minutes: float = 1.5  # sustained: the measured window of each run
    hold: str = "both"  # sustained: what another session holds open during a run (HOLDS)
    rate: float | None = None  # sustained: offered msgs/s across producers; None: half the calibrated maximum
    interval: float = 5.0  # sustained: seconds between samples
    bystander_rows: int = 1_000_000  # sustained: rows of the unrelated table whose query is timed
    upkeep: bool = True  # sustained, consumers (full cycle): run the kind's upkeep job (archive, compact) beside its load
    plots: str | None = None  # sustained, consumers: PNGs as <plots>-<kind>.png, cost: <plots>-<curve>.png; None: none
    consumer_counts: list[int] | None = None  # consumers: the curve's consumer counts; None: the scenario's default
    items: int = 10_000  # cost: messages one consumer claims and acks at each backlog and payload size
    # the options the user gave (the command line's names without "--"); each must be read
    # by the chosen scenario (SCENARIO_OPTIONS), so none is silently ignored
    given: frozenset[str] = frozenset()

    def validate(self) -> "BenchOptions":
        if self.producers is None:
            self.producers = DEFAULT_PRODUCERS.get(self.scenario, 4)
        if self.seconds is None:
            self.seconds = DEFAULT_SECONDS.get(self.scenario, 10.0)
        if self.consumers is None:
            self.consumers = DEFAULT_CONSUMERS.get(self.scenario, 4)
        if self.batch is None:
            self.batch = DEFAULT_BATCH.get(self.scenario, 100)
        if self.rows is None:
            self.rows = list(DEFAULT_ROWS.get(self.scenario, []))
        if self.batches is None:
            self.batches = list(DEFAULT_BATCHES.get(self.scenario, []))
        if self.sizes is None:
            self.sizes = list(DEFAULT_SIZES.get(self.scenario, []))
        self.sizes = sorted(set(self.sizes))
        if self.consumer_counts is None:
            self.consumer_counts = list(DEFAULT_CONSUMER_COUNTS.get(self.scenario, []))
        self.consumer_counts = sorted(set(self.consumer_counts))
        if self.backlog is None:
            self.backlog = max(2000, 10 * self.consumers * max([self.batch, *self.batches]))
        checks = [
            (1 <= self.producers <= 64, "--producers must be 1-64"),
            (1 <= self.consumers <= 64, "--consumers must be 1-64"),
            (1 <= self.batch <= 10_000, "--batch must be 1-10000"),
            (8 <= self.payload_bytes <= 1_048_576, "--payload-bytes must be 8-1048576 (8 bytes carry the send time)"),
            (0.5 <= self.seconds <= 3600, "--seconds must be 0.5-3600"),
            (1 <= self.repeat <= 100, "--repeat must be 1-100"),
            (0 <= self.backlog <= 100_000_000, "--backlog must be 0 (unbounded) to 100000000"),
            (all(100 <= n <= 10_000_000 for n in self.rows), "--rows must be sizes from 100 to 10000000"),
            (all(1 <= n <= 10_000 for n in self.batches), "--batches must be sizes from 1 to 10000"),
            (all(8 <= n <= 65_536 for n in self.sizes),
             "--sizes must be payload sizes from 8 to 65536 bytes (each design is filled with at least 1,000)"),
            (0 <= self.soak <= 86_400, "--soak must be 0 (none) to 86400 seconds"),
            (self.payload_content in PAYLOAD_CONTENTS, f"--payload-content must be one of {', '.join(PAYLOAD_CONTENTS)}"),
            (0.01 <= self.minutes <= 1440, "--minutes must be 0.01-1440"),
            (self.hold in HOLDS, f"--hold must be one of {', '.join(HOLDS)}"),
            (self.rate is None or 1 <= self.rate <= 1_000_000, "--rate must be 1-1000000 messages/s"),
            (0.2 <= self.interval <= 600, "--interval must be 0.2-600 seconds"),
            (20_000 <= self.bystander_rows <= 100_000_000, "--bystander-rows must be 20000-100000000"),
            (all(1 <= n <= 64 for n in self.consumer_counts), "--consumer-counts must be counts from 1 to 64"),
            (10 <= self.items <= 10_000_000, "--items must be 10-10000000"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        if not self.kinds:
            raise UsageError("give at least one --kind")
        peers = SUSTAINED_PEERS if self.scenario == "sustained" else ()
        for kind in self.kinds:
            if kind not in BENCH_KINDS and kind not in peers:
                also = f" (and, with --scenario sustained, the peers {', '.join(SUSTAINED_PEERS)})"
                raise UsageError(f"no bench driver for kind {kind!r}: choose from {', '.join(BENCH_KINDS)}{also}")
        if self.scenario == "sustained" and self.rate is None and all(k in SUSTAINED_PEERS for k in self.kinds):
            raise UsageError("peers alone need --rate: without it the offered rate is calibrated on queuectl's kinds")
        validate_schema_name(self.schema)
        if self.scenario not in SCENARIOS:
            raise UsageError(f"unknown scenario {self.scenario!r}: choose one of {', '.join(sorted(SCENARIOS))}")
        unread = sorted(self.given - COMMON_OPTIONS - SCENARIO_OPTIONS[self.scenario])
        if unread:
            option = unread[0]
            readers = sorted(name for name, read in SCENARIO_OPTIONS.items() if option in read)
            flag = "--kind" if option == "kinds" else "--" + option.replace("_", "-")
            hint = "; the split's payload sizes are --sizes" if option == "payload_bytes" and self.scenario == "split" else ""
            raise UsageError(f"{flag} is not used by scenario {self.scenario!r}"
                             + (f" (it is read by: {', '.join(readers)}{hint})" if readers else ""))
        return self

    @property
    def pgbench_seconds(self) -> int:
        return max(1, round(self.seconds))


# -- numbers -----------------------------------------------------------------------------


def stat(values: Sequence[float | None]) -> dict[str, Any]:
    """Per-repeat values and their median (None values, i.e. not measured, are left out)."""
    kept = [float(v) for v in values if v is not None]
    return {"values": [None if v is None else float(v) for v in values], "median": statistics.median(kept) if kept else None}


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    if not sorted_values:
        return None
    k = (len(sorted_values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def unavailable_once(items: list[dict[str, str]], subject: str, reason: str) -> None:
    """Report a subject as not measured once, however many repeats failed alike."""
    if not any(i["subject"] == subject for i in items):
        items.append({"subject": subject, "reason": reason})


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# -- progress ----------------------------------------------------------------------------


class Reporter:
    """A progress line on a terminal; silent otherwise."""

    def __init__(self, console: Console | None) -> None:
        self.console = console
        self._progress: Progress | None = None
        self._task: Any = None

    @contextmanager
    def scenario(self, name: str, steps: int) -> Iterator["Reporter"]:
        if self.console is None or not self.console.is_terminal:
            yield self
            return
        progress = Progress(
            TextColumn("[bold]{task.fields[scenario]}[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.description}", markup=False), TimeElapsedColumn(), console=self.console, transient=True,
        )
        with progress:
            self._progress = progress
            self._task = progress.add_task("starting", total=steps, scenario=name)
            try:
                yield self
            finally:
                self._progress = None

    def step(self, label: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=label)

    def done(self) -> None:
        if self._progress is not None:
            self._progress.advance(self._task)

    def note(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, highlight=False)


# -- the run -----------------------------------------------------------------------------


# What every bench worker process imports: loaded once by the fork server its processes are
# forked from, instead of once per process (a new interpreter spends ~0.5 s of CPU on them).
WORKER_PRELOAD = ["queuectl.bench.workers", "queuectl.bench.drivers", "queuectl.client", "queuectl.engine.postgresql",
                  "sqlalchemy", "psycopg"]


def worker_context() -> Any:
    """The multiprocessing context of the bench's worker processes: a fork server (a fresh,
    single-threaded interpreter that imported WORKER_PRELOAD once, each worker a fork of it),
    or spawn where there is none. Either way no worker inherits this process's threads,
    connections or locks."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(WORKER_PRELOAD)
    return ctx


class BenchRun:
    """Shared state of one `queuectl bench` invocation."""

    def __init__(self, options: BenchOptions, console: Console | None = None) -> None:
        self.options = options.validate()
        self.url = resolve_url(options.url)
        self.engine = make_engine(self.url, pool_size=2)
        self.schema = options.schema
        self.reporter = Reporter(console)
        self.pgbench_path = find_pgbench() if options.pgbench else None
        self.pgbench_skipped = not options.pgbench
        self._pgbench: Pgbench | None = None
        self.ctx = worker_context()
        self.commands: dict[str, list[str]] = {}

    # environment --------------------------------------------------------------------

    def environment(self) -> dict[str, Any]:
        import psycopg

        with self.engine.connect() as conn:
            rows = conn.execute(sa.text(bench_sql("server_settings", {})), {"names": list(SETTINGS_SHOWN)}).all()
        settings = {r.name: (f"{r.setting}{' ' + r.unit if r.unit else ''}") for r in rows}
        return {
            "cpu_count": os.cpu_count() or 0,
            "load_average": load_average(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "psycopg": psycopg.__version__,
            "url": mask_url(self.engine.url),
            "server_settings": settings,
            "pgbench": pgbench_version(self.pgbench_path) if self.pgbench_path else None,
        }

    @property
    def pgbench(self) -> Pgbench:
        if self.pgbench_skipped:
            raise PgbenchUnavailable("skipped (--no-pgbench)")
        if self.pgbench_path is None:
            raise PgbenchUnavailable("pgbench not found (install postgresql-client or set QUEUECTL_PGBENCH)")
        if self._pgbench is None:
            self._pgbench = Pgbench(self.pgbench_path, self.url)
        return self._pgbench

    def close(self) -> None:
        if self._pgbench is not None:
            self._pgbench.close()
        self.engine.dispose()

    def names(self, queue: str) -> QueueNames:
        return QueueNames(queue, self.schema)

    def template_values(self) -> dict[str, str]:
        return {
            "schema": quote_ident(self.schema),
            "commit_table": f"{quote_ident(self.schema)}.{quote_ident(COMMIT_TABLE)}",
        }

    # python phases ------------------------------------------------------------------

    def python_phase(
        self,
        driver: str,
        names: QueueNames,
        mode: str,
        *,
        batch: int,
        payload_bytes: int,
        producers: int,
        consumers: int,
        seconds: float,
    ) -> dict[str, Any]:
        """Run real worker processes; mode is 'enqueue', 'dequeue' (drain a pre-filled
        queue, no producers) or 'cycle' (producers and consumers at once)."""
        specs: list[WorkerSpec] = []
        common = dict(driver=driver, url=self.url, queue=names.queue, schema=names.schema, batch=batch,
                      payload_bytes=payload_bytes)
        if mode in ("enqueue", "cycle"):
            specs += [WorkerSpec(role="producer", seed=1000 + i, **common) for i in range(producers)]
        if mode in ("dequeue", "cycle"):
            specs += [WorkerSpec(role="consumer", seed=2000 + i, drain=(mode == "dequeue"), **common)
                      for i in range(consumers)]
        return self.run_processes(run_worker, specs, mode, seconds)

    def run_workers(self, target: Callable[..., None], specs: Sequence[Any], seconds: float, *, mode: str,
                    limit: int = 0, on_go: Callable[[float], None] | None = None) -> tuple[float, list[dict[str, Any]]]:
        """Start one process per spec (each calls target(spec, ready, go, stop, results,
        backlog)), let them go together once all are ready (on_go(t_go) is called just
        before), stop them after `seconds` (or when all reported), and return the start
        time and every worker's report. A failed or missing worker fails the run."""
        ctx = self.ctx
        ready, results = ctx.Queue(), ctx.Queue()
        go, stop = ctx.Event(), ctx.Event()
        slots = ctx.Array("q", len(specs), lock=False)
        producers = sum(1 for s in specs if s.role == "producer")
        procs = [
            ctx.Process(target=worker_main, daemon=True,
                        args=(target, os.getpid(), s, ready, go, stop, results, Backlog(slots, producers, limit, i)))
            for i, s in enumerate(specs)
        ]
        for p in procs:
            p.start()
        reports: list[dict[str, Any]] = []
        try:
            deadline = time.monotonic() + WORKER_START_TIMEOUT
            started = 0
            while started < len(procs):
                try:
                    ready.get(timeout=0.5)
                    started += 1
                except queue_mod.Empty:
                    if time.monotonic() > deadline:
                        raise QueuectlError("bench workers did not start in time")
                    if any(not p.is_alive() and p.exitcode not in (0, None) for p in procs):
                        break
            t_go = time.time()
            if on_go is not None:
                on_go(t_go)
            go.set()
            end = t_go + seconds
            while time.time() < end and len(reports) < len(procs):
                try:
                    reports.append(results.get(timeout=0.05))
                except queue_mod.Empty:
                    pass
                if any("error" in r for r in reports):
                    break
            stop.set()
            deadline = time.monotonic() + WORKER_STOP_TIMEOUT
            while len(reports) < len(procs):
                try:
                    reports.append(results.get(timeout=0.5))
                except queue_mod.Empty:
                    if time.monotonic() > deadline or all(not p.is_alive() for p in procs):
                        break
        finally:
            stop.set()
            go.set()
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=5)
        errors = [r for r in reports if "error" in r]
        if errors:
            raise QueuectlError(f"bench {mode} worker failed: {errors[0]['error']}")
        if len(reports) < len(procs):
            raise QueuectlError(f"{len(procs) - len(reports)} bench worker(s) died without a report")
        return t_go, reports

    def run_processes(self, target: Callable[..., None], specs: Sequence[Any], mode: str, seconds: float) -> dict[str, Any]:
        """Start one process per spec (each calls target(spec, ready, go, stop, results,
        backlog)), start them together, stop them after `seconds` (or when all drained), and
        sum up. Producers come first in `specs`; in a full cycle they keep the backlog under
        --backlog, so the cycle is measured at a steady state, as its pgbench twin runs."""
        limit = int(self.options.backlog or 0) if mode == "cycle" else 0
        t_go, reports = self.run_workers(target, specs, seconds, mode=mode, limit=limit)
        counted_role = "producer" if mode == "enqueue" else "consumer"
        counted = [r for r in reports if r["role"] == counted_role]
        total = sum(r["count"] for r in counted)
        t_end = max((r["t_end"] for r in counted), default=t_go)
        elapsed = max(t_end - t_go, 1e-9)
        latencies = sorted(x for r in counted for x in r.get("latencies", ()))
        result = {
            "messages": total,
            "seconds": elapsed,
            "rate": total / elapsed if total else 0.0,
            "p50_ms": _ms(percentile(latencies, 0.50)) if mode == "cycle" else None,
            "p99_ms": _ms(percentile(latencies, 0.99)) if mode == "cycle" else None,
        }
        if mode == "cycle":
            result["enqueued"] = sum(r["count"] for r in reports if r["role"] == "producer")
            idle: dict[str, int] = {}
            for r in counted:
                for key, n in r.get("idle", {}).items():
                    idle[key] = idle.get(key, 0) + n
            result["idle"] = idle
        # the worker processes' own CPU (not their server sessions'), by role
        result["cpu_seconds"] = {role: sum(r.get("cpu_seconds", 0.0) for r in reports if r["role"] == role)
                                 for role in ("producer", "consumer")}
        # everything each side handled, warm-up included: the ledger of lost/duplicated checks
        result["sent_total"] = sum(r["count"] + r.get("warmup_count", 0) for r in reports if r["role"] == "producer")
        result["taken_total"] = sum(r["count"] + r.get("warmup_count", 0) for r in reports if r["role"] == "consumer")
        return result

    # pgbench phases -----------------------------------------------------------------

    def ceiling(self, which: str, clients: int) -> float:
        """Statements (transactions) per second of SELECT 1 or a single-row insert."""
        values = self.template_values()
        if which == "commit":
            with self.engine.begin() as conn:
                conn.execute(sa.text(bench_sql("create_commit_table", values)))
        script = self.pgbench.script(f"ceiling_{which}", bench_sql(f"pgbench_{which}", values))
        run = self.pgbench.run([script], clients=clients, seconds=self.options.pgbench_seconds)
        self.commands.setdefault(f"ceiling {which}", run.command)
        return run.tps

    def sql_phases(
        self, driver_name: str, names: QueueNames, *, batch: int, payload_bytes: int, producers: int, consumers: int
    ) -> dict[str, float | None]:
        """The kind's own SQL API under pgbench: enqueue, dequeue (drain what enqueue left)
        and the full cycle (sql_cycle at producers+consumers clients)."""
        driver, scripts, values = self._pgbench_twin(driver_name, names, batch, payload_bytes)
        pg = self.pgbench
        enqueue = pg.script(f"{names.queue}_enqueue", bench_sql(scripts.enqueue_section, values))
        consume = pg.script(f"{names.queue}_consume", bench_sql(scripts.consume_section, values))
        seconds = self.options.pgbench_seconds
        out: dict[str, float | None] = {}
        with self.engine.connect() as conn:
            driver.reset(conn, names)
            run = pg.run([enqueue], clients=producers, seconds=seconds, variables=scripts.variables)
            self.commands.setdefault("sql enqueue", run.command)
            out["enqueue"] = run.tps * batch
            run = pg.run([consume], clients=consumers, seconds=seconds, variables=scripts.variables)
            self.commands.setdefault("sql dequeue", run.command)
            n, span = driver.consumed(conn, names)
            out["dequeue"] = n / span if n and span else None
            out["dequeue_drained"] = float(driver.ready(conn, names) == 0)
        out["cycle"] = self.sql_cycle(driver_name, names, batch=batch, payload_bytes=payload_bytes,
                                      clients=producers + consumers)
        return out

    def sql_cycle(self, driver_name: str, names: QueueNames, *, batch: int, payload_bytes: int, clients: int) -> float:
        """The kind's full cycle under pgbench, messages consumed per second: each client
        enqueues a batch, then dequeues and acks one, in turn. The queue is left empty."""
        driver, scripts, values = self._pgbench_twin(driver_name, names, batch, payload_bytes)
        pg = self.pgbench
        # No backlog builds up, so this bounds a full cycle at producers+consumers clients
        # from above (separate pgbench producers would outrun the consumers and starve them
        # of CPU).
        cycle = pg.script(
            f"{names.queue}_cycle",
            bench_sql(scripts.enqueue_section, values) + bench_sql(scripts.consume_section, values),
        )
        seconds = self.options.pgbench_seconds
        with self.engine.connect() as conn:
            driver.reset(conn, names)
            run = pg.run([cycle], clients=clients, seconds=seconds, variables=scripts.variables)
            self.commands.setdefault("sql full-cycle", run.command)
            n, _ = driver.consumed(conn, names)
            driver.reset(conn, names)
        return n / seconds

    def _pgbench_twin(
        self, driver_name: str, names: QueueNames, batch: int, payload_bytes: int
    ) -> tuple[KindDriver, PgbenchScripts, dict[str, str]]:
        """The kind's driver, its pgbench scripts at this batch, and the queue's template values."""
        driver = driver_for(driver_name)
        scripts = driver.pgbench(names, batch, payload_pool(payload_bytes, batch, seed=7))
        if scripts is None:
            raise PgbenchUnavailable(f"kind {driver_name} has no pgbench scripts")
        return driver, scripts, names.template_values()

    def table_stats(self, names: QueueNames, tables: list[str]) -> dict[str, dict[str, int]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(bench_sql("table_stats", {})), {"schema": names.schema, "tables": tables}
            ).mappings().all()
        return {r["relname"]: {k: int(v or 0) for k, v in r.items() if k != "relname"} for r in rows}

    # pg_stat_statements ---------------------------------------------------------------

    def pgss_available(self) -> bool:
        """pg_stat_statements is loaded and its extension exists (created here if need be)."""
        try:
            with self.engine.connect() as conn:
                if not conn.execute(sa.text(bench_sql("pgss_installed", {}))).scalar_one():
                    conn.execute(sa.text(bench_sql("pgss_create", {})))
                    conn.commit()
            return True
        except Exception:
            return False

    def pgss_calls(self, fn_name: str) -> dict[str, float]:
        """Totals so far of the top-level statements that call fn_name (a quoted, qualified name)."""
        return self.pgss_like(f"%{fn_name}(%")

    def pgss_like(self, pattern: str) -> dict[str, float]:
        """Totals so far of the top-level statements whose text is LIKE pattern."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text(bench_sql("pgss_calls", {})), {"pattern": pattern}).mappings().all()
        keys = ("calls", "rows", "shared_blks_hit", "shared_blks_read", "wal_bytes", "total_exec_time")
        return {k: float(sum(r[k] or 0 for r in rows)) for k in keys}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


# -- scenarios ---------------------------------------------------------------------------

Scenario = Callable[[BenchRun], dict[str, Any]]
SCENARIOS: dict[str, Scenario] = {}
SCENARIO_HELP: dict[str, str] = {}
# options every scenario reads (BenchOptions fields, and the command line's --json); the
# others are named by each scenario that reads them (@scenario(..., options))
COMMON_OPTIONS = frozenset({"scenario", "repeat", "url", "schema", "pgbench", "json_file"})
SCENARIO_OPTIONS: dict[str, frozenset[str]] = {}


def scenario(name: str, help_text: str, options: Sequence[str]) -> Callable[[Scenario], Scenario]:
    """Register a scenario with the BenchOptions fields it reads besides COMMON_OPTIONS."""
    unknown = set(options) - {f.name for f in fields(BenchOptions)}
    if unknown:
        raise ValueError(f"scenario {name!r} names options BenchOptions does not have: {sorted(unknown)}")

    def register(fn: Scenario) -> Scenario:
        SCENARIOS[name] = fn
        SCENARIO_HELP[name] = help_text
        SCENARIO_OPTIONS[name] = frozenset(options)
        return fn

    return register


def run_bench(options: BenchOptions, console: Console | None = None, argv: list[str] | None = None) -> dict[str, Any]:
    """Run one scenario and return the result document (result_schema.json)."""
    options.validate()
    run = BenchRun(options, console)
    try:
        started = datetime.now(timezone.utc)
        env = run.environment()
        result = SCENARIOS[options.scenario](run)
        result["load_average_end"] = load_average()
        return {
            "result_version": RESULT_VERSION,
            "tool": "queuectl bench",
            "command": argv or [],
            "started_at": started.isoformat(),
            "finished_at": datetime.now(timezone.utc).isoformat(),
            "options": {k: v for k, v in asdict(options).items() if k not in ("url", "given")},
            "environment": env,
            "scenario": result,
            "commands": dict(run.commands),
        }
    finally:
        run.close()
