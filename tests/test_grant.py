"""`queuectl grant` on PostgreSQL: roles reach the queue only through its functions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import ProgrammingError

from queuectl.client import Queue
from queuectl.errors import UsageError
from queuectl.grants import grant_queue
from queuectl.install import install_queue

from conftest import run_cli


@pytest.fixture
def roles(engine) -> Iterator[tuple[str, str, str]]:
    """Three fresh roles without any privilege: producer, consumer, bystander."""
    made = tuple(f"qt_{what}_{uuid.uuid4().hex[:8]}" for what in ("producer", "consumer", "other"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for role in made:
            conn.execute(sa.text(f'CREATE ROLE "{role}" NOLOGIN'))
    yield made
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for role in made:
            conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
            conn.execute(sa.text(f'DROP ROLE "{role}"'))


def engine_as(db_url: str, role: str) -> sa.Engine:
    """Connections that act as `role` from their first statement (the server's own SET ROLE)."""
    return sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1), connect_args={"options": f"-c role={role}"})


def denied(engine: sa.Engine, statement: str) -> bool:
    with engine.connect() as conn:
        try:
            conn.execute(sa.text(statement))
        except ProgrammingError as exc:
            return "permission denied" in str(exc.orig)
    return False


def test_producer_can_enqueue_but_cannot_read_or_delete_the_tables(engine, db_url, roles):
    producer, consumer, _ = roles
    install_queue(engine, "orders")
    granted = grant_queue(engine, "orders", producer=producer, consumer=consumer)
    assert granted == {
        producer: ["orders_enqueue", "orders_enqueue_many"],
        consumer: ["orders_ack", "orders_ack_dequeue", "orders_dequeue", "orders_extend_lease", "orders_nack",
                   "orders_release", "orders_wait_begin", "orders_wait_end"],
    }
    as_producer = engine_as(db_url, producer)
    try:
        with Queue(as_producer, "orders") as queue:
            first = queue.enqueue("from the producer role")
            more = queue.enqueue_many(["a", "b"])
            with pytest.raises(ProgrammingError, match="permission denied for function orders_dequeue"):
                queue.dequeue(1)
        for table, column in (("orders_meta", "priority"), ("orders_data", "payload"), ("orders_history", "title")):
            assert denied(as_producer, f"SELECT count(*) FROM queuectl.{table}")
            assert denied(as_producer, f"DELETE FROM queuectl.{table}")
            assert denied(as_producer, f"UPDATE queuectl.{table} SET {column} = {column}")
    finally:
        as_producer.dispose()
    # what the producer enqueued is there, seen by the owner
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM queuectl.orders_meta")).scalar() == 3
    assert more == [first + 1, first + 2]


def test_consumer_can_dequeue_ack_and_nack_but_not_enqueue_or_touch_tables(engine, db_url, roles):
    producer, consumer, _ = roles
    install_queue(engine, "orders")
    with Queue(engine, "orders") as owner:
        ids = owner.enqueue_many(["one", "two"])
    grant_queue(engine, "orders", producer=producer, consumer=consumer)
    as_consumer = engine_as(db_url, consumer)
    try:
        with Queue(as_consumer, "orders") as queue:
            batch = queue.dequeue(2, lease=60)
            assert sorted(m.id for m in batch) == ids
            assert queue.ack(batch[:1]) == 1
            assert queue.nack(batch[1:], "retry later") == {batch[1].id: "ready"}
            with pytest.raises(ProgrammingError, match="permission denied for function orders_enqueue"):
                queue.enqueue("not allowed")
        assert denied(as_consumer, "SELECT count(*) FROM queuectl.orders_data")
        assert denied(as_consumer, "DELETE FROM queuectl.orders_meta")
    finally:
        as_consumer.dispose()


def test_a_role_without_a_grant_cannot_call_the_functions(engine, db_url, roles):
    producer, _, other = roles
    install_queue(engine, "orders")
    grant_queue(engine, "orders", producer=producer)
    with engine.connect() as conn:
        # a NULL acl means the default one, which lets PUBLIC execute: it must be explicit now
        public = conn.execute(sa.text(
            "SELECT count(*) FILTER (WHERE p.proacl IS NULL) "
            "+ (SELECT count(*) FROM pg_proc q, aclexplode(q.proacl) a "
            "   WHERE q.proname LIKE 'orders\\_%' AND a.grantee = 0) "
            "FROM pg_proc p WHERE p.proname LIKE 'orders\\_%'"
        )).scalar()
        definer = conn.execute(sa.text(
            "SELECT bool_and(prosecdef) AND bool_and('search_path=pg_catalog, pg_temp' = ANY(proconfig)) "
            "FROM pg_proc WHERE proname IN ('orders_enqueue', 'orders_dequeue', 'orders_ack')"
        )).scalar()
    assert public == 0 and definer  # no EXECUTE for PUBLIC; definer rights with a fixed search_path
    bystander = engine_as(db_url, other)
    try:
        assert denied(bystander, "SELECT queuectl.orders_enqueue('\\x00'::bytea)")
        assert denied(bystander, "SELECT * FROM queuectl.orders_dequeue(1)")
    finally:
        bystander.dispose()


