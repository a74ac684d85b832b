"""The payload limit (reliable_0003, reliable_0010): the server refuses an enqueue whose
message (payload + title + headers, bytes as stored) is over the queue's max_payload_bytes
and stores nothing; payloads within it round-trip byte for byte."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queuectl.catalog import QueueSettings
from queuectl.defaults import DEFAULT_MAX_PAYLOAD_BYTES
from queuectl.client import Queue
from queuectl.errors import PayloadTooLarge, UsageError
from queuectl.install import downgrade_queue, head_of, install_queue, upgrade_queue

from conftest import run_cli

LIMIT = 4096


def table_counts(engine, queue: Queue) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            part: conn.execute(sa.text(f"SELECT count(*) FROM {queue.names.qualified(part)}")).scalar_one()
            for part in ("meta", "data", "history")
        }


@pytest.fixture
def small(engine):
    install_queue(engine, "small", settings=QueueSettings(max_payload_bytes=LIMIT))
    queue = Queue(engine, "small")
    yield queue
    queue.close()


def test_an_enqueue_over_the_limit_is_refused_and_stores_nothing(engine, small):
    small.enqueue(b"x")
    before = table_counts(engine, small)
    with pytest.raises(PayloadTooLarge) as err:
        small.enqueue(b"y" * (LIMIT + 1), headers={"k": "v"})
    assert isinstance(err.value, UsageError)  # the CLI prints it as one line, exit 2
    assert str(err.value) == (
        f"queue 'small': message of {LIMIT + 11} bytes (payload {LIMIT + 1} + title 0 + headers 10) "
        f"is over max_payload_bytes {LIMIT}: nothing was enqueued"
    )
    assert table_counts(engine, small) == before
    assert small.enqueue(b"z" * LIMIT) > 0  # exactly the limit is allowed


def test_enqueue_many_with_one_oversized_payload_stores_none_of_them(engine, small):
    before = table_counts(engine, small)
    payloads = [b"a", b"b" * LIMIT, b"c" * (LIMIT + 10), b"d"]
    with pytest.raises(PayloadTooLarge, match=rf"message 3 of 4 is {LIMIT + 10} bytes \(payload {LIMIT + 10} \+ "
                                              rf"title 0 \+ headers 0\), over max_payload_bytes {LIMIT}"):
        small.enqueue_many(payloads)
    assert table_counts(engine, small) == before
    ids = small.enqueue_many(payloads[:2] + payloads[3:])
    assert len(ids) == 3 and table_counts(engine, small)["data"] == before["data"] + 3


def test_the_server_enforces_the_limit_for_any_caller(engine, small):
    """Not the Python client: the SQL API itself refuses, with SQLSTATE QC413."""
    before = table_counts(engine, small)
    with engine.connect() as conn:
        with pytest.raises(sa.exc.DBAPIError) as err:
            conn.execute(sa.text('SELECT queuectl.small_enqueue(CAST(:p AS bytea))'), {"p": b"q" * (LIMIT + 1)})
        assert err.value.orig.sqlstate == "QC413"
        conn.rollback()
        with pytest.raises(sa.exc.DBAPIError) as err:
            conn.execute(sa.text("SELECT * FROM queuectl.small_enqueue_many(CAST(:p AS bytea[]))"),
                         {"p": [b"ok", b"q" * (LIMIT + 1)]})
        assert err.value.orig.sqlstate == "QC413"
    assert table_counts(engine, small) == before


def test_the_default_limit_is_one_mebibyte(engine, orders):
    assert orders.info.settings.max_payload_bytes == DEFAULT_MAX_PAYLOAD_BYTES == 1024 * 1024
    assert orders.enqueue(b"\x00" * DEFAULT_MAX_PAYLOAD_BYTES) > 0
    with pytest.raises(PayloadTooLarge, match=r"message of 1048577 bytes \(payload 1048577 \+ title 0 \+ headers 0\) "
                                              "is over max_payload_bytes 1048576"):
        orders.enqueue(b"\x00" * (DEFAULT_MAX_PAYLOAD_BYTES + 1))
    assert table_counts(engine, orders)["meta"] == 1


@pytest.mark.slow
def test_cli_install_sets_the_limit_and_enqueue_refuses_in_one_line(db_url, engine):
    result = run_cli("install", "tiny", "--max-payload-bytes", "10", url=db_url)
    assert result.returncode == 0, result.stderr.decode()
    listed = json.loads(run_cli("list", "--json", url=db_url).stdout)
    assert listed[0]["name"] == "tiny"
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT settings FROM queuectl.queues WHERE name = 'tiny'")).scalar_one()
    assert stored["max_payload_bytes"] == 10
    assert run_cli("enqueue", "tiny", "0123456789", url=db_url).returncode == 0
    result = run_cli("enqueue", "tiny", "-", input=b"01234567890", url=db_url)
    assert result.returncode == 2
    message = result.stderr.decode().strip()
    assert message == ("error: queue 'tiny': message of 11 bytes (payload 11 + title 0 + headers 0) "
                       "is over max_payload_bytes 10: nothing was enqueued")
    result = run_cli("enqueue", "tiny", "0", "--title", "0123456789", url=db_url)
    assert result.returncode == 2
    assert result.stderr.decode().strip() == ("error: queue 'tiny': message of 11 bytes (payload 1 + title 10 + headers 0) "
                                              "is over max_payload_bytes 10: nothing was enqueued")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM queuectl.tiny_data")).scalar_one() == 1
    bad = run_cli("install", "other", "--max-payload-bytes", "0", url=db_url)
    assert bad.returncode == 2 and "max-payload-bytes must be a whole number from 1" in bad.stderr.decode()


def test_a_queue_from_before_the_limit_upgrades_to_the_default_limit(engine):
    assert head_of("reliable") >= "reliable_0003"
    install_queue(engine, "old", revision="reliable_0002")
    with engine.connect() as conn:
        conn.execute(sa.text("UPDATE queuectl.queues SET settings = settings - 'max_payload_bytes' WHERE name = 'old'"))
        conn.commit()
    with Queue(engine, "old") as queue:
        big = b"b" * (DEFAULT_MAX_PAYLOAD_BYTES + 1)
        queue.enqueue(big)  # 0002 has no limit
        assert upgrade_queue(engine, "old") == ("reliable_0002", head_of("reliable"))
        with pytest.raises(PayloadTooLarge):
            queue.enqueue(big)
        with engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT settings FROM queuectl.queues WHERE name = 'old'")).scalar_one()
        assert stored["max_payload_bytes"] == DEFAULT_MAX_PAYLOAD_BYTES
        # the downgrade takes the limit away again, and nothing else
        assert downgrade_queue(engine, "old", "reliable_0002") == (head_of("reliable"), "reliable_0002")
        queue.enqueue(big)
        assert [len(m.payload) for m in queue.dequeue(10)] == [len(big), len(big)]


# -- the limit covers the whole message: payload, title and headers (reliable_0010) --------------


def refusal(total: int, payload: int, title: int, headers: int, limit: int = LIMIT) -> str:
    return (f"queue 'small': message of {total} bytes (payload {payload} + title {title} + headers {headers}) "
            f"is over max_payload_bytes {limit}: nothing was enqueued")


def test_a_title_over_the_limit_is_refused_and_stores_nothing(engine, small):
    before = table_counts(engine, small)
    with pytest.raises(PayloadTooLarge) as err:
        small.enqueue(b"p", title="t" * LIMIT)
    assert str(err.value) == refusal(LIMIT + 1, 1, LIMIT, 0)
    assert table_counts(engine, small) == before


def test_headers_over_the_limit_are_refused_and_store_nothing(engine, small):
    before = table_counts(engine, small)
    with pytest.raises(PayloadTooLarge) as err:
        small.enqueue(b"", headers={"k": "v" * LIMIT})  # stored as {"k": "vvv..."}: 9 bytes more
    assert str(err.value) == refusal(LIMIT + 9, 0, 0, LIMIT + 9)
    assert table_counts(engine, small) == before


def test_payload_title_and_headers_each_within_the_limit_but_over_it_together_are_refused(engine, small):
    before = table_counts(engine, small)
    third = LIMIT // 3 + 1
    headers = {"k": "v" * (third - 9)}  # {"k": "..."}: third bytes as stored
    with pytest.raises(PayloadTooLarge) as err:
        small.enqueue(b"p" * third, title="t" * third, headers=headers)
    assert str(err.value) == refusal(3 * third, third, third, third)
    assert table_counts(engine, small) == before


def test_a_message_of_exactly_the_limit_is_accepted_and_round_trips(engine, small):
    """Bytes as stored: a two-byte character of the title counts two, headers count as the
    server writes them out ({"k": "..."}, spaces included)."""
    title = "é" * 100                    # 200 bytes of UTF-8
    headers = {"k": "v" * 91}            # {"k": "vvv..."}: 100 bytes
    payload = b"p" * (LIMIT - 300)
    item = small.enqueue(payload, title=title, headers=headers)
    [message] = small.dequeue(1)
    assert (message.id, message.payload, message.title, message.headers) == (item, payload, title, headers)
    before = table_counts(engine, small)
    with pytest.raises(PayloadTooLarge) as err:
        small.enqueue(payload + b"p", title=title, headers=headers)
    assert str(err.value) == refusal(LIMIT + 1, LIMIT - 299, 200, 100)
    assert table_counts(engine, small) == before


def test_enqueue_many_with_one_message_over_by_title_or_headers_stores_none_of_them(engine, small):
    before = table_counts(engine, small)
    payloads = [b"a", b"b", b"c"]
    with pytest.raises(PayloadTooLarge) as err:
        small.enqueue_many(payloads, title=[None, "t" * LIMIT, None])
    assert str(err.value) == (f"queue 'small': message 2 of 3 is {LIMIT + 1} bytes (payload 1 + title {LIMIT} + "
                              f"headers 0), over max_payload_bytes {LIMIT}: nothing was enqueued")
    with pytest.raises(PayloadTooLarge, match=rf"message 3 of 3 is {LIMIT + 10} bytes \(payload 1 \+ title 0 \+ "
                                              rf"headers {LIMIT + 9}\)"):
        small.enqueue_many(payloads, headers=[None, {"k": "v"}, {"k": "v" * LIMIT}])
    half = LIMIT // 2
    with pytest.raises(PayloadTooLarge, match=rf"message 1 of 3 is {2 * half + 1} bytes"):
        small.enqueue_many([b"p" * half, b"b", b"c"], title=["t" * (half + 1), None, None])
    assert table_counts(engine, small) == before
    assert len(small.enqueue_many([b"p" * half, b"b"], title=["t" * half, "x"])) == 2


def test_the_server_counts_title_and_headers_for_any_caller(engine, small):
    """The SQL API itself refuses (SQLSTATE QC413), whoever calls it."""
    before = table_counts(engine, small)
    enqueue, enqueue_many = small.names.qualified("enqueue"), small.names.qualified("enqueue_many")
    with engine.connect() as conn:
        for sql, params in (
            (f"SELECT {enqueue}(CAST(:p AS bytea), p_title => :t)", {"p": b"q", "t": "t" * LIMIT}),
            (f"SELECT {enqueue}(CAST(:p AS bytea), CAST(:h AS jsonb))", {"p": b"q", "h": '{"k": "%s"}' % ("v" * LIMIT)}),
            (f"SELECT * FROM {enqueue_many}(CAST(:p AS bytea[]), p_titles => CAST(:t AS text[]))",
             {"p": [b"ok", b"q"], "t": [None, "t" * LIMIT]}),
        ):
            with pytest.raises(sa.exc.DBAPIError) as err:
                conn.execute(sa.text(sql), params)
            assert err.value.orig.sqlstate == "QC413"
            conn.rollback()
    assert table_counts(engine, small) == before


def all_rows(engine, queue: Queue) -> list[tuple]:
    meta, data = queue.names.qualified("meta"), queue.names.qualified("data")
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(
            "SELECT m.id, m.priority, m.due_at, m.status, m.title, m.attempts, m.max_attempts, m.lease_owner, "
            "m.leased_until, m.enqueued_at, m.dequeued_at, m.finished_at, m.last_error, d.payload, d.headers::text "
            f"FROM {meta} m JOIN {data} d USING (id) ORDER BY m.id")).all()]  # every column but reliable_0012's slot


def test_upgrading_to_the_whole_message_limit_and_back_keeps_every_row(engine):
    """reliable_0009 counted the payload only; reliable_0010 counts title and headers too,
    and its downgrade gives back 0009's functions: neither step touches a stored row."""
    assert head_of("reliable") >= "reliable_0010"
    install_queue(engine, "grown", revision="reliable_0009", settings=QueueSettings(max_payload_bytes=LIMIT))
    big_title = "t" * LIMIT  # within 0009's limit: it counts the payload only
    with Queue(engine, "grown") as queue:
        queue.enqueue(b"kept", title=big_title, headers={"k": "v"})
        queue.enqueue_many([b"a", b"b", b"c"], title=["x", None, "y"], headers=[None, {"n": 1}, None])
        [leased] = queue.dequeue(1, lease=600)
        [failed] = queue.dequeue(1, lease=600)
        queue.nack([failed], "boom")
        [done] = queue.dequeue(1, lease=600)
        queue.ack([done])
        rows = all_rows(engine, queue)
        assert upgrade_queue(engine, "grown") == ("reliable_0009", head_of("reliable"))
        assert all_rows(engine, queue) == rows
        with pytest.raises(PayloadTooLarge, match="title 4096"):
            queue.enqueue(b"new", title=big_title)
        assert all_rows(engine, queue) == rows
        assert downgrade_queue(engine, "grown", "reliable_0009") == (head_of("reliable"), "reliable_0009")
        assert all_rows(engine, queue) == rows
        assert queue.enqueue(b"new", title=big_title) > 0  # 0009 again: the title is not counted
        assert queue.ack([leased]) == 1  # the lease taken before both steps still holds


# -- payloads round-trip exactly (property-based) ------------------------------------------------

payloads = st.one_of(
    st.binary(max_size=64),
    st.binary(min_size=LIMIT - 8, max_size=LIMIT),
    st.text(max_size=200).map(lambda t: t.encode("utf-8")),
    st.just(b""),
    st.just(b"\x00" * LIMIT),
)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(payloads, min_size=1, max_size=8), single=payloads)
def test_payloads_round_trip_byte_for_byte(small, batch, single):
    ids = small.enqueue_many(batch) + [small.enqueue(single)]
    sent = dict(zip(ids, batch + [single]))
    got = small.dequeue(len(sent) + 5, lease=60)
    assert {m.id: m.payload for m in got} == sent
    assert small.ack(got) == len(sent)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=300))
def test_text_payloads_come_back_as_the_same_text(small, text):
    item = small.enqueue(text)  # a str is stored as its UTF-8 bytes
    [message] = small.dequeue(1)
    assert message.id == item and message.text == text and message.payload == text.encode("utf-8")
    small.ack([message])
