"""The embedded default PostgreSQL server: started on first use, reused afterwards.

queuectl needs a database before a user has configured one. Rather than failing, it keeps
a private PostgreSQL cluster under a home directory and starts it on demand:

    <home>/pgdata/       the cluster (0700, owned by the server user)
    <home>/run/          the unix socket directory (0700, owned by the server user)
    <home>/log/          server.log written by pg_ctl (0700, owned by the server user)
    <home>/server.json   port, server user, password, bindir, version (0600, invoking user)
    <home>/lock          flock serialising init/start/stop across processes

Local connections go over the socket with trust auth; that is safe because only the server
user (and root) can enter the 0700 socket directory. TCP listens on 127.0.0.1 only and
needs the generated password, for clients that cannot use a socket (JDBC, Spark).

PostgreSQL refuses to run as root, so as root the server runs as ``postgres`` (or a
created ``queuectl`` system user) through ``runuser``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import quote

from queuectl.errors import QueuectlError
from queuectl.names import quote_ident

log = logging.getLogger(__name__)

HOME_ENV = "QUEUECTL_HOME"
BIN_ENV = "QUEUECTL_PG_BIN"
ROLE = "queuectl"
DATABASE = "queuectl"
START_TIMEOUT_S = 60
LOG_TAIL_LINES = 15
SERVER_BINARIES = ("pg_ctl", "initdb", "postgres")
STOP_MODES = ("smart", "fast", "immediate")
# sun_path is 108 bytes on Linux including the terminating NUL.
MAX_SOCKET_PATH = 107
CONF_FILE = "queuectl.conf"


class EmbeddedServerError(QueuectlError):
    """The embedded server cannot be set up or started; the message says what to do."""


@dataclass
class ServerState:
    """What server.json remembers between runs; `password` never leaves this module unmasked
    except through tcp_url()."""

    port: int
    server_user: str
    password: str
    bindir: str
    version: str
    database_ready: bool = False


def default_home() -> Path:
    """$QUEUECTL_HOME, else a system dir for root (the server user cannot enter /root),
    else the XDG data dir."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser().absolute()
    if os.geteuid() == 0:
        return Path("/var/lib/queuectl")
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home).absolute() / "queuectl"


def find_bindir() -> Path:
    """Where pg_ctl/initdb/postgres live: $QUEUECTL_PG_BIN, Debian's newest, or PATH."""
    if os.environ.get(BIN_ENV):
        return _checked_bindir(Path(os.environ[BIN_ENV]))
    debian = _newest_debian_bindir()
    if debian is not None:
        return debian
    on_path = shutil.which("pg_ctl")
    if on_path:
        return _checked_bindir(Path(on_path).resolve().parent)
    raise EmbeddedServerError(
        "no PostgreSQL server binaries found: install Debian's postgresql "
        f"(apt-get install postgresql postgresql-contrib) or set {BIN_ENV}"
    )


def _has_server_binaries(bindir: Path) -> bool:
    return all((bindir / name).is_file() for name in SERVER_BINARIES)


def _checked_bindir(bindir: Path) -> Path:
    """An explicit or PATH-derived bindir must be complete; say which one is not."""
    if not _has_server_binaries(bindir):
        raise EmbeddedServerError(
            f"{bindir} lacks one of {', '.join(SERVER_BINARIES)}: point {BIN_ENV} at a "
            "PostgreSQL server bin directory"
        )
    return bindir


def _newest_debian_bindir() -> Path | None:
    """Debian installs majors side by side under /usr/lib/postgresql/<N>/bin."""
    root = Path("/usr/lib/postgresql")
    if not root.is_dir():
        return None
    majors = sorted((int(p.name) for p in root.iterdir() if p.name.isdigit()), reverse=True)
    for major in majors:
        bindir = root / str(major) / "bin"
        if _has_server_binaries(bindir):
            return bindir
    return None


