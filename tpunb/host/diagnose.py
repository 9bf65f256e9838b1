"""What a host finds out about itself so that the kernel can name what is wrong in one line:
its package versions (sent in the hello, read without importing them), which processes hold
the TPU, and whether the JAX coordinator's port answers at all.

Shipped to hosts: standard library only (see the package docstring).
"""
from __future__ import annotations

import errno
import glob
import os
import socket
import time

#: the packages whose versions must agree across a slice (jax #10218: the first question asked)
PACKAGES = ("jax", "jaxlib", "libtpu", "flax")
#: distributions that provide a package under another name (older libtpu wheels)
ALIASES = {"libtpu": ("libtpu", "libtpu-nightly")}
#: where the TPU's device files are (colon-separated globs); tests point this at plain files
DEVICES_ENV = "TPUNB_TPU_DEVICES"
DEFAULT_DEVICES = "/dev/accel*:/dev/vfio/[0-9]*"
#: the lock libtpu takes; left behind by a killed run it blocks the next (jax #10192)
LOCKFILE_ENV = "TPUNB_LIBTPU_LOCKFILE"
DEFAULT_LOCKFILE = "/tmp/libtpu_lockfile"


def versions() -> dict:
    """Python and PACKAGES versions (None: not installed), from package metadata: importing jax
    would cost seconds and start its backend."""
    import importlib.metadata as metadata
    import platform

    found = {"python": platform.python_version()}
    for package in PACKAGES:
        found[package] = None
        for dist in ALIASES.get(package, (package,)):
            try:
                found[package] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
            except Exception:  # a broken dist-info must not stop the agent
                break
    return found


def device_paths() -> list[str]:
    """The TPU device files this process would open (none on a CPU machine): with
    TPU_VISIBLE_CHIPS (processes sharing a VM's chips), only its own chips' accel files."""
    patterns = os.environ.get(DEVICES_ENV) or DEFAULT_DEVICES
    paths = sorted(p for pattern in patterns.split(":") if pattern for p in glob.glob(pattern))
    visible = os.environ.get("TPU_VISIBLE_CHIPS", "").strip()
    if visible:
        chips = {f"accel{c.strip()}" for c in visible.split(",")}
        paths = [p for p in paths if not os.path.basename(p).startswith("accel") or os.path.basename(p) in chips]
    return paths


def lockfile() -> str:
    return os.environ.get(LOCKFILE_ENV) or DEFAULT_LOCKFILE


def holders(paths: list[str]) -> list[dict]:
    """Processes with one of ``paths`` (files, or 'socket:[INODE]') open: pid, command line, age in
    seconds, path. Only
    processes this user may inspect are seen (all of them as root)."""
    wanted = {p if p.startswith("socket:[") else os.path.realpath(p) for p in paths}
    found, boot, tick = [], _boot_time(), os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            links = [os.readlink(f"{fd_dir}/{fd}") for fd in os.listdir(fd_dir)]
        except OSError:  # gone, or not ours to read
            continue
        held = sorted(wanted.intersection(links))
        if held:
            found.append({"pid": int(entry), "command": _command(entry), "age_s": _age(entry, boot, tick),
                          "path": held[0]})
    return found


def tpu_busy(host: int, own: set[int] | None = None) -> str | None:
    """One line saying what keeps JAX from the TPU here (another process holds a device file, or
    a stale libtpu lock file), with the %tpu_run line that frees it; None if nothing does."""
    own = own or {os.getpid()}
    lock = lockfile()
    devices = device_paths()
    if not devices and not os.path.exists(lock):
        return None
    others = [h for h in holders(devices + [lock]) if h["pid"] not in own]
    if others:
        first = others[0]
        pids = " ".join(str(h["pid"]) for h in others)
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        return (f"the TPU on host {host} is held by pid {first['pid']} ({first['command']}, running "
                f"{_duration(first['age_s'])}, has {first['path']} open){more}: free it with "
                f"%tpu_run --hosts {host} kill {pids}")
    try:
        owner = os.stat(lock).st_uid
    except OSError:
        return None
    if owner != os.getuid() and os.getuid() != 0:  # their processes are hidden from us: maybe not stale
        return (f"{lock} on host {host} belongs to another user, whose run holds the TPU or left it: look with "
                f"%tpu_run --hosts {host} sudo lsof -w /dev/accel* /dev/vfio/*, then sudo rm -f {lock}")
    return (f"a stale {lock} on host {host} (left by a run that was killed) blocks the TPU: free it with "
            f"%tpu_run --hosts {host} rm -f {lock}")


