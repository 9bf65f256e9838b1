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

The server runs no thread: a fork copies only the thread that calls it. Shipped to hosts:
standard library only.
"""
from __future__ import annotations

import array
import json
import os
import select
import socket

from . import agent

#: the largest request (an environment of a few hundred variables is some 20 kB)
MAX_REQUEST = 1 << 20


def main(fd: int) -> None:
    """Serve the kernel on socket ``fd`` until it goes away."""
    try:
        import IPython.core.interactiveshell  # noqa: F401 - the import every agent shares is the point
    except Exception:  # no IPython here: agents fall back to plain exec, as started ones do
        pass
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
        agent.main()
    finally:
        os._exit(0)
