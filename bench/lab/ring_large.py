"""Probe: what large payloads do to a ring's size, with and without a pinned xmin horizon.

    python bench/lab/ring_large.py [--size 64] [--laps 100] [--bytes 200,1900,4000,65536]
                                   [--slot-bytes N] [--url URL] [--json out.json]

For each payload size and each mode, a fresh ring of `--size` slots is installed at the head
revision (`--slot-bytes`: its in-row width, when the head has one) and pushed full and popped
empty `--laps` times (enqueue_many and dequeue of `--size`), with random (incompressible)
payloads. Autovacuum is off on the ring's tables for the run, so what is seen is the ring's
own mechanism (HOT updates and page pruning), not a vacuum's timing. Modes:
  * free: nothing else runs; then a plain VACUUM, and the sizes again;
  * held: another session holds a REPEATABLE READ snapshot taken before the laps (a long
    report, an idle-in-transaction session), released at the end, then VACUUM.
Reported per run: the ring's heap, its TOAST table, the side table (with its TOAST) when the
ring has one, before the laps, after them, and after the VACUUM; n_tup_upd and n_tup_hot_upd
of the slots over the laps; seconds per lap.
Without --url (or $QUEUECTL_URL) a throwaway server is started in a temporary folder.
Runs: bench/lab/results/ring-large-ring_0005.json (payloads in the slots, TOASTed over ~2 kB)
and ring-large-ring_0007.json (the side table over 1,800 bytes), 64 slots, 100 laps; the
table in docs/kinds.md (ring, large messages) is read from them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa


def sizes(conn: sa.Connection, name: str) -> dict[str, int]:
    row = conn.execute(sa.text(
        "SELECT pg_relation_size(c.oid) AS heap, "
        "       coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0) AS toast, "
        "       pg_total_relation_size(c.oid) AS total, "
        "       coalesce(pg_total_relation_size(to_regclass(:large)), 0) AS side "
        "FROM pg_class c WHERE c.oid = to_regclass(:ring)"),
        {"ring": f'queuectl."{name}_ring"', "large": f'queuectl."{name}_ring_large"'}).mappings().one()
    return dict(row)


def counters(conn: sa.Connection, name: str) -> tuple[int, int]:
    conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
    row = conn.execute(sa.text(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = to_regclass(:ring)"),
        {"ring": f'queuectl."{name}_ring"'}).one()
    return int(row[0]), int(row[1])


def _vacuum(conn: sa.Connection, names, suffix: str) -> None:
    conn.execute(sa.text(f"VACUUM {names.qualified(suffix)}"))


def _autovacuum_off(conn: sa.Connection, names, suffix: str) -> None:
    conn.execute(sa.text(f"ALTER TABLE {names.qualified(suffix)} SET (autovacuum_enabled = false, "
                         "toast.autovacuum_enabled = false)"))


def one_run(url: str, nbytes: int, mode: str, size: int, laps: int, slot_bytes: int | None) -> dict:
    from queuectl.client import RingQueue
    from queuectl.install import install_queue
    from queuectl.kindspec import RingSettings
    from queuectl.names import QueueNames

    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    name = f"lab_{mode}_{nbytes}"
    extra = {} if slot_bytes is None else {"slot_bytes": slot_bytes}
    install_queue(engine, name, "ring", RingSettings(size=size, **extra))
    names = QueueNames(name)
    with engine.connect() as conn:
        for suffix in ("ring", "ring_large"):
            if conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": names.qualified(suffix)}).scalar() is not None:
                _autovacuum_off(conn, names, suffix)
        _vacuum(conn, names, "ring")
        before = sizes(conn, name)
        upd0, hot0 = counters(conn, name)
    holder = engine.connect() if mode == "held" else None
    if holder is not None:
        holder.exec_driver_sql("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.exec_driver_sql("SELECT count(*) FROM pg_class")  # takes the snapshot
    payloads = [os.urandom(nbytes) for _ in range(size)]
    started = time.monotonic()
    with RingQueue(engine, name) as q:
        for _ in range(laps):
            q.enqueue_many(payloads)
            got = q.dequeue(size)
            assert len(got) == size and all(len(m.payload) == nbytes for m in got)
    seconds = time.monotonic() - started
    with engine.connect() as conn:
        after = sizes(conn, name)
        upd1, hot1 = counters(conn, name)
        if holder is not None:
            holder.exec_driver_sql("ROLLBACK")
            holder.close()
        _vacuum(conn, names, "ring")
        if conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": names.qualified("ring_large")}).scalar():
            _vacuum(conn, names, "ring_large")
        vacuumed = sizes(conn, name)
    engine.dispose()
    return {"bytes": nbytes, "mode": mode, "size": size, "laps": laps, "before": before, "after": after,
            "vacuumed": vacuumed, "n_tup_upd": upd1 - upd0, "n_tup_hot_upd": hot1 - hot0,
            "seconds_per_lap": round(seconds / laps, 5)}


def kb(n: int) -> str:
    return f"{n / 1024:,.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--laps", type=int, default=100)
    parser.add_argument("--bytes", default="200,1900,4000,65536")
    parser.add_argument("--slot-bytes", type=int, default=None)
    parser.add_argument("--url", default=os.environ.get("QUEUECTL_URL"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="queuectl-ringlarge-", dir="/tmp") as tmp:
        server = None
        url = args.url
        if not url:
            from queuectl.engine.embedded import EmbeddedServer

            os.chmod(tmp, 0o755)
            server = EmbeddedServer(Path(tmp) / "pg")
            server.ensure_running()
            url = server.url("postgres")
        try:
            for nbytes in (int(b) for b in args.bytes.split(",")):
                for mode in ("free", "held"):
                    r = one_run(url, nbytes, mode, args.size, args.laps, args.slot_bytes)
                    results.append(r)
                    print(f"{nbytes:>6} B {mode:>4}: ring heap {kb(r['before']['heap'])} -> {kb(r['after']['heap'])}"
                          f" -> {kb(r['vacuumed']['heap'])} kB, TOAST {kb(r['before']['toast'])} -> "
                          f"{kb(r['after']['toast'])} -> {kb(r['vacuumed']['toast'])} kB, side "
                          f"{kb(r['before']['side'])} -> {kb(r['after']['side'])} -> {kb(r['vacuumed']['side'])} kB;"
                          f" HOT {r['n_tup_hot_upd']}/{r['n_tup_upd']}; {r['seconds_per_lap'] * 1000:.1f} ms/lap",
                          flush=True)
        finally:
            if server is not None:
                server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
