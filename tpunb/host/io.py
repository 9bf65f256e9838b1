"""The agent's plumbing: the frame channel, the output pump that captures fds 1 and 2, no stdin.

Shipped to hosts: standard library only (see the package docstring).
"""
from __future__ import annotations

import codecs
import collections
import fcntl
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
#: print() output waits this long in the process before reaching fd 1/2 while output flows...
FLUSH_INTERVAL = 0.005
#: ... and at most this long after a pause (then it sleeps until the next write); or until this
#: many bytes are waiting
IDLE_INTERVAL = 0.05
FLUSH_CHARS = 1 << 16

_SIGNAL_THREAD_MASK = {signal.SIGINT, signal.SIGTERM}


def quiet_thread(target, name: str, *args) -> threading.Thread:
    """A daemon thread that never receives SIGINT, so interrupts always reach the main thread."""

    def run() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNAL_THREAD_MASK)
        target(*args)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def _widen_pipe(fd: int, size: int = 1 << 20) -> None:
    """A pushed value arrives in 2 MB parts: a 1 MB pipe (Linux; not a socket) takes a sixteenth of
    the reads a 64 KB one does."""
    if not sys.platform.startswith("linux"):
        return
    try:
        fcntl.fcntl(fd, 1031, size)  # F_SETPIPE_SZ
    except (OSError, ValueError):
        pass


class Channel:
    """Frames in on one fd, frames out on another; sends are atomic across threads. One thread at
    a time receives (``tpunb_host.inbox`` says which)."""

    def __init__(self, in_fd: int, out_fd: int) -> None:
        self.in_fd, self.out_fd = in_fd, out_fd
        _widen_pipe(in_fd)
        self._lock = threading.Lock()
        self._cutter = protocol.FrameCutter()
        self._frames: collections.deque = collections.deque()  # cut, not yet taken
        self._poller = select.poll()
        self._poller.register(in_fd, select.POLLIN)
        self.fast = False  # marshal frames out, once the kernel said it reads them (see protocol)
        self.sent_at = time.monotonic()  # the heartbeat stays quiet while other frames flow

    def send(self, message: dict, blob: bytes = b"") -> None:
        head = protocol.encode_head(message, len(blob), self.fast)
        data = memoryview(head + blob) if len(blob) < 65536 else None  # a large blob is not copied
        with self._lock:
            if data is None:
                _write_all(self.out_fd, memoryview(head))
                _write_all(self.out_fd, memoryview(blob).cast("B"))
            else:
                _write_all(self.out_fd, data)
            self.sent_at = time.monotonic()

    def place_blobs(self, place) -> None:
        """Large blobs go where ``place(message, blob_len)`` says (see ``protocol.FrameCutter``)."""
        self._cutter.place = place

    def heartbeat(self, interval: float) -> None:
        """From a side thread, a ``beat`` frame whenever nothing was sent for ``interval`` seconds
        (0: none): the session takes a host that stays silent for several intervals as frozen (the
        process stopped, its connection dead), so beats go on while user code runs on the main
        thread. Called again, it changes the interval."""
        started = getattr(self, "beat_interval", None) is not None
        self.beat_interval = interval
        if started:
            return

        def beat() -> None:
            while True:
                interval = self.beat_interval
                time.sleep(max(0.05, self.sent_at + interval - time.monotonic()) if interval > 0 else 0.5)
                if interval > 0 and time.monotonic() - self.sent_at >= interval:
                    try:
                        self.send({"op": "beat"})
                    except OSError:
                        return

        quiet_thread(beat, "tpunb-heartbeat")

    def recv(self) -> tuple[dict, bytes] | None:
        """The next frame, waiting for it; None at the end of the stream (EOFError inside a frame)."""
        while not self._frames:
            if not self._read():
                return None
        return self._frames.popleft()

    def recv_ready(self) -> list[tuple[dict, bytes]] | None:
        """The frames that can be had without waiting; None at the end of the stream."""
        while self._poller.poll(0):
            if not self._read():
                return None
        frames = list(self._frames)
        self._frames.clear()
        return frames

    def has_frames(self) -> bool:
        """A whole frame is read but not taken, or bytes wait to be read."""
        return bool(self._frames) or bool(self._poller.poll(0))

    def _read(self) -> bool:
        target = self._cutter.target()
        if target is not None:  # a large blob read straight to where it belongs
            n = os.readv(self.in_fd, [target])
            if not n:
                raise EOFError("the session's stream ended inside a frame")
            self._frames.extend(self._cutter.filled(n))
            return True
        data = os.read(self.in_fd, max(1 << 16, self._cutter.missing))
        if not data:
            if self._cutter.inside_frame:
                raise EOFError("the session's stream ended inside a frame")
            return False
        self._frames.extend(self._cutter.feed(data))
        return True


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        data = data[os.write(fd, data):]