#: what JAX and libtpu say when they cannot take the chips (jax #10192, openxla/xla#4666)
BUSY_SIGNS = ("TPU is already in use", "libtpu.so already in use", "Device or resource busy", "libtpu_lockfile")


def explain_error(text: str) -> str | None:
    """For an error JAX raised because it could not take the TPU: the one line that says who holds
    it and how to free it (or how to find a holder this user cannot see); None for other errors."""
    if not any(sign in text for sign in BUSY_SIGNS):
        return None
    host = int(os.environ.get("TPUNB_HOST_INDEX", "0") or 0)
    return tpu_busy(host) or (f"another user's process holds the TPU on host {host}: find it with "
                              f"%tpu_run --hosts {host} sudo lsof -w /dev/accel* /dev/vfio/*")


def port_taken(port: int, deadline_s: float = 5.0) -> str | None:
    """On the coordinator's host, before JAX binds ``port``: None once it is free (a coordinator
    that just ended may hold it a moment), else one line naming who holds it and how to free it."""
    stop = time.monotonic() + deadline_s
    while True:
        try:
            family = socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET
            with socket.socket(family) as s:  # JAX binds [::]:port, which an IPv4 listener also blocks
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("", port))
            return None
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return None  # not ours to judge (no IPv6 here, ...): JAX says what it finds
        if time.monotonic() >= stop:
            break
        time.sleep(0.1)
    found = holders([f"socket:[{inode}]" for inode in _listening(port)])
    fix = "pick another with --coordinator-port"
    if not found:
        return f"port {port}, JAX's coordinator port, is taken on host 0 by a process this user cannot see: {fix}"
    first = found[0]
    return (f"port {port}, JAX's coordinator port, is taken on host 0 by pid {first['pid']} ({first['command']}, "
            f"running {_duration(first['age_s'])}): free it with %tpu_run --hosts 0 kill {first['pid']}, or {fix}")


def _listening(port: int) -> set[str]:
    """Inodes of the sockets listening on ``port`` (/proc/net/tcp and tcp6; state 0A is LISTEN)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        for row in rows:
            if len(row) > 9 and row[3] == "0A" and int(row[1].rpartition(":")[2], 16) == port:
                inodes.add(row[9])
    return inodes


def probe(address: str, deadline_s: float = 5.0, attempt_s: float = 1.0) -> str | None:
    """Whether packets reach ``host:port``: None if they do, else why not. An answer of any kind
    counts, a refusal too (the coordinator starts its service a moment later, inside host 0's
    jax.distributed.initialize); only silence until ``deadline_s`` (a firewall dropping packets)
    or an unreachable network fails."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    stop = time.monotonic() + deadline_s
    why = "no answer"
    while True:
        left = stop - time.monotonic()
        if left <= 0:
            return f"{why} in {deadline_s:g} s"
        try:
            with socket.create_connection((host, int(port)), timeout=min(attempt_s, left)):
                return None
        except ConnectionRefusedError:
            return None
        except socket.timeout:
            why = "no answer"
        except OSError as exc:
            if exc.errno in (errno.ECONNRESET,):
                return None
            why = exc.strerror or str(exc)
            time.sleep(min(0.2, max(0.0, stop - time.monotonic())))


def answer(jax_config: dict | None, probe_s: float) -> dict:
    """Every check at once, for the kernel's ``diagnose`` request (%tpu_doctor): versions, what
    holds the TPU, and whether the coordinator answers (None: fine, or nothing to check)."""
    kwargs = (jax_config or {}).get("kwargs") or {}
    host = kwargs.get("process_id", int(os.environ.get("TPUNB_HOST_INDEX", "0") or 0))
    address = kwargs.get("coordinator_address") if (jax_config or {}).get("initialize", True) else None
    silence = probe(address, probe_s) if address else None
    return {"status": "ok", "versions": versions(), "tpu_busy": tpu_busy(host),
            "coordinator": f"host {host} cannot reach the JAX coordinator at {address} ({silence})" if silence else None}


def _boot_time() -> float:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def _command(pid: str) -> str:
    """The process's command line, its program by name only, cut to fit a line."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().decode("utf-8", "replace").rstrip("\0").split("\0")
    except OSError:
        words = []
    if words and words[0]:
        words[0] = os.path.basename(words[0])
    text = " ".join(words).strip()
    return (text[:97] + "...") if len(text) > 100 else (text or "?")


def _age(pid: str, boot: float, tick: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return max(0.0, time.time() - (boot + int(fields[19]) / tick))
    except (OSError, IndexError, ValueError):
        return None


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "for an unknown time"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
