"""No queue's objects can be named like another queue's, and grants reach exactly one queue.

Every schema-level object of a queue is "<queue>_<suffix>". Two queues whose names differ by
a word that joins two suffixes ("b" and "b_ack": b's ack_dequeue is b_ack's dequeue) would
share an object name; a new install refuses such names (names.validate_new_queue_name), an
install beside such a pair left by an older queuectl names the other queue, and grants match
functions by name and argument types, so even a pair installed before that reaches one queue.
"""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from alembic import command
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from sqlalchemy.exc import ProgrammingError

from queuectl.client import Queue
from queuectl.errors import UsageError
from queuectl.grants import (
    FUNCTION_ARGUMENTS, MAINTENANCE_CALLS, consumer_calls, grant_queue, granted_functions, secured_calls,
)
from queuectl.install import _queue_config, _script, install_queue, uninstall_queue, upgrade_catalog
from queuectl.registry import list_queues
from queuectl.kindspec import KINDS, check_name_fits, default_settings
from queuectl.names import (
    CATALOG_OBJECTS, OBJECT_SUFFIXES, QUEUE_OBJECT_SUFFIXES, SQL_SERVER_ONLY_SUFFIXES, QueueNames, shared_object_names,
    clashing_endings, validate_new_queue_name,
)

from conftest import run_cli

SCHEMA_OBJECTS = """
    SELECT c.relname AS name, NULL AS arguments
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'queuectl'
    UNION ALL
    SELECT p.proname, oidvectortypes(p.proargtypes)
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'queuectl'
"""


def schema_objects(engine) -> set[tuple[str, str | None]]:
    with engine.connect() as conn:
        return {(r.name, r.arguments) for r in conn.execute(sa.text(SCHEMA_OBJECTS))}


def revisions(kind: str) -> list[str]:
    return [r.revision for r in reversed(list(_script().iterate_revisions(f"{kind}@head", "base")))]


# -- the lists are complete ------------------------------------------------------------------


@pytest.mark.slow
def test_every_object_of_every_kind_at_every_revision_is_listed_with_its_argument_types(engine):
    """QUEUE_OBJECT_SUFFIXES and FUNCTION_ARGUMENTS are what the clash rule and the grants
    rely on: a revision that adds an object must add it there, or this fails."""
    assert set(QUEUE_OBJECT_SUFFIXES) == set(KINDS) == set(FUNCTION_ARGUMENTS)
    install_queue(engine, "zz")  # the catalog, and a queue whose objects are not under test
    catalog = {name for name, _ in schema_objects(engine) if not name.startswith("zz_")}
    assert catalog == CATALOG_OBJECTS
    for kind in KINDS:
        seen: set[str] = set()
        for revision in revisions(kind):
            install_queue(engine, "qq", kind, revision=revision)
            mine = {(n, a) for n, a in schema_objects(engine) if n.startswith("qq_")}
            assert {(n, a) for n, a in schema_objects(engine) if not n.startswith(("qq_", "zz_"))} == {
                (c, None) for c in CATALOG_OBJECTS
            }
            for name, arguments in mine:
                suffix = name[len("qq_"):]
                assert suffix in QUEUE_OBJECT_SUFFIXES[kind], (revision, name)
                if arguments is not None:
                    assert arguments in FUNCTION_ARGUMENTS[kind][suffix], (revision, name, arguments)
            seen |= {n[len("qq_"):] for n, _ in mine}
            uninstall_queue(engine, "qq")
        # nothing listed that no revision has (but SQL Server's own objects)
        assert seen == set(QUEUE_OBJECT_SUFFIXES[kind]) - set(SQL_SERVER_ONLY_SUFFIXES.get(kind, ())), kind


# -- no two accepted names share an object name ------------------------------------------------

WORDS = sorted({w for s in OBJECT_SUFFIXES for w in s.split("_")} | {"x", "eu", "2", "v2"})


@st.composite
def name_pairs(draw) -> tuple[str, str]:
    """Pairs biased to the dangerous shape: one name, and the same name plus suffix words."""
    base = draw(st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True))
    tail = "_".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3)))
    other = draw(st.one_of(st.just(f"{base}_{tail}"), st.just(f"{tail}_{base}"),
                           st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)))
    return base, other


