"""Files downloaded over HTTP onto a host (``%tpu_fetch``), several at once: ``Downloads`` keeps
``streams`` GETs in flight, whole small files and pieces of large ones (a Range each, as
``gcloud storage cp`` slices an object and hf_xet fetches a file's ranges at once). Bytes are
written into ``PATH.partial`` at their offsets, handed to ``on_chunk`` as they land (for a relay),
hashed in order by a ``Frontier``, then verified and renamed into place. A download cut short
resumes from what the partial holds: its contiguous start, or the spans listed beside it
(``PATH.partial.spans``) when pieces were in flight. A busy source (429, 5xx) is asked again after
its ``Retry-After`` (seconds or an HTTP date) or its ``RateLimit`` reset, for up to BUSY_TRIES.
``stream`` reads one file without writing it anywhere (the kernel's fallback).

Shipped to hosts: standard library only (see the package docstring).
"""
from __future__ import annotations

import email.utils
import http.client
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from typing import Callable

from .fetch import (CHUNK, Entry, FetchError, Frontier, Outcome, already_there, bare, disk_error, merged, place,
                    target_of, verify_or_remove, write_at)

#: times a GET is tried again after its connection broke, while no try brings bytes
RETRIES = 3
#: times a busy source (429, 5xx) is asked again: the Hub's rate-limit windows last minutes
BUSY_TRIES = 8
#: seconds a connection may stay silent
TIMEOUT = 60.0
#: answers after which a GET is tried again (after Retry-After, else a doubling pause)
BUSY = (429, 500, 502, 503, 504)
#: the longest pause before asking a busy source again (the Hub's windows are 5 minutes)
MAX_PAUSE = 300.0
#: the longest pause of the doubling backoff, when the source says nothing
MAX_BACKOFF = 60.0
#: GETs a host keeps in flight at once (huggingface_hub's snapshot_download: 8 files)
STREAMS = 8
#: a file this large is fetched as pieces (Range GETs) at once; smaller ones in one GET
PIECE = 64 << 20
#: seconds between two saves of a partial's spans while pieces land
SPANS_EVERY = 0.5


class _Busy(Exception):
    """The source said to come back later (429, or a 5xx): after ``delay`` seconds (None: backoff)."""

    def __init__(self, code: int, delay: float | None) -> None:
        super().__init__(code)
        self.code, self.delay = code, delay


class _Refused(FetchError):
    """401 or 403: the credentials sent were refused."""


class _NoRanges(Exception):
    """The source answered a Range with the whole file (200): it is fetched in one stream."""

    def __init__(self, response) -> None:
        super().__init__("no ranges")
        self.response = response


def retry_after(headers, now: float | None = None) -> float | None:
    """Seconds a busy source asks for: ``Retry-After`` as seconds or as an HTTP date (RFC 9110),
    else the reset of an exhausted ``RateLimit`` (the Hub's ``"api";r=0;t=55``); None if neither."""
    value = (headers.get("Retry-After") or "").strip()
    if value.isdigit():
        return float(value)
    if value:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            when = None
        if when is not None and when.tzinfo is not None:
            return max(0.0, when.timestamp() - (time.time() if now is None else now))
    limit = re.search(r";\s*r=(\d+)\s*;\s*t=(\d+)", headers.get("RateLimit") or "")
    if limit and int(limit.group(1)) == 0:
        return float(limit.group(2))
    return None


def _request(entry: Entry, token: str | None, lo: int, hi: int | None) -> urllib.request.Request:
    """A GET of bytes [lo, hi) (hi None: to the end) with the entry's headers, which never follow a
    redirect (a token stays off the CDN); ``token`` a bearer token of the host's own."""
    request = urllib.request.Request(entry.url)
    headers = dict(entry.headers)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    for name, value in headers.items():
        request.add_unredirected_header(name, value)
    request.add_header("Accept-Encoding", "identity")
    if lo or hi is not None:
        request.add_header("Range", f"bytes={lo}-" + ("" if hi is None else str(hi - 1)))
    return request


def _same_etag(entry: Entry, response) -> None:
    got = (response.headers.get("ETag") or "").removeprefix("W/").strip('"')
    if got != entry.digest.removeprefix("W/").strip('"'):
        raise FetchError(f"{entry.path}: {bare(entry.url)} changed since it was listed (ETag {got or 'none'}, "
                         f"listed as {entry.digest}): fetch again", "verify")


