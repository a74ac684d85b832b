"""Probe: client CPU per call of the asyncio client (AsyncQueue) against the blocking Queue, one process.

    python bench/lab/async_cpu.py [--url URL] [--batch 100] [--cycles 300] [--rounds 3] [--uvloop]

One process, one reliable queue (`bench_async_cpu`, removed afterwards), no other client:
each cycle enqueues a batch with enqueue_many, dequeues it and acks it (three statements,
one round trip each), as the `peers` scenario's producers and consumers do between them.
Each round times --cycles cycles on the blocking client, then on the asyncio one, after a
warm-up of 10 cycles each (psycopg prepares a statement on its 5th execution); it prints
the process CPU (time.process_time) and wall time per cycle and the asyncio/blocking CPU
quotient of the round. With --uvloop the asyncio client runs on uvloop's event loop
instead of asyncio's own (pip install uvloop). CPU, not throughput: a full cycle on a
machine whose cores are all busy runs at the pace of the CPU its clients and the server
share, so client CPU is what the asyncio client can cost there.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from queuectl.client import Queue
from queuectl.client.aio import AsyncQueue
from queuectl.engine import make_engine, resolve_url
from queuectl.install import install_queue, uninstall_queue
from queuectl.registry import get_queue

QUEUE = "bench_async_cpu"
LEASE = 300.0
WARMUP = 10


def blocking(url: str, payloads: list[bytes], cycles: int) -> tuple[float, float]:
    queue = Queue(url, QUEUE)

    def run(n: int) -> None:
        for _ in range(n):
            queue.enqueue_many(payloads)
            queue.ack(queue.dequeue(len(payloads), lease=LEASE))

    try:
        run(WARMUP)
        cpu, wall = time.process_time(), time.perf_counter()
        run(cycles)
        return (time.process_time() - cpu) / cycles * 1e6, (time.perf_counter() - wall) / cycles * 1e6
    finally:
        queue.close()


async def awaited(url: str, payloads: list[bytes], cycles: int) -> tuple[float, float]:
    queue = await AsyncQueue.open(url, QUEUE)

    async def run(n: int) -> None:
        for _ in range(n):
            await queue.enqueue_many(payloads)
            await queue.ack(await queue.dequeue(len(payloads), lease=LEASE))

    try:
        await run(WARMUP)
        cpu, wall = time.process_time(), time.perf_counter()
        await run(cycles)
        return (time.process_time() - cpu) / cycles * 1e6, (time.perf_counter() - wall) / cycles * 1e6
    finally:
        await queue.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="database URL (default: $QUEUECTL_URL, else the embedded server)")
    parser.add_argument("--batch", type=int, default=100, help="messages per enqueue_many and dequeue")
    parser.add_argument("--payload-bytes", type=int, default=300)
    parser.add_argument("--cycles", type=int, default=300, help="cycles timed per client and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--uvloop", action="store_true", help="run the asyncio client on uvloop's event loop")
    args = parser.parse_args()

    url = resolve_url(args.url)
    engine = make_engine(url)
    run_async: Callable[[Awaitable[Any]], Any] = asyncio.run  # type: ignore[assignment]
    if args.uvloop:
        import uvloop

        run_async = uvloop.run
    with engine.connect() as conn:
        if get_queue(conn, QUEUE) is not None:
            uninstall_queue(engine, QUEUE)
    install_queue(engine, QUEUE, "reliable", None)
    payloads = [os.urandom(args.payload_bytes) for _ in range(args.batch)]
    quotients = []
    try:
        for r in range(args.rounds):
            sync_cpu, sync_wall = blocking(url, payloads, args.cycles)
            async_cpu, async_wall = run_async(awaited(url, payloads, args.cycles))
            quotients.append(async_cpu / sync_cpu)
            print(f"round {r + 1}: per cycle of {args.batch} (enqueue_many + dequeue + ack): blocking CPU "
                  f"{sync_cpu:,.0f} us, wall {sync_wall:,.0f} us; asyncio{' (uvloop)' if args.uvloop else ''} CPU "
                  f"{async_cpu:,.0f} us, wall {async_wall:,.0f} us; CPU asyncio/blocking {quotients[-1]:.2f}")
        print(f"median CPU asyncio/blocking over {args.rounds} rounds: {statistics.median(quotients):.2f}")
    finally:
        uninstall_queue(engine, QUEUE)
        engine.dispose()


if __name__ == "__main__":
    main()
