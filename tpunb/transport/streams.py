"""Byte streams to a host made of a program started on it: what a transport without channels of
its own (an exec channel, as ``kubectl exec`` gives) offers for forwards and %tpu_sync.

A ``Stream`` is what a forward copies and what the SFTP client speaks over: a paramiko channel is
one, and so is a ``ProcessStream``, a program's stdin and stdout. The programs are small and need
only the host's Python: ``RELAY`` copies between its stdin/stdout and a TCP port on the host's
loopback (as ``kubectl port-forward`` would carry it), ``tpunb/transport/sftp_server.py`` answers
the SFTP requests tpunb's sync sends.
"""
from __future__ import annotations

import os
import select
from pathlib import Path
from typing import Any, Protocol

from tpunb.errors import TransportError

#: seconds a stream's program gets to end once both ends are closed, before it is killed
CLOSE_GRACE = 2.0
#: what the relay writes once it reached the port (the stream's first byte, never passed on)
READY = b"+"

RELAY = r"""import os, select, socket, sys
port = int(sys.argv[1])
try:
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
except OSError as exc:
    sys.stderr.write("nothing answers on port %d (%s)\n" % (port, exc.strerror or exc))
    sys.exit(1)
conn.settimeout(None)
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
os.write(1, b"+")
reading = [0, conn]
try:
    while reading:
        for source in select.select(reading, [], [])[0]:
            if source == 0:
                data = os.read(0, 262144)
                if data:
                    conn.sendall(data)
                    continue
                conn.shutdown(socket.SHUT_WR)
            else:
                try:
                    data = conn.recv(262144)
                except OSError:
                    data = b""
                view = memoryview(data)
                while view:
                    view = view[os.write(1, view):]
                if data:
                    continue
                os.close(1)
            reading.remove(source)
except OSError:
    pass
"""


class Stream(Protocol):
    """A two-way byte stream with a file descriptor to wait on (``select``)."""

    def fileno(self) -> int: ...

    def recv(self, n: int) -> bytes: ...

    def sendall(self, data: Any) -> None: ...

    def shutdown_write(self) -> None: ...

    def close(self) -> None: ...


class ProcessStream:
    """A program on a host as a ``Stream``: what is sent goes to its stdin, what it writes is read."""

    def __init__(self, process: Any, address: str) -> None:
        self.process, self.address = process, address
        fd = process.frames_fd()
        if fd is None:
            process.close(grace=0)
            raise TransportError(f"{address}: its transport gives no stream to wait on; this needs a channel of its own")
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def recv(self, n: int) -> bytes:
        try:
            return os.read(self._fd, n)
        except OSError:
            return b""

    def sendall(self, data: Any) -> None:
        try:
            self.process.send(data)
        except TransportError as exc:
            raise OSError(str(exc)) from None

    def shutdown_write(self) -> None:
        self.process.end_input()

    def close(self) -> None:
        self.process.end_input()
        self.process.close(grace=CLOSE_GRACE)


def _start(transport: Any, argv: list[str]) -> ProcessStream:
    transport.connect()
    return ProcessStream(transport.spawn(argv), transport.address)


def relayed(transport: Any, port: int, timeout: float | None = None) -> ProcessStream:
    """A stream to ``port`` on the host's loopback through ``RELAY``; TransportError if nothing answers."""
    stream = _start(transport, [transport.python, "-S", "-c", RELAY, str(int(port))])
    wait = 10.0 if timeout is None else timeout
    ready, _, _ = select.select([stream], [], [], wait)
    first = stream.recv(1) if ready else None
    if first == READY:
        return stream
    stream.close()
    if first is None:
        raise TransportError(f"port {port} of {transport.address} did not open within {wait:g} s")
    why = stream.process.stderr_tail().strip().splitlines()[-1:]
    raise TransportError(f"nothing answers on port {port} of {transport.address}"
                         + (f" ({why[0].split('(', 1)[-1].rstrip(')')})" if why and "(" in why[0] else ""))


def served_files(transport: Any) -> ProcessStream:
    """A stream to tpunb's SFTP server (``sftp_server.py``) run by the host's Python."""
    source = (Path(__file__).resolve().parent / "sftp_server.py").read_text(encoding="utf-8")
    return _start(transport, [transport.python, "-S", "-c", source])
