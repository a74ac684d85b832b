"""Every argument of every public client call: any value either works (and what was sent
comes back) or raises queuectl's UsageError in one line before anything is sent, never a
driver error, TypeError or UnicodeEncodeError, and a refused call stores nothing."""

from __future__ import annotations

import math
from datetime import timedelta, timezone
from typing import Any, Callable

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queuectl.client import Queue
from queuectl.messages import Message
from queuectl.errors import UsageError
from queuectl.install import install_queue
from queuectl.client import open_queue
from queuectl.kindspec import RingSettings
from queuectl.storable import diagnostic_text

DEFAULT_MAX_ATTEMPTS = 5
ANY_CHARACTER = st.characters(codec=None, exclude_categories=())  # NUL and lone surrogates too
TEXT = st.text(ANY_CHARACTER, max_size=12)
JSON_LIKE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), TEXT),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-3, max_value=40), st.floats(), TEXT,
    st.binary(max_size=12), st.decimals(), st.fractions(), st.complex_numbers(), st.datetimes(),
    st.datetimes(timezones=st.just(timezone.utc)), st.timedeltas(), st.just(object()),
)
ANYTHING = st.one_of(
    SCALARS,
    JSON_LIKE,
    st.lists(SCALARS, max_size=4),
    st.tuples(SCALARS, SCALARS),
    st.sets(st.integers(), max_size=3),
    st.dictionaries(st.one_of(TEXT, st.integers()), JSON_LIKE, max_size=3),
)
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def rows(engine, *tables: str) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for t in tables for r in conn.execute(sa.text(f"SELECT * FROM {t} ORDER BY 1")).all()]


def attempt(engine, tables: tuple[str, ...], call: Callable[[], Any]) -> tuple[bool, Any]:
    """(True, result) when the call works; (False, None) when it raised UsageError, in one
    line, with every row as it was. Any other exception fails the test."""
    before = rows(engine, *tables)
    try:
        return True, call()
    except UsageError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 600, str(exc)
        assert rows(engine, *tables) == before
        return False, None


def same_json(got: Any, sent: Any) -> bool:
    """JSON equality as jsonb keeps it: numbers are numeric (1e308 may come back as an int of
    the same value), everything else exactly."""
    if isinstance(sent, float):
        return type(got) in (int, float) and float(got) == sent
    if isinstance(sent, list):
        return isinstance(got, list) and len(got) == len(sent) and all(map(same_json, got, sent))
    if isinstance(sent, dict):
        return isinstance(got, dict) and got.keys() == sent.keys() and all(same_json(got[k], sent[k]) for k in sent)
    return type(got) is type(sent) and got == sent


