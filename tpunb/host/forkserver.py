"""The fork server of a kernel's local hosts: one process that has loaded the agent's modules and
imported IPython once, and forks every local host's agent from itself.

Why: most of an agent's start is importing IPython's shell (about 0.6 s of CPU on a 2-core
machine). A simulated slice's hosts all run on the kernel's machine and Python, so each can be a
fork of one process that imported it: a host then starts in milliseconds, and its pages stay
shared with the server's until it writes them.

The kernel holds the other end of the Unix socket on ``fd`` (SOCK_SEQPACKET: one message a
request). It sends ``spawn`` requests, each a JSON object (the agent's environment, working
directory and umask) with three file descriptors (SCM_RIGHTS: the agent's stdin, stdout and
stderr). The server answers each request, in order, with the new agent's pid, and says
``{"exited": pid, "code": code}`` when one ends (it is their parent, so it reaps them; code is
negative for a signal, as subprocess says). The end of the socket (the kernel gone) ends the
server; its agents end by themselves when their own stdin ends.

Over SSH (``serve``) a server runs on a remote host for every kernel that connects as this user
with this Python, environment and tpunb: detached from the connection that started it, it
listens on an abstract Unix socket whose name says all that (``forkclient.socket_name``), and
ends after ``IDLE_SECONDS`` with no agent and no request, or once a package install made it stale
(it then stops listening: the next kernel starts a fresh one). Each agent start is an exec
channel running the small client ``standalone/forkclient.py``, which connects, hands over its
own stdin, stdout and stderr (the channel's streams), and stays until the agent it asked for
ends, to pass its exit on to sshd. Server and client each check that the other is this user's
(SO_PEERCRED): an abstract socket is visible to every user of the host.

The server runs no thread: a fork copies only the thread that calls it. Shipped to hosts:
standard library only.
"""
from __future__ import annotations

import array
import json
import os
import select
import socket
import struct
import sys

from .standalone import forkclient

#: the largest request (an environment of a few hundred variables is some 20 kB)
MAX_REQUEST = 1 << 20
#: what a process reads from its environment only as it starts (Python's settings, the dynamic
#: linker's paths, the locale, the time zone, the user site-packages under HOME): a forked agent is
#: what a fresh one would be only where these are as they were when the server started
STARTUP_PREFIXES, STARTUP_NAMES = forkclient.STARTUP_PREFIXES, frozenset(forkclient.STARTUP_NAMES)
STARTUP_DIFFERS = "its start-up environment differs from the fork server's"
#: seconds an SSH host's fork server stays with no agent and no request before it ends
IDLE_SECONDS = 600.0
IDLE_ENV = "TPUNB_FORK_SERVER_IDLE"


def startup_environment(env) -> dict:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES) or k in STARTUP_NAMES}


def supported() -> bool:
    return hasattr(os, "fork") and hasattr(os, "pidfd_open") and hasattr(socket, "SCM_RIGHTS")


def _import_ipython() -> None:
    try:
        import IPython.core.interactiveshell  # noqa: F401 - the import every agent shares is the point
    except Exception:  # no IPython here: agents fall back to plain exec, as started ones do
        pass


def main(fd: int) -> None:
    """Serve the kernel on socket ``fd`` until it goes away."""
    _import_ipython()
    control = socket.socket(fileno=fd)
    poller = select.poll()
    poller.register(control, select.POLLIN)
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        for ready, _ in poller.poll():
            if ready == control.fileno():
                request = _receive(control)
                if request is None:
                    return
                pid = _fork(request, control)
                exited = os.pidfd_open(pid)
                children[exited] = pid
                poller.register(exited, select.POLLIN)
                control.send(json.dumps({"pid": pid}).encode())
            else:
                poller.unregister(ready)
                pid = children.pop(ready)
                os.close(ready)
                _, status = os.waitpid(pid, 0)
                try:
                    control.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:
                    return


def _receive(control: socket.socket) -> tuple[dict, list[int]] | None:
    """The next request and its three fds; None once the kernel is gone."""
    fds = array.array("i")
    try:
        data, ancillary, _, _ = control.recvmsg(MAX_REQUEST, socket.CMSG_SPACE(3 * fds.itemsize))
    except OSError:
        return None
    if not data:
        return None
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return json.loads(data), list(fds)