class _FdWriter(io.RawIOBase):
    """fd 1 or 2 as a raw stream that notes when it was written to (for ``Flusher``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.wrote = False
        #: written since the last cell started (by any thread): the pump may not have read it yet
        self.since_cell = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, data) -> int:
        self.wrote = self.since_cell = True
        return os.write(self.fd, data)


class Flusher:
    """sys.stdout/stderr on a host, block-buffered, flushed by a thread: FLUSH_INTERVAL after
    output while it flows, backing off to IDLE_INTERVAL, then sleeping until the next write. A
    line-buffered stream makes one system call per print(), most of the cost of printing a
    million lines.

    The thread sleeps until a stream is written to: the first write after a quiet spell goes
    through a hook that wakes it and then steps aside (later writes go straight to the buffer).
    A cell that prints nothing wakes no thread, and an idle host none at all: on a 256-host
    simulated slice, waking it at every cell's start was a tenth of each cell's CPU."""

    def __init__(self, *fds: int) -> None:
        self.raws = [_FdWriter(fd) for fd in fds]
        self.streams = [io.TextIOWrapper(io.BufferedWriter(raw, FLUSH_CHARS), encoding="utf-8",
                                         errors="backslashreplace") for raw in self.raws]
        self._wake = threading.Event()
        self._arm()
        os.register_at_fork(before=self.flush)  # a forked child must not write our buffers again
        quiet_thread(self._run, "tpunb-flush")

    def _arm(self) -> None:
        """Route each stream's next write through a hook that wakes the thread."""
        for stream in self.streams:
            write = type(stream).write.__get__(stream)

            def first_write(text, stream=stream, write=write):
                stream.write = write  # in the instance: print() finds it before the type's method
                self._wake.set()
                return write(text)

            stream.write = first_write

    def flush(self) -> bool:
        """Flush every stream; whether anything was written."""
        wrote = False
        for raw, stream in zip(self.raws, self.streams):
            raw.wrote = False
            try:
                stream.flush()
            except Exception:
                pass
            wrote = wrote or raw.wrote
        return wrote

    def flush_before_cell(self) -> bool:
        """Flush every stream; whether anything reached fds 1 and 2 since the last cell started,
        by this flush or the thread's (which ``flush`` alone would not tell): the pump must read
        it before the next cell's output begins, or it is tagged as that cell's."""
        self.flush()
        wrote = False
        for raw in self.raws:
            wrote = wrote or raw.since_cell
            raw.since_cell = False
        return wrote

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            self._pace()

    def _pace(self) -> None:
        """Flush while output flows, backing off when it pauses; once it stopped, re-arm the hook
        and look once more (a write between the last flush and the hook went straight in)."""
        interval = FLUSH_INTERVAL
        while True:
            time.sleep(interval)
            if self.flush():
                interval = FLUSH_INTERVAL
            elif interval < IDLE_INTERVAL:
                interval = min(IDLE_INTERVAL, interval * 2)
            else:
                self._arm()
                if not self.flush():
                    return
                interval = FLUSH_INTERVAL


#: runtime noise lines are short: a longer partial line is the user's, sent as it comes (holding
#: it back until its newline would copy a 20 MB line once per 64 kB read)
NOISE_LINE_CHARS = 4096


class OutputPump:
    """Turns everything written to fds 1 and 2 into stream frames tagged with the running cell.

    With a noise filter, Python's own sys.stdout and sys.stderr write to pipes of their own
    (``python_fds``), apart from fds 1 and 2 where the runtime's C++ threads write: a print that
    landed between the pieces of a noise line made one line with it, dropped whole (a user's line
    lost). The runtime and subprocesses still write to fds 1 and 2, and only those are filtered."""

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
        self._streams: dict[int, tuple[str, codecs.IncrementalDecoder]] = {}
        #: where sys.stdout and sys.stderr write (registered first: read first when both have output)
        self.python_fds = (1, 2) if self.drop is None else tuple(self._add(name)[1] for name in ("stdout", "stderr"))
        self._filtered = set()  # the read ends of fds 1 and 2
        for fd, name in ((1, "stdout"), (2, "stderr")):
            read_fd, write_fd = self._add(name)
            os.dup2(write_fd, fd)
            os.close(write_fd)
            self._filtered.add(read_fd)
        self._ready = self._poller()  # drain's own, never waited on
        quiet_thread(self._run, "tpunb-pump")

    def _add(self, name: str) -> tuple[int, int]:
        """A pipe whose output is sent as ``name``: (its read end, its write end)."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        self._streams[read_fd] = (name, codecs.getincrementaldecoder("utf-8")("replace"))
        return read_fd, write_fd

    def _poller(self) -> "select.poll":
        poller = select.poll()
        for fd in self._streams:
            poller.register(fd, select.POLLIN)
        return poller

    def _run(self) -> None:
        poller = self._poller()
        while True:
            for fd, _ in poller.poll():
                with self._lock:
                    self._read(fd)

    def _filter(self, fd: int, text: str, final: bool) -> str:
        """Drop whole lines matching ``drop``; hold back a partial line that may become one (not a
        progress line rewritten with \r: it is shown as it comes).

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
        if (tail and not final and "\r" not in tail and len(tail) < NOISE_LINE_CHARS
                and self.drop.search(tail + " Rank peer ranks")):
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
        """Send what is in the pipe, in frames of at most MAX_TEXT characters: a burst of output
        becomes a few large frames, and no output, however large, makes a frame too big to send."""
        name, decoder = self._streams[fd]
        while True:
            parts, size = [], 0
            while size < protocol.MAX_TEXT:
                try:
                    data = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                if not data:
                    break
                parts.append(decoder.decode(data))
                size += len(parts[-1])
            text = "".join(parts)
            if fd in self._filtered and self.drop is not None:
                text = self._filter(fd, text, final)
            for start in range(0, len(text), protocol.MAX_TEXT):
                self.channel.send({"op": "stream", "id": self.cell_id, "name": name,
                                   "text": text[start:start + protocol.MAX_TEXT]})
            if size < protocol.MAX_TEXT:
                return

    def drain(self) -> None:
        """Send whatever is already written; called when a cell ends, before its ``done``."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        with self._lock:
            ready = {fd for fd, _ in self._ready.poll(0)}  # most cells print nothing: skip the reads
            for fd in self._streams:
                if fd in ready or fd in self._held:
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


