"""Forwards carried by OpenSSH: a forward's connections cost C, not Python, per SSH packet.

Why: over paramiko each new connection is about eight SSH packets framed and parsed in Python on
one reader thread; with 32 clients at once that made p50 2.5x ``ssh -L``'s. When ``ssh`` is on
PATH, a forward starts an OpenSSH ControlMaster to its host (the user, key and host key tpunb's
own connection uses: ``StrictHostKeyChecking yes`` against a known_hosts file written from the
registry; only file paths on its command line) and hands each accepted socket to it over the
control socket (the mux protocol's stdio forward, what ``ssh -W`` does, the socket passed as a
file descriptor). OpenSSH then opens the channel and copies the bytes; Python only accepts. A
refused channel comes back as a mux failure, so the client still gets tpunb's one-line 502.
The master dies with the kernel (PR_SET_PDEATHSIG) and with ``close``.
"""
from __future__ import annotations

import array
import ctypes
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tpunb import report
from tpunb.errors import TransportError
from tpunb.transport.seam import OpenSSHLogin
from tpunb.transport.keys import default_key

# PROTOCOL.mux (OpenSSH): messages are uint32 length + body; strings are uint32 length + bytes
HELLO, STDIO_FWD, VERSION = 0x00000001, 0x10000008, 4
OPENED, FAILURE, DENIED = 0x80000006, 0x80000003, 0x80000002
#: who may start masters: PR_SET_PDEATHSIG fires when the *thread* that forked ends, so one that never does
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpunb-openssh")


def wanted() -> bool:
    """OpenSSH carries forwards unless ``$TPUNB_FORWARD=paramiko``, ``ssh`` is not on PATH, or this
    system cannot pass a socket to another process (Windows)."""
    return (os.environ.get("TPUNB_FORWARD", "openssh") != "paramiko" and hasattr(socket, "AF_UNIX")
            and hasattr(socket.socket, "sendmsg") and shutil.which("ssh") is not None)