def test_grant_refuses_unknown_roles_and_bad_names(engine, db_url):
    install_queue(engine, "orders")
    with pytest.raises(UsageError, match="does not exist"):
        grant_queue(engine, "orders", producer="nobody_here")
    with pytest.raises(UsageError, match="invalid role name"):
        grant_queue(engine, "orders", consumer='x"; drop table t; --')
    with pytest.raises(UsageError, match="--producer ROLE and/or --consumer ROLE"):
        grant_queue(engine, "orders")
    result = run_cli("grant", "orders", "--producer", "Bad-Role", url=db_url)
    assert result.returncode == 2 and b"invalid role name" in result.stderr


@pytest.mark.slow
def test_grant_command_reports_the_functions(engine, db_url, roles):
    producer, consumer, _ = roles
    install_queue(engine, "orders")
    result = run_cli("grant", "orders", "--producer", producer, "--consumer", consumer, "--json", url=db_url)
    assert result.returncode == 0, result.stderr.decode()
    assert b'"orders_enqueue_many"' in result.stdout and b'"orders_extend_lease"' in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["reliable", "heap", "fifo", "stack", "pending", "watermark", "ring"])
def test_after_grant_no_function_of_the_queue_is_executable_by_public(engine, roles, kind):
    """Every function a kind installs (API, maintenance, trigger) is locked down, not just
    the granted ones: PUBLIC would otherwise run them with the owner's rights."""
    from queuectl.kindspec import RingSettings

    producer, consumer, _ = roles
    install_queue(engine, "q1", kind, RingSettings(size=8) if kind == "ring" else None)
    grant_queue(engine, "q1", producer=producer, consumer=consumer)
    with engine.connect() as conn:
        open_to_public = conn.execute(sa.text(
            "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'queuectl'::regnamespace "
            "AND p.proname LIKE 'q1\\_%' AND (p.proacl IS NULL OR EXISTS "
            "(SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0))"
        )).scalars().all()
        installed = conn.execute(sa.text(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'queuectl'::regnamespace AND proname LIKE 'q1\\_%'"
        )).scalar()
    assert installed >= 3 and open_to_public == []


TABLE_STATEMENTS = {
    "select": "SELECT * FROM queuectl.{table}",
    "insert": "INSERT INTO queuectl.{table} DEFAULT VALUES",
    "update": "UPDATE queuectl.{table} SET {column} = {column}",
    "delete": "DELETE FROM queuectl.{table}",
    "truncate": "TRUNCATE queuectl.{table}",
}

# an ordinary column per table: updating an identity column fails before the privilege check
COLUMN = {"orders_meta": "priority", "orders_data": "payload", "orders_history": "title"}


def test_granted_roles_cannot_touch_any_queue_table_directly_while_their_functions_work(engine, db_url, roles):
    """Every role queuectl grant makes: no SELECT, INSERT, UPDATE, DELETE or TRUNCATE on
    meta, data or history (nor the id sequence, nor writes to the catalog), and yet the
    granted functions run for it."""
    producer, consumer, _ = roles
    install_queue(engine, "orders")
    grant_queue(engine, "orders", producer=producer, consumer=consumer)
    allowed = []
    for role in (producer, consumer):
        as_role = engine_as(db_url, role)
        try:
            for table in ("orders_meta", "orders_data", "orders_history"):
                for what, statement in TABLE_STATEMENTS.items():
                    if not denied(as_role, statement.format(table=table, column=COLUMN[table])):
                        allowed.append((role, what, table))
            if not denied(as_role, "SELECT nextval('queuectl.orders_meta_id_seq')"):
                allowed.append((role, "nextval", "orders_meta_id_seq"))
            for what in ("insert", "update", "delete"):
                if not denied(as_role, TABLE_STATEMENTS[what].format(table="queues", column="kind")):
                    allowed.append((role, what, "queues"))
        finally:
            as_role.dispose()
    assert allowed == [], allowed
    as_producer, as_consumer = engine_as(db_url, producer), engine_as(db_url, consumer)
    try:
        with Queue(as_producer, "orders") as queue:
            item = queue.enqueue("through the API")
        with Queue(as_consumer, "orders") as queue:
            batch = queue.dequeue(1)
            assert [m.id for m in batch] == [item] and queue.ack(batch) == 1
    finally:
        as_producer.dispose()
        as_consumer.dispose()


