"""Run one shell command on every host at once, streaming its output line by line.

The command (with any environment values) travels on the channel's stdin, not on the command
line, so neither appears in the host's process list or sshd's logs. It runs in the login shell
under a process group of its own (sshd makes every command a session leader) whose id is
reported first; cancelling kills that group, since closing a channel leaves the command running.
"""
from __future__ import annotations

import queue
import re
import shlex
import signal
import threading
from typing import Callable, Mapping, Sequence

from tpunb.errors import TransportError
from tpunb.transport.ssh import PID_MARK, SSHTransport, exit_status

# Read the script until EOF, detach stdin, then run it in this (login) shell: same pid, same group.
WRAPPER = f"printf '{PID_MARK}%s\\n' $$ >&2; tpunb_script=$(cat); exec </dev/null; eval \"$tpunb_script\""
CANCEL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL on cancel
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

OnOutput = Callable[[int, str, str], None]


class _Host:
    def __init__(self, index: int, transport: SSHTransport) -> None:
        self.index = index
        self.transport = transport
        self.channel = None
        self.pid: int | None = None
        self.pid_known = threading.Event()
        self.lock = threading.Lock()  # channel vs. cancelled: a late start must not escape a cancel
        self.cancelled = False


def run_shell(
    transports: Sequence[SSHTransport],
    command: str,
    on_output: OnOutput,
    env: Mapping[str, str] | None = None,
) -> dict[int, int]:
    """Run ``command`` on every host in parallel; {host index: exit code (negative: signal)}.

    ``on_output(host_index, "stdout" | "stderr", line)`` is called in this thread for each line
    as it arrives (the newline kept; a last unterminated line comes without one). A
    KeyboardInterrupt (or an exception from ``on_output``) kills the command on every host,
    then propagates. Raises TransportError naming the hosts that could not run it.
    """
    script = "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in _checked(env).items()) + command + "\n"
    events: queue.SimpleQueue = queue.SimpleQueue()
    hosts = [_Host(i, t) for i, t in enumerate(transports)]
    for host in hosts:
        threading.Thread(target=_run_host, args=(host, script, events), daemon=True,
                         name=f"tpunb-shell-{host.transport.address}").start()
    codes: dict[int, int] = {}
    failures: dict[int, str] = {}
    try:
        while len(codes) + len(failures) < len(hosts):
            kind, index, a, b = events.get()
            if kind == "line":
                on_output(index, a, b)
            elif kind == "exit":
                codes[index] = a
            else:
                failures[index] = a
    except BaseException:
        _cancel([h for h in hosts if h.index not in codes and h.index not in failures])
        raise
    finally:
        for host in hosts:
            if host.channel is not None:
                host.channel.close()
    if failures:
        error = TransportError(f"command failed to run on {len(failures)} of {len(hosts)} hosts: "
                               + "; ".join(failures[i] for i in sorted(failures)))
        error.exit_codes = codes
        raise error
    return codes


def _run_host(host: _Host, script: str, events: queue.SimpleQueue) -> None:
    try:
        channel = host.transport.open_command(WRAPPER)
        with host.lock:
            if host.cancelled:  # the script never arrives: the wrapper reads EOF and does nothing
                channel.close()
                return
            host.channel = channel
        channel.sendall(script.encode())
        channel.shutdown_write()
    except (TransportError, OSError) as exc:
        host.pid_known.set()
        events.put(("fail", host.index, str(exc), None))
        return
    stderr = threading.Thread(target=_pump, args=(host, channel.recv_stderr, "stderr", events), daemon=True)
    stderr.start()
    _pump(host, channel.recv, "stdout", events)
    stderr.join()
    channel.status_event.wait()  # set by exit-status/exit-signal, or when the channel closes
    code = exit_status(channel)
    if code is None:
        events.put(("fail", host.index, f"{host.transport.address}: connection lost while the command ran", None))
    else:
        events.put(("exit", host.index, code, None))


def _pump(host: _Host, recv: Callable[[int], bytes], stream: str, events: queue.SimpleQueue) -> None:
    partial = b""
    while True:
        try:
            chunk = recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        *lines, partial = (partial + chunk).split(b"\n")
        for raw in lines:
            text = raw.decode(errors="replace")
            if stream == "stderr" and host.pid is None and text.startswith(PID_MARK):
                host.pid = int(text[len(PID_MARK):])
                host.pid_known.set()
            else:
                events.put(("line", host.index, stream, text + "\n"))
    if partial:
        events.put(("line", host.index, stream, partial.decode(errors="replace")))
    if stream == "stderr":
        host.pid_known.set()


def _cancel(hosts: list[_Host]) -> None:
    """SIGTERM each command's process group, SIGKILL what is left after CANCEL_GRACE; in parallel."""
    def stop(host: _Host) -> None:
        with host.lock:
            host.cancelled = True
            channel = host.channel
        if channel is None or not host.pid_known.wait(CANCEL_GRACE) or host.pid is None:
            return
        host.transport.kill_group(host.pid, signal.SIGTERM)
        if not channel.status_event.wait(CANCEL_GRACE):
            host.transport.kill_group(host.pid, signal.SIGKILL)

    threads = [threading.Thread(target=stop, args=(h,), daemon=True) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _checked(env: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(env or {})
    for name in env:
        if not _NAME.match(name):
            raise TransportError(f"{name!r} is not a valid environment variable name: use letters, digits and _")
    return env