def server_version(bindir: Path) -> str:
    """`postgres --version` works even as root; e.g. '15.14'."""
    out = subprocess.run(
        [str(bindir / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"\(PostgreSQL\)\s+(\S+)", out)
    if not match:
        raise EmbeddedServerError(f"cannot parse server version from {out.strip()!r}")
    return match.group(1)


def pkglibdir(bindir: Path) -> Path:
    """Where extension libraries live, asked of the same installation as the server."""
    pg_config = bindir / "pg_config"
    if pg_config.is_file():
        result = subprocess.run([str(pg_config), "--pkglibdir"], capture_output=True, text=True)
        if result.returncode == 0 and result.stdout.strip():
            return Path(result.stdout.strip())
    return bindir.parent / "lib"


def server_user() -> str:
    """Who runs the server: PostgreSQL refuses root, so root delegates to a system user."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name
    for name in ("postgres", ROLE):
        if _user_exists(name):
            return name
    log.info("creating system user %s to run the embedded PostgreSQL server", ROLE)
    _run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", ROLE])
    return ROLE


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def free_port() -> int:
    """A port nobody listens on right now; the kernel picks it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _conf_str(value: str) -> str:
    """A postgresql.conf string literal."""
    return "'" + value.replace("'", "''") + "'"


def _run(args: list[str], *, detach: bool = False) -> subprocess.CompletedProcess[str]:
    """Run a command from / (the server user may not enter our cwd), capturing output.

    detach puts it in its own session so a later Ctrl-C in the caller's terminal does not
    reach the postmaster it starts.
    """
    result = subprocess.run(
        args, cwd="/", capture_output=True, text=True, start_new_session=detach
    )
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        raise EmbeddedServerError(f"{Path(args[0]).name} failed: {output or result.returncode}")
    return result


class EmbeddedServer:
    """A private PostgreSQL cluster under `home`, safe to drive from many processes."""

    def __init__(self, home: Path | None = None):
        self.home = Path(home).absolute() if home is not None else default_home()
        self.pgdata = self.home / "pgdata"
        self.run_dir = self.home / "run"
        self.log_dir = self.home / "log"
        self.log_file = self.log_dir / "server.log"
        self.state_file = self.home / "server.json"
        self.lock_file = self.home / "lock"

    # -- public API ------------------------------------------------------------------

    def ensure_running(self) -> str:
        """Initialise and start as needed, then return url(); serialised by the home lock."""
        with self._locked():
            state = self._state_or_init()
            if not self.is_running():
                self._start(state)
            self._ensure_database(state)
        return self.url()

    def start(self) -> None:
        """Start the server (initialising it first if there is none); no-op if running."""
        self.ensure_running()

    def stop(self) -> None:
        """Fast shutdown; nothing to do when not initialised or not running."""
        with self._locked():
            state = self._load_state()
            if state is None or not self.is_running():
                return
            log.info("stopping embedded PostgreSQL in %s", self.home)
            self._pg_ctl(state, ["-m", "fast", "-w", "-t", str(START_TIMEOUT_S), "stop"])

    def restart(self, mode: str = "fast") -> None:
        """`pg_ctl restart -m <mode>`: drops every connection, keeps the data."""
        if mode not in STOP_MODES:
            raise EmbeddedServerError(f"restart mode must be one of {', '.join(STOP_MODES)}")
        with self._locked():
            state = self._state()
            log.info("restarting embedded PostgreSQL in %s (mode %s)", self.home, mode)
            args = ["-l", str(self.log_file), "-m", mode, "-w", "-t", str(START_TIMEOUT_S)]
            self._pg_ctl_or_log_tail(state, args + ["restart"])

    def is_running(self) -> bool:
        return self._postmaster_pid() is not None

    def status(self) -> dict:
        """A password-free summary for `queuectl server status` and tests."""
        state = self._load_state()
        pid = self._postmaster_pid()
        return {
            "running": pid is not None,
            "home": str(self.home),
            "pgdata": str(self.pgdata),
            "port": state.port if state else None,
            "server_user": state.server_user if state else None,
            "version": state.version if state else None,
            "url": self.url() if state else None,
            "pid": pid,
        }

    def url(self, database: str = DATABASE) -> str:
        """SQLAlchemy URL over the unix socket; trust auth there, so no password in it."""
        host = quote(str(self.run_dir), safe="/")
        return f"postgresql+psycopg://{ROLE}@/{database}?host={host}&port={self._state().port}"

    def tcp_url(self, database: str = DATABASE) -> str:
        """URL over 127.0.0.1 with the password, for clients without socket support.

        It contains the secret: callers must mask it before showing it anywhere.
        """
        state = self._state()
        return f"postgresql+psycopg://{ROLE}:{state.password}@127.0.0.1:{state.port}/{database}"

    def psql_args(self, database: str = DATABASE) -> list[str]:
        """argv for an interactive psql on the socket (the matching psql when we have one)."""
        state = self._state()
        psql = Path(state.bindir) / "psql"
        return [
            str(psql) if psql.is_file() else "psql",
            "-h", str(self.run_dir),
            "-p", str(state.port),
            "-U", ROLE,
            "-d", database,
        ]  # fmt: skip

    # -- state -----------------------------------------------------------------------

    def _load_state(self) -> ServerState | None:
        try:
            return ServerState(**json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return None

    def _state(self) -> ServerState:
        state = self._load_state()
        if state is None:
            raise EmbeddedServerError(
                f"no embedded server in {self.home} yet: run ensure_running() first"
            )
        return state

    def _save_state(self, state: ServerState) -> None:
        """Atomic replace, created 0600 from the start: the file holds the password."""
        tmp = self.state_file.with_name(self.state_file.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(state), fh, indent=2)
        os.replace(tmp, self.state_file)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive flock on <home>/lock so concurrent first uses initialise only once."""
        self._make_home()
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _make_home(self) -> None:
        """Create home if missing; others get search (x) only so the server user can
        reach its own subdirectories. Parents keep whatever mode they have."""
        if self.home.is_dir():
            return
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o711 if os.geteuid() == 0 else 0o700)

    # -- initialisation --------------------------------------------------------------

    def _state_or_init(self) -> ServerState:
        """The saved state, initialising a fresh cluster when there is none."""
        state = self._load_state()
        has_cluster = (self.pgdata / "PG_VERSION").is_file()
        if state is not None and has_cluster:
            return state
        if has_cluster:
            raise EmbeddedServerError(
                f"{self.pgdata} holds a cluster but {self.state_file} is missing: "
                f"remove {self.home} to start afresh (this deletes its data)"
            )
        return self._init()

    def _init(self) -> ServerState:
        log.info("initialising embedded PostgreSQL in %s", self.home)
        bindir = find_bindir()
        state = ServerState(
            port=free_port(),
            server_user=server_user(),
            password=secrets.token_urlsafe(24),
            bindir=str(bindir),
            version=server_version(bindir),
        )
        self._check_socket_path(state.port)
        for directory in (self.pgdata, self.run_dir, self.log_dir):
            self._make_server_dir(directory, state.server_user)
        self._check_server_can_reach(state)
        self._initdb(state)
        self._write_conf(state)
        self._save_state(state)
        return state

    def _check_socket_path(self, port: int) -> None:
        """Unix socket paths are limited to 107 bytes; fail early with a remedy."""
        sock = self.run_dir / f".s.PGSQL.{port}"
        if len(os.fsencode(sock)) > MAX_SOCKET_PATH:
            raise EmbeddedServerError(
                f"socket path {sock} is longer than {MAX_SOCKET_PATH} bytes: "
                f"set {HOME_ENV} to a shorter directory"
            )

    def _make_server_dir(self, directory: Path, user: str) -> None:
        directory.mkdir(exist_ok=True)
        directory.chmod(0o700)
        self._chown(directory, user)

    def _chown(self, path: Path, user: str) -> None:
        if os.geteuid() == 0:
            shutil.chown(path, user=user, group=pwd.getpwnam(user).pw_gid)

    def _check_server_can_reach(self, state: ServerState) -> None:
        """As root, a 0700 parent (e.g. under /root) would make initdb fail obscurely."""
        if os.geteuid() != 0:
            return
        probe = subprocess.run(
            self._as_server(state, ["test", "-w", str(self.run_dir)]), cwd="/"
        )
        if probe.returncode != 0:
            raise EmbeddedServerError(
                f"server user {state.server_user} cannot reach {self.home}: every parent "
                f"directory must be searchable by it; set {HOME_ENV} elsewhere (e.g. under /var/lib)"
            )

    def _initdb(self, state: ServerState) -> None:
        """initdb with the generated password in a server-readable file, removed after."""
        pwfile = self.run_dir / "initdb.pw"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(state.password + "\n")
        self._chown(pwfile, state.server_user)
        try:
            _run(
                self._as_server(
                    state,
                    [
                        str(Path(state.bindir) / "initdb"),
                        "-D", str(self.pgdata),
                        "-U", ROLE,
                        "-E", "UTF8",
                        "--locale=C",
                        "--auth-local=trust",
                        "--auth-host=scram-sha-256",
                        f"--pwfile={pwfile}",
                    ],  # fmt: skip
                )
            )
        finally:
            pwfile.unlink(missing_ok=True)

    def _write_conf(self, state: ServerState) -> None:
        """Our settings live in an include file so a port change rewrites only that file."""
        conf = self.pgdata / "postgresql.conf"
        with conf.open("a") as fh:
            fh.write(f"\n# added by queuectl\ninclude = {_conf_str(CONF_FILE)}\n")
        self._write_include(state)

    def _write_include(self, state: ServerState) -> None:
        lines = [
            "listen_addresses = '127.0.0.1'",
            f"port = {state.port}",
            f"unix_socket_directories = {_conf_str(str(self.run_dir))}",
            "unix_socket_permissions = 0700",
            "max_connections = 200",
            "shared_buffers = 256MB",
            "logging_collector = off",
        ]
        if (pkglibdir(Path(state.bindir)) / "pg_stat_statements.so").is_file():
            lines.append("shared_preload_libraries = 'pg_stat_statements'")
        path = self.pgdata / CONF_FILE
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)
        self._chown(path, state.server_user)

    # -- running ---------------------------------------------------------------------

    def _start(self, state: ServerState) -> None:
        self._move_port_if_taken(state)
        log.info("starting embedded PostgreSQL in %s on port %d", self.home, state.port)
        args = ["-l", str(self.log_file), "-w", "-t", str(START_TIMEOUT_S), "start"]
        self._pg_ctl_or_log_tail(state, args)

    def _move_port_if_taken(self, state: ServerState) -> None:
        """The port was free at init; if another program took it since, pick a new one."""
        if port_is_free(state.port):
            return
        old = state.port
        state.port = free_port()
        log.info("port %d is taken; moving the embedded server to port %d", old, state.port)
        self._write_include(state)
        self._save_state(state)

    def _pg_ctl_or_log_tail(self, state: ServerState, args: list[str]) -> None:
        """pg_ctl says little about why a start failed; the server log says why."""
        try:
            self._pg_ctl(state, args)
        except EmbeddedServerError as exc:
            raise EmbeddedServerError(f"{exc}\nlast lines of {self.log_file}:\n{self._log_tail()}")

    def _pg_ctl(self, state: ServerState, args: list[str]) -> None:
        pg_ctl = str(Path(state.bindir) / "pg_ctl")
        _run(self._as_server(state, [pg_ctl, "-D", str(self.pgdata), *args]), detach=True)

    def _log_tail(self) -> str:
        try:
            lines = self.log_file.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no server log)"
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def _as_server(self, state: ServerState, argv: list[str]) -> list[str]:
        """Prefix argv so it runs as the server user (only needed, and allowed, as root)."""
        if os.geteuid() == 0:
            return ["runuser", "-u", state.server_user, "--", *argv]
        return argv

    def _postmaster_pid(self) -> int | None:
        """The live postmaster's pid from postmaster.pid, or None (absent or stale file)."""
        try:
            first_line = (self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0]
            pid = int(first_line.strip())
        except (FileNotFoundError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid  # alive, owned by someone else
        return pid

    def _ensure_database(self, state: ServerState) -> None:
        """Create the queuectl database once, over the socket as the bootstrap superuser."""
        if state.database_ready:
            return
        import psycopg

        with psycopg.connect(
            host=str(self.run_dir), port=state.port, user=ROLE, dbname="postgres",
            autocommit=True,
        ) as conn:  # fmt: skip
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
            ).fetchone()
            if not exists:
                # identifiers cannot be bind parameters: constants, quoted like every name
                conn.execute(f"CREATE DATABASE {quote_ident(DATABASE)} OWNER {quote_ident(ROLE)}")
        state.database_ready = True
        self._save_state(state)


def ensure_default_url() -> str:
    """The URL of the default embedded server, starting it on first use."""
    return EmbeddedServer().ensure_running()
