"""`queuectl bench`: queue throughput and latency beside the server's own ceilings.

run_bench(BenchOptions(...)) runs one scenario and returns a JSON-ready document described
by result_schema.json; render() prints it as rich tables. Kinds plug in through
queuectl.bench.drivers.register(), scenarios through queuectl.bench.core.scenario().
"""

from queuectl.bench import scenarios as _scenarios  # noqa: F401  (registers the built-in scenarios)
from queuectl.bench.core import BenchOptions, run_bench
from queuectl.bench.report import render

__all__ = ["BenchOptions", "render", "run_bench"]
