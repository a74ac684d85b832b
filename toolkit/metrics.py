"""The health facts as Prometheus / OpenMetrics metrics, for operators who scrape.

One gathering path: every value comes from a HealthReport (queuectl.health), so the metrics,
`queuectl health --json` and the rich text always tell the same story. ``families`` turns a
report into metric families; ``exposition`` renders one report as text (`queuectl health
--format openmetrics|prometheus`); ``start_server`` serves a fresh report per scrape
(`queuectl metrics serve`).

Names follow the Prometheus conventions: the ``queuectl_`` prefix, base units in the name
(``_seconds``, ``_bytes``, ``_ratio`` for 0..1), ``_total`` on counters, and labels for what
varies (schema, queue, kind, status, table, index, job_name, outcome). docs/operations.md
lists every metric. Label values are data (role names, application names, job errors are written
by anyone): prometheus_client escapes them, nothing here pastes text into the exposition.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from prometheus_client import exposition as prometheus_text
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector, CollectorRegistry

from queuectl.health import HealthReport, QueueFacts, horizon_holders
from queuectl.thresholds import CRITICAL, INFO, OK, STATUSES, WARNING

DEPTH_STATUSES = ("ready", "scheduled", "processing", "done", "dead")


class _Families:
    """Metric families by name, created on first use with their help and unit."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._by_name: dict[str, Metric] = {}

    def add(self, kind: type[Metric], name: str, help: str, labels: dict[str, str], value: Any, unit: str = "") -> None:
        """One sample of `name`; a value the report does not have (None) is left out."""
        if value is None:
            return
        labels = {"schema": self.schema, **labels}
        family = self._by_name.get(name)
        if family is None:
            family = self._by_name[name] = kind(name, help, labels=list(labels), unit=unit)
        family.add_metric([str(v) for v in labels.values()], float(value))

    def gauge(self, name: str, help: str, labels: dict[str, str], value: Any, unit: str = "") -> None:
        self.add(GaugeMetricFamily, name, help, labels, value, unit)

    def counter(self, name: str, help: str, labels: dict[str, str], value: Any) -> None:
        self.add(CounterMetricFamily, name, help, labels, value)

    def all(self) -> list[Metric]:
        return list(self._by_name.values())


def _timestamp(value: datetime | None) -> float | None:
    if value is None:
        return None
    return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()


def _ratio(percent: float | None) -> float | None:
    return None if percent is None else percent / 100.0


def _per_second(q: QueueFacts, count: int | None) -> float | None:
    return None if count is None or not q.window_s else count / q.window_s


