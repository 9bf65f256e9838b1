"""Agents on hosts reached through an exec channel: a local command that runs a program on the host
with its stdin and stdout as the program's, as ``kubectl exec -i POD --`` does.

Why it looks like this:
- Every spawn is ``prefix + argv`` as a child of this kernel: the streams are its pipes, so a host's
  frames are read by the kernel's one selector thread (``tpunb.transport.fanin``), as a local host's.
- Ending the local command need not end the program on the host (a pod outlives its exec client),
  so each program reports its pid first (on stderr, as over SSH) and signals go to the host through
  another exec: ``kill`` run there.
- Nothing else is assumed of the channel: forwards are streams through a relay program on the host,
  and %tpu_sync speaks SFTP to tpunb's own server there (``tpunb.transport.streams``).
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Sequence

from tpunb.errors import TransportError
from tpunb.transport.pipes import LocalAgentProcess
from tpunb.transport.seam import Transport

PID_MARK = "tpunb-pid "
#: seconds a kill run on the host may take: a stuck channel must not hold escalation
KILL_TIMEOUT = 5.0
#: seconds a program gets to exit on end of input before it is killed (``close``'s default)
CLOSE_GRACE = 2.0
#: what runs on the host before the program: its pid first, then the program in its place
WRAP = f"printf '{PID_MARK}%s\\n' $$ >&2; exec \"$@\""


class ExecAgentProcess(LocalAgentProcess):
    """A program on the host behind a local exec command: its pipes are the streams; signals and
    the kill that ends it go to its pid on the host."""

    def __init__(self, transport: ExecTransport, child: subprocess.Popen) -> None:
        self._transport = transport
        self._pid_known = threading.Event()
        #: the program's pid on the host (its group, once it makes its own: the agent does), once reported
        self.remote_pid: int | None = None
        self._closed = False
        super().__init__(child)

    def _stderr_line(self, line: str) -> None:
        if self.remote_pid is None and line.startswith(PID_MARK):
            self.remote_pid = int(line[len(PID_MARK):])
            self._pid_known.set()
        else:
            self._stderr_lines.append(line)

    def _stderr_ended(self) -> None:
        self._pid_known.set()  # never coming

    def exit_status(self) -> int | None:
        """How the program ended: an exec channel says a signal as a shell does (128 + its number),
        given here as subprocess does (negative)."""
        code = self._proc.poll()
        return -(code - 128) if code is not None and 128 < code <= 128 + 64 else code

    def signal_group(self, pgid: int, sig: int) -> None:
        """Runs ``kill`` on the host through another exec."""
        self._transport.kill_group(pgid, sig)

    def abandon(self, pgid: int | None) -> None:
        """End the local command now; the program on the host is killed in the background."""
        if self._closed:
            return
        self._closed = True
        self._kill_here()
        threading.Thread(target=self._reap, args=(pgid or self.remote_pid,), daemon=True,
                         name=f"tpunb-exec-kill-{self._transport.address}").start()

    def _reap(self, target: int | None) -> None:
        """Kill the program in its pod (its channel may be what is stuck), then collect the exec command's end."""
        if target:
            self._transport.kill_group(target, signal.SIGKILL)
        self.end_input()
        self._proc.wait()
        self._stdout.close()

    def _kill_here(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)  # the exec command (it made its own session)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self, grace: float | None = None) -> bool:
        """End of input; a program that has not ended within ``grace`` seconds is killed on the host,
        then its exec command here. True if it was killed (here, or by its watchdog)."""
        if self._closed:
            return False
        self._closed = True
        self.end_input()
        killed = False
        try:
            self._proc.wait(timeout=CLOSE_GRACE if grace is None else grace)
        except subprocess.TimeoutExpired:
            self._pid_known.wait(CLOSE_GRACE)
            if self.remote_pid is not None:
                self._transport.kill_group(self.remote_pid, signal.SIGKILL)
            self._kill_here()
            self._proc.wait()
            killed = True
        self._stdout.close()
        return killed or self.exit_status() == -signal.SIGKILL  # (its watchdog may have killed it)


class ExecTransport(Transport):
    """Programs on one host run through ``prefix`` (``["kubectl", "exec", "-i", POD, "--"]``), a
    local command that runs the rest of its arguments there with its stdin and stdout."""

    def __init__(self, prefix: Sequence[str], address: str, python: str = "python3", reaches_peers: bool = False,
                 env: dict[str, str] | None = None) -> None:
        self.prefix = list(prefix)
        self.address = address
        self.python = python
        #: the hosts reach each other (a pod network): large pushes are relayed among them
        self.reaches_peers = reaches_peers
        self._env = env  # the exec command's own environment (its credentials); None: this process's

    def _command(self, argv: list[str]) -> list[str]:
        return [*self.prefix, "sh", "-c", WRAP, "sh", *argv]

    def spawn(self, argv: list[str]) -> ExecAgentProcess:
        try:
            child = subprocess.Popen(self._command(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=self._env, start_new_session=True, bufsize=0)
        except OSError as exc:
            raise TransportError(f"cannot run {self.prefix[0]} to reach {self.address} ({exc.strerror or exc}): "
                                 "check that it is installed and on PATH") from None
        return ExecAgentProcess(self, child)

    def kill_group(self, pgid: int, sig: int, timeout: float = KILL_TIMEOUT) -> None:
        """Send ``sig`` to process group ``pgid`` on the host, and to ``pgid`` as a pid (a program
        that made no group of its own), waking a stopped one; quietly nothing if the host does not
        take it within ``timeout`` seconds."""
        name = signal.Signals(sig).name.removeprefix("SIG")
        target = int(pgid)
        script = "; ".join(f"kill -s {each} {who} 2>/dev/null" for each in (name, "CONT")
                           for who in (f"-- -{target}", str(target)))
        try:
            subprocess.run([*self.prefix, "sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=self._env, timeout=timeout, start_new_session=True)
        except (OSError, subprocess.TimeoutExpired):
            pass

    def __repr__(self) -> str:
        return f"ExecTransport({self.address}: {' '.join(self.prefix)})"
