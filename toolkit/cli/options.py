"""What every command shares: its consoles, its options (--url, --schema, --json, the queue
name), the one-line error, and keeping passwords out of sight.

Whatever a command prints may come from the server or from a user: application names, query
texts, role, database and object names, error messages, job errors. The consoles made here
show all of it as data: markup is off (a `[/x]` is printed as written, never parsed, so it
can neither restyle the output nor crash it with a MarkupError) and control characters are
shown as `?` (an ESC in a role name cannot move a terminal's cursor). Styles come from
`Text` objects and `style=` arguments only.

This module imports no other module of queuectl.cli, so every command module can import it.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import logging
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Optional

import typer
from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Column, Table
from rich.text import Text
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from queuectl.engine.urls import MASK, PASSWORD_FILE_ENV, URL_ENV, hide_secrets

# C0 and C1 control characters but newline and tab: a terminal would act on them.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class _DataConsole(Console):
    """A rich Console that prints every text as data (see the module docstring)."""

    def render_str(self, text: str, **options: Any) -> Text:
        """Every str printed or put in a table passes here, before it is measured."""
        return super().render_str(_CONTROL.sub("?", text), **{**options, "markup": False, "emoji": False})

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        """Text objects do not pass render_str: their control characters are caught here."""
        for segment in super().render(renderable, options):
            if segment.control is None and _CONTROL.search(segment.text):
                segment = Segment(_CONTROL.sub("?", segment.text), segment.style)
            yield segment


def make_console(*, stderr: bool = False, **options: object) -> Console:
    """The console every command prints through: markup and emoji codes off, control
    characters shown as '?'. Other rich Console options pass through."""
    return _DataConsole(stderr=stderr, markup=False, emoji=False, **options)


out = make_console()
err = make_console(stderr=True)


class DataFormatter(logging.Formatter):
    """Log lines of long-running commands (worker, scheduler, archive --continuous): the texts
    in them (handler errors, server messages) with control characters shown as '?'."""

    def format(self, record: logging.LogRecord) -> str:
        return _CONTROL.sub("?", super().format(record))


def print_fact(text: str) -> None:
    """A one-line result on stdout: whole on one line in a pipe or a file (log readers and
    scripts read lines; a path or a list must not break), wrapped at the width on a terminal."""
    out.print(text, highlight=False, soft_wrap=not out.is_terminal)


def print_error(message: str, prefix: str = "error", console: Console | None = None) -> None:
    """One line, `<prefix>: <message>`, on stderr (or `console`); the message printed as it is."""
    line = Text.assemble((f"{prefix}:", "bold red"), " ", message)
    (console or err).print(line, highlight=False, soft_wrap=True)


def make_table(columns: Iterable[str], *, title: str | None = None, right: Iterable[int] = (),
               wrap: Mapping[int, int] | None = None, plain: bool = False) -> Table:
    """A table of queuectl's look: a rule under the header, no frame, columns two spaces apart,
    the columns numbered in `right` right-aligned. Cells stay whole (names, numbers), but in the
    columns `wrap` maps to their narrowest readable width (a time may put its date over its
    hour, a sentence needs room for a few words a line), which wrap between words. Print it
    through Fitted, which keeps to that at any width."""
    right, wrap = set(right), dict(wrap or {})
    table = Table(title=title, title_justify="left", box=None if plain else box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, padding=(0, 1) if plain else (0, 1, 0, 0), title_style="" if plain else "bold")
    for i, name in enumerate(columns):
        table.add_column(name, justify="right" if i in right else "left", no_wrap=i not in wrap, min_width=wrap.get(i))
    return table


class Fitted:
    """A table laid out for the width it is printed at, so no cell is cut short (an ellipsis)
    or split inside a word, at 80 columns as at 200.

    Cells of a no_wrap column stay on one line, other cells may wrap between words down to the
    column's min_width, headers too ("size before" over two lines). When the columns fit that
    way, each gets a width that holds it (rich alone shrinks the widest column first, and cuts a
    name where another column had room to spare); when they do not, each row is printed as a
    block of `column  value` lines, which no width cuts."""

    def __init__(self, table: Table):
        self.table = table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.layout(console, options.max_width)

    def layout(self, console: Console, width: int) -> RenderableType:
        table = self.table
        wide = console.options.update_width(1 << 16)
        least, most = [], []
        for column in table.columns:
            header = Measurement.get(console, wide, column.header)
            cells = [Measurement.get(console, wide, cell) for cell in column.cells]
            most.append(max([header.maximum, *(c.maximum for c in cells)]))
            readable = min(column.min_width or 0, most[-1])
            least.append(max([readable, header.minimum, *(c.maximum if column.no_wrap else c.minimum for c in cells)]))
        laid = copy.copy(table)
        laid.columns = [dataclasses.replace(column, min_width=None, no_wrap=False) for column in table.columns]
        room = width - (Measurement.get(console, wide, laid).maximum - sum(most))  # less padding and rules
        if sum(least) > room:
            return self._blocks()
        spare = room - sum(least)
        for i in sorted(range(len(least)), key=lambda i: most[i] - least[i]):  # unfold as many columns as can be
            laid.columns[i].width = least[i] + min(most[i] - least[i], spare)
            spare -= laid.columns[i].width - least[i]
        return laid

    def _blocks(self) -> RenderableType:
        table = self.table
        parts: list[RenderableType] = []
        if table.title:
            parts.append(Text(str(table.title), style=table.title_style or ""))
        cells = [list(column.cells) for column in table.columns]
        for row in range(table.row_count):
            block = Table.grid(Column(no_wrap=True), Column(), padding=(0, 2))
            for column, values in zip(table.columns, cells):
                block.add_row(Text(str(column.header), style="bold" if table.title_style else ""), values[row])
            parts.extend([block, Text("")] if row < table.row_count - 1 else [block])
        return Group(*parts)


def database_errors() -> tuple[type[BaseException], ...]:
    """SQLAlchemy's DBAPIError, when SQLAlchemy is loaded (commands load it only when they
    reach a database, and no database error is raised without it)."""
    found = getattr(sys.modules.get("sqlalchemy.exc"), "DBAPIError", None)
    return (found,) if found is not None else ()


def fail(message: str, code: int = 2) -> None:
    """Stop the command with one error line and `code` (2: the user can fix it)."""
    print_error(message)
    raise typer.Exit(code)


URL_HELP = (
    "Database URL (e.g. postgresql://user@host:5432/db). Default: $" + URL_ENV + ", else the embedded server. "
    "Keep the password out of it: a command line is visible to other users (ps) until queuectl hides it; "
    "give it in $" + URL_ENV + ", in a file named by $" + PASSWORD_FILE_ENV + " (its first line), or "
    "through libpq's PGPASSFILE (~/.pgpass) or PGPASSWORD."
)
UrlOption = Annotated[Optional[str], typer.Option("--url", help=URL_HELP, show_default=False)]
SchemaOption = Annotated[str, typer.Option("--schema", help="Schema holding the catalog and queue tables.")]
QueueArg = Annotated[str, typer.Argument(help="Queue name: lowercase letters, digits, _ (max 48).")]
# The maintenance commands' queue: its naming rules are install's.
JobQueueArg = Annotated[str, typer.Argument(help="Queue name.")]


def json_flag(help: str = "Print JSON.") -> Any:
    """The --json flag; each command's help says what its JSON holds."""
    return Annotated[bool, typer.Option("--json", help=help)]


