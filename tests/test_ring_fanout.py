"""Fan-out on the ring (ring_0006): named subscriptions, each reading every message pushed
after it was added, in order, with competing consumers inside each; the producer gated by
the slowest subscription; lag limits, behind and dropped subscriptions; leases that expire
and are taken again within the subscription only; constant size and HOT updates; the
migration up and down."""

from __future__ import annotations

import json
import time

import pytest
import sqlalchemy as sa

from jobs_helpers import scalar
from queuectl.client import QueueFullError, RingQueue
from queuectl.errors import UsageError
from queuectl.install import downgrade_queue, head_of, install_queue, uninstall_queue, upgrade_queue
from queuectl.kindspec import RingSettings


def fanout(engine, size: int, name: str = "f", **options) -> RingQueue:
    install_queue(engine, name, "ring", RingSettings(size=size, fanout=True, **options))
    return RingQueue(engine, name)


def texts(items) -> list[str]:
    return [m.text for m in items]


def test_each_subscription_gets_every_message_in_order(engine):
    with fanout(engine, 16) as q:
        q.subscribe("a")
        q.subscribe("b")
        q.enqueue_many([f"m{i}" for i in range(10)])
        a, b = q.subscription("a"), q.subscription("b")
        got_a = a.dequeue(4) + a.dequeue(10)
        got_b = b.dequeue(10)
        assert texts(got_a) == texts(got_b) == [f"m{i}" for i in range(10)]
        assert [m.id for m in got_a] == list(range(10))
        assert a.ack(got_a) == list(range(10))
        assert b.ack(got_b) == list(range(10))
        assert a.dequeue(5) == [] and b.dequeue(5) == []


def test_consumers_of_one_subscription_compete_each_message_once(engine):
    install_queue(engine, "f", "ring", RingSettings(size=64, fanout=True))
    with RingQueue(engine, "f") as producer, RingQueue(engine, "f") as c1, RingQueue(engine, "f") as c2:
        producer.subscribe("a")
        producer.subscribe("b")
        ids = producer.enqueue_many([f"m{i}" for i in range(40)])
        s1, s2 = c1.subscription("a"), c2.subscription("a")
        seen: list[int] = []
        while True:
            got1, got2 = s1.dequeue(3), s2.dequeue(5)
            if not got1 and not got2:
                break
            seen += [m.id for m in got1 + got2]
            s1.ack(got1)
            s2.ack(got2)
        assert sorted(seen) == ids and len(seen) == len(set(seen))  # each once within "a"
        b = producer.subscription("b")
        assert [m.id for m in b.dequeue(100)] == ids  # and all of them again in "b"


def test_subscription_added_later_sees_only_later_messages(engine):
    with fanout(engine, 16) as q:
        q.subscribe("early")
        q.enqueue_many(["before1", "before2"])
        info = q.subscribe("late")
        assert info.start_pos == 2
        q.enqueue("after")
        assert texts(q.subscription("late").dequeue(10)) == ["after"]
        assert texts(q.subscription("early").dequeue(10)) == ["before1", "before2", "after"]


def test_messages_without_subscription_are_not_kept(engine):
    with fanout(engine, 4) as q:
        assert q.enqueue_many(list("abcdefgh")) == list(range(8))  # two laps: nobody waits for them
        q.subscribe("a")
        assert q.subscription("a").dequeue(10) == []


def test_slowest_subscription_gates_the_producer_and_unsubscribe_frees_it(engine):
    with fanout(engine, 8) as q:
        q.subscribe("fast")
        q.subscribe("slow")
        fast, slow = q.subscription("fast"), q.subscription("slow")
        q.enqueue_many([f"m{i}" for i in range(8)])
        fast.ack(fast.dequeue(8))
        with pytest.raises(QueueFullError):
            q.enqueue("m8", timeout=0.2)  # "slow" has not acknowledged position 0
        first = slow.dequeue(1)
        with pytest.raises(QueueFullError):
            q.enqueue("m8", timeout=0.2)  # claimed is not acknowledged
        slow.ack(first)
        assert q.enqueue("m8", timeout=0.2) == 8  # the position kept while full: no hole
        with pytest.raises(QueueFullError):
            q.enqueue("m9", timeout=0.2)
        assert q.unsubscribe("slow") is True
        assert q.enqueue("m9", timeout=0.2) == 9
        assert texts(fast.dequeue(10)) == ["m8", "m9"]
        assert q.unsubscribe("slow") is False


