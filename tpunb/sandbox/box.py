"""Rehearse the Cloud TPU workflow on this machine: the emulator, whose nodes' hosts are a real sshd.

    from tpunb.sandbox.box import start_sandbox
    sandbox = start_sandbox()      # then %tpu_launch v4-16 --spot works as on a real project

It points tpunb at the emulator (TPUNB_TPU_API_ENDPOINT, and TPUNB_COMPUTE_API_ENDPOINT for its
Compute Engine API, ``compute_routes``) with a made-up project and zone. The
hosts are loopback addresses served by one sshd (Debian's openssh-server must be installed), each
a fresh Cloud TPU VM image (``tpunb.sandbox.hosts.image``): a bare Python 3.10, a home of its own, no
JAX, so ``%tpu_launch`` prepares every host as it must on a real VM; JAX then runs on the CPU with
each host's chips as devices. Each host has a metadata server (worker number, endpoints,
``tpu-env``), so JAX finds its peers and ``--idle-delete`` works as on a real VM.
``sandbox.stop()`` undoes all of it.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tpunb.sandbox.hosts.image import Image
from tpunb.sandbox.server import EmulatorHandle, start_emulator
from tpunb.sandbox.hosts.sshd import Sshd
from tpunb.sandbox.storage.cloud_storage import StorageEmulator

SETTINGS = ("TPUNB_TPU_API_ENDPOINT", "TPUNB_COMPUTE_API_ENDPOINT", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_COMPUTE_ZONE", "STORAGE_EMULATOR_HOST",
            "TPUNB_BUCKET")


@dataclass
class Sandbox:
    url: str
    project: str
    zone: str
    sshd: Sshd
    emulator: EmulatorHandle
    _saved: dict = field(default_factory=dict, repr=False)
    #: everything the sandbox made on this machine (the image, the hosts' disks)
    directory: Path | None = field(default=None, repr=False)
    #: Cloud Storage on this machine (``storage=True``), where cloud slices' snapshots go
    storage: StorageEmulator | None = None

    @property
    def compute_url(self) -> str:
        """The base URL of the sandbox's Compute Engine API: google-cloud-compute's
        ``client_options={"api_endpoint": sandbox.compute_url}`` (TPUNB_COMPUTE_API_ENDPOINT)."""
        return self.url

    def preempt(self, node: str, after: float | None = None, notice: float | None = None) -> None:
        """Do to a node what Google does to spot capacity it reclaims (``notice``: with the notice
        its VMs get first, that many seconds before they die; Compute Engine gives 30)."""
        self.emulator.preempt(node, after=after, notice=notice)

    def stop(self) -> None:
        self.emulator.stop()
        self.sshd.close()
        if self.storage is not None:
            self.storage.stop()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def __repr__(self) -> str:
        return (f"<Sandbox: Cloud TPU API emulator at {self.url}, project {self.project!r}, zone {self.zone!r}, "
                f"{len(self.sshd.addresses)} SSH hosts>")


def start_sandbox(hosts: int = 4, project: str = "sandbox-project", zone: str = "us-central2-b",
                  devices_per_host: int = 4, create_seconds: float = 1.0, pythons: list | None = None,
                  cache: str | Path | None = None, storage: bool = False, bucket: str = "sandbox-bucket") -> Sandbox:
    """Start an sshd with ``hosts`` loopback hosts (each a fresh TPU VM image) and an emulator using
    them; point tpunb at it. ``pythons``: what stands in for uv's managed Pythons (X.Y from pyenv,
    or a prefix; default this kernel's); ``cache``: the uv and pip cache the hosts share.
    ``storage``: also Cloud Storage on this machine (``tpunb.sandbox.storage.cloud_storage``) with ``bucket``,
    which the hosts and this kernel reach, and snapshots of cloud slices use (TPUNB_BUCKET)."""
    directory = Path(tempfile.mkdtemp(prefix="tpunb-sandbox-"))
    store = StorageEmulator((bucket,)) if storage else None
    try:
        image = Image(directory / "image", pythons, Path(cache) if cache else None, devices_per_host)
        sshd = Sshd(hosts, directory=directory / "sshd", image=image, host_keys=True,
                    environment={"STORAGE_EMULATOR_HOST": store.url} if store else None)
    except BaseException:
        if store:
            store.stop()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    try:
        url, handle = start_emulator(create_seconds=create_seconds, delete_seconds=0.2, queue_seconds=0.5,
                                     **sshd.emulator_options())
    except BaseException:
        sshd.close()
        if store:
            store.stop()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    saved = {key: os.environ.get(key) for key in SETTINGS}
    os.environ.update({"TPUNB_TPU_API_ENDPOINT": url, "TPUNB_COMPUTE_API_ENDPOINT": url, "GOOGLE_CLOUD_PROJECT": project,
                       "CLOUDSDK_COMPUTE_ZONE": zone})
    if store:
        os.environ.update({"STORAGE_EMULATOR_HOST": store.url, "TPUNB_BUCKET": bucket})
    return Sandbox(url, project, zone, sshd, handle, saved, directory, store)
