"""The hosts behind emulated TPU nodes: addresses from a pool, and who may log in to them.

With a pool (``--ssh-hosts 127.0.0.2,127.0.0.3``, all served by one sshd on ``--ssh-port``),
each node gets real addresses tpunb can SSH into. Without a pool, nodes get made-up 10.x / 34.x
addresses that nothing ever connects to.

Logins, as a VM's guest agent and OS Login make them. With ``accounts`` (a directory an
``Sshd`` keeps: a passwd file its sshd reads through nss_wrapper, and ``keys/ADDRESS/USER``, the
AuthorizedKeysFile of USER on that address), a READY node's hosts get a login per user: the
``USER:KEY`` lines of its ``ssh-keys`` metadata, or under OS Login the POSIX users of the OS Login
profiles (accounts.py), never both. Each user is made to exist, as the guest agent's useradd and
OS Login's NSS module make it, and the node's keys go when the node does. Without ``accounts``
(an sshd of another kind), the keys are appended to ``authorized_keys`` for whatever user logs
in, each line marked ``tpunb-emulator:<instance>:<node>`` so exactly our lines are removed.

With ``host_keys`` (address -> the key file and pid file of that address's own sshd, an ``Sshd``
with ``host_keys``), every new VM on an address gets a host key of its own (``rekey``), which
Compute Engine VMs publish as guest attributes under ``hostkeys/`` (compute.py).

With ``host_environment`` (address -> the variables that host's processes see, as the sshd sets
them), hosts also boot and power off: a READY node's ``startup-script`` runs once per worker
with that host's environment (as a VM's boot runs it), and when the node is gone every process
carrying that host's ``TPUNB_HOST_DIR`` ends and that directory (the VM's disk) is emptied.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import re
import shutil
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpunb.machine import procs

MARKER = "tpunb-emulator:"
KEY_TYPES = ("ssh-", "ecdsa-", "sk-ssh-", "sk-ecdsa-")


@dataclass(frozen=True)
class Endpoint:
    """One worker's addresses, as networkEndpoints reports them."""

    internal_ip: str
    external_ip: str | None


def parse_ssh_keys(metadata_value: str) -> list[str]:
    """Public key lines from GCP ``ssh-keys`` metadata (``user:ssh-ed25519 AAAA... comment``)."""
    return [key for _, key in parse_user_keys(metadata_value)]


