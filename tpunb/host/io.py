"""The agent's plumbing: the frame channel, the output pump that captures fds 1 and 2, no stdin.

Shipped to hosts: standard library only (see the package docstring).
"""
from __future__ import annotations

import codecs
import io
import os
import re
import select
import signal
import sys
import threading
import time

from . import protocol

NOISE_WINDOW = 1.0  # seconds after a noise line during which a bare fragment of it is noise too

_SIGNAL_THREAD_MASK = {signal.SIGINT, signal.SIGTERM}


def quiet_thread(target, name: str, *args) -> threading.Thread:
    """A daemon thread that never receives SIGINT, so interrupts always reach the main thread."""

    def run() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNAL_THREAD_MASK)
        target(*args)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


class Channel:
    """Frames in on one fd, frames out on another; sends are atomic across threads."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self.in_fd, self.out_fd = in_fd, out_fd
        self._lock = threading.Lock()
        self._buf = bytearray()

    def send(self, message: dict, blob: bytes = b"") -> None:
        data = memoryview(protocol.encode(message, blob))
        with self._lock:
            while data:
                data = data[os.write(self.out_fd, data):]

    def read_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = os.read(self.in_fd, max(65536, n - len(self._buf)))
            if not chunk:
                break
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def recv(self):
        return protocol.read_frame(self.read_exact)


class OutputPump:
    """Turns everything written to fds 1 and 2 into stream frames tagged with the running cell."""

    def __init__(self, channel: Channel, drop: str | None = None, fragments: str | None = None) -> None:
        self.channel = channel
        self.cell_id = None
        self.drop = re.compile(drop) if drop else None  # noise the host runtime prints (simulated slices)
        #: pieces of that noise: C++ threads interleave their writes, leaving bits such as "7" on a
        #: line of their own; dropped only just after a noise line
        self.fragments = re.compile(fragments) if fragments else None
        self._noise_at = float("-inf")
        self._held: dict = {}
        self._dropping: dict = {}  # fd -> the rest of a dropped partial line is still to come
        self._lock = threading.Lock()
        self._streams = {}
        for fd, name in ((1, "stdout"), (2, "stderr")):
            read_fd, write_fd = os.pipe()
            os.dup2(write_fd, fd)
            os.close(write_fd)
            os.set_blocking(read_fd, False)
            self._streams[read_fd] = (name, codecs.getincrementaldecoder("utf-8")("replace"))
        quiet_thread(self._run, "tpunb-pump")

    def _run(self) -> None:
        poller = select.poll()
        for fd in self._streams:
            poller.register(fd, select.POLLIN)
        while True:
            for fd, _ in poller.poll():
                with self._lock:
                    self._read(fd)

    def _filter(self, fd: int, text: str, final: bool) -> str:
        """Drop whole lines matching ``drop``; hold back a partial line that may become one.

        A partial noise line dropped at a cell's end (``final``) leaves its rest, often just the
        newline, for the next read: that rest is dropped too, never shown as an empty line."""
        text = self._held.pop(fd, "") + text
        if self._dropping.pop(fd, False):
            _, newline, text = text.partition("\n")
            if not newline:
                self._dropping[fd] = True
                return ""
        lines = text.split("\n")
        tail = lines.pop()
        if tail and not final and self.drop.search(tail + " Rank peer ranks"):
            self._held[fd] = tail
            tail = ""
        kept = [line + "\n" for line in lines if not self._noise(line)]
        if tail:
            if self._noise(tail):
                self._dropping[fd] = True
            else:
                kept.append(tail)
        return "".join(kept)

    def _noise(self, line: str) -> bool:
        if self.drop.search(line):
            self._noise_at = time.monotonic()
            return True
        return (self.fragments is not None and time.monotonic() - self._noise_at < NOISE_WINDOW
                and self.fragments.fullmatch(line) is not None)

    def _read(self, fd: int, final: bool = False) -> None:
        name, decoder = self._streams[fd]
        parts = []
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not data:
                break
            parts.append(decoder.decode(data))
        text = "".join(parts)
        if self.drop is not None:
            text = self._filter(fd, text, final)
        if text:
            self.channel.send({"op": "stream", "id": self.cell_id, "name": name, "text": text})

    def drain(self) -> None:
        """Send whatever is already written; called when a cell ends, before its ``done``."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        with self._lock:
            for fd in self._streams:
                self._read(fd, final=True)


class StdinUnavailable(OSError):
    """Raised by input() on a host; runners show only its message, not the agent's frames."""


class NoStdin(io.TextIOBase):
    """Hosts have no terminal: reading stdin explains what to do instead of hanging."""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> str:
        raise StdinUnavailable("tpunb hosts have no stdin: send values with %tpu_push or Slice.push")

    readline = read