JsonOption = json_flag()


# -- --help ----------------------------------------------------------------------------------------

# Since 0.27 Typer labels each parameter by its Python annotation (`<str>`, `<bool>`, `<float range>`)
# and puts a required argument's name in braces in the usage line (`install [OPTIONS] {name}`).
# queuectl's help keeps the convention of click and of most command lines: NAME in the usage
# (optional: [NAME]), a value option labelled by what it takes (TEXT, INTEGER, FLOAT or its
# choices), a flag by nothing.
_TYPE_LABELS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "bool": "BOOLEAN", "Path": "PATH"}


class _Argument(TyperArgument):
    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")


class _Option(TyperOption):
    def display_type_rich(self, ctx: Any) -> str | None:
        if self.metavar is not None:
            return self.metavar
        if self.is_flag or self.count:
            return None
        label = str(super().display_type_rich(ctx)).removeprefix("<").replace(">", "", 1)
        if "|" in label:
            return f"[{label}]"
        label = re.sub(r"^list\[(.*)\]| range", r"\1", label)
        return _TYPE_LABELS.get(label, label.upper())


def _plain_help(params: list[Any]) -> list[Any]:
    # Typer makes its parameters (and --help, the completion options) itself, of its own classes:
    # each becomes, in place, the subclass above that renders it (the same object, state and
    # parsing; only the help text differs).
    for param in params:
        if type(param) is TyperArgument:
            param.__class__ = _Argument
            param.metavar = param.metavar or param.name.upper()
        elif type(param) is TyperOption:
            param.__class__ = _Option
    return params


class _Command(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_help(super().get_params(ctx))  # its own, --help and Typer's completion options


class HelpGroup(TyperGroup):
    """The app's group: its commands, its groups' and its own show their parameters in --help
    and usage lines as the comment above says."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        groups: list[TyperGroup] = [self]
        while groups:
            for command in groups.pop().commands.values():
                if type(command) is TyperGroup:
                    command.__class__ = HelpGroup
                    groups.append(command)
                elif type(command) is TyperCommand:
                    command.__class__ = _Command

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_help(super().get_params(ctx))


# -- the process's own command line ---------------------------------------------------------------


def hide_passwords_in_argv() -> bool | None:
    """Overwrite the passwords in this process's command line (what `ps` and /proc/PID/cmdline
    show to every user of the machine) with ***, in place: Linux keeps the original argv in the
    process's memory, between the addresses /proc/self/stat names (arg_start, arg_end).

    Returns None when the command line holds no password, True when it was hidden, False when
    it could not be (no /proc: not Linux): the caller then says so. A command line is readable
    from the moment the process starts until this runs (under a second of imports)."""
    if not any(hide_secrets(arg) != arg for arg in sys.argv):
        return None
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5): arg_start, arg_end
        raw = ctypes.string_at(start, end - start)
    except (OSError, ValueError, IndexError):
        return False
    args = raw.rstrip(b"\0").split(b"\0")
    shown = [hide_secrets(arg.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape") for arg in args]
    text = b"\0".join(shown) + b"\0"
    if len(text) > len(raw):  # a password shorter than ***: the argument that held it goes whole
        text = b"\0".join(MASK.encode() if new != old else old for old, new in zip(args, shown)) + b"\0"
    ctypes.memmove(start, text.ljust(len(raw), b"\0"), len(raw))
    return True
