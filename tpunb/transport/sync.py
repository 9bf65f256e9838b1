"""Copy a working directory to every host of a slice, sending only what changed.

What is sent: every file under the local directory except .git, what .gitignore files ignore
(nested ones too, git's precedence) and ``exclude`` patterns (gitignore syntax).
What counts as changed: a manifest on each host (``.tpunb-sync.json`` in the remote directory)
records the local size and mtime (ns) of each file sent; a file is skipped only if that record
matches the local file and the remote file still has the size and mtime tpunb gave it, so edits
within the same second and files changed or deleted on the host are both caught.
Deletion: a file tpunb sent earlier is removed from the hosts once it no longer exists locally;
files that are merely excluded now, and files tpunb never sent, are left alone.
"""
from __future__ import annotations

import json
import os
import posixpath
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tpunb.errors import SyncError, TransportError
from tpunb.transport.fanout import fan_out
from tpunb.transport.seam import Transport
from tpunb.transport.sftp import CREATE, TRUNCATE, WRITE_FLAG, PipelinedSFTP, attrs
from tpunb.units import format_bytes

MANIFEST = ".tpunb-sync.json"
OPEN_AHEAD = 16  # files whose OPEN is in flight while an earlier one is written
PROGRESS_EVERY = 0.1  # seconds between progress callbacks


@dataclass(frozen=True)
class LocalFile:
    rel: str  # posix path relative to the synced directory
    size: int
    mtime_ns: int
    atime_ns: int
    mode: int


@dataclass
class HostSync:
    address: str
    sent: int = 0
    unchanged: int = 0
    deleted: int = 0
    bytes: int = 0


@dataclass
class SyncReport:
    local_dir: str
    remote_dir: str
    files: int
    hosts: list[HostSync] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def files_sent(self) -> int:
        return sum(h.sent for h in self.hosts)

    @property
    def bytes_sent(self) -> int:
        return sum(h.bytes for h in self.hosts)

    def __str__(self) -> str:
        deleted = sum(h.deleted for h in self.hosts)
        return (f"synced {self.files} files to {len(self.hosts)} hosts in {self.seconds:.2f} s: "
                f"{self.files_sent} sent ({format_bytes(self.bytes_sent)}), {deleted} deleted")


# -- what to send ---------------------------------------------------------------------------------

def scan(local_dir: str | os.PathLike, exclude: Iterable[str] = ()) -> list[LocalFile]:
    """The files to sync, honouring .gitignore files and ``exclude`` (gitignore patterns)."""
    from pathspec import GitIgnoreSpec  # lazily: `import tpunb` must stay fast

    root = Path(local_dir)
    if not root.is_dir():
        raise TransportError(f"{root} is not a directory: give the local directory to sync")
    excludes = GitIgnoreSpec.from_lines(list(exclude)) if exclude else None
    files: list[LocalFile] = []

    def ignored(rel: str, is_dir: bool, chain: list[tuple[str, object]]) -> bool:
        key = rel + "/" if is_dir else rel
        if excludes is not None and excludes.match_file(key):
            return True
        for base, spec in reversed(chain):  # the deepest .gitignore that has an opinion decides
            verdict = spec.check_file(key[len(base):]).include
            if verdict is not None:
                return verdict
        return False

    def walk(directory: Path, rel_dir: str, chain: list[tuple[str, object]]) -> None:
        gitignore = directory / ".gitignore"
        if gitignore.is_file():
            lines = gitignore.read_text(errors="replace").splitlines()
            chain = chain + [(rel_dir, GitIgnoreSpec.from_lines(lines))]
        with os.scandir(directory) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel = rel_dir + entry.name
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != ".git" and not ignored(rel, True, chain):
                        walk(Path(entry.path), rel + "/", chain)
                elif entry.is_file() and not ignored(rel, False, chain) and rel != MANIFEST:
                    try:
                        st = entry.stat()
                    except OSError:  # vanished or unreadable: not ours to send
                        continue
                    files.append(LocalFile(rel, st.st_size, st.st_mtime_ns, st.st_atime_ns,
                                           stat.S_IMODE(st.st_mode)))

    walk(root, "", [])
    return files


