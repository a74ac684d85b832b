"""The embedded default server: started on first use, reused, managed by `queuectl db`.

These tests start their own clusters in private homes (never the suite's shared server or
a developer's own), so they cost a few initdb runs (~2 s each).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from conftest import run_cli, worker_processes
from queuectl.engine.embedded import EmbeddedServer, EmbeddedServerError, default_home
from queuectl.engine import make_engine


def new_home() -> Path:
    """A short path under /tmp (the socket path limit is 107 bytes) that the unprivileged
    server user can traverse when the tests run as root."""
    base = Path(tempfile.mkdtemp(prefix="qe-", dir="/tmp"))
    base.chmod(0o755)
    return base / "home"


@pytest.fixture
def home() -> Iterator[Path]:
    path = new_home()
    try:
        yield path
    finally:
        if (path / "server.json").exists():
            EmbeddedServer(path).stop()
        shutil.rmtree(path.parent, ignore_errors=True)


def scalar(url: str, sql: str):
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(sql)).scalar()
    finally:
        engine.dispose()


def start_and_report(home: str) -> str:
    """Body of a process racing others to start the same server."""
    return EmbeddedServer(Path(home)).ensure_running()


@pytest.mark.slow
def test_first_use_initialises_starts_and_serves_the_queuectl_database(home: Path):
    server = EmbeddedServer(home)
    assert not server.is_running()
    url = server.ensure_running()
    assert server.is_running()
    assert scalar(url, "SELECT current_database()") == "queuectl"
    # never as root: PostgreSQL refuses it, so root delegates to an unprivileged user
    owner = (home / "pgdata").stat().st_uid
    assert owner != 0 or os.geteuid() != 0
    assert scalar(url, "SELECT current_user") == "queuectl"


@pytest.mark.slow
def test_second_use_reuses_the_running_server_and_keeps_data(home: Path):
    server = EmbeddedServer(home)
    url = server.ensure_running()
    pid = server.status()["pid"]
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)"))
    engine.dispose()

    assert EmbeddedServer(home).ensure_running() == url
    assert EmbeddedServer(home).status()["pid"] == pid  # same postmaster, not a new one

    server.stop()
    assert not server.is_running()
    assert server.ensure_running() == url  # restarted on the same port
    assert scalar(url, "SELECT v FROM kept") == 42


@pytest.mark.slow
def test_concurrent_first_uses_initialise_once(home: Path):
    with worker_processes().Pool(4) as pool:
        urls = pool.map(start_and_report, [str(home)] * 4)
    assert len(set(urls)) == 1
    assert scalar(urls[0], "SELECT 1") == 1


@pytest.mark.slow
def test_state_file_is_private_and_status_has_no_password(home: Path):
    server = EmbeddedServer(home)
    server.ensure_running()
    mode = stat.S_IMODE((home / "server.json").stat().st_mode)
    assert mode == 0o600
    password = json.loads((home / "server.json").read_text())["password"]
    assert password and password not in json.dumps(server.status())
    assert password not in server.url()


@pytest.mark.slow
def test_tcp_listener_requires_the_generated_password(home: Path):
    server = EmbeddedServer(home)
    server.ensure_running()
    tcp = sa.engine.make_url(server.tcp_url())
    assert tcp.host == "127.0.0.1"
    assert scalar(server.tcp_url(), "SELECT inet_server_addr()::text") == "127.0.0.1/32"
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(host="127.0.0.1", port=tcp.port, user="queuectl", password="wrong", dbname="queuectl")


@pytest.mark.slow
def test_start_moves_to_a_free_port_when_its_port_was_taken(home: Path):
    server = EmbeddedServer(home)
    server.ensure_running()
    old_port = server.status()["port"]
    server.stop()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", old_port))
        squatter.listen()
        url = server.ensure_running()
    assert server.status()["port"] != old_port
    assert scalar(url, "SELECT 1") == 1


def test_a_home_the_server_user_cannot_reach_is_a_clear_error(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("only root delegates to another user; as non-root every home is reachable")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(EmbeddedServerError, match="cannot reach"):
        EmbeddedServer(private / "home").ensure_running()


def test_default_home_follows_queuectl_home(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("QUEUECTL_HOME", str(tmp_path / "h"))
    assert default_home() == tmp_path / "h"


@pytest.mark.slow
def test_cli_uses_the_embedded_server_when_no_url_is_given(home: Path):
    env = {"QUEUECTL_HOME": str(home)}
    installed = run_cli("install", "orders", env_extra=env)
    assert installed.returncode == 0, installed.stderr.decode()
    assert run_cli("enqueue", "orders", "hello", env_extra=env).returncode == 0

    url = run_cli("db", "url", env_extra=env, columns=40)  # narrower than the URL: it still never wraps
    assert url.returncode == 0
    assert sa.engine.make_url(url.stdout.decode().strip()) == sa.engine.make_url(EmbeddedServer(home).url())
    assert url.stdout.decode().count("\n") == 1
    assert scalar(EmbeddedServer(home).url(), "SELECT count(*) FROM queuectl.orders_meta") == 1

    status = run_cli("db", "status", "--json", env_extra=env)
    assert status.returncode == 0 and json.loads(status.stdout)["running"] is True

    assert run_cli("db", "stop", env_extra=env).returncode == 0
    stopped = run_cli("db", "status", env_extra=env)
    assert stopped.returncode == 1 and "False" in stopped.stdout.decode()

    started = run_cli("db", "start", env_extra=env, columns=40)
    assert started.returncode == 0
    assert started.stdout.decode() == f"embedded PostgreSQL running: {url.stdout.decode()}"  # one line, copy-paste whole
    on_terminal = run_cli("db", "start", env_extra=env, columns=40, tty=True).stdout.decode()
    assert url.stdout.decode().strip() in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", on_terminal)
    listed = run_cli("list", "--json", env_extra=env)
    assert listed.returncode == 0
    assert [q["name"] for q in json.loads(listed.stdout)] == ["orders"]


@pytest.mark.slow
def test_the_server_listens_on_loopback_only_with_private_dirs_and_no_trust_over_tcp(home: Path):
    server = EmbeddedServer(home)
    url = server.ensure_running()
    assert scalar(url, "SHOW listen_addresses") == "127.0.0.1"
    assert scalar(url, "SHOW unix_socket_permissions") == "0700"
    for directory in (home / "pgdata", home / "run", home / "log"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    hba = [line.split() for line in (home / "pgdata" / "pg_hba.conf").read_text().splitlines()
           if line.strip() and not line.lstrip().startswith("#")]
    tcp = [fields for fields in hba if fields[0].startswith("host")]
    assert tcp and all(fields[-1] not in ("trust", "password") for fields in tcp), tcp  # scram over TCP
    assert all(fields[-1] in ("trust", "peer") for fields in hba if fields[0] == "local")  # socket: 0700 dir


@pytest.mark.slow
def test_each_server_gets_its_own_generated_password(home: Path):
    first = EmbeddedServer(home)
    first.ensure_running()
    other_home = new_home()
    try:
        other = EmbeddedServer(other_home)
        other.ensure_running()
        passwords = [json.loads((h / "server.json").read_text())["password"] for h in (home, other_home)]
        assert passwords[0] != passwords[1] and min(len(p) for p in passwords) >= 24
        assert not sa.engine.make_url(first.url()).password  # the socket URL carries none
    finally:
        EmbeddedServer(other_home).stop()
        shutil.rmtree(other_home.parent, ignore_errors=True)
