"""Agents on remote hosts over SSH (paramiko): one connection per host, one exec channel per agent.

Why it looks like this:
- One long-lived agent per host session: every command sshd runs goes through the login shell
  (as root on some machines, ~200 ms of ~/.bashrc), so cells never start processes.
- Host keys are trusted on first use and kept in tpunb's registry, never in ~/.ssh/known_hosts;
  a changed key is refused (HostKeyError) until ``forget_host_key`` is called.
- Closing a channel without a pty leaves the remote process running, so every command is started
  with its pid printed first, and ending it means killing its process group (sshd makes each
  command a session leader, so pgid == pid).
"""
from __future__ import annotations

import collections
import getpass
import logging
import os
import shlex
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import paramiko
from paramiko.channel import Channel
from paramiko.common import MSG_CHANNEL_REQUEST, cMSG_CHANNEL_REQUEST

from tpunb.errors import AuthenticationError, HostKeyError, TransportError, UsageError
from tpunb.transport.fanout import fan_out
from tpunb.transport.keys import default_key, load_private_key
from tpunb.registry import Registry
from tpunb.transport import ssh_forks
from tpunb.transport.seam import AgentProcess, OpenSSHLogin, Transport, read_exact

PID_MARK = "tpunb-pid "
NO_FORK = "tpunb-nofork "  # a start through the host's fork server that it did not make (forkclient.py)
CLOSE_GRACE = 2.0  # seconds an agent gets to exit on EOF before its group is killed
KILL_TIMEOUT = 3.0  # seconds a kill command may take: a frozen connection must not hold escalation
# sqlite answers concurrent writers with sleeps of up to 100 ms; connecting threads take turns instead
_RECORD_LOCK = threading.Lock()


def forget_host_key(host: str, port: int = 22, registry: Registry | None = None) -> bool:
    """Drop the recorded key of host:port so the next connection records the new one.

    The documented way to accept a changed host key (a re-created VM); True if one was recorded.
    """
    return (registry or Registry()).forget_host_key(host, port)


def parse_host(spec: str, user: str | None = None, port: int = 22) -> tuple[str, str, int]:
    """``[user@]host[:port]`` (IPv6 as ``[addr]:port``) -> (user, host, port), filling defaults."""
    original = spec
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port_text = str(port)
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        if rest.startswith(":"):
            port_text = rest[1:]
    elif spec.count(":") == 1:
        host, port_text = spec.split(":")
    else:
        host = spec
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"bad host {original!r}: write [user@]host[:port] with a port from 1 to 65535, "
                         "e.g. me@10.0.0.2:2222")
    return user or getpass.getuser(), host, int(port_text)


def _drop_unrequested_channel_noise(record: logging.LogRecord) -> bool:
    """paramiko logs an ERROR when a channel it gave up on (a timed-out open on a slow host)
    opens after all; nothing is wrong, and users should not read it under their cell."""
    return "unrequested channel" not in record.getMessage()


logging.getLogger("paramiko.transport").addFilter(_drop_unrequested_channel_noise)


def _channel_request(chan: Channel, m: paramiko.Message) -> None:
    """paramiko's channel-request handler (the one its handler table names), plus the
    ``exit-signal`` request it ignores.

    sshd reports a command killed by a signal with exit-signal, not exit-status; recording it
    lets ``exit_status()`` answer -SIGNUM like subprocess does, instead of never answering.
    Both mark the channel, since paramiko also sets its status event when a channel just closes.
    """
    start = m.packet.tell()
    key = m.get_text()
    if key == "exit-signal":
        m.get_boolean()  # want_reply: never set for exit-signal
        number = getattr(signal, f"SIG{m.get_text()}", None)
        chan.exit_status = -int(number) if number is not None else -255
        chan.tpunb_exited = True
        chan.status_event.set()
        return
    m.packet.seek(start)
    if key == "exit-status":
        chan.tpunb_exited = True
    _PARAMIKO_CHANNEL_REQUEST(chan, m)


#: what paramiko does with a channel request, which ``_channel_request`` extends
_PARAMIKO_CHANNEL_REQUEST = paramiko.Transport._channel_handler_table[MSG_CHANNEL_REQUEST]


def _exec_now(channel: Channel, command: str) -> None:
    """paramiko's ``exec_command`` without asking for (and waiting on) sshd's reply."""
    m = paramiko.Message()
    m.add_byte(cMSG_CHANNEL_REQUEST)
    m.add_int(channel.remote_chanid)
    m.add_string("exec")
    m.add_boolean(False)
    m.add_string(command)
    channel.transport._send_user_message(m)