def _fork(request: tuple[dict, list[int]], control: socket.socket) -> int:
    """Fork one agent: its stdin, stdout and stderr are the fds that came with the request."""
    settings, fds = request
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        return pid
    try:  # the agent: nothing of the server's survives but its imported modules
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, 65536)  # the control socket, the other agents' pidfds, the fds as received
        os.environ.clear()
        os.environ.update(settings["env"])
        os.umask(settings["umask"])
        try:
            os.chdir(settings["cwd"])
        except OSError:
            pass
        from . import agent  # loaded already: the bundle made every module before this one

        agent.main()
    finally:
        os._exit(0)


def serve(digest: str) -> None:
    """Serve agent starts over SSH (``standalone/forkclient.py``) on the abstract Unix socket that
    ``forkclient.socket_name(digest)`` names, detached from the connection that started it, until
    it has had no agent and no request for ``IDLE_SECONDS``. Says ``ready`` on stdout once it (or
    one started before it) listens, or ``unsupported`` where it cannot fork agents."""
    if not supported():
        print("unsupported", flush=True)
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind("\0" + forkclient.socket_name(digest))
    except OSError:  # another start won the race: it serves (or will, once it imported IPython)
        print("ready", flush=True)
        return
    _import_ipython()
    paths = _path_times()
    listening, said = os.pipe()
    if os.fork():
        os.close(said)
        os.read(listening, 1)  # it listens (its peers see its pid, SO_PEERCRED), or it failed
        print("ready", flush=True)
        os._exit(0)
    os.setsid()  # the connection that started it may end: it serves on, for the next kernel too
    listener.listen(64)
    os.write(said, b"!")
    os.close(said)
    os.close(listening)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    _serve(listener, startup_environment(os.environ), paths, float(os.environ.get(IDLE_ENV) or IDLE_SECONDS))


def _serve(listener: socket.socket, startup: dict, paths: dict, idle: float) -> None:
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    asking: dict[int, socket.socket] = {}  # fd -> a client whose request is still to come
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its client)
    listening = True
    while listening or children:
        events = poller.poll(None if children or asking else idle * 1000)
        if not events:
            return  # idle: no agent lives and nobody asked
        for ready, _ in events:
            if ready == listener.fileno():
                client, _ = listener.accept()
                if _peer_uid(client) != os.getuid():
                    client.close()
                    continue
                asking[client.fileno()] = client
                poller.register(client, select.POLLIN)
            elif ready in asking:
                client = asking.pop(ready)
                poller.unregister(ready)
                request = _receive(client)
                refused = None if request is None else _refusal(request[0], startup, paths)
                if request is None or refused:
                    for fd in request[1] if request else ():
                        os.close(fd)
                    _answer(client, {"refused": refused or "no request"})
                    client.close()
                    if refused and listening and refused != STARTUP_DIFFERS:  # stale: a new server starts
                        poller.unregister(listener)
                        listener.close()
                        listening = False
                    continue
                pid = _fork(request, listener)
                exited = os.pidfd_open(pid)
                children[exited] = (pid, client)
                poller.register(exited, select.POLLIN)
                _answer(client, {"pid": pid})
            else:
                poller.unregister(ready)
                pid, client = children.pop(ready)
                os.close(ready)
                _, status = os.waitpid(pid, 0)
                _answer(client, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})
                client.close()


def _refusal(settings: dict, startup: dict, paths: dict) -> str | None:
    """Why this server must not make this agent: it would not be what a fresh start makes."""
    if startup_environment(settings["env"]) != startup:
        return STARTUP_DIFFERS
    if _path_times() != paths:
        return "packages changed since the fork server imported IPython"
    return None


def _path_times() -> dict:
    """When each folder Python imports from last changed: an install there makes the server stale."""
    times = {}
    for folder in sys.path:
        try:
            times[folder] = os.stat(folder or ".").st_mtime_ns
        except OSError:
            times[folder] = None
    return times


def _peer_uid(client: socket.socket) -> int:
    credentials = client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", credentials)[1]


def _answer(client: socket.socket, message: dict) -> None:
    try:
        client.send(json.dumps(message).encode())
    except OSError:  # the client went (its channel closed): the agent lives on regardless
        pass
