"""A real OpenSSH sshd on loopback addresses, standing in for the hosts of a slice.

The emulator's sandbox (and the test suite) use it: ``Sshd(hosts=4)``.

One sshd process listens on 127.0.0.2, 127.0.0.3, ... (same port), each address playing one
host. Everything it reads lives in a temp dir (config, host key, authorized_keys, pid file), so
nothing depends on ~/.ssh or the machine's own sshd. Needs Debian's openssh-server installed.

Users. The machine's own user logs in with the keys in ``authorized_keys`` (``authorize()``). Other
user names exist for this sshd only: it runs under nss_wrapper (Debian's libnss-wrapper, a
test library that serves getpwnam from a file), reading ``accounts/passwd``, to which the
emulator adds the users a VM would have (``hosts.add_user``). They all map to this machine's
uid, since every host is a process of this machine; ``$USER`` and ``$LOGNAME`` in a session are the
name it logged in with. Their keys are ``accounts/keys/ADDRESS/USER`` (per host, as each VM has its
own). Sessions run as the current user (root here). Root's ~/.bashrc on this machine runs
``pyenv init`` (~200 ms per command); the hosts tpunb targets run commands without that, since a
stock user .bashrc returns early for non-interactive shells. ``SetEnv SHLVL=1`` gives the same
effect here: bash only sources ~/.bashrc for sshd commands when it is a top-level shell
(SHLVL < 2).

By default every host is a fresh Cloud TPU VM image (``tpunb.sandbox.hosts.image``): a bare Python 3.10
as ``python3``, a home of its own, JAX on the CPU. ``Sshd.python`` is this machine's own Python
(absolute), for tests that bring hosts with an interpreter of their own (``--python``).

Host keys. One sshd serves every address with one host key, unless ``host_keys``: then each
address has an sshd process and a host key of its own (sshd's HostKey cannot differ per address),
as every real VM has, and the emulator gives an address a new key whenever a new VM gets it
(``HostPool.rekey``: the key file replaced, then SIGHUP, which makes sshd execute itself again and
read it; open connections stay).
"""
from __future__ import annotations

import atexit
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from tpunb.sandbox.hosts.image import Image
from tpunb.machine import procs

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
NSS_WRAPPER = "libnss_wrapper.so"
NSS_WRAPPER_PATHS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")


def write_ed25519(path: Path) -> str:
    """A fresh ed25519 key at ``path`` (0600); returns its public OpenSSH line."""
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                            serialization.NoEncryption())
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                         serialization.PublicFormat.OpenSSH).decode()


def nss_wrapper() -> str:
    """The path of nss_wrapper's library, or a one-line error saying how to install it."""
    for folder in NSS_WRAPPER_PATHS:
        if os.path.exists(f"{folder}/{NSS_WRAPPER}"):
            return f"{folder}/{NSS_WRAPPER}"
    raise RuntimeError("nss_wrapper not found (the sshd's users other than yours): apt-get install -y libnss-wrapper")


