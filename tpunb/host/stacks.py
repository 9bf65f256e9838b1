"""Where every thread of the agent is, readable while its main thread is blocked in C.

Shipped to hosts: standard library only. Two halves:

- ``install`` (in the agent): ``faulthandler.register`` on SIGNAL, writing into a memfd. The dump
  is written by a C signal handler, so it works whether the main thread is stuck in an XLA
  collective, a barrier or a blocked read, with the GIL held or not; no Python thread of the agent
  has to run.
- ``read`` (outside the agent: in the kernel for hosts on its machine, else in a short-lived
  ``python -S`` the transport starts on the host, ``bundle.STACKS_READER``): signal the agent,
  read what the handler appended to ``/proc/PID/fd/N``, and with ``native`` also run py-spy on it.
"""
from __future__ import annotations

import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SIGNAL = signal.SIGUSR2
#: a dump is complete once it ends a line and has not grown for this long (the handler writes it
#: in one go, in microseconds; a loaded machine may pause it a little)
QUIET = 0.02
#: how long a process gets to start its dump after the signal
ANSWER = 2.0
PYSPY_TIMEOUT = 20.0

_kept = []  # the dump file of this process: faulthandler writes to it for the agent's whole life


def install() -> dict | None:
    """Dump every thread's stack into a file on SIGNAL; where to read it, or None if impossible."""
    try:
        fd = os.memfd_create("tpunb-stacks", getattr(os, "MFD_CLOEXEC", 0))  # no file left behind, ever
        path = f"/proc/{os.getpid()}/fd/{fd}"
    except (AttributeError, OSError):  # no memfd: a temp file, unlinked where /proc reaches it anyway
        fd, path = tempfile.mkstemp(prefix="tpunb-stacks-")
        if os.path.isdir(f"/proc/{os.getpid()}/fd"):
            os.unlink(path)
            path = f"/proc/{os.getpid()}/fd/{fd}"
    try:
        dump = os.fdopen(fd, "w")
        faulthandler.register(SIGNAL, file=dump, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError):
        return None
    _kept.append(dump)
    return {"signal": int(SIGNAL), "path": path, "main": threading.get_ident()}


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, D, T, Z, ...) from /proc; None if it is gone; '?' without /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except FileNotFoundError:
        return None
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "?"


def _unable(pid: int) -> dict | None:
    """Why ``pid`` cannot write a dump now (gone, stopped), or None."""
    state = _state(pid)
    if state is None or state in "ZX":
        return {"error": "its process is gone", "state": "gone"}
    if state in "Tt":
        return {"error": "its process is stopped (SIGSTOP, or a debugger holds it): it cannot answer", "state": "stopped"}
    return None


def dump(pid: int, sig: int, path: str, answer: float = ANSWER) -> dict:
    """Signal ``pid`` and return ``{"text": ...}`` with what its handler appended to ``path``, or
    ``{"error": why, "state": "gone"|"stopped"|"silent"}``."""
    unable = _unable(pid)
    if unable:
        return unable
    try:
        f = open(path, "rb")
    except OSError as exc:
        return {"error": f"cannot read its stack dump ({exc.strerror or exc})", "state": "gone"}
    with f:
        start = os.fstat(f.fileno()).st_size
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return {"error": "its process is gone", "state": "gone"}
        except PermissionError as exc:
            return {"error": f"cannot signal it ({exc.strerror})", "state": "silent"}
        began = time.monotonic()
        size, changed = start, began
        while True:
            now = time.monotonic()
            grown = os.fstat(f.fileno()).st_size
            if grown != size:
                size, changed = grown, now
            elif size > start and now - changed >= QUIET and _ends_line(f, size):
                break
            if size == start and now - began > answer:  # stopped meanwhile, or ended?
                return _unable(pid) or {"error": f"it did not write its stacks within {answer:g} s of the "
                                                 "signal (frozen?)", "state": "silent"}
            if now - began > answer + 3.0:
                break  # a dump that never settles: what came is what there is
            time.sleep(0.002)
        f.seek(start)
        return {"text": f.read(size - start).decode("utf-8", "replace")}


def _ends_line(f, size: int) -> bool:
    f.seek(size - 1)
    return f.read(1) == b"\n"


def pyspy_path() -> str | None:
    """py-spy beside this Python (the host environment's bin), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def native(pid: int, timeout: float = PYSPY_TIMEOUT) -> dict:
    """py-spy's dump of ``pid`` with native frames: ``{"threads": [...]}`` (its JSON) or ``{"error": why}``."""
    tool = pyspy_path()
    if tool is None:
        return {"error": "py-spy is not installed here (pip install py-spy in the host's environment)", "missing": True}
    argv = [tool, "dump", "--pid", str(pid), "--native", "--json"]
    for attempt in (argv, ["sudo", "-n", *argv]):  # ptrace may need root (Yama's ptrace_scope 1)
        try:
            done = subprocess.run(attempt, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"py-spy took longer than {timeout:g} s"}
        except OSError as exc:
            return {"error": f"py-spy could not run ({exc.strerror or exc})"}
        if done.returncode == 0:
            try:
                return {"threads": json.loads(done.stdout)}
            except ValueError:
                return {"error": "py-spy's output was not JSON"}
        said = (done.stderr.decode(errors="replace").strip().splitlines() or ["no reason given"])[-1]
        if "ermission" not in said or not shutil.which("sudo"):
            break
    return {"error": f"py-spy failed: {said[:300]}"}


def read(request: dict) -> dict:
    """One host's answer: its Python stacks (and py-spy's native ones with ``native``)."""
    pid = int(request["pid"])
    reply = dump(pid, int(request["signal"]), request["path"], float(request.get("answer", ANSWER)))
    if request.get("native") and "text" in reply:
        reply["native"] = native(pid)
    return reply
