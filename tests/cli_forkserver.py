"""A fork server for the suite's `queuectl` commands (tests/conftest.py's run_cli uses it).

A command started as `python -m queuectl.cli ...` spends ~0.35 s of CPU importing SQLAlchemy,
psycopg, Typer, rich and Alembic before it does anything, and the suite runs several hundred
commands. This server imports those third-party libraries once, then forks one child per
command. The child is still a process of its own, as a user's command is: its own pid, argv,
environment (set in the C environment too, so libpq sees PGPASSFILE and the like), working
directory and sys.path[0], stdin/stdout/stderr (the caller's pipes or pseudo-terminal, passed
over a Unix socket), `__main__` run the way `python -m queuectl.cli` runs it (so multiprocessing's
spawn finds it), non-daemon threads and atexit handlers run at exit, and an exit status as
subprocess reports it (a signal as its negative number). queuectl's own modules are not
preloaded: each child imports them under its command's environment, as a new process does.
What a child cannot have is a different interpreter set-up, so run_cli starts a real process
whenever the command's environment differs in a variable read at interpreter start or at a
preloaded library's import (IMPORT_TIME_VARIABLES).

Usage: python cli_forkserver.py SOCKET_PATH. It prints "ready" once it listens and exits when
its stdin closes (its pytest worker is gone).
Protocol, one connection per command: the client sends one byte with its three descriptors
(SCM_RIGHTS), then a 4-byte big-endian length and a JSON request {"argv", "env", "cwd"}; the server
answers with a line "pid N", then, when the child has exited, a line "status N".
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import sys

PRELOAD = (
    "sqlalchemy", "sqlalchemy.dialects.postgresql", "sqlalchemy.dialects.postgresql.psycopg",
    "sqlalchemy.ext.asyncio", "psycopg", "psycopg.rows", "typer", "typer.main", "typer.core",
    "typer.rich_utils", "click", "rich.console", "rich.table", "rich.panel", "rich.text",
    "rich.markup", "rich.progress", "rich.traceback", "pydantic", "alembic.command",
    "alembic.config", "alembic.runtime.migration", "alembic.operations", "apscheduler",
    "prometheus_client", "typer._adapters", "typer._click.decorators", "pydantic.main",
    "pydantic.type_adapter", "pydantic.json_schema", "pydantic.fields", "pydantic.types",
    "annotated_types", "json", "decimal", "uuid", "ipaddress", "logging", "argparse", "hmac",
    "secrets", "rich._emoji_codes", "typer._click._textwrap", "pydantic.plugin._loader",
    "apscheduler.schedulers.background", "apscheduler.triggers.cron",
    "apscheduler.triggers.interval", "apscheduler.executors.pool", "multiprocessing.connection",
)

# Environment variables read when an interpreter starts or when a preloaded library is
# imported: a command whose environment differs from the server's in one of them runs in a
# new process (a prefix ends with "_" or names the variable itself).
IMPORT_TIME_VARIABLES = (
    "PYTHON", "TYPER_", "_TYPER_STANDARD_TRACEBACK", "_TYPER_FORCE_DISABLE_TERMINAL",
    "TERMINAL_WIDTH", "GITHUB_ACTIONS", "FORCE_COLOR", "PY_COLORS", "PSYCOPG_", "SQLALCHEMY_",
    "PYDANTIC_", "LANG", "LC_",
)


def import_time_environment(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_VARIABLES)}


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional extra not installed: its command imports it itself
            pass


def _standard_streams() -> None:
    """New sys.stdin/stdout/stderr over descriptors 0-2, made as interpreter start-up makes
    them (line-buffered on a terminal; unbuffered under PYTHONUNBUFFERED)."""
    import io

    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    encoding, errors = sys.stdout.encoding, sys.stdout.errors

    def writer(fd: int, errors: str, line_buffering: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w", closefd=False)
        binary = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(binary, encoding=encoding, errors=errors,  # type: ignore[arg-type]
                                line_buffering=line_buffering, write_through=unbuffered)

    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=encoding, errors=errors)
    sys.stdout = sys.__stdout__ = writer(1, errors, os.isatty(1))
    sys.stderr = sys.__stderr__ = writer(2, "backslashreplace", True)


def _run_command(argv: list[str]) -> int:
    """Run `python -m queuectl.cli ARGV` in this (forked) process; return its exit status."""
    import runpy
    import threading
    import traceback
    import types

    sys.modules["__main__"] = types.ModuleType("__main__")
    sys.argv = ["-m", *argv]  # runpy puts the module's path in sys.argv[0], as -m does
    try:
        runpy._run_module_as_main("queuectl.cli")  # type: ignore[attr-defined]
        code = 0
    except SystemExit as exit_:
        if exit_.code is None:
            code = 0
        elif isinstance(exit_.code, int):
            code = exit_.code
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, as at exit
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = 120
    return code


def _child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the command and exit with its status (never returns)."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = os.getcwd()  # -m puts the working directory first
        _standard_streams()
        code = _run_command(request["argv"])
    except BaseException:
        try:
            import traceback

            traceback.print_exc()
        finally:
            code = 1
    finally:
        os._exit(code & 0xFF if code >= 0 else 255)


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("client went away")
        data += chunk
    return data


def serve(path: str) -> None:
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    selector.register(sys.stdin, selectors.EVENT_READ, "parent")
    waiting: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.data == "parent":
                if not os.read(sys.stdin.fileno(), 4096):
                    for pid in waiting:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    return
            elif key.data == "child":
                os.read(wake_r, 4096)
                while waiting:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    conn = waiting.pop(pid, None)
                    if conn is not None:
                        try:
                            conn.sendall(f"status {os.waitstatus_to_exitcode(status)}\n".encode())
                        except OSError:
                            pass
                        conn.close()
            else:
                conn, _ = listener.accept()
                fds: list[int] = []
                try:
                    _, fds, _, _ = socket.recv_fds(conn, 1, 3)
                    (size,) = struct.unpack(">I", _recv_exact(conn, 4))
                    request = json.loads(_recv_exact(conn, size))
                except (OSError, EOFError, ValueError):
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    conn.close()
                    listener.close()
                    selector.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(wake_r)
                    os.close(wake_w)
                    _child(request, fds)
                for fd in fds:
                    os.close(fd)
                waiting[pid] = conn
                try:
                    conn.sendall(f"pid {pid}\n".encode())
                except OSError:  # its caller is gone: the child's status goes nowhere
                    pass


class ForkServer:
    """The client side: one server per test process, started on first use."""

    def __init__(self) -> None:
        import subprocess
        import tempfile

        self._dir = tempfile.mkdtemp(prefix="queuectl-cli-")
        self.path = os.path.join(self._dir, "forkserver.sock")
        self.environment = import_time_environment(dict(os.environ))
        self._process = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.path],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._process.stdout is not None
        if self._process.stdout.readline() != b"ready\n":
            raise RuntimeError("the CLI fork server did not start")

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a command with this environment can run as a fork of the server."""
        return self._process.poll() is None and import_time_environment(env) == self.environment

    def run(self, argv: list[str], env: dict[str, str], fds: tuple[int, int, int]) -> "Command":
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        body = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()
        socket.send_fds(conn, [b"c"], list(fds))
        conn.sendall(struct.pack(">I", len(body)) + body)
        return Command(conn)

    def close(self) -> None:
        import shutil

        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)


class Command:
    """A command the server forked: its pid, and its exit status once it has exited."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._buffer = b""
        line = self._line(None).split()
        if len(line) != 2 or line[0] != b"pid":
            raise RuntimeError("the CLI fork server did not start the command")
        self.pid = int(line[1])
        self.returncode: int | None = None

    def _line(self, timeout: float | None) -> bytes:
        self._conn.settimeout(timeout)
        while b"\n" not in self._buffer:
            chunk = self._conn.recv(4096)  # TimeoutError when the timeout passes
            if not chunk:
                raise RuntimeError("the CLI fork server went away")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def wait(self, timeout: float | None = None) -> int:
        """The exit status (a signal as its negative number); TimeoutError if still running."""
        if self.returncode is None:
            line = self._line(timeout).split()
            if len(line) != 2 or line[0] != b"status":
                raise RuntimeError(f"the CLI fork server lost command {self.pid}")
            self.returncode = int(line[1])
            self._conn.close()
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    serve(sys.argv[1])