def accepted(name: str, kind: str) -> bool:
    try:
        check_name_fits(QueueNames(validate_new_queue_name(name, kind)), kind)
    except UsageError:
        return False
    return True


@pytest.mark.slow
@given(name_pairs(), st.sampled_from(KINDS), st.sampled_from(KINDS))
@settings(max_examples=3000, deadline=None)
@example(("b", "b_acks"), "reliable", "reliable")
@example(("b", "b_meta"), "reliable", "reliable")
@example(("b", "b_enqueue"), "reliable", "ring")
@example(("b", "b_watermark"), "watermark", "fifo")
def test_no_two_names_a_new_install_accepts_share_an_object_name(pair, kind_a, kind_b):
    a, b = pair
    assume(a != b and accepted(a, kind_a) and accepted(b, kind_b))
    objects_a = {f"{a}_{s}" for s in QUEUE_OBJECT_SUFFIXES[kind_a]}
    objects_b = {f"{b}_{s}" for s in QUEUE_OBJECT_SUFFIXES[kind_b]}
    assert not objects_a & objects_b
    assert not (objects_a | objects_b) & CATALOG_OBJECTS
    assert max(len(o) for o in objects_a | objects_b) <= 63  # no truncation can make two names one


def test_the_endings_refused_are_exactly_those_that_can_clash():
    assert {k: sorted(clashing_endings(k)) for k in KINDS} == {
        "reliable": ["ack", "ring"], "heap": ["ack"], "fifo": ["ack"], "stack": ["ack"], "pending": ["ack"],
        "watermark": ["ack", "correct"], "ring": ["ack"],
    }
    validate_new_queue_name("events_ring", "ring")  # a ring named for what it is clashes with nothing
    assert not shared_object_names("events", "ring", "events_ring", "ring")


@pytest.mark.parametrize("name, kind, other, other_kind, shared", [
    ("b_ack", "fifo", "b", "reliable", "b_ack_dequeue"),
    ("orders_ring", "reliable", "orders", "ring", "orders_ring_release"),
    ("w_correct", "watermark", "w", "watermark", "w_correct_watermark"),
])
@pytest.mark.slow
def test_a_name_that_could_share_objects_with_another_queue_is_refused_in_one_line(
    engine, db_url, name, kind, other, other_kind, shared
):
    assert shared in shared_object_names(name, kind, other, other_kind)  # the rule is not idle: these clash
    before = schema_objects(engine)
    with pytest.raises(UsageError, match=f"'{shared}' would be both") as refused:
        install_queue(engine, name, kind)
    assert "\n" not in str(refused.value)
    assert schema_objects(engine) == before
    result = run_cli("install", name, "--kind", kind, url=db_url)
    assert result.returncode == 2
    assert result.stderr.decode().count("\n") == 1 and shared in result.stderr.decode()


# -- pairs an older queuectl may have installed ------------------------------------------------


def install_like_an_older_queuectl(engine, name: str, kind: str = "reliable") -> None:
    """An install without the shared-name checks, as older versions made them."""
    with engine.connect() as conn:
        upgrade_catalog(conn)
        command.upgrade(_queue_config(QueueNames(name), kind, default_settings(kind), connection=conn), f"{kind}@head")
        conn.commit()


def test_an_install_beside_a_clashing_queue_of_an_older_install_names_that_queue(engine):
    install_like_an_older_queuectl(engine, "b_ack")
    with pytest.raises(UsageError, match="would share object names with installed queue 'b_ack' .*b_ack_dequeue"):
        install_queue(engine, "b")
    install_queue(engine, "b", "fifo")  # a fifo queue b has no ack_dequeue: nothing shared
    with engine.connect() as conn:
        assert [q.name for q in list_queues(conn)] == ["b", "b_ack"]


@pytest.fixture
def consumer_role(engine):
    role = f"qt_c_{uuid.uuid4().hex[:8]}"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'CREATE ROLE "{role}" NOLOGIN'))
    yield role
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
        conn.execute(sa.text(f'DROP ROLE "{role}"'))


