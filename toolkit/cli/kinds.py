"""Commands of two queue kinds: `queuectl correct-watermark`, `queuectl repair-ring`, and a fan-out
ring's subscriptions: `queuectl subscribe`, `unsubscribe` and `subscriptions`."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Annotated, Optional

import typer

from queuectl.cli.options import (
    Fitted, JobQueueArg as QueueArg, SchemaOption, UrlOption, fail, json_flag, make_table, out, print_fact,
)
from queuectl.engine import make_engine
from queuectl.names import DEFAULT_SCHEMA, validate_queue_name

app = typer.Typer()


@app.command("correct-watermark")
def correct_watermark_command(name: QueueArg, url: UrlOption = None, schema: SchemaOption = DEFAULT_SCHEMA) -> None:
    """Recompute a watermark queue's true low bound and fix its stored watermark (the 5-minute job)."""
    validate_queue_name(name)
    from queuectl.client import correct_watermark

    result = correct_watermark(make_engine(url), name, schema=schema)
    sys.stdout.write(json.dumps(asdict(result)) + "\n")


@app.command("repair-ring")
def repair_ring_command(
    name: QueueArg,
    grace: Annotated[float, typer.Option(help="Seconds a slot must sit unchanged before it is repaired.")] = 30.0,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Run a ring queue's recovery path: tombstone dead pushers' positions, re-push dead poppers' messages."""
    validate_queue_name(name)
    from queuectl.client import repair_ring

    result = repair_ring(make_engine(url), name, schema=schema, grace=grace)
    sys.stdout.write(json.dumps(asdict(result)) + "\n")



SubscriptionArg = Annotated[str, typer.Argument(
    help="Subscription name: 1-48 lowercase letters, digits and underscores, starting with a letter.")]


def _fanout_ring(url: str | None, name: str, schema: str):  # -> RingQueue
    from queuectl.client import RingQueue

    queue = RingQueue(make_engine(url), name, schema=schema)
    if not queue.fanout:
        queue.close()
        fail(f"ring {name!r} does not fan out: subscriptions need a ring installed with --fanout")
    return queue


@app.command("subscribe")
def subscribe_command(
    name: QueueArg,
    subscription: SubscriptionArg,
    lag_limit: Annotated[Optional[int], typer.Option(
        "--lag-limit", min=1, help="Messages the subscription may fall behind the pushes before it is marked "
        "behind (health CRITICAL) \\[default: the ring's, set at install; half the ring unless given].",
        show_default=False)] = None,
    drop_when_behind: Annotated[Optional[bool], typer.Option(
        "--drop-when-behind/--keep-when-behind", help="Past its lag limit, let the next push drop the "
        "subscription (it misses the messages from then on; the producer stops waiting for it), or keep it and "
        "let it hold the producer back once the ring is full for it \\[default: the ring's, set at install; keep].",
        show_default=False)] = None,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Add a subscription to a fan-out ring, online: it receives every message pushed from now on.

    Each subscription reads every message in order; its consumers compete (each message once per subscription). The producer waits for the slowest subscription when the ring is full for it.
    """  # noqa: E501 (one line per paragraph: --help wraps them itself)
    validate_queue_name(name)
    queue = _fanout_ring(url, name, schema)
    with queue:
        info = queue.subscribe(subscription, lag_limit=lag_limit, drop_when_behind=drop_when_behind)
    print_fact(f"subscribed {info.name} to ring {name}: from position {info.start_pos}, lag limit {info.lag_limit}, "
               f"{'dropped' if info.drop_when_behind else 'kept'} when behind")


@app.command("unsubscribe")
def unsubscribe_command(
    name: QueueArg,
    subscription: SubscriptionArg,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Remove a subscription (active or dropped) from a fan-out ring.

    The producer stops waiting for it and its consumers' next call fails. Exit code 1 if there was no such subscription.
    """  # noqa: E501 (one line per paragraph: --help wraps them itself)
    validate_queue_name(name)
    with _fanout_ring(url, name, schema) as queue:
        removed = queue.unsubscribe(subscription)
    if not removed:
        print_fact(f"ring {name} has no subscription {subscription}")
        raise typer.Exit(1)
    print_fact(f"unsubscribed {subscription} from ring {name}")


SubscriptionsJsonOption = json_flag("Print a JSON list, one object per subscription (the columns below, times in ISO 8601).")


@app.command("subscriptions")
def subscriptions_command(
    name: QueueArg,
    as_json: SubscriptionsJsonOption = False,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """List a fan-out ring's subscriptions.

    For each: its lag (messages pushed that it has not been handed), its lag limit, whether it is behind (over the limit, or dropped), and its claims not yet acknowledged.
    """  # noqa: E501 (one line per paragraph: --help wraps them itself)
    validate_queue_name(name)
    with _fanout_ring(url, name, schema) as queue:
        subs = queue.subscriptions()
    if as_json:
        sys.stdout.write(json.dumps([{k: (v.isoformat() if hasattr(v, "isoformat") else v)
                                      for k, v in s._asdict().items()} for s in subs]) + "\n")
        return
    table = make_table(["subscription", "lag", "lag limit", "state", "claimed", "expired", "from", "next"],
                       right=(1, 2, 4, 5, 6, 7))
    for s in subs:
        state = "dropped" if s.dropped_at else ("behind" if s.behind else "ok")
        table.add_row(s.name, f"{s.lag:,}", f"{s.lag_limit:,}", state, f"{s.claimed:,}", f"{s.expired:,}",
                      f"{s.start_pos:,}", f"{s.next_pos:,}")
    out.print(Fitted(table))
