"""One thread reads the frames of every host whose stream is a file descriptor (local host processes).

A reader thread per host made the kernel's work per cell grow with the slice at pod scale: on 256
hosts, 256 threads each woke for a reply, took the GIL, made two or three system calls per frame
and queued behind each other for the GIL. Here one thread waits in the selector (epoll) and,
for every host that has bytes, makes one non-blocking read of at most ``CHUNK`` bytes, so a
host streaming megabytes cannot starve the others, cuts whole frames out of that host's bytes
and hands them on in order. Streams that are not file descriptors (paramiko channels) keep a
thread per host in the session.
"""
from __future__ import annotations

import os
import selectors
import threading
from typing import Callable

from tpunb.errors import TransportError
from tpunb.host.protocol import FrameCutter, Frames

#: the most bytes read from one host before the other ready hosts get their turn
CHUNK = 1 << 18

class Stream:
    """One host's registration: where its frames and its end go."""

    def __init__(self, fd: int, on_frames: Callable[[Frames], None], on_end: Callable[[str], None]) -> None:
        self.fd = fd
        self.on_frames = on_frames  # called after every read, with the frames it completed (maybe none)
        self.on_end = on_end  # called once at the end of the stream: "" when clean, else why it broke
        self.cutter = FrameCutter()
        self.active = True


class FanIn:
    """The selector thread of one session and the streams it reads; ``close`` ends the thread.

    ``remove`` guarantees that no read of that fd happens after it returns, so the owner may close
    the fd then (a closed fd's number can be reused by the next host's pipe)."""

    def __init__(self, name: str = "tpunb-fanin") -> None:
        self.name = name
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()  # held from "still registered?" to the read itself
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, fd: int, on_frames: Callable[[Frames], None], on_end: Callable[[str], None]) -> Stream:
        """Read ``fd`` (made non-blocking) from now on."""
        os.set_blocking(fd, False)
        stream = Stream(fd, on_frames, on_end)
        with self._lock:
            if self._closed:
                raise TransportError("this slice's host sessions were closed")
            self._selector.register(fd, selectors.EVENT_READ, stream)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name=self.name)
                self._thread.start()
        return stream

    def remove(self, stream: Stream) -> bool:
        """Stop reading ``stream``; False if it had already ended. Its ``on_end`` is not called."""
        with self._lock:
            return self._drop(stream)

    def _drop(self, stream: Stream) -> bool:
        if not stream.active:
            return False
        stream.active = False
        try:
            self._selector.unregister(stream.fd)
        except (KeyError, ValueError):
            pass
        return True

    def close(self) -> None:
        """Stop reading. A stream still registered (a host started while its session closed) is
        ended, so whoever waits on it (a handshake) hears so now, not at its timeout."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            dropped = [key.data for key in list(self._selector.get_map().values())
                       if key.data is not None and self._drop(key.data)]
            running = self._thread is not None
        if running:
            os.write(self._wake_w, b"x")  # the thread wakes, sees _closed and releases everything
        else:
            self._release()
        for stream in dropped:
            stream.on_end("its slice's host sessions were closed")

    def _release(self) -> None:
        self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    def _run(self) -> None:
        try:
            while not self._closed:
                for stream, frames, ended in self._read_ready(self._selector.select()):
                    if ended is None:
                        try:
                            stream.on_frames(frames)
                            continue
                        except Exception as exc:  # one host's bad frame must not stop every host's reading
                            if not self.remove(stream):
                                continue
                            ended = f"broken stream: {type(exc).__name__}: {exc}"
                    stream.on_end(ended)
        finally:
            self._release()

    def _read_ready(self, events) -> list[tuple[Stream, Frames, str | None]]:
        """One read of each ready stream, under the lock; frames are handed on outside it."""
        out = []
        with self._lock:
            for key, _ in events:
                stream = key.data
                if stream is None:
                    try:
                        os.read(self._wake_r, 4096)
                    except OSError:
                        pass
                    continue
                if not stream.active:
                    continue
                try:
                    data = os.read(stream.fd, CHUNK)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    self._drop(stream)
                    out.append((stream, [], f"broken stream: {exc}"))
                    continue
                if not data:
                    self._drop(stream)
                    out.append((stream, [], "broken stream: stream ended inside a frame"
                                if stream.cutter.inside_frame else ""))
                    continue
                try:
                    out.append((stream, stream.cutter.feed(data), None))
                except ValueError as exc:
                    self._drop(stream)
                    out.append((stream, [], f"broken stream: {exc}"))
        return out