def test_lagging_subscription_is_marked_behind_and_dropped_when_it_asked(engine):
    with fanout(engine, 16, lag_limit=4) as q:
        q.subscribe("keep")  # the ring's defaults: limit 4, not dropped
        q.subscribe("drop", drop_when_behind=True)
        q.subscribe("live", lag_limit=16)
        live = q.subscription("live")
        q.enqueue_many([f"m{i}" for i in range(4)])
        live.ack(live.dequeue(10))
        subs = {s.name: s for s in q.subscriptions()}
        assert [(s.lag, s.behind, s.dropped_at) for s in subs.values()] == [(4, False, None), (4, False, None),
                                                                           (0, False, None)]
        q.enqueue("m4")  # past the limit: this push drops "drop" (and only it)
        subs = {s.name: s for s in q.subscriptions()}
        assert (subs["keep"].lag, subs["keep"].lag_limit, subs["keep"].behind) == (5, 4, True)
        assert subs["keep"].dropped_at is None
        assert subs["drop"].dropped_at is not None and subs["drop"].behind
        assert not subs["live"].behind and subs["live"].lag == 1
        with pytest.raises(sa.exc.DBAPIError, match="no active subscription"):
            q.subscription("drop").dequeue(1)
        # "keep" still gates the producer; "drop" no longer does
        q.unsubscribe("keep")
        q.enqueue_many([f"n{i}" for i in range(10)])
        assert len(live.dequeue(100)) == 11


def test_expired_claim_is_taken_again_within_its_subscription_only(engine):
    install_queue(engine, "f", "ring", RingSettings(size=8, fanout=True))
    with RingQueue(engine, "f") as producer, RingQueue(engine, "f") as dying, RingQueue(engine, "f") as other:
        producer.subscribe("a")
        producer.subscribe("b")
        producer.enqueue_many(["x", "y"])
        first = dying.subscription("a").dequeue(1, lease=0.2)
        assert texts(first) == ["x"]
        a2 = other.subscription("a")
        assert texts(a2.dequeue(5)) == ["y"]  # the leased one is not handed out again yet
        time.sleep(1.3)  # past the lease and the subscription's one-second look at expired claims
        again = a2.dequeue(5)
        assert [(m.id, m.text) for m in again] == [(0, "x")] and a2.tries(again[0]) == 2
        assert dying.subscription("a").ack(first) == []  # taken again: the late ack matches nothing
        assert a2.ack(again + [1]) == [0, 1]
        b = producer.subscription("b")
        got_b = b.dequeue(5)
        assert texts(got_b) == ["x", "y"] and [b.tries(m) for m in got_b] == [1, 1]


def test_ack_after_the_lease_but_before_anyone_took_it_again_counts(engine):
    with fanout(engine, 8) as q:
        q.subscribe("a")
        q.enqueue("x")
        a = q.subscription("a")
        got = a.dequeue(1, lease=0.05)
        time.sleep(0.2)
        assert a.ack(got) == [0]
        time.sleep(1.1)
        assert a.dequeue(1) == []


def test_nack_gives_the_message_back_at_once(engine):
    with fanout(engine, 8) as q:
        q.subscribe("a")
        q.enqueue_many(["x", "y"])
        a = q.subscription("a")
        got = a.dequeue(1)
        assert a.nack(got) == [0]
        again = a.dequeue(5)
        assert [(m.id, a.tries(m)) for m in again] == [(0, 2), (1, 1)]


