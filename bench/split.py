"""Scenario `split`: one wide table vs the meta/data split, per payload size.

For each payload size (--sizes; default 300, 1024, 4096 and 16384 bytes), each design
gets a fresh queue pre-filled with the same number of payloads, random (incompressible) or,
with --payload-content json, JSON-like records that PostgreSQL compresses as it would real ones;
then --consumers processes drain it with dequeue+ack at the given batch. Reported per
design and size: messages/s, and from pg_stat_statements (deltas, nothing is reset) the
shared buffers each dequeue call touched (hit + read, including the statements inside
the SQL function) and the WAL it wrote. Then each design's tables are emptied, filled
again the same way, and drained by the same dequeue and ack statements from pgbench
(--consumers clients, no Python): that drain rate is the row's SQL ceiling, so the two
designs are also compared without any client in the way. The one-table design is
bench-only SQL (sql/postgresql/bench.sql, onetable_*) with the same columns, indexes,
storage parameters, plan settings, dequeue and ack as the reliable queue's meta table,
and its rows are decoded into the same Messages by the same client code
(queuectl.messages.messages_from).
"""

from __future__ import annotations

from typing import Any

from queuectl.bench.core import BenchRun, ratio, scenario, stat, unavailable_once
from queuectl.bench.drivers import analyze_filled, bench_sql, driver_for
from queuectl.bench.pgbench import PgbenchUnavailable
from queuectl.bench.workers import PAYLOAD_CONTENTS, payload_pool

DESIGNS = (("onetable", "bsplit_one", "one table"), ("reliable", "bsplit_split", "meta/data split"))
FILL_PER_SECOND = 10_000  # pre-filled rows per --seconds: a drain of ~20K msg/s lasts a few seconds
FILL_BYTES = 256 * 1024 * 1024  # at most this much payload per fill (16 KB payloads: 16,384 rows)
FILL_CHUNK = 200
PAYS_FROM = 1.05  # the split "pays" where it is at least this much faster than one table
MATCHES = 0.95  # "at least matches" within this machine's noise


def _fill(run: BenchRun, driver_name: str, names: Any, count: int, payload_bytes: int) -> None:
    driver = driver_for(driver_name)
    pool = payload_pool(payload_bytes, FILL_CHUNK * 2, seed=payload_bytes, content=run.options.payload_content)
    session = driver.open(run.url, names)
    try:
        done = 0
        while done < count:
            n = min(FILL_CHUNK, count - done)
            start = done % FILL_CHUNK
            session.enqueue(pool[start:start + n])
            done += n
    finally:
        session.close()


@scenario("split", "one wide table vs the meta/data split: buffers per dequeue and drain rate per payload size",
          ("consumers", "batch", "seconds", "sizes", "payload_content"))
