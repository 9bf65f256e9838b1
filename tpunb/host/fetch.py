"""Files fetched onto a host (``%tpu_fetch``): downloaded over HTTP into ``PATH.partial``, resumed
with a Range from what the partial holds, verified, then renamed into place (``download``); a
download hands each chunk on as it lands, for a relay to forward to ``receive.Receiver``.

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
import http.client
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Callable

CHUNK = 1 << 20
#: times a download resumes after its connection broke, while each try brings bytes
RETRIES = 3
#: seconds a connection may stay silent
TIMEOUT = 60.0
#: where each finished file's check is recorded, below the fetch's root
RECORDS = os.path.join(".cache", "tpunb")
#: answers after which a GET is tried again (after Retry-After, else a doubling pause)
BUSY = (429, 500, 502, 503, 504)
#: the longest pause before trying a busy source again
MAX_PAUSE = 30.0
#: how a file is verified: a digest (hex or base64 as the source gives it) or, for "etag", its
#: size and the ETag the source answers with
CHECKS = ("sha256", "git-sha1", "md5", "crc32c", "etag")


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
    how to verify it. ``headers`` (a token) travel with it but never show in a repr."""

    path: str
    size: int
    url: str
    check: str
    digest: str
    headers: dict = field(default_factory=dict, repr=False)

    def to_wire(self) -> dict:
        """The entry as a frame carries it to a host (headers included: frames travel over SSH)."""
        return {"path": self.path, "size": self.size, "url": self.url, "check": self.check,
                "digest": self.digest, "headers": dict(self.headers)}

    @classmethod
    def from_wire(cls, data: dict) -> "Entry":
        return cls(data["path"], int(data["size"]), data["url"], data["check"], data["digest"],
                   dict(data.get("headers") or {}))


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
    """CRC-32C (Castagnoli) of ``data``, continuing from ``crc``, in Python (slow: hosts without
    google_crc32c, and objects that have no md5)."""
    crc, table = crc ^ 0xFFFFFFFF, _CRC32C
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


class _Crc32c:
    """CRC-32C as Cloud Storage gives it: google_crc32c's C code when the host has it, else Python."""

    def __init__(self) -> None:
        try:
            import google_crc32c
            self._fast = google_crc32c.Checksum()
        except ImportError:
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
            self._hash = _Crc32c()
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


def _bare(url: str) -> str:
    """A URL without its query (a signed URL's signature stays out of messages)."""
    return url.split("?", 1)[0]


# -- downloading ------------------------------------------------------------------------------------
class _Busy(Exception):
    """The source said to come back later (429, or a 5xx): after ``delay`` seconds (None: backoff)."""

    def __init__(self, code: int, delay: float | None) -> None:
        super().__init__(code)
        self.code, self.delay = code, delay