def test_subscription_never_reads_a_publish_that_has_not_committed(engine, db_url):
    other = sa.create_engine(db_url)
    try:
        with fanout(engine, 8) as q, other.connect() as pusher:
            q.subscribe("a")
            pusher.begin()
            pusher.execute(sa.text("SELECT * FROM queuectl.f_publish(ARRAY['early'::bytea])"))
            q.enqueue("later")  # position 1, committed
            a = q.subscription("a")
            assert a.dequeue(5, timeout=0.2) == []  # position 0 is not committed: the cursor waits there
            pusher.commit()
            assert texts(a.dequeue(5)) == ["early", "later"]
    finally:
        other.dispose()


def test_plain_calls_refuse_a_fanout_ring_and_subscriptions_refuse_a_plain_one(engine):
    with fanout(engine, 8) as q:
        with pytest.raises(UsageError, match="dequeue through a subscription"):
            q.dequeue(1)
        with engine.connect() as conn, pytest.raises(sa.exc.DBAPIError, match="fans out: push with"):
            conn.execute(sa.text("SELECT queuectl.f_enqueue('x')"))
        with engine.connect() as conn:
            # the plain pop finds no FULL slot there: it takes nothing
            assert conn.execute(sa.text("SELECT count(*) FROM queuectl.f_dequeue(5)")).scalar() == 0
    install_queue(engine, "p", "ring", RingSettings(size=8))
    with RingQueue(engine, "p") as plain:
        with pytest.raises(UsageError, match="does not fan out"):
            plain.subscribe("a")
        with engine.connect() as conn, pytest.raises(sa.exc.DBAPIError, match="does not fan out"):
            conn.execute(sa.text("SELECT * FROM queuectl.p_subscribe('a')"))
        assert plain.enqueue("x") == 0 and texts(plain.dequeue(1)) == ["x"]


def test_subscribe_checks_its_name_and_limit(engine):
    with fanout(engine, 8) as q:
        q.subscribe("a")
        with pytest.raises(sa.exc.DBAPIError, match="exists"):
            q.subscribe("a")
        with pytest.raises(sa.exc.DBAPIError, match="invalid subscription name"):
            q.subscribe("Bad-Name")
        with pytest.raises(sa.exc.DBAPIError, match="lag limit must be from 1"):
            q.subscribe("b", lag_limit=9)
    with pytest.raises(UsageError, match="lag limit"):
        RingSettings(size=8, fanout=True, lag_limit=9)
    with pytest.raises(UsageError, match="fan-out ring only"):
        RingSettings(size=8, lag_limit=4)


def test_dead_publishers_hole_is_tombstoned_and_the_subscriptions_pass_it(engine, db_url):
    """A publisher that claimed a position and died leaves the subscriptions' cursors
    waiting there: ring_repair writes a fan-out tombstone once every subscription has
    acknowledged the slot's previous message, and the cursors move past it."""
    with fanout(engine, 4) as q:
        q.subscribe("a")
        a = q.subscription("a")
        q.enqueue_many(["m0", "m1", "m2", "m3"])
        with engine.connect() as conn:  # a push claim for position 4 that never writes
            conn.execute(sa.text("SELECT nextval('queuectl.f_push_seq')"))
        got = a.dequeue(4)
        assert texts(got) == ["m0", "m1", "m2", "m3"]
        from queuectl.client import repair_ring
        assert repair_ring(engine, "f", grace=0).tombstoned == []  # m0 not acknowledged yet: not free
        a.ack(got)
        assert q.enqueue("m5") == 5
        assert a.dequeue(5) == []  # the cursor waits at 4
        repaired = repair_ring(engine, "f", grace=0)
        assert repaired.tombstoned == [4]
        assert texts(a.dequeue(5)) == ["m5"]


