"""Enqueue notifications (reliable_0002): one per transaction, per-queue channels, and the
per-queue upgrade and downgrade that switch them on and off."""

from __future__ import annotations

import time

import psycopg
import psycopg.sql
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from queuectl.client import Queue
from queuectl.install import downgrade_queue, head_of, install_queue
from queuectl.registry import list_queues
from queuectl.names import QueueNames

from conftest import run_cli
from jobs_helpers import wait_until
from test_install import schema_objects


def psycopg_conninfo(db_url: str) -> str:
    url = make_url(db_url)
    parts = {"dbname": url.database, "user": url.username, "password": url.password,
             "host": url.query.get("host") or url.host, "port": url.query.get("port") or url.port}
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in parts.items() if v})


class Listener:
    """A plain LISTEN session, as any client of the queue's channel would open one."""

    def __init__(self, db_url: str, *channels: str) -> None:
        self.conn = psycopg.connect(psycopg_conninfo(db_url), autocommit=True)
        for channel in channels:
            self.conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))

    def register(self, *names: QueueNames) -> list[bool]:
        """reliable_0006+: say, as a consumer about to sleep would, that this session waits
        on these queues (their producers notify only then); True where sleeping is safe."""
        return [self.conn.execute(psycopg.sql.SQL("SELECT {}.{}()").format(
            psycopg.sql.Identifier(n.schema), psycopg.sql.Identifier(n.table("wait_begin")))).fetchone()[0]
            for n in names]

    def unregister(self, *names: QueueNames) -> None:
        for n in names:
            self.conn.execute(psycopg.sql.SQL("SELECT {}.{}()").format(
                psycopg.sql.Identifier(n.schema), psycopg.sql.Identifier(n.table("wait_end"))))

    def received(self, expect: int, settle: float = 0.3, deadline: float = 10.0) -> list[str]:
        """Channels of the notifications that arrive: wait for `expect`, then `settle` s for extras."""
        got: list[str] = []
        end = time.monotonic() + deadline
        while len(got) < expect and time.monotonic() < end:
            got += [n.channel for n in self.conn.notifies(timeout=end - time.monotonic(), stop_after=expect - len(got))]
        got += [n.channel for n in self.conn.notifies(timeout=settle)]
        return got

    def close(self) -> None:
        self.conn.close()


def enqueue_sql(queue: str) -> sa.TextClause:
    return sa.text(f"SELECT queuectl.{queue}_enqueue(CAST(:p AS bytea))")


def test_fresh_install_is_at_the_head_revision_which_notifies(engine):
    info = install_queue(engine, "orders")
    assert info.schema_version == head_of("reliable")
    assert head_of("reliable") >= "reliable_0002"
    assert "orders_notify" in schema_objects(engine)["functions"]


def test_one_notification_per_transaction_not_per_row(db_url, engine, orders):
    listener = Listener(db_url, orders.names.channel)
    listener.register(orders.names)
    try:
        orders.enqueue_many([f"item {i}" for i in range(500)])
        assert listener.received(1) == ["queuectl.orders"]

        with engine.begin() as conn:  # ten single enqueues in one transaction
            for i in range(10):
                conn.execute(enqueue_sql("orders"), {"p": b"x"})
        assert listener.received(1) == ["queuectl.orders"]

        for i in range(3):  # three transactions
            orders.enqueue(f"single {i}")
        assert listener.received(3) == ["queuectl.orders"] * 3

        with engine.connect() as conn:  # a rolled-back enqueue announces nothing
            conn.execute(enqueue_sql("orders"), {"p": b"never"})
            conn.rollback()
        assert listener.received(0, settle=0.5) == []
    finally:
        listener.close()


def test_each_queue_notifies_only_its_own_channel(db_url, engine):
    for name in ("alpha", "beta"):
        install_queue(engine, name)
    alpha, beta = QueueNames("alpha").channel, QueueNames("beta").channel
    listener = Listener(db_url, alpha, beta)
    listener.register(QueueNames("alpha"), QueueNames("beta"))
    try:
        with Queue(engine, "beta") as queue:
            queue.enqueue("b")
        assert listener.received(1) == [beta]
        with Queue(engine, "alpha") as queue:
            queue.enqueue_many(["a1", "a2"])
        assert listener.received(1) == [alpha]
    finally:
        listener.close()


