"""Agents as child processes of the kernel, over pipes: the simulated slice's transport."""
from __future__ import annotations

import collections
import os
import select
import signal
import subprocess
import sys
import threading

from tpunb.errors import TransportError
from tpunb.transport.seam import AgentProcess, Transport, read_exact
from tpunb.transport.forkserver import ForkedAgent, LocalForks


def _batch_scheduling(pid: int) -> None:
    """Simulated hosts share this machine's cores with the kernel. As SCHED_BATCH they do not
    preempt the kernel when a frame wakes them, so it can hand a cell to all hosts before any
    starts: on 2 cores a 64-host cell takes about half the time."""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH"):
        try:
            os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))
        except OSError:
            pass


def _start(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # Ctrl-C in a terminal must reach the kernel only
        bufsize=0,
    )


class LocalAgentProcess(AgentProcess):
    """A process on this machine whose stdin/stdout carry frames and whose stderr is kept for
    diagnosis: a child of the kernel, or an agent its fork server made (``ForkedAgent``: the same
    pipes, ``poll`` and ``wait``)."""

    def __init__(self, child: subprocess.Popen | ForkedAgent) -> None:
        self._proc = child
        self.pid = self._proc.pid
        _batch_scheduling(self.pid)
        self._stdout = self._proc.stdout
        self._stderr_lines: collections.deque[str] = collections.deque(maxlen=40)
        threading.Thread(target=self._drain_stderr, daemon=True, name=f"tpunb-stderr-{self.pid}").start()

    def _drain_stderr(self) -> None:
        with self._proc.stderr:  # closed at its end, not left to the garbage collector (one fd a host)
            for line in iter(self._proc.stderr.readline, b""):
                self._stderr_line(line.decode(errors="replace").rstrip("\n"))
        self._stderr_ended()

    def _stderr_line(self, line: str) -> None:
        self._stderr_lines.append(line)

    def _stderr_ended(self) -> None:
        """Its stderr is closed: no more lines will come."""

    def send(self, data) -> None:
        data = memoryview(data).cast("B")
        try:
            while data:  # a raw pipe may take part of a large write
                data = data[self._proc.stdin.write(data):]
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise TransportError(f"local host process {self.pid} is gone ({exc})") from None

    def recv_exact(self, n: int) -> bytes:
        return read_exact(self._stdout.read, n)

    def frames_fd(self) -> int | None:
        return self._stdout.fileno()

    def has_unread(self) -> bool:
        try:
            return bool(select.select([self._stdout], [], [], 0)[0])
        except (ValueError, OSError):  # closed
            return False

    def end_input(self) -> None:
        try:
            self._proc.stdin.close()
        except OSError:
            pass

    def signal_group(self, pgid: int, sig: int) -> None:
        for each in (sig, signal.SIGCONT):  # a stopped group is woken to take the signal
            try:
                os.killpg(pgid, each)
            except (ProcessLookupError, PermissionError):
                pass

    def exit_status(self) -> int | None:
        return self._proc.poll()

    def stderr_tail(self) -> str:
        return "\n".join(self._stderr_lines)

    def abandon(self, pgid: int | None) -> None:
        self.signal_group(pgid or self.pid, signal.SIGKILL)
        threading.Thread(target=self.close, daemon=True, name=f"tpunb-reap-{self.pid}").start()

    def close(self, grace: float | None = None) -> bool:
        for stream in (self._proc.stdin,):
            try:
                stream.close()
            except OSError:
                pass
        killed = False
        try:
            self._proc.wait(timeout=2.0 if grace is None else grace)
        except subprocess.TimeoutExpired:
            self.signal_group(self.pid, signal.SIGKILL)
            self._proc.wait()
            killed = True
        self._stdout.close()
        return killed or self._proc.returncode == -signal.SIGKILL  # (its watchdog may have killed it)


class LocalTransport(Transport):
    """Starts agents as child processes of this kernel."""

    same_machine = True

    def __init__(self, label: str = "local", python: str | None = None) -> None:
        self.address = label
        self.python = python or sys.executable

    @staticmethod
    def _environment() -> dict[str, str]:
        env = dict(os.environ)
        env.pop("PYTHONSTARTUP", None)
        env["TPUNB_KERNEL_PYTHON"] = sys.executable  # a host on this Python has the kernel's package versions
        return env

    def spawn(self, argv: list[str]) -> LocalAgentProcess:
        try:
            return LocalAgentProcess(_start(argv, self._environment()))
        except OSError as exc:
            raise TransportError(f"cannot start a local host process: {exc}") from None

    def spawn_agent(self, forks: LocalForks | None) -> LocalAgentProcess | None:
        """An agent forked by the kernel's fork server (its bundle loaded, IPython imported), when
        it runs the kernel's own Python; None: start one with ``spawn``."""
        if forks is None or self.python != sys.executable:
            return None
        try:
            child = forks.spawn(self._environment())
        except OSError:
            return None
        return LocalAgentProcess(child) if child is not None else None
