"""What tpunb remembers between kernels: slices, their hosts, and known host keys.

A small sqlite file under $TPUNB_HOME (default ~/.tpunb). It holds no secrets: environment
values given with --env and private keys never go here, only their names and paths.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from tpunb.machine import procs

SCHEMA = """
CREATE TABLE IF NOT EXISTS slices (
    name TEXT PRIMARY KEY,
    accelerator TEXT NOT NULL,
    backend TEXT NOT NULL,
    state TEXT NOT NULL,
    created REAL NOT NULL,
    owner_pid INTEGER,
    spec TEXT NOT NULL DEFAULT '{}',
    owner_start TEXT
);
CREATE TABLE IF NOT EXISTS hosts (
    slice TEXT NOT NULL,
    idx INTEGER NOT NULL,
    address TEXT NOT NULL,
    info TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (slice, idx)
);
CREATE TABLE IF NOT EXISTS host_keys (
    host TEXT NOT NULL,
    port INTEGER NOT NULL,
    key_type TEXT NOT NULL,
    key TEXT NOT NULL,
    added REAL NOT NULL,
    PRIMARY KEY (host, port)
);
CREATE TABLE IF NOT EXISTS orphans (
    project TEXT NOT NULL,
    zone TEXT NOT NULL,
    name TEXT NOT NULL,
    reason TEXT NOT NULL,
    time REAL NOT NULL,
    PRIMARY KEY (project, zone, name)
);
CREATE TABLE IF NOT EXISTS latest_metrics (
    slice TEXT NOT NULL,
    host INTEGER NOT NULL,
    metric TEXT NOT NULL,
    chip INTEGER NOT NULL DEFAULT -1,
    value REAL,
    time REAL NOT NULL,
    PRIMARY KEY (slice, host, metric, chip)
);
"""


def process_start(pid: int | None) -> str | None:
    """When process ``pid`` started (see tpunb.procs.start_token): kept for callers and tests."""
    return procs.start_token(pid)


def tpunb_home() -> Path:
    """$TPUNB_HOME, or ~/.tpunb; created on first use with owner-only permissions."""
    home = Path(os.environ.get("TPUNB_HOME") or Path.home() / ".tpunb")
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home


@dataclass
class HostInfo:
    """What a slice knows of one host beyond its address: what its backend said at launch (its JAX
    devices, which slice of a multislice, its address on the slices' own network) and what its
    kernel published of its agent (pid and stack dumps for readers in other processes, the
    environment made there, whether only %tpu_restart can start it again). Stored as JSON; keys
    this tpunb does not know are kept in ``extra``, so an older or newer registry loads and saves."""

    devices: int | None = None
    slice: int | None = None
    internal_ip: str | None = None
    pid: int | None = None
    #: where its agent dumps every thread's stacks on a signal: {"main": path, ...}
    stacks: dict | None = None
    #: the environment tpunb made or checked there: {"path", "python", "versions"}
    env: dict | None = None
    needs_restart: bool = False
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict | None) -> HostInfo:
        known = {f.name for f in fields(cls)} - {"extra"}
        data = dict(data or {})
        return cls(**{key: data.pop(key) for key in list(data) if key in known}, extra=data)

    def to_json(self) -> dict:
        said = {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "extra" and getattr(self, f.name) not in (None, False)}
        return {**self.extra, **said}


@dataclass
class HostRecord:
    index: int
    address: str
    info: HostInfo = field(default_factory=HostInfo)


@dataclass
class SliceRecord:
    name: str
    accelerator: str
    backend: str
    state: str
    created: float = field(default_factory=time.time)
    owner_pid: int | None = None
    spec: dict = field(default_factory=dict)
    hosts: list[HostRecord] = field(default_factory=list)
    #: the owner's process_start: a later process that reuses owner_pid is not the owner
    owner_start: str | None = None

    @property
    def num_slices(self) -> int:
        """Slices joined in a multislice (``spec["slices"]``); 1 for a single slice."""
        return int(self.spec.get("slices") or 1)

    @property
    def kind(self) -> str:
        """What status shows: 'v4-16', '2 x v4-16' for a multislice, 'N hosts' with no accelerator
        ('4 hosts in 2 slices')."""
        if not self.accelerator:
            return f"{len(self.hosts)} hosts" + (f" in {self.num_slices} slices" if self.num_slices > 1 else "")
        return f"{self.num_slices} x {self.accelerator}" if self.num_slices > 1 else self.accelerator


@dataclass(frozen=True)
class IdleMark:
    """A slice's last idle mark, as its owning kernel wrote it: the limit, whether a request was
    running, and when (the file's mtime)."""

    seconds: float
    busy: bool
    since: float


class Registry:
    """sqlite-backed store; each call opens its own short transaction so kernels can share it."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path else tpunb_home() / "registry.db"
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")  # kernels write metrics while a server reads
            db.executescript(SCHEMA)
            columns = {row["name"] for row in db.execute("PRAGMA table_info(slices)")}
            if "owner_start" not in columns:  # a registry written before owners had start times
                db.execute("ALTER TABLE slices ADD COLUMN owner_start TEXT")
        os.chmod(self.path, 0o600)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA synchronous=NORMAL")  # with WAL: safe against crashes, no fsync per commit
        return db

    def save_slice(self, record: SliceRecord) -> None:
        if record.owner_pid == os.getpid():  # this kernel owns it (perhaps since just now)
            record.owner_start = process_start(record.owner_pid)
        with self._connect() as db:
            db.execute(
                "INSERT OR REPLACE INTO slices (name, accelerator, backend, state, created, owner_pid, spec, owner_start) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (record.name, record.accelerator, record.backend, record.state, record.created,
                 record.owner_pid, json.dumps(record.spec), record.owner_start),
            )
            db.execute("DELETE FROM hosts WHERE slice = ?", (record.name,))
            db.executemany(
                "INSERT INTO hosts VALUES (?, ?, ?, ?)",
                [(record.name, h.index, h.address, json.dumps(h.info.to_json())) for h in record.hosts],
            )

    def get_slice(self, name: str) -> SliceRecord | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM slices WHERE name = ?", (name,)).fetchone()
            if row is None:
                return None
            hosts = db.execute("SELECT * FROM hosts WHERE slice = ? ORDER BY idx", (name,)).fetchall()
        return self._record(row, hosts)

    def list_slices(self) -> list[SliceRecord]:
        with self._connect() as db:
            rows = db.execute("SELECT * FROM slices ORDER BY created").fetchall()
            hosts = db.execute("SELECT * FROM hosts ORDER BY slice, idx").fetchall()
        by_slice: dict[str, list] = {}
        for h in hosts:
            by_slice.setdefault(h["slice"], []).append(h)
        return [self._record(r, by_slice.get(r["name"], [])) for r in rows]

    def delete_slice(self, name: str) -> bool:
        self._idle_path(name).unlink(missing_ok=True)
        with self._connect() as db:
            db.execute("DELETE FROM hosts WHERE slice = ?", (name,))
            db.execute("DELETE FROM latest_metrics WHERE slice = ?", (name,))
            return db.execute("DELETE FROM slices WHERE name = ?", (name,)).rowcount > 0

    @staticmethod
    def _record(row: sqlite3.Row, hosts: list) -> SliceRecord:
        return SliceRecord(
            name=row["name"], accelerator=row["accelerator"], backend=row["backend"],
            state=row["state"], created=row["created"], owner_pid=row["owner_pid"],
            spec=json.loads(row["spec"]), owner_start=row["owner_start"],
            hosts=[HostRecord(h["idx"], h["address"], HostInfo.from_json(json.loads(h["info"]))) for h in hosts],
        )

    # The latest metric values per host, published by the kernel that owns a slice, for readers
    # in other processes (the JupyterLab sidebar's server, %tpu_status in another kernel).
    def save_latest_metrics(self, name: str, rows: list[tuple[int, str, int | None, float, float]]) -> None:
        """Replace ``name``'s rows with (host, metric, chip, value, time) tuples."""
        with self._connect() as db:
            db.execute("DELETE FROM latest_metrics WHERE slice = ?", (name,))
            db.executemany("INSERT INTO latest_metrics VALUES (?, ?, ?, ?, ?, ?)",
                           [(name, h, m, -1 if c is None else c, v, t) for h, m, c, v, t in rows])

    def latest_metrics(self, name: str) -> list[tuple[int, str, int | None, float, float]]:
        with self._connect() as db:
            rows = db.execute("SELECT host, metric, chip, value, time FROM latest_metrics WHERE slice = ? "
                              "ORDER BY host, metric, chip", (name,)).fetchall()
        return [(r["host"], r["metric"], None if r["chip"] == -1 else r["chip"], r["value"], r["time"]) for r in rows]

    # The idle timer of a cloud slice with idle autodelete, as its owning kernel last marked it: a
    # file per slice beside the database (its mtime is the last activity), so a cell costs one small
    # write, not an sqlite transaction. The watchdog on the slice keeps the same clock.
    def _idle_path(self, name: str) -> Path:
        return self.path.parent / "idle" / name

    def mark_idle(self, name: str, seconds: float, busy: bool) -> None:
        """A request starts (``busy``) or ends on slice ``name``, whose node goes after ``seconds`` idle."""
        path = self._idle_path(name)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        path.write_text(json.dumps({"seconds": seconds, "busy": busy}))

    def idle_mark(self, name: str) -> IdleMark | None:
        """The slice's last idle mark (None: no idle autodelete, or never marked); the countdown
        from it is the status view's idle rule (``tpunb.overview.idle_delete_in``)."""
        path = self._idle_path(name)
        try:
            mark = json.loads(path.read_text())
            since = path.stat().st_mtime
        except (OSError, ValueError):
            return None
        return IdleMark(float(mark.get("seconds") or 0), bool(mark.get("busy")), since)

    # Cloud nodes a failed launch could not delete: listed by %tpu_status and the sidebar until gone.
    def save_orphan(self, project: str, zone: str, name: str, reason: str) -> None:
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO orphans VALUES (?, ?, ?, ?, ?)", (project, zone, name, reason, time.time()))

    def orphans(self) -> list[tuple[str, str, str, str]]:
        """(project, zone, name, why it was left) of each node recorded as an orphan."""
        with self._connect() as db:
            rows = db.execute("SELECT project, zone, name, reason FROM orphans ORDER BY time").fetchall()
        return [(r["project"], r["zone"], r["name"], r["reason"]) for r in rows]

    def forget_orphan(self, project: str, zone: str, name: str) -> bool:
        with self._connect() as db:
            return db.execute("DELETE FROM orphans WHERE project = ? AND zone = ? AND name = ?",
                              (project, zone, name)).rowcount > 0

    # Known host keys (trust on first use, checked on every later connection).
    def get_host_key(self, host: str, port: int) -> tuple[str, str] | None:
        """(key type, base64 key) recorded for host:port, or None if never seen."""
        with self._connect() as db:
            row = db.execute("SELECT key_type, key FROM host_keys WHERE host = ? AND port = ?", (host, port)).fetchone()
        return (row["key_type"], row["key"]) if row else None

    def set_host_key(self, host: str, port: int, key_type: str, key: str) -> None:
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO host_keys VALUES (?, ?, ?, ?, ?)", (host, port, key_type, key, time.time()))

    def forget_host_key(self, host: str, port: int) -> bool:
        with self._connect() as db:
            return db.execute("DELETE FROM host_keys WHERE host = ? AND port = ?", (host, port)).rowcount > 0