def exit_status(channel: Channel) -> int | None:
    """How the command on ``channel`` ended (negative: by that signal); None if still running
    or if the connection dropped before the host said."""
    return channel.exit_status if getattr(channel, "tpunb_exited", False) else None


#: AES-GCM first: one pass for cipher and MAC, ~10% faster bulk transfers than CTR + HMAC; only where
#: this paramiko has it (3.4 lists no AES-GCM cipher: asked for one, it fails on a KeyError)
_GCM = tuple(c for c in ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com") if c in paramiko.Transport._cipher_info)


class _Transport(paramiko.Transport):
    _preferred_ciphers = _GCM + tuple(c for c in paramiko.Transport._preferred_ciphers if c not in _GCM)
    _channel_handler_table: ClassVar[dict] = {**paramiko.Transport._channel_handler_table, MSG_CHANNEL_REQUEST: _channel_request}


class SSHAgentProcess(AgentProcess):
    """A command running on an exec channel: stdin/stdout for frames, stderr kept for diagnosis."""

    def __init__(self, transport: SSHTransport, channel: Channel) -> None:
        self._transport = transport
        self._channel = channel
        self._stderr_lines: collections.deque[str] = collections.deque(maxlen=40)
        self._pid_known = threading.Event()
        #: why the host's fork server did not make this agent (``forked``), if it did not
        self.refused: str | None = None
        #: the remote pid (== its process group until the command makes its own), once reported
        self.pid: int | None = None
        self._closed = False
        threading.Thread(target=self._drain_stderr, daemon=True,
                         name=f"tpunb-ssh-stderr-{transport.address}").start()

    def _drain_stderr(self) -> None:
        partial = b""
        while True:
            try:
                chunk = self._channel.recv_stderr(65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            *lines, partial = (partial + chunk).split(b"\n")
            for raw in lines:
                self._stderr_line(raw.decode(errors="replace"))
        if partial:
            self._stderr_line(partial.decode(errors="replace"))
        self._pid_known.set()  # never coming

    def _stderr_line(self, line: str) -> None:
        if self.pid is None and line.startswith(PID_MARK):
            self.pid = int(line[len(PID_MARK):])
            self._pid_known.set()
        elif self.pid is None and line.startswith(NO_FORK):
            self.refused = line[len(NO_FORK):]
            self._pid_known.set()
        else:
            self._stderr_lines.append(line)

    def forked(self, timeout: float) -> bool:
        """A start through the host's fork server: whether it made the agent (its pid is known)."""
        self._pid_known.wait(timeout)
        return self.pid is not None

    def send(self, data) -> None:
        data = memoryview(data).cast("B")  # sendall re-slices what is left per packet: quadratic on bytes
        try:
            while data:
                sent = self._channel.send(data[:1 << 20])
                if not sent:
                    raise OSError("the channel closed")
                data = data[sent:]
        except OSError as exc:
            raise TransportError(f"connection to {self._transport.address} is gone ({exc}); reconnect") from None

    def recv_exact(self, n: int) -> bytes:
        return read_exact(self._channel.recv, n)

    def has_unread(self) -> bool:
        return self._channel.recv_ready()

    def end_input(self) -> None:
        try:
            self._channel.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def signal_group(self, pgid: int, sig: int) -> None:
        """Runs ``kill`` on the host over a second channel; a no-op once the connection is gone."""
        self._transport.kill_group(pgid, sig)

    def exit_status(self) -> int | None:
        return exit_status(self._channel)

    def stderr_tail(self) -> str:
        return "\n".join(self._stderr_lines)

    def abandon(self, pgid: int | None) -> None:
        """The connection may be what froze (a stopped sshd session): drop it now, so the next cell
        connects afresh, and kill the group over a new connection in the background."""
        if self._closed:
            return
        self._closed = True
        pgid = pgid or self.pid
        self._transport.drop()
        if pgid:
            threading.Thread(target=self._transport.kill_from_new_connection, args=(pgid,), daemon=True,
                             name=f"tpunb-ssh-kill-{self._transport.address}").start()

    def close(self, grace: float | None = None) -> bool:
        """EOF to the agent; if it has not ended within ``grace`` (CLOSE_GRACE), kill its process group.
        True if it was killed (here, or by its watchdog)."""
        if self._closed:
            return False
        self._closed = True
        channel = self._channel
        try:
            channel.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass
        killed = False
        if not channel.status_event.wait(CLOSE_GRACE if grace is None else grace) and self._transport.connected:
            self._pid_known.wait(CLOSE_GRACE)
            if self.pid is not None:
                self._transport.kill_group(self.pid, signal.SIGKILL)
                killed = True
        channel.close()
        return killed or exit_status(channel) == -signal.SIGKILL  # (its watchdog may have killed it)


class SSHTransport(Transport):
    """One authenticated SSH connection to one host, checked against the registry's host key."""

    reaches_peers = True

    def __init__(
        self,
        host: str,
        port: int = 22,
        user: str | None = None,
        key_path: str | os.PathLike | None = None,
        registry: Registry | None = None,
        connect_timeout: float = 10.0,
        keepalive: int = 15,
        python: str = "python3",
        *,
        _pkey: paramiko.PKey | None = None,
    ) -> None:
        self.host = host
        self.port = int(port)
        self.user = user or getpass.getuser()
        self.key_path = Path(key_path).expanduser() if key_path else None
        self.registry = registry
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.python = python
        self.address = host if self.port == 22 else f"{host}:{self.port}"
        self._pkey = _pkey
        self._transport: _Transport | None = None
        self._lock = threading.Lock()
        self._forks_unsupported = False  # this host's Python cannot run a fork server
        self._lock_forks = threading.Lock()  # one start of the host's fork server at a time
        self.connect()

    # -- connection ---------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._transport is not None and self._transport.is_active()

    def connect(self) -> None:
        """(Re)connect if not connected: TCP, handshake, host key check, public key auth."""
        with self._lock:
            if self.connected:
                return
            if self._pkey is None:
                self._pkey = load_private_key(self.key_path)
            sock = self._open_socket()
            transport = _Transport(sock)
            try:
                self._handshake(transport)
            except BaseException:
                transport.close()
                raise
            self._transport = transport

    def reconnect(self) -> None:
        """Drop the connection (and every channel on it), then connect again."""
        self.close()
        self.connect()

    def _open_socket(self) -> socket.socket:
        where = f"{self.host}:{self.port}"
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        except socket.gaierror as exc:
            raise TransportError(f"cannot resolve host {self.host!r} ({exc.strerror}): check the address") from None
        except TimeoutError:
            raise TransportError(f"{where} did not answer within {self.connect_timeout:g} s: "
                                 "check the address, the firewall and that the host is up") from None
        except ConnectionRefusedError:
            raise TransportError(f"{where} refused the connection: is sshd running there and the port right?") from None
        except OSError as exc:
            raise TransportError(f"cannot reach {where} ({exc.strerror or exc}): check the address and network") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # frames are small: no Nagle delay
        if self.keepalive and hasattr(socket, "TCP_KEEPIDLE"):
            # notice a host that vanished without closing (preempted VM), not just a closed socket
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, self.keepalive)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, self.keepalive // 3))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
            if hasattr(socket, "TCP_USER_TIMEOUT"):  # and one that stopped acknowledging what we sent
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, self.keepalive * 3000)
        return sock

    def _handshake(self, transport: _Transport) -> None:
        where = f"{self.host}:{self.port}"
        registry = self.registry or Registry()
        known = registry.get_host_key(self.host, self.port)
        transport.banner_timeout = transport.handshake_timeout = transport.auth_timeout = self.connect_timeout
        if known:  # ask for the key type we hold, so a host with several keys is compared like for like
            options = transport.get_security_options()
            types = tuple(options.key_types)
            if known[0] in types:
                options.key_types = (known[0],) + tuple(t for t in types if t != known[0])
        try:
            transport.start_client(timeout=self.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(f"SSH handshake with {where} failed ({exc or type(exc).__name__}): "
                                 "is it an SSH server, and not overloaded?") from None
        if not transport.initial_kex_done:  # start_client gives up quietly at its timeout
            raise TransportError(f"{where} accepted TCP but no SSH handshake completed within "
                                 f"{self.connect_timeout:g} s: is the host overloaded or is that port not sshd?")
        key = transport.get_remote_server_key()
        if known is None:
            with _RECORD_LOCK:
                registry.set_host_key(self.host, self.port, key.get_name(), key.get_base64())
        elif known != (key.get_name(), key.get_base64()):
            recorded = _fingerprint(known[0], known[1])
            raise HostKeyError(
                f"host key of {where} changed (recorded {recorded}, now {key.get_name()} {key.fingerprint}); "
                f"if the host was re-created, accept its new key with %tpu_connect ... --accept-new-host-key "
                f"(or tpunb.transport.ssh_hosts.forget_host_key({self.host!r}, {self.port})) and connect again")
        try:
            transport.auth_publickey(self.user, self._pkey)
        except paramiko.AuthenticationException:
            key_name = self.key_path or f"{default_key()[0]} (tpunb's own)"
            raise AuthenticationError(
                f"{self.user}@{where} rejected SSH key {key_name} ({self._pkey.fingerprint}): add its public "
                f"key to ~{self.user}/.ssh/authorized_keys on the host, or pass --user/--key") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(f"SSH authentication with {where} failed ({exc}): retry, or check sshd's log") from None
        transport.set_keepalive(self.keepalive)

    def close(self) -> None:
        with self._lock:
            if self._transport is not None:
                self._transport.close()
                self._transport = None

    def drop(self) -> None:
        """Forget the connection now (the next ``connect`` makes a new one) and close it in the
        background: closing towards a frozen peer can take seconds."""
        with self._lock:
            old, self._transport = self._transport, None
        if old is not None:
            threading.Thread(target=old.close, daemon=True, name=f"tpunb-ssh-drop-{self.address}").start()

    def kill_from_new_connection(self, pgid: int) -> None:
        """SIGKILL a process group over a connection of its own (the usual one may be frozen);
        quietly nothing if the host cannot be reached (its sshd ends the session once it notices)."""
        try:
            fresh = SSHTransport(self.host, self.port, self.user, self.key_path, self.registry, self.connect_timeout,
                                 self.keepalive, self.python, _pkey=self._pkey)
        except TransportError:
            return
        try:
            fresh.kill_group(pgid, signal.SIGKILL)
        finally:
            fresh.close()

    # -- channels -----------------------------------------------------------------------------

    def _require(self) -> _Transport:
        transport = self._transport
        if transport is None or not transport.is_active():
            raise TransportError(f"not connected to {self.address}: reconnect")
        return transport

    def open_command(self, command: str, timeout: float | None = None, wait: bool = True) -> Channel:
        """An exec channel running ``command`` through the user's login shell (no pty). ``wait``
        False: do not wait for sshd to confirm the exec (a round trip): what is sent next reaches the
        command, since sshd handles a channel's requests and data in order; a refused exec shows as
        the channel closing."""
        return self._open(lambda channel: channel.exec_command(command) if wait else _exec_now(channel, command),
                          "a command", timeout)

    def open_subsystem(self, name: str) -> Channel:
        """A channel running an SSH subsystem such as "sftp" (sshd starts it like a command)."""
        return self._open(lambda channel: channel.invoke_subsystem(name), name)

    def _open(self, start: Callable[[Channel], None], what: str, timeout: float | None = None) -> Channel:
        try:
            channel = self._require().open_session(timeout=timeout or self.connect_timeout)
            start(channel)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(f"cannot start {what} on {self.address} ({exc}): reconnect, "
                                 "or check that sshd allows it") from None
        return channel

    def open_tunnel(self, port: int, host: str = "127.0.0.1", timeout: float | None = None) -> Channel:
        """A direct-tcpip channel to ``host:port`` as this host sees it (what ``ssh -L`` does), on
        the existing connection."""
        try:
            return self._require().open_channel("direct-tcpip", (host, int(port)), ("127.0.0.1", 0),
                                                timeout=timeout or self.connect_timeout)
        except paramiko.ChannelException as exc:
            raise TransportError(f"nothing answers on port {port} of {self.address} ({exc.text})") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(f"cannot open a tunnel to {self.address} ({exc}): reconnect") from None

    def open_stream(self, port: int, timeout: float | None = None) -> Channel:
        """A direct-tcpip channel on this connection (``open_tunnel``)."""
        return self.open_tunnel(port, timeout=timeout)

    def open_files(self) -> Channel:
        """The host's own SFTP server (sshd's sftp subsystem)."""
        return self.open_subsystem("sftp")

    def openssh_login(self) -> OpenSSHLogin:
        """This connection's user, key and recorded host key, for OpenSSH's client."""
        return OpenSSHLogin(self.address, self.host, self.port, self.user, str(self.key_path) if self.key_path else None,
                            (self.registry or Registry()).get_host_key(self.host, self.port), self.connect_timeout,
                            self.keepalive)

    def spawn(self, argv: list[str]) -> SSHAgentProcess:
        """Start ``argv`` on the host; its pid is reported first so ``close`` can always end it. The
        program's input may follow at once (no wait for sshd's reply to the exec)."""
        command = f"printf '{PID_MARK}%s\\n' $$ >&2; exec {shlex.join(argv)}"
        return SSHAgentProcess(self, self.open_command(command, wait=False))

    def spawn_agent(self, forks=None) -> SSHAgentProcess | None:
        """An agent forked by this host's fork server (``tpunb.transport.ssh_forks``: its bundle
        loaded, IPython imported; started here with the first agent that finds none), or None:
        ``spawn`` a fresh one."""
        if self._forks_unsupported or not ssh_forks.enabled():
            return None
        process = self._forked()
        if process is None:
            with self._lock_forks:
                try:
                    self._forks_unsupported = not ssh_forks.start_server(self)
                except TransportError:
                    return None
            process = None if self._forks_unsupported else self._forked()
        return process

    def _forked(self) -> SSHAgentProcess | None:
        process = SSHAgentProcess(self, self.open_command(ssh_forks.client_command(self.python), wait=False))
        if process.forked(ssh_forks.READY_SECONDS):
            return process
        process.close(0)
        return None

    def kill_group(self, pgid: int, sig: int, timeout: float = KILL_TIMEOUT) -> None:
        """Send ``sig`` to process group ``pgid`` on the host (a stopped group is woken to take it);
        quietly nothing if the host does not take the command within ``timeout`` seconds."""
        name = signal.Signals(sig).name.removeprefix("SIG")
        try:
            channel = self.open_command(f"kill -s {name} -- -{int(pgid)} 2>/dev/null; "
                                        f"kill -s CONT -- -{int(pgid)} 2>/dev/null", timeout)
        except TransportError:
            return
        try:
            channel.status_event.wait(timeout)
        finally:
            channel.close()

    def __repr__(self) -> str:
        return f"SSHTransport({self.user}@{self.address}, {'connected' if self.connected else 'closed'})"


def _fingerprint(key_type: str, key_b64: str) -> str:
    import base64
    import hashlib

    digest = hashlib.sha256(base64.b64decode(key_b64)).digest()
    return f"{key_type} SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


def connect_all(
    hosts: list[str],
    *,
    user: str | None = None,
    port: int = 22,
    key_path: str | os.PathLike | None = None,
    registry: Registry | None = None,
    connect_timeout: float = 10.0,
    keepalive: int = 15,
    python: str | list[str] = "python3",
) -> list[SSHTransport]:
    """Connect to every ``[user@]host[:port]`` in parallel, in order; all or nothing.

    ``python``: one interpreter for every host, or one per host (hosts set up differently).
    Raises one TransportError naming each host that failed and why (a HostKeyError if every
    failure is a changed host key); its ``failures`` maps address -> exception.
    """
    pkey = load_private_key(key_path)
    registry = registry or Registry()
    specs = [parse_host(h, user, port) for h in hosts]
    pythons = [python] * len(specs) if isinstance(python, str) else list(python)
    if len(pythons) != len(specs):
        raise UsageError(f"give one Python for every host, or one for all: {len(pythons)} for {len(specs)} hosts")

    def one(i: int) -> SSHTransport:
        u, h, p = specs[i]
        return SSHTransport(h, p, u, key_path, registry, connect_timeout, keepalive, pythons[i], _pkey=pkey)

    reached = fan_out(range(len(specs)), one, name="tpunb-connect", late=SSHTransport.close)
    connected = list(reached.succeeded.values())
    failures = {}
    for i, exc in reached.failed.items():
        _, h, p = specs[i]
        if not isinstance(exc, TransportError):
            for t in connected:
                t.close()
            raise exc
        failures[h if p == 22 else f"{h}:{p}"] = exc
    if failures:
        for t in connected:
            t.close()
        kinds = {type(e) for e in failures.values()}
        kind = kinds.pop() if len(kinds) == 1 else TransportError  # e.g. every host refused our key
        details = "; ".join(str(e) for e in failures.values())
        raise kind(f"cannot connect to {len(failures)} of {len(specs)} hosts: {details}", failures)
    return connected


__all__ = ["SSHAgentProcess", "SSHTransport", "connect_all", "exit_status", "forget_host_key", "parse_host"]
