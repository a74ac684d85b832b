"""Scenario `peers`: the same full cycle on PgQueuer and Procrastinate beside queuectl.

queuectl runs twice in each repeat, one client right after the other: the blocking Queue
(the `kinds` scenario's worker processes) and the asyncio AsyncQueue, whose processes run
the same producer and consumer loops awaited (enqueue_many; dequeue, then ack). Their
quotient is taken per repeat.

Each repeat also measures the SQL ceiling of queuectl's own full cycle: the statements
its client sends, driven by pgbench at the same batch and client count, with no Python
(BenchRun.sql_cycle, as the `kinds` scenario's full-cycle ceiling). A target line says
whether 5x the faster peer is within that ceiling at all.

Each peer is installed from PyPI (`pip install 'queuectl[bench-peers]'`) and driven only
through its own public API, in its own fresh database, with a no-op handler and the same
numbers of producer and consumer processes as queuectl. Each runs at several batch
settings and is credited with its best. A peer that is not installed, or fails, is
reported as not measured, with the reason.

Counting: a peer's consumer counts a job when its handler runs (the peer writes the
completion afterwards, PgQueuer even in buffered batches), while queuectl counts after
its ack has committed; so the comparison leans, slightly, in the peers' favour.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import struct
import time
import traceback
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from queuectl.bench.core import BenchRun, ratio, scenario, stat, unavailable_once
from queuectl.bench.drivers import bench_sql, driver_for
from queuectl.bench.pgbench import PgbenchUnavailable
from queuectl.bench.workers import (
    BACKLOG_PAUSE_SECONDS, LATENCY_SAMPLE, STOP_CHECK_SECONDS, WARMUP_CALLS, Backlog, IdleRule, payload_pool,
)
from queuectl.names import quote_ident

STAMP = struct.Struct("<d")
PEERS_DATABASE = "queuectl_bench_peers"
ENTRYPOINT = "bench"
# The settings each peer is tried at ("batch" as its own API understands it).
PGQUEUER_BATCHES = (10, 100)
PROCRASTINATE_CONCURRENCY = (1, 10)
# The goal: queuectl's full cycle at this many times the faster peer's best.
PEER_FACTOR_GOAL = 5.0
# queuectl's own subjects: the blocking client and the asyncio one (run through peer_worker)
SYNC, ASYNCIO = "queuectl", "queuectl-asyncio"


@dataclass(frozen=True)
class PeerSpec:
    peer: str
    dsn: str
    role: str
    batch: int  # messages per enqueue call
    setting: int  # PgQueuer: dequeue batch_size; Procrastinate: worker concurrency; queuectl: dequeue n
    payload_bytes: int
    seed: int
    queue: str = ""  # queuectl's asyncio subject: the bench queue and its schema
    schema: str = ""


def peer_worker(spec: PeerSpec, ready: Any, go: Any, stop: Any, results: Any, backlog: Backlog) -> None:
    """Process entry point (a bench worker process): one asyncio loop running one producer or consumer."""
    main = {"pgqueuer": _pgqueuer, "procrastinate": _procrastinate, ASYNCIO: _queuectl_asyncio}[spec.peer]
    run_async_worker(spec.role, spec.peer, lambda signal_ready: main(spec, signal_ready, go, stop, backlog), ready,
                     results)


def run_async_worker(role: str, label: str, main: Callable[[Callable[[], None]], Awaitable[dict[str, Any]]],
                     ready: Any, results: Any) -> None:
    """A bench worker process's life on one asyncio loop: run main(signal_ready), which calls
    signal_ready() once warmed up and returns what goes into the report; every outcome (a
    failure too, labelled) is one report on `results`, and ready is signalled whatever happens."""
    report: dict[str, Any] = {"role": role, "pid": os.getpid(), "count": 0, "t_start": None, "t_end": None}
    signalled = False

    def signal_ready() -> None:
        nonlocal signalled
        if not signalled:
            signalled = True
            ready.put(os.getpid())

    try:
        report.update(asyncio.run(main(signal_ready)))
    except BaseException as exc:  # reported to the parent, which fails the run with it
        report["error"] = f"{label}: {type(exc).__name__}: {exc}"
        report["traceback"] = traceback.format_exc(limit=8)
    finally:
        signal_ready()
        results.put(report)


class _Tally:
    """Counts handled jobs once the common start was given, with send-to-handler latency."""

    def __init__(self, backlog: Backlog | None = None) -> None:
        self.backlog = backlog
        self.counting = False
        self.count = 0
        self.t_start = 0.0
        self.t_end = 0.0
        self.latencies = array("d")

    def start(self) -> None:
        self.t_start = self.t_end = time.time()
        self.counting = True

    def handled(self, sent_at: float) -> None:
        self.handled_batch((sent_at,))

    def handled_batch(self, sent_at: Sequence[float]) -> None:
        """A batch handled at once (its send times): one clock read, one backlog update."""
        if self.backlog is not None:
            self.backlog.add(len(sent_at))
        if self.counting:
            now = time.time()
            self.count += len(sent_at)
            self.t_end = now
            self.latencies.extend(now - t for t in sent_at)

    def report(self, seed: int) -> dict[str, Any]:
        sample = list(self.latencies)
        if len(sample) > LATENCY_SAMPLE:
            sample = random.Random(seed).sample(sample, LATENCY_SAMPLE)
        return {"count": self.count, "t_start": self.t_start, "t_end": self.t_end, "latencies": sample}


async def _wait(event: Any) -> None:
    await asyncio.to_thread(event.wait)


async def _until(event: Any) -> None:
    while not event.is_set():
        await asyncio.sleep(0.02)


def _payloads(spec: PeerSpec) -> tuple[list[bytes], random.Random]:
    return payload_pool(spec.payload_bytes, max(64, spec.batch * 4), spec.seed), random.Random(spec.seed)


async def _produce(spec: PeerSpec, send: Any, signal_ready: Any, go: Any, stop: Any, backlog: Backlog) -> dict[str, Any]:
    for _ in range(WARMUP_CALLS):
        await send()
        backlog.add(spec.batch)
    signal_ready()
    await _wait(go)
    count, t_start = 0, time.time()
    t_end = t_start
    while not stop.is_set():
        if backlog.too_deep():
            await asyncio.sleep(BACKLOG_PAUSE_SECONDS)
            continue
        await send()
        backlog.add(spec.batch)
        count += spec.batch
        t_end = time.time()
    return {"count": count, "t_start": t_start, "t_end": t_end}


# -- queuectl's asyncio client -------------------------------------------------------------


async def _queuectl_asyncio(spec: PeerSpec, signal_ready: Any, go: Any, stop: Any, backlog: Backlog) -> dict[str, Any]:
    """The blocking subject's loops (queuectl.bench.workers), awaited on AsyncQueue: producers
    enqueue_many a batch per call, consumers dequeue a batch and ack it, counting it (and its
    send -> ack latency) once the ack has returned, and after an empty take waiting as the
    AsyncWorker does (_AsyncIdleWait). Warm-up as there: WARMUP_CALLS calls of each, not counted."""
    from queuectl.asyncworker import AsyncListener
    from queuectl.bench.drivers import LEASE_SECONDS
    from queuectl.client.aio import AsyncQueue

    queue = await AsyncQueue.open(spec.dsn, spec.queue, schema=spec.schema)
    try:
        if spec.role == "producer":
            pool, rng = _payloads(spec)

            async def send() -> None:
                stamp = STAMP.pack(time.time())
                start = rng.randrange(len(pool) - spec.batch)
                payloads = [stamp + p[8:] for p in pool[start:start + spec.batch]]
                if spec.batch == 1:
                    await queue.enqueue(payloads[0])
                else:
                    await queue.enqueue_many(payloads)

            return await _produce(spec, send, signal_ready, go, stop, backlog)

        tally = _Tally(backlog)
        unpack = STAMP.unpack_from
        idle = _AsyncIdleWait(await AsyncListener.open(queue))
        for _ in range(WARMUP_CALLS):  # prepares the dequeue and the ack (psycopg: at the 5th execution)
            messages = await queue.dequeue(spec.setting, lease=LEASE_SECONDS)
            if messages:
                await queue.ack(messages)
            backlog.add(len(messages))
        signal_ready()
        await _wait(go)
        tally.start()
        try:
            while not stop.is_set():
                messages = await queue.dequeue(spec.setting, lease=LEASE_SECONDS)
                if not messages:
                    await idle.found_nothing(stop)
                    continue
                await idle.found_work()
                await queue.ack(messages)
                tally.handled_batch([unpack(m.payload)[0] for m in messages])
        finally:
            await idle.listener.close()
        return tally.report(spec.seed)
    finally:
        await queue.close()


class _AsyncIdleWait:
    """The bench's IdleRule (queuectl.bench.workers), as the AsyncWorker waits: on its
    AsyncListener's socket, watched by the event loop only while asleep."""

    def __init__(self, listener: Any) -> None:
        self.listener = listener
        self.rule = IdleRule(listener.gated)

    async def found_work(self) -> None:
        if self.rule.found_work():
            await self.listener.wait_end()
            await self.listener.drain()

    async def found_nothing(self, stop: Any) -> None:
        step, seconds = self.rule.found_nothing()
        if step == "outrun":
            await self.listener.wait_end()
        elif step == "register":
            clear = await self.listener.wait_begin()
            await self.listener.drain()
            seconds = self.rule.registered_now(clear)
        deadline = time.monotonic() + seconds
        loop = asyncio.get_running_loop()
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            if step == "outrun":
                await asyncio.sleep(min(left, STOP_CHECK_SECONDS))
                continue
            readable = asyncio.Event()
            loop.add_reader(self.listener.conn.fileno(), readable.set)
            try:
                await asyncio.wait_for(readable.wait(), min(left, STOP_CHECK_SECONDS))
            except TimeoutError:
                pass
            finally:
                loop.remove_reader(self.listener.conn.fileno())
            if await self.listener.drain():
                self.rule.woken()
                return


