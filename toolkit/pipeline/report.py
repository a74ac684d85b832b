"""Analytics over the lake with Spark: per queue and hour, rendered as JSON and PNG charts.

Per queue and hour (UTC):
  enqueued      items whose enqueued_at falls in the hour
  completed     items finished DONE in the hour (finished_at), dead = finished DEAD
  throughput    completed per second over the whole hour (completed / 3600)
  wait          dequeued_at - enqueued_at of items finished in the hour: p50, p90, p99 (s)
  processing    finished_at - dequeued_at of the same items: p50, p90, p99 (s)
  attempts      how many of the hour's finished items took 1, 2, ... attempts
  dead_rate     dead / (completed + dead)
Per queue over everything: the same counts and percentiles, and throughput per second from
the first finish to the last. A run shorter than an hour therefore shows a lower hourly
figure than its summary (a 3-minute run: the hour divides by 3600 s, the summary by 180 s).

The charts use a time step chosen from the history's span (`series`: 5 s for a 3-minute
run, 15 min for a day, 6 h for a month), so a short run is a curve and not one dot; their
throughput is the summary's, per step: completed per second of the step's part between the
first and the last finish.

Percentiles are Spark's exact `percentile` (linear interpolation, as PostgreSQL's
percentile_cont), not an approximation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

from queuectl.errors import UsageError
from queuectl.pipeline.lake import Lake
from queuectl.pipeline.spark import get_session

STATUS_DONE, STATUS_DEAD = 2, 3
PERCENTILES = (0.5, 0.9, 0.99)
CHARTS = ("throughput.png", "latency.png", "attempts.png")
# The charts' time steps, seconds: the finest that keeps a chart under MAX_POINTS points.
STEPS_S = (1, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 604800)
MAX_POINTS = 120


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
            "step_s": next((q["series"]["step_s"] for q in self.queues.values()), None),
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
    # What every grouping of finished items computes: counts by outcome, wait and processing percentiles.
    outcomes = (
        F.sum(F.when(F.col("status") == STATUS_DONE, 1).otherwise(0)).alias("completed"),
        F.sum(F.when(F.col("status") == STATUS_DEAD, 1).otherwise(0)).alias("dead"),
        F.percentile(F.when(timed, F.col("wait_s")), pct).alias("wait"),
        F.percentile(F.when(timed, F.col("processing_s")), pct).alias("processing"),
    )
    by_finish = finished.groupBy("queue", "hour").agg(*outcomes).collect()
    enqueued_rows = rows.withColumn("hour", F.date_trunc("hour", "enqueued_at"))
    if since_day is not None:
        enqueued_rows = enqueued_rows.where(F.to_date("enqueued_at") >= F.lit(since_day))
    by_enqueue = enqueued_rows.groupBy("queue", "hour").agg(F.count(F.lit(1)).alias("enqueued")).collect()
    attempts_by_hour = finished.groupBy("queue", "hour", "attempts").agg(F.count(F.lit(1)).alias("n")).collect()
    totals = (
        finished.groupBy("queue")
        .agg(
            F.count(F.lit(1)).alias("finished"),
            *outcomes,
            F.min("finished_at").alias("first"),
            F.max("finished_at").alias("last"),
        )
        .collect()
    )
    result = _assemble(by_finish, by_enqueue, attempts_by_hour, totals)
    firsts = [r["first"] for r in totals if r["first"]]
    lasts = [r["last"] for r in totals if r["last"]]
    if not firsts:
        return result
    step = step_seconds((max(lasts) - min(firsts)).total_seconds())
    at = F.timestamp_seconds(F.floor(F.unix_micros("finished_at") / F.lit(step * 1_000_000)) * F.lit(step))
    by_step = finished.withColumn("at", at).groupBy("queue", "at").agg(*outcomes).collect()
    spans = {r["queue"]: (r["first"], r["last"]) for r in totals if r["first"]}
    for queue in result:
        result[queue]["series"] = {"step_s": step, "points": []}
    for r in sorted(by_step, key=lambda r: (r["queue"], r["at"])):
        if r["queue"] in result:
            result[r["queue"]]["series"]["points"].append({
                "at": _hour_key(r["at"]), "completed": int(r["completed"]), "dead": int(r["dead"]),
                "throughput_per_s": int(r["completed"]) / _covered(r["at"], step, *spans[r["queue"]]),
                "wait_s": _pcts(r["wait"]), "processing_s": _pcts(r["processing"]),
            })  # fmt: skip
    return result


def _covered(at: datetime, step: int, first: datetime, last: datetime) -> float:
    """Seconds of the step starting `at` that lie between the queue's first and last finish:
    a step's throughput divides by them, as the summary's does by the whole span, so the
    partial first and last steps of a run are not read as a slowdown."""
    covered = (min(at + timedelta(seconds=step), last) - max(at, first)).total_seconds()
    return covered if covered > 0 else float(step)


def step_seconds(span_s: float) -> int:
    """The charts' time step for a history spanning `span_s` seconds: the finest of STEPS_S
    that keeps a chart under MAX_POINTS points (3 minutes: 5 s; a day: 15 min)."""
    return next((s for s in STEPS_S if span_s / s <= MAX_POINTS), STEPS_S[-1])


def step_label(step: int) -> str:
    for unit, seconds in (("day", 86400), ("h", 3600), ("min", 60)):
        if step >= seconds and step % seconds == 0:
            return f"{step // seconds} {unit}"
    return f"{step} s"


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
    """throughput.png, latency.png and attempts.png (matplotlib, Agg: no display needed).

    Time charts use each queue's `series` (a step chosen from the span), with a marker on
    every point, so a series of one point is still seen; a y axis whose values span more
    than a factor LOG_SPREAD is logarithmic. Attempts are integer bars with their counts
    written on them, on a log axis when retries are rare beside first attempts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    def times(q: dict) -> list[datetime]:
        return [datetime.fromisoformat(p["at"]) for p in q["series"]["points"]]

    plotted = {name: q for name, q in queues.items() if q.get("series", {}).get("points")}
    step = next((q["series"]["step_s"] for q in plotted.values()), 3600)
    every = step_label(step)
    stamps = [t for q in plotted.values() for t in times(q)]
    # One step of margin each side: a single point sits mid-chart on a readable time axis.
    span = (min(stamps) - timedelta(seconds=step), max(stamps) + timedelta(seconds=step)) if stamps else None

    written = []
    fig, ax = plt.subplots(figsize=(10, 4))
    for name, q in plotted.items():
        rate = q["summary"]["throughput_per_s"]
        overall = f", {rate:,.1f}/s first to last finish" if rate else ""
        ax.plot(times(q), [p["throughput_per_s"] for p in q["series"]["points"]], marker="o", markersize=4,
                label=f"{name} ({q['summary']['completed']:,} completed{overall})")
    ax.set_title(f"Throughput: items completed per second, per {every} (UTC)")
    ax.set_ylabel("items / s")
    ax.set_ylim(bottom=0)
    _finish_time_axis(ax, mdates, span)
    written.append(_save(fig, out / "throughput.png", plt))

    fig, axes = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for ax, metric, title in ((axes[0], "wait_s", "Wait (dequeued - enqueued)"), (axes[1], "processing_s", "Processing (finished - dequeued)")):
        values = []
        for name, q in plotted.items():
            for p, style, marker in (("p50", "-", "o"), ("p90", "--", "s"), ("p99", ":", "^")):
                ys = [pt[metric][p] for pt in q["series"]["points"]]
                values += [y for y in ys if y]
                ax.plot(times(q), [float("nan") if y is None else y for y in ys], style, marker=marker, markersize=4,
                        label=f"{name} {p}")
        ax.set_title(f"{title}, seconds, per {every}")
        ax.set_ylabel("s")
        _scale(ax, values)
        _finish_time_axis(ax, mdates, span)
    written.append(_save(fig, out / "latency.png", plt))

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(len(queues), 1)
    counts = []
    for i, (name, q) in enumerate(queues.items()):
        dist = q["summary"]["attempts"]
        xs = [int(k) + (i - (len(queues) - 1) / 2) * width for k in dist]
        bars = ax.bar(xs, list(dist.values()), width=width, label=name)
        ax.bar_label(bars, labels=[f"{v:,}" for v in dist.values()], fontsize="small")
        counts += list(dist.values())
    ax.set_title("Attempts per finished item")
    ax.set_xlabel("attempts")
    ax.set_ylabel("items")
    # Whole attempts only, at least 1-3 shown: an empty 2 and 3 say "no retries" at a glance.
    most = max([int(k) for q in queues.values() for k in q["summary"]["attempts"]] + [3])
    ax.set_xticks(range(1, most + 1))
    ax.set_xlim(0.4, most + 0.6)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    _scale(ax, counts)
    if counts and ax.get_yscale() == "linear":
        ax.set_ylim(0, max(counts) * 1.12)  # room for the labels
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")  # clear of the bars' labels
    written.append(_save(fig, out / "attempts.png", plt))
    return written


LOG_SPREAD = 20.0


def _scale(ax, values: list[float]) -> None:
    """Logarithmic where positive values span more than LOG_SPREAD (rare retries beside
    thousands of first attempts, a p99 far above the p50), else linear from 0."""
    positive = [v for v in values if v and v > 0]
    if positive and max(positive) / min(positive) > LOG_SPREAD:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)


def _finish_time_axis(ax, mdates, span) -> None:
    locator = mdates.AutoDateLocator(minticks=4, maxticks=10)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    if span:
        ax.set_xlim(*span)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def _save(fig, path: Path, plt) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