def test_ring_consumer_role_that_closes_rescues_the_message_it_missed(engine, db_url, roles):
    """A ring's consumer role may call dequeue and ring_release, not enqueue; the release's
    rescue (ring_0002) pushes through the enqueue function with the owner's rights."""
    from queuectl.client import ReleasedClaim, RingQueue
    from queuectl.kindspec import RingSettings

    producer, consumer, _ = roles
    install_queue(engine, "events", "ring", RingSettings(size=8))
    granted = grant_queue(engine, "events", producer=producer, consumer=consumer)
    assert granted[consumer] == ["events_dequeue", "events_ring_release", "events_sub_done", "events_sub_return",
                                "events_sub_take"]
    as_producer, as_consumer = engine_as(db_url, producer), engine_as(db_url, consumer)
    try:
        late = RingQueue(as_consumer, "events")
        assert late.dequeue(1) == []  # claims position 0
        with as_producer.connect() as conn:
            assert conn.execute(sa.text("SELECT queuectl.events_enqueue('m')")).scalar() == 0
            conn.commit()
        with pytest.raises(ProgrammingError, match="permission denied for function events_enqueue"):
            late.enqueue("not a producer")
        late.close()
        assert late.released == [ReleasedClaim("pop", 0, False, 1, "rescued")]
        with RingQueue(as_consumer, "events") as other:
            assert [(m.id, m.text) for m in other.dequeue(5)] == [(1, "m")]
    finally:
        as_producer.dispose()
        as_consumer.dispose()


def test_ring_producer_role_that_closes_gives_up_its_kept_push_claim(engine, db_url, roles):
    """A ring producer whose push found the ring full keeps its claim in the session; its
    close() must be able to give it up (ring_release), or closing fails for the role."""
    from queuectl.client import QueueFullError, RingQueue
    from queuectl.kindspec import RingSettings

    producer, consumer, _ = roles
    install_queue(engine, "events", "ring", RingSettings(size=8))
    granted = grant_queue(engine, "events", producer=producer, consumer=consumer)
    assert granted[producer] == ["events_enqueue", "events_enqueue_many", "events_publish", "events_ring_release"]
    as_producer = engine_as(db_url, producer)
    try:
        pusher = RingQueue(as_producer, "events")
        assert len(pusher.enqueue_many([b"m%d" % i for i in range(8)])) == 8
        with pytest.raises(QueueFullError):
            pusher.enqueue(b"full", timeout=0)  # ring full: the claim of position 8 stays in the session
        pusher.close()
        assert [(c.side, c.item_id, c.outcome) for c in pusher.released] == [("push", 8, "left")]
    finally:
        as_producer.dispose()
    with RingQueue(engine, "events") as consumer_queue:
        assert [m.payload for m in consumer_queue.dequeue(10)] == [b"m%d" % i for i in range(8)]