# -- one host -------------------------------------------------------------------------------------

class _Progress:
    def __init__(self) -> None:
        self.done = 0
        self.total = 0
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n


class _HostJob:
    """Sync to one host in two steps, so the total is known before the first byte is counted."""

    def __init__(self, transport: Transport, local_dir: Path, remote_dir: str, files: list[LocalFile]) -> None:
        self.transport = transport
        self.local_dir = local_dir
        self.root = remote_dir
        self.files = files
        self.result = HostSync(transport.address)
        self.sftp: PipelinedSFTP | None = None
        self.to_send: list[LocalFile] = []
        self.to_delete: list[str] = []
        self.manifest: dict[str, list[int]] = {}

    def remote(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def plan(self) -> int:
        """Connect SFTP, make the remote dir, read the manifest, check candidates; bytes to send."""
        self.sftp = sftp = PipelinedSFTP(self.transport.open_files(), self.transport.address)
        parts = self.root.split("/")
        for i in range(1, len(parts) + 1):
            if parts[:i] != [""]:
                sftp.mkdir("/".join(parts[:i]))
        remote_root = sftp.stat(self.root)
        if remote_root is None or not stat.S_ISDIR(remote_root.mode or 0):
            raise TransportError(f"{self.transport.address}: cannot create directory {self.root}: "
                                 "check the remote path and its permissions")
        try:
            self.manifest = json.loads(sftp.read_file(self.remote(MANIFEST)) or b"{}").get("files", {})
        except (ValueError, AttributeError):
            self.manifest = {}  # unreadable manifest: send everything, then write a good one
        candidates = [f for f in self.files if self.manifest.get(f.rel) == [f.size, f.mtime_ns]]
        remote = sftp.lstat_many([self.remote(f.rel) for f in candidates])
        unchanged = {f.rel for f, st in zip(candidates, remote)
                     if st is not None and st.size == f.size and st.mtime == f.mtime_ns // 10**9}
        self.result.unchanged = len(unchanged)
        self.to_send = [f for f in self.files if f.rel not in unchanged]
        local = {f.rel for f in self.files}
        self.to_delete = [rel for rel in self.manifest
                          if rel not in local and not os.path.lexists(self.local_dir / rel)]
        return sum(f.size for f in self.to_send)

    def send(self, progress: _Progress) -> None:
        """Directories, then files (opens kept OPEN_AHEAD in flight), deletions, and the manifest."""
        sftp = self.sftp
        dirs = sorted({posixpath.dirname(f.rel) for f in self.to_send} - {""})
        for directory in sorted({p for d in dirs for p in _ancestors(d)}):
            sftp.mkdir(self.remote(directory))
        sent: dict[str, list[int]] = {}
        queue = iter(self.to_send)
        opens: deque = deque()

        def open_next() -> None:
            f = next(queue, None)
            if f is not None:
                opens.append((f, sftp.open(self.remote(f.rel), WRITE_FLAG | CREATE | TRUNCATE, f.mode)))

        for _ in range(OPEN_AHEAD):
            open_next()
        while opens:
            f, reply = opens.popleft()
            open_next()
            handle = sftp.handle(reply)
            what = f"write {self.remote(f.rel)}"
            written = self._write(handle, f, what, progress)
            sftp.fsetstat(handle, attrs(f.mode, (f.atime_ns // 10**9, f.mtime_ns // 10**9)), what)
            sftp.close_handle(handle, what)
            if written == f.size:
                sent[f.rel] = [f.size, f.mtime_ns]
            self.result.bytes += written
        for rel in self.to_delete:
            sftp.remove(self.remote(rel))
        sftp.drain()
        if sftp.errors:
            raise TransportError(f"{self.transport.address}: {'; '.join(sftp.errors[:3])}")
        self.result.sent = len(self.to_send)
        self.result.deleted = len(self.to_delete)
        attempted = {f.rel for f in self.to_send}
        unchanged = {f.rel: [f.size, f.mtime_ns] for f in self.files if f.rel not in attempted}
        manifest = {"version": 1, "files": {**unchanged, **sent}}
        sftp.write_file(self.remote(MANIFEST), json.dumps(manifest, separators=(",", ":")).encode())

    def _write(self, handle: bytes, f: LocalFile, what: str, progress: _Progress) -> int:
        step = self.sftp.WRITE_CHUNK
        offset = 0
        try:
            with open(self.local_dir / f.rel, "rb") as fh:
                while offset < f.size:
                    data = fh.read(min(step, f.size - offset))
                    if not data:
                        break
                    self.sftp.write(handle, offset, data, what)
                    offset += len(data)
                    progress.add(len(data))
        except OSError:
            pass  # changed under us: not recorded as sent, so the next sync sends it again
        return offset

    def close(self) -> None:
        if self.sftp is not None:
            self.sftp.close()


def _ancestors(d: str) -> list[str]:
    parts = d.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _remote_root(remote_dir: str) -> str:
    """SFTP paths are relative to the login directory; '~' and '~/x' mean that too."""
    if remote_dir in ("", "~", "~/"):
        return "."
    remote_dir = remote_dir.removeprefix("~/")
    return remote_dir.rstrip("/") or "/"


# -- all hosts ------------------------------------------------------------------------------------

def sync_tree(
    transports: Sequence[Transport],
    local_dir: str | os.PathLike,
    remote_dir: str | Sequence[str],
    exclude: Iterable[str] = (),
    progress: Callable[[int, int], None] | None = None,
) -> SyncReport:
    """Make ``remote_dir`` on every host match ``local_dir``, in parallel over SFTP (each transport's
    ``open_files``: sshd's own server, or tpunb's over an exec channel).

    ``remote_dir`` is one path for all hosts (relative paths start at the login directory), or
    a list with one path per host. Hosts sharing a filesystem may share the path: each write is
    complete and the manifest is replaced atomically, only bandwidth is wasted.

    ``progress(done_bytes, total_bytes)`` is called from this thread (safe for widgets) every
    0.1 s and once at the end. Raises TransportError naming each host that failed; the others
    are complete (the error's ``report`` says what was done).
    """
    started = time.perf_counter()
    local = Path(local_dir).expanduser()
    files = scan(local, exclude)
    roots = [remote_dir] * len(transports) if isinstance(remote_dir, str) else list(remote_dir)
    if len(roots) != len(transports):
        raise TransportError(f"{len(roots)} remote directories for {len(transports)} hosts: give one, or one per host")
    jobs = [_HostJob(t, local, _remote_root(r), files) for t, r in zip(transports, roots)]
    report = SyncReport(str(local), str(remote_dir), len(files), [j.result for j in jobs])
    counter = _Progress()
    hosts = range(len(jobs))
    try:
        planned = fan_out(hosts, lambda i: jobs[i].plan(), name="tpunb-sync")
        counter.total = sum(planned.succeeded.values())
        sent = fan_out(list(planned.succeeded), lambda i: jobs[i].send(counter), name="tpunb-sync", tick=PROGRESS_EVERY,
                       on_tick=None if progress is None else lambda: progress(counter.done, counter.total))
    finally:
        for j in jobs:
            j.close()  # on KeyboardInterrupt this is what makes the workers stop at once
    failures = {jobs[i].result.address: exc for i, exc in {**planned.failed, **sent.failed}.items()}
    if progress is not None:
        progress(counter.done, counter.total)
    report.seconds = time.perf_counter() - started
    if failures:
        raise SyncError(f"sync failed on {len(failures)} of {len(jobs)} hosts: "
                        + "; ".join(_reason(e) for e in failures.values()), failures, report)
    return report


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, TransportError) else f"{type(exc).__name__}: {exc}"
