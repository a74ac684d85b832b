"""An async worker process for tests/test_async_client.py: consumes the queue, recording
every run of its handler (one row per run in `runs`), until SIGTERM.

    python tests/async_workers.py URL QUEUE CONCURRENCY HANDLER_SECONDS
"""

from __future__ import annotations

import asyncio
import sys

import psycopg

from queuectl.client.aio import AsyncQueue


async def main(url: str, name: str, concurrency: int, seconds: float) -> None:
    queue = await AsyncQueue.open(url, name)
    runs = await psycopg.AsyncConnection.connect(url.replace("postgresql+psycopg://", "postgresql://"),
                                                 autocommit=True)

    async def handler(message) -> None:
        await asyncio.sleep(seconds)
        await runs.execute("INSERT INTO runs (item) VALUES (%s)", (message.id,))

    print("ready", flush=True)
    stats = await queue.consume(handler, concurrency=concurrency, batch=concurrency, lease=30)
    print(f"stopped processed={stats.processed} released={stats.released} failed={stats.failed}", flush=True)
    await runs.close()
    await queue.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
