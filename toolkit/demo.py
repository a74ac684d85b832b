"""`queuectl demo`: producers and consumers in separate processes on one queue, a live
view of depth and rates, then a summary. Waits are measured between the server's own
enqueue and dequeue timestamps, so no clock skew enters them.

The demo installs a queue of its own (`queuectl_demo`; it refuses one that exists, so it
never writes into a user's queue) and uninstalls it when it ends, however it ends (unless
asked to keep it, e.g. as history for the pipeline). A
demo process that fails reports one line and the demo stops at the next tick of its live
view with that line, rather than waiting for results that will not come.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue as queue_module
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from queuectl.client import Queue
from queuectl.engine import make_engine, resolve_url
from queuectl.engine.urls import error_text
from queuectl.errors import QueuectlError, UsageError
from queuectl.install import install_queue, uninstall_queue
from queuectl.registry import get_queue
from queuectl.stats import queue_counts
from queuectl.worker import exit_when_orphaned

DEMO_QUEUE = "queuectl_demo"
PRODUCER_BATCH = 20
DRAIN_SECONDS = 10.0
STARTUP_TIMEOUT_S = 120.0  # spawned processes may start slowly on a loaded machine
REPORT_TIMEOUT_S = 60.0  # consumers hand over their wait samples after draining
TICK_S = 0.25


@dataclass(frozen=True)
class DemoSummary:
    seconds: float
    producers: int
    consumers: int
    enqueued: int
    completed: int
    per_second: float
    wait_p50_ms: float
    wait_p99_ms: float
    left_ready: int


def _ready(ready: Synchronized, go: mp.Event) -> None:
    """Report this process connected, then wait for the common start (so slow process
    start-up on a busy machine does not eat into the measured seconds)."""
    with ready.get_lock():
        ready.value += 1
    go.wait()


def _producer(
    url: str, queue: str, stop: mp.Event, enqueued: Synchronized, rate: float, seed: int,
    ready: Synchronized, go: mp.Event,
) -> None:  # fmt: skip
    rng = random.Random(seed)
    with Queue(url, queue) as q:
        _ready(ready, go)
        started = time.monotonic()
        sent = 0
        while not stop.is_set():
            orders = [
                json.dumps({"order": f"{seed}-{sent + i}", "sku": rng.randrange(1000), "qty": rng.randint(1, 5)})
                for i in range(PRODUCER_BATCH)
            ]
            q.enqueue_many(orders, priority=[rng.choice((0, 1, 1, 2)) for _ in orders])
            sent += len(orders)
            with enqueued.get_lock():
                enqueued.value += len(orders)
            if rate > 0:  # pace to this producer's share of the target rate
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0:
                    stop.wait(ahead)


def _work(payload: str) -> None:
    """The consumers' "work": read the order. Any payload is fine: an item that is not an
    order (not JSON, or not an object) is completed like the others."""
    try:
        json.loads(payload)
    except ValueError:
        pass


def _consumer(
    url: str, queue: str, stop: mp.Event, completed: Synchronized, batch: int, waits: mp.Queue,
    ready: Synchronized, go: mp.Event,
) -> None:  # fmt: skip
    samples: list[float] = []
    with Queue(url, queue) as q:
        _ready(ready, go)
        while True:
            with q.processing(batch, lease=30) as messages:
                for m in messages:
                    _work(m.payload)
                    samples.append((m.dequeued_at - m.enqueued_at).total_seconds())
            if messages:
                with completed.get_lock():
                    completed.value += len(messages)
                continue
            # empty queue: stop once told to (the producers are done), else poll again shortly
            if stop.is_set():
                break
            time.sleep(0.02)
    waits.put(samples)


def _reporting(target: Callable[..., None], parent: int, url: str, errors: mp.Queue, *args: object) -> None:
    """A demo process: runs `target`; a failure becomes one line (no password) on `errors`
    and exit code 1, instead of a traceback on the user's terminal. It ends with the demo: a
    demo killed without its cleanup leaves no producer or consumer running."""
    exit_when_orphaned(parent)
    try:
        target(url, *args)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the demo itself says so
        sys.exit(130)
    except BaseException as exc:
        errors.put(f"{mp.current_process().name}: {error_text(exc, url)}")
        errors.close()
        errors.join_thread()
        sys.exit(1)


def _check_alive(procs: list, errors: mp.Queue) -> None:
    """One line naming the first demo process that died (and why, when it could say), if any."""
    dead = [p for p in procs if p.exitcode not in (None, 0)]
    if not dead:
        return
    try:
        reason = errors.get(timeout=1.0)  # its line may still be in the pipe
    except queue_module.Empty:
        reason = f"{dead[0].name} exited with code {dead[0].exitcode}"
    raise QueuectlError(f"demo stopped: {reason}")


def _wait_for_workers(procs: list, ready: Synchronized, errors: mp.Queue, timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Every process connected to the queue, or a clear error (one died, or too slow)."""
    deadline = time.monotonic() + timeout
    while ready.value < len(procs):
        _check_alive(procs, errors)
        if time.monotonic() > deadline:
            raise QueuectlError(f"demo processes did not connect within {timeout:.0f}s")
        time.sleep(0.05)


