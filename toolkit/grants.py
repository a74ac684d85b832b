"""Least privilege: `queuectl grant NAME --producer ROLE --consumer ROLE`.

A producer role may call the queue's enqueue functions, a consumer role its dequeue
functions (and ack/nack/extend/release for a reliable queue); neither gets any privilege
on the queue's tables. What that takes per engine is in sql/<engine>/grant.sql
(PostgreSQL: SECURITY DEFINER functions with a fixed search_path, EXECUTE revoked from
PUBLIC; SQL Server: ownership chaining). Both roles may read the catalog's registry,
which the client reads to find its queue.
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from queuectl.engine import adapter_for
from queuectl.errors import UsageError
from queuectl.registry import require_queue
from queuectl.names import CLAIM_CALLS, DEFAULT_SCHEMA, LEASE_CALLS, ROTATION_CALLS, QueueNames, quote_ident
from queuectl.sqlfiles import render

DEFAULT_PRODUCER_CALLS = ("enqueue", "enqueue_many")
PRODUCER_CALLS = {
    # A ring producer keeps a push claim in its session when the ring is full; its client's
    # close() gives it up through ring_release, so producers need that call too.
    "ring": ("enqueue", "enqueue_many", "ring_release", "publish"),
}
CONSUMER_CALLS = {
    # wait_begin/wait_end (reliable_0006): a consumer registers before it sleeps on the channel
    "reliable": ("dequeue", "ack", "nack", "extend_lease", "release", "ack_dequeue", "wait_begin", "wait_end"),
    "ring": ("dequeue", "ring_release", "sub_take", "sub_done", "sub_return"),
}
DEFAULT_CONSUMER_CALLS = ("dequeue",)
# Functions granted to nobody but still locked down (SECURITY DEFINER, no EXECUTE for
# PUBLIC): maintenance calls, the activation trigger's function, the rotation's calls and
# the per-slot claims, acks, extends, nacks and releases (the helpers run inside the API
# functions, as their owner).
MAINTENANCE_CALLS = {
    "reliable": ("notify", *ROTATION_CALLS, *CLAIM_CALLS, *LEASE_CALLS),
    "watermark": ("correct_watermark",),
    # the fan-out ring's subscriptions are managed by the owner (queuectl subscribe); its guard
    # trigger's function runs for the owner's functions only
    "ring": ("ring_repair", "subscribe", "unsubscribe", "subscriptions", "fanout_guard"),
}
# The argument types (PostgreSQL's oidvectortypes form) of each call of each kind, over all
# of the kind's revisions. A grant matches a function by its name AND these types: a name
# alone could also match a function of another queue that an older install let share it
# (queue "b"'s b_ack_dequeue and queue "b_ack"'s), whose types differ.
# tests/test_object_names.py checks this against every revision of every kind.
_ONE_TABLE_ARGUMENTS = {"enqueue": ("bytea, jsonb",), "enqueue_many": ("bytea[], jsonb[]",), "dequeue": ("integer",)}
FUNCTION_ARGUMENTS: dict[str, dict[str, tuple[str, ...]]] = {
    "reliable": {
        "enqueue": ("bytea, jsonb, smallint, interval, text, integer",),
        "enqueue_many": ("bytea[], jsonb[], smallint[], interval[], text[], integer",),
        "dequeue": ("integer, double precision, text",),
        "ack": ("bigint[], text",),
        "nack": ("bigint[], text, text, double precision, double precision",),
        "extend_lease": ("bigint[], double precision, text",),
        "release": ("bigint[], text",),
        "ack_dequeue": ("bigint[], integer, double precision, text",),
        "notify": ("",),
        "wait_begin": ("",),
        "wait_end": ("",),
        "rot_move": ("bigint[], smallint, smallint",),
        "rot_follow": ("bigint[], bigint",),
        "rot_state": ("",),
        "rot_switch": ("bigint",),
        "rot_seal": ("integer",),
        "rot_mark": ("text, bigint",),
        "rot_copy": ("smallint, bigint, integer", "smallint, bigint, integer, xid8"),
        "rot_next_empty": ("",),
        "rot_empty": ("integer", "integer, bigint, xid8"),
        **{call: ("smallint[], integer, double precision, text",) for call in CLAIM_CALLS if call.startswith("claim")},
        **{call: ("bigint[], text",) for call in CLAIM_CALLS if call.startswith("ack")},
        **{call: ("bigint[], double precision, text",) for call in LEASE_CALLS if call.startswith("extend")},
        **{call: ("bigint[], text, text, double precision, double precision",)
           for call in LEASE_CALLS if call.startswith("nack")},
        **{call: ("bigint[], text",) for call in LEASE_CALLS if call.startswith("release")},
    },
    "heap": _ONE_TABLE_ARGUMENTS,
    "fifo": _ONE_TABLE_ARGUMENTS,
    "stack": _ONE_TABLE_ARGUMENTS,
    "pending": {
        "enqueue": ("bytea, jsonb, timestamp with time zone, interval",),
        "enqueue_many": ("bytea[], jsonb[], timestamp with time zone[], interval[]",),
        "dequeue": ("integer",),
    },
    "watermark": {**_ONE_TABLE_ARGUMENTS, "correct_watermark": ("",)},
    "ring": {
        "enqueue": ("bytea, jsonb, double precision",),
        "enqueue_many": ("bytea[], jsonb[], double precision",),
        "dequeue": ("integer, double precision",),
        "ring_repair": ("interval, double precision",),
        "ring_release": ("", "double precision"),
        "publish": ("bytea[], jsonb[], double precision",),
        "sub_take": ("text, integer, double precision, double precision",),
        "sub_done": ("text, bigint[], integer[]",),
        "sub_return": ("text, bigint[], integer[]",),
        "subscribe": ("text, bigint, boolean",),
        "unsubscribe": ("text",),
        "subscriptions": ("",),
        "fanout_guard": ("",),
    },
}
ROLE_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


def validate_role(role: str) -> str:
    if not isinstance(role, str) or not ROLE_RE.fullmatch(role):
        raise UsageError(
            f"invalid role name {role!r}: use 1-63 lowercase letters, digits and underscores, starting with a letter"
        )
    return role


def producer_calls(kind: str) -> tuple[str, ...]:
    return PRODUCER_CALLS.get(kind, DEFAULT_PRODUCER_CALLS)


def consumer_calls(kind: str) -> tuple[str, ...]:
    return CONSUMER_CALLS.get(kind, DEFAULT_CONSUMER_CALLS)


def api_calls(kind: str) -> tuple[str, ...]:
    """Every call a producer or a consumer of this kind may be granted, each once."""
    return tuple(dict.fromkeys(producer_calls(kind) + consumer_calls(kind)))


def secured_calls(kind: str) -> tuple[str, ...]:
    """Every function `queuectl grant` locks down: the API calls and the maintenance ones."""
    return api_calls(kind) + MAINTENANCE_CALLS.get(kind, ())


def function_values(names: QueueNames, kind: str, calls: tuple[str, ...]) -> dict[str, str]:
    """grant.sql's {{schema_literal}}, {{function_literals}} (the functions' names, for SQL
    Server, where one schema holds one object of a name) and {{function_signatures}}
    ((name, argument types) pairs, for PostgreSQL, where names may be overloaded), as SQL
    literals: validated identifiers and the fixed types above hold no quote."""
    arguments = FUNCTION_ARGUMENTS[kind]
    return {
        "schema_literal": f"'{names.schema}'",
        "function_literals": ", ".join(f"'{names.table(call)}'" for call in calls),
        "function_signatures": ", ".join(
            f"('{names.table(call)}', '{types}')" for call in calls for types in arguments[call]
        ),
    }


def _run(conn: Connection, file_values: dict[str, str], section: str, params: dict[str, str] | None = None) -> None:
    adapter = adapter_for(conn)
    for statement in adapter.split_batches(render(adapter.sql_dir, "grant", section, file_values)):
        conn.execute(sa.text(statement), params or {})


def granted_functions(conn: Connection, name: str, role: str, schema: str = DEFAULT_SCHEMA) -> list[str]:
    """The queue's functions `role` may execute."""
    names = QueueNames(name, schema)
    info = require_queue(conn, name, schema)
    values = function_values(names, info.kind, api_calls(info.kind))
    sql = render(adapter_for(conn).sql_dir, "grant", "granted_functions", values)
    return list(conn.execute(sa.text(sql), {"role": validate_role(role)}).scalars())


