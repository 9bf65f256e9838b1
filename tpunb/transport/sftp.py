"""A small pipelined SFTP v3 client on a stream (a paramiko channel, a program's stdin/stdout), for bulk uploads.

paramiko's SFTPClient waits for a reply on every open and close and sends every request as its
own SSH packet; for a tree of small files that is slower than rsync. Here requests are queued
without waiting (OpenSSH's sftp-server answers them strictly in order) and go out in 256 KiB
channel writes, and a reader thread matches replies to requests. Only what tpunb's sync needs
is implemented.
"""
from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass

from tpunb.errors import TransportError
from tpunb.transport.seam import read_exact
from tpunb.transport.streams import Stream

# request types (draft-ietf-secsh-filexfer-02, version 3)
INIT, VERSION, OPEN, CLOSE, READ, WRITE, LSTAT = 1, 2, 3, 4, 5, 6, 7
FSETSTAT, MKDIR, REMOVE, STAT, RENAME, EXTENDED = 10, 14, 13, 17, 18, 200
STATUS, HANDLE, DATA, ATTRS_REPLY = 101, 102, 103, 105
OK, EOF, NO_SUCH_FILE = 0, 1, 2
READ_FLAG, WRITE_FLAG, CREATE, TRUNCATE = 0x1, 0x2, 0x8, 0x10
ATTR_SIZE, ATTR_UIDGID, ATTR_PERMISSIONS, ATTR_TIMES, ATTR_EXTENDED = 0x1, 0x2, 0x4, 0x8, 0x80000000


def _string(data: bytes | str) -> bytes:
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")  # file names that are not UTF-8 survive
    return struct.pack("!I", len(data)) + data


def attrs(mode: int | None = None, times: tuple[int, int] | None = None) -> bytes:
    """SFTP ATTRS with permissions and/or (atime, mtime) in whole seconds."""
    flags, body = 0, b""
    if mode is not None:
        flags |= ATTR_PERMISSIONS
        body += struct.pack("!I", mode)
    if times is not None:
        flags |= ATTR_TIMES
        body += struct.pack("!II", *times)
    return struct.pack("!I", flags) + body


@dataclass
class Stat:
    size: int | None
    mode: int | None
    mtime: int | None


def _parse_attrs(data: bytes, pos: int = 0) -> Stat:
    (flags,), pos = struct.unpack_from("!I", data, pos), pos + 4
    size = mode = mtime = None
    if flags & ATTR_SIZE:
        (size,), pos = struct.unpack_from("!Q", data, pos), pos + 8
    if flags & ATTR_UIDGID:
        pos += 8
    if flags & ATTR_PERMISSIONS:
        (mode,), pos = struct.unpack_from("!I", data, pos), pos + 4
    if flags & ATTR_TIMES:
        _, mtime = struct.unpack_from("!II", data, pos)
    return Stat(size, mode, mtime)


class Reply:
    """One outstanding request; ``wait()`` gives (reply type, payload after the request id)."""

    __slots__ = ("_sftp", "event", "kind", "payload", "what")

    def __init__(self, sftp: PipelinedSFTP, what: str) -> None:
        self.event = threading.Event()
        self.what = what
        self.kind = 0
        self.payload = b""
        self._sftp = sftp

    def wait(self) -> tuple[int, bytes]:
        if not self.event.is_set():
            self._sftp.flush()
            self.event.wait()
        return self.kind, self.payload

    def status(self) -> tuple[int, str]:
        """(status code, message) of a STATUS reply; (OK, '') for any other successful reply."""
        kind, payload = self.wait()
        if kind != STATUS:
            return OK, ""
        code, msg_len = struct.unpack_from("!II", payload)
        return code, payload[8:8 + msg_len].decode(errors="replace")


class _Batch:
    """Many replies collected without an Event each (stat of every file of a tree)."""

    def __init__(self, n: int) -> None:
        self.results: list[tuple[int, bytes]] = [(-1, b"")] * n
        self.left = n
        self.done = threading.Event()
        if not n:
            self.done.set()

    def fill(self, index: int, kind: int, payload: bytes) -> None:
        self.results[index] = (kind, payload)
        self.left -= 1  # only the reader thread fills
        if not self.left:
            self.done.set()


