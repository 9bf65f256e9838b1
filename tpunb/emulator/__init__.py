"""``tpunb.emulator`` is the old name of tpunb.sandbox: it keeps working for one release.

Importing it warns once (DeprecationWarning); its names are the new package's, and every old
module path (``tpunb.emulator.compute``) is the new module itself, so patching through it patches what runs.
Remove this package in tpunb 0.3 (0.2 is the one release that keeps it)."""
from __future__ import annotations

from tpunb.machine import old_names

#: each old module path and the module it is now
MOVED = {
    "tpunb.emulator.accounts": "tpunb.sandbox.iam.accounts",
    "tpunb.emulator.admin": "tpunb.sandbox.admin",
    "tpunb.emulator.catalog_api": "tpunb.sandbox.tpu.catalog_api",
    "tpunb.emulator.checks": "tpunb.sandbox.tpu.request_checks",
    "tpunb.emulator.compute": "tpunb.sandbox.compute.compute",
    "tpunb.emulator.compute_checks": "tpunb.sandbox.compute.compute_checks",
    "tpunb.emulator.compute_metadata": "tpunb.sandbox.compute.compute_metadata",
    "tpunb.emulator.compute_migs": "tpunb.sandbox.compute.compute_migs",
    "tpunb.emulator.compute_project": "tpunb.sandbox.compute.compute_project",
    "tpunb.emulator.compute_records": "tpunb.sandbox.compute.compute_records",
    "tpunb.emulator.compute_routes": "tpunb.sandbox.compute.compute_routes",
    "tpunb.emulator.hosts": "tpunb.sandbox.hosts.pool",
    "tpunb.emulator.hub": "tpunb.sandbox.hub.hub_server",
    "tpunb.emulator.image": "tpunb.sandbox.hosts.image",
    "tpunb.emulator.machines": "tpunb.sandbox.compute.machines",
    "tpunb.emulator.metadata": "tpunb.sandbox.metadata.metadata_server",
    "tpunb.emulator.quotas": "tpunb.sandbox.quotas",
    "tpunb.emulator.resources": "tpunb.sandbox.tpu.resources",
    "tpunb.emulator.sandbox": "tpunb.sandbox.box",
    "tpunb.emulator.server": "tpunb.sandbox.server",
    "tpunb.emulator.sshd": "tpunb.sandbox.hosts.sshd",
    "tpunb.emulator.state": "tpunb.sandbox.state",
    "tpunb.emulator.storage": "tpunb.sandbox.storage.cloud_storage",
    "tpunb.emulator.vms": "tpunb.sandbox.hosts.vms",
}


__getattr__ = old_names.keep(__name__, MOVED, "tpunb.sandbox", "tpunb.sandbox")