def _die_with_parent() -> None:
    """In the master's child before exec: SIGTERM when the kernel process ends (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _packet(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _string(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


class Master:
    """One ``ssh -M`` (a ControlMaster) to a host as its transport logs in (``login``), with its control socket."""

    def __init__(self, login: OpenSSHLogin) -> None:
        known = login.known_key
        if known is None:
            raise TransportError(f"no recorded host key for {login.address}")
        self.address = login.address
        self._dir = tempfile.mkdtemp(prefix="tpunb-ssh-")  # 0700: the socket and files are ours alone
        self.socket_path = os.path.join(self._dir, "control")
        known_hosts = os.path.join(self._dir, "known_hosts")
        name = login.host if login.port == 22 else f"[{login.host}]:{login.port}"
        with open(known_hosts, "w", encoding="utf-8") as f:
            f.write(f"{name} {known[0]} {known[1]}\n")
        key = login.key_path or default_key()[0]
        # a session with a pty, doing nothing: sshd (and ssh) then mark the connection interactive and
        # send small packets at once (TCP_NODELAY); with -N, a reply written in two parts waited for a
        # delayed ACK, 40 ms, on several requests in a hundred. The pty's hang-up ends the remote sleep.
        argv = ["ssh", "-F", "/dev/null", "-M", "-S", self.socket_path, "-tt", "-i", str(key),
                "-p", str(login.port), "-l", login.user,
                "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ControlPersist=no",
                "-o", f"ConnectTimeout={max(1, int(login.connect_timeout))}",
                "-o", f"ServerAliveInterval={max(1, int(login.keepalive or 15))}", "-o", "ServerAliveCountMax=3",
                "-o", "LogLevel=ERROR", login.host, "exec sleep 2147483647"]
        errors = open(os.path.join(self._dir, "stderr"), "w+b")
        try:
            self._proc = _SPAWNER.submit(subprocess.Popen, argv, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=errors,
                                         preexec_fn=_die_with_parent).result()
        except OSError as exc:
            errors.close()
            self.close()
            raise TransportError(f"cannot run ssh ({exc.strerror or exc})") from None
        deadline = time.monotonic() + login.connect_timeout + 5
        while not os.path.exists(self.socket_path):  # OpenSSH makes it once authenticated
            if self._proc.poll() is not None or time.monotonic() > deadline:
                errors.seek(0)
                why = errors.read().decode(errors="replace").strip().splitlines()
                errors.close()
                self.close()
                raise TransportError(why[-1] if why else f"ssh to {self.address} did not start")
            threading.Event().wait(0.005)
        errors.close()

    def close(self) -> None:
        """End the master (and with it every connection it carries); idempotent."""
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


def master_for(login_of: Callable[[], OpenSSHLogin | None]) -> Master | None:
    """A Master for the host a transport's ``openssh_login`` (``login_of``) describes, or None (said once, unless
    the transport has no such login) when OpenSSH cannot carry its forwards."""
    if not wanted():
        return None
    login = login_of()
    if login is None:
        return None
    try:
        return Master(login)
    except TransportError as exc:
        if report.once("openssh forwards"):
            report.warn(f"[tpunb] OpenSSH cannot carry forwards to {login.address} ({exc}): "
                        "they use tpunb's own SSH channels, which are slower with many connections")
        return None


class _Handoff:
    """One accepted connection on its way to the master: its control connection, what came back."""

    __slots__ = ("mux", "client", "deadline", "answer", "opened")

    def __init__(self, mux: socket.socket, client: socket.socket, deadline: float) -> None:
        self.mux, self.client, self.deadline, self.answer, self.opened = mux, client, deadline, b"", False


class Carrier:
    """Hands a forward's accepted connections to its Master, with no thread per connection: the
    accepting thread sends the request and the socket, one thread reads every answer and holds each
    control connection until its channel ends (the master then closes it).

    ``refused(client, error)``: the host refused the channel or did not open it in time (answer
    the client); ``gone(client)``: the master has ended, carry this one another way; ``opened()``:
    a channel opened."""

    def __init__(self, master: Master, host: str, port: int, timeout: float,
                 refused: Callable[[socket.socket, TransportError], None], gone: Callable[[socket.socket], None],
                 opened: Callable[[], None]) -> None:
        self.master, self.timeout = master, timeout
        self._request = (_packet(struct.pack(">II", HELLO, VERSION))
                         + _packet(struct.pack(">II", STDIO_FWD, 1) + _string(b"") + _string(host.encode())
                                   + struct.pack(">I", port)))
        self._refused, self._gone, self._opened = refused, gone, opened
        self._port = port
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._waiting: set[_Handoff] = set()  # no answer yet: their deadlines are watched
        self.closed = False
        threading.Thread(target=self._run, daemon=True, name="tpunb-openssh-carrier").start()

    def hand_over(self, client: socket.socket) -> bool:
        """Start giving ``client`` to the master; False when the master cannot be reached (gone)."""
        mux = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            mux.connect(self.master.socket_path)
            mux.sendall(self._request)
            for _ in range(2):  # the stdio forward's stdin, then its stdout: both the client
                mux.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [client.fileno()]))])
        except OSError:
            mux.close()
            return False
        mux.setblocking(False)
        handoff = _Handoff(mux, client, time.monotonic() + self.timeout)
        with self._lock:
            if self.closed:
                mux.close()
                client.close()
                return True
            self._waiting.add(handoff)
            self._selector.register(mux, selectors.EVENT_READ, handoff)
        return True

    def _run(self) -> None:
        while not self.closed:
            with self._lock:
                first = min((h.deadline for h in self._waiting), default=None)
            try:
                events = self._selector.select(None if first is None else max(0.0, first - time.monotonic()))
            except (OSError, ValueError):
                return  # closed under us
            for key, _ in events:
                if self.closed:  # close() has dealt with every connection
                    return
                if key.data is not None:
                    self._readable(key.data)
            now = time.monotonic()
            with self._lock:
                late = [] if self.closed else [h for h in self._waiting if h.deadline <= now]
            for handoff in late:
                self._finish(handoff)
                self._refused(handoff.client, TransportError(
                    f"{self.master.address} did not open a channel within {self.timeout:g} s"))

    def _readable(self, handoff: _Handoff) -> None:
        try:
            data = handoff.mux.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if handoff.opened:
            if not data:  # the channel ended
                self._finish(handoff)
            return
        if not data:  # no answer: the master ended (its host died?)
            self._finish(handoff)
            return self._gone(handoff.client)
        handoff.answer += data
        kind = _second_packet_kind(handoff.answer)  # after the master's hello
        if kind is None:
            return
        if kind == OPENED:
            with self._lock:
                self._waiting.discard(handoff)
            handoff.opened = True
            handoff.client.close()  # the master holds its own copy
            return self._opened()
        self._finish(handoff)
        if kind in (FAILURE, DENIED):
            self._refused(handoff.client, TransportError(
                f"nothing answers on port {self._port} of {self.master.address} (Connect failed)"))
        else:
            self._gone(handoff.client)

    def _finish(self, handoff: _Handoff) -> None:
        with self._lock:
            self._waiting.discard(handoff)
            try:
                self._selector.unregister(handoff.mux)
            except (KeyError, ValueError):
                pass
        handoff.mux.close()

    def close(self, hand_back: bool = False) -> None:
        """End the master and every connection it carries; idempotent. ``hand_back``: connections
        still waiting for a channel go to ``gone`` (carried another way) instead of being closed."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            handoffs = [key.data for key in self._selector.get_map().values() if key.data is not None]
        self.master.close()
        for handoff in handoffs:
            handoff.mux.close()
            if not handoff.opened:
                self._gone(handoff.client) if hand_back else handoff.client.close()
        self._wake.send(b"\0")  # the thread wakes, sees closed, ends
        self._wake.close()


def _second_packet_kind(data: bytes) -> int | None:
    """The type of the second mux packet in ``data`` (the first is the master's hello), once whole."""
    if len(data) < 4:
        return None
    second = 4 + struct.unpack(">I", data[:4])[0]
    if len(data) < second + 8:
        return None
    return struct.unpack(">I", data[second + 4:second + 8])[0]
