"""Files fetched onto a host (``%tpu_fetch``): what one file is (``Entry``), how its bytes are
checked (``Checker``, fed in order by a ``Frontier`` however the pieces land), where it goes and
how a finished one is recorded. ``download`` moves the bytes; ``receive`` writes a relayed stream.

Shipped to hosts: standard library only (see the package docstring).

Nothing that looks complete is ever half-written: bytes go to ``PATH.partial`` and reach ``PATH``
only by a rename once verified (sha256, git-blob SHA-1, md5 or crc32c, or size and ETag). A
finished file's check is recorded under ``ROOT/.cache/tpunb/`` (as huggingface_hub keeps
``.cache/huggingface/`` in a local_dir), so fetching it again moves no bytes.
An ``Entry``'s headers (a token) are never part of a repr or an error's text.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
from dataclasses import dataclass, field

CHUNK = 1 << 20
#: where each finished file's check is recorded, below the fetch's root
RECORDS = os.path.join(".cache", "tpunb")
#: how a file is verified: a digest (hex or base64 as the source gives it) or, for "etag", its
#: size and the ETag the source answers with
CHECKS = ("sha256", "git-sha1", "md5", "crc32c", "etag")
#: the largest file whose CRC32C a host computes in Python when google_crc32c is missing (~11 MB/s:
#: larger ones would be held to that rate, so they are refused with what to install)
SLOW_CRC_MAX = 64 << 20


class FetchError(Exception):
    """A file that cannot be fetched; one line naming the file, the cause and what to do.
    ``kind``: verify, disk, source, network, path or cancelled."""

    def __init__(self, message: str, kind: str, moved: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        #: bytes that came from the source before it failed (some did: the source was reachable)
        self.moved = moved


@dataclass
class Entry:
    """One file of a manifest: where it goes (relative to the fetch's root), where to GET it, and
    how to verify it. ``headers`` (a token) travel with it but never show in a repr. ``auth``
    names credentials the host finds itself ("gcs": the VM's service account, else a token the
    kernel gives for this file alone); they are never part of the entry."""

    path: str
    size: int
    url: str
    check: str
    digest: str
    headers: dict = field(default_factory=dict, repr=False)
    auth: str | None = None

    def to_wire(self) -> dict:
        """The entry as a frame carries it to a host (headers included: frames travel over SSH)."""
        return {"path": self.path, "size": self.size, "url": self.url, "check": self.check,
                "digest": self.digest, "headers": dict(self.headers), "auth": self.auth}

    @classmethod
    def from_wire(cls, data: dict) -> "Entry":
        return cls(data["path"], int(data["size"]), data["url"], data["check"], data["digest"],
                   dict(data.get("headers") or {}), data.get("auth"))


@dataclass
class Outcome:
    """What fetching one file did: ``moved`` bytes crossed the network for it (0: it was already there)."""

    path: str
    size: int
    moved: int
    seconds: float
    already: bool = False
    resumed_from: int = 0

    @property
    def rate(self) -> float:
        """Bytes per second moved."""
        return self.moved / self.seconds if self.seconds > 0 else 0.0


def bare(url: str) -> str:
    """A URL without its query (a signed URL's signature stays out of messages)."""
    return url.split("?", 1)[0]


# -- verification -----------------------------------------------------------------------------
def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_CRC32C = _crc32c_table()


def crc32c(data, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data``, continuing from ``crc``, in Python (slow: small objects on
    hosts without google_crc32c)."""
    crc, table = crc ^ 0xFFFFFFFF, _CRC32C
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


class _Crc32c:
    """CRC-32C as Cloud Storage gives it: google_crc32c's C code (tpunb's hosts install it), else
    Python for files up to SLOW_CRC_MAX."""

    def __init__(self, entry: "Entry") -> None:
        try:
            import google_crc32c
            self._fast = google_crc32c.Checksum()
        except ImportError:
            if entry.size > SLOW_CRC_MAX:
                raise FetchError(f"{entry.path}: its only checksum is a CRC32C (a composite object) and this host has "
                                 "no google_crc32c to compute it at speed: install google-crc32c in the hosts' "
                                 "environment (%tpu_run uv pip install google-crc32c) and fetch again", "path") from None
            self._fast = None
        self._crc = 0

    def update(self, data) -> None:
        if self._fast is not None:
            self._fast.update(bytes(data))
        else:
            self._crc = crc32c(data, self._crc)

    def digest(self) -> bytes:
        return self._fast.digest() if self._fast is not None else self._crc.to_bytes(4, "big")


class Checker:
    """A file's bytes, fed in order, against the digest its entry expects."""

    def __init__(self, entry: Entry) -> None:
        if entry.check not in CHECKS:
            raise FetchError(f"{entry.path}: unknown check {entry.check!r} (one of {', '.join(CHECKS)})", "path")
        self.entry = entry
        self.fed = 0
        if entry.check == "sha256":
            self._hash = hashlib.sha256()
        elif entry.check == "git-sha1":
            self._hash = hashlib.sha1(b"blob %d\0" % entry.size)
        elif entry.check == "md5":
            self._hash = hashlib.md5()
        elif entry.check == "crc32c":
            self._hash = _Crc32c(entry)
        else:
            self._hash = None

    def update(self, data) -> None:
        self.fed += len(data)
        if self._hash is not None:
            self._hash.update(data)

    def mismatch(self) -> str | None:
        """None if the bytes fed are the file the entry describes, else what differs (one phrase)."""
        entry = self.entry
        if self.fed != entry.size:
            return f"it has {self.fed:,} bytes, the source says {entry.size:,}"
        if self._hash is None:
            return None
        raw = self._hash.digest()
        got = raw.hex() if entry.check in ("sha256", "git-sha1") else base64.b64encode(raw).decode()
        same = got.lower() == entry.digest.lower() if entry.check in ("sha256", "git-sha1") else got == entry.digest
        return None if same else f"its {entry.check} is {got}, the source says {entry.digest}"


def merged(spans: list[list[int]]) -> list[list[int]]:
    """Byte ranges [lo, hi) with overlapping and touching ones joined, in order."""
    out: list[list[int]] = []
    for lo, hi in sorted(spans):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


class Frontier:
    """A file written at offsets in any order (pieces downloaded at once, a relay's stream) and
    hashed in order as its contiguous start grows: bytes that land right at the frontier are
    hashed as they come, later ones are read back from the file once the gap before them fills
    (the page cache still holds them), so no file needs a second pass. Thread-safe."""

    def __init__(self, entry: Entry, fd: int, spans: list[list[int]] | None = None) -> None:
        self.entry, self.fd = entry, fd
        self.checker = Checker(entry)
        self.spans: list[list[int]] = []
        self.next = 0  # bytes hashed so far, from the start
        self._lock = threading.Lock()
        self._hashing = False
        if spans:
            self.spans = merged([list(s) for s in spans])
            self._catch_up()

    @property
    def received(self) -> int:
        with self._lock:
            return sum(hi - lo for lo, hi in self.spans)

    @property
    def complete(self) -> bool:
        with self._lock:
            return self.spans == ([[0, self.entry.size]] if self.entry.size else [])

    def held(self) -> list[list[int]]:
        with self._lock:
            return [list(s) for s in self.spans]

    def landed(self, offset: int, data) -> None:
        """``data`` was written at ``offset``."""
        with self._lock:
            self.spans = merged(self.spans + [[offset, offset + len(data)]])
            if self._hashing or offset != self.next:
                direct = False
            else:
                direct, self._hashing = True, True
        if direct:  # at the frontier: hashed from memory, no read back
            self.checker.update(data)
            with self._lock:
                self.next += len(data)
                self._hashing = False
        self._catch_up()

    def _catch_up(self) -> None:
        """Hash what is contiguous past ``next`` (one thread at a time; the others leave it to it)."""
        while True:
            with self._lock:
                end = self.spans[0][1] if self.spans and self.spans[0][0] == 0 else 0
                if self._hashing or end <= self.next:
                    return
                self._hashing, start = True, self.next
            try:
                while start < end:
                    piece = os.pread(self.fd, min(CHUNK, end - start), start)
                    if not piece:
                        raise FetchError(f"{self.entry.path}: the partial ends at {start:,} bytes while "
                                         f"{end:,} were written", "disk")
                    self.checker.update(piece)
                    start += len(piece)
            finally:
                with self._lock:
                    self.next, self._hashing = start, False

    def mismatch(self) -> str | None:
        """As Checker.mismatch, once every byte landed (what is missing, else)."""
        self._catch_up()
        if not self.complete:
            return f"only {self.received:,} of {self.entry.size:,} bytes arrived"
        return self.checker.mismatch()


# -- places ---------------------------------------------------------------------------------------
def target_of(root: str, entry: Entry) -> str:
    """Where ``entry`` goes below ``root``; FetchError for a path that would leave it."""
    parts = entry.path.replace("\\", "/").split("/")
    if entry.path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise FetchError(f"{entry.path!r} is not a plain relative path: refusing to write it", "path")
    return os.path.join(os.path.abspath(os.path.expanduser(root)), *parts)


def _record_path(root: str, entry: Entry) -> str:
    return os.path.join(os.path.abspath(os.path.expanduser(root)), RECORDS, *entry.path.split("/")) + ".json"


def _record(root: str, entry: Entry) -> None:
    """Remember that the file in place was verified as ``entry`` says (a lost record costs a re-hash)."""
    try:
        stat = os.stat(target_of(root, entry))
        path = _record_path(root, entry)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as out:
            json.dump({"check": entry.check, "digest": entry.digest, "size": entry.size,
                       "mtime_ns": stat.st_mtime_ns}, out)
    except OSError:
        pass


def already_there(root: str, entry: Entry) -> bool:
    """Whether ``entry``'s file is in place and verified: by its record, else by reading it (then
    recorded). An ETag-checked file without a record cannot be told apart: it is fetched again."""
    target = target_of(root, entry)
    try:
        stat = os.stat(target)
    except OSError:
        return False
    if stat.st_size != entry.size:
        return False
    try:
        with open(_record_path(root, entry)) as kept:
            record = json.load(kept)
        if record == {"check": entry.check, "digest": entry.digest, "size": entry.size, "mtime_ns": stat.st_mtime_ns}:
            return True
    except (OSError, ValueError):
        pass
    if entry.check == "etag":
        return False
    checker = Checker(entry)
    try:
        with open(target, "rb") as held:
            for piece in iter(lambda: held.read(CHUNK), b""):
                checker.update(piece)
    except OSError:  # unreadable: fetched again, and replacing it says what is wrong
        return False
    if checker.mismatch():
        return False
    _record(root, entry)
    return True


def write_at(fd: int, data, offset: int) -> None:
    """All of ``data`` written at ``offset`` (pwrite may write less than asked)."""
    view = memoryview(data)
    while len(view):
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def disk_error(entry: Entry, partial: str, exc: OSError, have: int) -> FetchError:
    """A failed write as one line: a full disk keeps the partial to resume from."""
    import errno

    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return FetchError(f"{entry.path}: no space left on the device writing {partial} ({have:,} of "
                          f"{entry.size:,} bytes kept there): free space and fetch again, it resumes", "disk")
    return FetchError(f"{entry.path}: cannot write {partial}: {exc.strerror or exc}", "disk")


def place(root: str, entry: Entry, partial: str) -> None:
    """The verified partial renamed into place, and its check recorded."""
    os.replace(partial, target_of(root, entry))
    _record(root, entry)


def verify_or_remove(entry: Entry, checker: Checker, partial: str) -> None:
    """FetchError (the partial removed) unless ``checker`` saw the file ``entry`` describes."""
    wrong = checker.mismatch()
    if wrong:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise FetchError(f"{entry.path}: verification failed, {wrong}: removed {partial}; fetch again (the "
                         "source changed or the bytes were damaged on the way)", "verify")
