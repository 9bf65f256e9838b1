"""An agent's start on an SSH host that runs a fork server (``forkserver.serve``): what sshd runs
on the agent's exec channel instead of a fresh Python that imports IPython.

It connects to the server's abstract Unix socket (``socket_name``: the tpunb bundle's digest is
its first argument), checks that this user runs the server, hands over
the channel's stdin, stdout and stderr, and says the agent's pid on stderr as every start does
(``tpunb-pid PID``: the process group the kernel signals is the agent's own). It then waits for
the agent to end and ends the same way, so sshd reports the agent's exit status or signal. If
there is no server to ask, or it refuses, it says ``tpunb-nofork REASON`` and exits: the kernel
starts a fresh agent instead.

Standalone: the standard library only, no relative import (it runs as ``python3 -I -S -c``)."""
from __future__ import annotations

import array
import hashlib
import json
import os
import select
import signal
import socket
import struct
import sys

PID_MARK = "tpunb-pid "
NO_FORK = "tpunb-nofork "
#: the exit code of a start the server did not make (the kernel has started a fresh one by then)
REFUSED = 75


#: what a process reads from its environment only as it starts (``forkserver.startup_environment``)
STARTUP_PREFIXES = ("PYTHON", "LD_", "LC_")
STARTUP_NAMES = ("LANG", "LANGUAGE", "TZ", "HOME")


def socket_name(digest: str) -> str:
    """The fork server's abstract socket for this user, this Python, these start-up settings and
    this tpunb (``digest``: its bundle's): a server serves only starts it would make alike."""
    startup = sorted((k, v) for k, v in os.environ.items() if k.startswith(STARTUP_PREFIXES) or k in STARTUP_NAMES)
    key = json.dumps([os.getuid(), sys.executable, startup, digest]).encode()
    return "tpunb-fork-" + hashlib.sha256(key).hexdigest()[:32]


def _say(line: str) -> None:
    os.write(2, (line + "\n").encode())


def _umask() -> int:
    mask = os.umask(0)  # one thread here: reading it by setting it is safe
    os.umask(mask)
    return mask


def _wait_gone(pid: int) -> None:
    """Until ``pid`` (no child of ours) has ended."""
    try:
        exited = os.pidfd_open(pid)
    except OSError:
        return
    try:
        select.select([exited], [], [])
    finally:
        os.close(exited)


def _end_as(code: int) -> None:
    """Exit as the agent did: the same status, or killed by the same signal."""
    if code < 0:
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL and SIGSTOP keep theirs
            pass
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


def main(digest: str) -> int:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        server.connect("\0" + socket_name(digest))
        credentials = server.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", credentials)[1] != os.getuid():
            raise PermissionError("another user holds the fork server's name")
        request = json.dumps({"env": dict(os.environ), "cwd": os.getcwd(), "umask": _umask()}).encode()
        server.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
        answer = json.loads(server.recv(1 << 16) or b"{}")
    except (OSError, ValueError) as exc:
        _say(f"{NO_FORK}{type(exc).__name__}: {exc}")
        return REFUSED
    if "pid" not in answer:
        _say(f"{NO_FORK}{answer.get('refused') or 'the fork server ended'}")
        return REFUSED
    pid = int(answer["pid"])
    _say(f"{PID_MARK}{pid}")
    for fd in (0, 1):  # the agent holds the channel's streams now
        os.close(fd)
    try:
        ended = json.loads(server.recv(1 << 16) or b"{}")
    except (OSError, ValueError):
        ended = {}
    if "code" in ended:
        _end_as(int(ended["code"]))
    _wait_gone(pid)  # the server went first: its agents' codes are lost
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