def can_execute(engine, role: str, signature: str) -> bool:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT has_function_privilege(:r, :f, 'EXECUTE')"),
                            {"r": role, "f": signature}).scalar()


def touched_by_grant(engine, role: str, signature: str) -> bool:
    """Whether a grant made the function run as its owner or named the role in its ACL
    (PUBLIC's default EXECUTE on an invoker's-rights function gives a role nothing)."""
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT p.prosecdef OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = CAST(:r AS regrole)) "
            "FROM pg_proc p WHERE p.oid = CAST(:f AS regprocedure)"), {"r": role, "f": signature}).scalar()


def test_a_grant_on_one_of_a_clashing_pair_reaches_only_that_queue_and_either_uninstalls(engine, db_url, consumer_role):
    install_like_an_older_queuectl(engine, "b_ack")
    install_like_an_older_queuectl(engine, "b")
    theirs = "queuectl.b_ack_dequeue(integer, double precision, text)"          # queue b_ack's dequeue
    ours = "queuectl.b_ack_dequeue(bigint[], integer, double precision, text)"  # queue b's ack_dequeue
    grant_queue(engine, "b", consumer=consumer_role)
    assert can_execute(engine, consumer_role, ours)
    assert not touched_by_grant(engine, consumer_role, theirs)
    with engine.connect() as conn:
        assert set(granted_functions(conn, "b", consumer_role)) == {
            f"b_{c}" for c in FUNCTION_ARGUMENTS["reliable"]
            if c not in ("enqueue", "enqueue_many", *MAINTENANCE_CALLS["reliable"])}
    Queue(engine, "b_ack").enqueue(b"secret of b_ack")
    role_engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1),
                                   connect_args={"options": f"-c role={consumer_role}"})
    with role_engine.connect() as conn, pytest.raises(ProgrammingError, match="permission denied"):
        conn.execute(sa.text("SELECT * FROM queuectl.b_ack_dequeue(1, 30.0, 'w')"))
    role_engine.dispose()

    uninstall_queue(engine, "b_ack")
    b = Queue(engine, "b")
    b.enqueue(b"still here")
    assert [m.payload for m in b.dequeue(1)] == [b"still here"]
    b.close()
    uninstall_queue(engine, "b")
    assert {n for n, _ in schema_objects(engine)} == CATALOG_OBJECTS


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_queues_whose_names_are_prefixes_of_each_other_stay_apart_for_every_kind(engine, consumer_role, kind):
    """A queue of each kind beside queues named after it plus a suffix word, of every kind:
    each grant reaches only its own queue's functions, each uninstall removes only its own."""
    others = {f"p_{word}": other for word, other in zip(("meta", "enqueue", "items", "ring_x", "version", "data",
                                                          "dequeue"), KINDS)}
    install_queue(engine, "p", kind)
    for name, other_kind in others.items():
        install_queue(engine, name, other_kind)
    before = schema_objects(engine)
    grant_queue(engine, "p", consumer=consumer_role)
    with engine.connect() as conn:
        granted = set(conn.execute(sa.text(
            "SELECT p.proname, oidvectortypes(p.proargtypes) FROM pg_proc p, aclexplode(p.proacl) a "
            "WHERE p.pronamespace = 'queuectl'::regnamespace AND a.grantee = CAST(:r AS regrole)"),
            {"r": consumer_role}).all())
        owners_rights = set(conn.execute(sa.text(
            "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'queuectl'::regnamespace AND p.prosecdef"
        )).scalars())
    assert {name for name, _ in granted} == {f"p_{call}" for call in consumer_calls(kind)}
    assert all(types in FUNCTION_ARGUMENTS[kind][name[2:]] for name, types in granted)
    assert owners_rights == {f"p_{call}" for call in secured_calls(kind)}
    uninstall_queue(engine, "p")
    mine = {(n, a) for n, a in before if n[2:] in QUEUE_OBJECT_SUFFIXES[kind] and n.startswith("p_")}
    assert schema_objects(engine) == before - mine
    for name in others:
        uninstall_queue(engine, name)
    assert {n for n, _ in schema_objects(engine)} == CATALOG_OBJECTS
