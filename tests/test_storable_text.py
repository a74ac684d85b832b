"""Text the clients send is storable or refused in one line (queuectl.storable).

PostgreSQL's text and jsonb cannot hold NUL (U+0000) and a lone surrogate has no UTF-8
form. A title, header or worker name the caller chose is refused with a UsageError naming
the field, before anything is sent; a nack's error reason is diagnostic text and is always
stored, with NUL and lone surrogates replaced by U+FFFD and its length capped.
"""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import run_cli
from queuectl.catalog import QueueSettings
from queuectl.client import Queue
from queuectl.errors import UsageError
from queuectl.install import install_queue
from queuectl.client import open_queue

OTHER_KINDS = ("heap", "fifo", "stack", "pending", "watermark", "ring")
# every character, lone surrogates (category Cs) and NUL included
ANY_CHARACTER = st.characters(codec=None, exclude_categories=())


def stored(engine, queue: Queue, columns: str = "count(*)") -> list[tuple]:
    """Columns of the queue's meta table, all rows."""
    meta = queue.names.qualified("meta")
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(f"SELECT {columns} FROM {meta} ORDER BY 1")).all()]


# -- diagnostic text: never refused ----------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(text=st.text(ANY_CHARACTER, max_size=3000))
def test_diagnostic_text_is_always_storable_and_keeps_what_it_can(text):
    from queuectl.storable import DIAGNOSTIC_TEXT_LIMIT, diagnostic_text

    made = diagnostic_text(text)
    made.encode("utf-8")  # no lone surrogate left
    assert "\x00" not in made and len(made) == min(len(text), DIAGNOSTIC_TEXT_LIMIT)
    assert all(m == t or (m == "\ufffd" and (t == "\x00" or "\ud800" <= t <= "\udfff")) for m, t in zip(made, text))


def test_diagnostic_text_of_any_object_is_text_even_when_its_str_fails():
    from queuectl.storable import diagnostic_text

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert diagnostic_text(None) is None
    assert diagnostic_text(ValueError("bad\x00value")) == "ValueError: bad\ufffdvalue"
    assert diagnostic_text(Unprintable()) == "<Unprintable that cannot be shown as text>"
    assert diagnostic_text(42) == "42"


def test_a_nack_reason_with_nul_and_lone_surrogates_is_stored_not_refused(engine, orders):
    ids = orders.enqueue_many([b"a", b"b"])
    got = orders.dequeue(2)
    reason = "HandlerError: bad byte \x00 and \udcff here " + "x" * 5000
    assert orders.nack(got, reason) == {ids[0]: "ready", ids[1]: "ready"}
    [(error,)] = set(stored(engine, orders, "last_error"))
    assert error.startswith("HandlerError: bad byte \ufffd and \ufffd here xxx") and len(error) == 2000


@pytest.fixture
def poison(engine):
    """A queue whose items go DEAD at their first failure."""
    install_queue(engine, "poison", settings=QueueSettings(max_attempts=1))
    with Queue(engine, "poison") as queue:
        yield queue


def test_a_processing_block_that_fails_with_nul_in_its_error_nacks_its_items(engine, poison):
    queue = poison
    queue.enqueue(b"poison")
    with pytest.raises(ValueError):
        with queue.processing(1):
            raise ValueError("NUL \x00 inside")
    assert stored(engine, queue, "status, last_error") == [(3, "ValueError: NUL \ufffd inside")]


def test_a_worker_whose_handler_fails_with_nul_dead_letters_the_item_and_finishes(engine, poison):
    """The worker's nack goes through the same rule: the poison message ends DEAD with the
    error stored, and a --burst worker returns instead of renewing its lease forever."""
    from queuectl.worker import Worker

    queue = poison
    queue.enqueue(b"poison")

    def handler(message) -> None:
        raise RuntimeError("handler text with \x00 in it")

    worker = Worker(queue, handler, burst=True, handle_signals=False, poll_interval=0.1)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    runner.join(60)
    alive = runner.is_alive()
    if alive:
        worker.stop()
    assert not alive, "the worker did not finish its burst"
    assert stored(engine, queue, "status, last_error") == [(3, "RuntimeError: handler text with \ufffd in it")]


