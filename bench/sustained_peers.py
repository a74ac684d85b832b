"""Peers of the sustained scenario: PgQ, PgQueuer and pg-boss at the same offered rate, clean and held.

`queuectl bench --scenario sustained --kinds reliable,pgq,pgqueuer` runs each peer as it
runs a queuectl kind: the same paced producers (a fixed offered rate, a batch per send,
the send time stamped in every payload), the same hold, sampler and bystander, in the
bench's own database (a snapshot pins the horizon of its own database only). What differs
is only the peer's own API:

- **PgQ** (Skype's, Debian's postgresql-15-pgq3 3.5 with its ticker pgqd): producers call
  pgq.insert_event per message (a batch in one statement); the consumer loops on
  next_batch / get_batch_events / finish_batch, the calls pgq.Consumer of PgQ's Python
  client (PyPI pgq 3.8) sends, here over psycopg like queuectl's sessions. PgQ hands a
  batch (every event between two ticks) to one registered consumer, so it runs with ONE
  consumer process, whatever --consumers says: two processes under one consumer name
  would get the same batch. pgqd makes the ticks, with Debian's defaults (a tick at most
  every second: at 500 events, or after 3 s of lag). Events are only inserted; finished
  event tables are rotated and truncated (every 2 hours by default, never within a run),
  so the hot path leaves no dead row but PgQ's own bookkeeping rows.
- **PgQueuer** (PyPI pgqueuer, over asyncpg): producers call Queries.enqueue with a batch;
  consumers run its QueueManager (dequeue batch_size = --batch) with a no-op entrypoint,
  which counts a job when its handler runs. It installs into its own schema.
- **pg-boss** (npm, the version bench/pgboss/package-lock.json pins; `make peer-pgboss`):
  each producer and consumer is a Node process (bench/pgboss/peer.mjs) that the worker
  process drives over JSON lines: producers insert() a batch, consumers work() with
  batchSize = --batch and a no-op handler, which counts a job when it runs (returning
  completes the batch). Its defaults but one: the queue is created with notify and the
  instances with useListenNotify, its LISTEN/NOTIFY delivery, so a worker fetches when an
  insert announces itself instead of every pollingIntervalSeconds (2 s). It installs into
  its own schema; a completed job stays in its job table until deleteAfterSeconds (7 days).

No peer is installed by queuectl: a peer that is missing is reported as not measured,
with the command that installs it.
"""

from __future__ import annotations

import asyncio
import base64
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from array import array
from pathlib import Path
from typing import Any, Iterator

import sqlalchemy as sa
from sqlalchemy.engine import Connection, make_url

from queuectl.bench import paced
from queuectl.bench.drivers import bench_sql
from queuectl.bench.peers import _until, _version, _wait, run_async_worker
from queuectl.bench.workers import STAMP, WARMUP_CALLS, payload_pool, pick_batch, run_loop
from queuectl.names import QueueNames, quote_ident

PGQ_CONSUMER = "bench"
PGQUEUER_ENTRYPOINT = "bench"
PGQD_START_SECONDS = 1.0
PGQUEUER_SCHEMA = "bench_pgqueuer"
_PGQUEUER_VALUES: dict[str, str | int] = {"schema": quote_ident(PGQUEUER_SCHEMA)}


def peer_for(name: str) -> Any | None:
    """The peer measured under `name` in --kinds, if it is one."""
    return PEERS.get(name)


# -- PgQ ----------------------------------------------------------------------------------------


class PgqSession:
    """One PgQ producer or consumer over one autocommit connection. Payloads travel as base64
    text (PgQ's ev_data is text). A batch of a tick with no event is finished at once."""

    def __init__(self, url: str, queue: str) -> None:
        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self.conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        self.args = {"queue": queue, "consumer": PGQ_CONSUMER}
        self.sql = {key: sa.text(bench_sql(f"pgq_{key}", {}))
                    for key in ("enqueue", "next_batch", "batch_events", "finish_batch")}

    def enqueue(self, payloads: list[bytes]) -> None:
        data = [base64.b64encode(p).decode() for p in payloads]
        self.conn.execute(self.sql["enqueue"], {**self.args, "data": data}).scalar_one()

    def take(self, n: int) -> tuple[list[bytes], Any]:
        batch = self.conn.execute(self.sql["next_batch"], self.args).scalar_one()
        if batch is None:
            return [], None
        events = [base64.b64decode(d) for (d,) in self.conn.execute(self.sql["batch_events"], {"batch": batch})]
        if not events:
            self.finish(batch)
        return events, batch

    def finish(self, token: Any) -> None:
        if token is not None:
            self.conn.execute(self.sql["finish_batch"], {"batch": token}).scalar_one()

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()


