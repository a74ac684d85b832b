"""An asyncio service on queuectl: an order row and its confirmation task commit together,
and an async worker sends the confirmations.

    python docs/examples/async_service.py postgresql://app@db/app 20

It creates a table `shop_orders` (if missing) and expects the reliable queue `orders`
(`queuectl install orders`). It places N orders, each in one transaction with its task,
then consumes the tasks with the async worker until every order is confirmed, and prints
one line of JSON: how many were placed, confirmed, and how the worker did.
"""

from __future__ import annotations

import asyncio
import json
import sys

from queuectl.client.aio import AsyncQueue


async def place_order(queue: AsyncQueue, order_id: int, amount: int) -> None:
    """The business row and its task in one transaction: both commit, or neither does."""
    async with queue.transaction() as conn:
        await conn.execute("INSERT INTO shop_orders (id, amount) VALUES (%s, %s)", (order_id, amount))
        await queue.enqueue(json.dumps({"order": order_id}), title=f"confirm order {order_id}")


async def main(url: str, count: int) -> dict[str, object]:
    shop = await AsyncQueue.open(url, "orders")
    worker_queue = await AsyncQueue.open(url, "orders")  # the worker's own connection
    try:
        async with shop.transaction() as conn:
            await conn.execute("CREATE TABLE IF NOT EXISTS shop_orders "
                               "(id int PRIMARY KEY, amount int NOT NULL, confirmed boolean NOT NULL DEFAULT false)")
        await asyncio.gather(*(place_order(shop, n, 10 * n) for n in range(1, count + 1)))
        try:  # a business rule refuses this order: its row and its task both roll back
            await place_order(shop, 1, 999)
        except Exception as exc:  # the duplicate key
            print(f"refused as expected: {type(exc).__name__}", file=sys.stderr)

        async def confirm(message: object) -> None:
            order = json.loads(message.text)["order"]  # type: ignore[attr-defined]
            async with shop.transaction() as conn:
                await conn.execute("UPDATE shop_orders SET confirmed = true WHERE id = %s", (order,))

        # burst: consume until the queue is empty, then return the worker's stats
        stats = await worker_queue.consume(confirm, concurrency=4, batch=10, burst=True, handle_signals=False)
        async with shop.transaction() as conn:
            cursor = await conn.execute("SELECT count(*), count(*) FILTER (WHERE confirmed) FROM shop_orders")
            placed, confirmed = await cursor.fetchone()
        return {"placed": placed, "confirmed": confirmed, "processed": stats.processed, "failed": stats.failed}
    finally:
        await worker_queue.close()
        await shop.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], int(sys.argv[2])))))
