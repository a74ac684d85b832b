"""Probe: wake-up latency and idle cost of an activated consumer.

    python bench/lab/wakeup.py [--url URL] [--runs 5] [--items 1000] [--spacing 0.02]

Per run: install a fresh queue, start a real `queuectl worker` process on it (threads,
concurrency 1, batch 10) and let it go idle; measure its CPU time (utime+stime from
/proc/<pid>/stat) over an idle window, together with the CPU of its two server backends;
then enqueue `items` single items, one transaction each, spaced `spacing` s apart (+-20%
jitter) so the consumer is idle before each one, and take the time from the enqueue's
commit to the start of the handler, and to the notification's arrival at a plain LISTEN
client in the bench process (the server's share). The handler's first act is to read
time.monotonic_ns() (CLOCK_MONOTONIC: one clock for every process of the machine).

Latency "from commit" is handler start minus the moment the producer's enqueue call
returned, i.e. after the server acknowledged the commit (the notification leaves at
commit, so this can undercount by the reply's trip, ~0.1 ms locally); "from call" adds the
whole enqueue round trip and bounds it from above. Without --url (or $QUEUECTL_URL) the
bench starts a throwaway PostgreSQL server in a temporary folder and removes it after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

OUT_ENV = "QUEUECTL_WAKEUP_OUT"
TARGET_P50_MS, TARGET_P99_MS, TARGET_IDLE_CPU_PCT = 10.0, 50.0, 1.0


def record_start(message) -> None:
    """The bench's handler: when did the handler start, for which item."""
    started = time.monotonic_ns()
    with open(os.environ[OUT_ENV], "a") as out:
        out.write(f"{message.text} {started}\n")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def _worker_backends(engine: sa.Engine, database: str, own_pids: set[int]) -> list[int]:
    """Server pids of the worker's connections (its LISTEN session and its control session)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT pid FROM pg_stat_activity WHERE datname = :db AND backend_type = 'client backend'"),
            {"db": database},
        ).scalars().all()
    return [pid for pid in rows if pid not in own_pids]


def _listen_beside(engine: sa.Engine, queue: str):
    """A plain LISTEN client on the queue's channel: when each notification reached it."""
    import threading

    from queuectl.names import QueueNames
    from queuectl.sqlfiles import render

    raw = engine.raw_connection()
    conn = raw.driver_connection
    raw.detach()
    conn.rollback()
    conn.autocommit = True
    conn.execute(render("postgresql", "activation", "listen", QueueNames(queue).template_values()))
    heard: list[int] = []
    done = threading.Event()

    def hear() -> None:
        while not done.is_set():
            for _ in conn.notifies(timeout=0.2):
                heard.append(time.monotonic_ns())

    thread = threading.Thread(target=hear, daemon=True)
    thread.start()

    def stop() -> None:
        done.set()
        thread.join()
        conn.close()

    return heard, stop