def _collect_waits(procs: list, waits: mp.Queue, errors: mp.Queue, consumers: int) -> list[float]:
    """The consumers' wait samples, each handed over once it drained; a dead process or a
    consumer that does not finish is a one-line error, not a wait on a queue that stays empty."""
    samples: list[float] = []
    received = 0
    deadline = time.monotonic() + REPORT_TIMEOUT_S
    while received < consumers:
        try:
            samples.extend(waits.get(timeout=TICK_S))
            received += 1
        except queue_module.Empty:
            _check_alive(procs, errors)
            if time.monotonic() > deadline:
                raise QueuectlError(f"demo consumers did not finish within {REPORT_TIMEOUT_S:.0f}s of the end") from None
    return samples


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def _live_table(elapsed: float, seconds: float, enq: int, done: int, counts: dict[str, int], rates: tuple[float, float]) -> Table:
    table = Table(title=f"queuectl demo: {elapsed:4.1f}s of {seconds:.0f}s", title_justify="left")
    for col in ("enqueued", "completed", "ready", "processing", "enqueue/s", "complete/s"):
        table.add_column(col, justify="right")
    table.add_row(
        f"{enq:,}", f"{done:,}", f"{counts['ready']:,}", f"{counts['processing']:,}",
        f"{rates[0]:,.0f}", f"{rates[1]:,.0f}",
    )
    return table


def run_demo(
    url: str | None,
    *,
    queue: str = DEMO_QUEUE,
    seconds: float = 20.0,
    producers: int = 2,
    consumers: int = 2,
    batch: int = 50,
    rate: float = 2000.0,
    keep: bool = False,
    console: Console | None = None,
) -> DemoSummary:
    """Run the demo on a queue it installs (`queue` must not exist) and uninstalls at the end
    (with `keep`, leaves in place); print its live view and summary on `console`."""
    if (not 0.5 <= seconds <= 3600 or not 1 <= producers <= 64 or not 1 <= consumers <= 64 or not 1 <= batch <= 10000
            or not 0 <= rate <= 1_000_000):  # `not` so that nan fails too
        raise QueuectlError(
            "demo limits: 0.5-3600 seconds, 1-64 producers and consumers, batch 1-10000, rate 0 (unlimited) to 1000000"
        )
    console = console or Console()
    resolved = resolve_url(url)
    engine = make_engine(resolved)
    with engine.connect() as conn:
        existing = get_queue(conn, queue)
    if existing is not None:
        engine.dispose()
        raise UsageError(
            f"queue {queue!r} exists: the demo installs a queue of its own and removes it after; give another "
            f"--queue, or remove this one (a demo's that was killed) with `queuectl uninstall {queue} --yes`"
        )
    install_queue(engine, queue)
    console.print(Text.assemble("installed queue ", (queue, "bold"), " for the demo",
                                " (kept when it ends)" if keep else " (uninstalled when it ends)"))
    procs: list = []
    try:
        return _run(engine, resolved, queue, seconds, producers, consumers, batch, rate, console, procs)
    finally:
        for p in procs:
            if p.pid is None:  # never started
                continue
            if p.exitcode is None:
                p.kill()
            p.join(timeout=10)
        if not keep:
            uninstall_queue(engine, queue)
        engine.dispose()


