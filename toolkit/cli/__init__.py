"""The `queuectl` command line: thin Typer commands over library functions.

Commands parse, call one library function and render its result. Errors a user can fix
are one line on stderr with exit code 2; database URLs are only ever shown masked.

One module per command group, each with a Typer of its own; this module adds them to the
app and runs it. The shared options and consoles live in queuectl.cli.options, and no
command module imports this one.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from queuectl.cli import bench, db, grant, health, jobs, kinds, metrics, options, pipeline, queues, worker
from queuectl.engine.urls import PASSWORD_FILE_ENV, URL_ENV, error_text
from queuectl.errors import QueuectlError

app = typer.Typer(
    name="queuectl",
    help="Work queues as tables in the database you already run: install, use, and keep them healthy.",
    cls=options.HelpGroup,
    no_args_is_help=True,
    add_completion=True,  # Typer's --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_show_locals=False,  # locals may hold connection strings
)


def _print_version(asked: bool) -> None:
    if asked:
        from queuectl import __version__  # the package's own module only: no library is loaded

        options.out.print(f"queuectl {__version__}", highlight=False)
        raise typer.Exit(0)


@app.callback()
def _app_options(
    version: Annotated[bool, typer.Option("--version", help="Print queuectl's version and exit.", is_eager=True,
                                          callback=_print_version)] = False,
) -> None:
    pass  # the options of `queuectl` itself, before any command


# In the order `queuectl --help` lists them. A group's Typer without a name adds its
# commands at the top level (install, health, archive...); a named one is a subcommand (db, jobs...).
for group in (queues.app, health.app, jobs.app, grant.app, worker.app, kinds.app, bench.app,
              db.app, jobs.jobs_app, jobs.scheduler_app, pipeline.app, metrics.app):
    app.add_typer(group)


def _click_exceptions() -> tuple[type[BaseException], ...]:
    """Parser errors (unknown option, a value of the wrong type): click's, and those of the
    copy of click that Typer vendors since 0.17 (typer._click), which are not click's."""
    found: list[type[BaseException]] = []
    for module, name in (("click", "ClickException"), ("typer._click.exceptions", "ClickException")):
        try:
            found.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def main() -> None:
    """Entry point: run the app, turning known errors into one line and exit code 2."""
    if options.hide_passwords_in_argv() is False:
        options.print_error(f"the password in this command line stays visible to other users (ps): give it in "
                            f"${URL_ENV}, ${PASSWORD_FILE_ENV} or libpq's PGPASSFILE instead", prefix="warning")
    try:
        code = app(prog_name="queuectl", standalone_mode=False)  # also as `python -m queuectl.cli`: usage, completion
    except QueuectlError as exc:
        options.print_error(str(exc))
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        options.err.print("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # click usage errors come here in non-standalone mode
        if isinstance(exc, options.database_errors()):
            options.print_error(error_text(exc), prefix="database error")
            sys.exit(1)
        if isinstance(exc, _click_exceptions()):
            exc.show()
            sys.exit(exc.exit_code)
        raise
    sys.exit(code if isinstance(code, int) else 0)