class PipelinedSFTP:
    """SFTP requests queued back to back and sent in large writes; failures of requests nobody
    waits for are collected in ``errors``."""

    FLUSH_AT = 256 * 1024  # bytes queued before they go out without being asked for
    WRITE_CHUNK = 64 * 1024  # data per WRITE; OpenSSH's sftp-server takes up to 256 KiB

    def __init__(self, channel: Stream, label: str) -> None:
        self.channel = channel
        self.label = label
        self.errors: list[str] = []
        self._pending: dict[int, Reply | str | tuple[_Batch, int]] = {}
        self._lock = threading.Lock()  # request ids and the pending table (the reader takes it)
        self._send_lock = threading.Lock()  # the outgoing queue; sending may block on the window
        self._out = bytearray()
        self._next_id = 0
        self._idle = threading.Condition(self._lock)
        self._out += struct.pack("!IBI", 5, INIT, 3)
        self.flush()
        header = read_exact(channel.recv, 4)
        body = read_exact(channel.recv, struct.unpack("!I", header)[0]) if len(header) == 4 else None
        if not body or body[0] != VERSION:
            raise TransportError(f"{label}: the SFTP server did not answer: is the sftp subsystem enabled?")
        self.extensions = body[5:]
        self._reader = threading.Thread(target=self._read_replies, daemon=True, name=f"tpunb-sftp-{label}")
        self._reader.start()

    # -- wire -----------------------------------------------------------------------------------

    def flush(self) -> None:
        """Send everything queued."""
        with self._send_lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if not self._out:
            return
        data, self._out = bytes(self._out), bytearray()
        try:
            self.channel.sendall(data)
        except OSError as exc:
            raise TransportError(f"{self.label}: connection lost during SFTP ({exc}): reconnect") from None

    def _read_replies(self) -> None:
        buf = bytearray()
        while True:
            try:
                chunk = self.channel.recv(1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            pos, replies = 0, []
            while len(buf) - pos >= 9:
                length, kind, request_id = struct.unpack_from("!IBI", buf, pos)
                if len(buf) - pos - 4 < length:
                    break
                replies.append((request_id, kind, bytes(buf[pos + 9:pos + 4 + length])))
                pos += 4 + length
            del buf[:pos]
            with self._lock:
                waiters = [self._pending.pop(request_id, None) for request_id, _, _ in replies]
                if not self._pending:
                    self._idle.notify_all()
            for waiter, (_, kind, payload) in zip(waiters, replies):
                self._deliver(waiter, kind, payload)
        with self._lock:  # connection gone: release everyone still waiting
            pending, self._pending = self._pending, {}
            self._idle.notify_all()
        for waiter in pending.values():
            self._deliver(waiter, -1, b"")

    def _deliver(self, waiter, kind: int, payload: bytes) -> None:
        if isinstance(waiter, Reply):
            waiter.kind, waiter.payload = kind, payload
            waiter.event.set()
        elif isinstance(waiter, tuple):
            waiter[0].fill(waiter[1], kind, payload)
        elif waiter is not None and not waiter.startswith("?"):
            if kind == -1:
                self.errors.append(f"{waiter}: connection lost")
            elif kind == STATUS and struct.unpack_from("!I", payload)[0] != OK:
                self.errors.append(f"{waiter}: {_status_text(struct.unpack_from('!I', payload)[0], payload[4:])}")

    def _queue(self, kind: int, parts: tuple[bytes, ...], waiter) -> None:
        with self._send_lock:
            with self._lock:
                self._next_id = request_id = (self._next_id + 1) & 0xFFFFFFFF
                self._pending[request_id] = waiter
            self._out += struct.pack("!IBI", 5 + sum(map(len, parts)), kind, request_id)
            for part in parts:
                self._out += part
            if len(self._out) >= self.FLUSH_AT:
                self._flush_locked()

    def request(self, kind: int, body: bytes, what: str, wait: bool = True) -> Reply | None:
        """Queue one request. With ``wait`` a Reply to wait on; else failures land in ``errors``
        (``what`` starting with "?" means failure is expected and ignored, e.g. mkdir of an existing dir)."""
        reply = Reply(self, what) if wait else None
        self._queue(kind, (body,), reply if wait else what)
        return reply

    def drain(self) -> None:
        """Wait until every request queued so far has been answered (or the connection dropped)."""
        self.flush()
        with self._lock:
            self._idle.wait_for(lambda: not self._pending)

    # -- operations -----------------------------------------------------------------------------

    def open(self, path: str, flags: int, mode: int | None = None) -> Reply:
        return self.request(OPEN, _string(path) + struct.pack("!I", flags) + attrs(mode), f"open {path}")

    def handle(self, reply: Reply) -> bytes:
        """The handle from an OPEN reply, or TransportError with the server's reason."""
        kind, payload = reply.wait()
        if kind != HANDLE:
            raise self._error(reply)
        (length,) = struct.unpack_from("!I", payload)
        return payload[4:4 + length]

    def write(self, handle: bytes, offset: int, data: bytes, what: str) -> None:
        """Queue a WRITE of ``data`` (at most WRITE_CHUNK bytes); nobody waits for its reply."""
        self._queue(WRITE, (_string(handle), struct.pack("!QI", offset, len(data)), data), what)

    def close_handle(self, handle: bytes, what: str, wait: bool = False) -> Reply | None:
        return self.request(CLOSE, _string(handle), what, wait=wait)

    def fsetstat(self, handle: bytes, attributes: bytes, what: str) -> None:
        self.request(FSETSTAT, _string(handle) + attributes, what, wait=False)

    def mkdir(self, path: str) -> None:
        self.request(MKDIR, _string(path) + attrs(), f"?mkdir {path}", wait=False)

    def remove(self, path: str) -> None:
        self.request(REMOVE, _string(path), f"?remove {path}", wait=False)

    def stat(self, path: str) -> Stat | None:
        kind, payload = self.request(STAT, _string(path), f"stat {path}").wait()
        return _parse_attrs(payload) if kind == ATTRS_REPLY else None

    def lstat_many(self, paths: list[str]) -> list[Stat | None]:
        """LSTAT of every path in one pipelined batch; None where a path does not exist."""
        batch = _Batch(len(paths))
        for i, path in enumerate(paths):
            self._queue(LSTAT, (_string(path),), (batch, i))
        self.flush()
        batch.done.wait()
        return [_parse_attrs(payload) if kind == ATTRS_REPLY else None for kind, payload in batch.results]

    def rename(self, old: str, new: str) -> None:
        """Atomic replace (posix-rename@openssh.com), else remove + rename."""
        if b"posix-rename@openssh.com" in self.extensions:
            reply = self.request(EXTENDED, _string("posix-rename@openssh.com") + _string(old) + _string(new),
                                 f"rename {old}")
        else:
            self.remove(new)
            reply = self.request(RENAME, _string(old) + _string(new), f"rename {old}")
        if reply.status()[0] != OK:
            raise self._error(reply)

    def read_file(self, path: str) -> bytes | None:
        """A whole (small) remote file, or None if it does not exist."""
        reply = self.open(path, READ_FLAG)
        kind, _ = reply.wait()
        if kind == STATUS and reply.status()[0] == NO_SUCH_FILE:
            return None
        handle = self.handle(reply)
        parts, offset = [], 0
        while True:
            kind, payload = self.request(READ, _string(handle) + struct.pack("!QI", offset, 65536),
                                         f"read {path}").wait()
            if kind != DATA:
                break
            (length,) = struct.unpack_from("!I", payload)
            parts.append(payload[4:4 + length])
            offset += length
        self.close_handle(handle, f"close {path}")
        return b"".join(parts)

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Write a small file atomically: a temp file renamed over ``path``."""
        tmp = f"{path}.{os.urandom(4).hex()}.tmp"  # unique: hosts may share a filesystem
        handle = self.handle(self.open(tmp, WRITE_FLAG | CREATE | TRUNCATE, mode))
        step = self.WRITE_CHUNK
        for offset in range(0, len(data), step):
            self.write(handle, offset, data[offset:offset + step], f"write {tmp}")
        reply = self.close_handle(handle, f"close {tmp}", wait=True)
        if reply.status()[0] != OK or self.errors:
            raise self._error(reply)
        self.rename(tmp, path)

    def _error(self, reply: Reply) -> TransportError:
        if reply.kind == -1:
            return TransportError(f"{self.label}: connection lost during SFTP: reconnect and sync again")
        code, message = reply.status()
        detail = "; ".join(self.errors[:3]) or f"{reply.what}: {message or _status_text(code, b'')}"
        return TransportError(f"{self.label}: {detail}")

    def close(self) -> None:
        self.channel.close()


def _status_text(code: int, payload: bytes) -> str:
    try:
        (length,) = struct.unpack_from("!I", payload)
        message = payload[4:4 + length].decode(errors="replace")
    except struct.error:
        message = ""
    return message or {2: "no such file", 3: "permission denied", 4: "failure"}.get(code, f"error {code}")
