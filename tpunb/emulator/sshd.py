"""A real OpenSSH sshd on loopback addresses, standing in for the hosts of a slice.

The emulator's sandbox (and the test suite) use it: ``Sshd(hosts=4)``.

One sshd process listens on 127.0.0.2, 127.0.0.3, ... (same port), each address playing one
host. Everything it reads lives in a temp dir (config, host key, authorized_keys, pid file), so
nothing depends on ~/.ssh or the machine's own sshd. Needs Debian's openssh-server installed.

Sessions log in as the current user (root here). Root's ~/.bashrc on this machine runs
``pyenv init`` (~200 ms per command); the hosts tpunb targets run commands without that, since a
stock user .bashrc returns early for non-interactive shells. ``SetEnv SHLVL=1`` gives the same
effect here: bash only sources ~/.bashrc for sshd commands when it is a top-level shell
(SHLVL < 2). Without a PATH from pyenv, commands must name the interpreter: use ``Sshd.python``.
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

from tpunb.transport import procs

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


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

    def __init__(self, hosts: int = 4, directory: Path | None = None, environment: dict[str, str] | None = None) -> None:
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
        #: set in every session (sshd SetEnv), e.g. a PATH that finds this Python as python3
        self.environment = {"SHLVL": "1", **(environment or {})}
        #: where each host's metadata server listens (at the host's own address): the emulator serves it
        self.metadata_port = _free_port(self.addresses, avoid=self.port)
        self.host_key_path = self.dir / "ssh_host_ed25519_key"
        self.host_public_key = write_ed25519(self.host_key_path)
        self.authorized_keys = self.dir / "authorized_keys"
        self.authorized_keys.write_text("")
        self.pid_file = self.dir / "sshd.pid"
        self.log_file = self.dir / "sshd.log"
        self.config = self.dir / "sshd_config"
        self.config.write_text(self._config_text())
        self._proc: subprocess.Popen | None = None
        atexit.register(self.stop)  # a test run that dies early must not leave sshd listening
        self.start()

    def _config_text(self) -> str:
        listen = "".join(f"ListenAddress {a}:{self.port}\n" for a in self.addresses)
        return (
            f"{listen}"
            f"HostKey {self.host_key_path}\n"
            f"AuthorizedKeysFile {self.authorized_keys}\n"
            f"PidFile {self.pid_file}\n"
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
                      for a in self.addresses)
        )

    def host_environment(self, address: str) -> dict[str, str]:
        """What every process of host ``address`` sees: ``environment``, plus its own metadata server
        (``GCE_METADATA_HOST``) and its own directory for host state (``TPUNB_HOST_DIR``, its "disk")."""
        return {**self.environment, "GCE_METADATA_HOST": f"{address}:{self.metadata_port}",
                "TPUNB_HOST_DIR": str(self.dir / "hosts" / address)}

    def emulator_options(self) -> dict:
        """start_emulator keyword arguments that make these the emulated nodes' hosts."""
        return {"ssh_hosts": list(self.addresses), "ssh_port": self.port,
                "authorized_keys": str(self.authorized_keys), "metadata_port": self.metadata_port,
                "host_environment": {a: self.host_environment(a) for a in self.addresses}}

    def start(self, timeout: float = 10.0) -> None:
        """Start (or restart after ``stop``) listening; returns once every address accepts."""
        if self.running:
            return
        os.makedirs("/run/sshd", exist_ok=True)  # privilege separation dir Debian's sshd wants
        self.pid_file.unlink(missing_ok=True)
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self.pid_file.exists():  # written once the listening sockets are bound
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._proc = None
                raise RuntimeError(f"sshd did not start: {self.log_file.read_text()[-2000:]}")
            time.sleep(0.005)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, sessions: bool = True) -> None:
        """Kill sshd (and, with ``sessions``, every connection and process it started): a host dying."""
        if self._proc is None:
            return
        victims = procs.descendants(self._proc.pid) if sessions else []
        self._proc.kill()
        self._proc.wait()
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._proc = None

    def swap_host_key(self) -> str:
        """Give the hosts a new host key (a re-created VM); returns its public line."""
        was_running = self.running
        self.stop(sessions=False)
        self.host_public_key = write_ed25519(self.host_key_path)
        if was_running:
            self.start()
        return self.host_public_key

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
