"""Analytics over the lake with Spark: per queue and hour, rendered as JSON and PNG charts.

Per queue and hour (UTC):
  enqueued      items whose enqueued_at falls in the hour
  completed     items finished DONE in the hour (finished_at), dead = finished DEAD
  throughput    completed per second over the hour
  wait          dequeued_at - enqueued_at of items finished in the hour: p50, p90, p99 (s)
  processing    finished_at - dequeued_at of the same items: p50, p90, p99 (s)
  attempts      how many of the hour's finished items took 1, 2, ... attempts
  dead_rate     dead / (completed + dead)
Percentiles are Spark's exact `percentile` (linear interpolation, as PostgreSQL's
percentile_cont), not an approximation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path

from queuectl.errors import UsageError
from queuectl.pipeline.lake import Lake
from queuectl.pipeline.spark import get_session

STATUS_DONE, STATUS_DEAD = 2, 3
PERCENTILES = (0.5, 0.9, 0.99)
CHARTS = ("throughput.png", "latency.png", "attempts.png")


@dataclass
class Report:
    lake: str
    since: str | None
    generated_at: str
    queues: dict[str, dict]
    out_dir: str | None = None
    charts: list[str] | None = None

    def as_dict(self) -> dict:
        return {
            "lake": self.lake,
            "since": self.since,
            "generated_at": self.generated_at,
            "queues": self.queues,
            "out_dir": self.out_dir,
            "charts": self.charts or [],
        }


def parse_since(text: str | None) -> date | None:
    if text is None:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--since must be a date like 2025-01-31, got {text!r}") from None


def build_report(lake_path: str, *, since: str | None = None, out_dir: str | None = None, master: str | None = None) -> Report:
    """Compute the report from the lake; with out_dir, write report.json and the charts there."""
    since_day = parse_since(since)
    lake = Lake(lake_path)
    if not lake.committed_files():
        raise UsageError(f"lake {lake} holds no exported history yet: run `queuectl pipeline export --lake {lake}` first")
    spark = get_session(master)
    queues = compute(spark, lake, since_day)
    report = Report(
        lake=str(lake),
        since=since_day.isoformat() if since_day else None,
        generated_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        queues=queues,
    )
    if out_dir:
        out = Path(out_dir).expanduser().absolute()
        out.mkdir(parents=True, exist_ok=True)
        report.out_dir = str(out)
        report.charts = draw_charts(queues, out)
        (out / "report.json").write_text(json.dumps(report.as_dict(), indent=2) + "\n", "utf-8")
    return report


def compute(spark, lake: Lake, since_day: date | None) -> dict[str, dict]:
    from pyspark.sql import functions as F

    # Only files named by commit records (never a half-published run's), with the queue=
    # and day= folders still read as columns.
    files = [str(p) for p in lake.committed_files()]
    rows = spark.read.option("basePath", str(lake.history_dir)).parquet(*files)
    if since_day is not None:
        # day (of finished_at) prunes partitions; enqueue counts keep their own filter.
        rows = rows.where(F.col("day") >= F.lit(since_day))
    rows = rows.withColumns(
        {
            "wait_s": (F.unix_micros("dequeued_at") - F.unix_micros("enqueued_at")) / F.lit(1e6),
            "processing_s": (F.unix_micros("finished_at") - F.unix_micros("dequeued_at")) / F.lit(1e6),
        }
    )
    finished = rows.where(F.col("finished_at").isNotNull()).withColumn("hour", F.date_trunc("hour", "finished_at"))
    pct = F.array(*(F.lit(p) for p in PERCENTILES))
    timed = F.col("dequeued_at").isNotNull()
    by_finish = (
        finished.groupBy("queue", "hour")
        .agg(
            F.sum(F.when(F.col("status") == STATUS_DONE, 1).otherwise(0)).alias("completed"),
            F.sum(F.when(F.col("status") == STATUS_DEAD, 1).otherwise(0)).alias("dead"),
            F.percentile(F.when(timed, F.col("wait_s")), pct).alias("wait"),
            F.percentile(F.when(timed, F.col("processing_s")), pct).alias("processing"),
        )
        .collect()
    )
    enqueued_rows = rows.withColumn("hour", F.date_trunc("hour", "enqueued_at"))
    if since_day is not None:
        enqueued_rows = enqueued_rows.where(F.to_date("enqueued_at") >= F.lit(since_day))
    by_enqueue = enqueued_rows.groupBy("queue", "hour").agg(F.count(F.lit(1)).alias("enqueued")).collect()
    attempts_by_hour = finished.groupBy("queue", "hour", "attempts").agg(F.count(F.lit(1)).alias("n")).collect()
    totals = (
        finished.groupBy("queue")
        .agg(
            F.count(F.lit(1)).alias("finished"),
            F.sum(F.when(F.col("status") == STATUS_DONE, 1).otherwise(0)).alias("completed"),
            F.sum(F.when(F.col("status") == STATUS_DEAD, 1).otherwise(0)).alias("dead"),
            F.percentile(F.when(timed, F.col("wait_s")), pct).alias("wait"),
            F.percentile(F.when(timed, F.col("processing_s")), pct).alias("processing"),
            F.min("finished_at").alias("first"),
            F.max("finished_at").alias("last"),
        )
        .collect()
    )
    return _assemble(by_finish, by_enqueue, attempts_by_hour, totals)


def _pcts(values) -> dict[str, float | None]:
    if values is None:
        return {f"p{int(p * 100)}": None for p in PERCENTILES}
    return {f"p{int(p * 100)}": (None if v is None else float(v)) for p, v in zip(PERCENTILES, values)}


def _hour_key(ts: datetime) -> str:
    return ts.replace(tzinfo=timezone.utc).isoformat() if ts.tzinfo is None else ts.astimezone(timezone.utc).isoformat()


def _dead_rate(completed: int, dead: int) -> float | None:
    return dead / (completed + dead) if completed + dead else None


def _assemble(by_finish, by_enqueue, attempts_by_hour, totals) -> dict[str, dict]:
    hours: dict[str, dict[str, dict]] = {}

    def slot(queue: str, hour: datetime) -> dict:
        per_queue = hours.setdefault(queue, {})
        key = _hour_key(hour)
        return per_queue.setdefault(
            key,
            {"hour": key, "enqueued": 0, "completed": 0, "dead": 0, "throughput_per_s": 0.0,
             "dead_rate": None, "wait_s": _pcts(None), "processing_s": _pcts(None), "attempts": {}},
        )  # fmt: skip

    for r in by_finish:
        s = slot(r["queue"], r["hour"])
        s.update(
            completed=int(r["completed"]),
            dead=int(r["dead"]),
            throughput_per_s=int(r["completed"]) / 3600.0,
            dead_rate=_dead_rate(int(r["completed"]), int(r["dead"])),
            wait_s=_pcts(r["wait"]),
            processing_s=_pcts(r["processing"]),
        )
    for r in by_enqueue:
        slot(r["queue"], r["hour"])["enqueued"] = int(r["enqueued"])
    attempts_total: dict[str, dict[str, int]] = {}
    for r in attempts_by_hour:
        s = slot(r["queue"], r["hour"])
        s["attempts"][str(r["attempts"])] = int(r["n"])
        per_queue = attempts_total.setdefault(r["queue"], {})
        per_queue[str(r["attempts"])] = per_queue.get(str(r["attempts"]), 0) + int(r["n"])
    result: dict[str, dict] = {}
    summary = {r["queue"]: r for r in totals}
    for queue in sorted(hours):
        ordered = [hours[queue][k] for k in sorted(hours[queue])]
        for s in ordered:
            s["attempts"] = dict(sorted(s["attempts"].items(), key=lambda kv: int(kv[0])))
        t = summary.get(queue)
        completed = int(t["completed"]) if t else 0
        dead = int(t["dead"]) if t else 0
        span = (t["last"] - t["first"]).total_seconds() if t and t["first"] and t["last"] else 0.0
        result[queue] = {
            "summary": {
                "enqueued": sum(s["enqueued"] for s in ordered),
                "completed": completed,
                "dead": dead,
                "dead_rate": _dead_rate(completed, dead),
                "throughput_per_s": completed / span if span > 0 else None,
                "wait_s": _pcts(t["wait"] if t else None),
                "processing_s": _pcts(t["processing"] if t else None),
                "attempts": dict(sorted(attempts_total.get(queue, {}).items(), key=lambda kv: int(kv[0]))),
                "first_finished": _hour_key(t["first"]) if t and t["first"] else None,
                "last_finished": _hour_key(t["last"]) if t and t["last"] else None,
            },
            "hours": ordered,
        }
    return result


def draw_charts(queues: dict[str, dict], out: Path) -> list[str]:
    """throughput.png, latency.png and attempts.png (matplotlib, Agg: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    def hours_of(q: dict) -> list[datetime]:
        return [datetime.fromisoformat(h["hour"]) for h in q["hours"]]

    written = []
    fig, ax = plt.subplots(figsize=(10, 4))
    for name, q in queues.items():
        ax.plot(hours_of(q), [h["throughput_per_s"] for h in q["hours"]], marker=".", label=f"{name} completed/s")
    ax.set_title("Throughput per hour (UTC)")
    ax.set_ylabel("items / s")
    _finish_time_axis(ax, mdates)
    written.append(_save(fig, out / "throughput.png", plt))

    fig, axes = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for ax, metric, title in ((axes[0], "wait_s", "Wait (dequeued - enqueued)"), (axes[1], "processing_s", "Processing (finished - dequeued)")):
        for name, q in queues.items():
            for p, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
                ax.plot(hours_of(q), [h[metric][p] for h in q["hours"]], style, label=f"{name} {p}")
        ax.set_title(f"{title}, seconds")
        ax.set_ylabel("s")
        _finish_time_axis(ax, mdates)
    written.append(_save(fig, out / "latency.png", plt))

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(len(queues), 1)
    for i, (name, q) in enumerate(queues.items()):
        dist = q["summary"]["attempts"]
        xs = [int(k) + (i - (len(queues) - 1) / 2) * width for k in dist]
        ax.bar(xs, list(dist.values()), width=width, label=name)
    ax.set_title("Attempts per finished item")
    ax.set_xlabel("attempts")
    ax.set_ylabel("items")
    ax.legend()
    written.append(_save(fig, out / "attempts.png", plt))
    return written


def _finish_time_axis(ax, mdates) -> None:
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def _save(fig, path: Path, plt) -> str:
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