# -- PgQueuer -----------------------------------------------------------------------------


async def _pgqueuer(spec: PeerSpec, signal_ready: Any, go: Any, stop: Any, backlog: Backlog) -> dict[str, Any]:
    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(spec.dsn)
    try:
        queries = Queries.from_asyncpg_connection(conn)
        if spec.role == "producer":
            pool, rng = _payloads(spec)
            entrypoints, priorities = [ENTRYPOINT] * spec.batch, [0] * spec.batch

            async def send() -> None:
                stamp = STAMP.pack(time.time())
                start = rng.randrange(len(pool) - spec.batch)
                await queries.enqueue(entrypoints, [stamp + p[8:] for p in pool[start:start + spec.batch]], priorities)

            return await _produce(spec, send, signal_ready, go, stop, backlog)

        tally = _Tally(backlog)
        qm = QueueManager(queries)

        @qm.entrypoint(ENTRYPOINT)
        async def handle(job: Any) -> None:  # the no-op handler
            tally.handled(STAMP.unpack_from(job.payload)[0])

        runner = asyncio.create_task(qm.run(batch_size=spec.setting, dequeue_timeout=timedelta(seconds=1)))
        await asyncio.sleep(0.5)  # let it take the warm-up jobs (not counted)
        signal_ready()
        await _wait(go)
        tally.start()
        await _until(stop)
        qm.shutdown.set()
        await asyncio.wait_for(runner, timeout=30)
        return tally.report(spec.seed)
    finally:
        await conn.close()