def parse_user_keys(metadata_value: str) -> list[tuple[str, str]]:
    """(user, key) per line of ``ssh-keys`` metadata; a line without ``USER:`` has user ""."""
    found = []
    for line in (metadata_value or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, rest = line.partition(":")
        if sep and " " not in user and rest.lstrip().startswith(KEY_TYPES):
            found.append((user, rest.strip()))
        elif line.startswith(KEY_TYPES):
            found.append(("", line))
    return found


def _wipe(directory: str) -> None:
    """Empty a VM's disk at once (a rename) and delete what it held on a thread: a disk with an
    environment tpunb made holds thousands of files, and the emulator's lock must not wait on them."""
    trash = f"{directory}.wiped-{os.urandom(4).hex()}"
    try:
        os.rename(directory, trash)
    except OSError:
        return  # nothing there
    threading.Thread(target=shutil.rmtree, args=(trash,), kwargs={"ignore_errors": True}, daemon=True,
                     name="tpu-emulator-wipe").start()


def processes_of(host_dir: str) -> list[int]:
    """The live processes of the VM whose TPUNB_HOST_DIR is ``host_dir`` (by their environment; a
    zombie's reads empty), this one excepted."""
    marker = f"TPUNB_HOST_DIR={host_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _ended(host_dirs: list[str], deadline: float) -> bool:
    """Whether every process of these VMs ends before ``deadline``: waits on each one's pidfd (an exit
    wakes it, a zombie counts as ended), then looks again for any started meanwhile."""
    while pids := [p for d in host_dirs for p in processes_of(d)]:
        waiting = []
        try:
            for pid in pids:
                try:
                    waiting.append(os.pidfd_open(pid))
                except ProcessLookupError:
                    continue  # ended between the look and now
            poller = select.poll()
            for fd in waiting:
                poller.register(fd, select.POLLIN)
            left = len(waiting)
            while left:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                for fd, _ in poller.poll(remaining * 1000):
                    poller.unregister(fd)
                    left -= 1
        except OSError:  # no pidfds here (Linux before 5.3): the window ends the guest
            return False
        finally:
            for fd in waiting:
                os.close(fd)
    return time.monotonic() < deadline


def _stop_then_kill(host_dir: str) -> None:
    """SIGSTOP every process of the VM, with its whole process group (a fork keeps its parent's
    group, and a signal to a group reaches a child being forked too), until a look finds none not
    stopped already; then SIGKILL them all. A stopped process cannot fork, so when a look finds only
    processes stopped by earlier looks, none is missing. Killing look by look missed a process that
    forks its successor and exits faster than a look over /proc (a loaded CI run: it then forked
    forever)."""
    stopped: set[int] = set()
    groups: set[int] = set()
    mine = {os.getpgrp(), 0, 1}
    for _ in range(1000):
        fresh = [pid for pid in processes_of(host_dir) if pid not in stopped]
        if not fresh:
            break
        for pid in fresh:
            try:
                group = os.getpgid(pid)
                if group not in mine and group not in groups:
                    os.killpg(group, signal.SIGSTOP)
                    groups.add(group)
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
            stopped.add(pid)
    ending = []
    for pid in stopped:
        try:
            ending.append(os.pidfd_open(pid))
        except OSError:
            continue
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            continue
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    for fd in ending:  # readable once that process has ended: gone from a look, as a VM powered off is
        select.select([fd], [], [], 5.0)
        os.close(fd)


def _sshd_session(pid: int) -> int | None:
    """The nearest sshd above ``pid``: the session process of its connection (the listener is
    further up, above the connection's monitor)."""
    for _ in range(8):
        parent = procs.parent(pid)
        if parent is None or parent <= 1:
            return None
        try:
            with open(f"/proc/{parent}/comm") as f:
                name = f.read().strip()
        except OSError:
            return None
        if name == "sshd":
            return parent
        pid = parent
    return None


#: where a VM without a way out of its VPC sends HTTPS: the discard port, which refuses (as no route would)
NO_EGRESS = "http://127.0.0.1:9"


class HostPool:
    """Hands out worker addresses per node and keeps the authorized keys file in step."""

    def __init__(
        self,
        addresses: list[str] | None = None,
        ssh_port: int = 22,
        authorized_keys: str | Path | None = None,
        host_environment: dict[str, dict[str, str]] | None = None,
        accounts: str | Path | None = None,
        vm_image: dict | None = None,
        host_keys: dict[str, dict[str, str]] | None = None,
        shared_host_key: str | None = None,
    ) -> None:
        self.addresses = list(addresses or [])
        self.host_keys = {a: dict(v) for a, v in (host_keys or {}).items()}
        #: the public line of the one host key every address shows (an sshd without ``host_keys``)
        self.shared_host_key = shared_host_key
        #: what Compute Engine VMs are made of (Sshd.emulator_options): {"pythons": {X.Y: bin dir},
        #: "nss_wrapper": its library, "hosts_file": the names every VM resolves}
        self.vm_image = dict(vm_image or {})
        if accounts is None and authorized_keys and (Path(authorized_keys).parent / "accounts").is_dir():
            accounts = Path(authorized_keys).parent / "accounts"  # an Sshd keeps its accounts beside its keys
        self.accounts = Path(accounts) if accounts else None
        self.host_environment = {a: dict(env) for a, env in (host_environment or {}).items()}
        self._boot_dir: str | None = None
        self.ssh_port = ssh_port
        self.authorized_keys = Path(authorized_keys) if authorized_keys else None
        self._owner: dict[str, str] = {}  # address -> node name
        self._fake: dict[str, list[Endpoint]] = {}
        self._counter = itertools.count(2)
        self._lock = threading.Lock()
        self._tag = f"{MARKER}{os.getpid()}-{os.urandom(3).hex()}:"

    @property
    def real(self) -> bool:
        """True when nodes get addresses of real SSH hosts."""
        return bool(self.addresses)

    def free(self) -> int:
        with self._lock:
            return len(self.addresses) - len(self._owner)

    def allocate(self, owner: str, count: int, external: bool) -> list[Endpoint] | None:
        """``count`` endpoints for ``owner``, or None when the pool cannot hold them (stockout)."""
        with self._lock:
            if self.real:
                free = [a for a in self.addresses if a not in self._owner]
                if len(free) < count:
                    return None
                for address in free[:count]:
                    self._owner[address] = owner
                return [Endpoint(a, a if external else None) for a in free[:count]]
            endpoints = []
            for _ in range(count):
                n = next(self._counter)
                endpoints.append(
                    Endpoint(
                        f"10.130.{n // 250 % 250}.{n % 250 + 2}",
                        f"34.{120 + n // 62500 % 100}.{n // 250 % 250}.{n % 250 + 2}" if external else None,
                    )
                )
            self._fake[owner] = endpoints
            return endpoints

    def release(self, owner: str) -> None:
        """Give ``owner``'s addresses back to the pool (powered off) and drop its keys."""
        self.remove_keys(owner)
        with self._lock:
            for address in [a for a, o in self._owner.items() if o == owner]:
                del self._owner[address]
                self.power_off(address)
                if profile := self.host_environment.get(address, {}).get("BASH_ENV"):
                    Path(profile).unlink(missing_ok=True)  # a Compute Engine VM's settings go with it
            self._fake.pop(owner, None)

    def rekey(self, address: str, timeout: float = 10.0) -> str | None:
        """A new host key for ``address``'s sshd (a new VM there): the key file replaced, then
        SIGHUP, on which sshd executes itself again and reads it (its open connections stay);
        returns the key's public line once it listens again. Without ``host_keys`` the address keeps
        the key every address shows (``shared_host_key``: what its VM publishes), or None."""
        from tpunb.sandbox.hosts.sshd import write_ed25519

        files = self.host_keys.get(address)
        if not files:
            return self.shared_host_key
        key, pid_file = Path(files["key"]), Path(files["pid_file"])
        fresh = key.with_name(f".{key.name}.{os.urandom(3).hex()}")
        line = write_ed25519(fresh)
        os.replace(fresh, key)
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return line  # not running: it reads the new key when it starts
        pid_file.unlink(missing_ok=True)
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while not pid_file.exists() and time.monotonic() < deadline:  # written once it listens again
            time.sleep(0.005)
        return line

    def owner_of(self, address: str) -> str | None:
        """The node holding ``address``, if any."""
        with self._lock:
            return self._owner.get(address)

    def configure(self, address: str, python: str, devices: int, names: dict[str, str], egress: bool = True) -> None:
        """Make ``address`` the VM a Compute Engine machine type gives: the image's Python ``python``
        first on PATH, ``devices`` JAX devices, and every instance's bare name resolving to its address
        (nss_wrapper's hosts file, as the VMs' DNS resolves instance names). It lives in the host's
        BASH_ENV profile, which every command (bash -c) and boot script sources; releasing the host
        removes it, so a Cloud TPU node's hosts stay the image the sandbox started with. Without
        ``egress`` (no external IP, no Cloud NAT) HTTPS leaves only through a proxy that refuses
        (``NO_EGRESS``), which urllib and uv both honour: PyPI is out of reach, the sandbox's own
        plain-HTTP APIs and metadata server are not."""
        profile = self.host_environment.get(address, {}).get("BASH_ENV")
        if not profile or not self.vm_image:
            return
        bin_dir = self.vm_image["pythons"].get(python)
        if bin_dir is None:
            raise ValueError(f"the sandbox has no Python {python} for this machine type's image: pyenv install {python}")
        hosts_file = Path(self.vm_image["hosts_file"])
        hosts_file.parent.mkdir(parents=True, exist_ok=True)
        hosts_file.write_text("".join(f"{ip} {name}\n" for name, ip in sorted(names.items())))
        Path(profile).parent.mkdir(parents=True, exist_ok=True)
        Path(profile).write_text(
            f"export PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin\n"
            f"export XLA_FLAGS=--xla_force_host_platform_device_count={devices}\n"
            f"export NSS_WRAPPER_HOSTS={hosts_file} LD_PRELOAD={self.vm_image['nss_wrapper']}\n"
            "export GRPC_DNS_RESOLVER=native\n"  # gRPC's c-ares would skip nss_wrapper: names through getaddrinfo
            + ("" if egress else f"export HTTPS_PROXY={NO_EGRESS} https_proxy={NO_EGRESS}\n"))

    def boot(self, address: str, script: str) -> None:
        """Run a startup-script as ``address``'s boot does: its environment, its own session."""
        env = self.host_environment.get(address)
        if env is None or not script.strip():
            return
        if self._boot_dir is None:
            self._boot_dir = tempfile.mkdtemp(prefix="tpunb-emulator-boot-")
        path = Path(self._boot_dir) / f"startup-{address}-{os.urandom(3).hex()}"
        path.write_text(script)
        path.chmod(0o700)
        command = [str(path)] if script.startswith("#!") else ["/bin/bash", str(path)]
        base = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                "HOME": os.environ.get("HOME", "/root")}
        with open(f"{path}.log", "ab") as log:
            proc = subprocess.Popen(command, env={**base, **env}, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=log, start_new_session=True, cwd="/")
        threading.Thread(target=proc.wait, daemon=True, name=f"tpu-emulator-boot-{address}").start()

    def power_off(self, address: str) -> None:
        """End every process of ``address`` (those carrying its TPUNB_HOST_DIR) and empty that dir.
        Every one is stopped before any is killed (``_stop_then_kill``): a process forked between a
        look and the kills (a watchdog being spawned) would outlive its VM, and hold the next node's
        host dir."""
        host_dir = self.host_environment.get(address, {}).get("TPUNB_HOST_DIR")
        if host_dir:
            _stop_then_kill(host_dir)
            _wipe(host_dir)
            home = self.host_environment.get(address, {}).get("HOME", "")
            if home.startswith(host_dir.rstrip("/") + "/"):  # the next VM on this address has a fresh, empty home
                os.makedirs(home, exist_ok=True)

    def shut_down(self, addresses: list[str], window: float, then: Callable[[], None]) -> None:
        """A guest's shutdown (the preemption notice's ACPI soft-off): SIGTERM to every process of
        ``addresses`` and to the sshd session above each (sshd stops, so connections drop); then, on a
        thread, ``then()`` once every one of those processes (and any started since) has ended, if that
        is within ``window`` seconds. Compute Engine gives the guest up to the window to stop; a guest
        that stops sooner is off sooner. A VM with no process of ours keeps the whole window (how long
        a bare guest takes to halt is not modelled)."""
        dirs = [d for a in addresses if (d := self.host_environment.get(a, {}).get("TPUNB_HOST_DIR"))]
        running = any(processes_of(d) for d in dirs)  # looked for before the signal, which may end them at once
        for address in addresses:
            self.signal_processes(address, signal.SIGTERM, sessions=True)
        if running:
            threading.Thread(target=lambda: _ended(dirs, time.monotonic() + window) and then(), daemon=True,
                             name="tpu-emulator-shutdown").start()

    def signal_processes(self, address: str, sig: int, sessions: bool = False) -> str | None:
        """Send ``sig`` to every process of ``address``; its TPUNB_HOST_DIR, or None for a host
        without one. ``sessions``: also to the sshd session process above each (the guest's
        shutdown stops sshd, so its connections drop), never to the sshd that serves every host."""
        return self._signal(address, sig, sessions)[0]

    def _signal(self, address: str, sig: int, sessions: bool = False) -> tuple[str | None, int]:
        """``signal_processes``, and how many processes it found (whether or not they lived to get it)."""
        host_dir = self.host_environment.get(address, {}).get("TPUNB_HOST_DIR")
        if not host_dir:
            return None, 0
        found = processes_of(host_dir)
        targets = set(found) | ({session for pid in found if (session := _sshd_session(pid))} if sessions else set())
        for pid in targets:
            try:
                os.kill(pid, sig)
            except OSError:
                continue
        return host_dir, len(found)

    def close(self) -> None:
        """Power off every host still held and remove the boot scripts."""
        with self._lock:
            for address in list(self._owner):
                self.power_off(address)
        if self._boot_dir:
            shutil.rmtree(self._boot_dir, ignore_errors=True)

    def set_logins(self, owner: str, logins: dict[str, list[str]]) -> int:
        """Who may log in to ``owner``'s hosts now: user -> keys (replacing what was there); without
        an accounts directory every key goes to authorized_keys. Returns how many keys."""
        if self.accounts is None:
            return self.install_keys(owner, "\n".join(k for keys in logins.values() for k in keys))
        with self._lock:
            addresses = [a for a, o in self._owner.items() if o == owner]
        for user in logins:
            add_user(self.accounts, user)
        for address in addresses:
            folder = self.accounts / "keys" / address
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True, exist_ok=True)
            for user, keys in logins.items():
                (folder / user).write_text("".join(f"{k}\n" for k in keys))
        return sum(len(keys) for keys in logins.values())

    def install_keys(self, owner: str, ssh_keys_metadata: str) -> int:
        """Append ``owner``'s public keys to the authorized keys file; returns how many."""
        keys = parse_ssh_keys(ssh_keys_metadata or "")
        if not keys or self.authorized_keys is None:
            return 0
        self.remove_keys(owner)
        lines = [f"{key} {self._tag}{owner}\n" for key in keys]
        self.authorized_keys.parent.mkdir(parents=True, exist_ok=True)
        with open(self.authorized_keys, "a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.writelines(lines)
        return len(lines)

    def remove_keys(self, owner: str) -> None:
        """Nobody logs in to ``owner``'s hosts any more: their key files go, and the lines this
        emulator added to authorized_keys for ``owner`` (other lines stay as they are)."""
        if self.accounts is not None:
            with self._lock:
                addresses = [a for a, o in self._owner.items() if o == owner]
            for address in addresses:
                shutil.rmtree(self.accounts / "keys" / address, ignore_errors=True)
        if self.authorized_keys is None or not self.authorized_keys.exists():
            return
        suffix = f" {self._tag}{owner}"
        self._rewrite(lambda line: line.rstrip("\n").endswith(suffix))

    def remove_all_keys(self) -> None:
        """Remove every login this emulator gave (reset and shutdown)."""
        if self.accounts is not None:
            shutil.rmtree(self.accounts / "keys", ignore_errors=True)
        if self.authorized_keys is None or not self.authorized_keys.exists():
            return
        self._rewrite(lambda line: f" {self._tag}" in line)

    def _rewrite(self, drop) -> None:
        """Remove the lines ``drop`` selects, under an exclusive lock, in place."""
        with open(self.authorized_keys, "r+", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            lines = f.readlines()
            kept = [line for line in lines if not drop(line)]
            if len(kept) != len(lines):
                f.seek(0)
                f.truncate()
                f.writelines(kept)

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "addresses": list(self.addresses),
                "allocated": dict(self._owner),
                "ssh_port": self.ssh_port,
                "authorized_keys": str(self.authorized_keys) if self.authorized_keys else None,
            }


def add_user(accounts: Path, user: str) -> None:
    """Make ``user`` exist for the sshd (a line in the passwd file nss_wrapper serves it), with this
    machine's uid, gid and home: the hosts are processes of this machine, whatever their name."""
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", user or ""):
        return  # not a name a VM would make a user of (as the guest agent refuses it)
    passwd = accounts / "passwd"
    with open(passwd, "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        if any(line.split(":", 1)[0] == user for line in f):
            return
        f.write(f"{user}:x:{os.getuid()}:{os.getgid()}:{user}:{Path.home()}:/bin/bash\n")
