"""The Spark side: one SparkSession per process, local by default or on a given cluster.

PySpark and matplotlib are an optional extra (`spark`); without them the pipeline stops
with a one-line error naming the command that installs them for this interpreter.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from queuectl.errors import UsageError

DEFAULT_MASTER = "local[*]"
MASTER_ENV = "QUEUECTL_SPARK_MASTER"
APP_NAME = "queuectl-pipeline"


def install_command() -> str:
    """How to add the spark extra to the running interpreter: from the checkout it runs from
    (an editable install: `make venv-spark` there), else from the package index."""
    checkout = Path(__file__).resolve().parents[2]  # toolkit/pipeline/spark.py in a checkout
    pip = f"{shlex.quote(sys.executable)} -m pip install"
    if (checkout / "pyproject.toml").is_file() and (checkout / "toolkit").is_dir():
        return f"make venv-spark (in {checkout}), or {pip} -e {shlex.quote(f'{checkout}[spark]')}"
    return f"{pip} 'queuectl[spark]'"


def require_pyspark():
    try:
        import matplotlib  # noqa: F401  (the report's charts)
        import pyspark
    except ImportError as exc:
        raise UsageError(f"the pipeline needs the spark extra ({exc.name} is missing): {install_command()}") from None
    return pyspark


def get_session(master: str | None = None, jars: list[Path] | None = None, extra: dict[str, str] | None = None):
    """A SparkSession on `master` (else $QUEUECTL_SPARK_MASTER, else local[*]) with the
    given jars on the driver's and executors' classpath.

    Spark keeps one session per process: when one is already running (a notebook, a test
    module) it is reused as it is, and the jars are added to it.
    """
    require_pyspark()
    from pyspark.sql import SparkSession

    master = master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER
    jar_list = ",".join(str(j) for j in (jars or []))
    active = SparkSession.getActiveSession()
    if active is not None:
        present = active.sparkContext.getConf().get("spark.jars", "")
        for jar in jars or []:
            if str(jar) not in present.split(","):
                # Ships it to executors; a driver started without it may still miss the class.
                active.sparkContext._jsc.sc().addJar(str(jar))
        return active
    builder = (
        SparkSession.builder.master(master)
        .appName(APP_NAME)
        # Hours and days in the lake and the report are UTC, whatever the machine says.
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.parquet.compression.codec", "zstd")
    )
    if "spark.driver.extraJavaOptions" not in (extra or {}):
        # Spark's startup chatter (WARN lines, "Using Spark's default log4j profile") would
        # bury the CLI's own output on stderr: errors only.
        builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{_quiet_log4j()}")
    if jar_list:
        # spark.jars ships the jar to executors; the driver's own JDBC calls need it on the
        # driver class path too.
        builder = builder.config("spark.jars", jar_list).config("spark.driver.extraClassPath", jar_list.replace(",", os.pathsep))
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
"""


def _quiet_log4j() -> Path:
    """A log4j2 configuration that logs errors only, written once per user."""
    import tempfile

    path = Path(tempfile.gettempdir()) / f"queuectl-log4j2-{os.getuid()}.properties"
    if not path.is_file() or path.read_text() != _LOG4J2:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(_LOG4J2)
        os.replace(tmp, path)
    return path
