"""The Parquet lake on a file system path, and how a run commits into it.

Layout:
    <lake>/history/queue=<q>/day=<YYYY-MM-DD>/<seq>-part-....parquet   the data
    <lake>/_commits/<q>/<seq>.json                                      one record per run
    <lake>/_staging/<q>/<seq>/                                          a run in progress

A run lets Spark write into its staging folder. When Spark's job has finished, the run
writes `manifest.json` there (atomically: temp file + rename): from then on the run is
decided. It then renames each data file into history/ (one atomic rename per file, names
unique per run), writes the commit record, and removes the staging folder. A run that dies
before its manifest leaves only staging files, which the next run deletes; one that dies
after it is rolled forward by the next run (the remaining renames and the commit record),
so the lake never holds a run's rows twice or half of them. Renames need the staging and
history folders on one file system: the lake is a local or shared (NFS) path that the
driver and every executor see at the same place.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from queuectl.errors import UsageError

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MANIFEST = "manifest.json"


def to_micros(ts: datetime) -> int:
    """Exact microseconds since the epoch (no float rounding)."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=timezone.utc)
    delta = ts - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(us: int) -> datetime:
    from datetime import timedelta

    return EPOCH + timedelta(microseconds=us)


@dataclass(frozen=True)
class Bounds:
    """The lake holds exactly the history rows with id <= upto_id and archived_at < before."""

    upto_id: int = 0
    before_us: int = 0

    @property
    def archived_before(self) -> datetime:
        return from_micros(self.before_us)


@dataclass(frozen=True)
class CommitRecord:
    queue: str
    seq: int
    previous: Bounds
    bounds: Bounds
    rows: int
    files: list[str]  # relative to the lake
    committed_at: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "CommitRecord":
        data = json.loads(text)
        return cls(
            queue=data["queue"],
            seq=data["seq"],
            previous=Bounds(**data["previous"]),
            bounds=Bounds(**data["bounds"]),
            rows=data["rows"],
            files=list(data["files"]),
            committed_at=data.get("committed_at", ""),
        )


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Lake:
    """A lake rooted at a local path (file:// URIs accepted)."""

    def __init__(self, path: str | os.PathLike[str]):
        text = os.fspath(path)
        if text.startswith("file://"):
            text = text[len("file://") :]
        elif "://" in text:
            raise UsageError(
                f"lake {text!r}: only file system paths are supported (a local or shared mount "
                "that the driver and all executors see at the same path)"
            )
        self.root = Path(text).expanduser().absolute()

    def __str__(self) -> str:
        return str(self.root)

    @property
    def history_dir(self) -> Path:
        return self.root / "history"

    def staging_dir(self, queue: str, seq: int) -> Path:
        return self.root / "_staging" / queue / f"{seq:08d}"

    def commits_dir(self, queue: str) -> Path:
        return self.root / "_commits" / queue

    def ensure(self) -> None:
        self.history_dir.mkdir(parents=True, exist_ok=True)

    # -- the commit log ----------------------------------------------------------------

    def commits(self, queue: str) -> list[CommitRecord]:
        directory = self.commits_dir(queue)
        if not directory.is_dir():
            return []
        records = [CommitRecord.from_json(p.read_text("utf-8")) for p in sorted(directory.glob("*.json"))]
        for expected, record in enumerate(records, start=1):
            if record.seq != expected:
                raise UsageError(f"lake {self}: commit log of {queue!r} misses run {expected}")
        return records

    def last_commit(self, queue: str) -> CommitRecord | None:
        records = self.commits(queue)
        return records[-1] if records else None

    def queues(self) -> list[str]:
        base = self.root / "_commits"
        return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []

    # -- one run -----------------------------------------------------------------------

    def recover(self, queue: str) -> list[tuple[int, str]]:
        """Finish or discard runs a dead process left behind; returns (seq, what was done)."""
        done: list[tuple[int, str]] = []
        base = self.root / "_staging" / queue
        if not base.is_dir():
            return done
        for run_dir in sorted(p for p in base.iterdir() if p.is_dir()):
            manifest = run_dir / MANIFEST
            if manifest.is_file():
                record = CommitRecord.from_json(manifest.read_text("utf-8"))
                self._publish(run_dir, record)
                done.append((record.seq, "rolled forward"))
            else:
                shutil.rmtree(run_dir)
                done.append((int(run_dir.name), "discarded"))
        return done

    def decide(self, queue: str, seq: int, previous: Bounds, bounds: Bounds, rows: int) -> CommitRecord:
        """Spark has written the run's files into staging: name their final places and
        write the manifest. After this the run is committed, whatever happens next."""
        run_dir = self.staging_dir(queue, seq)
        files: list[str] = []
        for src in sorted(run_dir.rglob("*.parquet")):
            rel = src.relative_to(run_dir)
            if any(part.startswith(("_", ".")) for part in rel.parts):
                continue  # Spark's _temporary leftovers of failed task attempts
            day = next((p for p in rel.parts if p.startswith("day=")), None)
            if day is None:
                raise UsageError(f"unexpected file {src} in staging (no day= folder)")
            target = Path("history") / f"queue={queue}" / day / f"{seq:08d}-{src.name}"
            files.append(f"{rel}\t{target}")
        record = CommitRecord(queue, seq, previous, bounds, rows, files,
                              datetime.now(timezone.utc).isoformat(timespec="seconds"))  # fmt: skip
        _write_atomic(run_dir / MANIFEST, record.to_json())
        return record

    def publish(self, record: CommitRecord) -> None:
        self._publish(self.staging_dir(record.queue, record.seq), record)

    def _publish(self, run_dir: Path, record: CommitRecord) -> None:
        """Idempotent: move what is still in staging, write the commit record, clean up."""
        for pair in record.files:
            rel, target = pair.split("\t")
            src = run_dir / rel
            dst = self.root / target
            if src.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)
                _crash_point("after_first_move")
            elif not dst.exists():
                raise UsageError(f"lake {self}: run {record.seq} of {record.queue!r} lost {target}")
        commits = self.commits_dir(record.queue)
        commits.mkdir(parents=True, exist_ok=True)
        _write_atomic(commits / f"{record.seq:08d}.json", record.to_json())
        shutil.rmtree(run_dir)

    def files_of(self, record: CommitRecord) -> list[Path]:
        return [self.root / pair.split("\t")[1] for pair in record.files]

    def committed_files(self) -> list[Path]:
        """Every data file of every committed run: what a reader may trust. A run that died
        half-way through its renames is not listed until the next run completes it."""
        return [path for queue in self.queues() for record in self.commits(queue) for path in self.files_of(record)]


def _crash_point(name: str) -> None:
    """Fault injection for the crash-recovery tests: QUEUECTL_PIPELINE_CRASH=<name> makes the
    process die here as a SIGKILL would (no cleanup, no exception handlers)."""
    if os.environ.get("QUEUECTL_PIPELINE_CRASH") == name:
        os._exit(137)