def secured(engine, prefix: str) -> dict[str, bool]:
    """Each of the queue's functions: whether it runs SECURITY DEFINER."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT p.proname, p.prosecdef FROM pg_proc p "
            "WHERE p.pronamespace = 'queuectl'::regnamespace AND p.proname LIKE :prefix"), {"prefix": f"{prefix}%"}).all()
    return dict(rows)


@pytest.mark.parametrize("kind, old", [("reliable", "reliable_0004"), ("ring", "ring_0002"),
                                       *((k, f"{k}_0001") for k in ("heap", "fifo", "stack", "pending", "watermark"))])
@pytest.mark.slow
def test_granted_roles_keep_working_across_revisions_that_replace_functions_in_place(
        engine, db_url, roles, kind, old):
    """CREATE OR REPLACE keeps the ACL but resets SECURITY DEFINER: without the migration's
    resecure step the consumer role would get 'permission denied for table' after the
    upgrade. A queue never granted keeps its functions as installed."""
    from queuectl.install import downgrade_queue, head_of, upgrade_queue
    from queuectl.client import open_queue
    from queuectl.kindspec import RingSettings

    producer, consumer, _ = roles
    new = head_of(kind)  # reliable: 0005 and 0006 replace functions in place; ring: 0003; others: 0002
    settings = RingSettings(size=8) if kind == "ring" else None
    install_queue(engine, "granted", kind, settings, revision=old)
    install_queue(engine, "plain", kind, settings, revision=old)
    grant_queue(engine, "granted", producer=producer, consumer=consumer)
    before = secured(engine, "granted_")
    assert before["granted_dequeue"] and not any(secured(engine, "plain_").values())
    as_producer, as_consumer = engine_as(db_url, producer), engine_as(db_url, consumer)
    try:
        for step, revision in (("upgrade", new), ("downgrade", old)):
            if step == "upgrade":
                assert upgrade_queue(engine, "granted") == (old, new)
                assert upgrade_queue(engine, "plain") == (old, new)
            else:
                assert downgrade_queue(engine, "granted", old) == (new, old)
            # functions a revision adds (reliable_0006's wait_begin/wait_end) are as installed
            # until `queuectl grant` runs again
            assert {f: d for f, d in secured(engine, "granted_").items() if f in before} == before, step
            assert not any(secured(engine, "plain_").values()), step
            with open_queue(as_producer, "granted") as q:
                sent = q.enqueue_many([f"{step}-1", f"{step}-2"])
            with open_queue(as_consumer, "granted") as q:
                got = q.dequeue(5)
                ids = [m.id for m in got]
                # in the kind's order: newest first on a stack, none on a heap
                assert (sorted(ids) if kind == "heap" else ids) == (sent[::-1] if kind == "stack" else sent), step
                if kind == "reliable":
                    assert q.ack(got) == 2
    finally:
        as_producer.dispose()
        as_consumer.dispose()


def function_acl(engine, queue: str, call: str) -> dict[str, object]:
    """The queue's function `call`, whatever its arguments: its argument types, whether PUBLIC
    and which roles may execute it, and whether it runs SECURITY DEFINER."""
    with engine.connect() as conn:
        [row] = conn.execute(sa.text(
            "SELECT oidvectortypes(p.proargtypes) AS types, p.prosecdef, "
            "has_function_privilege('public', p.oid, 'EXECUTE') AS public, "
            "ARRAY(SELECT a.grantee::regrole::text FROM aclexplode(p.proacl) a "
            "      WHERE a.privilege_type = 'EXECUTE' AND a.grantee NOT IN (0, p.proowner) ORDER BY 1) AS roles "
            "FROM pg_proc p WHERE p.pronamespace = 'queuectl'::regnamespace AND p.proname = :name"),
            {"name": f"{queue}_{call}"}).all()
    return {"types": row.types, "secured": row.prosecdef, "public": row.public, "roles": list(row.roles)}


@pytest.mark.slow
def test_a_revision_that_changes_a_functions_arguments_carries_its_grants_both_ways(engine, roles):
    """reliable_0017 replaces rot_copy and rot_empty by functions with more arguments (created
    beside them, the old ones dropped): a new function would be executable by PUBLIC and
    granted to nobody. What the old one had, the new one gets: EXECUTE revoked from PUBLIC,
    granted to the roles it was granted to, SECURITY DEFINER (on the downgrade too). A queue
    never granted keeps its functions as installed."""
    from queuectl.install import downgrade_queue, head_of, upgrade_queue

    producer, consumer, other = roles
    old, new = "reliable_0016", head_of("reliable")
    install_queue(engine, "granted", "reliable", revision=old)
    install_queue(engine, "plain", "reliable", revision=old)
    grant_queue(engine, "granted", producer=producer, consumer=consumer)
    with engine.begin() as conn:  # a role the DBA let run the truncate itself
        conn.execute(sa.text(f'GRANT EXECUTE ON FUNCTION queuectl.granted_rot_empty(integer) TO "{other}"'))
    types = {old: {"rot_copy": "smallint, bigint, integer", "rot_empty": "integer"},
             new: {"rot_copy": "smallint, bigint, integer, xid8", "rot_empty": "integer, bigint, xid8"}}
    for step, revision in (("installed", old), ("upgrade", new), ("downgrade", old)):
        if step == "upgrade":
            assert upgrade_queue(engine, "granted") == (old, new)
            assert upgrade_queue(engine, "plain") == (old, new)
        elif step == "downgrade":
            assert downgrade_queue(engine, "granted", old) == (new, old)
            assert downgrade_queue(engine, "plain", old) == (new, old)
        for call in ("rot_copy", "rot_empty"):
            want = types[revision][call]
            assert function_acl(engine, "granted", call) == {
                "types": want, "secured": True, "public": False, "roles": [other] if call == "rot_empty" else []}, step
            assert function_acl(engine, "plain", call) == {"types": want, "secured": False, "public": True,
                                                          "roles": []}, step