def test_release_gives_up_a_kept_publish_claim_as_a_fanout_tombstone(engine):
    install_queue(engine, "f", "ring", RingSettings(size=2, fanout=True))
    with RingQueue(engine, "f") as q:
        q.subscribe("a")
        a = q.subscription("a")
        producer = RingQueue(engine, "f")
        producer.enqueue_many(["m0", "m1"])
        with pytest.raises(QueueFullError):
            producer.enqueue("m2", timeout=0.1)  # keeps its claim on position 2
        assert a.ack(a.dequeue(2)) == [0, 1]
        producer.close()
        assert [(c.side, c.item_id, c.outcome) for c in producer.released] == [("push", 2, "tombstoned")]
        assert q.enqueue("m3") == 3  # position 2 is a fan-out tombstone now
        assert texts(a.dequeue(5)) == ["m3"]


def test_fanout_updates_stay_hot_and_sizes_constant_over_many_laps(engine, db_url):
    size = 1024
    install_queue(engine, "f", "ring", RingSettings(size=size, fanout=True))
    own = sa.create_engine(db_url)  # disposed below: its backends' exit flushes their statistics
    with RingQueue(own, "f") as q:
        for name in ("a", "b", "c"):
            q.subscribe(name)
        subs = [q.subscription(n) for n in ("a", "b", "c")]

        def lap():
            q.enqueue_many([b"payload-%d" % i for i in range(size // 2)])
            for s in subs:
                assert len(s.ack(s.dequeue(size))) == size // 2
        for _ in range(8):  # four laps of the ring: every slot has held a payload
            lap()
        with engine.connect() as conn:
            before = conn.execute(sa.text(
                "SELECT pg_relation_size('queuectl.f_ring'), pg_relation_size('queuectl.f_sub_slots'), "
                "pg_relation_size('queuectl.f_sub_slots_pkey'), pg_relation_size('queuectl.f_ring_pkey')")).one()
        for _ in range(40):  # twenty laps more
            lap()
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
            after = conn.execute(sa.text(
                "SELECT pg_relation_size('queuectl.f_ring'), pg_relation_size('queuectl.f_sub_slots'), "
                "pg_relation_size('queuectl.f_sub_slots_pkey'), pg_relation_size('queuectl.f_ring_pkey')")).one()
        assert after == before
    own.dispose()
    deadline = time.monotonic() + 30
    while True:
        with engine.connect() as conn:
            upd, hot = conn.execute(sa.text(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE relid = 'queuectl.f_sub_slots'::regclass")).one()
        if upd >= 2 * 48 * 3 * (size // 2) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert upd == 2 * 48 * 3 * (size // 2)  # a claim and an ack per message and subscription
    assert hot == upd


def test_install_settings_and_cli_defaults_are_recorded(engine):
    info = install_queue(engine, "f", "ring", RingSettings(size=16, fanout=True))
    assert info.settings.as_dict() == {"size": 16, "fanout": True, "lag_limit": 8, "drop_when_behind": False,
                                       "slot_bytes": 1_800, "max_payload_bytes": 1024 * 1024}
    with RingQueue(engine, "f") as q:
        sub = q.subscribe("a")
        assert (sub.lag_limit, sub.drop_when_behind) == (8, False)  # half the ring, kept


def ring_slots(engine, name: str) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(
            f'SELECT slot, msg_id, state, payload FROM queuectl."{name}_ring" ORDER BY slot'))]


def test_existing_ring_upgrades_to_0006_and_back_with_every_row(engine):
    install_queue(engine, "old", "ring", RingSettings(size=8), revision="ring_0005")
    with RingQueue(engine, "old") as q:
        q.enqueue_many(["a", "b", "c"])
        assert texts(q.dequeue(1)) == ["a"]
    before = ring_slots(engine, "old")
    assert upgrade_queue(engine, "old") == ("ring_0005", head_of("ring"))
    assert ring_slots(engine, "old") == before
    assert scalar(engine, 'SELECT count(*) FROM queuectl."old_subs"') == 0
    with RingQueue(engine, "old") as q:
        assert not q.fanout
        assert texts(q.dequeue(1)) == ["b"]
        q.enqueue("d")
    kept = ring_slots(engine, "old")
    assert downgrade_queue(engine, "old", "ring_0005") == (head_of("ring"), "ring_0005")
    assert ring_slots(engine, "old") == kept
    assert scalar(engine, "SELECT to_regclass('queuectl.old_subs')") is None
    assert scalar(engine, "SELECT to_regproc('queuectl.old_publish')") is None
    with RingQueue(engine, "old") as q:
        assert texts(q.dequeue(5)) == ["c", "d"]


def test_fanout_ring_downgrade_gives_unacknowledged_messages_to_the_plain_pop(engine):
    with fanout(engine, 8) as q:
        q.subscribe("a")
        q.subscribe("b")
        q.enqueue_many(["m0", "m1", "m2", "m3"])
        a, b = q.subscription("a"), q.subscription("b")
        a.ack(a.dequeue(4))
        b.ack(b.dequeue(2))
        b.dequeue(1)  # m2 claimed, not acknowledged
    assert downgrade_queue(engine, "f", "ring_0005") == (head_of("ring"), "ring_0005")
    with RingQueue(engine, "f") as plain:
        assert not plain.fanout and not plain.info.settings.fanout
        assert scalar(engine, "SELECT settings FROM queuectl.queues WHERE name = 'f'") == {"size": 8}
        assert texts(plain.dequeue(10)) == ["m2", "m3"]  # each once, for the plain pop
        assert plain.enqueue_many(list("abcdefgh")) == list(range(4, 12))
        assert texts(plain.dequeue(10)) == list("abcdefgh")
    assert upgrade_queue(engine, "f") == ("ring_0005", head_of("ring"))  # back up: a plain ring at the head
    uninstall_queue(engine, "f")
    install_queue(engine, "g", "ring", RingSettings(size=4, fanout=True))
    uninstall_queue(engine, "g")  # the downgrade to base passes unmake_fanout too
    assert scalar(engine, "SELECT to_regclass('queuectl.g_ring')") is None


def test_cli_installs_a_fanout_ring_and_manages_its_subscriptions(engine, db_url):
    from conftest import run_cli

    result = run_cli("install", "cf", "--kind", "ring", "--size", "16", "--fanout", "--lag-limit", "4", url=db_url)
    assert result.returncode == 0, result.stderr
    result = run_cli("subscribe", "cf", "audit", url=db_url)
    assert result.returncode == 0, result.stderr
    assert "from position 0, lag limit 4, kept when behind" in result.stdout.decode()
    result = run_cli("subscribe", "cf", "mail", "--lag-limit", "8", "--drop-when-behind", url=db_url)
    assert "lag limit 8, dropped when behind" in result.stdout.decode()
    with RingQueue(engine, "cf") as q:
        q.enqueue_many([f"m{i}" for i in range(6)])
    listed = json.loads(run_cli("subscriptions", "cf", "--json", url=db_url).stdout)
    assert [(s["name"], s["lag"], s["lag_limit"], s["behind"]) for s in listed] == [
        ("audit", 6, 4, True), ("mail", 6, 8, False)]
    table = run_cli("subscriptions", "cf", url=db_url).stdout.decode()
    assert "audit" in table and "behind" in table
    assert run_cli("unsubscribe", "cf", "audit", url=db_url).returncode == 0
    assert run_cli("unsubscribe", "cf", "audit", url=db_url).returncode == 1
    assert "--drop-when-behind" in run_cli("subscribe", "--help", url=db_url).stdout.decode()
    run_cli("install", "cp", "--kind", "ring", "--size", "16", url=db_url)
    refused = run_cli("subscribe", "cp", "audit", url=db_url)
    assert refused.returncode == 2 and "does not fan out" in refused.stderr.decode()
    refused = run_cli("install", "cx", "--kind", "fifo", "--fanout", url=db_url)
    assert refused.returncode == 2 and "--kind ring only" in refused.stderr.decode()


def test_cli_dequeue_reads_a_fanout_ring_through_a_subscription(engine, db_url):
    from conftest import run_cli

    assert run_cli("install", "cd", "--kind", "ring", "--size", "16", "--fanout", url=db_url).returncode == 0
    assert run_cli("subscribe", "cd", "audit", url=db_url).returncode == 0
    assert run_cli("subscribe", "cd", "mail", url=db_url).returncode == 0
    with RingQueue(engine, "cd") as q:
        q.enqueue_many(["m0", "m1", "m2"])
    refused = run_cli("dequeue", "cd", url=db_url)
    assert refused.returncode == 2 and "--subscription NAME" in refused.stderr.decode(), refused.stderr
    # audit: two acknowledged at once, then the third claimed and left to its lease
    done = [json.loads(line) for line in run_cli("dequeue", "cd", "--subscription", "audit", "--batch", "2", "--ack",
                                                 url=db_url).stdout.decode().splitlines()]
    assert [(r["payload"], r["status"], r["tries"], r["subscription"]) for r in done] == [
        ("m0", "done", 1, "audit"), ("m1", "done", 1, "audit")]
    claimed = [json.loads(line) for line in run_cli("dequeue", "cd", "--subscription", "audit", "--batch", "5",
                                                    "--lease", "60", url=db_url).stdout.decode().splitlines()]
    assert [(r["payload"], r["status"]) for r in claimed] == [("m2", "claimed")]
    # mail reads every message too, independently of audit
    mail = [json.loads(line) for line in run_cli("dequeue", "cd", "--subscription", "mail", "--batch", "5", "--ack",
                                                 url=db_url).stdout.decode().splitlines()]
    assert [r["payload"] for r in mail] == ["m0", "m1", "m2"]
    listed = {s["name"]: s for s in json.loads(run_cli("subscriptions", "cd", "--json", url=db_url).stdout)}
    assert (listed["audit"]["claimed"], listed["mail"]["claimed"]) == (1, 0)
    run_cli("install", "cq", "--kind", "ring", "--size", "16", url=db_url)
    refused = run_cli("dequeue", "cq", "--subscription", "audit", url=db_url)
    assert refused.returncode == 2 and "not a fan-out ring" in refused.stderr.decode(), refused.stderr


def test_health_marks_a_lagging_subscription_behind_with_advice(engine):
    from queuectl.health import HealthOptions, health_report

    with fanout(engine, 16, lag_limit=4) as q:
        q.subscribe("live")
        q.subscribe("stuck")
        q.subscribe("gone", drop_when_behind=True)
        live = q.subscription("live")
        q.enqueue_many([f"m{i}" for i in range(6)])
        live.ack(live.dequeue(10))
        rep = health_report(engine, ["f"], options=HealthOptions())
    checks = {c.object: c for c in rep.checks if c.id == "queue.subscription"}
    assert checks["f.live"].status == "OK" and checks["f.live"].advice is None
    assert checks["f.stuck"].status == "CRITICAL" and checks["f.stuck"].value == 6
    assert "queuectl unsubscribe f stuck" in checks["f.stuck"].advice
    assert checks["f.gone"].status == "CRITICAL" and checks["f.gone"].summary.startswith("dropped")
    assert rep.exit_code == 2


# -- the fault run: 3 subscriptions x 2 consumer processes, one of each killed mid-run ---------


def read_ledger(path) -> list[dict]:
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a torn last line of a SIGKILLed process
            pass
    return records


def fanout_fault_run(engine, db_url, tmp_path, messages: int, size: int = 1024) -> dict:
    """The run of RESULTS and the suite: returns what it measured (the test asserts on it)."""
    import multiprocessing as mp
    import os
    import signal

    import fanout_workers
    from queuectl.health import HealthOptions, health_report

    install_queue(engine, "fan", "ring", RingSettings(size=size, fanout=True))
    subs = ("audit", "billing", "search")
    with RingQueue(engine, "fan") as admin:
        for s in subs:
            admin.subscribe(s)
        # no consumer: behind past half the ring, then dropped by a push
        admin.subscribe("lagger", drop_when_behind=True)

    def sizes():
        with engine.connect() as conn:
            return conn.execute(sa.text(
                "SELECT pg_relation_size('queuectl.fan_ring'), pg_relation_size('queuectl.fan_ring_pkey'), "
                "pg_relation_size('queuectl.fan_sub_slots'), pg_relation_size('queuectl.fan_sub_slots_pkey')")).one()

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    consumers = {}
    for s in subs:
        for k in range(2):
            path = tmp_path / f"{s}-{k}.jsonl"
            proc = ctx.Process(target=fanout_workers.consume, args=(db_url, "fan", s, str(path), stop))
            proc.start()
            consumers[(s, k)] = (proc, path)
    producer_path = tmp_path / "producer.jsonl"
    started = time.monotonic()
    producer = ctx.Process(target=fanout_workers.produce, args=(db_url, "fan", messages, 100, str(producer_path)))
    producer.start()

    def published() -> int:
        return sum(len(r.get("items", [])) for r in read_ledger(producer_path)) if producer_path.exists() else 0

    # health while the run goes on: the subscription without consumers is behind (then dropped)
    while published() < min(messages // 10, size):
        time.sleep(0.05)
    behind = [c for c in health_report(engine, ["fan"], options=HealthOptions()).checks
              if c.id == "queue.subscription" and c.object == "fan.lagger"]
    # sizes once every slot has held a payload (three laps), then at the end
    while published() < 3 * size:
        time.sleep(0.05)
    before = sizes()
    # one consumer of each subscription is killed mid-run, holding claims it has not acknowledged
    while published() < messages // 3:
        time.sleep(0.05)
    killed = []
    for s in subs:
        proc, path = consumers[(s, 0)]
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        killed.append(s)
    while published() < messages // 2:
        time.sleep(0.05)
    middle = sizes()
    producer.join(timeout=600)
    assert producer.exitcode == 0

    def drained() -> bool:
        with RingQueue(engine, "fan") as q:
            state = {i.name: i for i in q.subscriptions()}
        return all(state[s].lag == 0 and state[s].claimed == 0 for s in subs)
    deadline = time.monotonic() + 600
    while not drained():
        assert time.monotonic() < deadline, "the subscriptions did not drain"
        time.sleep(0.2)
    elapsed = time.monotonic() - started
    stop.set()
    for (s, k), (proc, _path) in consumers.items():
        if k == 1:
            proc.join(timeout=60)
    after = sizes()
    report = health_report(engine, ["fan"], options=HealthOptions())
    final = {c.object: c for c in report.checks if c.id == "queue.subscription"}

    pushed = {i: p for r in read_ledger(producer_path) for i, p in r.get("items", [])}
    result: dict = {"messages": len(pushed), "seconds": round(elapsed, 1), "sizes_before": tuple(before),
                    "sizes_middle": tuple(middle), "sizes_after": tuple(after), "killed": killed, "lagger_during_run": behind,
                    "final_checks": final, "per_subscription": {}}
    for s in subs:
        acked: list[int] = []
        got: dict[int, list[str]] = {}
        retaken = 0
        unledgered: list[int] = []
        for k in range(2):
            pending: list[int] = []
            for r in read_ledger(consumers[(s, k)][1]):
                if r["ev"] == "acked":
                    acked += r["ids"]
                    pending = []
                elif r["ev"] == "got":
                    pending = [i for i, _tries, _text in r["items"]]
                    for i, tries, text in r["items"]:
                        got.setdefault(i, []).append(text)
                        retaken += tries > 1
            if k == 0:
                # the killed consumer's last claims with no "acked" line: the ones nobody took
                # again were acknowledged by its ack before the kill (the subscription drained
                # with no claim left, so each was acknowledged by someone: by it, then)
                unledgered = [i for i in pending if i not in acked and len(got[i]) == 1]
        delivered = acked + [i for i in unledgered if i not in acked]
        result["per_subscription"][s] = {
            "acked": len(delivered), "distinct_acked": len(set(delivered)), "acked_before_kill_unledgered": len(unledgered),
            "every_message_once": sorted(delivered) == sorted(pushed),
            "payloads_match": all(texts == [pushed[i]] * len(texts) for i, texts in got.items()),
            "taken_again_after_kill": retaken,
        }
    return result


@pytest.mark.slow
def test_fault_run_three_subscriptions_two_consumers_each_one_killed(engine, db_url, tmp_path):
    import os

    messages = int(os.environ.get("FANOUT_FAULT_MESSAGES", "30000"))
    result = fanout_fault_run(engine, db_url, tmp_path, messages)
    print(json.dumps({k: v for k, v in result.items() if k not in ("lagger_during_run", "final_checks")}, indent=1))
    print("lagger during the run:", [(c.status, c.summary) for c in result["lagger_during_run"]])
    print("final:", {k: (c.status, c.summary) for k, c in result["final_checks"].items()})
    assert result["messages"] == messages
    for s, r in result["per_subscription"].items():
        assert r["every_message_once"] and r["acked"] == r["distinct_acked"] == messages, (s, r)
        assert r["payloads_match"], s
    # the ring and the claims settle within the first laps (pages the concurrent row versions
    # need: a few more on a loaded machine, where vacuum falls behind), then stop growing:
    # bounded here, where 30 laps of a busy machine may still add pages (the claims table
    # can reach about 1.3x its size after the first laps; growth without bound would be
    # about the number of laps); the run by hand at 100,000 messages (RESULTS, the report)
    # shows the second half adding none
    bounds = [round(1.5 * b) for b in result["sizes_before"]]
    assert all(a <= b for a, b in zip(result["sizes_after"], bounds)), (result["sizes_before"], result["sizes_after"])
    if messages >= 100_000:
        assert result["sizes_after"] == result["sizes_middle"], (result["sizes_middle"], result["sizes_after"])
    assert [c.status for c in result["lagger_during_run"]] == ["CRITICAL"]
    assert result["final_checks"]["fan.lagger"].status == "CRITICAL"
    assert all(result["final_checks"][f"fan.{s}"].status == "OK" for s in ("audit", "billing", "search"))


def test_a_fanout_rings_depth_is_its_slowest_live_subscriptions_lag_and_its_claims(engine, db_url):
    """A fan-out ring keeps no FULL slot, so counting them said 0 whatever waited: `queuectl
    list` and counts() read the subscriptions instead (ready: what the slowest live one has not
    been handed; processing: the claims held); a dropped subscription no longer counts, and a
    plain ring still counts its FULL slots."""
    from conftest import run_cli

    with fanout(engine, 16) as q:
        assert q.counts()["ready"] == 0
        q.subscribe("fast")
        q.subscribe("slow", lag_limit=12, drop_when_behind=True)
        q.enqueue_many([f"m{i}" for i in range(10)])
        fast = q.subscription("fast")
        taken = fast.dequeue(4)
        assert (q.counts()["ready"], q.counts()["processing"]) == (10, 4)  # "slow" has all 10 to read
        fast.ack(taken)
        assert (q.counts()["ready"], q.counts()["processing"]) == (10, 0)
        listed = {r["name"]: r["counts"] for r in json.loads(run_cli("list", "--json", url=db_url).stdout)}
        assert (listed["f"]["ready"], listed["f"]["processing"]) == (10, 0)
        assert fast.ack(fast.dequeue(10)) == list(range(4, 10))
        q.enqueue_many([f"n{i}" for i in range(3)])  # "slow" passes its limit of 12 and is dropped
        assert [s.dropped_at is not None for s in q.subscriptions()] == [False, True]
        assert (q.counts()["ready"], q.counts()["processing"]) == (3, 0)  # only "fast" is waited for
    install_queue(engine, "p", "ring", RingSettings(size=8))
    with RingQueue(engine, "p") as plain:
        plain.enqueue_many(["a", "b"])
        assert plain.counts()["ready"] == 2
