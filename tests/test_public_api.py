"""One import for every kind: `from queuectl import ...` gives the clients, the workers, the
records and the errors, loaded on first use."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

import queuectl
from queuectl import AsyncQueue, Message, Queue, UsageError, Worker, open_async_queue, open_queue
from queuectl.client import FifoQueue
from queuectl.install import install_queue


def test_every_public_name_is_the_object_its_module_defines():
    assert queuectl.__all__ == sorted(queuectl._PUBLIC)
    for name, module in queuectl._PUBLIC.items():
        assert getattr(queuectl, name) is getattr(importlib.import_module(module), name), name
    assert set(queuectl.__all__) <= set(dir(queuectl))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        queuectl.Nope  # noqa: B018
    assert (Message, Worker, AsyncQueue, open_async_queue) == (
        queuectl.Message, queuectl.Worker, queuectl.AsyncQueue, queuectl.open_async_queue)


def test_the_package_and_its_errors_load_without_sqlalchemy():
    code = ("import sys, queuectl; queuectl.UsageError; queuectl.QueuectlError; queuectl.__version__; "
            "print(sorted(m for m in ('sqlalchemy', 'psycopg', 'queuectl.client') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_open_queue_gives_any_kind_its_client_and_queue_points_there(engine: sa.Engine):
    install_queue(engine, "events", "fifo")
    with open_queue(engine, "events") as events:
        assert isinstance(events, FifoQueue)
        events.enqueue("hello")
        assert [m.payload for m in events.dequeue(1)] == [b"hello"]
    with pytest.raises(UsageError, match=r"kind 'fifo'; Queue speaks 'reliable': use queuectl.open_queue\(url, 'events'\)"):
        Queue(engine, "events")


@pytest.mark.slow
def test_the_public_api_is_clean_under_mypy_strict(tmp_path):
    """The package face, the clients (sync and asyncio), the workers, the records and the errors
    type-check with mypy --strict (the package ships py.typed). The tree's folders are laid out
    as the package (the editable install's path finder is invisible to mypy)."""
    root = Path(__file__).resolve().parent.parent
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "queuectl").symlink_to(root / "toolkit")
    assert (root / "toolkit" / "py.typed").is_file()
    modules = ["queuectl", "queuectl.worker", "queuectl.asyncworker", "queuectl.messages", "queuectl.errors"]
    args = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-error-summary",
            "--cache-dir", str(tmp_path / "cache"), "-p", "queuectl.client", *(a for m in modules for a in ("-m", m))]
    result = subprocess.run(args, cwd=tmp_path / "src", env={**os.environ, "MYPYPATH": "."},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
