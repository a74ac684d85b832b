"""A real Spark standalone cluster (one master, one worker) started from the PySpark
installation, bound to 127.0.0.1 on free ports: for tests, CI and trying `--master`.

    python -m queuectl.pipeline.standalone      # prints the master URL, Ctrl-C stops both

The processes are the same `org.apache.spark.deploy.master.Master` and
`...worker.Worker` classes a production cluster runs, launched through the `spark-class`
script that ships inside the pyspark package (its SPARK_HOME).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from queuectl.engine.embedded import free_port
from queuectl.errors import QueuectlError
from queuectl.pipeline.spark import require_pyspark

START_TIMEOUT_S = 90


class StandaloneCluster:
    def __init__(self, cores: int = 2, memory: str = "1g", work_dir: Path | None = None):
        self.cores = cores
        self.memory = memory
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="queuectl-spark-"))
        self.port = free_port()
        self.ui_port = free_port()
        self.worker_ui_port = free_port()
        self.processes: list[subprocess.Popen] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def spark_home(self) -> Path:
        return Path(require_pyspark().__file__).parent

    def start(self) -> "StandaloneCluster":
        spark_class = self.spark_home() / "bin" / "spark-class"
        env = {**os.environ, "SPARK_HOME": str(self.spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_NO_DAEMONIZE": "1"}  # fmt: skip
        logs = self.work_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self._launch(
            [str(spark_class), "org.apache.spark.deploy.master.Master",
             "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port)],
            env, logs / "master.log",
        )  # fmt: skip
        self._wait(lambda state: True, "master")
        self._launch(
            [str(spark_class), "org.apache.spark.deploy.worker.Worker", self.master_url,
             "--host", "127.0.0.1", "--cores", str(self.cores), "--memory", self.memory,
             "--webui-port", str(self.worker_ui_port), "--work-dir", str(self.work_dir / "work")],
            env, logs / "worker.log",
        )  # fmt: skip
        self._wait(lambda state: any(w.get("state") == "ALIVE" for w in state.get("workers", [])), "worker")
        return self

    def _launch(self, argv: list[str], env: dict, log: Path) -> None:
        with open(log, "ab") as fh:
            # Own process group, so stop() ends the JVM and nothing else.
            self.processes.append(subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True))

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as resp:
            return json.load(resp)

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for proc in self.processes:
                if proc.poll() is not None:
                    raise QueuectlError(f"Spark {what} exited with {proc.returncode}: see {self.work_dir}/logs")
            try:
                if ready(self.state()):
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise QueuectlError(f"Spark {what} not ready after {START_TIMEOUT_S} s: see {self.work_dir}/logs")

    def stop(self) -> None:
        for proc in reversed(self.processes):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self.processes.clear()

    def __enter__(self) -> "StandaloneCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    with StandaloneCluster() as cluster:
        print(cluster.master_url, flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