def pgq_paced_worker(spec: Any, ready: Any, go: Any, stop: Any, results: Any, backlog: Any) -> None:
    """Process entry point: the sustained scenario's paced producer or consumer on a PgqSession."""
    loop = paced.producer if spec.role == "producer" else paced.consumer
    run_loop(spec, ready, go, stop, results, lambda session: loop(session, spec),
             open_session=lambda: PgqSession(spec.url, spec.queue))


class Pgqd:
    """Debian's pgqd, ticking the bench database for the length of a run (its own config,
    log and pid files in a temporary directory; Debian's defaults otherwise)."""

    def __init__(self, url: str) -> None:
        self.url = make_url(url)
        self.dir = Path(tempfile.mkdtemp(prefix="queuectl-pgqd-"))
        self.process: subprocess.Popen[bytes] | None = None

    def connstr(self) -> str:
        u, q = self.url, self.url.query
        parts = {"host": q.get("host") or u.host, "port": q.get("port") or u.port, "user": u.username,
                 "password": u.password}
        return " ".join(f"{k}={v}" for k, v in parts.items() if v)

    def start(self) -> None:
        config = self.dir / "pgqd.ini"
        database = self.url.database or "postgres"
        config.write_text(f"[pgqd]\nlogfile = {self.dir / 'pgqd.log'}\npidfile = {self.dir / 'pgqd.pid'}\n"
                          f"base_connstr = {self.connstr()}\ninitial_database = {database}\n"
                          f"database_list = {database}\n")
        config.chmod(0o600)  # it may hold a password
        self.process = subprocess.Popen(["pgqd", "-q", str(config)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)

    def log_tail(self) -> str:
        log = self.dir / "pgqd.log"
        return log.read_text(errors="replace")[-400:] if log.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class PgqPeer:
    name = kind = "pgq"
    label = "PgQ 3.5 (pgqd)"
    max_consumers = 1
    paced_target = staticmethod(pgq_paced_worker)
    schema = "pgq"

    def __init__(self) -> None:
        self.ticker: Pgqd | None = None
        self.tables: list[str] = []

    def unavailable(self, run: Any) -> str | None:
        if shutil.which("pgqd") is None:
            return "pgqd is not installed: apt-get install postgresql-15-pgq3 pgqd (Debian)"
        with run.engine.connect() as conn:
            if not conn.execute(sa.text(bench_sql("pgq_available", {}))).scalar_one():
                return "the server has no pgq extension: apt-get install postgresql-15-pgq3 (Debian)"
        return None

    def install(self, run: Any, names: QueueNames) -> None:
        args = {"queue": names.queue, "consumer": PGQ_CONSUMER}
        with run.engine.begin() as conn:
            for statement in _statements("pgq_setup", {}):
                conn.execute(sa.text(statement), args)
            self.tables = list(conn.execute(sa.text(bench_sql("pgq_tables", {})), args).scalar_one())
        self.ticker = Pgqd(run.url)
        self.ticker.start()
        time.sleep(PGQD_START_SECONDS)  # it connects, or exits at once on a bad configuration
        if self.ticker.process is not None and self.ticker.process.poll() is not None:
            tail = self.ticker.log_tail()
            self.uninstall(run, names)
            raise RuntimeError("pgqd stopped at its start" + (f": {tail}" if tail else ""))

    def uninstall(self, run: Any, names: QueueNames) -> None:
        if self.ticker is not None:
            self.ticker.stop()
            self.ticker = None
        with run.engine.begin() as conn:
            conn.execute(sa.text(bench_sql("pgq_drop", {})), {"queue": names.queue})

    def waiting(self, conn: Connection, names: QueueNames) -> int:
        return int(conn.execute(sa.text(bench_sql("pgq_pending", {})),
                                {"queue": names.queue, "consumer": PGQ_CONSUMER}).scalar_one())

    def left(self, run: Any, names: QueueNames) -> int:
        events = f"{quote_ident(self.schema)}.{quote_ident(self.tables[0])}"  # the parent event table
        with run.engine.connect() as conn:
            return int(conn.execute(sa.text(bench_sql("pgq_left", {"pgq_events": events})),
                                    {"queue": names.queue, "consumer": PGQ_CONSUMER}).scalar_one())


# -- PgQueuer -----------------------------------------------------------------------------------


def _pgqueuer_dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _pgqueuer_connect(url: str, schema: str) -> Any:
    import asyncpg

    return await asyncpg.connect(_pgqueuer_dsn(url), server_settings={"search_path": schema})


def pgqueuer_paced_worker(spec: Any, ready: Any, go: Any, stop: Any, results: Any, backlog: Any) -> None:
    """Process entry point: a paced PgQueuer producer or a QueueManager consumer, reporting as
    the sustained scenario's workers do."""
    main = _pgqueuer_producer if spec.role == "producer" else _pgqueuer_consumer
    run_async_worker(spec.role, "pgqueuer", lambda signal_ready: main(spec, signal_ready, go, stop), ready, results)


async def _pgqueuer_producer(spec: Any, signal_ready: Any, go: Any, stop: Any) -> dict[str, Any]:
    import random

    from pgqueuer.queries import Queries

    conn = await _pgqueuer_connect(spec.url, PGQUEUER_SCHEMA)
    try:
        queries = Queries.from_asyncpg_connection(conn)
        pool = payload_pool(spec.payload_bytes, max(64, spec.batch * 4), spec.seed)
        rng = random.Random(spec.seed + 1)
        n = spec.batch
        entrypoints, priorities = [PGQUEUER_ENTRYPOINT] * n, [0] * n

        async def send(stamp: float) -> int:
            await queries.enqueue(entrypoints, pick_batch(pool, rng, n, stamp), priorities)
            return n

        warm = 0
        for _ in range(WARMUP_CALLS):
            warm += await send(paced.WARMUP_STAMP)
        signal_ready()
        await _wait(go)
        schedule = paced.Schedule(spec)
        while not stop.is_set():
            due = schedule.next_due()
            wait = due - time.time()
            if wait > 0:
                await asyncio.sleep(min(wait, 0.1))  # short sleeps: the stop is seen soon
                if time.time() < due:
                    continue
            now = time.time()
            schedule.sent(due, now, await send(now))
        return {"warmup_count": warm, **schedule.report()}
    finally:
        await conn.close()


async def _pgqueuer_consumer(spec: Any, signal_ready: Any, go: Any, stop: Any) -> dict[str, Any]:
    from datetime import timedelta

    from pgqueuer import QueueManager
    from pgqueuer.queries import Queries

    conn = await _pgqueuer_connect(spec.url, PGQUEUER_SCHEMA)
    try:
        qm = QueueManager(Queries.from_asyncpg_connection(conn))
        done_at, latency = array("d"), array("d")
        counting = False
        warm = 0

        @qm.entrypoint(PGQUEUER_ENTRYPOINT)
        async def handle(job: Any) -> None:  # the no-op handler
            nonlocal warm
            now = time.time()
            if not counting:
                warm += 1
                return
            sent = STAMP.unpack_from(job.payload)[0]
            done_at.append(now)
            latency.append(now - sent if sent != paced.WARMUP_STAMP else math.nan)

        runner = asyncio.create_task(qm.run(batch_size=spec.batch, dequeue_timeout=timedelta(seconds=1)))
        await asyncio.sleep(0.5)  # takes the warm-up jobs (in the ledger, not in the series)
        signal_ready()
        await _wait(go)
        counting = True
        await _until(stop)
        qm.shutdown.set()
        await asyncio.wait_for(runner, timeout=30)
        return {"warmup_count": warm, "done": done_at, "latency": latency}
    finally:
        await conn.close()


class PgQueuerPeer:
    name = kind = "pgqueuer"
    label = "PgQueuer"
    max_consumers = None
    paced_target = staticmethod(pgqueuer_paced_worker)
    # its job table and what it keeps beside it; not pgqueuer_log, the log of finished jobs,
    # as the reliable kind's history is not sampled either
    tables = ["pgqueuer", "pgqueuer_statistics", "pgqueuer_schedules"]

    schema = PGQUEUER_SCHEMA

    def unavailable(self, run: Any) -> str | None:
        import importlib.util

        absent = [m for m in ("pgqueuer", "asyncpg") if importlib.util.find_spec(m) is None]
        return f"not installed ({', '.join(absent)}): pip install 'queuectl[bench-peers]'" if absent else None

    def install(self, run: Any, names: QueueNames) -> None:
        self.label = f"PgQueuer {_version('pgqueuer')}"
        with run.engine.begin() as conn:
            conn.execute(sa.text(bench_sql("pgqueuer_drop", _PGQUEUER_VALUES)))
            conn.execute(sa.text(bench_sql("pgqueuer_schema", _PGQUEUER_VALUES)))

        async def install() -> None:
            from pgqueuer.queries import Queries

            conn = await _pgqueuer_connect(run.url, PGQUEUER_SCHEMA)
            try:
                await Queries.from_asyncpg_connection(conn).install()
            finally:
                await conn.close()

        asyncio.run(install())

    def uninstall(self, run: Any, names: QueueNames) -> None:
        with run.engine.begin() as conn:
            conn.execute(sa.text(bench_sql("pgqueuer_drop", _PGQUEUER_VALUES)))

    def waiting(self, conn: Connection, names: QueueNames) -> int:
        return int(conn.execute(sa.text(bench_sql("pgqueuer_waiting", _PGQUEUER_VALUES))).scalar_one())

    def left(self, run: Any, names: QueueNames) -> int:
        with run.engine.connect() as conn:
            return int(conn.execute(sa.text(bench_sql("pgqueuer_left", _PGQUEUER_VALUES))).scalar_one())


def _statements(section: str, values: dict[str, str | int]) -> Iterator[str]:
    from queuectl.sqlfiles import split_statements

    yield from split_statements(bench_sql(section, values))


# -- pg-boss -------------------------------------------------------------------------------------


def pgboss_dir() -> Path:
    """Where `make peer-pgboss` installs pg-boss (npm ci: package.json and package-lock.json
    beside the peer's script, node_modules beside them)."""
    return Path(__file__).resolve().parent / "pgboss"


def _pgboss_connection(url: str) -> dict[str, Any]:
    """node-postgres's connection settings for a SQLAlchemy URL (a host that is a directory is
    a unix socket's, as libpq reads it)."""
    u = make_url(url)
    q = u.query
    host, port = q.get("host") or u.host, q.get("port") or u.port
    conn = {"host": host, "port": int(port) if port else None, "user": u.username, "password": u.password,
            "database": u.database}
    return {k: v for k, v in conn.items() if v is not None}


class PgBossProcess:
    """One run of bench/pgboss/peer.mjs under Node: the spec on its stdin, its JSON lines read
    by a thread (so every read has a timeout), its stderr kept for a failure's message."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import json
        import queue
        import threading

        node = shutil.which("node")
        if node is None:
            raise RuntimeError("node is not on PATH")
        self.json = json
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen([node, str(pgboss_dir() / "peer.mjs")], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        self.send(json.dumps(spec))

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def receive(self, timeout: float) -> dict[str, Any]:
        """The next message; a failure (an error message, an exit, a timeout) raises."""
        import queue

        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"pg-boss peer: no answer in {timeout:g} s") from None
        if line is None:
            self.process.wait(timeout=5)
            raise RuntimeError(f"pg-boss peer exited ({self.process.returncode}): {self.stderr_tail()}")
        message = self.json.loads(line)
        if "error" in message:
            raise RuntimeError(f"pg-boss peer: {message['error']}")
        return dict(message)

    def stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-400:].strip()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.stderr.close()


PGBOSS_SCHEMA = "bench_pgboss"
_PGBOSS_VALUES: dict[str, str | int] = {"schema": quote_ident(PGBOSS_SCHEMA)}
PGBOSS_ANSWER_SECONDS = 60.0  # its start (a migration check, the instance row), a warm-up, a graceful stop


def _pgboss_spec(command: str, url: str, queue: str, **more: Any) -> dict[str, Any]:
    return {"command": command, "connection": _pgboss_connection(url), "schema": PGBOSS_SCHEMA, "queue": queue,
            **more}


def pgboss_paced_worker(spec: Any, ready: Any, go: Any, stop: Any, results: Any, backlog: Any) -> None:
    """Process entry point: a paced pg-boss producer (insert of a batch) or a consumer (work()
    with batchSize --batch and a no-op handler), one Node process each, reporting as the
    sustained scenario's workers do."""
    report: dict[str, Any] = {"role": spec.role, "pid": os.getpid(), "count": 0, "t_start": None, "t_end": None}
    signalled = False
    node: PgBossProcess | None = None
    try:
        node = PgBossProcess(_pgboss_spec(spec.role, spec.url, spec.queue, batch=spec.batch,
                                          payload_bytes=spec.payload_bytes, seed=spec.seed,
                                          rate=getattr(spec, "rate", 0.0), phase=getattr(spec, "phase", 0.0)))
        report["warmup_count"] = int(node.receive(PGBOSS_ANSWER_SECONDS)["warmup_count"])
        ready.put(os.getpid())
        signalled = True
        go.wait()
        node.send("go")
        stop.wait()
        node.send("stop")
        report.update(_pgboss_report(node.receive(PGBOSS_ANSWER_SECONDS)["report"]))
    except BaseException as exc:  # reported to the parent, which fails the run with it
        report["error"] = f"pgboss: {type(exc).__name__}: {exc}"
        report["traceback"] = traceback.format_exc(limit=4)
    finally:
        if not signalled:
            ready.put(os.getpid())
        if node is not None:
            node.close()
        results.put(report)


def _pgboss_report(raw: dict[str, Any]) -> dict[str, Any]:
    """A Node report as the sustained scenario's summary reads a worker's: arrays of times, a
    latency of None (a warm-up job's) as NaN."""
    out = {k: v for k, v in raw.items() if k not in ("due", "sent", "accepted", "done", "latency")}
    if "due" in raw:  # a producer
        out.update(due=array("d", raw["due"]), sent=array("d", raw["sent"]), accepted=array("l", raw["accepted"]))
    if "done" in raw:  # a consumer
        out.update(done=array("d", raw["done"]),
                   latency=array("d", (math.nan if x is None else x for x in raw["latency"])))
    return out


class PgBossPeer:
    name = kind = "pgboss"
    label = "pg-boss"
    max_consumers = None
    paced_target = staticmethod(pgboss_paced_worker)
    schema = PGBOSS_SCHEMA
    install_command = "make peer-pgboss"

    def __init__(self) -> None:
        self.tables: list[str] = []

    def unavailable(self, run: Any) -> str | None:
        if shutil.which("node") is None:
            return f"Node.js is not installed (no node on PATH): install Node 20 or later, then {self.install_command}"
        if not (pgboss_dir() / "node_modules" / "pg-boss" / "package.json").exists():
            return f"pg-boss is not installed: {self.install_command} (npm ci in {pgboss_dir()})"
        return None

    def install(self, run: Any, names: QueueNames) -> None:
        with run.engine.begin() as conn:
            conn.execute(sa.text(bench_sql("pgboss_drop", _PGBOSS_VALUES)))
        node = PgBossProcess(_pgboss_spec("install", run.url, names.queue))
        try:
            self.label = f"pg-boss {node.receive(PGBOSS_ANSWER_SECONDS)['report']['version']}"
        finally:
            node.close()
        with run.engine.connect() as conn:
            self.tables = list(conn.execute(sa.text(bench_sql("pgboss_tables", {})),
                                            {"schema": PGBOSS_SCHEMA}).scalar_one())

    def uninstall(self, run: Any, names: QueueNames) -> None:
        with run.engine.begin() as conn:
            conn.execute(sa.text(bench_sql("pgboss_drop", _PGBOSS_VALUES)))

    def waiting(self, conn: Connection, names: QueueNames) -> int:
        return int(conn.execute(sa.text(bench_sql("pgboss_waiting", _PGBOSS_VALUES)),
                                {"queue": names.queue}).scalar_one())

    def left(self, run: Any, names: QueueNames) -> int:
        with run.engine.connect() as conn:
            return int(conn.execute(sa.text(bench_sql("pgboss_left", _PGBOSS_VALUES)),
                                    {"queue": names.queue}).scalar_one())


PEERS: dict[str, Any] = {"pgq": PgqPeer(), "pgqueuer": PgQueuerPeer(), "pgboss": PgBossPeer()}
