"""`queuectl db start|stop|status|url`: the embedded PostgreSQL server (queuectl.engine.embedded)."""

from __future__ import annotations

import json
import sys

import typer

from queuectl.cli.options import JsonOption, out
from queuectl.engine.urls import mask_url

app = typer.Typer(name="db", help="Manage the embedded PostgreSQL server used when no --url is given.", no_args_is_help=True)


@app.command("start")
def db_start() -> None:
    """Start the embedded server (initialising it on first use)."""
    from queuectl.engine.embedded import EmbeddedServer

    server = EmbeddedServer()
    server.ensure_running()
    out.print(f"embedded PostgreSQL running: {mask_url(server.url())}", soft_wrap=True)  # a URL never wraps


@app.command("stop")
def db_stop() -> None:
    """Stop the embedded server (fast shutdown: open transactions roll back)."""
    from queuectl.engine.embedded import EmbeddedServer

    EmbeddedServer().stop()
    out.print("embedded PostgreSQL stopped")


@app.command("status")
def db_status(as_json: JsonOption = False) -> None:
    """Show whether the embedded server runs, where, and its version. Exit 1 if stopped."""
    from queuectl.engine.embedded import EmbeddedServer

    status = EmbeddedServer().status()
    if as_json:
        sys.stdout.write(json.dumps(status, default=str) + "\n")
    else:
        for key, value in status.items():
            out.print(f"{key:12} {value}", highlight=False, soft_wrap=True)  # its url and data dir never wrap
    if not status.get("running"):
        raise typer.Exit(1)


@app.command("url")
def db_url() -> None:
    """Print the embedded server's URL, starting it if needed (a Unix-socket URL: no password in it)."""
    from queuectl.engine.embedded import EmbeddedServer

    sys.stdout.write(mask_url(EmbeddedServer().ensure_running()) + "\n")