def pgqueuer_install(dsn: str) -> None:
    async def install() -> None:
        import asyncpg
        from pgqueuer.queries import Queries

        conn = await asyncpg.connect(dsn)
        try:
            await Queries.from_asyncpg_connection(conn).install()
        finally:
            await conn.close()

    asyncio.run(install())


# -- Procrastinate ------------------------------------------------------------------------


def _procrastinate_app(dsn: str, tally: _Tally | None) -> tuple[Any, Any]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name=ENTRYPOINT, queue=ENTRYPOINT)
    async def bench_job(sent_at: float, body: str) -> None:  # the no-op handler
        if tally is not None:
            tally.handled(sent_at)

    return app, bench_job


async def _procrastinate(spec: PeerSpec, signal_ready: Any, go: Any, stop: Any, backlog: Backlog) -> dict[str, Any]:
    tally = _Tally(backlog) if spec.role == "consumer" else None
    app, bench_job = _procrastinate_app(spec.dsn, tally)
    async with app.open_async():
        if spec.role == "producer":
            pool, rng = _payloads(spec)
            bodies = [base64.b64encode(p[8:]).decode() for p in pool]

            async def send() -> None:
                now = time.time()
                start = rng.randrange(len(bodies) - spec.batch)
                await bench_job.batch_defer_async(*({"sent_at": now, "body": b} for b in bodies[start:start + spec.batch]))

            return await _produce(spec, send, signal_ready, go, stop, backlog)

        assert tally is not None
        runner = asyncio.create_task(app.run_worker_async(
            queues=[ENTRYPOINT], concurrency=spec.setting, wait=True, install_signal_handlers=False,
            delete_jobs="successful", shutdown_graceful_timeout=10,
        ))
        await asyncio.sleep(0.5)
        signal_ready()
        await _wait(go)
        tally.start()
        await _until(stop)
        runner.cancel()
        try:
            await asyncio.wait_for(runner, timeout=30)
        except (asyncio.CancelledError, Exception):
            pass
        return tally.report(spec.seed)


