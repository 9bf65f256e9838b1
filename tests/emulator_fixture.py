"""Pytest fixtures for the Cloud TPU API emulator: a fresh one per test, tpunb pointed at it.

In conftest.py: ``from tests.emulator_fixture import tpu_emulator, tpu_emulator_options  # noqa: F401``.
Override ``tpu_emulator_options`` (start_emulator keyword arguments) in a module or conftest
to change timings, start with faults, or hand the emulator an sshd's hosts and authorized keys.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import proto_check
from tpunb.sandbox import EmulatorHandle, start_emulator

FAST = {"create_seconds": 0.1, "delete_seconds": 0.05, "queue_seconds": 0.05}


@pytest.fixture
def tpu_emulator_options() -> dict:
    """Keyword arguments for start_emulator; fast timings by default."""
    return dict(FAST)


@pytest.fixture
def tpu_emulator(tpu_emulator_options: dict, monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatorHandle]:
    """A running emulator (``.url``, ``.admin()``, ``.faults()``, ``.preempt()``, ``.state()``,
    ``.wait_for()``...) with TPUNB_TPU_API_ENDPOINT set to it for the test. Every API call the test
    made is checked against tpu_v2 afterwards (tests/proto_check.py)."""
    url, handle = start_emulator(**tpu_emulator_options)
    monkeypatch.setenv("TPUNB_TPU_API_ENDPOINT", url)
    exchanges = handle.record()
    try:
        yield handle
    finally:
        handle.stop()
    for exchange in exchanges:  # every call the test made, against Google's own tpu_v2 messages
        proto_check.check(exchange)


def on_sshd(sshd) -> dict:
    """Fast start_emulator options whose nodes' hosts are ``sshd``'s real SSH hosts, each with its
    metadata server (as every TPU VM has: JAX finds its peers there). Their disks and homes are
    kept between nodes (the emulator boots and powers off state dirs of its own), so a test
    session prepares each host's environment once; ``sshd.emulator_options()`` wipes them."""
    return {**FAST, "ssh_hosts": sshd.addresses, "ssh_port": sshd.port, "authorized_keys": str(sshd.authorized_keys),
            "metadata_port": sshd.metadata_port, "shared_host_key": sshd.host_public_key}


def configure(monkeypatch: pytest.MonkeyPatch, zone: str, project: str = "proj") -> None:
    """A configured project and default zone, as GOOGLE_CLOUD_PROJECT and CLOUDSDK_COMPUTE_ZONE say."""
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", project)
    monkeypatch.setenv("CLOUDSDK_COMPUTE_ZONE", zone)
    monkeypatch.delenv("CLOUDSDK_COMPUTE_REGION", raising=False)


def assert_nothing_leaked(emulator, home) -> None:
    """After a test: every node the emulator holds is one the registry knows (nothing bills unseen)."""
    from tpunb import manager
    from tpunb.registry import Registry

    manager.detach_all()
    known = {r.name for r in Registry(home / "registry.db").list_slices()}
    left = {n["name"].rsplit("/", 1)[-1] for n in emulator.state()["nodes"]}
    assert left <= known, f"nodes the registry does not know: {left - known}"