def split(run: BenchRun) -> dict[str, Any]:
    o = run.options
    B, C = o.batch, o.consumers
    sizes = o.sizes  # ascending (BenchOptions), default 300, 1024, 4096, 16384 (--sizes)
    fills = {size: max(1000, min(int(FILL_PER_SECOND * o.seconds), FILL_BYTES // size)) for size in sizes}
    unavailable: list[dict[str, str]] = []
    have_pgss = run.pgss_available()
    if not have_pgss:
        unavailable.append({"subject": "buffers per dequeue",
                            "reason": "pg_stat_statements is not available (needs shared_preload_libraries and CREATE EXTENSION)"})
    m: dict[tuple[str, int], dict[str, list[Any]]] = {
        (d, size): {"rate": [], "sql_rate": [], "buffers_call": [], "buffers_msg": [], "wal_msg": []}
        for d, _, _ in DESIGNS for size in sizes
    }
    with run.reporter.scenario("split", o.repeat * len(m)) as rep:
        for r in range(o.repeat):
            for size in sizes:
                # alternate which design goes first, so neither always follows the other's
                # checkpoint, autovacuum or dropped tables
                for design, queue, _ in (DESIGNS if r % 2 == 0 else DESIGNS[::-1]):
                    rep.step(f"repeat {r + 1}: {design}, {size} B")
                    names = run.names(queue)
                    driver = driver_for(design)
                    driver.install(run.engine, names)
                    fill = fills[size]
                    _fill(run, design, names, fill, size)
                    analyze_filled(run.engine, design, names)  # the same step for every design
                    fn = names.template_values()["fn_dequeue"]
                    before = run.pgss_calls(fn) if have_pgss else None
                    res = run.python_phase(design, names, "dequeue", batch=B, payload_bytes=size,
                                           producers=0, consumers=C, seconds=o.seconds)
                    after = run.pgss_calls(fn) if have_pgss else None
                    cell = m[(design, size)]
                    cell["rate"].append(res["rate"])
                    if before is not None and after is not None:
                        calls = after["calls"] - before["calls"]
                        msgs = after["rows"] - before["rows"]
                        blocks = (after["shared_blks_hit"] + after["shared_blks_read"]
                                  - before["shared_blks_hit"] - before["shared_blks_read"])
                        cell["buffers_call"].append(blocks / calls if calls else None)
                        cell["buffers_msg"].append(blocks / msgs if msgs else None)
                        wal = after["wal_bytes"] - before["wal_bytes"]
                        cell["wal_msg"].append(wal / msgs if msgs else None)
                    try:
                        cell["sql_rate"].append(_sql_drain(run, design, names, fill, size))
                    except PgbenchUnavailable as exc:
                        unavailable_once(unavailable, "SQL drain (pgbench)", str(exc))
                    driver.uninstall(run.engine, names)
                    rep.done()
    rows = []
    for size in sizes:
        for design, _, label in DESIGNS:
            cell = m[(design, size)]
            metrics = {
                "buffers_per_dequeue": stat(cell["buffers_call"]),
                "buffers_per_message": stat(cell["buffers_msg"]),
                "wal_bytes_per_message": stat(cell["wal_msg"]),
            }
            if design == "reliable":
                one = m[("onetable", size)]
                metrics["split_vs_one_table"] = stat([ratio(a, b) for a, b in zip(cell["rate"], one["rate"])])
                metrics["sql_split_vs_one_table"] = stat([ratio(a, b) for a, b in zip(cell["sql_rate"], one["sql_rate"])])
            ceiling = ({"name": f"the design's dequeue+ack via pgbench ({C} clients)", "rate": stat(cell["sql_rate"])}
                       if cell["sql_rate"] else None)
            rows.append({
                "subject": label, "phase": "dequeue+ack (drain)",
                "params": {"batch": B, "producers": 0, "consumers": C, "payload_bytes": size,
                           "payload_content": o.payload_content, "prefilled": fills[size]},
                "rate": stat(cell["rate"]), "ceiling": ceiling,
                "fraction_of_ceiling": stat([ratio(a, b) for a, b in zip(cell["rate"], cell["sql_rate"])]) if ceiling else None,
                "latency_ms": None,
                "metrics": metrics,
            })
    speedup = {size: stat([ratio(a, b) for a, b in zip(m[("reliable", size)]["rate"], m[("onetable", size)]["rate"])])["median"]
               for size in sizes}
    pays_from, pays_at, targets = split_targets(speedup, B)
    return {
        "name": "split",
        "description": "one wide table vs the meta/data split: drain of a pre-filled queue per payload size",
        "notes": [
            f"each design and size: fresh queue, {', '.join(f'{fills[z]:,}' for z in sizes)} {PAYLOAD_CONTENTS[o.payload_content]} "
            f"pre-filled (by size), {C} consumers dequeue+ack at batch {B} until empty or --seconds",
            f"SQL ceiling: the same fill drained by the design's own dequeue and ack statements from pgbench "
            f"({C} clients, -M prepared); 'sql split x' is split / one table on those drains",
            "the designs alternate which goes first from one repeat to the next",
            "after the pre-fill each design's tables are vacuumed and analyzed, so every dequeue is planned "
            "from statistics (not from whatever autovacuum had reached by then)",
            "buffers per dequeue: pg_stat_statements shared_blks_hit + shared_blks_read of the dequeue call "
            "(statements inside the function included), as a delta over the phase",
            "a row above ~2 KB has its payload compressed (pglz) and, if still above ~2 KB, stored out of "
            "line (TOAST), in both designs; random payloads do not compress",
            f"the split pays (>= {PAYS_FROM:.2f}x one table) at "
            + (", ".join(f"{z:,} B" for z in pays_at) if pays_at else "no measured size"),
        ],
        "display_metrics": [["buf/deq", "buffers_per_dequeue"], ["WAL B/msg", "wal_bytes_per_message"],
                            ["split x", "split_vs_one_table"], ["sql split x", "sql_split_vs_one_table"]],
        "ceilings": [],
        "rows": rows,
        "targets": targets,
        "unavailable": unavailable,
        "pays_from_bytes": pays_from,
        "pays_at_bytes": pays_at,
    }


def split_targets(speedup: dict[int, float | None], batch: int) -> tuple[int | None, list[int], list[dict[str, Any]]]:
    """From split / one table per payload size (ascending): the size from which the split
    pays at every larger measured size, every size at which it pays, and the two targets.
    PostgreSQL stores a payload above ~2 KB out of line (TOAST) in both designs, so the
    split may pay at some sizes without paying from them upward: both are reported, and
    "upward" names the largest size measured (it says nothing of sizes above it)."""
    sizes = sorted(speedup)
    pays_from = next((s for s in sizes if all((speedup[t] or 0) >= PAYS_FROM for t in sizes if t >= s)), None)
    pays_at = [s for s in sizes if (speedup[s] or 0) >= PAYS_FROM]
    small = speedup[sizes[0]]
    targets = [
        {"name": f"split vs one table at batch {batch}, {sizes[0]} B: at least matches (>= {MATCHES:.2f}x, noise)",
         "value": small, "threshold": MATCHES, "met": None if small is None else small >= MATCHES},
        {"name": f"split beats one table (>= {PAYS_FROM:.2f}x) from payload size "
                 + (f"{pays_from} B upward (to {sizes[-1]} B, the largest measured)" if pays_from
                    else "- (at no measured size)"),
         "value": speedup[pays_from] if pays_from else max((v for v in speedup.values() if v is not None), default=None),
         "threshold": PAYS_FROM, "met": pays_from is not None},
    ]
    return pays_from, pays_at, targets


def _sql_drain(run: BenchRun, design: str, names: Any, fill: int, size: int) -> float | None:
    """The design's own dequeue+ack statements draining the same fill from pgbench
    (--consumers clients): messages per second from the first claim to the last ack."""
    o = run.options
    driver = driver_for(design)
    # the consume script needs no payload (a 16 KB x batch payload variable is too long for pgbench)
    scripts = driver.pgbench(names, o.batch, payload_pool(1, o.batch, seed=7))
    if scripts is None:
        raise PgbenchUnavailable(f"{design} has no pgbench scripts")
    pg = run.pgbench
    with run.engine.connect() as conn:
        driver.reset(conn, names)
    _fill(run, design, names, fill, size)
    analyze_filled(run.engine, design, names)
    consume = pg.script(f"{names.queue}_drain", bench_sql(scripts.consume_section, names.template_values()))
    variables = {k: v for k, v in scripts.variables.items() if k in ("batch", "worker")}
    result = pg.run([consume], clients=o.consumers, seconds=o.pgbench_seconds, variables=variables)
    run.commands.setdefault("sql split drain", result.command)
    with run.engine.connect() as conn:
        n, span = driver.consumed(conn, names)
    return n / span if n and span else None