def procrastinate_install(dsn: str) -> None:
    async def install() -> None:
        app, _ = _procrastinate_app(dsn, None)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(install())


PEERS = {
    "pgqueuer": (pgqueuer_install, PGQUEUER_BATCHES, "dequeue batch_size", ("pgqueuer", "asyncpg")),
    "procrastinate": (procrastinate_install, PROCRASTINATE_CONCURRENCY, "worker concurrency", ("procrastinate",)),
}


def _missing(modules: tuple[str, ...]) -> str | None:
    import importlib.util

    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if absent:
        return f"not installed ({', '.join(absent)}): pip install 'queuectl[bench-peers]'"
    return None


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "?"


@scenario("peers", "full cycle: queuectl reliable (blocking and asyncio clients) and its SQL ceiling beside "
                   "PgQueuer and Procrastinate, equal processes",
          ("producers", "consumers", "batch", "payload_bytes", "seconds", "backlog"))
def peers(run: BenchRun) -> dict[str, Any]:
    o = run.options
    P, C, B = o.producers, o.consumers, o.batch
    kind = "reliable"
    names = run.names("bench_reliable")
    driver = driver_for(kind)
    driver.install(run.engine, names)
    unavailable: list[dict[str, str]] = []
    ready_peers: dict[str, tuple[int, ...]] = {}
    for peer, (install, settings, _, modules) in PEERS.items():
        reason = _missing(modules)
        if reason is None:
            try:
                install(_fresh_database(run))
            except Exception as exc:  # a peer that cannot install is reported, not faked
                reason = f"install failed: {type(exc).__name__}: {exc}"
        if reason:
            unavailable.append({"subject": peer, "reason": reason})
        else:
            ready_peers[peer] = settings
    series: dict[tuple[str, int], dict[str, list[Any]]] = {
        (SYNC, B): {"rate": [], "p50": [], "p99": []}, (ASYNCIO, B): {"rate": [], "p50": [], "p99": []},
    }
    for peer, settings in ready_peers.items():
        for s in settings:
            series[(peer, s)] = {"rate": [], "p50": [], "p99": []}
    sql_rates: list[float | None] = []  # the SQL ceiling, one per repeat, measured beside queuectl's run
    steps = o.repeat * (len(series) + 1)
    failed: set[str] = set()

    def on_bench_queue(target: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """A run of queuectl's own on the bench queue, emptied before and after."""
        with run.engine.connect() as conn:
            driver.reset(conn, names)
        try:
            return target(*args, **kwargs)
        finally:
            with run.engine.connect() as conn:
                driver.reset(conn, names)

    with run.reporter.scenario("peers", steps) as rep:
        for r in range(o.repeat):
            rep.step(f"repeat {r + 1}: queuectl SQL via pgbench ({P + C} clients)")
            try:
                sql_rates.append(run.sql_cycle(kind, names, batch=B, payload_bytes=o.payload_bytes, clients=P + C))
            except PgbenchUnavailable as exc:
                sql_rates.append(None)
                unavailable_once(unavailable, f"sql {kind}", str(exc))
            rep.done()
            for (subject, setting), m in series.items():
                rep.step(f"repeat {r + 1}: {subject} (setting {setting})")
                if subject == SYNC:
                    res = on_bench_queue(run.python_phase, kind, names, "cycle", batch=B, payload_bytes=o.payload_bytes,
                                         producers=P, consumers=C, seconds=o.seconds)
                elif subject == ASYNCIO:  # the same loops, processes and queue as SYNC, right after it
                    ours = dict(dsn=run.url, batch=B, setting=setting, payload_bytes=o.payload_bytes,
                                queue=names.queue, schema=names.schema)
                    specs = [PeerSpec(subject, role="producer", seed=1000 + i, **ours) for i in range(P)]
                    specs += [PeerSpec(subject, role="consumer", seed=2000 + i, **ours) for i in range(C)]
                    res = on_bench_queue(run.run_processes, peer_worker, specs, "cycle", o.seconds)
                elif subject in failed:
                    res = {"rate": None, "p50_ms": None, "p99_ms": None}
                else:
                    dsn = _fresh_database(run)  # no backlog or history carried between runs
                    PEERS[subject][0](dsn)
                    specs = [PeerSpec(subject, dsn, "producer", B, setting, o.payload_bytes, 1000 + i) for i in range(P)]
                    specs += [PeerSpec(subject, dsn, "consumer", B, setting, o.payload_bytes, 2000 + i) for i in range(C)]
                    try:
                        res = run.run_processes(peer_worker, specs, "cycle", o.seconds)
                    except Exception as exc:
                        failed.add(subject)
                        unavailable.append({"subject": subject, "reason": f"run failed: {exc}"})
                        res = {"rate": None, "p50_ms": None, "p99_ms": None}
                m["rate"].append(res["rate"])
                m["p50"].append(res["p50_ms"])
                m["p99"].append(res["p99_ms"])
                rep.done()
    _drop_database(run)
    rows = []
    best: dict[str, tuple[float, int]] = {}
    sync_rates, async_rates = series[(SYNC, B)]["rate"], series[(ASYNCIO, B)]["rate"]
    for (subject, setting), m in series.items():
        rate = stat(m["rate"])
        ours_row = subject in (SYNC, ASYNCIO)
        if not ours_row and rate["median"] is not None:
            if subject not in best or rate["median"] > best[subject][0]:
                best[subject] = (rate["median"], setting)
        label = {SYNC: f"queuectl {kind}", ASYNCIO: f"queuectl {kind} asyncio"}.get(subject)
        setting_name = "batch" if ours_row else PEERS[subject][2]
        metrics: dict[str, Any] = {}
        if subject == ASYNCIO:  # the asyncio client over the blocking one, repeat by repeat
            metrics["vs_sync"] = stat([ratio(a, b) for a, b in zip(async_rates, sync_rates)])
        elif not ours_row:
            metrics["queuectl_x"] = stat([ratio(a, b) for a, b in zip(sync_rates, m["rate"])])
            metrics["asyncio_x"] = stat([ratio(a, b) for a, b in zip(async_rates, m["rate"])])
            # the most any client of queuectl's statements could be over this peer, repeat by repeat
            metrics["sql_ceiling_x"] = stat([ratio(a, b) for a, b in zip(sql_rates, m["rate"])])
        rows.append({
            "subject": label or f"{subject} {_version(subject)}", "phase": "full-cycle",
            "params": {"batch": B, "setting": f"{setting_name} {setting}", "producers": P, "consumers": C,
                       "payload_bytes": o.payload_bytes, "clients": P + C},
            "rate": rate,
            "ceiling": {"name": "same SQL via pgbench (producers+consumers clients)", "rate": stat(sql_rates)}
            if ours_row else None,
            "fraction_of_ceiling": stat([ratio(a, b) for a, b in zip(m["rate"], sql_rates)]) if ours_row else None,
            "latency_ms": {"p50": stat(m["p50"]), "p99": stat(m["p99"])}, "metrics": metrics,
        })
    ours = stat(sync_rates)["median"]
    ceiling = stat(sql_rates)["median"]
    fastest = max(best.items(), key=lambda kv: kv[1][0]) if best else None
    targets = [{
        "name": f"queuectl reliable (batch {B}, {P}P+{C}C) vs the faster peer at its best setting"
                + (f" ({fastest[0]} at {PEERS[fastest[0]][2]} {fastest[1][1]})" if fastest else ""),
        "value": ratio(ours, fastest[1][0]) if fastest else None,
        "threshold": PEER_FACTOR_GOAL,
        "met": (ratio(ours, fastest[1][0]) >= PEER_FACTOR_GOAL) if fastest and ours else None,
    }, reach_target(fastest, ceiling, ours, rows[0]["fraction_of_ceiling"]["median"], B, P + C)]
    return {
        "name": "peers",
        "description": "full cycle (enqueue -> dequeue -> complete), equal producer and consumer processes",
        "notes": [
            f"peers run in their own database {PEERS_DATABASE}, installed and driven through their own APIs "
            "(PgQueuer over asyncpg, its fastest driver; Procrastinate over psycopg), no-op handlers",
            "peers' enqueue uses their batch APIs with --batch jobs per call; queuectl uses enqueue_many; "
            f"every system's producers pause while more than {o.backlog:,} jobs wait (--backlog)",
            "peers count a job when its handler runs, before the peer records completion; queuectl counts "
            "after its ack commits; peers' latency is send -> handler, queuectl's send -> ack returned",
            "queuectl reliable asyncio: AsyncQueue in the same processes, loops and queue as the blocking "
            "client (producers enqueue_many, consumers dequeue then ack), right after it in each repeat; "
            "'x sync' is its rate over the blocking client's in the same repeat, 'asyncio x' its rate over each peer",
            f"SQL ceiling (queuectl rows): the statements queuectl's client sends, from pgbench -M prepared at "
            f"{P + C} clients that each enqueue a batch of {B}, then dequeue and ack one, measured in each repeat "
            "just before queuectl's run; 'ceiling x' is that ceiling over each peer, the most any client of "
            "queuectl's statements could be ahead of it at this batch and client count on this machine",
        ],
        "display_metrics": [["queuectl x", "queuectl_x"], ["asyncio x", "asyncio_x"], ["x sync", "vs_sync"],
                            ["ceiling x", "sql_ceiling_x"]],
        "ceilings": [],
        "rows": rows,
        "targets": targets,
        "unavailable": unavailable,
    }


def reach_target(
    fastest: tuple[str, tuple[float, int]] | None,
    ceiling: float | None,
    ours: float | None,
    share: float | None,
    batch: int,
    clients: int,
) -> dict[str, Any]:
    """Whether PEER_FACTOR_GOAL x the faster peer is within the SQL ceiling of queuectl's own
    full cycle: if not, no client of these statements reaches it on this machine."""
    value = ratio(ceiling, fastest[1][0]) if fastest else None
    target: dict[str, Any] = {
        "name": f"SQL ceiling of queuectl's full cycle (pgbench, batch {batch}, {clients} clients) over the faster "
                f"peer's best: can {PEER_FACTOR_GOAL:g}x the faster peer be reached at all",
        "value": value, "threshold": PEER_FACTOR_GOAL, "met": None if value is None else value >= PEER_FACTOR_GOAL,
    }
    if fastest and ceiling and value is not None:
        peer, (peer_rate, _) = fastest
        goal = PEER_FACTOR_GOAL * peer_rate
        where = "within" if value >= PEER_FACTOR_GOAL else "above"
        verdict = (f"{PEER_FACTOR_GOAL:g}x {peer} = {goal:,.0f} msg/s is {where} the SQL ceiling {ceiling:,.0f} msg/s "
                   f"({value:.2f}x {peer}'s {peer_rate:,.0f})")
        verdict += (": reachable in principle" if value >= PEER_FACTOR_GOAL
                    else ": unreachable by any client of these statements at this batch and client count on this machine")
        if ours and share is not None:
            verdict += f"; queuectl's client is at {ours:,.0f} msg/s, {share:.0%} of the ceiling"
        target["verdict"] = verdict
    return target


def _fresh_database(run: BenchRun) -> str:
    """A new database for the peers (their tables never mix with the user's); its libpq URL."""
    values = {"database": quote_ident(PEERS_DATABASE)}
    with run.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(bench_sql("drop_database", values)))
        conn.execute(sa.text(bench_sql("create_database", values)))
    url = make_url(run.url).set(drivername="postgresql", database=PEERS_DATABASE)
    return url.render_as_string(hide_password=False)


def _drop_database(run: BenchRun) -> None:
    with run.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(bench_sql("drop_database", {"database": quote_ident(PEERS_DATABASE)})))