def _open(entry: Entry, token: str | None, lo: int, hi: int | None, timeout: float):
    """The response to one GET; _Busy, a FetchError, or the connection's error to retry."""
    try:
        response = urllib.request.urlopen(_request(entry, token, lo, hi), timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code in BUSY:
            raise _Busy(exc.code, retry_after(exc.headers)) from None
        code = exc.headers.get("X-Error-Code") or exc.reason
        kind = _Refused if exc.code in (401, 403) else FetchError
        raise kind(f"{entry.path}: {bare(entry.url)} answered HTTP {exc.code} ({code})", "source") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (ConnectionError, TimeoutError)):
            raise exc.reason from None
        raise FetchError(f"{entry.path}: cannot reach {bare(entry.url)} ({exc.reason})", "network") from None
    if entry.check == "etag":
        try:
            _same_etag(entry, response)
        except FetchError:
            response.close()
            raise
    return response


class _Tries:
    """How long one span keeps trying: broken connections while no bytes come (RETRIES), a busy
    source (BUSY_TRIES, pausing as it asks); a stop ends any pause."""

    def __init__(self, entry: Entry, stop: Callable[[], bool], where: Callable[[], str]) -> None:
        self.entry, self.stop, self.where = entry, stop, where
        self.broken = self.busy = 0

    def on_busy(self, busy: _Busy) -> None:
        self.busy += 1
        if self.busy > BUSY_TRIES:
            raise FetchError(f"{self.entry.path}: {bare(self.entry.url)} answered HTTP {busy.code} {self.busy} times "
                             "(throttled or down): fetch again later, it resumes", "source") from None
        pause = busy.delay if busy.delay is not None else min(MAX_BACKOFF, 2.0 ** self.busy)
        deadline = time.monotonic() + min(pause, MAX_PAUSE)
        while time.monotonic() < deadline:
            if self.stop():
                raise FetchError(f"{self.entry.path}: stopped ({self.where()})", "cancelled")
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def on_broken(self, exc: Exception, progressed: bool) -> None:
        self.broken = 0 if progressed else self.broken + 1
        if self.broken > RETRIES:
            raise FetchError(f"{self.entry.path}: the connection to {bare(self.entry.url)} kept breaking "
                             f"({type(exc).__name__}) with {self.where()}: fetch again, it resumes", "network") from None


def _read_into(entry: Entry, response, lo: int, hi: int, sink: Callable[[int, bytes], None],
               stop: Callable[[], bool], where: Callable[[], str]) -> int:
    """The response's bytes for [lo, hi) handed to ``sink(offset, data)``; the offset reached."""
    buffer = bytearray(CHUNK)
    while lo < hi:
        if stop():
            raise FetchError(f"{entry.path}: stopped ({where()})", "cancelled")
        n = response.readinto(memoryview(buffer)[:min(CHUNK, hi - lo)])
        if not n:
            raise http.client.IncompleteRead(b"", hi - lo)
        sink(lo, bytes(buffer[:n]))
        lo += n
    return lo


