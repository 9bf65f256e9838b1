"""A fetched file arriving as chunks at offsets (a relay's stream, ``fetch.download``'s
``on_chunk`` on another host): written into ``PATH.partial`` by a thread of its own, then verified
and renamed into place as a download is.

Shipped to hosts: standard library only (see the package docstring).
"""
from __future__ import annotations

import os
import queue
import threading
import time

from .fetch import Entry, FetchError, Frontier, Outcome, disk_error, place, target_of, verify_or_remove, write_at

#: bytes a Receiver holds for its writer before ``put`` waits (the relay then slows to the disk)
QUEUE_BYTES = 64 << 20


class Receiver:
    """One file arriving as chunks at offsets (a relay's stream): written into ``PATH.partial`` by a
    thread of its own, so the caller (a socket reader) never waits on the disk unless ``QUEUE_BYTES``
    are already waiting; ``finish`` verifies it and renames it into place."""

    def __init__(self, entry: Entry, root: str, max_queued: int = QUEUE_BYTES) -> None:
        self.entry, self.root = entry, root
        self.target = target_of(root, entry)
        self.partial = self.target + ".partial"
        self.max_queued = max_queued
        self.received = 0
        self.error: FetchError | None = None
        self._started = time.monotonic()
        self._queue: queue.Queue = queue.Queue()
        self._queued = 0
        self._cond = threading.Condition()
        try:
            os.makedirs(os.path.dirname(self.target), exist_ok=True)
            self._fd = os.open(self.partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise disk_error(entry, self.partial, exc, 0) from None
        self._frontier = Frontier(entry, self._fd)  # hashed in order as the chunks land, in any order
        self._thread = threading.Thread(target=self._write_loop, daemon=True, name="tpunb-fetch-writer")
        self._thread.start()

    def put(self, offset: int, data: bytes) -> None:
        """Queue ``data`` for ``offset``; waits only while the writer is ``max_queued`` behind.
        FetchError once writing failed (a full disk): the sender can stop."""
        if offset < 0 or offset + len(data) > self.entry.size:
            raise FetchError(f"{self.entry.path}: a chunk at {offset:,} of {len(data):,} bytes is outside the "
                             f"file's {self.entry.size:,} bytes", "verify")
        if not data:
            return
        with self._cond:
            while self._queued >= self.max_queued and self.error is None:
                self._cond.wait(1.0)
            if self.error is not None:
                raise self.error
            self._queued += len(data)
        self._queue.put((offset, data))

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            offset, data = item
            try:
                if self.error is None:
                    write_at(self._fd, data, offset)
                    self._frontier.landed(offset, data)
                    self.received = self._frontier.received
            except FetchError as exc:
                self.error = exc
            except OSError as exc:
                self.error = disk_error(self.entry, self.partial, exc, self.received)
            finally:
                with self._cond:
                    self._queued -= len(data)
                    self._cond.notify_all()

    def finish(self, timeout: float = 600.0) -> Outcome:
        """Wait for the writer, then verify and rename; FetchError if a byte is missing, writing
        failed (the partial kept) or the file is not what its entry says (the partial removed)."""
        self._queue.put(None)
        self._thread.join(timeout)
        try:
            if self._thread.is_alive():
                raise FetchError(f"{self.entry.path}: the disk took over {timeout:.0f} s to write "
                                 f"{self.partial}", "disk")
            if self.error is not None:
                raise self.error
            if not self._frontier.complete:
                raise FetchError(f"{self.entry.path}: only {self.received:,} of {self.entry.size:,} bytes arrived "
                                 f"(kept in {self.partial}): fetch again", "network")
            self._frontier.mismatch()  # hashes what is still unhashed, while the file is open
        finally:
            self._close()
        verify_or_remove(self.entry, self._frontier, self.partial)
        place(self.root, self.entry, self.partial)
        return Outcome(self.target, self.entry.size, self.received, time.monotonic() - self._started)

    def abort(self) -> None:
        """Give up: the writer stops, the partial stays (a later fetch starts it over)."""
        self.error = self.error or FetchError(f"{self.entry.path}: the transfer was given up", "cancelled")
        if self._fd is None:
            return
        self._queue.put(None)
        self._thread.join(10.0)
        self._close()

    def _close(self) -> None:
        if self._fd is not None and not self._thread.is_alive():
            os.close(self._fd)
            self._fd = None
