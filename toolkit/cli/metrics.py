"""`queuectl metrics serve`: the health facts on an HTTP endpoint for Prometheus to scrape.

Each scrape gathers a fresh report (queuectl.metrics over queuectl.health: the facts
`queuectl health` shows), bounded by --timeout: a slow or lost database answers the scrape
with queuectl_up 0 and one line on stderr, never a hung scraper or a traceback.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Annotated, Optional

import typer

from queuectl.cli.options import SchemaOption, UrlOption, fail, make_console, print_error
from queuectl.names import DEFAULT_SCHEMA

app = typer.Typer(name="metrics", help="Expose the health facts as Prometheus / OpenMetrics metrics.",
                  no_args_is_help=True)

DEFAULT_PORT = 9643  # not one of the well-known exporters' ports (postgres_exporter has 9187)


@app.command()
def serve(
    port: Annotated[int, typer.Option("--port", help="TCP port to listen on (0: any free port, printed at start).")] = DEFAULT_PORT,
    host: Annotated[str, typer.Option("--host", help="Address to listen on. The default is loopback only; the "
                                      "metrics name queues, roles and applications and need no password to read, "
                                      "so expose them wider only behind a firewall or proxy.")] = "127.0.0.1",
    timeout: Annotated[float, typer.Option("--timeout", metavar="SECONDS", help="Longest a scrape waits for the "
                                           "facts (each statement is bounded by it too); slower answers "
                                           "queuectl_up 0. Keep it below the scraper's scrape_timeout.")] = 5.0,
    config: Annotated[Optional[str], typer.Option("--config", help="TOML file with a \\[health] table: thresholds "
                                                  "(they set queuectl_health_status) and options, as for `queuectl "
                                                  "health --config`.", show_default=False)] = None,
    url: UrlOption = None,
    schema: SchemaOption = DEFAULT_SCHEMA,
) -> None:
    """Serve the health facts at http://HOST:PORT/metrics until Ctrl-C or SIGTERM.

    Every scrape gathers a fresh report: queue depths, oldest ready age, rates, dead rows, index bloat, cleanup blockers, job runs and the health verdict (docs/operations.md lists every metric). The format follows the scraper's Accept header: OpenMetrics or the Prometheus text format.
    """  # noqa: E501 (one line per paragraph: --help wraps them itself)
    from dataclasses import replace

    from queuectl.engine import make_engine
    from queuectl.engine.urls import error_text, mask_url
    from queuectl.health import HealthOptions, health_report, load_config
    from queuectl.metrics import HealthCollector, is_loopback, start_server
    from queuectl.names import validate_schema_name

    if not 0 <= port <= 65535:
        fail(f"--port must be from 0 to 65535, got {port}")
    if not 0.1 <= timeout <= 300:
        fail(f"--timeout must be from 0.1 to 300 seconds, got {timeout:g}")
    validate_schema_name(schema)
    options = load_config(config) if config else HealthOptions()
    millis = int(timeout * 1000)
    options = replace(options, statement_timeout_ms=millis, lock_timeout_ms=min(options.lock_timeout_ms, millis))
    engine = make_engine(url)
    err = make_console(stderr=True)

    def on_error(exc: BaseException) -> None:
        print_error(f"scrape answered queuectl_up 0: {error_text(exc, engine)}", prefix="warning", console=err)

    collector = HealthCollector(lambda: health_report(engine, None, schema, options), schema, timeout, on_error)
    try:
        server = start_server(collector, host, port)
    except OSError as exc:
        fail(f"cannot listen on {host} port {port}: {exc.strerror or exc}")
    if not is_loopback(host):
        print_error(f"listening on {host}, beyond this machine: anyone who reaches the port reads queue, role and "
                    "application names (no authentication)", prefix="warning", console=err)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    sys.stdout.write(f"serving {server.url} for {mask_url(engine.url)} (schema {schema}); Ctrl-C or SIGTERM stops\n")
    sys.stdout.flush()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.close()
        engine.dispose()
    sys.stdout.write("stopped\n")
    sys.stdout.flush()