def grant_queue(
    engine: Engine,
    name: str,
    producer: str | None = None,
    consumer: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> dict[str, list[str]]:
    """Grant EXECUTE on the queue's API to a producer and/or a consumer role.

    Returns {role: the queue functions it may now execute}.
    """
    names = QueueNames(name, schema)
    roles = [role for role in (producer, consumer) if role]
    if not roles:
        raise UsageError("give --producer ROLE and/or --consumer ROLE")
    for role in roles:
        validate_role(role)
    with engine.connect() as conn:
        info = require_queue(conn, name, schema)
        base = {**names.template_values(), "schema_literal": f"'{schema}'"}
        exists = render(adapter_for(conn).sql_dir, "grant", "role_exists", {})
        for role in roles:
            if not conn.execute(sa.text(exists), {"role": role}).scalar():
                raise UsageError(f"role {role!r} does not exist in this database: create it first")
        _run(conn, {**base, **function_values(names, info.kind, secured_calls(info.kind))}, "secure_functions")
        for role, calls in ((producer, producer_calls(info.kind)), (consumer, consumer_calls(info.kind))):
            if role:
                _run(conn, {**base, **function_values(names, info.kind, calls), "role": quote_ident(role)},
                     "grant_execute")
        conn.commit()
        return {role: granted_functions(conn, name, role, schema) for role in roles}