def test_channel_names_are_distinct_and_fit_in_63_bytes(db_url, engine):
    assert QueueNames("b_c", "a").channel != QueueNames("c", "a_b").channel
    long_schema, long_queue = "s" * 48, "q" * 48
    names = [QueueNames(long_queue, long_schema), QueueNames(long_queue[:-1] + "r", long_schema),
             QueueNames(long_queue, long_schema[:-1] + "t")]
    channels = [n.channel for n in names]
    assert len(set(channels)) == 3
    assert all(len(c.encode()) <= 63 for c in channels)
    assert QueueNames("orders").channel == "queuectl.orders"
    # the shortened channel is the one the trigger really notifies
    install_queue(engine, long_queue, schema=long_schema)
    listener = Listener(db_url, names[0].channel)
    listener.register(names[0])
    try:
        with Queue(engine, long_queue, schema=long_schema) as queue:
            queue.enqueue("deep")
        assert listener.received(1) == [names[0].channel]
    finally:
        listener.close()


@pytest.mark.slow
def test_queue_at_0001_upgrades_alone_and_starts_notifying(db_url, engine):
    install_queue(engine, "alpha", revision="reliable_0001")
    install_queue(engine, "beta", revision="reliable_0001")
    with engine.connect() as conn:
        assert {q.name: q.schema_version for q in list_queues(conn)} == {"alpha": "reliable_0001", "beta": "reliable_0001"}
    assert "alpha_notify" not in schema_objects(engine)["functions"]
    channels = {QueueNames(n).channel: n for n in ("alpha", "beta")}
    listener = Listener(db_url, *channels)
    try:
        alpha, beta = Queue(engine, "alpha"), Queue(engine, "beta")
        alpha.enqueue("a0")
        beta.enqueue("b0")
        assert listener.received(0, settle=0.5) == []  # 0001 does not notify

        result = run_cli("upgrade", "alpha", url=db_url)
        assert result.returncode == 0, result.stderr.decode()
        head = head_of("reliable")
        assert f"alpha: reliable_0001 -> {head}" in result.stdout.decode()
        with engine.connect() as conn:
            assert {q.name: q.schema_version for q in list_queues(conn)} == {"alpha": head, "beta": "reliable_0001"}
            assert conn.execute(sa.text("SELECT version_num FROM queuectl.beta_version")).scalar() == "reliable_0001"

        assert listener.register(QueueNames("alpha")) == [True]  # a consumer about to sleep on alpha
        alpha.enqueue("a1")
        beta.enqueue("b1")
        assert listener.received(1) == ["queuectl.alpha"]  # alpha now notifies, beta still does not

        # the downgrade removes the notification and nothing else
        assert downgrade_queue(engine, "alpha", "reliable_0001") == (head, "reliable_0001")
        assert "alpha_notify" not in schema_objects(engine)["functions"]
        alpha.enqueue("a2")
        assert listener.received(0, settle=0.5) == []
        assert sorted(m.text for m in alpha.dequeue(10)) == ["a0", "a1", "a2"]
        alpha.close()
        beta.close()
    finally:
        listener.close()


def test_installing_at_an_unknown_revision_is_refused(engine):
    with pytest.raises(Exception, match="unknown revision 'reliable_0099'"):
        install_queue(engine, "orders", revision="reliable_0099")
    with pytest.raises(Exception, match="unknown revision"):
        install_queue(engine, "orders", revision="catalog_0001")
    assert schema_objects(engine)["functions"] == []


# -- reliable_0006: notifications only while a consumer may be sleeping ----------------------

WAITING = sa.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1902347383 "
                  "AND objsubid = 2 AND mode = 'ShareLock' AND granted")