def run_once(url: str, args: argparse.Namespace, workdir: Path) -> dict:
    from queuectl.client import Queue
    from queuectl.engine import make_engine
    from queuectl.install import install_queue, uninstall_queue

    engine = make_engine(url)
    name = f"wakeup_{uuid.uuid4().hex[:8]}"
    install_queue(engine, name)
    out_file = workdir / f"{name}.txt"
    log_file = workdir / f"{name}.log"
    out_file.touch()
    # the worker finds its handler, this module, through the lab folder on its path
    lab_path = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, QUEUECTL_URL=url, PYTHONPATH=lab_path, **{OUT_ENV: str(out_file)})
    command = [sys.executable, "-m", "queuectl.cli", "worker", name, "--handler", "wakeup:record_start",
               "--concurrency", "1", "--batch", "10", "--poll-interval", str(args.poll_interval), "--json"]
    if args.no_notify:
        command.append("--no-notify")
    worker = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log_file.open("wb"), env=env)
    try:
        producer = Queue(engine, name)
        deadline = time.monotonic() + 60
        while "on queue" not in log_file.read_text():
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker did not start:\n{log_file.read_text()}")
            time.sleep(0.05)
        with engine.connect() as conn:
            own = {conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()}
        own.add(producer._conn.execute(sa.text("SELECT pg_backend_pid()")).scalar())
        time.sleep(args.poll_interval * 2)  # let the back-off reach its idle wait
        backends = _worker_backends(engine, engine.url.database, own)
        server_local = all(Path(f"/proc/{pid}").exists() for pid in backends)

        # idle window: nothing is enqueued
        wall0, cpu0 = time.monotonic(), cpu_seconds(worker.pid)
        server0 = sum(cpu_seconds(p) for p in backends) if server_local else 0.0
        time.sleep(args.idle_seconds)
        idle_wall = time.monotonic() - wall0
        idle_cpu = cpu_seconds(worker.pid) - cpu0
        server_cpu = (sum(cpu_seconds(p) for p in backends) - server0) if server_local else None

        # latency: single enqueues, spaced so the consumer is idle before each; a plain LISTEN
        # client beside the worker shows how much of it is the server's notification delivery
        heard, stop_hearing = _listen_beside(engine, name)
        sent: dict[str, tuple[int, int]] = {}
        for i in range(args.items):
            before = time.monotonic_ns()
            producer.enqueue(str(i))
            sent[str(i)] = (before, time.monotonic_ns())
            time.sleep(args.spacing * random.uniform(0.8, 1.2))
        deadline = time.monotonic() + 30 + args.poll_interval
        while True:
            lines = out_file.read_text().splitlines()
            if len(lines) >= args.items or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        started = {item: int(ns) for item, ns in (line.split() for line in lines)}
        stop_hearing()
        producer.close()
    finally:
        worker.send_signal(signal.SIGTERM)
        stdout, _ = worker.communicate(timeout=60)
    stats = json.loads(stdout) if stdout.strip() else {}
    missing = sorted(set(sent) - set(started), key=int)
    if missing or len(lines) != args.items:
        raise SystemExit(f"{len(missing)} items not handled (or handled twice): {missing[:10]}")
    from_commit = [(started[k] - sent[k][1]) / 1e6 for k in sent]
    # one notification per enqueue (each its own transaction), delivered in commit order
    delivery = [(heard[i] - sent[str(i)][1]) / 1e6 for i in range(min(len(heard), args.items))]
    from_call = [(started[k] - sent[k][0]) / 1e6 for k in sent]
    uninstall_queue(engine, name)
    engine.dispose()
    return {
        "items": args.items,
        "notify": not args.no_notify,
        "p50_ms": percentile(from_commit, 50),
        "p90_ms": percentile(from_commit, 90),
        "p99_ms": percentile(from_commit, 99),
        "max_ms": max(from_commit),
        "notify_delivery_p50_ms": percentile(delivery, 50) if delivery and not args.no_notify else None,
        "notify_delivery_p99_ms": percentile(delivery, 99) if delivery and not args.no_notify else None,
        "p50_from_call_ms": percentile(from_call, 50),
        "p99_from_call_ms": percentile(from_call, 99),
        "idle_seconds": idle_wall,
        "idle_cpu_pct": 100 * idle_cpu / idle_wall,
        "idle_server_cpu_pct": None if server_cpu is None else 100 * server_cpu / idle_wall,
        "worker": stats,
        "loadavg_1min_after": os.getloadavg()[0],  # other work on the machine skews the tail
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="database URL (default: $QUEUECTL_URL, else a throwaway server)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--spacing", type=float, default=0.02, help="seconds between enqueues (+-20%%)")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="length of the idle CPU window")
    parser.add_argument("--poll-interval", type=float, default=2.0, help="the worker's longest poll wait")
    parser.add_argument("--no-notify", action="store_true", help="poll only (for comparison)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    url = args.url or os.environ.get("QUEUECTL_URL")
    server = None
    with tempfile.TemporaryDirectory(prefix="queuectl-wakeup-", dir="/tmp") as tmp:
        workdir = Path(tmp)
        os.chmod(workdir, 0o755)  # as root, the server runs as an unprivileged user
        if not url:
            from queuectl.engine.embedded import EmbeddedServer

            server = EmbeddedServer(workdir / "pg")
            url = server.ensure_running()
        try:
            results = []
            for run in range(1, args.runs + 1):
                result = run_once(url, args, workdir)
                results.append(result)
                line = (
                    f"run {run}: p50 {result['p50_ms']:.2f} ms, p90 {result['p90_ms']:.2f} ms, "
                    f"p99 {result['p99_ms']:.2f} ms, max {result['max_ms']:.2f} ms "
                    f"(from call: p50 {result['p50_from_call_ms']:.2f}, p99 {result['p99_from_call_ms']:.2f}); "
                    f"idle worker CPU {result['idle_cpu_pct']:.3f}% over {result['idle_seconds']:.0f} s "
                    f"(resolution {100 / os.sysconf('SC_CLK_TCK') / result['idle_seconds']:.3f}%)"
                )
                if result["notify_delivery_p50_ms"] is not None:
                    line += (f"; a plain LISTEN client heard the notification after p50 "
                             f"{result['notify_delivery_p50_ms']:.2f} ms, p99 {result['notify_delivery_p99_ms']:.2f} ms")
                if result["idle_server_cpu_pct"] is not None:
                    line += f", its server backends {result['idle_server_cpu_pct']:.3f}%"
                print(f"{line}; load average {result['loadavg_1min_after']:.1f}", flush=True)
        finally:
            if server is not None:
                server.stop()
    median = {key: statistics.median(r[key] for r in results)
              for key in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "p50_from_call_ms", "p99_from_call_ms", "idle_cpu_pct",
                          "notify_delivery_p50_ms", "notify_delivery_p99_ms", "loadavg_1min_after")
              if all(r[key] is not None for r in results)}
    verdict = (median["p50_ms"] < TARGET_P50_MS, median["p99_ms"] < TARGET_P99_MS, median["idle_cpu_pct"] < TARGET_IDLE_CPU_PCT)
    print(
        f"median of {len(results)} runs x {args.items} items ({'LISTEN/NOTIFY' if not args.no_notify else 'polling only'}): "
        f"p50 {median['p50_ms']:.2f} ms (target < {TARGET_P50_MS:g}: {'ok' if verdict[0] else 'MISSED'}), "
        f"p99 {median['p99_ms']:.2f} ms (target < {TARGET_P99_MS:g}: {'ok' if verdict[1] else 'MISSED'}), "
        f"idle CPU {median['idle_cpu_pct']:.3f}% (target < {TARGET_IDLE_CPU_PCT:g}%: {'ok' if verdict[2] else 'MISSED'}); "
        f"load average {median['loadavg_1min_after']:.1f}"
    )
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "median": median}, indent=2) + "\n")
    return 0 if all(verdict) else 1


if __name__ == "__main__":
    sys.exit(main())