def _run(engine, url: str, queue: str, seconds: float, producers: int, consumers: int, batch: int, rate: float,
         console: Console, procs: list) -> DemoSummary:  # fmt: skip
    """The demo's processes and live view; `procs` is filled so the caller can stop them."""
    ctx = mp.get_context("spawn")
    stop, drain, go = ctx.Event(), ctx.Event(), ctx.Event()
    enqueued, completed, ready = ctx.Value("q", 0), ctx.Value("q", 0), ctx.Value("i", 0)
    waits: mp.Queue = ctx.Queue()
    errors: mp.Queue = ctx.Queue()
    procs += [
        ctx.Process(target=_reporting,
                    args=(_producer, os.getpid(), url, errors, queue, stop, enqueued, rate / producers, i, ready, go),
                    name=f"producer {i + 1}", daemon=True)
        for i in range(producers)
    ] + [
        ctx.Process(target=_reporting,
                    args=(_consumer, os.getpid(), url, errors, queue, drain, completed, batch, waits, ready, go),
                    name=f"consumer {i + 1}", daemon=True)
        for i in range(consumers)
    ]
    for p in procs:
        p.start()
    _wait_for_workers(procs, ready, errors)
    go.set()

    started = time.monotonic()
    last = (started, 0, 0)
    rates = (0.0, 0.0)
    with engine.connect() as conn, Live(console=console, refresh_per_second=4, transient=False) as live:
        while True:
            _check_alive(procs, errors)
            now = time.monotonic()
            elapsed = now - started
            enq, done = enqueued.value, completed.value
            if now - last[0] >= 1.0:
                span = now - last[0]
                rates = ((enq - last[1]) / span, (done - last[2]) / span)
                last = (now, enq, done)
            counts = queue_counts(conn, queue, "reliable")
            conn.commit()
            live.update(_live_table(min(elapsed, seconds), seconds, enq, done, counts, rates))
            if elapsed >= seconds and not stop.is_set():
                stop.set()  # producers stop; consumers drain what is left
                drain.set()
            if stop.is_set() and (done >= enq or elapsed >= seconds + DRAIN_SECONDS):
                break
            time.sleep(TICK_S)
        drain.set()
        samples = _collect_waits(procs, waits, errors, consumers)
        for p in procs:
            p.join(timeout=30)
        _check_alive(procs, errors)
        elapsed = time.monotonic() - started
        final_counts = queue_counts(conn, queue, "reliable")
    console.line()

    summary = DemoSummary(
        seconds=elapsed,
        producers=producers,
        consumers=consumers,
        enqueued=enqueued.value,
        completed=completed.value,
        per_second=completed.value / elapsed if elapsed else 0.0,
        wait_p50_ms=_percentile(samples, 50) * 1000,
        wait_p99_ms=_percentile(samples, 99) * 1000,
        left_ready=final_counts["ready"],
    )
    console.print(summary_table(summary))
    return summary


def summary_table(s: DemoSummary) -> Table:
    table = Table(title="demo summary", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for label, value in (
        ("producers / consumers", f"{s.producers} / {s.consumers}"),
        ("seconds", f"{s.seconds:.1f}"),
        ("enqueued", f"{s.enqueued:,}"),
        ("completed", f"{s.completed:,}"),
        ("completed messages/s", f"{s.per_second:,.0f}"),
        ("wait p50 (ms)", f"{s.wait_p50_ms:,.1f}"),
        ("wait p99 (ms)", f"{s.wait_p99_ms:,.1f}"),
        ("left ready in queue", f"{s.left_ready:,}"),
    ):
        table.add_row(label, value)
    return table