def waiting_sessions(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(WAITING).scalar_one()


def test_producers_notify_only_while_a_consumer_is_registered(db_url, engine, orders):
    listener = Listener(db_url, orders.names.channel)
    try:
        orders.enqueue("nobody waits")  # LISTEN alone is not a registration
        assert listener.received(0, settle=0.5) == []
        assert listener.register(orders.names) == [True]
        assert listener.register(orders.names) == [True]  # once per session, however often called
        assert waiting_sessions(engine) == 1
        for i in range(3):
            orders.enqueue(f"announced {i}")
        orders.enqueue_many(["one", "announcement"])
        assert listener.received(4) == ["queuectl.orders"] * 4
        listener.unregister(orders.names)  # the consumer is busy again
        assert waiting_sessions(engine) == 0
        orders.enqueue("busy consumer")
        assert listener.received(0, settle=0.5) == []
    finally:
        listener.close()
    assert orders.counts()["ready"] == 7


def test_registration_sees_an_enqueue_still_open_which_it_would_not_hear(db_url, engine, orders):
    """The race the 'in flight' lock closes: an enqueue whose trigger ran before the consumer
    registered does not notify at its commit; wait_begin says so while it is open."""
    listener = Listener(db_url, orders.names.channel)
    try:
        with engine.connect() as producer:
            producer.execute(enqueue_sql("orders"), {"p": b"open"})  # trigger ran, not committed
            assert listener.register(orders.names) == [False]  # sleeping now could miss it
            assert listener.register(orders.names) == [False]
            producer.commit()
        assert listener.received(0, settle=0.5) == []  # it probed before the registration
        assert listener.register(orders.names) == [True]  # ended: the next look sees its row
        assert [m.text for m in orders.dequeue(10)] == ["open"]

        with engine.connect() as producer:  # a rolled-back enqueue is no longer in flight either
            producer.execute(enqueue_sql("orders"), {"p": b"never"})
            assert listener.register(orders.names) == [False]
            producer.rollback()
        assert listener.register(orders.names) == [True]
        assert listener.received(0, settle=0.3) == []

        with engine.connect() as producer:  # an enqueue after the registration announces itself
            producer.execute(enqueue_sql("orders"), {"p": b"late"})
            producer.commit()
        assert listener.received(1) == ["queuectl.orders"]
    finally:
        listener.close()
    # a closed session's registration is gone once its backend has exited, which the server
    # does after the client's close returns
    wait_until(lambda: waiting_sessions(engine) == 0, timeout=10)


@pytest.mark.slow
def test_downgrade_to_0005_notifies_every_transaction_again(db_url, engine, orders):
    assert downgrade_queue(engine, "orders", "reliable_0005") == (head_of("reliable"), "reliable_0005")
    assert not {"orders_wait_begin", "orders_wait_end"} & set(schema_objects(engine)["functions"])
    listener = Listener(db_url, orders.names.channel)
    try:
        orders.enqueue("unregistered listener hears it")
        assert listener.received(1) == ["queuectl.orders"]
    finally:
        listener.close()
    result = run_cli("upgrade", "orders", url=db_url)
    assert result.returncode == 0, result.stderr.decode()
    assert {"orders_wait_begin", "orders_wait_end"} <= set(schema_objects(engine)["functions"])


def test_a_role_holding_the_activation_locks_stalls_neither_producers_nor_consumers(db_url, engine, orders):
    """Any role that can connect may take the two advisory locks of the protocol above, whose
    keys anyone can compute. Held exclusively, they cost spare notifications and polls; no
    enqueue and no registration waits for them (each is held to a 3 s statement timeout)."""
    role = "squatter_activation"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'CREATE ROLE "{role}" LOGIN'))
    squatter = psycopg.connect(psycopg_conninfo(make_url(db_url).set(username=role).render_as_string(False)),
                               autocommit=True)
    timed = sa.create_engine(db_url, connect_args={"options": "-c statement_timeout=3000"})
    producer = Queue(timed, "orders")
    listener = Listener(db_url, orders.names.channel)
    listener.conn.execute("SET statement_timeout = 3000")
    try:
        key = squatter.execute("SELECT hashtext(%s) & 2147483647", (orders.names.channel,)).fetchone()[0]
        assert squatter.execute("SELECT pg_try_advisory_lock(1902343273, %s), pg_try_advisory_lock(1902347383, %s)",
                                (key, key)).fetchone() == (True, True)
        started = time.monotonic()
        assert listener.register(orders.names) == [False]  # not safe to sleep: the consumer polls instead
        producer.enqueue("while squatted")
        producer.enqueue_many(["and", "more"])
        assert listener.received(2) == ["queuectl.orders"] * 2  # announced anyway: spare ones at worst
        assert time.monotonic() - started < 3
        assert sorted(m.text for m in orders.dequeue(10)) == ["and", "more", "while squatted"]
    finally:
        listener.close()
        producer.close()
        timed.dispose()
        squatter.close()
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f'DROP ROLE "{role}"'))