def families(report: HealthReport) -> list[Metric]:
    """Every metric of one health report (see docs/operations.md, "Metrics")."""
    f = report.facts
    m = _Families(f.schema)
    kind_of = {q.name: q.kind for q in f.queues}

    m.gauge("queuectl_health_status", "The health verdict as `queuectl health` exits: 0 OK, 1 WARNING, 2 CRITICAL.",
            {}, report.exit_code)
    counts = dict.fromkeys(STATUSES, 0)
    for check in report.checks:
        counts[check.status] += 1
    for status in (OK, INFO, WARNING, CRITICAL):
        m.gauge("queuectl_health_checks", "Health checks by their status.", {"status": status}, counts[status])

    for q in f.queues:
        labels = {"queue": q.name, "kind": q.kind}
        m.gauge("queuectl_queue_readable", "1 when the queue's tables were read, 0 when its probe failed (a lock "
                "timeout) or its kind has no probe.", labels, int(q.probed))
        if not q.probed:
            continue
        for status in DEPTH_STATUSES:
            m.gauge("queuectl_queue_items", "Items in the queue by status (a kind has only the statuses it keeps).",
                    {**labels, "status": status}, getattr(q, status))
        m.gauge("queuectl_queue_oldest_ready_age_seconds", "How long the oldest due item has waited (0: none waits).",
                labels, q.oldest_ready_age_s or 0.0, "seconds")
        m.gauge("queuectl_queue_stuck_items", "Items in processing whose lease has expired.", labels, q.stuck)
        m.gauge("queuectl_queue_rate_window_seconds", "The window the queue's rates are averaged over.",
                labels, q.window_s, "seconds")
        m.gauge("queuectl_queue_enqueue_rate", "Items enqueued per second over the rate window.",
                labels, _per_second(q, q.enqueued_in_window))
        m.gauge("queuectl_queue_dequeue_rate", "Items taken by consumers per second over the rate window (their "
                "latest dequeue; reliable queues, whose rows outlive the dequeue).", labels, _per_second(q, q.dequeued_in_window))
        m.gauge("queuectl_queue_completion_rate", "Items completed per second over the rate window.",
                labels, _per_second(q, q.completed_in_window))
        m.gauge("queuectl_queue_dead_letter_rate", "Items that used up their attempts per second over the rate window.",
                labels, _per_second(q, q.died_in_window))
        m.gauge("queuectl_queue_watermark_lag", "Rows between a watermark queue's stored watermark and its oldest "
                "waiting item (below 0: items are skipped).", labels, q.watermark_lag)
        m.gauge("queuectl_queue_ring_fill_ratio", "Share of a ring queue's slots in use.", labels, _ratio(q.ring_fill_pct))
        m.gauge("queuectl_queue_rotation_lag", "Items since a reliable queue's generations last rotated (the archive "
                "job rotates them).", labels, q.rotation_lag)
        m.gauge("queuectl_queue_rotation_stranded", "Items due in a reliable queue's sealed generation that the "
                "archive job has not emptied yet (expired leases, ready items the seal passed over): no dequeue looks "
                "there.", labels, q.rotation_stranded)

    graded = {(c.id, c.object): c.value for c in report.checks}
    for t in f.tables:
        labels = {"queue": t["queue"], "kind": kind_of.get(t["queue"], ""), "table": t["table_name"]}
        m.gauge("queuectl_table_live_rows", "Live rows in a queue table (the server's statistics).", labels, t["n_live_tup"])
        m.gauge("queuectl_table_dead_rows", "Dead row versions in a queue table waiting for VACUUM (the server's "
                "statistics).", labels, t["n_dead_tup"])
        m.gauge("queuectl_table_size_bytes", "Size of a queue table (heap).", labels, t["table_bytes"], "bytes")
        m.gauge("queuectl_table_indexes_size_bytes", "Size of a queue table's indexes.", labels, t["index_bytes"], "bytes")
        m.gauge("queuectl_table_bloat_ratio", "Free space beyond fillfactor in a queue table (pgstattuple_approx; "
                "only for tables large enough to grade).", labels, _ratio(graded.get(("storage.table_bloat", t["table_name"]))))
        last = max((d for d in (t["last_vacuum"], t["last_autovacuum"]) if d), default=None)
        m.gauge("queuectl_table_last_vacuum_timestamp_seconds", "When the table was last vacuumed (by hand or by "
                "autovacuum).", labels, _timestamp(last), "seconds")
        m.counter("queuectl_table_vacuums", "Manual VACUUMs of the table since the statistics were reset.",
                  labels, t["vacuum_count"])
        m.counter("queuectl_table_autovacuums", "Autovacuum runs on the table since the statistics were reset.",
                  labels, t["autovacuum_count"])

    for ix in f.indexes:
        labels = {"queue": ix["queue"], "kind": kind_of.get(ix["queue"], ""), "index": ix["index_name"]}
        m.gauge("queuectl_index_size_bytes", "Size of an index of a queue table.", labels, ix["index_bytes"], "bytes")
        m.gauge("queuectl_index_valid", "0 for an invalid index (an interrupted CREATE/REINDEX CONCURRENTLY).",
                labels, int(bool(ix["valid"]) and not ix["reindex_leftover"]))
        m.gauge("queuectl_index_bloat_ratio", "Wasted leaf space of a B-tree index (pgstatindex; only for indexes "
                "large enough to grade).", labels, _ratio(graded.get(("storage.index_bloat", ix["index_name"]))))
        m.counter("queuectl_index_scans", "Scans of the index since the statistics were reset.", labels, ix["idx_scan"])

    _blockers(m, report)

    for run in f.jobs["runs"]:
        # job_name, not job: Prometheus gives every scraped series its own `job` label (the scrape job)
        labels = {"job_name": run["job"], "queue": run["queue"] or ""}
        m.gauge("queuectl_job_last_run_outcome", "1, labelled with the outcome of the job's last run (running while "
                "it has not finished).", {**labels, "outcome": run["outcome"] or "running"}, 1)
        m.gauge("queuectl_job_last_run_start_timestamp_seconds", "When the job's last run started.",
                labels, _timestamp(run["started_at"]), "seconds")
        m.gauge("queuectl_job_last_run_duration_seconds", "How long the job's last finished run took.",
                labels, run["duration_s"], "seconds")
        m.gauge("queuectl_job_last_run_rows", "Rows the job's last run handled.", labels, run["rows"])
        m.gauge("queuectl_job_last_success_timestamp_seconds", "When the job last succeeded (within the lookback).",
                labels, _timestamp(run["last_success_at"]), "seconds")
        m.gauge("queuectl_job_failures", "Failed runs of the job in the failure window "
                f"({report.options.job_failure_window_s:g} s).", labels, run["failures"])
    return m.all()