class _Download:
    """One file from its URL into PATH.partial: resumed, streamed to ``on_chunk``, verified, placed."""

    def __init__(self, entry: Entry, root: str, on_chunk, progress, stop, timeout: float) -> None:
        self.entry, self.root = entry, root
        self.target = target_of(root, entry)
        self.partial = self.target + ".partial"
        self.on_chunk = on_chunk or (lambda offset, data: None)
        self.progress = progress or (lambda n: None)
        self.stop = stop or (lambda: False)
        self.timeout = timeout
        self.moved = 0
        self.have = 0

    def run(self) -> Outcome:
        started = time.monotonic()
        os.makedirs(os.path.dirname(self.target), exist_ok=True)
        fd = os.open(self.partial, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            checker = self._replay(fd)
            resumed, tries = self.have, 0
            while self.have < self.entry.size:
                before = self.have
                try:
                    checker = self._get(fd, checker)
                except _Busy as busy:
                    tries += 1
                    if tries > RETRIES:
                        raise FetchError(f"{self.entry.path}: {_bare(self.entry.url)} answered HTTP {busy.code} "
                                         f"{tries} times (throttled or down): fetch again later, it resumes",
                                         "source") from None
                    self._pause(busy.delay if busy.delay is not None else 2.0 ** tries)
                except (http.client.HTTPException, ConnectionError, TimeoutError) as exc:
                    tries = 0 if self.have > before else tries + 1
                    if tries > RETRIES:
                        raise FetchError(f"{self.entry.path}: the connection to {_bare(self.entry.url)} kept breaking "
                                         f"({type(exc).__name__}) with {self.have:,} of {self.entry.size:,} bytes "
                                         f"in {self.partial}: fetch again, it resumes", "network") from None
        finally:
            os.close(fd)
        verify_or_remove(self.entry, checker, self.partial)
        place(self.root, self.entry, self.partial)
        return Outcome(self.target, self.entry.size, self.moved, time.monotonic() - started, resumed_from=resumed)

    def _pause(self, seconds: float) -> None:
        """Wait before asking a busy source again; a stop ends the wait."""
        deadline = time.monotonic() + min(seconds, MAX_PAUSE)
        while time.monotonic() < deadline:
            if self.stop():
                raise FetchError(f"{self.entry.path}: stopped with {self.have:,} bytes in {self.partial}", "cancelled")
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def _replay(self, fd: int) -> Checker:
        """A checker fed the bytes the partial already holds (and ``on_chunk`` given them too)."""
        checker = Checker(self.entry)
        size = os.fstat(fd).st_size
        if size > self.entry.size:
            os.ftruncate(fd, 0)
            size = 0
        while self.have < size:
            piece = os.pread(fd, min(CHUNK, size - self.have), self.have)
            if not piece:
                break
            checker.update(piece)
            self.on_chunk(self.have, piece)
            self.have += len(piece)
        return checker

    def _request(self) -> urllib.request.Request:
        request = urllib.request.Request(self.entry.url)
        for name, value in self.entry.headers.items():
            request.add_unredirected_header(name, value)  # a token never follows a redirect to a CDN
        request.add_header("Accept-Encoding", "identity")
        if self.have:
            request.add_header("Range", f"bytes={self.have}-")
        return request

    def _get(self, fd: int, checker: Checker) -> Checker:
        """One GET from ``have`` on; the checker that has seen every byte in the partial."""
        try:
            response = urllib.request.urlopen(self._request(), timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            if exc.code in BUSY:
                after = (exc.headers.get("Retry-After") or "").strip()
                raise _Busy(exc.code, min(float(after), MAX_PAUSE) if after.isdigit() else None) from None
            code = exc.headers.get("X-Error-Code") or exc.reason
            raise FetchError(f"{self.entry.path}: {_bare(self.entry.url)} answered HTTP {exc.code} ({code})",
                             "source") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (ConnectionError, TimeoutError)):
                raise exc.reason from None
            raise FetchError(f"{self.entry.path}: cannot reach {_bare(self.entry.url)} ({exc.reason})", "network") from None
        with response:
            if self.entry.check == "etag":
                self._same_etag(response)
            if self.have and response.status != 206:  # the source ignored the Range: start over
                os.ftruncate(fd, 0)
                self.have, checker = 0, Checker(self.entry)
            buffer = bytearray(CHUNK)
            while self.have < self.entry.size:
                if self.stop():
                    raise FetchError(f"{self.entry.path}: stopped with {self.have:,} bytes in {self.partial}", "cancelled")
                n = response.readinto(memoryview(buffer)[:min(CHUNK, self.entry.size - self.have)])
                if not n:
                    raise http.client.IncompleteRead(b"", self.entry.size - self.have)
                piece = bytes(buffer[:n])
                try:
                    write_at(fd, piece, self.have)
                except OSError as exc:
                    raise disk_error(self.entry, self.partial, exc, self.have) from None
                checker.update(piece)
                self.on_chunk(self.have, piece)
                self.have += n
                self.moved += n
                self.progress(n)
        return checker

    def _same_etag(self, response) -> None:
        got = (response.headers.get("ETag") or "").removeprefix("W/").strip('"')
        if got != self.entry.digest.removeprefix("W/").strip('"'):
            raise FetchError(f"{self.entry.path}: {_bare(self.entry.url)} changed since it was listed (ETag "
                             f"{got or 'none'}, listed as {self.entry.digest}): fetch again", "verify")


def download(entry: Entry, root: str, on_chunk: Callable[[int, bytes], None] | None = None,
             progress: Callable[[int], None] | None = None, stop: Callable[[], bool] | None = None,
             timeout: float = TIMEOUT) -> Outcome:
    """Fetch ``entry`` to ``root/entry.path``: nothing moves if it is already there and verified;
    else into ``.partial`` (resumed from its size), each chunk handed to ``on_chunk(offset, bytes)``
    as it lands (the bytes the partial held first, too, so a stream sees the whole file) and its
    size to ``progress``, then verified and renamed. FetchError (one line) on any failure; a
    failed verification removes the partial, a full disk or a broken connection keeps it."""
    started = time.monotonic()
    if already_there(root, entry):
        return Outcome(target_of(root, entry), entry.size, 0, time.monotonic() - started, already=True)
    job = _Download(entry, root, on_chunk, progress, stop, timeout)
    try:
        return job.run()
    except FetchError as exc:
        exc.moved = job.moved
        raise
    except OSError as exc:  # making folders or opening the partial
        raise disk_error(entry, target_of(root, entry) + ".partial", exc, 0) from None


def fetch_all(entries: list[dict], root: str, progress: Callable[[int], None] | None = None,
              stop: Callable[[], bool] | None = None) -> dict:
    """Every entry (as ``Entry.to_wire`` gives them) downloaded to ``root`` one after another, as a
    host that fetches on its own does; what it did, for a reply frame: files, bytes moved, files
    already there, seconds. The first FetchError ends it (the files before it stay in place)."""
    started, moved, already = time.monotonic(), 0, 0
    for wire in entries:
        outcome = download(Entry.from_wire(wire), root, progress=progress, stop=stop)
        moved += outcome.moved
        already += outcome.already
    return {"files": len(entries), "moved": moved, "already": already, "seconds": time.monotonic() - started}
