"""Pytest fixtures around a real OpenSSH sshd on loopback addresses (tpunb.sandbox.hosts.sshd.Sshd).

Use: ``from tests.sshd import hosts, ssh_key, sshd, transports`` (fixtures; conftest imports them).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tpunb.sandbox.hosts.sshd import Sshd, alive, write_ed25519 as _write_ed25519  # noqa: F401 - re-exported for tests


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory):
    """A running sshd with 4 loopback hosts; tests that stop it must start it again."""
    server = Sshd(hosts=4, directory=tmp_path_factory.mktemp("sshd"))
    yield server
    server.close()


@pytest.fixture(scope="session")
def ssh_key(sshd: Sshd, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user key authorized on the sshd (kept out of any TPUNB_HOME the tests use)."""
    path = tmp_path_factory.mktemp("userkey") / "id_ed25519"
    sshd.authorize(_write_ed25519(path))
    return path


@pytest.fixture
def hosts(sshd: Sshd) -> list[str]:
    """The sshd's hosts as ``address:port`` specs."""
    return [f"{a}:{sshd.port}" for a in sshd.addresses]


@pytest.fixture
def transports(sshd: Sshd, ssh_key: Path, hosts: list[str]):
    """SSHTransports connected to every host (closed after the test)."""
    from tpunb.transport.ssh_hosts import connect_all

    connected = connect_all(hosts, key_path=ssh_key, python=sshd.python)
    yield connected
    for t in connected:
        t.close()


@pytest.fixture
def host_key_restored(sshd: Sshd):
    """For a test that swaps the session sshd's host key (``sshd.swap_host_key()``): the old key
    is back afterwards, so the connections other tests record or hold (warm slices among them:
    tests/warm.py) still find the key they trusted."""
    saved, public = sshd.host_key_path.read_bytes(), sshd.host_public_key
    yield
    sshd.host_key_path.write_bytes(saved)
    sshd.stop(sessions=False)
    sshd.start()
    sshd.host_public_key = public