def _blockers(m: _Families, report: HealthReport) -> None:
    """What holds back cleanup: the xmin horizon's holders, slots, standbys, prepared transactions."""
    f = report.facts
    holders = horizon_holders(f)
    m.gauge("queuectl_cleanup_oldest_xmin_age_seconds", "Age of the oldest transaction or snapshot holding back "
            "VACUUM in this database (0: none).", {}, holders[0]["xact_age_s"] if holders else 0.0, "seconds")
    m.gauge("queuectl_cleanup_dead_rows", "Dead row versions in all queue tables: what a blocker keeps VACUUM from "
            "removing.", {}, sum(t["n_dead_tup"] or 0 for t in f.tables))
    for s in f.sessions:
        labels = {"pid": str(s["pid"]), "role": s["usename"] or "", "application": s["application_name"] or "",
                  "state": s["state"] or s["backend_type"] or ""}
        m.gauge("queuectl_cleanup_session_transaction_age_seconds", "Age of the transaction of a session that holds "
                "back cleanup or sits idle in a transaction.", labels, s["xact_age_s"], "seconds")
    for slot in f.replication_slots:
        labels = {"slot": slot["slot_name"], "slot_type": slot["slot_type"] or ""}
        m.gauge("queuectl_cleanup_replication_slot_xmin_age_transactions", "Transactions a replication slot's xmin "
                "holds back.", labels, slot["xmin_age_xids"])
        m.gauge("queuectl_cleanup_replication_slot_active", "1 when a consumer is attached to the slot.",
                labels, int(bool(slot["active"])))
        m.gauge("queuectl_cleanup_replication_slot_retained_wal_bytes", "WAL the slot keeps on the server.",
                labels, slot["retained_wal_bytes"], "bytes")
    for r in f.standby_feedback:
        m.gauge("queuectl_cleanup_standby_xmin_age_transactions", "Transactions a standby's hot_standby_feedback "
                "holds back.", {"application": r["application_name"] or str(r["pid"])}, r["xmin_age_xids"])
    for p in f.prepared_xacts:
        m.gauge("queuectl_cleanup_prepared_transaction_age_seconds", "Age of a prepared (two-phase) transaction "
                "never committed or rolled back.", {"gid": p["gid"], "database": p["database"]}, p["age_s"], "seconds")


# -- collecting and serving ------------------------------------------------------------------------


class HealthCollector(Collector):
    """Gathers a health report per collect() and yields its families, plus queuectl_up.

    A gathering that fails or takes longer than ``timeout`` gives queuectl_up 0 (and a call
    of ``on_error``), never a hung scrape; scrapes that arrive while a gathering runs share
    it, so slow scrapes never pile queries on the server."""

    def __init__(self, gather: Callable[[], HealthReport], schema: str, timeout: float,
                 on_error: Callable[[BaseException], None]) -> None:
        self._gather, self._schema, self._timeout, self._on_error = gather, schema, timeout, on_error
        self._lock = threading.Lock()
        self._running: Future[HealthReport] | None = None

    def describe(self) -> Iterable[Metric]:
        return []  # names vary with the report: registering never gathers

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        try:
            report: HealthReport | None = self._report()
        except Exception as exc:
            self._on_error(exc)
            report = None
        if report is not None:
            yield from families(report)
        schema = {"schema": self._schema}
        up = GaugeMetricFamily("queuectl_up", "1 when the health facts were gathered, 0 when the database failed "
                               "or was too slow.", labels=list(schema))
        up.add_metric([self._schema], float(report is not None))
        took = GaugeMetricFamily("queuectl_health_gather_duration_seconds", "How long gathering the health facts "
                                 "took (or waited, when it timed out).", labels=list(schema), unit="seconds")
        took.add_metric([self._schema], time.monotonic() - started)
        yield up
        yield took

    def _report(self) -> HealthReport:
        with self._lock:
            if self._running is None or self._running.done():
                self._running = Future()
                threading.Thread(target=self._run, args=(self._running,), name="queuectl-health-gather",
                                 daemon=True).start()
            running = self._running
        try:
            return running.result(timeout=self._timeout)
        except TimeoutError:
            if running.done():  # the gathering's own error
                raise
            raise TimeoutError(f"health facts not gathered within {self._timeout:g} s") from None

    def _run(self, future: Future[HealthReport]) -> None:
        try:
            future.set_result(self._gather())
        except BaseException as exc:  # handed to the scrape that waits for it
            future.set_exception(exc)


class _ReportCollector(Collector):
    def __init__(self, report: HealthReport) -> None:
        self._report = report

    def collect(self) -> Iterator[Metric]:
        return iter(families(self._report))


def exposition(report: HealthReport, fmt: str = "openmetrics") -> bytes:
    """One report as OpenMetrics text (ends with `# EOF`) or the Prometheus text format: its
    families only (queuectl_up and the gathering time belong to a scrape, see HealthCollector)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ReportCollector(report))
    generate = {"openmetrics": openmetrics.generate_latest, "prometheus": prometheus_text.generate_latest}[fmt]
    return generate(registry)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class MetricsServer:
    """A running exposition endpoint; ``close`` stops it."""

    server: Any
    thread: threading.Thread
    url: str

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_server(collector: HealthCollector, host: str, port: int) -> MetricsServer:
    """Serve the collector on http://host:port/metrics (any path answers) in a daemon thread.
    The exposition format follows the scraper's Accept header (OpenMetrics or Prometheus text).
    Port 0 takes a free port: the returned url names it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, thread = prometheus_text.start_http_server(port, addr=host, registry=registry)
    bound = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    return MetricsServer(server, thread, f"http://{shown}:{bound}/metrics")