def _free_port(addresses: list[str], avoid: int = 0) -> int:
    """A TCP port that is free on every one of ``addresses``."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((addresses[0], 0))
            port = s.getsockname()[1]
        if port == avoid:
            continue
        try:
            for addr in addresses[1:]:
                with socket.socket() as s:
                    s.bind((addr, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no TCP port free on all of {addresses}")


class Sshd:
    """One sshd serving ``hosts`` loopback addresses on one port, with its own keys and config."""

    def __init__(self, hosts: int = 4, directory: Path | None = None, environment: dict[str, str] | None = None,
                 image: Image | bool = True, pythons: list | None = None, host_keys: bool = False) -> None:
        if not os.path.exists(SSHD):
            raise RuntimeError("sshd not found: apt-get install -y openssh-server")
        self.dir = Path(directory or tempfile.mkdtemp(prefix="tpunb-sshd-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.addresses = [f"127.0.0.{i + 2}" for i in range(hosts)]
        self.port = _free_port(self.addresses)
        self.user = getpass.getuser()
        #: interpreter to run on the hosts (the same machine): absolute, as PATH lacks pyenv there
        self.python = sys.executable
        #: the TPU VM image every host models (None: this machine's own environment)
        self.image = (image if isinstance(image, Image) else Image(self.dir / "image", pythons) if image else None)
        #: set in every session (sshd SetEnv): the image's PATH, caches, JAX on the CPU, ...
        self.environment = {"SHLVL": "1", **(self.image.environment() if self.image else {}), **(environment or {})}
        #: where each host's metadata server listens (at the host's own address): the emulator serves it
        self.metadata_port = _free_port(self.addresses, avoid=self.port)
        self.host_key_path = self.dir / "ssh_host_ed25519_key"
        self.host_public_key = write_ed25519(self.host_key_path)
        #: an sshd and a host key per address (``host_keys``), else one for all: group -> its addresses
        self.per_host = host_keys
        self.groups = {a: [a] for a in self.addresses} if host_keys else {"": list(self.addresses)}
        for group in self.groups if host_keys else ():
            self.key_path(group).parent.mkdir(parents=True, exist_ok=True)
            write_ed25519(self.key_path(group))
        self.authorized_keys = self.dir / "authorized_keys"
        self.authorized_keys.write_text("")
        #: the users this sshd knows besides the machine's own (nss_wrapper's passwd) and their keys
        self.accounts = self.dir / "accounts"
        (self.accounts / "keys").mkdir(parents=True, exist_ok=True)
        (self.accounts / "passwd").write_text(Path("/etc/passwd").read_text())
        (self.accounts / "group").write_text(Path("/etc/group").read_text())
        self.pid_file = self.dir / "sshd.pid"
        self.log_file = self.dir / "sshd.log"
        self.config = self.dir / "sshd_config"
        for group, addresses in self.groups.items():
            self.config_path(group).write_text(self._config_text(addresses, group))
        for address in self.addresses if self.image else ():
            self.home(address).mkdir(parents=True, exist_ok=True)
        self._procs: dict[str, subprocess.Popen] = {}
        atexit.register(self.stop)  # a test run that dies early must not leave sshd listening
        self.start()

    def key_path(self, group: str) -> Path:
        """The host key file of ``group`` (an address, or "" for the one sshd of every address)."""
        return self.dir / "hostkeys" / group / "ssh_host_ed25519_key" if group else self.host_key_path

    def config_path(self, group: str) -> Path:
        return self.dir / f"sshd_config.{group}" if group else self.config

    def pid_path(self, group: str) -> Path:
        return self.dir / f"sshd.{group}.pid" if group else self.pid_file

    def host_key(self, address: str) -> str:
        """The public line of the host key ``address`` presents now."""
        from cryptography.hazmat.primitives.serialization import load_ssh_private_key

        key = load_ssh_private_key(self.key_path(address if self.per_host else "").read_bytes(), None)
        return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()

    def _config_text(self, addresses: list[str], group: str = "") -> str:
        listen = "".join(f"ListenAddress {a}:{self.port}\n" for a in addresses)
        return (
            f"{listen}"
            f"HostKey {self.key_path(group)}\n"
            f"AuthorizedKeysFile {self.authorized_keys}\n"
            f"PidFile {self.pid_path(group)}\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\n"
            "AcceptEnv *\n"
            "MaxStartups 100:30:200\n"
            "MaxSessions 200\n"
            "UseDNS no\n"
            "PrintMotd no\n"
            "PrintLastLog no\n"
            "LogLevel ERROR\n"
            "Subsystem sftp /usr/lib/openssh/sftp-server\n"
            + "".join(f"Match LocalAddress {a}\n    SetEnv "
                      f"{' '.join(f'{k}={v}' for k, v in self.host_environment(a).items())}\n"
                      f"    AuthorizedKeysFile {self.authorized_keys} {self.accounts}/keys/{a}/%u\n"
                      for a in addresses)
        )

    def host_environment(self, address: str) -> dict[str, str]:
        """What every process of host ``address`` sees: ``environment``, plus its own metadata server
        (``GCE_METADATA_HOST``) and its own directory for host state (``TPUNB_HOST_DIR``, its "disk")."""
        disk = self.dir / "hosts" / address
        metadata = f"{address}:{self.metadata_port}"
        home = {"HOME": str(self.home(address)), "BASH_ENV": str(self.dir / "vm" / address / "profile")} if self.image else {}
        return {**self.environment, **home, "GCE_METADATA_HOST": metadata, "GCE_METADATA_IP": metadata,
                "TPUNB_HOST_DIR": str(disk)}

    def home(self, address: str) -> Path:
        """Host ``address``'s home (on its disk: a deleted node's is gone with it)."""
        return self.dir / "hosts" / address / "home" if self.image else Path.home()

    def emulator_options(self) -> dict:
        """start_emulator keyword arguments that make these the emulated nodes' hosts."""
        return {"ssh_hosts": list(self.addresses), "ssh_port": self.port, "accounts": str(self.accounts),
                "authorized_keys": str(self.authorized_keys), "metadata_port": self.metadata_port,
                "host_environment": {a: self.host_environment(a) for a in self.addresses},
                **({"host_keys": {a: {"key": str(self.key_path(a)), "pid_file": str(self.pid_path(a))}
                                  for a in self.addresses}} if self.per_host else {"shared_host_key": self.host_public_key}),
                **({"vm_image": {"pythons": self.image.vm_pythons(), "nss_wrapper": nss_wrapper(),
                                 "hosts_file": str(self.dir / "vm" / "hosts")}} if self.image else {})}

    def start(self, timeout: float = 10.0) -> None:
        """Start (or restart after ``stop``) listening; returns once every address accepts."""
        os.makedirs("/run/sshd", exist_ok=True)  # privilege separation dir Debian's sshd wants
        env = {**os.environ, "LD_PRELOAD": nss_wrapper(), "NSS_WRAPPER_PASSWD": str(self.accounts / "passwd"),
               "NSS_WRAPPER_GROUP": str(self.accounts / "group")}
        for group in self.groups:
            proc = self._procs.get(group)
            if proc is not None and proc.poll() is None:
                continue
            self.pid_path(group).unlink(missing_ok=True)
            with open(self.log_file, "ab") as log:
                proc = self._procs[group] = subprocess.Popen(
                    [SSHD, "-D", "-e", "-f", str(self.config_path(group))],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env,
                )
            deadline = time.monotonic() + timeout
            while not self.pid_path(group).exists():  # written once the listening sockets are bound
                if proc.poll() is not None or time.monotonic() > deadline:
                    self._procs.pop(group, None)
                    raise RuntimeError(f"sshd did not start: {self.log_file.read_text()[-2000:]}")
                time.sleep(0.005)

    @property
    def _proc(self) -> subprocess.Popen | None:
        """The (first) sshd process."""
        return next(iter(self._procs.values()), None)

    @property
    def running(self) -> bool:
        return bool(self._procs) and all(p.poll() is None for p in self._procs.values())

    def stop(self, sessions: bool = True) -> None:
        """Kill sshd (and, with ``sessions``, every connection and process its hosts run): a host dying."""
        victims = self.processes() if sessions else []
        for proc in self._procs.values():
            proc.kill()
            proc.wait()
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._procs.clear()

    def processes(self) -> list[int]:
        """Every process its hosts run: below sshd, and those that left its tree (a host's fork
        server detaches to serve the next connection; its agents are its children)."""
        below = [pid for proc in self._procs.values() for pid in procs.descendants(proc.pid)]
        left = procs.started_with(f"TPUNB_HOST_DIR={self.dir / 'hosts'}/")
        return below + [pid for pid in left if pid not in below]

    def swap_host_key(self) -> str:
        """Give the hosts a new host key (a re-created VM); returns its public line."""
        was_running = self.running
        self.stop(sessions=False)
        self.host_public_key = write_ed25519(self.host_key_path)
        if was_running:
            self.start()
        return self.host_public_key

    def logins(self, address: str) -> dict[str, str]:
        """Who may log in to host ``address`` as the emulator set it: user -> their keys' lines."""
        folder = self.accounts / "keys" / address
        return {f.name: f.read_text() for f in sorted(folder.iterdir())} if folder.is_dir() else {}

    def authorize(self, public_key_line: str) -> None:
        """Let the holder of this key log in (as ``self.user``) on every address."""
        with open(self.authorized_keys, "a") as f:
            f.write(public_key_line.strip() + "\n")

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def alive(pid: int) -> bool:
    """True while ``pid`` runs on this machine (zombies count as dead: nobody may reap them here)."""
    return procs.alive(pid)