# -- text the caller chose: refused in one line, naming the field ----------------------------------


def test_a_title_with_nul_or_a_lone_surrogate_is_refused_and_nothing_is_stored(engine, orders):
    cases = [
        (lambda: orders.enqueue(b"x", title="ab\x00c"),
         "title contains a NUL character (U+0000) at position 2, which the database cannot store"),
        (lambda: orders.enqueue(b"x", title="\udcff"),
         "title contains a lone surrogate (U+DCFF) at position 0, which has no UTF-8 form"),
        (lambda: orders.enqueue_many([b"x", b"y"], title=["ok", "n\x00"]),
         "title[1] contains a NUL character (U+0000) at position 1, which the database cannot store"),
        (lambda: orders.enqueue(b"x", title=b"bytes"), "title must be text (str) or None, not bytes"),
    ]
    for call, message in cases:
        with pytest.raises(UsageError) as err:
            call()
        assert str(err.value) == message
    assert stored(engine, orders) == [(0,)]


HEADER_CASES = [
    ({"a": "\x00"}, "headers['a'] contains a NUL character (U+0000) at position 0, which the database cannot store"),
    ({"a\x00": 1}, "key 'a\\x00' of headers contains a NUL character (U+0000) at position 1, which the database cannot store"),
    ({"a": ["ok", {"b": "\udc80"}]}, "headers['a'][1]['b'] contains a lone surrogate (U+DC80) at position 0, which has no UTF-8 form"),
    ({"a": float("nan")}, "headers['a'] is nan: JSON has no NaN or Infinity"),
    ({"a": [float("-inf")]}, "headers['a'][0] is -inf: JSON has no NaN or Infinity"),
    ({"a": {1, 2}}, "headers['a'] is a set, which is not a JSON value (use dict, list, str, int, float, bool or None)"),
    ({"a": (1, 2)}, "headers['a'] is a tuple, which is not a JSON value (use dict, list, str, int, float, bool or None)"),
    ({1: "a"}, "headers has a key of type int (1): JSON object keys are text"),
    (["a"], "headers must be a dict of JSON values or None, not list"),
]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["reliable", *OTHER_KINDS])
def test_headers_that_cannot_be_stored_as_given_are_refused_by_every_kind(engine, kind):
    install_queue(engine, "q", kind)
    with open_queue(engine, "q") as queue:
        for headers, message in HEADER_CASES:
            with pytest.raises(UsageError) as err:
                queue.enqueue(b"x", headers=headers)
            assert str(err.value) == message, kind
            with pytest.raises(UsageError) as err:
                queue.enqueue_many([b"x", b"y"], headers=[None, headers])
            assert str(err.value) == message.replace("headers", "headers[1]", 1), kind
        with pytest.raises(UsageError, match=r"^payload contains a lone surrogate \(U\+D800\) at position 1, which has no UTF-8 form"):
            queue.enqueue("a\ud800")
        with pytest.raises(UsageError, match=r"^payloads\[1\] contains a lone surrogate"):
            queue.enqueue_many(["ok", "\ud800"])
        assert queue.counts().get("ready", 0) == 0
        # NUL in a payload is data like any other byte (bytea), given as bytes or as text
        queue.enqueue("a\x00b", headers={"k": "v"})
        [item] = queue.dequeue(1)
        assert (item.payload, item.headers) == (b"a\x00b", {"k": "v"})


def test_a_worker_name_that_cannot_be_stored_is_refused(engine, orders):
    with pytest.raises(UsageError, match=r"^worker contains a NUL character \(U\+0000\) at position 3"):
        Queue(engine, "orders", worker="pod\x001")
    with pytest.raises(UsageError, match=r"^worker must be text \(str\) or None, not int"):
        Queue(engine, "orders", worker=7)


def test_cli_headers_with_nul_are_a_one_line_usage_error_and_store_nothing(engine, db_url, orders):
    result = run_cli("enqueue", "orders", "x", "--headers", '{"a":"\\u0000"}', url=db_url)
    assert result.returncode == 2
    assert result.stderr.decode().splitlines() == [
        "error: headers['a'] contains a NUL character (U+0000) at position 0, which the database cannot store"]
    assert stored(engine, orders) == [(0,)]
