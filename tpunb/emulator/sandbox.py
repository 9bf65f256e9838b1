"""Rehearse the Cloud TPU workflow on this machine: the emulator, whose nodes' hosts are a real sshd.

    from tpunb.emulator.sandbox import start_sandbox
    sandbox = start_sandbox()      # then %tpu_launch v4-16 --spot works as on a real project

It points tpunb at the emulator (TPUNB_TPU_API_ENDPOINT) with a made-up project and zone. The
hosts are loopback addresses served by one sshd (Debian's openssh-server must be installed);
their sessions find this Python as ``python3`` and run JAX on the CPU with each host's chips as
devices, like the local simulated slice; each has a metadata server, so ``--idle-delete`` works
as on a real VM. ``sandbox.stop()`` undoes all of it.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tpunb.emulator.server import EmulatorHandle, start_emulator
from tpunb.emulator.sshd import Sshd
from tpunb.emulator.storage import StorageEmulator

SETTINGS = ("TPUNB_TPU_API_ENDPOINT", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_COMPUTE_ZONE", "STORAGE_EMULATOR_HOST",
            "TPUNB_BUCKET")


@dataclass
class Sandbox:
    url: str
    project: str
    zone: str
    sshd: Sshd
    emulator: EmulatorHandle
    _saved: dict = field(default_factory=dict, repr=False)
    #: Cloud Storage on this machine (``storage=True``), where cloud slices' snapshots go
    storage: StorageEmulator | None = None

    def preempt(self, node: str, after: float | None = None, notice: float | None = None) -> None:
        """Do to a node what Google does to spot capacity it reclaims (``notice``: with the notice
        its VMs get first, that many seconds before they die; Compute Engine gives 30)."""
        self.emulator.preempt(node, after=after, notice=notice)

    def stop(self) -> None:
        self.emulator.stop()
        self.sshd.close()
        if self.storage is not None:
            self.storage.stop()
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def __repr__(self) -> str:
        return (f"<Sandbox: Cloud TPU API emulator at {self.url}, project {self.project!r}, zone {self.zone!r}, "
                f"{len(self.sshd.addresses)} SSH hosts>")


def start_sandbox(hosts: int = 4, project: str = "sandbox-project", zone: str = "us-central2-b",
                  devices_per_host: int = 4, create_seconds: float = 1.0, storage: bool = False,
                  bucket: str = "sandbox-bucket") -> Sandbox:
    """Start an sshd with ``hosts`` loopback hosts and an emulator using them; point tpunb at it.
    ``storage``: also Cloud Storage on this machine (``tpunb.emulator.storage``) with ``bucket``,
    which the hosts and this kernel reach, and snapshots of cloud slices use (TPUNB_BUCKET)."""
    bindir = Path(sys.executable).parent
    store = StorageEmulator((bucket,)) if storage else None
    environment = {
        "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_host}",
        **({"STORAGE_EMULATOR_HOST": store.url} if store else {}),
    }
    try:
        sshd = Sshd(hosts, environment=environment)
    except BaseException:
        if store:
            store.stop()
        raise
    try:
        url, handle = start_emulator(create_seconds=create_seconds, delete_seconds=0.2, queue_seconds=0.5,
                                     **sshd.emulator_options())
    except BaseException:
        sshd.close()
        if store:
            store.stop()
        raise
    saved = {key: os.environ.get(key) for key in SETTINGS}
    os.environ.update({"TPUNB_TPU_API_ENDPOINT": url, "GOOGLE_CLOUD_PROJECT": project, "CLOUDSDK_COMPUTE_ZONE": zone})
    if store:
        os.environ.update({"STORAGE_EMULATOR_HOST": store.url, "TPUNB_BUCKET": bucket})
    return Sandbox(url, project, zone, sshd, handle, saved, store)
