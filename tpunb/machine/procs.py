"""The state of a process on this machine, read in one place with one rule: a zombie (ended,
not yet reaped) is not alive. Linux reads /proc/PID/stat; elsewhere signals and psutil stand in.
It runs in the kernel (local hosts, kernels owning slices), the Jupyter server and the emulator,
and is never shipped: the shipped host modules keep their own reads.
"""
from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (field 3, the state, first), or None if unreadable."""
    try:
        raw = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    return raw[raw.rindex(b")") + 2:].decode(errors="replace").split()


def alive(pid: int | None) -> bool:
    """``pid`` runs here; one that ended and waits to be reaped (a zombie) does not."""
    if not pid:
        return False
    if _PROC.is_dir():
        fields = stat_fields(pid)
        return fields is not None and fields[0] not in ("Z", "X")
    try:  # no /proc (macOS): existence is all a signal can tell
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def parent(pid: int) -> int | None:
    """The parent pid of a live process, or None if it is gone."""
    fields = stat_fields(pid)
    return int(fields[1]) if fields is not None and alive(pid) else None


def started_by(pid: int, owner: int | None) -> bool:
    """``pid`` runs and ``owner`` started it: its parent is ``owner``, or the parent of its parent
    (a local host's agent is a child of its kernel's fork server, itself the kernel's child)."""
    above = parent(pid)
    return owner is not None and above is not None and (above == owner or parent(above) == owner)


def umask() -> int:
    """This process's umask, read without setting it: ``os.umask`` can only swap, and between
    the swap and the swap back every file another thread creates would get mode 0666."""
    with open("/proc/self/status") as status:  # Linux (the fork server needs pidfd_open anyway)
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise OSError("no Umask in /proc/self/status")


def start_token(pid: int | None) -> str | None:
    """When ``pid`` started, as a token that differs for a later process given the same pid
    (/proc/PID/stat field 22, clock ticks since boot; psutil elsewhere); None where unknown."""
    if not pid:
        return None
    fields = stat_fields(pid)
    if fields is not None and len(fields) > 19:
        return fields[19]
    try:
        import psutil

        return repr(psutil.Process(pid).create_time())
    except Exception:  # no psutil, or no such process
        return None


def children() -> dict[int, list[int]]:
    """Every live process's children, by parent pid (one pass over /proc)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir(_PROC) if _PROC.is_dir() else ():
        if entry.isdigit():
            fields = stat_fields(int(entry))
            if fields is not None and fields[0] not in ("Z", "X"):
                tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, parents before their children."""
    tree, out, todo = children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def started_with(setting: str) -> list[int]:
    """Every live process whose environment began with ``setting`` (``NAME=value``, or a prefix of
    one): a host's processes that left its process tree, found by what every one of them inherited."""
    wanted, found = setting.encode(), []
    for entry in os.listdir(_PROC) if _PROC.is_dir() else ():
        if entry.isdigit():
            try:
                environment = (_PROC / entry / "environ").read_bytes()
            except OSError:
                continue
            if any(item.startswith(wanted) for item in environment.split(b"\0")) and alive(int(entry)):
                found.append(int(entry))
    return found
