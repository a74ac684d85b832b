"""The SQL ceilings: pgbench driving bench.sql scripts, without Python in the loop.

pgbench gets its connection from the database URL: host (a socket folder or a name),
port, user and database as arguments, the password only through PGPASSWORD in its
environment, so no secret appears in the commands the bench records and prints.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import make_url

from queuectl.errors import UsageError

PGBENCH_ENV = "QUEUECTL_PGBENCH"
# Linux limits one argv string to 128 KiB (MAX_ARG_STRLEN); -D name=value must fit.
MAX_VARIABLE_BYTES = 120_000
_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)
_FAILED = re.compile(r"^number of failed transactions: (\d+)", re.MULTILINE)
_PROCESSED = re.compile(r"^number of transactions actually processed: (\d+)", re.MULTILINE)


class PgbenchUnavailable(Exception):
    """pgbench cannot run this measurement; the message says why (shown in the report)."""


def find_pgbench() -> str | None:
    """$QUEUECTL_PGBENCH, else the newest Debian PostgreSQL's, else PATH."""
    given = os.environ.get(PGBENCH_ENV)
    if given:
        return given if Path(given).is_file() else None
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        for major in sorted((p.name for p in root.iterdir() if p.name.isdigit()), key=int, reverse=True):
            candidate = root / major / "bin" / "pgbench"
            if candidate.is_file():
                return str(candidate)
    return shutil.which("pgbench")


def pgbench_version(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


@dataclass(frozen=True)
class Connection:
    """libpq connection arguments for pgbench; the password stays in `env` only."""

    args: tuple[str, ...]
    env: dict[str, str] = field(repr=False)

    @classmethod
    def from_url(cls, url: str) -> "Connection":
        parsed = make_url(url)
        if parsed.get_backend_name() not in ("postgresql", "postgres"):
            raise UsageError("pgbench ceilings need a PostgreSQL URL")
        host = parsed.host or parsed.query.get("host")
        port = parsed.port or parsed.query.get("port")
        if isinstance(host, tuple):
            host = host[0]
        if isinstance(port, tuple):
            port = port[0]
        args: list[str] = []
        if host:
            args += ["-h", str(host)]
        if port:
            args += ["-p", str(port)]
        if parsed.username:
            args += ["-U", parsed.username]
        env = {}
        if parsed.password:
            env["PGPASSWORD"] = str(parsed.password)
        sslmode = parsed.query.get("sslmode")
        if sslmode:
            env["PGSSLMODE"] = str(sslmode if isinstance(sslmode, str) else sslmode[0])
        return cls(tuple(args), env)

    def database(self, url: str) -> str:
        return make_url(url).database or ""


@dataclass
class Run:
    """One pgbench invocation's outcome."""

    command: list[str]
    tps: float
    transactions: int
    failed: int
    seconds: float


class Pgbench:
    """Writes scripts into a private temporary folder and runs pgbench over them."""

    def __init__(self, path: str, url: str) -> None:
        self.path = path
        self.url = url
        self.conn = Connection.from_url(url)
        self.dbname = self.conn.database(url)
        self.folder = Path(tempfile.mkdtemp(prefix="queuectl-bench-"))

    def script(self, name: str, text: str) -> Path:
        path = self.folder / f"{name}.sql"
        path.write_text(text)
        return path

    def command(
        self,
        scripts: list[Path],
        *,
        clients: int,
        seconds: int,
        variables: dict[str, str] | None = None,
    ) -> list[str]:
        argv = [self.path, "-n", "-M", "prepared", "-c", str(clients), "-j", str(clients), "-T", str(seconds)]
        for name, value in sorted((variables or {}).items()):
            item = f"{name}={value}"
            if len(item.encode()) > MAX_VARIABLE_BYTES:
                raise PgbenchUnavailable(
                    f"pgbench variable {name} would be {len(item.encode()):,} bytes (batch x payload too "
                    f"large for one argument; the limit is {MAX_VARIABLE_BYTES:,})"
                )
            argv += ["-D", item]
        for path in scripts:
            argv += ["-f", str(path)]
        return [*argv, *self.conn.args, self.dbname]

    def start(self, argv: list[str]) -> subprocess.Popen[str]:
        env = {**os.environ, **self.conn.env}
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd="/")

    def finish(self, proc: subprocess.Popen[str], argv: list[str], started: float, timeout: float) -> Run:
        try:
            out, errout = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise PgbenchUnavailable(f"pgbench did not finish within {timeout:.0f} s")
        elapsed = time.monotonic() - started
        tps = _TPS.search(out)
        if proc.returncode != 0 or tps is None:
            reason = (errout or out).strip().splitlines()
            raise PgbenchUnavailable(f"pgbench failed (exit {proc.returncode}): {reason[-1] if reason else 'no output'}")
        processed = _PROCESSED.search(out)
        failed = _FAILED.search(out)
        return Run(
            command=self.shown(argv),
            tps=float(tps.group(1)),
            transactions=int(processed.group(1)) if processed else 0,
            failed=int(failed.group(1)) if failed else 0,
            seconds=elapsed,
        )

    def run(self, scripts: list[Path], *, clients: int, seconds: int, variables: dict[str, str] | None = None) -> Run:
        argv = self.command(scripts, clients=clients, seconds=seconds, variables=variables)
        started = time.monotonic()
        return self.finish(self.start(argv), argv, started, timeout=seconds * 3 + 60)

    def shown(self, argv: list[str]) -> list[str]:
        """The command as recorded: long -D values shortened (they are random payload bytes)."""
        shown = []
        for item in argv:
            if len(item) > 120:
                item = f"{item[:60]}...<{len(item):,} chars>"
            shown.append(item)
        return shown

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