def as_payload(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def each(value: Any, n: int) -> list[Any]:
    """enqueue_many's reading of an argument: a list/tuple per item, else one value for all."""
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


def delay_of(row: sa.Row) -> float:
    return (row.due_at - row.enqueued_at).total_seconds()


# -- values a careless or hostile caller passes -----------------------------------------------------


def test_max_attempts_outside_1_to_1000_or_not_a_whole_number_is_a_usage_error(engine, orders):
    for value in (0, -1, 1001, 10**10, 1e10, 1.5, True, "3", float("nan")):
        for call in (lambda: orders.enqueue(b"x", max_attempts=value), lambda: orders.enqueue_many([b"x"], max_attempts=value)):
            with pytest.raises(UsageError, match=r"^max_attempts must be a whole number from 1 to 1000, got "):
                call()
    assert rows(engine, orders.names.qualified("meta")) == []


def test_nan_infinity_sets_and_other_non_json_header_values_are_usage_errors(engine, orders):
    for headers in ({"a": float("nan")}, {"a": float("inf")}, {"a": {1}}, {"a": object()}, {"a": b"x"}, {(1, 2): 1}):
        with pytest.raises(UsageError, match=r"^headers"):
            orders.enqueue(b"x", headers=headers)
    assert rows(engine, orders.names.qualified("meta")) == []


def test_ids_that_are_not_whole_numbers_within_bigint_are_usage_errors(orders):
    orders.enqueue(b"x")
    for items in ([2**63], [0], [1.0], ["1"], [None], [True], 5, "12"):
        for call in (orders.ack, orders.nack, orders.release, orders.extend_lease):
            with pytest.raises(UsageError, match=r"^(item ids|items) must be"):
                call(items)


# -- any value for any argument of the reliable Queue (property-based) ---------------------------------


class Reliable:
    """The queue under test, its tables, and what it stored."""

    def __init__(self, engine, queue: Queue) -> None:
        self.engine, self.queue = engine, queue
        self.tables = (queue.names.qualified("meta"), queue.names.qualified("data"))

    def empty(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(sa.text(f"TRUNCATE {', '.join(self.tables)}"))
            conn.commit()

    def stored(self) -> list[sa.Row]:
        meta, data = self.tables
        with self.engine.connect() as conn:
            return conn.execute(sa.text(f"SELECT * FROM {meta} JOIN {data} USING (id) ORDER BY id")).all()

    def attempt(self, call: Callable[[], Any]) -> tuple[bool, Any]:
        return attempt(self.engine, self.tables, call)


@pytest.fixture
def reliable(engine, orders) -> Reliable:
    return Reliable(engine, orders)


ENQUEUE_ARGS = ("payload", "headers", "priority", "delay", "title", "max_attempts")


@pytest.mark.slow
@PROPERTY
@given(data=st.data())
def test_any_value_for_an_enqueue_argument_round_trips_or_is_a_usage_error(reliable, data):
    reliable.empty()
    arg = data.draw(st.sampled_from(ENQUEUE_ARGS), label="argument")
    value = data.draw(ANYTHING, label="value")
    payload, options = (value, {}) if arg == "payload" else (b"p", {arg: value})
    ok, item_id = reliable.attempt(lambda: reliable.queue.enqueue(payload, **options))
    if not ok:
        return
    [row] = reliable.stored()
    assert row.id == item_id
    assert (row.payload, row.priority, row.title, row.max_attempts) == (
        as_payload(payload), options.get("priority", 0), options.get("title"),
        options.get("max_attempts") or DEFAULT_MAX_ATTEMPTS)
    assert same_json(row.headers, options.get("headers"))
    assert math.isclose(delay_of(row), options.get("delay") or 0.0, abs_tol=1e-5)


@pytest.mark.slow
@PROPERTY
@given(data=st.data())
def test_any_value_for_an_enqueue_many_argument_round_trips_or_is_a_usage_error(reliable, data):
    reliable.empty()
    arg = data.draw(st.sampled_from(("payloads", *ENQUEUE_ARGS[1:])), label="argument")
    # one entry per payload half of the time, so that the per-item checks are reached too
    value = data.draw(st.one_of(ANYTHING, st.lists(ANYTHING, min_size=3, max_size=3)), label="value")
    payloads, options = (value, {}) if arg == "payloads" else ([b"a", b"b", b"c"], {arg: value})
    ok, ids = reliable.attempt(lambda: reliable.queue.enqueue_many(payloads, **options))
    if not ok:
        return
    got = reliable.stored()
    n = len(got)
    assert [r.id for r in got] == ids
    assert [r.payload for r in got] == [as_payload(p) for p in payloads]
    assert [r.title for r in got] == each(options.get("title"), n)
    assert [r.priority for r in got] == each(options.get("priority", 0), n)
    assert [r.max_attempts for r in got] == [options.get("max_attempts") or DEFAULT_MAX_ATTEMPTS] * n
    assert all(same_json(r.headers, h) for r, h in zip(got, options.get("headers") or [None] * n))
    assert all(math.isclose(delay_of(r), d or 0.0, abs_tol=1e-5) for r, d in zip(got, each(options.get("delay"), n)))


# Each consumer call with one argument taken from the property, the others valid:
# (call, the status an item it touched ends in, or None when it does not change status).
CONSUMER_CALLS: dict[str, tuple[Callable[[Queue, list[Message], Any], Any], int | None]] = {
    "ack(items)": (lambda q, held, v: q.ack(v), 2),
    "nack(items)": (lambda q, held, v: q.nack(v), 0),
    "release(items)": (lambda q, held, v: q.release(v), 0),
    "extend_lease(items)": (lambda q, held, v: q.extend_lease(v), 1),
    "ack_and_dequeue(done)": (lambda q, held, v: q.ack_and_dequeue(v, 1), 2),
    "nack(error)": (lambda q, held, v: q.nack(held, v), None),
    "nack(base_delay)": (lambda q, held, v: q.nack(held, base_delay=v), None),
    "nack(max_delay)": (lambda q, held, v: q.nack(held, max_delay=v), None),
    "extend_lease(lease)": (lambda q, held, v: q.extend_lease(held, v), None),
    "dequeue(n)": (lambda q, held, v: q.dequeue(v), None),
    "dequeue(lease)": (lambda q, held, v: q.dequeue(1, lease=v), None),
    "ack_and_dequeue(n)": (lambda q, held, v: q.ack_and_dequeue(held, v), None),
    "ack_and_dequeue(lease)": (lambda q, held, v: q.ack_and_dequeue(held, 1, lease=v), None),
}


@pytest.mark.slow
@PROPERTY
@given(data=st.data())
def test_any_value_for_a_consumer_argument_works_or_is_a_usage_error(reliable, data):
    reliable.empty()
    queue = reliable.queue
    queue.enqueue_many([b"a", b"b", b"c"])
    held = queue.dequeue(2, lease=600)
    held_ids = {m.id for m in held}
    arg = data.draw(st.sampled_from(sorted(CONSUMER_CALLS)), label="argument")
    call, touched_status = CONSUMER_CALLS[arg]
    ids_like = st.lists(st.one_of(st.sampled_from(held), st.sampled_from(sorted(held_ids)), SCALARS), max_size=4)
    value = data.draw(st.one_of(ANYTHING, ids_like), label="value")
    ok, result = reliable.attempt(lambda: call(queue, held, value))
    if arg == "nack(error)":
        assert ok, "a nack's error reason is never refused"
        assert {r.last_error for r in reliable.stored() if r.id in held_ids} == {diagnostic_text(value)}
    if not ok:
        return
    if touched_status is not None:
        touched = held_ids & {v.id if isinstance(v, Message) else v for v in value}
        assert all(r.status == touched_status for r in reliable.stored() if r.id in touched)
    if arg in ("dequeue(lease)", "ack_and_dequeue(lease)"):
        lease = queue.info.settings.lease_seconds if value is None else value
        assert all(math.isclose((m.leased_until - m.dequeued_at).total_seconds(), lease, abs_tol=1e-3) for m in result)
    if arg == "extend_lease(lease)":
        assert sorted(result) == sorted(held_ids)


@pytest.mark.slow
@PROPERTY
@given(value=ANYTHING)
def test_any_worker_name_is_stored_as_given_or_is_a_usage_error(reliable, value):
    reliable.empty()
    reliable.queue.enqueue(b"x")
    ok, queue = reliable.attempt(lambda: Queue(reliable.engine, "orders", worker=value))
    if ok:
        with queue:
            [claimed] = queue.dequeue(1)
            assert [r.lease_owner for r in reliable.stored()] == [value or queue.worker]


# -- the other kinds ------------------------------------------------------------------------------------

# Each call with one argument taken from the property, per kind (heap stands for fifo,
# stack and watermark: the same KindQueue code).
KIND_CALLS: dict[str, dict[str, Callable[[Any, Any], Any]]] = {
    "heap": {
        "enqueue(payload)": lambda q, v: q.enqueue(v),
        "enqueue(headers)": lambda q, v: q.enqueue(b"p", headers=v),
        "enqueue(priority)": lambda q, v: q.enqueue(b"p", priority=v),
        "enqueue(delay)": lambda q, v: q.enqueue(b"p", delay=v),
        "enqueue(title)": lambda q, v: q.enqueue(b"p", title=v),
        "enqueue(due_at)": lambda q, v: q.enqueue(b"p", due_at=v),
        "enqueue_many(payloads)": lambda q, v: q.enqueue_many(v),
        "enqueue_many(headers)": lambda q, v: q.enqueue_many([b"a", b"b"], headers=v),
        "dequeue(n)": lambda q, v: q.dequeue(v),
    },
    "pending": {
        "enqueue(delay)": lambda q, v: q.enqueue(b"p", delay=v),
        "enqueue(due_at)": lambda q, v: q.enqueue(b"p", due_at=v),
        "enqueue_many(delay)": lambda q, v: q.enqueue_many([b"a", b"b"], delay=v),
        "enqueue_many(due_at)": lambda q, v: q.enqueue_many([b"a", b"b"], due_at=v),
        "enqueue_many(headers)": lambda q, v: q.enqueue_many([b"a", b"b"], headers=v),
    },
    "ring": {
        "enqueue(timeout)": lambda q, v: q.enqueue(b"p", timeout=v),
        "enqueue_many(timeout)": lambda q, v: q.enqueue_many([b"a", b"b"], timeout=v),
        "enqueue_many(headers)": lambda q, v: q.enqueue_many([b"a", b"b"], headers=v),
        "dequeue(timeout)": lambda q, v: q.dequeue(1, timeout=v),
        "dequeue(n)": lambda q, v: q.dequeue(v),
        "repair(grace)": lambda q, v: q.repair(grace=v),
    },
}


@pytest.fixture
def other(engine, kind):
    install_queue(engine, "q", kind, RingSettings(size=16) if kind == "ring" else None)
    with open_queue(engine, "q") as queue:
        yield queue


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KIND_CALLS))
@PROPERTY
@given(data=st.data())
def test_any_value_for_an_argument_of_the_other_kinds_works_or_is_a_usage_error(engine, other, kind, data):
    while other.dequeue(100):
        pass
    table = other.names.qualified("ring" if kind == "ring" else "items")
    arg = data.draw(st.sampled_from(sorted(KIND_CALLS[kind])), label="argument")
    value = data.draw(st.one_of(ANYTHING, st.lists(ANYTHING, min_size=2, max_size=2)), label="value")
    if arg == "dequeue(timeout)":
        other.enqueue(b"p")  # a message waits, so that a long timeout is not waited out
    ok, result = attempt(engine, (table,), lambda: KIND_CALLS[kind][arg](other, value))
    if not ok or not arg.startswith("enqueue") or kind == "pending":
        return  # (pending items given a delay or due time are not all due now)
    got = other.dequeue(10)
    assert [item.id for item in got] == (result if isinstance(result, list) else [result])
    if arg == "enqueue(payload)":
        assert [item.payload for item in got] == [as_payload(value)]
    if arg == "enqueue_many(payloads)":
        assert [item.payload for item in got] == [as_payload(p) for p in value]
    if arg.endswith("(headers)"):
        sent = (value or [None, None]) if arg.startswith("enqueue_many") else [value]
        assert all(same_json(item.headers, h) for item, h in zip(got, sent))
