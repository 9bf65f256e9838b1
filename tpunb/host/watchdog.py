"""The watchdog: a small process beside the agent that makes a host session end as a whole.

- The agent dies (killed, crashed): every process its cells started (its session and process
  group) is killed, so nothing keeps the chips or runs on unattended.
- The kernel goes away (our stdin is hung up) while the agent cannot notice, because it is
  frozen (SIGSTOP) or ignores the end of its stdin: the agent's group is woken (SIGCONT) and given
  ``GRACE`` seconds to end by itself, then everything is killed.

It is forked before the agent starts any thread, then leaves the agent's session, so stopping or
killing the agent's process group does not reach it. Shipped to hosts: standard library only.
"""
from __future__ import annotations

import os
import select
import signal
import time

GRACE = 2.0
POLL_SECONDS = 0.25


def start() -> int | None:
    """Fork the watchdog of this process (the agent, whose frames arrive on fd 0); its pid, or None
    where there is no fork."""
    if not hasattr(os, "fork"):
        return None
    agent, sid, pgid = os.getpid(), os.getsid(0), os.getpgid(0)
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (1, 2):  # never hold the agent's stdout/stderr: the kernel sees its end of stream
            os.dup2(devnull, fd)
        os.closerange(3, 65536)
        _watch(0, agent, sid, pgid)
    finally:
        os._exit(0)


def _watch(stdin_fd: int, agent: int, sid: int, pgid: int) -> None:
    poller = select.poll()
    poller.register(stdin_fd, getattr(select, "POLLRDHUP", 0))  # hang-up only: never reads the agent's frames
    try:
        agent_fd = os.pidfd_open(agent)  # readable once the agent has exited
        poller.register(agent_fd, select.POLLIN)
    except (AttributeError, OSError):
        agent_fd = None
    hung_up_at = None
    while True:
        # with a pidfd every end shows as an event: no need to wake (256 idle hosts woke 1,000 times a second)
        wait = -1 if agent_fd is not None and hung_up_at is None else int(POLL_SECONDS * 1000)
        events = dict(poller.poll(wait))
        if os.getppid() != agent or (agent_fd is not None and agent_fd in events):
            end_session(sid, pgid)
            return
        if hung_up_at is None and stdin_fd in events:
            poller.unregister(stdin_fd)
            hung_up_at = time.monotonic()
            _signal_group(pgid, signal.SIGCONT)  # a frozen agent wakes, reads its end of stdin, ends itself
        if hung_up_at is not None and time.monotonic() - hung_up_at > GRACE:
            end_session(sid, pgid)
            return


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def end_session(sid: int, pgid: int) -> None:
    """SIGKILL the group and every process of the session (cells may start their own groups)."""
    for sig in (signal.SIGKILL, signal.SIGCONT):
        _signal_group(pgid, sig)
    for pid in members(sid=sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def members(pgid: int | None = None, sid: int | None = None) -> list[int]:
    """Processes (other than this one) in process group ``pgid`` or session ``sid``, from Linux's
    /proc; elsewhere, none."""
    me, found = os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if (pgid is not None and int(fields[2]) == pgid) or (sid is not None and int(fields[3]) == sid):
                found.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return found
