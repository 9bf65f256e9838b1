"""The transport seam: start the agent on a host and carry its byte streams.

A transport knows nothing of frames or cells. It starts one long-lived process per host
session (``spawn``), gives the session a way to send bytes to it and read bytes back, and can
signal the agent's process group on that host when a cell must be stopped the hard way.
Everything else (interrupts, output, values) travels as frames over these two streams.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

from tpunb.errors import TransportError
from tpunb.transport import streams


def read_exact(recv: Callable[[int], bytes], n: int) -> bytes:
    """Exactly ``n`` bytes from ``recv`` (a pipe's read, a channel's recv); fewer only at end of stream."""
    chunks = []
    while n:
        try:
            chunk = recv(n)
        except (OSError, ValueError):
            chunk = b""
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class AgentProcess(ABC):
    """One running agent on one host, seen as two byte streams and a process group."""

    @abstractmethod
    def send(self, data: bytes) -> None:
        """Write all of ``data`` (bytes or a view) to the agent's stdin; raise TransportError if it is gone."""

    @abstractmethod
    def recv_exact(self, n: int) -> bytes:
        """Read exactly ``n`` bytes from the agent's stdout; fewer only at end of stream."""

    def frames_fd(self) -> int | None:
        """A file descriptor the agent's stdout can be read from without blocking, so one thread
        may wait on every host's at once (``tpunb.transport.fanin``); None: read with ``recv_exact`` on a
        thread of this host's own. Once it is given, ``recv_exact`` is not called."""
        return None

    def has_unread(self) -> bool:
        """Bytes from the agent wait that nobody has read yet: it spoke, and this kernel is the one
        behind (its reader thread starved), so its silence is not the host's."""
        return False

    def end_input(self) -> None:
        """Close the agent's stdin and nothing else (a half close: it still answers); where the
        transport cannot, nothing."""

    @abstractmethod
    def signal_group(self, pgid: int, sig: int) -> None:
        """Deliver ``sig`` to the process group ``pgid`` on the agent's host (escalation)."""

    @abstractmethod
    def exit_status(self) -> int | None:
        """How the agent ended (negative: killed by that signal), or None if unknown/running."""

    @abstractmethod
    def stderr_tail(self) -> str:
        """The last lines the agent wrote to its own stderr: why it failed to start."""

    @abstractmethod
    def close(self, grace: float | None = None) -> bool:
        """Close the streams and make sure the agent ends: it gets ``grace`` seconds (default 2)
        to exit on end of input, then its group is killed. True if it had to be killed (here, or by
        its watchdog: SIGKILL); idempotent."""

    @abstractmethod
    def abandon(self, pgid: int | None) -> None:
        """End an agent that stopped answering, and its process group, without waiting on it (it
        may be frozen, its connection dead): returns at once, the rest happens in the background."""


@dataclass(frozen=True)
class OpenSSHLogin:
    """How OpenSSH's own client logs in to a host as tpunb does: what a ControlMaster that carries
    forwards in C needs (``tpunb.forwards.openssh``). ``known_key``: the recorded (type, base64) host key."""

    address: str
    host: str
    port: int
    user: str
    key_path: str | None
    known_key: tuple[str, str] | None
    connect_timeout: float
    keepalive: int


class Transport(ABC):
    """A way to start agents on one host, and what else it can do (its capabilities, declared by
    each kind of transport so that callers never test its type).

    Beyond agents, features reach a host through three capabilities, each with a generic way over
    ``spawn`` that a transport replaces with a faster one of its own (SSH: its channels):
    ``open_stream`` (forwards), ``open_files`` (%tpu_sync) and ``openssh_login`` (forwards in C)."""

    #: its agents run on this machine: they map this process's memfds and share its files and ports
    same_machine = False
    #: hosts on it reach each other over a network of their own, apart from the kernel's link to
    #: them, so a large push crosses that link once and is relayed among them (tpunb.engine.relay)
    reaches_peers = False
    #: what the user would call this host ("127.0.0.2", "local pid 1234", ...)
    address: str = ""
    #: the Python interpreter to run on the host
    python: str = "python3"
    #: the environment to make (or check) on the host before its agent starts (tpunb/host/prepare.py)
    prepare: dict | None = None
    #: that environment's Python, once made: what other programs tpunb starts there run on
    prepared_python: str | None = None

    def connect(self) -> None:
        """(Re)establish the connection if it is down; hosts reached without one need nothing."""

    @abstractmethod
    def spawn(self, argv: list[str]) -> AgentProcess:
        """Start ``argv`` on the host with its stdin/stdout as the agent's streams."""

    def spawn_agent(self, forks) -> AgentProcess | None:
        """An agent that holds its bundle already (forked from a process that loaded it, from
        ``forks``: the kernel's ``tpunb.transport.forkserver.LocalForks``), waiting for its init
        frame; None (here: always): ``spawn`` the bootstrap and ship the bundle."""
        return None

    def open_stream(self, port: int, timeout: float | None = None) -> streams.Stream:
        """A byte stream to TCP ``port`` on the host's loopback (a forward's connection): here a relay
        program started with ``spawn``, its stdin and stdout the stream; TransportError naming the
        port if nothing answers there."""
        return streams.relayed(self, port, timeout)

    def open_files(self) -> streams.Stream:
        """A byte stream to an SFTP v3 server on the host, paths relative to its home (%tpu_sync
        speaks it): here tpunb's own small server started with ``spawn``."""
        return streams.served_files(self)

    def openssh_login(self) -> OpenSSHLogin | None:
        """How OpenSSH's client would log in to the host (forwards are then carried in C); None:
        OpenSSH cannot reach it, forwards go over ``open_stream``."""
        return None

    def close(self) -> None:
        """Release connections held for this host; idempotent."""
