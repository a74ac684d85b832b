"""The data pipeline on Spark: queue history to a Parquet lake, analytics and charts.

Needs the `spark` extra (PySpark, matplotlib) and a JDBC driver jar (see jdbc.py).
"""

from queuectl.pipeline.export import ExportResult, QueueExport, export_history, purge_exported
from queuectl.pipeline.lake import Bounds, Lake
from queuectl.pipeline.report import Report, build_report

__all__ = ["Bounds", "ExportResult", "Lake", "QueueExport", "Report", "build_report", "export_history", "purge_exported"]
