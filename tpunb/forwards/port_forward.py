"""Port forwards: a listening port on the notebook's machine that reaches a port on a host.

For remote hosts every accepted connection becomes a stream its transport opens
(``Transport.open_stream``: on SSH a direct-tcpip channel on the slice's existing connection, what
``ssh -L`` does), or, when the transport says how OpenSSH logs in (``openssh_login``) and ``ssh`` is
on PATH, is handed to an OpenSSH ControlMaster (openssh.py: the bytes are copied in C) until that
master has ended (its host died); for hosts on this machine, a plain connection to the port here.
A connection tpunb copies is copied both ways by a thread of its own until both sides have ended.
"""
from __future__ import annotations

import errno
import select
import socket
import threading
from typing import Callable

from tpunb import report
from tpunb.errors import TransportError, UsageError
from tpunb.forwards import openssh
from tpunb.transport.seam import Transport

CHUNK = 256 * 1024
#: seconds a new connection waits for its channel before the client is told the host is unreachable
OPEN_TIMEOUT = 10.0


def opener(transport: Transport, port: int) -> Callable[[], object]:
    """How to reach ``port`` on the host behind ``transport``: a socket-like object per call."""
    if not transport.same_machine:
        def tunnel():
            transport.connect()  # a dropped connection is made again; a dead host fails here, at once
            return transport.open_stream(port, timeout=OPEN_TIMEOUT)
        return tunnel

    def direct():
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=OPEN_TIMEOUT)
        except OSError as exc:
            raise TransportError(f"nothing answers on port {port} of {transport.address} ({exc.strerror})") from None
    return direct


def free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Forward:
    """``url`` reaches ``port`` on host ``host``; ``close()`` ends the listener and every connection."""

    def __init__(self, open_remote: Callable[[], object], host: int, port: int, local_port: int | None,
                 master: Callable[[], openssh.Master | None] | None = None) -> None:
        self.host, self.port = host, port
        self._open = open_remote
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._server.bind(("127.0.0.1", local_port or 0))
        except OSError as exc:
            self._server.close()
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(f"port {local_port} is taken on this machine: try --local-port {free_local_port()} "
                                 "(or leave it out to get a free one)") from None
            raise
        self._server.listen(512)
        self.local_port = self._server.getsockname()[1]
        self._closed = False
        self._lock = threading.Lock()
        self._open_sockets: set = set()
        self._said: str | None = None  # the last failure warned about: a client retrying is told once
        self._carrier: openssh.Carrier | None = None
        try:
            made = master() if master else None  # after the port is ours: a taken port starts nothing
        except BaseException:
            self._server.close()
            raise
        if made is not None:
            self._carrier = openssh.Carrier(made, "127.0.0.1", port, OPEN_TIMEOUT, self._refuse, self._carry_ourselves,
                                            self._answered)
        threading.Thread(target=self._accept, daemon=True, name=f"tpunb-forward-{self.local_port}").start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}/"

    def __repr__(self) -> str:
        return f"<Forward {self.url} -> host {self.host} port {self.port}{' (closed)' if self._closed else ''}>"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            carrier = self._carrier
            if carrier is not None and carrier.hand_over(client):
                continue  # OpenSSH carries it
            self._carry_ourselves(client)

    def _carry_ourselves(self, client: socket.socket) -> None:
        """Over tpunb's own channels, also once the OpenSSH master has ended (its host died, or it
        was closed: the paramiko connection then says which, in the 502)."""
        with self._lock:
            carrier, self._carrier = self._carrier, None
        if carrier is not None:
            carrier.close(hand_back=True)  # the connections it had not carried yet come back here too
        threading.Thread(target=self._serve, args=(client,), daemon=True, name="tpunb-forward-conn").start()

    def _answered(self) -> None:
        with self._lock:
            self._said = None

    def _serve(self, client: socket.socket) -> None:
        try:
            remote = self._open()
        except TransportError as exc:
            return self._refuse(client, exc)
        with self._lock:
            self._said = None
            if self._closed:
                client.close()
                remote.close()
                return
            self._open_sockets.update((client, remote))
        _relay(client, remote)
        with self._lock:
            self._open_sockets.difference_update((client, remote))
        for end in (client, remote):
            end.close()

    def _refuse(self, client: socket.socket, exc: TransportError) -> None:
        """Answer a 502 with one line saying why; the notebook is told once until it works again."""
        line = f"forward {self.url} -> host {self.host} port {self.port}: {exc}"
        with self._lock:
            repeated, self._said = line == self._said, line
        if not repeated:  # every request still gets the line in its 502; the notebook gets it once
            report.warn(f"[tpunb] {line}")
        body = (line + "\n").encode()
        try:
            client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        except OSError:
            pass
        client.close()

    def close(self) -> None:
        """Stop listening and end every connection; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            ends = list(self._open_sockets)
            carrier, self._carrier = self._carrier, None
        if carrier is not None:
            carrier.close()
        try:
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        for end in ends:
            try:
                if isinstance(end, socket.socket):
                    end.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked reading it (close alone does not)
                end.close()
            except OSError:
                pass


def _relay(client: socket.socket, remote) -> None:
    """Copy both ways on this one thread (a transport's stream has a file descriptor to wait on)
    until both sides have ended; an end one way is passed on as a half close, the other goes on."""
    other = {client: remote, remote: client}
    reading = [client, remote]
    while reading:
        try:
            ready, _, _ = select.select(reading, [], [])
        except (OSError, ValueError):
            return  # the forward was closed under us
        for source in ready:
            try:
                data = source.recv(CHUNK)
            except OSError:
                data = b""
            if data:
                try:
                    other[source].sendall(data)
                    continue
                except OSError:
                    return
            reading.remove(source)
            _end_writing(other[source])


def _end_writing(sink) -> None:
    try:
        if isinstance(sink, socket.socket):
            sink.shutdown(socket.SHUT_WR)
        else:
            sink.shutdown_write()
    except (OSError, EOFError):
        pass


def forward(transports: list[Transport], host: int, port: int, local_port: int | None) -> Forward | str:
    """A Forward to ``port`` on ``host``; for a host on this machine without ``local_port``, its own
    address (a string: there is nothing to carry)."""
    if not isinstance(port, int) or not 0 < port < 65536:
        raise UsageError(f"a port is a number from 1 to 65535, not {port!r}")
    if local_port is not None and (not isinstance(local_port, int) or not 0 < local_port < 65536):
        raise UsageError(f"--local-port is a number from 1 to 65535, not {local_port!r}")
    transport = transports[host]
    if transport.same_machine and local_port in (None, port):
        return f"http://127.0.0.1:{port}/"
    master = None if transport.same_machine else (lambda: openssh.master_for(transport.openssh_login))
    return Forward(opener(transport, port), host, port, local_port, master)