# -- one file, in pieces ---------------------------------------------------------------------------
class _File:
    """One file being downloaded: its partial, what it holds, the pieces still to fetch."""

    def __init__(self, index: int, entry: Entry, root: str) -> None:
        self.index, self.entry, self.root = index, entry, root
        self.target = target_of(root, entry)
        self.partial = self.target + ".partial"
        self.spans_path = self.partial + ".spans"
        self.fd: int | None = None
        self.frontier: Frontier | None = None
        self.pieces: deque = deque()
        self.running = 0
        self.moved = 0
        self.resumed_from = 0
        self.started = time.monotonic()
        self.ranged = False  # pieces in flight at once: the spans file says what the partial holds
        self.refused = False  # the host's own credentials were refused: the kernel's token, for this file
        self.held_back: list[tuple[int, int]] = []  # pieces released once the source showed it takes ranges
        self._saved = 0.0
        self._lock = threading.Lock()

    def open(self, on_chunk: Callable[[int, bytes], None], progress: Callable[[int], None]) -> None:
        """The partial opened, the bytes it holds handed on (a relay's receivers need the whole file)
        and hashed, and the pieces still missing queued."""
        os.makedirs(os.path.dirname(self.target), exist_ok=True)
        self.fd = os.open(self.partial, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        size = self.entry.size
        held, from_spans = self._held(os.fstat(self.fd).st_size)
        for lo, hi in held:
            at = lo
            while at < hi:
                piece = os.pread(self.fd, min(CHUNK, hi - at), at)
                if not piece:
                    held, from_spans = [], False  # shorter than its spans said: start over
                    break
                on_chunk(at, piece)
                progress(len(piece))
                at += len(piece)
        self.frontier = Frontier(self.entry, self.fd, held)
        self.resumed_from = sum(hi - lo for lo, hi in held)
        missing, at = [], 0
        for lo, hi in held + [[size, size]]:
            if lo > at:
                missing.append((at, lo))
            at = max(at, hi)
        if not from_spans and (len(missing) != 1 or missing[0][1] - missing[0][0] < 2 * PIECE):
            self.pieces.extend(missing)  # one GET: the rest of the file
            return
        self.ranged = True  # pieces at once: the spans file says what the partial holds from now on
        self.save_spans(force=True)
        split = [(cut, min(cut + PIECE, hi)) for lo, hi in missing for cut in range(lo, hi, PIECE)]
        if from_spans:  # the source took ranges before
            self.pieces.extend(split)
        else:  # the rest once the first answer shows the source takes ranges
            self.pieces.append(split[0])
            self.held_back = split[1:]

    def _held(self, size: int) -> tuple[list[list[int]], bool]:
        """What the partial holds, and whether its spans file said so (else: its contiguous start)."""
        if size > self.entry.size:
            os.ftruncate(self.fd, 0)
            size = 0
        try:
            with open(self.spans_path) as kept:
                spans = json.load(kept)
            return merged([[max(0, int(lo)), min(int(hi), size)] for lo, hi in spans]), True
        except (OSError, ValueError, TypeError):
            return ([[0, size]] if size else []), False

    def save_spans(self, force: bool = False) -> None:
        """The spans written so far beside the partial (pieces may land out of order), every
        SPANS_EVERY seconds: a download cut short resumes from them."""
        if not self.ranged or self.frontier is None:
            return
        now = time.monotonic()
        if not force and now - self._saved < SPANS_EVERY:
            return
        self._saved = now
        try:
            kept = self.spans_path + ".tmp"
            with open(kept, "w") as out:
                json.dump(self.frontier.held(), out)
            os.replace(kept, self.spans_path)
        except OSError:
            pass

    def close(self) -> None:
        if self.fd is not None:
            self.save_spans(force=True)
            os.close(self.fd)
            self.fd = None

    def finish(self) -> Outcome:
        """Verified and renamed into place (FetchError, the partial removed, if it is not the file)."""
        self.close()
        verify_or_remove(self.entry, self.frontier, self.partial)
        place(self.root, self.entry, self.partial)
        try:
            os.unlink(self.spans_path)
        except OSError:
            pass
        return Outcome(self.target, self.entry.size, self.moved, time.monotonic() - self.started,
                       resumed_from=self.resumed_from)


class Downloads:
    """Files into ``root``, ``streams`` GETs in flight across them (see the module docstring).

    ``on_chunk(index, offset, bytes)`` gets every byte of each file, the partial's and those of a
    file already in place too; ``progress(n)`` the size of each as it is handed on; ``stop()``
    ends it (FetchError "cancelled"); ``token(index, entry, refused)`` a bearer token for entries
    whose ``auth`` says the host brings its own (``refused``: its own was refused for this file)."""

    def __init__(self, root: str, on_chunk: Callable[[int, int, bytes], None] | None = None,
                 progress: Callable[[int], None] | None = None, stop: Callable[[], bool] | None = None,
                 timeout: float = TIMEOUT, streams: int = STREAMS,
                 token: Callable[[int, Entry, bool], str | None] | None = None) -> None:
        self.root = root
        self.on_chunk = on_chunk or (lambda index, at, data: None)
        self.progress = progress or (lambda n: None)
        self._stop = stop or (lambda: False)
        self.timeout = timeout
        self.streams = max(1, int(streams))
        self.token = token or (lambda index, entry, refused: None)
        self.outcomes: dict[int, Outcome] = {}
        self.error: FetchError | None = None
        self._todo: deque = deque()
        self._files: list[_File] = []
        self._cond = threading.Condition()
        self._opening = 0

    def stopped(self) -> bool:
        return self.error is not None or self._stop()

    def run(self, items: list[tuple[int, Entry]]) -> dict[int, Outcome]:
        """Each (index, entry) in place and verified; their outcomes by index. The first failure
        stops the rest (partials kept to resume) and is raised, with the bytes moved before it."""
        self._todo.extend(items)
        large = any(entry.size >= 2 * PIECE for _, entry in items)
        workers = [threading.Thread(target=self._work, daemon=True, name="tpunb-fetch-get")
                   for _ in range((self.streams if large else min(self.streams, len(items))) - 1)]
        for worker in workers:
            worker.start()
        self._work()
        for worker in workers:
            worker.join()
        for file in self._files:
            try:
                file.close()
            except OSError:
                pass
        if self.error is None and len(self.outcomes) < len(items):  # stopped between two pieces
            self.error = FetchError(f"stopped with {len(self.outcomes)} of {len(items)} files in place", "cancelled")
        if self.error is not None:
            self.error.moved = sum(f.moved for f in self._files)
            raise self.error
        return self.outcomes

    # -- the workers -----------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            file, span = job
            try:
                if span is None:
                    self._open(file)
                else:
                    self._fetch(file, *span)
                    self._piece_done(file)
            except FetchError as exc:
                self._fail(exc)
            except OSError as exc:
                self._fail(disk_error(file.entry, file.partial, exc, file.frontier.received if file.frontier else 0))

    def _next(self):
        """(file, span) of a piece to fetch, (file, None) for a file to open, None once all is done."""
        with self._cond:
            while True:
                if self.stopped():
                    self._cond.notify_all()
                    return None
                for file in self._files:
                    if file.pieces:
                        file.running += 1
                        return file, file.pieces.popleft()
                if self._todo:
                    index, entry = self._todo.popleft()
                    self._opening += 1
                    return _File(index, entry, self.root), None
                if not self._opening and not any(f.running for f in self._files):
                    self._cond.notify_all()
                    return None
                self._cond.wait(0.5)

    def _fail(self, exc: FetchError) -> None:
        with self._cond:
            self.error = self.error or exc
            self._cond.notify_all()

    def _open(self, file: _File) -> None:
        """A file taken up: already there (its bytes handed on if anyone wants them), else opened
        with its pieces queued."""
        started = time.monotonic()
        try:
            if already_there(self.root, file.entry):
                self._hand_existing(file)
                self.outcomes[file.index] = Outcome(file.target, file.entry.size, 0, time.monotonic() - started,
                                                    already=True)
                return
            try:
                file.open(lambda at, data: self.on_chunk(file.index, at, data), self.progress)
            except OSError as exc:
                raise disk_error(file.entry, file.partial, exc, 0) from None
            with self._cond:
                self._files.append(file)
                file.running += 1  # held until its first pieces are queued
            self._piece_done(file)
        finally:
            with self._cond:
                self._opening -= 1
                self._cond.notify_all()

    def _hand_existing(self, file: _File) -> None:
        with open(file.target, "rb") as held:
            at = 0
            for piece in iter(lambda: held.read(CHUNK), b""):
                if self.stopped():
                    raise FetchError(f"{file.entry.path}: stopped", "cancelled")
                self.on_chunk(file.index, at, piece)
                self.progress(len(piece))
                at += len(piece)

    def _piece_done(self, file: _File) -> None:
        with self._cond:
            file.running -= 1
            done = not file.running and not file.pieces and not file.held_back
            self._cond.notify_all()
        if done:
            self.outcomes[file.index] = file.finish()

    def _release(self, file: _File) -> None:
        """The source took the first Range: the file's other pieces may go."""
        with self._cond:
            file.pieces.extend(file.held_back)
            file.held_back = []
            self._cond.notify_all()

    def _fetch(self, file: _File, lo: int, hi: int) -> None:
        """Bytes [lo, hi) of ``file`` into its partial, retried and resumed as the source allows."""
        entry = file.entry
        whole = hi == entry.size and not file.ranged  # one GET to the end: "bytes=lo-" (or none)
        tries = _Tries(entry, self.stopped, lambda: f"{file.frontier.received:,} of {entry.size:,} bytes in "
                                                    f"{file.partial}")
        reached = [lo]  # where the bytes landed so far: a broken GET resumes there

        def sink(at: int, data: bytes) -> None:
            self._landed(file, at, data)
            reached[0] = at + len(data)

        while reached[0] < hi:
            before = lo = reached[0]
            try:
                response = _open(entry, self.token(file.index, entry, file.refused), lo, None if whole else hi,
                                 self.timeout)
                with response:
                    if response.status == 206:
                        if file.held_back:
                            self._release(file)
                    elif file.ranged and lo == 0 and not file.frontier.received:  # no ranges: one stream
                        self._unrange(file)
                        hi, whole = entry.size, True
                    elif lo:  # the source ignored the Range
                        raise _NoRanges(response)
                    _read_into(entry, response, lo, hi, sink, self.stopped, tries.where)
            except _Busy as busy:
                tries.on_busy(busy)
            except _NoRanges:
                self._restart(file)  # from the first byte, in one stream
                return
            except _Refused:
                if not entry.auth or file.refused:
                    raise
                file.refused = True  # the host's own credentials were refused: the kernel's, for this file
            except (http.client.HTTPException, ConnectionError, TimeoutError) as exc:
                tries.on_broken(exc, reached[0] > before)

    def _unrange(self, file: _File) -> None:
        """The source answered the first piece with the whole file: no other piece will go."""
        with self._cond:
            file.held_back, file.ranged = [], False
        try:
            os.unlink(file.spans_path)
        except OSError:
            pass

    def _restart(self, file: _File) -> None:
        """A source that ignores Range: the file from its first byte, in one stream."""
        self._unrange(file)
        os.ftruncate(file.fd, 0)
        file.frontier = Frontier(file.entry, file.fd)
        with self._cond:
            file.pieces.clear()
            file.pieces.append((0, file.entry.size))
            self._cond.notify_all()

    def _landed(self, file: _File, at: int, data: bytes) -> None:
        try:
            write_at(file.fd, data, at)
        except OSError as exc:
            raise disk_error(file.entry, file.partial, exc, file.frontier.received) from None
        file.frontier.landed(at, data)
        with file._lock:
            file.moved += len(data)
        file.save_spans()
        self.on_chunk(file.index, at, data)
        self.progress(len(data))


def download(entry: Entry, root: str, on_chunk: Callable[[int, bytes], None] | None = None,
             progress: Callable[[int], None] | None = None, stop: Callable[[], bool] | None = None,
             timeout: float = TIMEOUT, streams: int = STREAMS) -> Outcome:
    """Fetch ``entry`` to ``root/entry.path``: nothing moves if it is already there and verified;
    else into ``.partial`` (resumed from what it holds), each chunk handed to ``on_chunk(offset,
    bytes)`` as it lands (the bytes the partial held first, too, so a stream sees the whole file)
    and its size to ``progress``, then verified and renamed. FetchError (one line) on any
    failure; a failed verification removes the partial, a full disk or a broken connection keeps it."""
    hand = (lambda index, at, data: on_chunk(at, data)) if on_chunk else None
    return Downloads(root, hand, progress, stop, timeout, streams).run([(0, entry)])[0]


def fetch_all(entries: list[dict], root: str, progress: Callable[[int], None] | None = None,
              stop: Callable[[], bool] | None = None, streams: int = STREAMS) -> dict:
    """Every entry (as ``Entry.to_wire`` gives them) downloaded to ``root``, several at once, as a
    host that fetches on its own does; what it did, for a reply frame: files, bytes moved, files
    already there, seconds. The first FetchError ends it (the files finished before it stay)."""
    started = time.monotonic()
    done = Downloads(root, progress=progress, stop=stop, streams=streams).run(
        [(i, Entry.from_wire(w)) for i, w in enumerate(entries)])
    return {"files": len(entries), "moved": sum(o.moved for o in done.values()),
            "already": sum(o.already for o in done.values()), "seconds": time.monotonic() - started}


def stream(entry: Entry, on_chunk: Callable[[int, bytes], None], stop: Callable[[], bool] | None = None,
           timeout: float = TIMEOUT) -> int:
    """Every byte of ``entry`` handed to ``on_chunk(offset, bytes)`` in order, verified as it
    passes, written nowhere (the kernel's fallback, which must not hold a model on its disk); a
    broken connection resumes with a Range from the last byte handed on. The bytes moved."""
    from .fetch import Checker

    checker, stop = Checker(entry), stop or (lambda: False)
    state = {"at": 0}

    def sink(at: int, data: bytes) -> None:
        checker.update(data)
        on_chunk(at, data)
        state["at"] = at + len(data)

    tries = _Tries(entry, stop, lambda: f"{state['at']:,} of {entry.size:,} bytes handed on")
    while state["at"] < entry.size:
        before = state["at"]
        try:
            with _open(entry, None, before, None, timeout) as response:
                if before and response.status != 206:
                    raise FetchError(f"{entry.path}: {bare(entry.url)} ignores Range requests, and {before:,} bytes "
                                     "were handed on already: fetch again", "source")
                _read_into(entry, response, before, entry.size, sink, stop, tries.where)
        except _Busy as busy:
            tries.on_busy(busy)
        except (http.client.HTTPException, ConnectionError, TimeoutError) as exc:
            tries.on_broken(exc, state["at"] > before)
    wrong = checker.mismatch()
    if wrong:
        raise FetchError(f"{entry.path}: verification failed, {wrong}: fetch again (the source changed or the "
                         "bytes were damaged on the way)", "verify")
    return state["at"]
