"""Local host agents forked from one process that imported IPython once (``tpunb/host/forkserver.py``).

A local host's agent used to be a fresh Python that imported IPython's shell: about 0.6 s of CPU
a host, paid again by every launch, restart and standby, 2.6 s for a 4-host slice on 2 cores.
The fork server pays it once per kernel; each agent is then a fork of it, ready in milliseconds,
sharing its pages. It starts with the first local host and lives as long as the kernel (its
socket's end ends it).

Only an agent that a fresh start would make the same way is forked: this kernel's Python, and
the variables a process reads only as it starts (``PYTHONPATH``, ``LD_LIBRARY_PATH``, the
locale, ...) as they were when the server started. Otherwise, or where there is no fork server
(no ``pidfd_open``, no ``fork``), the caller starts a fresh process. One difference remains:
forked agents share the server's string-hash seed, where fresh ones would each draw their own.
"""
from __future__ import annotations

import array
import json
import os
import select
import socket
import subprocess
import sys
import threading
import weakref

from tpunb.transport.bundle import FORK_SERVER, agent_bundle
from tpunb.host.forkserver import startup_environment, supported
from tpunb.machine import procs

#: seconds a spawn waits for the server's answer (its first one waits for IPython's import too)
ANSWER_SECONDS = 60.0


class ForkedAgent:
    """An agent the server forked, seen as ``subprocess.Popen`` sees a child: its pipes, ``poll``
    and ``wait`` (the server, its parent, says how it ended)."""

    def __init__(self, server: ForkServer, pid: int, stdin: int, stdout: int, stderr: int) -> None:
        self.pid, self._server = pid, server
        self.stdin = open(stdin, "wb", buffering=0)
        self.stdout = open(stdout, "rb", buffering=0)
        self.stderr = open(stderr, "rb", buffering=0)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"host agent {self.pid}", timeout)
        return self.returncode


class ForkServer:
    """One fork server process and the kernel's end of its socket."""

    def __init__(self, env: dict[str, str]) -> None:
        self.startup = startup_environment(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", FORK_SERVER], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True,
                env={**env, "TPUNB_FORK_SERVER_FD": str(theirs.fileno())})
        finally:
            theirs.close()
        self.pid = self._process.pid
        self._socket = ours
        self._asking = threading.Lock()  # one request at a time: answers come in the order asked
        self._changed = threading.Condition()
        self._answers: list[int] = []
        self._codes: dict[int, int] = {}
        self._ended = False
        with self._process.stdin:
            self._process.stdin.write(agent_bundle())
        threading.Thread(target=self._read, daemon=True, name=f"tpunb-forkserver-{self.pid}").start()

    @property
    def running(self) -> bool:
        return not self._ended

    def close(self) -> None:
        """End the server (the agents it made live on, each until its own stdin ends)."""
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def spawn(self, env: dict[str, str]) -> ForkedAgent | None:
        """A new agent with environment ``env``, in this process's working directory and umask; None
        if the server is gone (the caller starts a fresh process)."""
        mask = procs.umask()
        ends = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr: (read, write) each
        theirs = [ends[0][0], ends[1][1], ends[2][1]]
        ours = [ends[0][1], ends[1][0], ends[2][0]]
        try:
            with self._asking:
                request = json.dumps({"env": env, "cwd": os.getcwd(), "umask": mask}).encode()
                self._socket.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", theirs))])
                pid = self._answer()
        except OSError:
            pid = None
        finally:
            for fd in theirs:
                os.close(fd)
        if pid is None:
            for fd in ours:
                os.close(fd)
            return None
        return ForkedAgent(self, pid, *ours)

    def _answer(self) -> int | None:
        with self._changed:
            if not self._changed.wait_for(lambda: self._answers or self._ended, ANSWER_SECONDS):
                self._ended = True  # stuck: no agent is asked of it again
            return self._answers.pop(0) if self._answers else None

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        """How agent ``pid`` ended, once it has (waiting up to ``timeout`` seconds); None meanwhile.
        If the server went first, its agents' codes are lost: 0 once such an agent is gone."""
        with self._changed:
            self._changed.wait_for(lambda: pid in self._codes or self._ended, timeout)
            if pid in self._codes or not self._ended:
                return self._codes.get(pid)
        try:
            exited = os.pidfd_open(pid)
        except OSError:  # gone already
            return 0
        try:
            return 0 if select.select([exited], [], [], timeout)[0] else None
        finally:
            os.close(exited)

    def _read(self) -> None:
        """The server's answers and its agents' ends, until it is gone."""
        try:
            while True:
                data = self._socket.recv(1 << 16)
                if not data:
                    break
                message = json.loads(data)
                with self._changed:
                    if "pid" in message:
                        self._answers.append(message["pid"])
                    else:
                        self._codes[message["exited"]] = message["code"]
                    self._changed.notify_all()
        except (OSError, ValueError):
            pass
        finally:
            with self._changed:
                self._ended = True
                self._changed.notify_all()
            self._socket.close()
            self._process.wait()


class LocalForks:
    """The kernel's fork server for its local agents: started with the first one, started again
    if it ended, ended with this object (a SliceManager a test made and dropped takes its server
    along). One per kernel (the SliceManager's); a Session without one starts fresh processes."""

    def __init__(self) -> None:
        self._server: ForkServer | None = None
        self._lock = threading.Lock()

    def spawn(self, env: dict[str, str]) -> ForkedAgent | None:
        """An agent forked with environment ``env``, or None where a fresh process must start it
        (``TPUNB_FORK_SERVER=0`` asks for that always: to compare, or to rule the server out)."""
        if not supported() or os.environ.get("TPUNB_FORK_SERVER") == "0":
            return None
        with self._lock:
            if self._server is None or not self._server.running:
                self._server = ForkServer(env)
                weakref.finalize(self, self._server.close)
            server = self._server
        if startup_environment(env) != server.startup:
            return None
        return server.spawn(env)

    def close(self) -> None:
        """End the server now (the next agent starts another); its agents live on."""
        with self._lock:
            if self._server is not None:
                self._server.close()

    @property
    def pid(self) -> int | None:
        """The fork server's process, while it runs."""
        server = self._server
        return server.pid if server is not None and server.running else None
